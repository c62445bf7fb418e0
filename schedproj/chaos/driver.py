"""The chaos run: real workers, beats and Redis, while a driver keeps breaking them.

Several heavy workers, a light worker and two beats run the chaos lanes against a private
Redis for a bounded time. The driver repeatedly SIGKILLs the heavy worker holding the lease,
SIGKILLs the active beat (and starts a fresh standby), SIGSTOPs the holder past the lease TTL
and resumes it, restarts the state Redis (which keeps nothing: state is lost), and blocks Redis
with SIGSTOP for a while. The run journal, dispatch log and fenced ledger live on a second
private Redis that is never harmed, and the audit reads them at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import redis

from schedproj.audit import FencedLedger, audit
from schedproj.embedded import answers, free_port
from schedproj.errors import ConfigurationError
from schedproj.keys import Keys
from schedproj.processes import Spawned, spawn, stop_all

PREFIX = "chaos"
LEASE_TTL_S = 2.0
START_DEADLINE_S = 4.0
BEAT_LOCK_TTL_S = 3.0
LOOP_S = 0.5
CADENCES = {"chaos.h1": 2.0, "chaos.h2": 3.0, "chaos.h3": 4.0, "chaos.pulse": 1.0}
FAULTS = ("kill-heavy", "kill-beat", "pause-heavy", "restart-redis", "block-redis")


class RedisProc:
    """A redis-server on a fixed loopback port that can be killed, restarted and frozen."""

    def __init__(self, workdir: Path, name: str) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ConfigurationError("the chaos run needs the redis-server binary on PATH")
        self.binary, self.dir, self.name = binary, workdir / name, name
        self.dir.mkdir()
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not answers(self.url, 0.2):
            if time.monotonic() > deadline:
                raise ConfigurationError(f"{self.name} redis did not start on {self.port}")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def signal(self, sig: int) -> None:
        if self.proc is not None:
            self.proc.send_signal(sig)


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

    def spawn(self, role: str) -> Child:
        self.serial += 1
        name = f"{role}{self.serial}"
        base = [sys.executable, "-m", "celery", "-A", "schedproj.app"]
        argv = {
            "heavy": [*base, "worker", "-Q", "heavy", "-c", "1", "-n", f"{name}@%h",
                      "--without-gossip", "--without-mingle", "-l", "info"],
            "light": [*base, "worker", "-Q", "light", "-c", "2", "-n", f"{name}@%h",
                      "--without-gossip", "--without-mingle", "-l", "info"],
            "beat": [*base, "beat", "-S", "fair", "-l", "info"],
        }[role]
        started = spawn(name, argv, self.env, self.logdir / f"{name}.log")
        child = Child(started.name, started.popen, started.log, role=role)
        self.children.append(child)
        return child

    def live(self, role: str) -> list[Child]:
        return [c for c in self.children if c.role == role and c.alive()]

    def holding(self, pid: int) -> Child | None:
        """The worker whose process group contains ``pid`` (the pool child running a lane)."""
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            return None
        return next((c for c in self.live("heavy") if c.popen.pid == group), None)

    def stop(self) -> None:
        stop_all(list(self.children), timeout_s=15)


@dataclass
class Figures:
    kills: Counter[str] = field(default_factory=Counter)
    lease_recovery_s: list[float] = field(default_factory=list)
    failover_s: list[float] = field(default_factory=list)
    paused_fences: list[int] = field(default_factory=list)


def run_chaos(duration_s: float = 60.0, heavy_workers: int = 3, fault_every_s: float = 4.0,
              say: TextIO = sys.stderr) -> dict[str, Any]:
    """Run the chaos scenario and return the figure table (see :func:`render`)."""
    with tempfile.TemporaryDirectory(prefix="schedproj-chaos-") as tmp:
        work = Path(tmp)
        state, audit_redis = RedisProc(work, "state"), RedisProc(work, "audit")
        state.start()
        audit_redis.start()
        fleet = Fleet(env=chaos_env(state.url, audit_redis.url), logdir=work)
        figures = Figures()
        started = time.time()
        try:
            for _ in range(heavy_workers):
                fleet.spawn("heavy")
            fleet.spawn("light")
            fleet.spawn("beat")
            fleet.spawn("beat")
            drive(fleet, state, audit_redis, figures, duration_s, fault_every_s, say)
        finally:
            fleet.stop()
            ended = time.time()
        report = collect(audit_redis, figures, started, ended)
        state.kill()
        audit_redis.kill()
        return report


def chaos_env(state_url: str, audit_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDPROJ_")}
    env.update({
        "CELERY_BROKER_URL": state_url, "SCHEDPROJ_REDIS_URL": state_url,
        "SCHEDPROJ_AUDIT_REDIS_URL": audit_url, "SCHEDPROJ_KEY_PREFIX": PREFIX,
        "SCHEDPROJ_LANE_MODULES": "schedproj.chaos.lanes",
        "SCHEDPROJ_LEASE_TTL_S": repr(LEASE_TTL_S),
        "SCHEDPROJ_START_DEADLINE_S": repr(START_DEADLINE_S), "SCHEDPROJ_HOLD_CAP_S": "1.2",
        "SCHEDPROJ_BEAT_LOCK_TTL_S": repr(BEAT_LOCK_TTL_S),
        "SCHEDPROJ_BEAT_MAX_LOOP_INTERVAL_S": repr(LOOP_S),
        "SCHEDPROJ_VISIBILITY_TIMEOUT_S": "20", "SCHEDPROJ_HEAVY_TIME_LIMIT_S": "15",
        "SCHEDPROJ_LIGHT_TIME_LIMIT_S": "10",
        "SCHEDPROJ_STARVATION_THRESHOLD_S": "30",
    })
    return env


def journal(audit_redis: RedisProc) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(audit_redis.url, decode_responses=True)
    return [json.loads(x) for x in client.lrange(Keys(PREFIX).journal, 0, -1)]


def current_holder(audit_redis: RedisProc) -> dict[str, Any] | None:
    """The newest heavy run that started and has not ended, from the journal."""
    open_runs: dict[str, dict[str, Any]] = {}
    for e in journal(audit_redis):
        if e["fence"] <= 0:
            continue
        if e["ev"] == "start":
            open_runs[e["task"]] = e
        else:
            open_runs.pop(e["task"], None)
    return max(open_runs.values(), key=lambda e: e["t"], default=None)


def active_beat(fleet: Fleet, state: RedisProc) -> Child | None:
    try:
        info = redis.Redis.from_url(state.url, decode_responses=True,
                                    socket_timeout=1).hgetall(Keys(PREFIX).beat_info)
    except redis.RedisError:
        return None
    pid = int(info.get("pid", 0))
    return next((c for c in fleet.live("beat") if c.popen.pid == pid), None)


def wait_until(predicate: Callable[[], bool], timeout_s: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.05)
    return None


def drive(fleet: Fleet, state: RedisProc, audit_redis: RedisProc, figures: Figures,
          duration_s: float, fault_every_s: float, say: TextIO) -> None:
    deadline = time.monotonic() + duration_s
    wait_until(lambda: current_holder(audit_redis) is not None, 30)
    n = 0
    while time.monotonic() < deadline - fault_every_s:
        time.sleep(fault_every_s)
        kind = FAULTS[n % len(FAULTS)]
        n += 1
        inject(kind, fleet, state, audit_redis, figures)
        say.write(f"chaos {time.monotonic() - deadline + duration_s:6.1f}s: {kind}\n")
    time.sleep(max(0.0, deadline - time.monotonic()))


def inject(kind: str, fleet: Fleet, state: RedisProc, audit_redis: RedisProc,
           figures: Figures) -> None:
    if kind in ("kill-heavy", "pause-heavy"):
        holder = current_holder(audit_redis)
        worker = fleet.holding(int(holder["pid"])) if holder else None
        if holder is None or worker is None:
            return
        if kind == "kill-heavy":
            worker.signal(signal.SIGKILL)
            figures.kills[kind] += 1
            fence = int(holder["fence"])
            took = wait_until(lambda: any(e["ev"] == "start" and e["fence"] > fence
                                          for e in journal(audit_redis)), 30)
            if took is not None:
                figures.lease_recovery_s.append(took)
            fleet.spawn("heavy")
        else:
            worker.signal(signal.SIGSTOP)
            figures.kills[kind] += 1
            figures.paused_fences.append(int(holder["fence"]))
            time.sleep(LEASE_TTL_S + 1.5)
            worker.signal(signal.SIGCONT)
    elif kind == "kill-beat":
        beat = active_beat(fleet, state)
        if beat is None:
            return
        beat.signal(signal.SIGKILL)
        figures.kills[kind] += 1
        took = wait_until(lambda: (b := active_beat(fleet, state)) is not None and b is not beat,
                          30)
        if took is not None:
            figures.failover_s.append(took)
        fleet.spawn("beat")
    elif kind == "restart-redis":
        state.kill()
        figures.kills[kind] += 1
        time.sleep(0.5)
        state.start()
    elif kind == "block-redis":
        state.signal(signal.SIGSTOP)
        figures.kills[kind] += 1
        time.sleep(LEASE_TTL_S + 1.0)
        state.signal(signal.SIGCONT)


def collect(audit_redis: RedisProc, figures: Figures, started: float,
            ended: float) -> dict[str, Any]:
    client = redis.Redis.from_url(audit_redis.url, decode_responses=True)
    keys = Keys(PREFIX)
    entries = journal(audit_redis)
    dispatches = [json.loads(x) for x in client.lrange(keys.dispatch_log, 0, -1)]
    # A lane must start again within its cadence plus the longest recovery a fault can cause
    # (a lapsed start deadline, the lease TTL, a beat failover, a blocked or restarted Redis).
    slack = START_DEADLINE_S + LEASE_TTL_S + BEAT_LOCK_TTL_S + LEASE_TTL_S + 8.0
    bounds = {lane: cadence + slack for lane, cadence in CADENCES.items()}
    report = audit(entries, dispatches, due_bounds_s=bounds, window=(started + 15, ended - 2))
    ledger = FencedLedger(client, PREFIX)

    def med_max(xs: list[float]) -> dict[str, float | None]:
        return {"median": round(statistics.median(xs), 3) if xs else None,
                "max": round(max(xs), 3) if xs else None}

    return {
        "duration_s": round(ended - started, 1),
        **report.summary(),
        "faults": dict(figures.kills),
        "lease_recovery_after_kill_s": med_max(figures.lease_recovery_s),
        "beat_failover_s": med_max(figures.failover_s),
        "late_writes_refused": ledger.refused(),
        "ledger_monotone": ledger.monotone(),
        "paused_writer_fenced": paused_writers_fenced(entries, figures.paused_fences),
        "details": {
            "overlaps": [[a.task, b.task] for a, b in report.overlaps],
            "duplicates": report.duplicates,
            "lost": report.lost,
            "stale_starts": [r.task for r in report.stale_starts],
        },
    }


def paused_writers_fenced(entries: list[dict[str, Any]], fences: list[int]) -> bool:
    """Every holder paused past its TTL ended knowing it had lost the lease (its renewal or
    a fenced write was refused), so nothing it wrote after losing it was accepted."""
    if not fences:
        return False
    ends = {int(e["fence"]): e for e in entries if e["ev"] == "end"}
    return all(f in ends and ends[f].get("lost") for f in fences)


def render(report: dict[str, Any], out: TextIO) -> None:
    rows = [
        ("duration", f"{report['duration_s']} s"),
        ("heavy runs", report["heavy_runs"]),
        ("light runs", report["light_runs"]),
        *((f"faults: {k}", v) for k, v in sorted(report["faults"].items())),
        ("overlaps (must be 0)", report["overlaps"]),
        ("duplicate executions/dispatches (must be 0)", report["duplicates"]),
        ("lost runs (must be 0)", report["lost_runs"]),
        ("runs started with a stale fence (must be 0)", report["stale_starts"]),
        ("fenced stragglers (stopped at a checkpoint)", report["fenced_stragglers"]),
        ("late writes refused by fence", report["late_writes_refused"]),
        ("ledger fences monotone", report["ledger_monotone"]),
        ("lease recovery after SIGKILL, median / max",
         f"{report['lease_recovery_after_kill_s']['median']} / "
         f"{report['lease_recovery_after_kill_s']['max']} s"),
        ("beat failover, median / max",
         f"{report['beat_failover_s']['median']} / {report['beat_failover_s']['max']} s"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        out.write(f"{k:<{width}}  {v}\n")
