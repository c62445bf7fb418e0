"""Light workers survive Redis restarts (issue 10, found #4).

A live ``celery -A schedproj.app worker -Q light`` (and beat) on a private ``redis-server``
started for this test on a free loopback port, never the shared one. Redis is restarted
without persistence several times while a light run is in flight (``acks_late``). Before the
fix the worker died on a third of such restarts with ``Unrecoverable error: AttributeError(
"'NoneType' object has no attribute 'hostname'")`` after ``Restoring 1 unacknowledged
message(s)``: kombu restored the running task's message through a transport Celery had
already dropped (see ``schedproj.on_celery.config._BrokerChannel``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from schedproj.devtools.processes import Spawned, spawn, stop_all, wait_for

ROOT = Path(__file__).resolve().parents[2]
RESTARTS = 6

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None,
                                reason="needs the redis-server binary for a private Redis")

LANE_MODULE = textwrap.dedent("""
    import os
    import time

    from celery import shared_task

    from schedproj import Lane, LaneKind, LaneTask


    @shared_task(base=LaneTask, bind=True, name="restart.light",
                 lane=Lane(cadence_s=0.3, kind=LaneKind.LIGHT))
    def light(self):
        with open(os.environ["RESTART_STARTS_FILE"], "a") as out:
            out.write(f"{time.time()}\\n")
        # Long enough that the test can restart Redis while this run is in flight.
        time.sleep(0.8)
        with open(os.environ["RESTART_RUNS_FILE"], "a") as out:
            out.write(f"{time.time()}\\n")
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateRedis:
    """A redis-server of our own, restartable on the same port with its state lost."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)
        wait_for(lambda: _pings(client), 10, "the private redis-server")
        client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # no persistence: everything it held is gone
            self.proc.wait(timeout=10)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.stop()


def runs(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_light_worker_survives_redis_restarts(private_redis: PrivateRedis,
                                              tmp_path: Path) -> None:
    (tmp_path / "restart_lanes.py").write_text(LANE_MODULE)
    runs_file = tmp_path / "runs.txt"
    starts_file = tmp_path / "starts.txt"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SCHEDPROJ_") and k != "CELERY_BROKER_URL"}
    env.update({
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "CELERY_BROKER_URL": private_redis.url,
        "SCHEDPROJ_REDIS_URL": private_redis.url, "SCHEDPROJ_LANE_MODULES": "restart_lanes",
        "SCHEDPROJ_KEY_PREFIX": "restart", "SCHEDPROJ_LEASE_TTL_S": "1.5",
        "SCHEDPROJ_START_DEADLINE_S": "5", "SCHEDPROJ_BEAT_LOCK_TTL_S": "1.5",
        "SCHEDPROJ_BEAT_MAX_LOOP_INTERVAL_S": "0.25", "RESTART_RUNS_FILE": str(runs_file),
        "RESTART_STARTS_FILE": str(starts_file),
    })
    celery = [sys.executable, "-m", "celery", "-A", "schedproj.app"]
    # The public command, with Celery's defaults (gossip, mingle, heartbeat, remote control).
    worker = spawn("light", [*celery, "worker", "-Q", "light", "-c", "2", "-l", "info"], env,
                   tmp_path / "worker.log", cwd=ROOT)
    beat = spawn("beat", [*celery, "beat", "-S", "fair", "-l", "info"], env,
                 tmp_path / "beat.log", cwd=ROOT)
    children: list[Spawned] = [worker, beat]
    try:
        wait_for(lambda: runs(runs_file) >= 2 or not worker.alive(), 60, "first light runs")
        for restart in range(RESTARTS):
            assert worker.alive(), worker.text()[-5000:]
            before = runs(runs_file)
            # Restart only while a run is in flight (started, not finished): its message is
            # unacknowledged (acks_late), the case that killed workers.
            wait_for(lambda: runs(starts_file) > runs(runs_file), 30, "a light run in flight")
            private_redis.stop()
            time.sleep(0.3)
            private_redis.start()
            # Light runs go on after the restart (once beat's state-loss quarantine is over).
            wait_for(lambda b=before: runs(runs_file) > b + 1 or not worker.alive(),  # type: ignore[misc]
                     60, f"light runs after restart {restart + 1}")
        assert worker.alive(), worker.text()[-5000:]
        log = worker.text()
        assert "Unrecoverable error" not in log, log[-5000:]
        assert "Restoring" in log, "no restart found a message in flight: the test proved nothing"
    finally:
        stop_all(children)
