"""Schedule entries at scale: start-up, idle tick and beat memory with N ``beat_schedule``
entries, FairScheduler against celery-redbeat (issue 20).

``python -m bench.entries --scheduler fair|redbeat|pair --entries N --redis URL`` prints one
JSON object. Both schedulers are given the same ``beat_schedule`` (:func:`beat_schedule`):
half ``schedule(seconds)`` entries with intervals from 20 minutes to a day, half ``crontab``s
spread over the minutes of 22 hours, none of them in the current hour or the next, so nothing
falls due while the process runs (a tick that sent something would not be idle; the no-op
sends count them and the run fails if any is sent). The timing, round-trip and memory readings
are ``bench.tickcost``'s, taken the same way:

* ``start``: a beat starting on an empty Redis (first deployment) and again on the state the
  first left (a restart or fail-over). FairScheduler: construction (``setup_schedule``) and
  ticks, beat's returned sleeps included, until every entry has been judged once (nothing left
  in ``<prefix>:entries:due`` at or before the start: ``take_over`` indexes every entry for a
  look at time 0, and a judged entry's next look is in the future). celery-redbeat:
  construction (its ``setup_schedule`` stores every entry and its score), taking its lock (what
  ``celery beat`` does at ``beat_init``) and its first tick.
* ``idle``: ticks with nothing due, after start-up (medians; Redis round trips counted).
* ``memory``: RSS after the first start-up and the idle ticks, minus RSS with the app and its
  ``beat_schedule`` built and no scheduler yet (``scheduler_mib``: what the scheduler adds);
  ``delta_mib`` counts from the process's start (the schedule's own objects included, the same
  in both). Every reading after a garbage collection and ``malloc_trim``.
* ``pair``: both schedulers started in one process and their idle ticks interleaved, so both
  see the same moments of a shared machine (the idle goal is judged on this, as for lanes).

``--profile`` (FairScheduler) runs one more start of each kind under cProfile;
``--trace-memory`` one more restart under ``tracemalloc``: the lines that hold the
scheduler's memory.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import redis
from celery import Celery
from celery.schedules import crontab, schedule

from bench.tickcost import (
    LOOP_INTERVAL_S,
    ROUND_TRIPS,
    mib,
    noop_sends,
    proc_kib,
    profiled,
    read_memory,
    redbeat_app,
    settled_rss_kib,
    tick_stats,
    timed,
)
from schedproj import Settings, configure_app
from schedproj.on_celery.beat import FairScheduler
from schedproj.store.lane_store import LaneStore
from schedproj.store.protocol import Keys

try:  # optional peer
    import redbeat.schedulers as redbeat_schedulers
except ImportError:  # pragma: no cover - reported as skipped
    redbeat_schedulers = None

#: The task every entry sends (never sent: nothing falls due while the benchmark runs).
ENTRY_TASK = "bench.entry"
#: The shortest interval (seconds): longer than any run of this benchmark lasts.
MIN_INTERVAL_S = 1200
#: Intervals spread over a day above the shortest (a prime step, so neighbours differ).
INTERVAL_SPREAD_S = 85_200
INTERVAL_STEP_S = 7919
#: FairScheduler's key prefix here.
FAIR_PREFIX = "ent-fair"
#: A start-up that has not judged every entry after this many ticks is a failure.
MAX_START_TICKS = 5000
#: A start-up during which beat lost its lock this often has failed: every re-take of the
#: lock indexes every entry for a look again, so it would go on the same way.
MAX_LOCK_LOSSES = 3
#: The beat lock TTL of the profiled and traced starts (seconds): cProfile slows a tick about
#: twice, so a pass beat's default TTL covers would outlast it there; they are about where the
#: time and memory go, not about the lock.
PROFILE_LOCK_TTL_S = 120.0


def entry_name(i: int) -> str:
    return f"bench.entry{i:06d}"


def quiet_hours(now: datetime) -> tuple[int, ...]:
    """The hours the crontab entries use: all but the current one and the next, so the
    earliest fires at least an hour after ``now``."""
    return tuple(h for h in range(24) if h not in (now.hour, (now.hour + 1) % 24))


def beat_schedule(n: int, hours: tuple[int, ...], min_interval_s: int = MIN_INTERVAL_S,
                  ) -> dict[str, dict[str, Any]]:
    """N entries: even ones every ``min_interval_s`` (20 minutes) to a day later, odd ones a
    crontab at minute ``j % 60`` of one of ``hours`` (about N / 2640 entries share a minute)."""
    spec: dict[str, dict[str, Any]] = {}
    for i in range(n):
        if i % 2 == 0:
            every = min_interval_s + (i * INTERVAL_STEP_S) % INTERVAL_SPREAD_S
            sched: Any = schedule(timedelta(seconds=every))
        else:
            j = i // 2
            sched = crontab(minute=j % 60, hour=hours[(j // 60) % len(hours)])
        spec[entry_name(i)] = {"task": ENTRY_TASK, "schedule": sched}
    return spec


# -- FairScheduler --------------------------------------------------------------------------

def fair_entries_app(url: str, spec: dict[str, dict[str, Any]],
                     lock_ttl_s: float | None = None) -> Celery:
    """An app with no lanes and ``spec`` as its ``beat_schedule``; beat's settings are the
    defaults (the beat lock TTL too, unless ``lock_ttl_s`` is given) but for polling instead
    of waiting for a wake."""
    lock: dict[str, float] = {}
    if lock_ttl_s is not None:
        lock = {"beat_lock_ttl_s": lock_ttl_s,
                "beat_max_loop_interval_s": min(LOOP_INTERVAL_S, lock_ttl_s / 3)}
    settings = Settings.load(**{"broker_url": url, "redis_url": url, "key_prefix": FAIR_PREFIX,
                                "wake_on_release": False,
                                "beat_max_loop_interval_s": LOOP_INTERVAL_S, **lock})
    # Current, as `celery beat` makes its app: the REM chain's due checks (beside the
    # entries in bench.million) read the current app's store.
    app = Celery("bench-entries-fair", set_as_current=True)
    configure_app(app, settings)
    app.conf.beat_schedule = spec
    return app


def declare_fresh(client: redis.Redis) -> None:
    """A new deployment on an emptied Redis (as `schedproj init` declares it): lanes need no
    quarantine; the entries do not depend on it."""
    LaneStore(client, Keys(FAIR_PREFIX)).declare_fresh()


def unjudged(client: redis.Redis, sched: Any) -> int:
    """Entries not yet judged by this beat: those whose next look has come (none of this
    schedule falls due during a start: a judged entry looks again 20 minutes on or later), or
    every one while its take-over's pass (index, states, listing: a page a tick) is under way.
    Counting those looked at before the beat was built, as before, found a take-over that put
    every entry's look at its own start judged, though none was."""
    if not sched.active or getattr(sched.engine.entries, "passing", False):
        return -1
    return int(client.zcount(Keys(FAIR_PREFIX).entries_due, "-inf", time.time()))


def fair_start(app: Celery, client: redis.Redis) -> tuple[FairScheduler, list[int],
                                                          dict[str, Any]]:
    """A FairScheduler built and ticked, sleeping as beat would between ticks, until every
    entry has been judged once. The check after each tick is not counted. A start-up that
    lost the beat lock :data:`MAX_LOCK_LOSSES` times is given up (``completed`` false)."""
    checks_s, check_rts = 0.0, 0
    tick_s: list[float] = []
    slept = 0.0
    lost = 0
    with ROUND_TRIPS.measure() as rts:
        start = time.perf_counter()
        sched = FairScheduler(app=app)
        sent = noop_sends(sched)
        built = time.perf_counter() - start
        while True:
            begin = time.perf_counter()
            interval = sched.tick()
            tick_s.append(time.perf_counter() - begin)
            lost += not sched.active
            with ROUND_TRIPS.measure() as check:
                begin = time.perf_counter()
                left = unjudged(client, sched)
                checks_s += time.perf_counter() - begin
            check_rts += check[0]
            if left == 0 or lost >= MAX_LOCK_LOSSES:
                break
            assert len(tick_s) < MAX_START_TICKS, f"{left} entries unjudged after " \
                                                  f"{len(tick_s)} ticks"
            time.sleep(interval)
            slept += interval
        elapsed = time.perf_counter() - start - checks_s
    assert sent[0] == 0, f"start-up sent {sent[0]} entries (none is due)"
    return sched, sent, {"completed": left == 0,
                         "start_s": round(elapsed, 3) if left == 0 else None,
                         "gave_up_after_s": None if left == 0 else round(elapsed, 3),
                         "unjudged_at_end": left, "lock_lost": lost,
                         "construct_s": round(built, 3), "first_tick_s": round(tick_s[0], 3),
                         "longest_tick_s": round(max(tick_s), 3), "ticks": len(tick_s),
                         "slept_s": round(slept, 3), "round_trips": rts[0] - check_rts}


def run_fair(url: str, n: int, reps: int, result: dict[str, Any], *, profile: bool,
             trace: bool, hours: tuple[int, ...], lock_ttl_s: float | None = None) -> None:
    client = redis.Redis.from_url(url, decode_responses=True)
    app = fair_entries_app(url, beat_schedule(n, hours), lock_ttl_s)
    declare_fresh(client)
    result["memory"]["app_kib"] = settled_rss_kib()
    sched, sent, result["start"] = fair_start(app, client)
    if result["start"]["completed"]:  # else entries are still due: no tick is idle
        result["idle"] = idle_ticks(sched, sent, reps)
    read_memory(result)
    sched.close()
    del sched
    gc.collect()
    sched, _, result["restart"] = fair_start(app, client)
    sched.close()
    # The same schedule, a beat lock that outlasts a pass slowed by cProfile or tracemalloc.
    slow = fair_entries_app(url, app.conf.beat_schedule, PROFILE_LOCK_TTL_S)
    if profile:
        result["profile"] = {
            "restart": profiled(lambda: fair_start(slow, client)[0].close(), top=25,
                                also=("celery",)),
            "first_start": profiled(lambda: first_start_again(slow, client, url), top=25,
                                    also=("celery",)),
        }
    if trace:
        result["trace_memory"] = traced(lambda: fair_start(slow, client)[0])


def first_start_again(app: Celery, client: redis.Redis, url: str) -> None:
    """An empty Redis again, and a beat's first start on it."""
    redis.Redis.from_url(url).flushdb()
    declare_fresh(client)
    fair_start(app, client)[0].close()


# -- celery-redbeat ---------------------------------------------------------------------------

def redbeat_start(app: Celery) -> tuple[Any, list[int], dict[str, Any]]:
    """A RedBeatScheduler built (storing every entry), holding its lock, after its first
    tick."""
    with ROUND_TRIPS.measure() as rts:
        start = time.perf_counter()
        sched = redbeat_schedulers.RedBeatScheduler(app=app)
        sent = noop_sends(sched)
        built = time.perf_counter() - start
        # What `celery beat` does at start (beat_init): take redbeat's lock.
        redbeat_schedulers.acquire_distributed_beat_lock(
            sender=SimpleNamespace(scheduler=sched))
        begin = time.perf_counter()
        sched.tick()
        first = time.perf_counter() - begin
        elapsed = time.perf_counter() - start
    assert sent[0] == 0, f"start-up sent {sent[0]} entries (none is due)"
    return sched, sent, {"completed": True, "start_s": round(elapsed, 3),
                         "construct_s": round(built, 3), "first_tick_s": round(first, 3),
                         "ticks": 1, "slept_s": 0.0, "round_trips": rts[0]}


def run_redbeat(url: str, n: int, reps: int, result: dict[str, Any], *, trace: bool,
                hours: tuple[int, ...]) -> None:
    if redbeat_schedulers is None:
        result["skipped"] = "celery-redbeat is not installed (pip install celery-redbeat)"
        return
    app = redbeat_app(url, n, beat_schedule(n, hours))
    result["memory"]["app_kib"] = settled_rss_kib()
    sched, sent, result["start"] = redbeat_start(app)
    result["idle"] = idle_ticks(sched, sent, reps)
    read_memory(result)
    sched.close()
    del sched
    gc.collect()
    sched, _, result["restart"] = redbeat_start(app)
    sched.close()
    if trace:
        result["trace_memory"] = traced(lambda: redbeat_start(app)[0])


# -- both -------------------------------------------------------------------------------------

def idle_ticks(sched: Any, sent: list[int], reps: int) -> dict[str, Any]:
    sched.tick()  # warm-up
    samples = [timed(sched.tick)[:2] for _ in range(reps)]
    assert sent[0] == 0, f"an idle tick sent {sent[0]} entries"
    return tick_stats(samples)


def run_pair(url: str, n: int, reps: int, result: dict[str, Any],
             hours: tuple[int, ...]) -> None:
    """Both schedulers started in one process on the same schedule, then their idle ticks
    interleaved (fair, redbeat, fair, ...)."""
    if redbeat_schedulers is None:
        result["skipped"] = "celery-redbeat is not installed (pip install celery-redbeat)"
        return
    client = redis.Redis.from_url(url, decode_responses=True)
    declare_fresh(client)
    fair, fair_sent, started = fair_start(fair_entries_app(url, beat_schedule(n, hours)),
                                          client)
    if not started["completed"]:
        result["skipped"] = f"FairScheduler's start-up did not complete: {started}"
        fair.close()
        return
    peer, peer_sent, _ = redbeat_start(redbeat_app(url, n, beat_schedule(n, hours)))
    fair.tick()
    peer.tick()
    fair_samples: list[tuple[float, int]] = []
    peer_samples: list[tuple[float, int]] = []
    for _ in range(reps):
        fair_samples.append(timed(fair.tick)[:2])
        peer_samples.append(timed(peer.tick)[:2])
    assert fair_sent[0] == 0 and peer_sent[0] == 0, "an idle tick sent entries"
    fair_stats, peer_stats = tick_stats(fair_samples), tick_stats(peer_samples)
    result["idle_pair"] = {
        "reps": reps, "fair_ms": fair_stats["ms"], "redbeat_ms": peer_stats["ms"],
        "fair_round_trips": fair_stats["round_trips"],
        "redbeat_round_trips": peer_stats["round_trips"],
        "ratio": round(statistics.median(s for s, _ in fair_samples)
                       / statistics.median(s for s, _ in peer_samples), 3)}
    fair.close()
    peer.close()


def traced(start: Callable[[], Any], top: int = 15) -> dict[str, Any]:
    """Start a scheduler under ``tracemalloc`` and report the source lines holding most of
    what it keeps (after a garbage collection), with the scheduler still alive."""
    tracemalloc.start()
    sched = start()
    gc.collect()
    snapshot = tracemalloc.take_snapshot()
    tracemalloc.stop()
    stats = snapshot.statistics("lineno")
    total = sum(s.size for s in stats)
    rows = []
    for stat in stats[:top]:
        frame = stat.traceback[0]
        where = frame.filename.replace("\\", "/")
        for package in ("/schedproj/", "/celery/", "/redbeat/", "/kombu/", "/redis/"):
            if package in where:
                where = package.strip("/") + "/" + where.split(package, 1)[1]
                break
        else:
            where = Path(where).name
        rows.append({"where": f"{where}:{frame.lineno}", "kib": round(stat.size / 1024, 1),
                     "blocks": stat.count})
    sched.close()
    return {"traced_mib": round(total / 2**20, 1), "top": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheduler", required=True, choices=["fair", "redbeat", "pair"],
                        help="pair: both started in one process, idle ticks interleaved")
    parser.add_argument("--entries", type=int, required=True)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--reps", type=int, default=30, help="idle ticks timed")
    parser.add_argument("--profile", action="store_true",
                        help="FairScheduler: also profile a first start and a restart")
    parser.add_argument("--trace-memory", action="store_true",
                        help="also trace one restart's allocations (tracemalloc)")
    parser.add_argument("--beat-lock-ttl", type=float, default=None,
                        help="FairScheduler's beat lock TTL in seconds (default: beat's "
                             "default); the loop interval becomes at most a third of it")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    redis.Redis.from_url(args.redis).flushdb()
    ROUND_TRIPS.install()
    hours = quiet_hours(datetime.now(UTC))
    result: dict[str, Any] = {"scheduler": args.scheduler, "entries": args.entries,
                              "memory": {"baseline_kib": settled_rss_kib()}}
    if args.scheduler == "fair":
        run_fair(args.redis, args.entries, args.reps, result, profile=args.profile,
                 trace=args.trace_memory, hours=hours, lock_ttl_s=args.beat_lock_ttl)
    elif args.scheduler == "redbeat":
        run_redbeat(args.redis, args.entries, args.reps, result, trace=args.trace_memory,
                    hours=hours)
    else:
        run_pair(args.redis, args.entries, args.reps, result, hours)
    result["memory"]["peak_rss_mib"] = mib(proc_kib("VmHWM"))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


__all__ = ["beat_schedule", "main", "quiet_hours"]

if __name__ == "__main__":
    raise SystemExit(main())
