"""Redis clients built from a URL: credentials and TLS come from the URL, never from code.

Besides ``redis://`` and ``rediss://``, a Sentinel-managed Redis is named by
``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]`` (``rediss+sentinel``
for TLS to the master; ``?sentinel_password=...`` when the sentinels need one): the client
asks the sentinels for the current master of ``service`` and follows a failover.

A Redis Cluster is named by ``redis+cluster://[user:password@]host:port[,host:port...]``
(``rediss+cluster`` for TLS): one or more of its nodes (a managed service's configuration
endpoint will do); the client learns the rest, sends each command to the master that holds
its keys' slot, and follows a failover or a slot move. A cluster has database 0 only. Every key
of one deployment must hash to one slot (see :func:`cluster_key_prefix`).
"""

from __future__ import annotations

import re
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry
from redis.sentinel import Sentinel

from schedproj.core.errors import ConfigurationError

#: URL schemes that name a Sentinel-managed master.
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
#: Port of a sentinel named without one.
SENTINEL_PORT = 26379
#: How often a command is retried while a failover moves the master (with backoff, about 10 s).
FAILOVER_RETRIES = 8


#: URL schemes that name a Redis Cluster.
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
#: Port of a cluster node named without one.
CLUSTER_PORT = 6379

#: URL schemes a Redis client is built from (redis-py's, Sentinel's and Cluster's above).
REDIS_SCHEMES = ("redis", "rediss", "unix", *SENTINEL_SCHEMES, *CLUSTER_SCHEMES)
#: The oldest redis-py whose cluster client runs MULTI/EXEC (6.1), which schedproj's stores
#: use; older ones refuse ``pipeline(transaction=True)`` on a cluster.
CLUSTER_MIN_REDIS_PY = (6, 1)
#: TLS options a ``rediss+cluster://`` URL may carry in its query (as redis-py's URLs do).
TLS_QUERY_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs")


def cluster_client_problem(version: str | None = None) -> str | None:
    """Why this redis-py (or ``version``) cannot carry schedproj's state on a Redis Cluster,
    with the fix; or None."""
    version = version or redis.__version__
    have = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
    if have >= CLUSTER_MIN_REDIS_PY:
        return None
    return (f"a Redis Cluster needs redis-py 6.1 or later (its cluster client runs "
            f"transactions from 6.1 on, and schedproj's stores use them); this is redis-py "
            f"{version}. Fix: pip install 'redis>=6.1'")


def is_cluster_url(url: str | None) -> bool:
    """Whether ``url`` names a Redis Cluster."""
    return url is not None and urlsplit(url).scheme in CLUSTER_SCHEMES


def redis_url_problem(url: str) -> str | None:
    """What is wrong with a Redis URL, with the fix (never echoing the URL: it may hold a
    password); None when a client can be built from it."""
    parts = urlsplit(url)
    if parts.scheme not in REDIS_SCHEMES:
        return (f"scheme {parts.scheme!r} is not a Redis URL scheme. Fix: start it with "
                "redis:// (rediss:// for TLS, redis+sentinel:// for Sentinel, "
                "redis+cluster:// for a Redis Cluster, unix:// for a socket)")
    if parts.scheme in SENTINEL_SCHEMES:
        try:
            parse_sentinel_url(url)
        except ConfigurationError as exc:
            return f"{str(exc).partition(': ')[2]}. Fix: correct the sentinel addresses"
        return None
    if parts.scheme in CLUSTER_SCHEMES:
        too_old = cluster_client_problem()
        if too_old is not None:
            return too_old
        try:
            parse_cluster_url(url)
        except ConfigurationError as exc:
            problem = str(exc).partition(": ")[2]
            return problem if "Fix:" in problem else (
                f"{problem}. Fix: write each node as host:port, e.g. "
                "redis+cluster://10.0.0.1:6379,10.0.0.2:6379")
        return None
    try:
        parts.port  # noqa: B018 - parsing it is the check
    except ValueError:
        return ("the port is not a number from 0 to 65535. Fix: write host:port, e.g. "
                "redis://:password@redis.example:6379/0")
    db = parts.path.strip("/")
    if parts.scheme != "unix" and db and not db.isdigit():
        return (f"database {db[:20]!r} is not a number. Fix: end the URL with the database "
                "number, e.g. /0")
    return None


def connect(url: str, *, socket_timeout_s: float = 10.0,
            tls: Mapping[str, str] | None = None, retry: bool = True) -> redis.Redis:
    """A client that decodes to ``str`` and gives up on a dead server instead of hanging.

    ``tls`` (``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs``: see
    :attr:`schedproj.settings.Settings.redis_tls`) applies to ``rediss://`` URLs only; the
    URL's own query parameters of the same names win. ``retry=False``: one attempt per
    command, bounded by the socket timeouts (a lease holder's renewals, whose caller retries on
    its own schedule and must learn of a failure in time to stop)."""
    if urlsplit(url).scheme in SENTINEL_SCHEMES:
        return connect_sentinel(url, socket_timeout_s=socket_timeout_s, tls=tls, retry=retry)
    if urlsplit(url).scheme in CLUSTER_SCHEMES:
        return connect_cluster(url, socket_timeout_s=socket_timeout_s, tls=tls, retry=retry)
    once = {} if retry else {"retry": Retry(NoBackoff(), 0)}
    return redis.Redis.from_url(
        url,
        decode_responses=True,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=min(5.0, socket_timeout_s),
        health_check_interval=30,
        **once,
        **tls_options(url, tls),
    )


def tls_options(url: str, tls: Mapping[str, str] | None) -> dict[str, str]:
    """The ``tls`` options a client of ``url`` takes: none for a plain URL, and none that the
    URL's query already sets."""
    parts = urlsplit(url)
    if not tls or not parts.scheme.startswith("rediss"):
        return {}
    given = parse_qs(parts.query)
    return {k: v for k, v in tls.items() if k not in given}


def _hosts(url: str, default_port: int, what: str) -> list[tuple[str, int]]:
    """The ``host:port`` list of a URL naming several servers (``h1:p1,h2:p2``)."""
    hosts = []
    for item in urlsplit(url).netloc.rpartition("@")[2].split(","):
        host, _, port = item.strip().rpartition(":") if ":" in item else (item, "", "")
        try:
            number = int(port) if port else default_port
        except ValueError:
            number = -1
        if not 0 < number < 65536:
            raise ConfigurationError(f"{mask(url)}: {what} address {item!r} is not host:port")
        hosts.append((host or item.strip(), number))
    return hosts


def parse_sentinel_url(url: str) -> tuple[list[tuple[str, int]], str, int, dict[str, str]]:
    """(sentinel addresses, service name, db, options) of a ``redis+sentinel://`` URL."""
    parts = urlsplit(url)
    hosts = _hosts(url, SENTINEL_PORT, "sentinel")
    path = [p for p in parts.path.split("/") if p]
    if not hosts or not hosts[0][0] or not path:
        raise ConfigurationError(
            f"{mask(url)}: a Sentinel URL names the sentinels and the service, e.g. "
            "redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster/0")
    try:
        db = int(path[1]) if len(path) > 1 else 0
    except ValueError:
        raise ConfigurationError(f"{mask(url)}: database {path[1]!r} is not a number") from None
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    return hosts, path[0], db, options


def connect_sentinel(url: str, *, socket_timeout_s: float = 10.0,
                     tls: Mapping[str, str] | None = None, retry: bool = True) -> redis.Redis:
    """A client for the current master of a Sentinel-managed service; commands are retried
    (with backoff) while a failover moves the master, and a demoted master's read-only replies
    count as a lost connection."""
    hosts, service, db, options = parse_sentinel_url(url)
    parts = urlsplit(url)
    sentinel_password = options.get("sentinel_password")
    asking: dict[str, Any] = {"socket_timeout": socket_timeout_s,
                              "socket_connect_timeout": min(5.0, socket_timeout_s)}
    if sentinel_password:
        asking["password"] = sentinel_password
    if not retry:  # one question per sentinel, no backoff between attempts
        asking["retry"] = Retry(NoBackoff(), 0)
    # Typed as Any: redis-py's annotations of Sentinel differ between the versions accepted
    # (untyped before 8, typed since), and no ignore comment fits both.
    sentinel_class: Any = Sentinel
    sentinel: Any = sentinel_class(
        hosts, socket_timeout=socket_timeout_s, socket_connect_timeout=min(5.0, socket_timeout_s),
        sentinel_kwargs=asking)
    client: redis.Redis = sentinel.master_for(
        service, db=db, decode_responses=True,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        ssl=parts.scheme.startswith("rediss"),
        socket_timeout=socket_timeout_s, socket_connect_timeout=5.0,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.1), FAILOVER_RETRIES if retry else 0),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        **tls_options(url, tls))
    follow_switches(sentinel, service, client)
    return client


def parse_cluster_url(url: str) -> tuple[list[tuple[str, int]], dict[str, str]]:
    """(node addresses, options) of a ``redis+cluster://`` URL; ConfigurationError (URL
    masked, with the fix) when it names no node or a database other than 0."""
    parts = urlsplit(url)
    hosts = _hosts(url, CLUSTER_PORT, "cluster node")
    if not hosts or not hosts[0][0]:
        raise ConfigurationError(
            f"{mask(url)}: a Redis Cluster URL names at least one node. Fix: write "
            "redis+cluster://host:port (more nodes: redis+cluster://host1:port1,host2:port2)")
    db = parts.path.strip("/")
    if db not in ("", "0"):
        raise ConfigurationError(
            f"{mask(url)}: a Redis Cluster has database 0 only, not {db[:20]!r}. Fix: end the "
            "URL with the last host:port (or /0); one deployment is kept apart from another "
            "by its SCHEDPROJ_KEY_PREFIX")
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    return hosts, options


def connect_cluster(url: str, *, socket_timeout_s: float = 10.0,
                    tls: Mapping[str, str] | None = None, retry: bool = True) -> redis.Redis:
    """A client of a Redis Cluster that sends each command (and script) to the master holding
    its keys' slot and follows a failover or a moved slot.

    redis-py retries a command that met a dead node at once, after re-reading the slot map;
    while the cluster has not yet elected the dead master's replica that map still names the
    dead node, so, as for Sentinel, the whole command is retried with backoff for about 10 s
    (with ``retry=False`` only once at once, to the master the slot map names after the
    failure: the caller's next attempt may come long after the takeover)."""
    hosts, options = parse_cluster_url(url)
    too_old = cluster_client_problem()
    if too_old is not None:
        raise ConfigurationError(f"{mask(url)}: {too_old}")
    parts = urlsplit(url)
    tls_given = dict(tls or {}) if parts.scheme == "rediss+cluster" else {}
    tls_given.update({k: v for k, v in options.items() if k in TLS_QUERY_OPTIONS})
    try:
        client = _cluster_client(hosts, parts, tls_given, socket_timeout_s, retry)
    except redis.exceptions.RedisClusterException as exc:
        # Unlike redis.Redis, the cluster client connects at once (to read the slot map), and
        # says it cannot with an exception that is no RedisError: raised as the connection
        # error it is, every caller that waits out an unreachable Redis waits this out too.
        raise redis.ConnectionError(str(exc)) from exc
    # A RedisCluster is no redis.Redis, but answers the commands schedproj sends (every key
    # of a deployment in one slot); typed as the client every store takes.
    return client  # type: ignore[return-value]


def _cluster_client(hosts: list[tuple[str, int]], parts: Any, tls_given: dict[str, str],
                    socket_timeout_s: float, retry: bool) -> FailoverCluster:
    return FailoverCluster(
        startup_nodes=[ClusterNode(host, port)  # type: ignore[no-untyped-call]
                       for host, port in hosts],
        failover_retries=FAILOVER_RETRIES if retry else 0,
        decode_responses=True,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        ssl=parts.scheme == "rediss+cluster",
        socket_timeout=socket_timeout_s, socket_connect_timeout=min(5.0, socket_timeout_s),
        health_check_interval=30,
        # redis-py's own retries: immediate, each after re-reading the slot map. Even a
        # client of one attempt gets one: its map was last read when the command before
        # failed, maybe before the replica took over, and would still name the dead master.
        retry=Retry(NoBackoff(), 2 if retry else 1),
        **tls_given)


class FailoverCluster(RedisCluster):
    """redis-py's cluster client, with each command retried with backoff while a failover
    is under way (the cluster says CLUSTERDOWN, or the slot's master does not answer)."""

    def __init__(self, *, failover_retries: int, **kwargs: Any) -> None:
        # Set first: the parent's __init__ already sends commands (COMMAND).
        self._failover_retry = Retry(ExponentialBackoff(cap=2.0, base=0.1), failover_retries,
                              supported_errors=(redis.ConnectionError, redis.TimeoutError,
                                                redis.exceptions.ClusterDownError,
                                                redis.exceptions.SlotNotCoveredError))
        super().__init__(**kwargs)

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        parent = super().execute_command
        return self._failover_retry.call_with_retry(
            lambda: parent(*args, **kwargs),  # type: ignore[no-untyped-call]
            lambda _: None)


def cluster_key_prefix(prefix: str) -> str:
    """``prefix`` as a Redis Cluster needs it: with a hash tag, so every key of the
    deployment (all are ``<prefix>:...``) hashes to one slot and every script may touch
    them together. A prefix that has one is kept; else the whole prefix becomes the tag
    (``schedproj`` -> ``{schedproj}``)."""
    return prefix if hash_tag(prefix) else "{" + prefix.replace("{", "").replace("}", "") + "}"


def hash_tag(prefix: str) -> str | None:
    """The hash tag every key ``<prefix>:...`` hashes by, or None when a key's slot would
    depend on the rest of its name: Redis hashes only what lies between the first ``{`` and
    the first ``}`` after it, when that is not empty."""
    start = prefix.find("{")
    end = prefix.find("}", start + 1) if start >= 0 else -1
    if start < 0 or end < 0 or end == start + 1:
        return None
    return prefix[start + 1:end]


def socket_timeout_of(client: redis.Redis) -> float | None:
    """The socket timeout ``client``'s connections use (a cluster client has no single
    connection pool to ask)."""
    timeout = client.get_connection_kwargs().get("socket_timeout")
    return None if timeout is None else float(timeout)


def follow_switches(sentinel: Sentinel, service: str, client: redis.Redis) -> None:
    """Drop the client's connections the moment the sentinels announce a new master.

    Until Sentinel demotes the old master, it keeps accepting writes from clients still
    connected to it (seen here: about 10 s after SENTINEL FAILOVER). Listening for
    ``+switch-master`` moves this client to the new master within a moment instead, so beat,
    workers and holders all write to the same server again.
    """

    def listen() -> None:
        while True:
            try:
                # Any: Redis.pubsub is untyped in some accepted redis-py versions.
                watcher: Any = redis.Redis(host=sentinel.sentinels[0].connection_pool
                                      .connection_kwargs["host"],
                                      port=sentinel.sentinels[0].connection_pool
                                      .connection_kwargs["port"],
                                      decode_responses=True, socket_timeout=None)
                pubsub = watcher.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe("+switch-master")
                for message in pubsub.listen():
                    if str(message.get("data", "")).split(" ")[:1] == [service]:
                        client.connection_pool.disconnect()
            except redis.RedisError:
                # That sentinel is gone: try the next one after a pause.
                sentinel.sentinels.append(sentinel.sentinels.pop(0))
                time.sleep(1.0)

    threading.Thread(target=listen, name=f"schedproj-sentinel-{service}", daemon=True).start()


def mask(url: str) -> str:
    """The URL with its password replaced, safe for logs and errors."""
    parts = urlsplit(url)
    query = re.sub(r"(password=)[^&]*", r"\1***", parts.query)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{netloc.rpartition('@')[2]}"
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception it was raised from or during (kombu wraps redis-py's)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


#: How a plain client's first command ends at a TLS port: the server drops the connection.
_CLOSED = re.compile(r"reset by peer|closed by server|Connection closed|\b104\b|EOF",
                     re.IGNORECASE)


def _speaks_tls(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """Whether ``host:port`` completes a TLS handshake (its certificate is not checked: this
    only tells a TLS port from a plain one)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw, \
                context.wrap_socket(raw, server_hostname=host):
            return True
    except (OSError, ValueError):
        return False


def _speaks_plain_redis(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """Whether ``host:port`` answers a plain-text PING as Redis does (``+PONG``, or an error
    such as ``-NOAUTH``): a plain port named by a ``rediss://`` URL."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw:
            raw.sendall(b"PING\r\n")
            return raw.recv(64)[:1] in (b"+", b"-")
    except OSError:
        return False


def describe_failure(url: str, exc: BaseException, setting: str,
                     ca_setting: str = "SCHEDPROJ_REDIS_SSL_CA_CERTS") -> tuple[str, bool]:
    """One line for the operator on why connecting to ``url`` failed: the URL masked, the
    setting that names it, the fix; and whether it is a configuration problem that retrying
    cannot cure (wrong credentials, an untrusted certificate, TLS on one side only).

    The line never holds the URL's password, even if a library put it in its message."""
    parts = urlsplit(url)
    server = "RabbitMQ" if parts.scheme.endswith(("amqp", "amqps", "librabbitmq")) else "Redis"
    where = f"{server} at {mask(url)} ({setting})"
    chain = _chain(exc)
    text = " | ".join(str(e) for e in chain)
    detail = _first_line(str(exc) or text).rstrip(".")
    fatal = True
    if any(isinstance(e, redis.AuthenticationError) for e in chain) or re.search(
            r"WRONGPASS|NOAUTH|invalid username-password|invalid password|ACCESS_REFUSED", text):
        line = (f"{where} refused the credentials ({detail}). Fix: correct the user "
                f"and password in {setting}")
    elif any(isinstance(e, ssl.SSLCertVerificationError) for e in chain) or \
            "CERTIFICATE_VERIFY_FAILED" in text:
        reason = next((e.verify_message for e in chain
                       if isinstance(e, ssl.SSLCertVerificationError)), "") or "verify failed"
        line = (f"{where}: the server's TLS certificate is not trusted ({reason}). Fix: set "
                f"{ca_setting} (or ?ssl_ca_certs= in {setting}) to the CA file that signed it")
    elif any(isinstance(e, ssl.SSLError) for e in chain) or "WRONG_VERSION_NUMBER" in text:
        line = (f"{where}: TLS handshake failed ({detail}); the port may not speak "
                f"TLS. Fix: use redis:// in {setting} for a plain port, rediss:// for a TLS port")
    elif parts.scheme == "rediss" and parts.hostname and "Timeout" in text and \
            _speaks_plain_redis(parts.hostname, parts.port or 6379):
        line = (f"{where}: the port does not speak TLS (a plain Redis answers there) but the "
                f"URL is rediss://. Fix: use redis:// in {setting}, or the server's tls-port")
    elif parts.scheme == "redis" and parts.hostname and _CLOSED.search(text) and \
            _speaks_tls(parts.hostname, parts.port or 6379):
        line = (f"{where}: the port speaks TLS but the URL is plain redis:// (the server closed "
                f"the connection). Fix: use rediss:// in {setting}")
    else:
        fatal = False
        line = f"{where}: {detail}"
    if parts.password:
        line = line.replace(unquote(parts.password), "***").replace(parts.password, "***")
    return line, fatal


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "no answer"
