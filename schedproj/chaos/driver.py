"""The chaos run: real workers, beats and Redis, while a driver keeps breaking them.

Several heavy workers, a light worker and two beats run the chaos lanes against a private
Redis for a bounded time. The driver repeatedly SIGKILLs the heavy worker holding the lease,
SIGKILLs the active beat (and starts a fresh standby), SIGSTOPs the holder past the lease TTL
and resumes it, restarts the state Redis (which keeps nothing: state is lost), and blocks Redis
with SIGSTOP for a while. The run journal, dispatch log and fenced ledger live on a second
private Redis that is never harmed, and the audit reads them at the end.

With ``sentinel=True`` the state and lease live on a real Sentinel set instead (one master,
one replica, three sentinels; beat and workers get its ``redis+sentinel://`` URL, the broker a
plain Redis of its own), and one more fault kind fails it over to a replica made to lag, so
the promoted replica lacks the latest writes: by SIGKILL of the master and by
``SENTINEL FAILOVER``, in turn. Restarts and freezes then hit the Sentinel master (and the
broker with it).
"""

from __future__ import annotations

import contextlib
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

from schedproj.chaos.audit import (
    FAMILY,
    FAMILY_CADENCE_S,
    FAMILY_JITTER,
    FAMILY_MEMBERS_ENV,
    LOCK_DIR_ENV,
    FencedLedger,
    audit,
    family_members,
    overlaps_key,
)
from schedproj.core.errors import ConfigurationError
from schedproj.devtools.embedded import answers, free_port
from schedproj.devtools.processes import Spawned, spawn, stop_all
from schedproj.devtools.sentinel import LOCKOUT, SentinelSet
from schedproj.store.connection import connect
from schedproj.store.lane_store import LaneStore
from schedproj.store.protocol import Keys

PREFIX = "chaos"
LEASE_TTL_S = 2.0
START_DEADLINE_S = 4.0
BEAT_LOCK_TTL_S = 3.0
LOOP_S = 0.5
CADENCES = {"chaos.h1": 2.0, "chaos.h2": 3.0, "chaos.h3": 4.0, "chaos.pulse": 1.0}
FAULTS = ("kill-heavy", "kill-beat", "pause-heavy", "restart-redis", "block-redis",
          "lose-redis-mid-run", "freeze-beat", "restart-redis-under-light")
#: Faults after which Redis holds none of the state it had (restarted without persistence).
STATE_LOSSES = ("restart-redis", "lose-redis-mid-run", "restart-redis-under-light")
#: The fault kind of a run on a Sentinel set: a failover to a lagging replica.
FAILOVER = "failover"
#: Names ``min_faults`` may use besides fault kinds: a group counts all its kinds.
FAULT_GROUPS = {"state-loss": STATE_LOSSES}
#: Sentinel timings of the chaos set: a master silent this long is down. Above the Redis
#: freeze fault (lease TTL + 1 s, plus a sentinel ping period), so a freeze is no failover.
SENTINEL_DOWN_AFTER_MS = 5000
#: How long after a fault's action returns the fleet may still be recovering from it (the
#: audit does not count this time against a lane's wait). The other actions return only once
#: the fleet is back (a new holder started, a standby beat took over, the paused holder's
#: lease passed on).
RECOVERY_AFTER_S = {
    # Redis came back empty (or a replica was promoted): a quarantine, then beat's next loop.
    **dict.fromkeys((*STATE_LOSSES, FAILOVER), 4 / 3 * LEASE_TTL_S + LOOP_S),
    # Redis resumed after the beat lock may have lapsed: a beat takes it again.
    "block-redis": BEAT_LOCK_TTL_S + LOOP_S,
}
#: The long run of the README: every minimum met, on a Sentinel set.
LONG_PROFILE: dict[str, Any] = {
    "duration_s": 600.0, "sentinel": True, "max_duration_s": 5400.0,
    "min_faults": {"state-loss": 100, FAILOVER: 20, "freeze-beat": 20},
}


def fault_kinds(sentinel: bool) -> tuple[str, ...]:
    """The fault kinds a run injects, in turn."""
    return (*FAULTS, FAILOVER) if sentinel else FAULTS


def parse_min_faults(text: str) -> dict[str, int]:
    """``state-loss=100,failover=20`` -> {"state-loss": 100, "failover": 20}."""
    known = {*FAULTS, FAILOVER, *FAULT_GROUPS}
    out: dict[str, int] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, _, value = item.partition("=")
        if name not in known or not value.isdigit():
            raise ConfigurationError(
                f"--min-faults: {item!r} is not KIND=COUNT; the kinds are "
                f"{', '.join(sorted(known))}")
        out[name] = int(value)
    return out


def fault_count(kills: Counter[str], name: str) -> int:
    return sum(kills[k] for k in FAULT_GROUPS.get(name, (name,)))
#: How long the beat-freeze fault stalls a beat between recording and sending: past its lock.
FREEZE_S = BEAT_LOCK_TTL_S + 1.5


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

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, decode_responses=True, socket_timeout=1)

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

    def spawn(self, role: str, **extra_env: str) -> Child:
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
        started = spawn(name, argv, {**self.env, **extra_env}, self.logdir / f"{name}.log")
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
    #: Children the driver killed on purpose (any other that died is a worker exit).
    killed: set[int] = field(default_factory=set)
    #: When Redis came back empty after each state loss (to measure the quarantine's wait).
    losses: list[float] = field(default_factory=list)
    lease_recovery_s: list[float] = field(default_factory=list)
    failover_s: list[float] = field(default_factory=list)
    paused_fences: list[int] = field(default_factory=list)
    #: Sentinel failovers: how each was made, how long until the replica was promoted, and
    #: how many bytes of replication stream the promoted replica lacked.
    failover_methods: Counter[str] = field(default_factory=Counter)
    promotion_s: list[float] = field(default_factory=list)
    replica_behind: list[int] = field(default_factory=list)
    #: (began, fault kind, ended) of every fault injected.
    log: list[tuple[float, str, float]] = field(default_factory=list)


def run_chaos(duration_s: float = 60.0, heavy_workers: int = 3, fault_every_s: float = 4.0,
              say: TextIO = sys.stderr, *, sentinel: bool = False,
              min_faults: dict[str, int] | None = None,
              max_duration_s: float | None = None,
              dump_to: Path | None = None, members: int = 100) -> dict[str, Any]:
    """Run the chaos scenario and return the figure table (see :func:`render`).

    It runs at least ``duration_s``, and on until every count of ``min_faults`` (a fault kind
    or a group of :data:`FAULT_GROUPS`) was injected, at most ``max_duration_s``. With
    ``dump_to``, the journal, dispatch log, ledger and fault times are written there as JSON
    for a closer look. A light lane family of ``members`` members runs next to the ordinary
    lanes, its member set given by a members hook (so it comes back after a state loss)."""
    with tempfile.TemporaryDirectory(prefix="schedproj-chaos-") as tmp, \
            contextlib.ExitStack() as cleanup:
        work = Path(tmp)
        # Plain: one Redis is broker and state. Sentinel: this one is the broker only.
        broker, audit_redis = RedisProc(work, "state"), RedisProc(work, "audit")
        # Every server is stopped however the run ends (a fault that fails included).
        cleanup.callback(broker.kill)
        cleanup.callback(audit_redis.kill)
        broker.start()
        audit_redis.start()
        sset: SentinelSet | None = None
        state_url = broker.url
        if sentinel:
            (work / "sentinel").mkdir()
            sset = SentinelSet(work / "sentinel", down_after_ms=SENTINEL_DOWN_AFTER_MS,
                               failover_timeout_ms=10_000)
            cleanup.callback(sset.stop)
            sset.start()
            state_url = sset.url
        # A brand-new Redis: nothing ran before, so the first grant needs no quarantine (the
        # state-loss faults below are what must wait one).
        LaneStore(connect(state_url), Keys(PREFIX)).declare_fresh()
        (work / "locks").mkdir()
        fleet = Fleet(env={**chaos_env(state_url, audit_redis.url, work / "locks",
                                       broker_url=broker.url),
                           FAMILY_MEMBERS_ENV: str(members)}, logdir=work)
        figures = Figures()
        scene = Scene(fleet, broker, audit_redis, figures, sset)
        started = time.time()
        exits: list[str] = []
        try:
            for _ in range(heavy_workers):
                fleet.spawn("heavy")
            fleet.spawn("light")
            fleet.spawn("beat")
            fleet.spawn("beat")
            drive(scene, duration_s, fault_every_s, say, min_faults or {}, max_duration_s)
            exits = [c.name for c in fleet.children
                     if c.role != "beat" and not c.alive() and c.popen.pid not in figures.killed]
        finally:
            fleet.stop()
            ended = time.time()
        report = collect(audit_redis, figures, started, ended, members=members)
        if dump_to is not None:
            dump(audit_redis, figures, dump_to)
        return {**report, **run_figures(figures, exits, sentinel, min_faults or {}),
                "details": {**report["details"], "worker_exits": exits}}


def run_figures(figures: Figures, exits: list[str], sentinel: bool,
                min_faults: dict[str, int]) -> dict[str, Any]:
    """The report's figures about the run itself (besides the audit's)."""
    return {"worker_exits": len(exits), "sentinel": sentinel,
            "state_loss_faults": fault_count(figures.kills, "state-loss"),
            "min_faults": dict(min_faults),
            "min_faults_met": all(fault_count(figures.kills, k) >= n
                                  for k, n in min_faults.items())}


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


def active_beat(sc: Scene) -> Child | None:
    try:
        info = sc.state_client().hgetall(Keys(PREFIX).beat_info)
    except redis.RedisError:
        return None
    pid = int(info.get("pid", 0))
    return next((c for c in sc.fleet.live("beat") if c.popen.pid == pid), None)


def wait_until(predicate: Callable[[], bool], timeout_s: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.05)
    return None


def drive(sc: Scene, duration_s: float, fault_every_s: float, say: TextIO,
          min_faults: dict[str, int], max_duration_s: float | None) -> None:
    t0 = time.monotonic()
    deadline = t0 + duration_s
    cap = t0 + max(duration_s, max_duration_s or duration_s)
    kinds = fault_kinds(sc.sentinel is not None)
    wait_until(lambda: current_holder(sc.audit_redis) is not None, 30)
    n = 0

    def owed() -> bool:
        return any(fault_count(sc.figures.kills, k) < m for k, m in min_faults.items())

    while (time.monotonic() < deadline - fault_every_s or owed()) \
            and time.monotonic() < cap - fault_every_s:
        time.sleep(fault_every_s)
        kind = kinds[n % len(kinds)]
        n += 1
        began = time.time()
        ACTIONS[kind](sc)
        sc.figures.log.append((began, kind, time.time()))
        say.write(f"chaos {time.monotonic() - t0:7.1f}s: {kind}\n")
        say.flush()
    time.sleep(max(0.0, deadline - time.monotonic()))


@dataclass
class Scene:
    """What a fault acts on. ``state`` is the state Redis (and broker); with ``sentinel``
    the state lives on the Sentinel set and ``state`` is the broker only."""

    fleet: Fleet
    state: RedisProc
    audit_redis: RedisProc
    figures: Figures
    sentinel: SentinelSet | None = None

    def state_client(self) -> redis.Redis:
        """A plain client of the server holding the state now (no retries, short timeout)."""
        if self.sentinel is None:
            return self.state.client()
        port = self.sentinel.master_port() or 0
        return redis.Redis(port=port, decode_responses=True, socket_timeout=1,
                           password=LOCKOUT if port in self.sentinel.locked else None)

    def restart_state(self, down_s: float) -> None:
        """The state Redis (and the broker) restart without persistence: all state is lost."""
        self.state.kill()
        if self.sentinel is not None:
            self.sentinel.restart_master(down_s)
        else:
            time.sleep(down_s)
        self.state.start()

    def freeze_state(self, seconds: float) -> None:
        self.state.signal(signal.SIGSTOP)
        master = self.sentinel.master_port() if self.sentinel is not None else None
        if self.sentinel is not None and master is not None:
            self.sentinel.signal_node(master, signal.SIGSTOP)
        time.sleep(seconds)
        if self.sentinel is not None and master is not None:
            self.sentinel.signal_node(master, signal.SIGCONT)
        self.state.signal(signal.SIGCONT)


def _kill_heavy(sc: Scene) -> None:
    holder = current_holder(sc.audit_redis)
    worker = sc.fleet.holding(int(holder["pid"])) if holder else None
    if holder is None or worker is None:
        return
    worker.signal(signal.SIGKILL)
    sc.figures.killed.add(worker.popen.pid)
    sc.figures.kills["kill-heavy"] += 1
    fence = int(holder["fence"])
    took = wait_until(lambda: any(e["ev"] == "start" and e["fence"] > fence
                                  for e in journal(sc.audit_redis)), 30)
    if took is not None:
        sc.figures.lease_recovery_s.append(took)
    sc.fleet.spawn("heavy")


def _pause_heavy(sc: Scene) -> None:
    holder = current_holder(sc.audit_redis)
    worker = sc.fleet.holding(int(holder["pid"])) if holder else None
    if holder is None or worker is None:
        return
    worker.signal(signal.SIGSTOP)
    sc.figures.kills["pause-heavy"] += 1
    sc.figures.paused_fences.append(int(holder["fence"]))
    time.sleep(LEASE_TTL_S + 1.5)
    worker.signal(signal.SIGCONT)


def _kill_beat(sc: Scene) -> None:
    beat = active_beat(sc)
    if beat is None:
        return
    beat.signal(signal.SIGKILL)
    sc.figures.killed.add(beat.popen.pid)
    sc.figures.kills["kill-beat"] += 1
    took = wait_until(lambda: (b := active_beat(sc)) is not None and b is not beat, 30)
    if took is not None:
        sc.figures.failover_s.append(took)
    sc.fleet.spawn("beat")


def _restart_redis(sc: Scene, down_s: float = 0.5, kind: str = "restart-redis") -> None:
    sc.figures.kills[kind] += 1
    sc.restart_state(down_s)
    sc.figures.losses.append(time.time())


def _lose_redis_mid_run(sc: Scene) -> None:
    """Redis restarts empty while a heavy run holds the lease, down well under a TTL: the
    case where a beat used to grant a second lease while the first holder ran on."""
    if wait_until(lambda: current_holder(sc.audit_redis) is not None, 5) is None:
        return
    time.sleep(0.3)
    _restart_redis(sc, down_s=0.2, kind="lose-redis-mid-run")


def _restart_redis_under_light(sc: Scene) -> None:
    """Several quick restarts while the light worker runs (acks_late): it must survive them
    and no light lane may run twice at once."""
    for _ in range(3):
        _restart_redis(sc, down_s=0.2, kind="restart-redis-under-light")
        time.sleep(1.0)


def _block_redis(sc: Scene) -> None:
    sc.figures.kills["block-redis"] += 1
    sc.freeze_state(LEASE_TTL_S + 1.0)


def _freeze_beat(sc: Scene) -> None:
    """A beat stalls between recording its dispatch and publishing it, past its lock; another
    takes over and dispatches; the stalled one then publishes. Its messages must run nothing."""
    frozen = sc.fleet.spawn("beat", SCHEDPROJ_TEST_FREEZE_BEFORE_SEND_S=repr(FREEZE_S))
    for beat in sc.fleet.live("beat"):
        if beat is not frozen:
            beat.signal(signal.SIGKILL)
            sc.figures.killed.add(beat.popen.pid)
    if wait_until(lambda: active_beat(sc) is frozen, 15) is None:
        sc.fleet.spawn("beat")
        return
    sc.fleet.spawn("beat")
    sc.figures.kills["freeze-beat"] += 1
    time.sleep(FREEZE_S + 2.0)
    frozen.signal(signal.SIGKILL)
    sc.figures.killed.add(frozen.popen.pid)
    sc.fleet.spawn("beat")


def _failover(sc: Scene) -> None:
    """The Sentinel set fails over to a replica that lags: it is locked out of the master,
    the master takes the latest writes (a new grant if one comes within a lease TTL) alone,
    then it is SIGKILLed or ``SENTINEL FAILOVER`` is sent, in turn. The old master comes back
    as a replica of the new one before the next fault."""
    s = sc.sentinel
    if s is None or not s.wait_synced(30):
        return
    method = ("sigkill", "command")[sc.figures.kills[FAILOVER] % 2]
    newest = max((int(e["fence"]) for e in journal(sc.audit_redis) if e["ev"] == "start"),
                 default=0)
    master = s.lag_replica()
    wait_until(lambda: any(e["ev"] == "start" and int(e["fence"]) > newest
                           for e in journal(sc.audit_redis)), LEASE_TTL_S)
    replica = s.replica_port()
    try:
        behind = int(s.client(master).info("replication")["master_repl_offset"]) - \
            int(s.client(replica or 0).info("replication").get("slave_repl_offset", 0))
    except redis.RedisError:
        behind = -1
    began = time.monotonic()
    if method == "sigkill":
        s.kill_master()
    else:
        s.command_failover()
    promoted = s.wait_promoted(master, 60)
    if promoted:
        sc.figures.promotion_s.append(time.monotonic() - began)
        sc.figures.losses.append(time.time())
        sc.figures.kills[FAILOVER] += 1
        sc.figures.failover_methods[method] += 1
        sc.figures.replica_behind.append(behind)
    s.rejoin(master)
    s.wait_synced(30)


ACTIONS: dict[str, Callable[[Scene], None]] = {
    "kill-heavy": _kill_heavy, "pause-heavy": _pause_heavy, "kill-beat": _kill_beat,
    "restart-redis": _restart_redis, "block-redis": _block_redis,
    "lose-redis-mid-run": _lose_redis_mid_run, "freeze-beat": _freeze_beat,
    "restart-redis-under-light": _restart_redis_under_light, FAILOVER: _failover,
}


def collect(audit_redis: RedisProc, figures: Figures, started: float,
            ended: float, members: int = 0) -> dict[str, Any]:
    client = redis.Redis.from_url(audit_redis.url, decode_responses=True)
    keys = Keys(PREFIX)
    entries = journal(audit_redis)
    dispatches = [json.loads(x) for x in client.lrange(keys.dispatch_log, 0, -1)]
    # A lane must start again within its cadence plus a slack (a lapsed start deadline, lease
    # TTLs, a beat lock, and the queue behind the other heavy lanes: after a state loss all of
    # them are due at once), not counting the time a fault and its recovery took (faults come
    # every few seconds, and a lane may wait through several; see audit()).
    slack = START_DEADLINE_S + LEASE_TTL_S + BEAT_LOCK_TTL_S + LEASE_TTL_S + 8.0
    bounds = {lane: cadence + slack for lane, cadence in CADENCES.items()}
    # A member falls due at up to (1 + jitter) cadences.
    bounds.update(dict.fromkeys((f"{FAMILY}[{k}]" for k in family_members(members)),
                                FAMILY_CADENCE_S * (1 + FAMILY_JITTER) + slack))
    ledger = FencedLedger(client, PREFIX)
    disruptions = [(began, ended + RECOVERY_AFTER_S.get(kind, 0.0))
                   for began, kind, ended in figures.log]
    report = audit(entries, dispatches, due_bounds_s=bounds, window=(started + 15, ended - 2),
                   ledger=ledger.entries(), disruptions=disruptions)

    def med_max(xs: list[float]) -> dict[str, float | None]:
        return {"median": round(statistics.median(xs), 3) if xs else None,
                "max": round(max(xs), 3) if xs else None}

    os_overlaps = [json.loads(x) for x in client.lrange(overlaps_key(PREFIX), 0, -1)]
    paused = set(figures.paused_fences)
    after_pause = [o for o in os_overlaps if (o.get("holder") or {}).get("fence") in paused]
    return {
        "duration_s": round(ended - started, 1),
        **report.summary(),
        "family_members": members,
        "member_runs": sum(1 for e in entries if e["ev"] == "start"
                           and str(e.get("lane", "")).startswith(f"{FAMILY}[")),
        "members_that_ran": len({e["lane"] for e in entries if e["ev"] == "start"
                                 and str(e.get("lane", "")).startswith(f"{FAMILY}[")}),
        "os_overlaps": len(os_overlaps) - len(after_pause),
        "os_overlaps_with_a_paused_holder": len(after_pause),
        "longest_wait_after_state_loss_s": longest_wait(entries, figures.losses),
        "faults": dict(figures.kills),
        "lease_recovery_after_kill_s": med_max(figures.lease_recovery_s),
        "beat_failover_s": med_max(figures.failover_s),
        "late_writes_refused": ledger.refused(),
        "ledger_monotone": ledger.monotone(),
        "paused_writer_fenced": paused_writers_fenced(entries, figures.paused_fences),
        "failover_methods": dict(figures.failover_methods),
        "failover_promotion_s": med_max(figures.promotion_s),
        "failovers_to_a_lagging_replica": sum(1 for b in figures.replica_behind if b > 0),
        "details": {
            "overlaps": [[a.task, b.task] for a, b in report.overlaps],
            "late_ends": [[a.task, b.task] for a, b in report.late_ends],
            "duplicates": report.duplicates,
            "lost": report.lost,
            "stale_starts": [r.task for r in report.stale_starts],
            "stale_beat_starts": report.stale_beat_starts,
            "unended_unrecorded": report.unended_unrecorded,
            "os_overlaps": [o for o in os_overlaps if o not in after_pause],
        },
    }


def dump(audit_redis: RedisProc, figures: Figures, path: Path) -> None:
    client = redis.Redis.from_url(audit_redis.url, decode_responses=True)
    keys = Keys(PREFIX)
    path.write_text(json.dumps({
        "journal": journal(audit_redis),
        "dispatches": [json.loads(x) for x in client.lrange(keys.dispatch_log, 0, -1)],
        "ledger": FencedLedger(client, PREFIX).entries(),
        "os_overlaps": [json.loads(x) for x in client.lrange(overlaps_key(PREFIX), 0, -1)],
        "faults": figures.log,
    }))


def longest_wait(entries: list[dict[str, Any]], losses: list[float]) -> float | None:
    """After each state loss, how long until a heavy run started again (the quarantine, plus
    waiting for the next lane to fall due); the longest of them."""
    starts = sorted(float(e["t"]) for e in entries if e["ev"] == "start" and e["fence"] > 0)
    waits = [min((t for t in starts if t > back), default=back) - back for back in losses]
    return round(max(waits), 2) if waits else None


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
        ("light family: members / member runs / members that ran",
         f"{report.get('family_members')} / {report.get('member_runs')} / "
         f"{report.get('members_that_ran')}"),
        *((f"faults: {k}", v) for k, v in sorted(report["faults"].items())),
        ("state-loss faults (Redis restarted empty)", report.get("state_loss_faults")),
        *([("failovers by method", report["failover_methods"]),
           ("  ... to a replica lacking the latest writes",
            report["failovers_to_a_lagging_replica"]),
           ("replica promoted after, median / max",
            f"{report['failover_promotion_s']['median']} / "
            f"{report['failover_promotion_s']['max']} s")]
          if report.get("sentinel") else []),
        ("overlaps (must be 0)", report["overlaps"]),
        ("duplicate executions/dispatches (must be 0)", report["duplicates"]),
        ("lost runs (must be 0)", report["lost_runs"]),
        ("runs started with a stale fence (must be 0)", report["stale_starts"]),
        ("overlaps seen by the OS lock (must be 0)", report["os_overlaps"]),
        ("  ... with a SIGSTOPped holder resumed (fenced)",
         report["os_overlaps_with_a_paused_holder"]),
        ("runs from a beat that had lost its lock (must be 0)", report["stale_beat_starts"]),
        ("killed runs recorded lost", report["recorded_lost"]),
        ("killed runs not recorded (state lost with them)", report["unended_unrecorded"]),
        ("worker exits (must be 0)", report["worker_exits"]),
        ("longest wait after a state loss",
         f"{report['longest_wait_after_state_loss_s']} s"),
        ("fenced stragglers (stopped at a checkpoint)", report["fenced_stragglers"]),
        ("ends journaled after a newer start, no write after it (late, not overlaps)",
         report["late_ends"]),
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
