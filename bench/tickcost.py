"""Tick cost, Redis round trips per tick and beat memory, in one process per scheduler and size.

``python -m bench.tickcost --scheduler fair|redbeat|persistent --lanes N --redis URL`` prints
one JSON object. Every scheduler holds the same N entries (cadence one hour); its sends are
replaced by a no-op that keeps the scheduler's own bookkeeping (Celery's ``apply_async`` minus
building and publishing the message: ``reserve`` when it advances, the sync counter), so only
scheduler work is timed. Logging stays at WARNING for all three.

Scenarios, in this order (memory is read after the idle ticks, before any large dispatch):

* ``idle``: every entry ran just now, nothing is due; the tick returns its sleep instead of
  blocking (FairScheduler with ``wake_on_release=False``).
* ``rank`` (FairScheduler only): N heavy lanes, all due with different staleness ratios, lease
  free. One cycle = the tick that ranks them and grants the lease, then the tick that finds the
  lease held (all N-1 deferred), then the run ends (lease deleted).
* ``dispatch``: N light lanes (FairScheduler) or N entries (the peers), all due; the time to
  dispatch all of them (FairScheduler and celery-redbeat: one tick; PersistentScheduler sends
  one entry per tick, so as many ticks as entries), and that time per entry.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import ctypes
import gc
import json
import logging
import pstats
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import MethodType, SimpleNamespace
from typing import Any

import celery.beat
import redis
from celery import Celery
from celery.schedules import crontab

from bench.rtt import RoundTrips
from bench.stats import summary
from schedproj import Lane, LaneKind, LaneTask, Settings, configure_app
from schedproj.core.calendar import next_fire
from schedproj.core.collector import cyclic_gc_paused
from schedproj.core.families import LaneFamily, member_lane, split_member
from schedproj.core.records import COMPACT_FORMAT, Outcome, RunRecord, SchedRecord, encode
from schedproj.on_celery.beat import FairScheduler
from schedproj.store.families import FamilyStore
from schedproj.store.lane_store import LaneStore
from schedproj.store.protocol import Keys

try:  # optional peer
    import redbeat.schedulers as redbeat_schedulers
except ImportError:  # pragma: no cover - reported as skipped
    redbeat_schedulers = None

#: Every entry's cadence: an hour, so "idle" stays idle for the whole measurement.
CADENCE_S = 3600.0
#: Lease-held ticks timed after the first one of each cycle.
STEADY_HELD_TICKS = 5
#: Beat's loop interval for all three (FairScheduler's default).
LOOP_INTERVAL_S = 3.0

ROUND_TRIPS = RoundTrips()


def lane_name(i: int) -> str:
    return f"bench.lane{i:05d}"


def proc_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def mib(kib: int) -> float:
    return round(kib / 1024.0, 1)


def timed(fn: Callable[[], Any]) -> tuple[float, int, Any]:
    """(seconds, Redis round trips, result) of one call."""
    with ROUND_TRIPS.measure() as n:
        start = time.perf_counter()
        result = fn()
        elapsed = time.perf_counter() - start
    return elapsed, n[0], result


def noop_sends(sched: Any) -> list[int]:
    """Replace the scheduler's sends by a no-op that keeps its bookkeeping; count them."""
    sent = [0]
    _ = sched.producer  # connect to the broker now, outside the timing (sends need it)

    def apply_async(self: Any, entry: Any, producer: Any = None, advance: bool = True,
                    **kwargs: Any) -> None:
        if advance:
            entry = self.reserve(entry)
        sent[0] += 1
        self._tasks_since_sync += 1
        if self.should_sync():
            self._do_sync()

    sched.apply_async = MethodType(apply_async, sched)
    return sent


def profiled(fn: Callable[[], Any], top: int = 12,
             also: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Run ``fn`` once under cProfile: its costliest schedproj functions (cumulative time,
    calls), and the Redis commands it sent; also the functions of the packages named in
    ``also`` (e.g. ``("celery", "redbeat")``). cProfile slows the run; compare rows, not
    totals."""
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    stats = pstats.Stats(prof)
    rows = []
    for (path, line, func), (_cc, calls, tottime, cumtime, _callers) in \
            stats.stats.items():  # type: ignore[attr-defined]
        where = path.replace("\\", "/")
        package = next((p for p in also if f"/{p}/" in where), None)
        if "/schedproj/" in where and not (where.endswith("scheduler.py") and func == "tick"):
            name = "schedproj/" + where.split("/schedproj/", 1)[1]
        elif where.endswith("redis/connection.py") and func == "send_packed_command":
            name = "redis/connection.py"
        elif package is not None:
            name = f"{package}/" + where.split(f"/{package}/", 1)[1]
        else:
            continue
        rows.append({"function": f"{name}:{func}", "line": line, "calls": calls,
                     "tottime_ms": round(tottime * 1000, 1),
                     "cumtime_ms": round(cumtime * 1000, 1)})
    rows.sort(key=lambda r: -r["cumtime_ms"])
    return rows[:top]


def tick_stats(samples: list[tuple[float, int]]) -> dict[str, Any]:
    return {"ms": summary([s for s, _ in samples], 1000.0),
            "round_trips": summary([float(n) for _, n in samples], 1.0, 1)}


# -- FairScheduler --------------------------------------------------------------------------
#
# FairScheduler's N lanes are the members of lane families (one Celery task each: heavy and
# light), as a deployment with thousands of lanes declares them; ``--declare tasks`` declares
# N Celery tasks instead (as before families existed; memory-hungry past 10,000).

HEAVY_FAMILY = "bench.heavy-family"
#: FairScheduler's beat lock TTL in the tick-cost runs (seconds).
BEAT_LOCK_TTL_S = 120.0
LIGHT_FAMILY = "bench.light-family"


def member_key(i: int) -> str:
    return f"m{i:06d}"


def far_crontab() -> str:
    """A daily crontab whose fire time is twelve hours away: nothing falls due in a run."""
    return f"0 {(datetime.now(UTC).hour + 12) % 24} * * *"


def fair_app(url: str, prefix: str, n: int, kind: Callable[[int], LaneKind],
             declare: str = "family", calendar: str | None = None) -> tuple[Celery, list[str]]:
    """The app and its N lane names (members of the two families, or N tasks); with
    ``calendar`` (a cron expression) calendar lanes instead of cadence lanes."""
    timing: dict[str, Any] = ({"schedule": calendar} if calendar is not None
                              else {"cadence_s": CADENCE_S})
    # The beat lock outlives the longest tick measured: the first ranking tick at 100,000
    # lanes records 99,999 new deferral streaks and takes longer than the default TTL here.
    settings = Settings.load(broker_url=url, redis_url=url, key_prefix=prefix,
                             wake_on_release=False, beat_max_loop_interval_s=LOOP_INTERVAL_S,
                             beat_lock_ttl_s=BEAT_LOCK_TTL_S)
    app = Celery(f"bench-{prefix}", set_as_current=False)
    configure_app(app, settings)
    # A new deployment on an emptied Redis: no state-loss quarantine before the first grant.
    LaneStore(redis.Redis.from_url(url, decode_responses=True), Keys(prefix)).declare_fresh()
    if declare == "tasks":
        for i in range(n):
            def body() -> None:
                return None

            app.task(shared=False, base=LaneTask, name=lane_name(i),
                     lane=Lane(**timing, kind=kind(i)))(body)
        assert len(app.tasks) >= n
        return app, [lane_name(i) for i in range(n)]
    for family, fkind in ((HEAVY_FAMILY, LaneKind.HEAVY), (LIGHT_FAMILY, LaneKind.LIGHT)):
        def member(key: str) -> None:
            return None

        app.task(shared=False, base=LaneTask, name=family,
                 lane=LaneFamily(**timing, kind=fkind))(member)
    assert len(app.tasks) >= 2
    return app, [member_lane(HEAVY_FAMILY if kind(i) is LaneKind.HEAVY else LIGHT_FAMILY,
                             member_key(i)) for i in range(n)]


def seed(client: redis.Redis, keys: Keys, records: dict[str, str],
         scores: dict[str, float]) -> None:
    """Write lane records and due-index scores (and family memberships), and mark the lanes
    changed — what the workers' scripts do, outside the timing."""
    write_hash(client, keys.lanes, records)
    items = list(scores.items())
    pipe = client.pipeline(transaction=False)
    for start in range(0, len(items), 1000):
        chunk = dict(items[start:start + 1000])
        pipe.zadd(keys.due, chunk)
        pipe.sadd(keys.changed, *chunk)
        for lane in chunk:
            parts = split_member(lane)
            if parts is not None:
                pipe.sadd(keys.family(parts[0]), parts[1])
    pipe.execute()


def fair_idle_state(client: redis.Redis, keys: Keys, names: list[str], now: float,
                    next_look: float | None = None) -> None:
    """Every lane ran just now and its message was the one beat sent: nothing is due (until
    ``next_look``, default one cadence on)."""
    mapping: dict[str, str] = {}
    for name in names:
        task_id = str(uuid.uuid4())
        mapping[f"{name}|run"] = encode(RunRecord(
            last_run_at=now, last_outcome=Outcome.COMPLETED, last_task_id=task_id, runs=1))
        mapping[f"{name}|sched"] = encode(SchedRecord(
            inflight_task_id=task_id, inflight_deadline=now + 60, last_dispatch_at=now - 1,
            dispatches=1))
    seed(client, keys, mapping, dict.fromkeys(
        names, now + CADENCE_S if next_look is None else next_look))


def write_hash(client: redis.Redis, key: str, mapping: dict[str, str]) -> None:
    items = list(mapping.items())
    pipe = client.pipeline(transaction=False)
    for start in range(0, len(items), 1000):
        pipe.hset(key, mapping=dict(items[start:start + 1000]))
    pipe.execute()


def fair_scheduler(app: Celery) -> tuple[FairScheduler, list[int]]:
    sched = FairScheduler(app=app)
    return sched, noop_sends(sched)


def redis_used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def fair_idle(url: str, n: int, reps: int, result: dict[str, Any], profile: bool,
              declare: str, calendar: str | None = None) -> tuple[FairScheduler, list[int]]:
    prefix = "tc-fair-idle"
    client = redis.Redis.from_url(url, decode_responses=True)
    app, names = fair_app(url, prefix, n,
                          lambda i: LaneKind.HEAVY if i % 2 == 0 else LaneKind.LIGHT, declare,
                          calendar)
    result["memory"]["app_kib"] = settled_rss_kib()
    before = redis_used(client)
    now = time.time()
    fair_idle_state(client, Keys(prefix), names, now,
                    None if calendar is None else next_fire(calendar, "UTC", now))
    result["redis_bytes_per_lane"] = round((redis_used(client) - before) / n, 1)
    start = time.perf_counter()
    sched, sent = fair_scheduler(app)
    sched.tick()  # the first tick takes the lock and reads every due lane: part of start-up
    result["setup_s"] = round(time.perf_counter() - start, 3)
    sched.tick()  # warm-up
    samples = [timed(sched.tick)[:2] for _ in range(reps)]
    assert sent[0] == 0, f"an idle tick sent {sent[0]} messages"
    result["idle"] = tick_stats(samples)
    if profile:
        result["profile"] = {"idle": profiled(sched.tick)}
    return sched, sent


def rank_floor(client: redis.Redis, keys: Keys, names: list[str]) -> float:
    """The floor the ranking tick is compared to: fetch the N due lanes' run records in one
    round trip and take the maximal staleness ratio in plain Python. With the cyclic
    collector paused, as beat's tick runs (core.collector): the floor is the least the work
    can cost."""
    with cyclic_gc_paused():
        start = time.perf_counter()
        raw = client.hmget(keys.lanes, [f"{name}|run" for name in names])
        now = time.time()
        # (Either format: the long one's key, or the compact one's, SCHEDPROJ_COMPACT_RECORDS.)
        best = max((now - _last_run_at(json.loads(r))) / CADENCE_S for r in raw if r)
        elapsed = time.perf_counter() - start
    assert best > 1.0
    return elapsed


def _last_run_at(data: dict[str, Any]) -> float:
    return float(data["t"] if data["v"] == COMPACT_FORMAT else data["last_run_at"])


def fair_rank(url: str, n: int, reps: int, result: dict[str, Any], profile: bool,
              declare: str) -> None:
    prefix = "tc-fair-rank"
    client = redis.Redis.from_url(url, decode_responses=True)
    keys = Keys(prefix)
    app, names = fair_app(url, prefix, n, lambda i: LaneKind.HEAVY, declare)
    now = time.time()
    # All due, with different staleness ratios (1.0 to 10.6), none ever deferred yet.
    seed(client, keys, {
        f"{name}|run": encode(RunRecord(
            last_run_at=now - CADENCE_S * (1.0 + (i % 97) / 10.0),
            last_outcome=Outcome.COMPLETED, runs=1))
        for i, name in enumerate(names)}, dict.fromkeys(names, now - 1.0))
    sched, sent = fair_scheduler(app)
    result["rank"] = rank_cycles(sched, sent, client, keys, names, reps)
    if profile:
        result["profile"]["rank"] = profiled(sched.tick)
        result["profile"]["held"] = profiled(sched.tick)
    sched.close()


def rank_cycles(sched: Any, sent: list[int], client: redis.Redis, keys: Keys,
                due: list[str], cycles: int,
                steady_ticks: int = STEADY_HELD_TICKS) -> dict[str, Any]:
    """The ranking tick with ``due`` due (it sends the winner), the lease-held ticks after it
    (the first, then ``steady_ticks`` more) and the read-and-max floor, ``cycles`` times after
    a first cycle left out (it loads the scripts, announces the beat, marks the lanes read)."""
    ranks: list[tuple[float, int]] = []
    helds: list[tuple[float, int]] = []
    steady: list[tuple[float, int]] = []
    floors: list[float] = []
    for cycle in range(cycles + 1):
        before = sent[0]
        rank = timed(sched.tick)[:2]
        assert sent[0] == before + 1, "the ranking tick did not send exactly the winner"
        held = timed(sched.tick)[:2]
        # A run holds the lease for many ticks: the ones after the first (which follows the
        # ranking tick's record writes, and pays for Redis settling after them).
        later = [timed(sched.tick)[:2] for _ in range(steady_ticks)]
        assert sent[0] == before + 1, "a tick sent while the lease was held"
        floors.append(rank_floor(client, keys, due))
        end_run(client, keys)
        if cycle > 0:
            ranks.append(rank)
            helds.append(held)
            steady.extend(later)
    return {"rank_tick": tick_stats(ranks), "held_tick": tick_stats(helds),
            "steady_held_tick": tick_stats(steady),
            "floor": {"ms": summary(floors[1:] or floors, 1000.0)}}


def end_run(client: redis.Redis, keys: Keys) -> None:
    """The heavy run ended: its lease is released and its lane marked changed (as
    ``run_finish.lua`` does; the winner's record stays due, so it is ranked again)."""
    raw = client.get(keys.lease)
    pipe = client.pipeline(transaction=True)
    pipe.delete(keys.lease)
    if raw:
        pipe.sadd(keys.changed, json.loads(raw)["lane"])
    pipe.execute()


def fair_complete_all(client: redis.Redis, keys: Keys, names: list[str],
                      due_at: float) -> None:
    """Every dispatched light run finished long enough ago to be due again."""
    raw = client.hmget(keys.lanes, [f"{name}|sched" for name in names])
    mapping = {}
    for name, sched_raw in zip(names, raw, strict=True):
        task_id = json.loads(sched_raw)["inflight_task_id"] if sched_raw else None
        mapping[f"{name}|run"] = encode(RunRecord(
            last_run_at=due_at, last_outcome=Outcome.COMPLETED, last_task_id=task_id, runs=1))
    seed(client, keys, mapping, dict.fromkeys(names, due_at + CADENCE_S))


def fair_dispatch(url: str, n: int, reps: int, result: dict[str, Any], profile: bool,
                  declare: str) -> None:
    prefix = "tc-fair-light"
    client = redis.Redis.from_url(url, decode_responses=True)
    keys = Keys(prefix)
    app, names = fair_app(url, prefix, n, lambda i: LaneKind.LIGHT, declare)
    sched, sent = fair_scheduler(app)
    samples: list[tuple[float, int]] = []
    for cycle in range(reps + 1):
        fair_complete_all(client, keys, names, time.time() - 2 * CADENCE_S)
        before = sent[0]
        sample = timed(sched.tick)[:2]
        assert sent[0] - before == n, f"dispatched {sent[0] - before} of {n} due light lanes"
        if cycle > 0:
            samples.append(sample)
    result["dispatch"] = dispatch_stats(samples, n, ticks=1)
    if profile:
        fair_complete_all(client, keys, names, time.time() - 2 * CADENCE_S)
        result["profile"]["dispatch"] = profiled(sched.tick)
    sched.close()


def fair_startup(url: str, n: int, result: dict[str, Any]) -> None:
    """Start-up with N members added through the family API: adding them, then a new beat's
    construction and first tick (it reads every due lane: all N, never run)."""
    prefix = "tc-fair-start"
    client = redis.Redis.from_url(url, decode_responses=True)
    app, _ = fair_app(url, prefix, n, lambda i: LaneKind.HEAVY)
    store = FamilyStore(client, Keys(prefix), [HEAVY_FAMILY, LIGHT_FAMILY])
    start = time.perf_counter()
    store.add(HEAVY_FAMILY, [member_key(i) for i in range(n)])
    added = time.perf_counter() - start
    start = time.perf_counter()
    sched, _ = fair_scheduler(app)
    sched.tick()
    result["startup"] = {"add_members_s": round(added, 3),
                         "beat_start_s": round(time.perf_counter() - start, 3)}
    sched.close()


def dispatch_stats(samples: list[tuple[float, int]], n: int, ticks: int,
                   complete: bool = True) -> dict[str, Any]:
    total = [s for s, _ in samples]
    return {
        "entries": n,
        "ticks": ticks,
        "complete": complete,
        "total_ms": summary(total, 1000.0),
        "per_entry_ms": summary([t / n for t in total], 1000.0, 4),
        "round_trips": summary([float(r) for _, r in samples], 1.0, 1),
        "round_trips_per_entry": summary([r / n for _, r in samples], 1.0, 2),
    }


def run_fair(url: str, n: int, reps: int, due_reps: int, result: dict[str, Any],
             profile: bool = False, declare: str = "family") -> None:
    sched, _ = fair_idle(url, n, reps, result, profile, declare)
    read_memory(result)
    sched.close()
    flush(url)
    fair_rank(url, n, due_reps, result, profile, declare)
    flush(url)
    fair_dispatch(url, n, due_reps, result, profile, declare)
    if declare == "family":
        flush(url)
        fair_startup(url, n, result)


def flush(url: str) -> None:
    redis.Redis.from_url(url).flushdb()


# -- celery-redbeat ---------------------------------------------------------------------------

def peer_app(url: str, name: str, n: int,
             beat_schedule: dict[str, dict[str, Any]] | None = None) -> Celery:
    """A peer's app: N entries of cadence one hour, or the ``beat_schedule`` given."""
    app = Celery(name, set_as_current=False, broker=url)
    app.conf.beat_max_loop_interval = LOOP_INTERVAL_S
    app.conf.beat_schedule = beat_schedule if beat_schedule is not None else {
        lane_name(i): {"task": lane_name(i), "schedule": timedelta(seconds=CADENCE_S)}
        for i in range(n)}
    return app


def redbeat_reset(sched: Any, client: redis.Redis, n: int, last_run_at: datetime,
                  score: float) -> None:
    """Set every entry's last run and its place in the schedule (outside the timing)."""
    conf = sched.app.redbeat_conf
    meta = json.dumps({"last_run_at": last_run_at}, cls=redbeat_schedulers.RedBeatJSONEncoder)
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        key = redbeat_schedulers.RedBeatSchedulerEntry.generate_key(sched.app, lane_name(i))
        pipe.hset(key, "meta", meta)
        pipe.zadd(conf.schedule_key, {key: score})
    pipe.execute()


def redbeat_app(url: str, n: int,
                beat_schedule: dict[str, dict[str, Any]] | None = None) -> Celery:
    app = peer_app(url, "bench-redbeat", n, beat_schedule)
    app.conf.redbeat_redis_url = url
    app.conf.redbeat_key_prefix = "tc-redbeat:"
    # Its lock outlives the longest tick measured (sending 100,000 due entries takes longer
    # than the default of five loop intervals), as FairScheduler's does.
    app.conf.redbeat_lock_timeout = int(BEAT_LOCK_TTL_S)
    return app


def redbeat_idle(app: Celery, client: redis.Redis, n: int,
                 result: dict[str, Any] | None = None,
                 score: float | None = None) -> tuple[Any, list[int]]:
    """A RedBeatScheduler holding its lock with nothing due, after two warm-up ticks (its
    construction time in ``result["setup_s"]`` when given)."""
    start = time.perf_counter()
    sched = redbeat_schedulers.RedBeatScheduler(app=app)
    if result is not None:
        result["setup_s"] = round(time.perf_counter() - start, 3)
    # What `celery beat` does at start (beat_init): take redbeat's lock, extended every tick.
    redbeat_schedulers.acquire_distributed_beat_lock(sender=SimpleNamespace(scheduler=sched))
    sent = noop_sends(sched)
    now = datetime.now(UTC)
    redbeat_reset(sched, client, n, now, now.timestamp() + CADENCE_S if score is None else score)
    for _ in range(2):
        sched.tick()
    return sched, sent


#: ``--settle``: tick both schedulers until Redis's Lua heap is below this (KiB) ...
SETTLED_LUA_KIB = 1024
#: ... or this many pairs of idle ticks have run.
SETTLE_MAX_PAIRS = 5000


def lua_kib(client: redis.Redis) -> int:
    """Redis's Lua heap (``used_memory_lua``), KiB."""
    return int(client.info("memory")["used_memory_lua"]) // 1024


def settle(fair: Any, peer: Any, client: redis.Redis) -> dict[str, int]:
    """Tick both, interleaved, until Redis's Lua heap is back below :data:`SETTLED_LUA_KIB`:
    FairScheduler's first tick (taking the lock, reading every lane) leaves tens of MiB of Lua
    garbage at 100,000 lanes, which Redis collects a step per so many script calls, and every
    script call pays for the steps meanwhile (the next few hundred idle ticks of both
    schedulers run slower, FairScheduler's more: its script allocates more per call)."""
    before, pairs = lua_kib(client), 0
    while pairs < SETTLE_MAX_PAIRS and (pairs % 100 or lua_kib(client) > SETTLED_LUA_KIB):
        fair.tick()
        peer.tick()
        pairs += 1
    return {"lua_kib_before": before, "pairs": pairs, "lua_kib_after": lua_kib(client)}


def run_pair(url: str, n: int, reps: int, result: dict[str, Any],
             calendar: bool = False, settled: bool = False) -> None:
    """Idle ticks of FairScheduler and celery-redbeat at the same N, in one process and
    interleaved (fair, redbeat, fair, ...): both see the same moments of a shared, noisy
    machine, so their ratio does not drift with the load the way two runs minutes apart do.
    ``calendar``: N crontab lanes and N crontab entries (one daily fire time, twelve hours
    away) instead of hourly cadences. ``settled``: time them once Redis's Lua heap is back to
    its size before start-up (:func:`settle`), not right after it. Redis's Lua heap when the
    timing starts is in the result either way (``lua_kib``)."""
    if redbeat_schedulers is None:
        result["skipped"] = "celery-redbeat is not installed (pip install celery-redbeat)"
        return
    client = redis.Redis.from_url(url, decode_responses=True)
    expression = far_crontab() if calendar else None
    fair, fair_sent = fair_idle(url, n, 1, {"memory": {}}, False, "family", expression)
    entries = None
    if expression is not None:
        result["crontab"] = expression
        minute, hour = expression.split()[:2]
        entries = {lane_name(i): {"task": lane_name(i),
                                  "schedule": crontab(minute=minute, hour=hour)}
                   for i in range(n)}
    peer, peer_sent = redbeat_idle(redbeat_app(url, n, entries), client, n,
                                   score=None if expression is None
                                   else next_fire(expression, "UTC", time.time()))
    if settled:
        result["settle"] = settle(fair, peer, client)
    result["lua_kib"] = lua_kib(client)
    fair_ms: list[float] = []
    peer_ms: list[float] = []
    for _ in range(reps):
        fair_ms.append(timed(fair.tick)[0] * 1000)
        peer_ms.append(timed(peer.tick)[0] * 1000)
    assert fair_sent[0] == 0 and peer_sent[0] == 0, "an idle tick sent messages"
    result["idle_pair"] = {"reps": reps, "fair_ms": summary(fair_ms, 1.0, 3),
                           "redbeat_ms": summary(peer_ms, 1.0, 3),
                           "ratio": round(statistics.median(fair_ms)
                                          / statistics.median(peer_ms), 3)}
    fair.close()
    peer.close()


def run_redbeat(url: str, n: int, reps: int, due_reps: int, result: dict[str, Any]) -> None:
    if redbeat_schedulers is None:
        result["skipped"] = "celery-redbeat is not installed (pip install celery-redbeat)"
        return
    client = redis.Redis.from_url(url, decode_responses=True)
    app = redbeat_app(url, n)
    result["memory"]["app_kib"] = settled_rss_kib()
    sched, sent = redbeat_idle(app, client, n, result)
    samples = [timed(sched.tick)[:2] for _ in range(reps)]
    assert sent[0] == 0, f"an idle tick sent {sent[0]} messages"
    result["idle"] = tick_stats(samples)
    read_memory(result)
    due: list[tuple[float, int]] = []
    for cycle in range(due_reps + 1):
        redbeat_reset(sched, client, n, datetime.now(UTC) - timedelta(seconds=2 * CADENCE_S),
                      0.0)
        before = sent[0]
        sample = timed(sched.tick)[:2]
        assert sent[0] - before == n, f"dispatched {sent[0] - before} of {n} due entries"
        if cycle > 0:
            due.append(sample)
    result["dispatch"] = dispatch_stats(due, n, ticks=1)
    sched.close()


# -- Celery's PersistentScheduler ---------------------------------------------------------------

def run_persistent(url: str, n: int, reps: int, due_reps: int, budget_s: float,
                   result: dict[str, Any]) -> None:
    app = peer_app(url, "bench-persistent", n)
    result["memory"]["app_kib"] = settled_rss_kib()
    with tempfile.TemporaryDirectory(prefix="bench-beat-") as tmp:
        start = time.perf_counter()
        sched = celery.beat.PersistentScheduler(
            app=app, schedule_filename=str(Path(tmp) / "celerybeat-schedule"))
        result["setup_s"] = round(time.perf_counter() - start, 3)
        sent = noop_sends(sched)
        for _ in range(2):
            sched.tick()  # the first tick builds the heap
        samples = [timed(sched.tick)[:2] for _ in range(reps)]
        assert sent[0] == 0, f"an idle tick sent {sent[0]} messages"
        result["idle"] = tick_stats(samples)
        read_memory(result)
        due: list[tuple[float, int]] = []
        ticks = 0
        complete = True
        for _ in range(due_reps):
            old = app.now() - timedelta(seconds=2 * CADENCE_S)
            for entry in sched.schedule.values():
                entry.last_run_at = old
            sched._heap = None  # rebuilt on the next tick, as after any schedule change
            before = sent[0]
            ticks = 0
            with ROUND_TRIPS.measure() as rts:
                begin = time.perf_counter()
                while sent[0] - before < n:
                    sched.tick()
                    ticks += 1
                    if time.perf_counter() - begin > budget_s:
                        complete = False
                        break
                elapsed = time.perf_counter() - begin
            done = sent[0] - before
            # Out of budget: extrapolate linearly (each tick costs the same, one send each).
            due.append((elapsed * n / max(1, done), rts[0]))
            if not complete:
                result["dispatch_note"] = (f"stopped after {elapsed:.0f}s with {done} of {n} "
                                           "sent; total extrapolated linearly")
                break
        result["dispatch"] = dispatch_stats(due, n, ticks=ticks, complete=complete)
        sched.close()


# -- main -----------------------------------------------------------------------------------------

def release_freed_memory() -> None:
    """Hand memory the process freed back to the OS (glibc's ``malloc_trim``), so RSS
    counts what the scheduler keeps, not what its set-up once used (the 100,000-lane set-up
    peaks near 500 MiB; without this the same code read 34 to 62 MiB from run to run)."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: RSS is read as it is
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def settled_rss_kib() -> int:
    """RSS once garbage is collected and freed memory handed back: what the process keeps."""
    gc.collect()
    release_freed_memory()
    return proc_kib("VmRSS")


def read_memory(result: dict[str, Any]) -> None:
    mem = result["memory"]
    rss = settled_rss_kib()
    mem["rss_mib"] = mib(rss)
    mem["baseline_mib"] = mib(mem["baseline_kib"])
    mem["declare_mib"] = mib(mem["app_kib"] - mem["baseline_kib"])
    mem["scheduler_mib"] = mib(rss - mem["app_kib"])
    mem["delta_mib"] = mib(rss - mem["baseline_kib"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheduler", required=True,
                        choices=["fair", "redbeat", "persistent", "pair"],
                        help="pair: fair's and redbeat's idle ticks interleaved in one process")
    parser.add_argument("--lanes", type=int, required=True)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--reps", type=int, default=30, help="idle ticks timed")
    parser.add_argument("--due-reps", type=int, default=5, help="due cycles timed")
    parser.add_argument("--profile", action="store_true",
                        help="FairScheduler: also profile one tick of each scenario")
    parser.add_argument("--declare", choices=["family", "tasks"], default="family",
                        help="FairScheduler: lanes as members of two lane families (default) "
                             "or as N Celery tasks")
    parser.add_argument("--calendar", action="store_true",
                        help="pair: crontab lanes and crontab entries instead of cadences")
    parser.add_argument("--settle", action="store_true",
                        help="pair: time the idle ticks once Redis's Lua heap has settled "
                             "after FairScheduler's first tick (see settle())")
    parser.add_argument("--budget", type=float, default=180.0,
                        help="seconds PersistentScheduler may take to send all due entries")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    redis.Redis.from_url(args.redis).flushdb()
    ROUND_TRIPS.install()
    result: dict[str, Any] = {"scheduler": args.scheduler, "lanes": args.lanes,
                              "memory": {"baseline_kib": settled_rss_kib()}}
    if args.scheduler == "fair":
        run_fair(args.redis, args.lanes, args.reps, args.due_reps, result, args.profile,
                 args.declare)
        result["declare"] = args.declare
    elif args.scheduler == "pair":
        run_pair(args.redis, args.lanes, args.reps, result, args.calendar, args.settle)
    elif args.scheduler == "redbeat":
        run_redbeat(args.redis, args.lanes, args.reps, args.due_reps, result)
    else:
        run_persistent(args.redis, args.lanes, args.reps, args.due_reps, args.budget, result)
    result["memory"]["peak_rss_mib"] = mib(proc_kib("VmHWM"))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
