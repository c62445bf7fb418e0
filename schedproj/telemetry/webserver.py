"""Beat's HTTP endpoint: ``/metrics`` (Prometheus, unchanged), the status page and its JSON.

A small stdlib server in a daemon thread. ``/metrics`` answers as prometheus_client's own
server did. The page (``/``) and the JSON (``/api/status``, the same as ``schedproj status
--json``; ``/api/timeline``, the runs of the last hour and each lane's staleness ratio) are
open on a loopback address; bound beyond loopback they need basic auth
(``SCHEDPROJ_STATUS_USER`` and ``SCHEDPROJ_STATUS_PASSWORD``), and without those settings
they are refused, said at start-up in one line with the fix.

Clients cannot hold the server: at most :data:`MAX_CONNECTIONS` are served at once (one thread
each; more are answered 503 at once and closed), and a request must arrive whole within
:data:`REQUEST_DEADLINE_S` (a header sent one byte at a time is cut off there) — so basic auth,
checked once the headers are in, is never waited for longer than that.
"""

from __future__ import annotations

import base64
import hmac
import io
import ipaddress
import json
import logging
import socket
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import redis
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from schedproj.core.lanes import LaneSpec
from schedproj.settings import Settings
from schedproj.store.connection import connect
from schedproj.store.protocol import Keys
from schedproj.telemetry import statuspage
from schedproj.telemetry.entries_view import read_entries
from schedproj.telemetry.observe import observe, wrong_type
from schedproj.telemetry.status import as_json

logger = logging.getLogger(__name__)

#: How many journal entries the page reads (newest first); an hour of runs fits easily.
JOURNAL_READ = 5000
#: Connections served at once (a thread each); a page, its JSON and a few scrapes need a
#: handful, so this leaves room for several browsers without letting a flood start threads.
MAX_CONNECTIONS = 16
#: Seconds a client has to send its whole request; then the connection is closed. Its answer
#: must be written within this too (a client that never reads cannot hold a thread).
REQUEST_DEADLINE_S = 10.0
#: What a client turned away at the cap reads.
BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nServer: schedproj\r\nContent-Type: text/plain"
        b"\r\nConnection: close\r\nRetry-After: 1\r\n\r\nschedproj status server busy: too "
        b"many connections at once; try again\n")


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Deployment:
    """What the page reads: the state Redis (status) and the audit Redis (the journal)."""

    def __init__(self, client: redis.Redis, keys: Keys, settings: Settings,
                 specs: tuple[LaneSpec, ...]) -> None:
        self.client, self.keys, self.settings, self.specs = client, keys, settings, specs
        self.audit = connect(settings.audit_redis_url, tls=settings.redis_tls) \
            if settings.audit_redis_url else client

    def status(self) -> dict[str, Any]:
        s = self.settings
        obs = observe(self.client, self.keys)
        health = obs.health(starvation_threshold_s=s.starvation_threshold_s,
                            hold_cap_s=s.hold_cap_s, profile=s.profile)
        data: dict[str, Any] = json.loads(json.dumps(as_json(obs, health), default=str))
        view = read_entries(self.client, self.keys)
        shown = sorted(view.rows(), key=lambda r: (r["next_due_at"] is None,
                                                   r["next_due_at"] or 0.0))
        data["entries"] = shown[:statuspage.ENTRIES_SHOWN]
        data["entries_total"] = len(shown)
        data.setdefault("problems", []).extend(view.problems)
        return data

    def journal(self, problems: list[str] | None = None) -> list[dict[str, Any]]:
        """The journal's newest entries that are JSON objects; a journal of the wrong type
        is reported in ``problems`` and reads as empty."""
        try:
            raw = self.audit.lrange(self.keys.journal, -JOURNAL_READ, -1)
        except redis.ResponseError as exc:
            if problems is not None:
                problems.append(wrong_type(self.audit, self.keys.journal, "list", exc))
            return []
        entries = []
        for item in raw:
            try:
                entry = json.loads(item)
            except ValueError:
                continue
            if isinstance(entry, dict):
                entries.append(entry)
        return entries

    def read(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """(the status, the journal) for the page; the journal's problems among the
        status's."""
        status = self.status()
        return status, self.journal(status.setdefault("problems", []))


class StatusServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], registry: CollectorRegistry,
                 deployment: Deployment, credentials: tuple[str, str] | None,
                 page_allowed: bool) -> None:
        super().__init__(address, Handler)
        self.registry, self.deployment = registry, deployment
        self.credentials, self.page_allowed = credentials, page_allowed
        self.deadline_s = REQUEST_DEADLINE_S
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread for the connection if one of the slots is free; else a 503 and close,
        written from the accepting thread without waiting on the client."""
        if not self.slots.acquire(blocking=False):
            try:
                request.setblocking(False)
                request.send(BUSY)
            except OSError:
                pass  # the client is gone or not reading: nothing more is owed
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class DeadlineReader(io.RawIOBase):
    """The connection's reads, each waiting no longer than what is left of the request's
    deadline: a per-read timeout alone lets a client that sends a byte now and then hold the
    thread for ever."""

    def __init__(self, sock: socket.socket, deadline_s: float) -> None:
        super().__init__()
        self.sock, self.ends = sock, time.monotonic() + deadline_s

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.ends - time.monotonic()
        if left <= 0:
            raise TimeoutError("request deadline passed")
        self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


class Handler(BaseHTTPRequestHandler):
    server: StatusServer
    #: The ``Server:`` header: no Python or library version for a scanner to match.
    server_version = "schedproj"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.deadline_s)
        self.rfile.close()
        self.rfile = io.BufferedReader(DeadlineReader(self.connection, self.server.deadline_s))

    def version_string(self) -> str:
        return self.server_version

    def do_GET(self) -> None:
        try:
            self._route()
        except Exception:  # a bug must cost one reply, never the connection or a traceback
            logger.exception("status server: %s failed", self.path[:200])
            self._send(500, "text/plain; charset=utf-8",
                       b"schedproj could not build this reply (a bug: beat's log has the "
                       b"details; please report it)\n")

    def _route(self) -> None:
        self.connection.settimeout(self.server.deadline_s)  # the reply's own time to write
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        if path == "/metrics":
            self._send(200, CONTENT_TYPE_LATEST, generate_latest(self.server.registry))
            return
        routes = {"/": self._page, "/status": self._page, "/api/status": self._api_status,
                  "/api/timeline": self._api_timeline}
        route = routes.get(path)
        if route is None:
            self._send(404, "text/plain; charset=utf-8", b"not found: try / or /metrics\n")
            return
        if not self._allowed():
            return
        try:
            route()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._send(503, "text/plain; charset=utf-8",
                       f"Redis unreachable from beat: {exc}\n".encode())
        except redis.RedisError as exc:
            self._send(503, "text/plain; charset=utf-8",
                       f"Redis refused a read from beat: {exc}\n".encode())

    def _allowed(self) -> bool:
        if not self.server.page_allowed:
            self._send(403, "text/plain; charset=utf-8",
                       b"the status page is served beyond loopback only with basic auth: set "
                       b"SCHEDPROJ_STATUS_USER and SCHEDPROJ_STATUS_PASSWORD\n")
            return False
        if self.server.credentials is None:
            return True
        user, password = self.server.credentials
        expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        given = self.headers.get("Authorization", "")
        if hmac.compare_digest(given.encode(), expected.encode()):
            return True
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="schedproj", charset="UTF-8"')
        self.send_header("Content-Length", "0")
        self.end_headers()
        return False

    def _page(self) -> None:
        page = statuspage.render_page(*self.server.deployment.read())
        self._send(200, "text/html; charset=utf-8", page.encode())

    def _api_status(self) -> None:
        self._json(self.server.deployment.status())

    def _api_timeline(self) -> None:
        self._json(statuspage.api_timeline(*self.server.deployment.read()))

    def _json(self, data: Mapping[str, Any]) -> None:
        self._send(200, "application/json", statuspage.dumps(data).encode())

    def _send(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("http: %s", format % args)


def credentials(settings: Settings) -> tuple[tuple[str, str] | None, bool]:
    """(basic-auth credentials or None, whether the page may be served at all); says at
    start-up, in one line with the fix, when the page is refused."""
    password = settings.status_password.get_secret_value() if settings.status_password else None
    if settings.status_user and password:
        return (settings.status_user, password), True
    if is_loopback(settings.metrics_host):
        return None, True
    logger.error("status page refused: SCHEDPROJ_METRICS_HOST=%s is beyond loopback and basic "
                 "auth is not configured. Fix: set SCHEDPROJ_STATUS_USER and "
                 "SCHEDPROJ_STATUS_PASSWORD (or bind to 127.0.0.1); /metrics is served as "
                 "before", settings.metrics_host)
    return None, False


def start(registry: CollectorRegistry, client: redis.Redis, keys: Keys, settings: Settings,
          specs: tuple[LaneSpec, ...]) -> StatusServer:
    """Bind and serve in a daemon thread; returns the server (its address has the port)."""
    assert settings.metrics_port is not None
    creds, allowed = credentials(settings)
    server = StatusServer((settings.metrics_host, settings.metrics_port), registry,
                          Deployment(client, keys, settings, specs), creds, allowed)
    threading.Thread(target=server.serve_forever, name="schedproj-http", daemon=True).start()
    return server
