"""The status server bounds what clients can hold: a capped number of connections at once, and a
deadline for a whole request (a header sent one byte at a time is cut off), with real sockets."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry

from schedproj.settings import Settings
from schedproj.store.protocol import Keys
from schedproj.telemetry import webserver
from schedproj.telemetry.metrics import SchedprojCollector

pytestmark = pytest.mark.timeout(60)

CAP = 3
DEADLINE_S = 1.0


@pytest.fixture
def address(client: redis.Redis, key_prefix: str,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, int]]:
    monkeypatch.setattr(webserver, "MAX_CONNECTIONS", CAP, raising=False)
    monkeypatch.setattr(webserver, "REQUEST_DEADLINE_S", DEADLINE_S, raising=False)
    s = Settings(metrics_port=0, key_prefix=key_prefix)
    registry = CollectorRegistry()
    registry.register(SchedprojCollector(client, Keys(key_prefix), s, ()))
    server = webserver.start(registry, client, Keys(key_prefix), s, ())
    yield "127.0.0.1", server.server_address[1]
    server.shutdown()
    server.server_close()


def fetch(address: tuple[str, int], path: str = "/metrics") -> bytes:
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        return read_all(sock)


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """How long until the server closes ``sock`` (None: still open after ``seconds``)."""
    start = time.monotonic()
    sock.settimeout(0.05)
    while time.monotonic() - start < seconds:
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - start
        except TimeoutError:
            continue
        except ConnectionResetError:
            return time.monotonic() - start
    return None


def test_a_header_sent_byte_by_byte_is_cut_off_at_the_deadline(address: Any) -> None:
    with socket.create_connection(address, timeout=10) as sock:
        request = b"GET /metrics HTTP/1.0\r\nX-Slow: " + b"a" * 1000
        start = time.monotonic()
        cut = False
        for byte in request:  # one byte every 50 ms: each read is quick, the whole is not
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                cut = True
                break
            if closed_within(sock, 0.05) is not None:
                cut = True
                break
        held = time.monotonic() - start
    assert cut, "the slow client held its connection for the whole request"
    assert held < DEADLINE_S + 1.5, f"held {held:.1f}s, deadline {DEADLINE_S}s"


def test_connections_beyond_the_cap_are_turned_away_and_served_again_later(
        address: Any) -> None:
    idle = [socket.create_connection(address, timeout=10) for _ in range(CAP)]
    try:
        time.sleep(0.2)  # each holds a handler thread, reading a request that never comes
        with socket.create_connection(address, timeout=10) as extra:
            reply = read_all(extra)
        assert reply.startswith(b"HTTP/1.0 503"), reply[:200]
        assert b"busy" in reply
        # The idle ones are cut off at the deadline; then the server answers again.
        for sock in idle:
            assert closed_within(sock, DEADLINE_S + 2) is not None
    finally:
        for sock in idle:
            sock.close()
    time.sleep(0.1)
    assert fetch(address).startswith(b"HTTP/1.0 200")


def test_a_normal_request_is_served_and_says_only_schedproj(address: Any) -> None:
    reply = fetch(address, "/api/status")
    assert reply.startswith(b"HTTP/1.0 200")
    assert b"\r\nServer: schedproj\r\n" in reply
    assert b"Python" not in reply.split(b"\r\n\r\n")[0]
