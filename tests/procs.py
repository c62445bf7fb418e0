"""Start and stop real ``celery worker`` / ``celery beat`` processes for end-to-end tests."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from schedproj.devtools.processes import Spawned, spawn, stop_all, wait_for

ROOT = Path(__file__).resolve().parent.parent

#: Small, test-sized timings: a lease that frees itself in 2 s, a beat lock of 3 s.
FAST_SETTINGS = {
    "SCHEDPROJ_LEASE_TTL_S": "2",
    "SCHEDPROJ_START_DEADLINE_S": "5",
    "SCHEDPROJ_HOLD_CAP_S": "1.5",
    "SCHEDPROJ_BEAT_LOCK_TTL_S": "3",
    "SCHEDPROJ_BEAT_MAX_LOOP_INTERVAL_S": "0.5",
    "SCHEDPROJ_LANE_MODULES": "tests.lanes_e2e",
}


#: A started celery process (see schedproj.devtools.processes.Spawned).
Proc = Spawned


@dataclass
class Cluster:
    """Real processes sharing one environment (broker, state Redis, lanes, timings)."""

    env: dict[str, str]
    logdir: Path
    procs: list[Proc] = field(default_factory=list)
    #: The Celery app the processes run (``-A``): schedproj's own, or a test's app module.
    app: str = "schedproj.app"

    def start(self, name: str, *args: str) -> Proc:
        proc = spawn(name, [sys.executable, "-m", "celery", "-A", self.app, *args],
                     self.env, self.logdir / f"{name}.log", cwd=ROOT)
        self.procs.append(proc)
        return proc

    def worker(self, name: str, queue: str, concurrency: int = 1) -> Proc:
        proc = self.start(name, "worker", "-Q", queue, "-c", str(concurrency), "-n",
                          f"{name}@%h", "--without-gossip", "--without-mingle",
                          "--without-heartbeat", "-l", "info")
        wait_for(lambda: "ready." in proc.text() or not proc.alive(), 30, f"{name} ready")
        assert proc.alive(), proc.text()
        return proc

    def beat(self, name: str, *, wait_active: bool = True) -> Proc:
        proc = self.start(name, "beat", "-S", "fair", "-l", "info")
        if wait_active:
            wait_for(lambda: ": active" in proc.text() or not proc.alive(), 30,
                     f"{name} active")
            assert proc.alive(), proc.text()
        return proc

    def stop_all(self, timeout_s: float = 10.0) -> None:
        stop_all(self.procs, timeout_s)
