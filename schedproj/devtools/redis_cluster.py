"""A real Redis Cluster on loopback: three masters, each with one replica.

Used by the cluster tests (tests/e2e/test_redis_cluster.py). Every node is a ``redis-server
--cluster-enabled yes`` process (:class:`~schedproj.devtools.redis_server.RedisServer`) that
keeps nothing on disk but its ``nodes.conf``. They are joined as ``redis-cli --cluster create
--cluster-replicas 1`` joins them (slots split evenly, ``CLUSTER MEET``, ``CLUSTER
REPLICATE``), by commands sent here: redis-cli polls once a second, which tripled the start.
A cluster node also listens on its port + 10000 (the cluster bus), so ports are picked from a
private range where both are free, below the usual ephemeral range.

The master that holds a deployment's slot can fail over two ways, as a managed service's would:
:meth:`LoopbackCluster.kill_node` (SIGKILL: the other masters agree it failed after the node
timeout, and its replica is elected) or :meth:`LoopbackCluster.manual_failover` (``CLUSTER
FAILOVER`` sent to the replica: it catches up, then takes over, and the old master becomes its
replica). A replica can be made to miss the last writes first, so the promoted one lacks them:
:meth:`LoopbackCluster.lock_out_replica` (its master asks the default user, which the replica
syncs as, for a password it does not have; clients logged in as a user of
:meth:`LoopbackCluster.add_user` carry on). Freezing the replica (SIGSTOP) would not do: the
kernel keeps receiving the replication stream into the socket, and the thawed replica reads
it before it takes over.
"""

from __future__ import annotations

import contextlib
import random
import signal
import socket
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import redis

from schedproj.core.errors import ConfigurationError
from schedproj.devtools.processes import wait_until
from schedproj.devtools.redis_server import RedisServer, redis_server_binary

#: Ports are drawn from here: a node's cluster bus is its port + 10000, which stays below the
#: ephemeral range (32768 and up on Linux) that other tests' free ports come from.
PORT_RANGE = (20000, 22767)
#: The cluster bus port offset Redis uses (fixed by Redis: port + 10000).
BUS_OFFSET = 10000
#: Hash slots of a Redis Cluster.
SLOTS = 16384
#: The password that keeps a lagging replica out of its master (never a credential).
LOCKOUT = "keep-the-replica-out"


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_cluster_port(taken: set[int] | None = None) -> int:
    """A loopback port that is free, with its cluster bus port (+10000) free too."""
    taken = taken or set()
    for _ in range(500):
        port = random.randint(*PORT_RANGE)
        if port not in taken and _bindable(port) and _bindable(port + BUS_OFFSET):
            return port
    raise ConfigurationError(f"no free port pair in {PORT_RANGE} and +{BUS_OFFSET}")


@dataclass
class LoopbackCluster:
    """``masters`` masters and as many replicas on loopback, files under ``workdir``."""

    workdir: Path
    masters: int = 3
    #: How long a node must be unreachable before the others call it failed (Redis's default
    #: is 15 s; short here so a failover takes a few seconds).
    node_timeout_ms: int = 1000
    nodes: dict[int, RedisServer] = field(default_factory=dict)
    #: Masters whose replica :meth:`lock_out_replica` keeps out.
    locked: set[int] = field(default_factory=set)
    #: (CA, certificate, key) PEM files: every node then speaks TLS only, to clients, to its
    #: replicas and on the cluster bus (``rediss+cluster://`` URLs).
    tls: tuple[Path, Path, Path] | None = None

    def __post_init__(self) -> None:
        redis_server_binary()  # fail before starting anything when there is none

    @property
    def ports(self) -> list[int]:
        return sorted(self.nodes)

    @property
    def url(self) -> str:
        """The URL schedproj is given: every node (one would do: the client learns the rest
        from it)."""
        return self.url_of(*self.ports)

    def url_of(self, *ports: int, user: tuple[str, str] | None = None) -> str:
        """A URL naming only these nodes, as a managed service's one configuration endpoint
        (the client asks the first that answers for the slot map), logging in as ``user``
        (name, password) if given; with TLS, ``rediss+cluster://`` trusting the test CA."""
        login = f"{user[0]}:{user[1]}@" if user else ""
        scheme, query = ("rediss+cluster", f"?ssl_ca_certs={self.tls[0]}") if self.tls \
            else ("redis+cluster", "")
        return f"{scheme}://{login}" + ",".join(f"127.0.0.1:{p}" for p in ports) + query

    def _tls_args(self) -> tuple[str, ...]:
        if self.tls is None:
            return ()
        ca, cert, key = self.tls
        # --port 0 after RedisServer's own --port: the last one counts, so no plain port.
        return ("--port", "0", "--tls-port", "{port}", "--tls-cluster", "yes",
                "--tls-replication", "yes", "--tls-ca-cert-file", str(ca), "--tls-cert-file",
                str(cert), "--tls-key-file", str(key), "--tls-auth-clients", "no")

    def start(self, timeout_s: float = 30.0) -> None:
        taken: set[int] = set()
        for i in range(2 * self.masters):
            port = free_cluster_port(taken)
            taken |= {port, port + BUS_OFFSET}
            self.nodes[port] = RedisServer(self.workdir, f"node{i}", port=port, extra_args=(
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(self.node_timeout_ms),
                # A replica that was cut off for a while may still take over: a managed
                # service prefers availability too, and a lagging replica is what the tests
                # need (the quarantine covers what it lacks).
                "--cluster-replica-validity-factor", "0",
                # A replica's first sync starts at once, not after Redis's 5 s wait for
                # more replicas to share it.
                "--repl-diskless-sync-delay", "0",
                *(a.replace("{port}", str(port)) for a in self._tls_args())))
        for node in self.nodes.values():
            node.launch()
        for port in self.nodes:
            # RedisServer's own wait asks the plain port, which a TLS node does not open.
            if not wait_until(partial(self._pings_or_died, port), timeout_s, poll_s=0.05) \
                    or not self.nodes[port].alive():
                raise ConfigurationError(f"the cluster node on port {port} did not start")
        self._join(timeout_s)
        if not wait_until(self.healthy, timeout_s, poll_s=0.1):
            raise ConfigurationError("the loopback cluster did not converge: "
                                     f"{self.describe()}")

    def _join(self, timeout_s: float) -> None:
        """What ``redis-cli --cluster create --cluster-replicas 1`` does, without its
        one-second polls: slots split evenly over the first ``masters`` nodes, every node
        introduced to the first, each remaining node made a replica of one master."""
        ports = self.ports
        masters, replicas = ports[:self.masters], ports[self.masters:]
        step = SLOTS // self.masters
        for i, port in enumerate(masters):
            last = SLOTS - 1 if i == self.masters - 1 else (i + 1) * step - 1
            self.command(port, "CLUSTER", "ADDSLOTSRANGE", i * step, last)
            # Distinct config epochs up front, as redis-cli sets them (else the nodes settle
            # their collisions one by one).
            self.command(port, "CLUSTER", "SET-CONFIG-EPOCH", i + 1)
        for port in ports[1:]:
            self.command(ports[0], "CLUSTER", "MEET", "127.0.0.1", port)

        def everyone_known() -> bool:
            for port in ports:
                text = self._ask(port, "CLUSTER", "NODES")
                if not isinstance(text, str) or len(text.strip().splitlines()) != len(ports) \
                        or "handshake" in text:
                    return False
            return True

        if not wait_until(everyone_known, timeout_s, poll_s=0.05):
            raise ConfigurationError("the loopback cluster's nodes did not meet")
        for master, replica in zip(masters, replicas, strict=True):
            master_id = self.command(master, "CLUSTER", "MYID")
            self.command(replica, "CLUSTER", "REPLICATE", master_id)

    def stop(self) -> None:
        for node in self.nodes.values():
            node.kill()

    # -- reading the topology ------------------------------------------------------------

    def client(self, port: int) -> redis.Redis:
        """A plain client of one node (no redirections followed)."""
        tls: dict[str, Any] = {} if self.tls is None else {
            "ssl": True, "ssl_ca_certs": str(self.tls[0])}
        return redis.Redis(host="127.0.0.1", port=port, decode_responses=True,
                           password=LOCKOUT if port in self.locked else None,
                           socket_timeout=2, socket_connect_timeout=2, **tls)

    def _pings_or_died(self, port: int) -> bool:
        if not self.nodes[port].alive():
            return True
        try:
            return bool(self.client(port).ping())
        except (redis.RedisError, OSError):
            return False

    def command(self, port: int, *args: str | int) -> Any:
        """One command sent to one node (``CLUSTER ...``, which redis-py has no typed call
        for)."""
        return self.client(port).execute_command(*args)  # type: ignore[no-untyped-call]

    def _ask(self, port: int, *command: str) -> object:
        try:
            return self.command(port, *command)
        except redis.RedisError:
            return None

    def live_ports(self) -> list[int]:
        return [p for p, node in self.nodes.items() if node.alive()]

    def slot_of(self, key: str) -> int:
        for port in self.live_ports():
            slot = self._ask(port, "CLUSTER", "KEYSLOT", key)
            if slot is not None:
                return int(str(slot))
        raise ConfigurationError("no cluster node answers")

    def roles(self) -> dict[int, tuple[str, int | None, list[tuple[int, int]]]]:
        """port -> (master | replica, its master's port, slot ranges), as a live node sees
        it (flags of failed nodes included: ``fail`` nodes are left out)."""
        for port in self.live_ports():
            text = self._ask(port, "CLUSTER", "NODES")
            if isinstance(text, str):
                return _parse_nodes(text)
        return {}

    def master_of(self, key: str) -> int | None:
        """The port of the master that holds ``key``'s slot now."""
        slot = self.slot_of(key)
        for port, (role, _, ranges) in self.roles().items():
            if role == "master" and any(lo <= slot <= hi for lo, hi in ranges):
                return port
        return None

    def replica_of(self, master: int) -> int | None:
        return next((p for p, (role, of, _) in self.roles().items()
                     if role == "replica" and of == master), None)

    def healthy(self) -> bool:
        """Every live node says cluster_state:ok, and every replica's link is up."""
        for port in self.live_ports():
            info = self._ask(port, "CLUSTER", "INFO")
            if not isinstance(info, str) or "cluster_state:ok" not in info:
                return False
            try:
                repl = self.client(port).info("replication")
            except redis.RedisError:
                return False
            if repl.get("role") == "slave" and repl.get("master_link_status") != "up":
                return False
        roles = self.roles()
        masters = [p for p, (role, _, ranges) in roles.items() if role == "master" and ranges]
        return len(masters) == self.masters

    def describe(self) -> str:
        return "; ".join(f"{p}: {role} of {of}" if of else f"{p}: {role} {ranges}"
                         for p, (role, of, ranges) in sorted(self.roles().items()))

    # -- failures ------------------------------------------------------------------------

    def kill_node(self, port: int) -> None:
        """SIGKILL one node: what it held and had not yet sent its replica is gone."""
        self.nodes[port].kill()

    def freeze_node(self, port: int) -> None:
        """SIGSTOP a node (a replica made to lag: it receives nothing until thawed)."""
        self.nodes[port].signal(signal.SIGSTOP)

    def thaw_node(self, port: int) -> None:
        self.nodes[port].signal(signal.SIGCONT)

    def add_user(self, name: str, password: str) -> None:
        """An ACL user with every right on every node (ACLs are not replicated): clients that
        log in as it stay unaffected by :meth:`lock_out_replica`, which locks the default
        user, the one a replica without ``masterauth`` syncs as."""
        for port in self.live_ports():
            self.command(port, "ACL", "SETUSER", name, "on", f">{password}", "~*", "&*",
                         "+@all")

    def lock_out_replica(self, master: int) -> None:
        """Keep ``master``'s replica out: the master asks for a password the replica does not
        have and drops its link, so from now on writes land on the master only. Clients
        already connected stay connected (as the tests' own are)."""
        client = self.client(master)
        client.config_set("requirepass", LOCKOUT)
        self.locked.add(master)
        # The command itself: redis-py's client_kill_filter took no "replica" type before 8.
        self.command(master, "CLIENT", "KILL", "TYPE", "replica")

    def let_replicas_in(self, port: int) -> None:
        """Undo :meth:`lock_out_replica` (a no-op on a node that is gone)."""
        if port in self.locked and self.nodes[port].alive():
            with contextlib.suppress(redis.RedisError):
                self.client(port).config_set("requirepass", "")
        self.locked.discard(port)

    def manual_failover(self, replica: int) -> None:
        """``CLUSTER FAILOVER`` on a replica: it catches up with its master, then takes over."""
        self.command(replica, "CLUSTER", "FAILOVER")

    def wait_promoted(self, old_master: int, key: str, timeout_s: float = 30.0) -> int | None:
        """Wait until a live node other than ``old_master`` is the master of ``key``'s slot
        and the cluster is ok again; the new master's port, or None."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            port = self.master_of(key)
            if port is not None and port != old_master and self.ok_without(old_master):
                return port
            time.sleep(0.1)
        return None

    def ok_without(self, port: int) -> bool:
        """cluster_state:ok on every live node other than ``port``."""
        for p in self.live_ports():
            if p == port:
                continue
            info = self._ask(p, "CLUSTER", "INFO")
            if not isinstance(info, str) or "cluster_state:ok" not in info:
                return False
        return True


def _parse_nodes(text: str) -> dict[int, tuple[str, int | None, list[tuple[int, int]]]]:
    """``CLUSTER NODES`` as port -> (role, master's port, slot ranges); failed nodes out."""
    ids: dict[str, int] = {}
    rows = []
    for line in text.strip().splitlines():
        fields = line.split()
        node_id, addr, master_id = fields[0], fields[1], fields[3]
        port = int(addr.split("@")[0].rpartition(":")[2])
        ids[node_id] = port
        rows.append((port, fields[2].split(","), master_id, fields[8:]))
    out: dict[int, tuple[str, int | None, list[tuple[int, int]]]] = {}
    for port, flags, master_id, slots in rows:
        if "fail" in flags or "noaddr" in flags:
            continue
        ranges = []
        for item in slots:
            if item.startswith("["):
                continue  # a slot being migrated
            lo, _, hi = item.partition("-")
            ranges.append((int(lo), int(hi or lo)))
        role = "master" if "master" in flags else "replica"
        out[port] = (role, ids.get(master_id) if role == "replica" else None, ranges)
    return out
