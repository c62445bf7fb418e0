"""The one way this project starts a redis-server of its own.

The demo's private Redis, the Sentinel set and the chaos run all launch their servers here, so
each is started, awaited and stopped the same way: on loopback, on a port of its own, keeping
nothing on disk (a restart comes back empty, which is what the state-loss faults need).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import redis

from schedproj.core.errors import ConfigurationError
from schedproj.devtools.processes import wait_until

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


def redis_server_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        raise ConfigurationError("the redis-server binary is not on PATH. Fix: install the "
                                 "redis-server package (scripts/setup.sh does)")
    return binary


@dataclass
class RedisServer:
    """A redis-server on a fixed loopback port that can be started, killed, started again
    (empty, on the same port) and frozen with signals. Its files live in ``parent/name``."""

    parent: Path
    name: str
    port: int = field(default_factory=free_port)
    #: Arguments after the common ones, e.g. a replica's ``--replicaof`` or a ``--logfile``.
    extra_args: tuple[str, ...] = ()
    #: Lines of a sentinel's configuration: given, the server runs as a Redis Sentinel.
    sentinel_config: str | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.binary = redis_server_binary()
        self.dir = self.parent / self.name
        self.dir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, decode_responses=True, socket_timeout=1)

    def argv(self) -> list[str]:
        if self.sentinel_config is not None:
            # A sentinel rewrites its configuration file, so it must have one of its own.
            conf = self.dir / "sentinel.conf"
            conf.write_text(f"port {self.port}\nbind 127.0.0.1\ndir {self.dir}\n"
                            f"{self.sentinel_config}")
            return [self.binary, str(conf), "--sentinel"]
        return [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.dir), *self.extra_args]

    def launch(self) -> None:
        """Start the server without waiting for it (see :meth:`wait_answering`)."""
        # A replica saves each full sync it receives as dump.rdb, which a start would load:
        # that would be a restart from an old snapshot, not the empty start promised here.
        for old in self.dir.glob("*.rdb"):
            old.unlink()
        self.proc = subprocess.Popen(self.argv(), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)

    def wait_answering(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until the server answers PING; ConfigurationError if it exits or is too slow."""
        if not wait_until(lambda: not self.alive() or answers(self.url, 0.2), timeout_s,
                          poll_s=0.05) or not self.alive():
            code = None if self.proc is None else self.proc.poll()
            raise ConfigurationError(f"the {self.name} redis-server did not start on port "
                                     f"{self.port} (exit code {code})")

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        self.launch()
        self.wait_answering(timeout_s)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: the server and everything it held are gone at once."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it does not exit within ``timeout_s``."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
        self.proc = None

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
