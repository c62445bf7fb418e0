"""The chaos run: real workers, beats and Redis, while a driver keeps breaking them.

Several heavy workers, a worker for a pool of two slots, a light worker and two beats run the
chaos lanes against a private
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
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

import redis

from schedproj.chaos.audit import FAMILY_MEMBERS_ENV
from schedproj.chaos.faults import (
    ACTIONS,
    FAILOVER,
    POLL_S,
    Figures,
    Scene,
    current_holder,
    fault_count,
    fault_kinds,
)
from schedproj.chaos.processes import PREFIX, Fleet, chaos_env
from schedproj.chaos.report import (
    ENTRY_DELIVER_S,
    awaiting_delivery,
    collect,
    dump,
    run_figures,
)
from schedproj.core.entries import EntryState
from schedproj.core.errors import StateError
from schedproj.devtools.processes import wait_until
from schedproj.devtools.redis_server import RedisServer
from schedproj.devtools.sentinel import SentinelSet
from schedproj.store.connection import connect
from schedproj.store.lane_store import LaneStore
from schedproj.store.protocol import Keys

#: Sentinel timings of the chaos set: a master silent this long is down. Above the Redis
#: freeze fault (lease TTL + 1 s, plus a sentinel ping period), so a freeze is no failover.
SENTINEL_DOWN_AFTER_MS = 5000
#: The long run of the README: every minimum met, on a Sentinel set.
LONG_PROFILE: dict[str, Any] = {
    "duration_s": 600.0, "sentinel": True, "max_duration_s": 5400.0,
    "min_faults": {"state-loss": 100, FAILOVER: 20, "freeze-beat": 20},
}


def run_chaos(duration_s: float = 60.0, heavy_workers: int = 3, fault_every_s: float = 4.0,
              say: TextIO = sys.stderr, *, sentinel: bool = False,
              min_faults: dict[str, int] | None = None,
              max_duration_s: float | None = None,
              dump_to: Path | None = None, logs_to: Path | None = None,
              members: int = 100) -> dict[str, Any]:
    """Run the chaos scenario and return the figure table (see :func:`render`).

    It runs at least ``duration_s``, and on until every count of ``min_faults`` (a fault kind
    or a group of :data:`FAULT_GROUPS`) was injected, at most ``max_duration_s``. With
    ``dump_to``, the journal, dispatch log, ledger and fault times are written there as JSON
    for a closer look; with ``logs_to``, every beat's and worker's log is copied there (the
    run's own folder is deleted when it ends). A light lane family of ``members`` members runs
    next to the ordinary lanes, its member set given by a members hook (so it comes back
    after a state loss)."""
    with tempfile.TemporaryDirectory(prefix="schedproj-chaos-") as tmp, \
            contextlib.ExitStack() as cleanup:
        work = Path(tmp)
        scene = start_servers(work, cleanup, sentinel)
        (work / "locks").mkdir()
        scene.fleet.env.update({**chaos_env(scene.state_url, scene.audit_redis.url,
                                            work / "locks", broker_url=scene.state.url),
                                FAMILY_MEMBERS_ENV: str(members)})
        started = time.time()
        exits: list[str] = []
        try:
            start_fleet(scene.fleet, heavy_workers)
            drive(scene, duration_s, fault_every_s, say, min_faults or {}, max_duration_s)
            exits = [c.name for c in scene.fleet.children if c.role != "beat"
                     and not c.alive() and c.popen.pid not in scene.figures.killed]
        finally:
            # Beats first, then the entry messages they published lately are given their
            # delivery time (the audit judges every published message run or lost), then
            # the workers. The entries' state is read once no beat can claim.
            stopping = time.time()
            scene.fleet.stop_beats()
            last_states = entry_states(scene)
            wait_until(lambda: not awaiting_delivery(scene.audit_redis.client(),
                                                     stopping - ENTRY_DELIVER_S),
                       ENTRY_DELIVER_S, poll_s=POLL_S)
            scene.fleet.stop()
            ended = time.time()
            if logs_to is not None:
                keep_logs(scene.fleet, logs_to)
        report = collect(scene.audit_redis, scene.figures, started, ended, members=members,
                         stopping=stopping, entry_states=last_states)
        if dump_to is not None:
            dump(scene.audit_redis, scene.figures, dump_to)
        return {**report, **run_figures(scene.figures, exits, sentinel, min_faults or {}),
                "details": {**report["details"], "worker_exits": exits}}


def entry_states(sc: Scene) -> dict[str, tuple[float, int]]:
    """Each schedule entry's stored ``last_run_at`` and run count, read as the fleet is about
    to stop: the entry audit's word on the last claims, which no later claim follows (none
    when Redis cannot say, as while it fails over)."""
    try:
        stored = sc.state_client().hgetall(Keys(PREFIX).entries)
    except redis.RedisError:
        return {}
    states = {}
    for name, raw in stored.items():
        with contextlib.suppress(StateError):
            state = EntryState.decode(str(raw), str(name))
            states[str(name)] = (state.last_run_at, state.total_run_count)
    return states


def keep_logs(fleet: Fleet, to: Path) -> None:
    """Copy the log of every beat and worker the run started (killed ones included) to ``to``."""
    to.mkdir(parents=True, exist_ok=True)
    for child in fleet.children:
        if child.log is not None and child.log.exists():
            shutil.copyfile(child.log, to / child.log.name)


def start_servers(work: Path, cleanup: contextlib.ExitStack, sentinel: bool) -> Scene:
    """The broker and audit Redis, and the Sentinel set when asked; each stopped by
    ``cleanup`` however the run ends (a fault that fails included). The fleet is empty."""
    # Plain: one Redis is broker and state. Sentinel: this one is the broker only.
    broker, audit_redis = RedisServer(work, "state"), RedisServer(work, "audit")
    cleanup.callback(broker.kill)
    cleanup.callback(audit_redis.kill)
    broker.start()
    audit_redis.start()
    sset: SentinelSet | None = None
    if sentinel:
        (work / "sentinel").mkdir()
        sset = SentinelSet(work / "sentinel", down_after_ms=SENTINEL_DOWN_AFTER_MS,
                           failover_timeout_ms=10_000)
        cleanup.callback(sset.stop)
        sset.start()
    scene = Scene(Fleet(env={}, logdir=work), broker, audit_redis, Figures(), sset)
    # A brand-new Redis: nothing ran before, so the first grant needs no quarantine (the
    # state-loss faults are what must wait one).
    LaneStore(connect(scene.state_url), Keys(PREFIX)).declare_fresh()
    return scene


def start_fleet(fleet: Fleet, heavy_workers: int) -> None:
    """Heavy workers, one worker for the pool, one light worker, and two beats (one active,
    one standing by)."""
    for _ in range(heavy_workers):
        fleet.spawn("heavy")
    fleet.spawn("pool")
    fleet.spawn("light")
    fleet.spawn("beat")
    fleet.spawn("beat")


def drive(sc: Scene, duration_s: float, fault_every_s: float, say: TextIO,
          min_faults: dict[str, int], max_duration_s: float | None) -> None:
    t0 = time.monotonic()
    deadline = t0 + duration_s
    cap = t0 + max(duration_s, max_duration_s or duration_s)
    kinds = fault_kinds(sc.sentinel is not None)
    wait_until(lambda: current_holder(sc.audit_redis) is not None, 30, poll_s=POLL_S)
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
