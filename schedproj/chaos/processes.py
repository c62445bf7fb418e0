"""The chaos fleet: heavy workers, a worker for the pool, a light worker and beats as child
processes, and the settings they share (short leases and locks, so faults are felt within
seconds)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from schedproj.chaos.audit import LOCK_DIR_ENV, POOL, POOL_SLOTS
from schedproj.chaos.scheduler import FREEZE_ENV, FREEZING_SCHEDULER
from schedproj.devtools.processes import Spawned, spawn, stop_all

PREFIX = "chaos"
LEASE_TTL_S = 2.0
START_DEADLINE_S = 4.0
BEAT_LOCK_TTL_S = 3.0
LOOP_S = 0.5


def chaos_env(state_url: str, audit_url: str, lock_dir: Path,
              broker_url: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDPROJ_")}
    env.update({
        LOCK_DIR_ENV: str(lock_dir),
        "CELERY_BROKER_URL": broker_url or state_url, "SCHEDPROJ_REDIS_URL": state_url,
        "SCHEDPROJ_AUDIT_REDIS_URL": audit_url, "SCHEDPROJ_KEY_PREFIX": PREFIX,
        "SCHEDPROJ_LANE_MODULES": "schedproj.chaos.lanes",
        "SCHEDPROJ_LEASE_TTL_S": repr(LEASE_TTL_S),
        "SCHEDPROJ_START_DEADLINE_S": repr(START_DEADLINE_S), "SCHEDPROJ_HOLD_CAP_S": "1.2",
        "SCHEDPROJ_BEAT_LOCK_TTL_S": repr(BEAT_LOCK_TTL_S),
        "SCHEDPROJ_BEAT_MAX_LOOP_INTERVAL_S": repr(LOOP_S),
        "SCHEDPROJ_VISIBILITY_TIMEOUT_S": "20", "SCHEDPROJ_HEAVY_TIME_LIMIT_S": "15",
        "SCHEDPROJ_LIGHT_TIME_LIMIT_S": "10",
        "SCHEDPROJ_STARVATION_THRESHOLD_S": "30",
        "SCHEDPROJ_POOLS": ",".join(f"{name}={n}" for name, n in POOL_SLOTS.items()),
    })
    return env


@dataclass
class Child(Spawned):
    """A worker or beat of the chaos fleet."""

    role: str = ""


@dataclass
class Fleet:
    env: dict[str, str]
    logdir: Path
    children: list[Child] = field(default_factory=list)
    serial: int = 0

    def spawn(self, role: str, *, freeze_before_send_s: float = 0.0, **extra_env: str) -> Child:
        """Start a child of ``role``; a beat with ``freeze_before_send_s`` is the frozen beat
        of the beat-freeze fault (:class:`schedproj.chaos.scheduler.FreezingScheduler`)."""
        self.serial += 1
        name = f"{role}{self.serial}"
        base = [sys.executable, "-m", "celery", "-A", "schedproj.app"]
        argv = {
            "heavy": [*base, "worker", "-Q", "heavy", "-c", "1", "-n", f"{name}@%h",
                      "--without-gossip", "--without-mingle", "-l", "info"],
            "light": [*base, "worker", "-Q", "light", "-c", "2", "-n", f"{name}@%h",
                      "--without-gossip", "--without-mingle", "-l", "info"],
            # The pool's worker: as many processes as the pool has slots, on its queue.
            "pool": [*base, "worker", "-Q", POOL, "-c", str(POOL_SLOTS[POOL]), "-n",
                     f"{name}@%h", "--without-gossip", "--without-mingle", "-l", "info"],
            "beat": [*base, "beat", "-S",
                     FREEZING_SCHEDULER if freeze_before_send_s else "fair", "-l", "info"],
        }[role]
        if freeze_before_send_s:
            extra_env = {**extra_env, FREEZE_ENV: repr(freeze_before_send_s)}
        started = spawn(name, argv, {**self.env, **extra_env}, self.logdir / f"{name}.log")
        child = Child(started.name, started.popen, started.log, role=role)
        self.children.append(child)
        return child

    def live(self, role: str) -> list[Child]:
        return [c for c in self.children if c.role == role and c.alive()]

    def holding(self, pid: int, role: str = "heavy") -> Child | None:
        """The worker of ``role`` whose process group contains ``pid`` (the prefork child
        running a lane)."""
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            return None
        return next((c for c in self.live(role) if c.popen.pid == group), None)

    def stop_beats(self) -> None:
        """Stop the beats (SIGTERM, then SIGKILL after a while): nothing is sent any more."""
        stop_all(list(self.live("beat")), timeout_s=15)

    def stop(self) -> None:
        stop_all(list(self.children), timeout_s=15)
