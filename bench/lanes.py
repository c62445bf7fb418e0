"""Lanes for the live benchmarks (``SCHEDPROJ_LANE_MODULES=bench.lanes``).

``BENCH_SCENARIO`` selects the lane set; ``BENCH_*`` variables size it. Every run appends what
it saw to the Redis list ``<prefix>:bench:runs`` (one JSON object per run, timestamps from the
worker's clock), which outlives the processes:

* ``handoff``: ``BENCH_HEAVY`` heavy lanes that are always due (a waiting backlog), each run
  sleeping ``BENCH_HEAVY_RUN_S``; the hand-off gap is the next run's start minus this run's end.
  A heavy run's record is pushed by the next run of the process, after that run's start is
  stamped, so the benchmark's own write is not inside the gap it measures (in the other
  scenarios it is pushed as the run ends). The plain task
  ``bench.floor`` (not a lane) measures the floor: a message published to the idle heavy
  worker, its body's start minus the publish time the message carries.
* ``light-delay``: ``BENCH_HEAVY`` heavy lanes holding the lease (runs of ``BENCH_HEAVY_RUN_S``)
  and ``BENCH_LIGHT`` light lanes with cadences from ``BENCH_LIGHT_CADENCE_S`` up; a light run
  records when it fell due (its previous run's end plus its cadence), when beat dispatched it
  and when it started.
* ``throughput``: ``BENCH_LIGHT`` light lanes that are always due; each run bumps the counter
  ``<prefix>:bench:done``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import shared_task

from bench import handoff_trace
from schedproj import Lane, LaneKind, LaneTask
from schedproj.core.families import LaneFamily
from schedproj.store.protocol import Keys, run_field, sched_field

SCENARIO = os.environ.get("BENCH_SCENARIO", "handoff")
PREFIX = os.environ.get("SCHEDPROJ_KEY_PREFIX", "schedproj")
HEAVY = int(os.environ.get("BENCH_HEAVY", "3"))
HEAVY_RUN_S = float(os.environ.get("BENCH_HEAVY_RUN_S", "0.02"))
LIGHT = int(os.environ.get("BENCH_LIGHT", "5"))
LIGHT_CADENCE_S = float(os.environ.get("BENCH_LIGHT_CADENCE_S", "0.5"))
#: Cadence of lanes that should always be due: far below any run's length.
ALWAYS_DUE_S = 0.001

RUNS_KEY = f"{PREFIX}:bench:runs"
FLOOR_KEY = f"{PREFIX}:bench:floor"
FLOOR_TASK = "bench.floor"
DONE_KEY = f"{PREFIX}:bench:done"
KEYS = Keys(PREFIX)

_client: redis.Redis | None = None


def client() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["SCHEDPROJ_REDIS_URL"],
                                       decode_responses=True)
    return _client


def light_cadence(i: int) -> float:
    """Light lane ``i``'s cadence in the light-delay scenario: staggered, so they fall due
    at different moments."""
    return LIGHT_CADENCE_S * (1.0 + 0.5 * i)


def heavy_names() -> list[str]:
    return [f"bench.heavy{i}" for i in range(HEAVY)]


def light_names() -> list[str]:
    return [f"bench.light{i}" for i in range(LIGHT)]


def _record(entry: dict[str, Any]) -> None:
    client().rpush(RUNS_KEY, json.dumps(entry))


def _field(raw: Any, name: str) -> Any:
    return None if raw is None else json.loads(raw).get(name)


#: Heavy runs of this process not yet pushed (the next run pushes them, outside any gap).
_unpushed: list[dict[str, Any]] = []


def heavy_body(task: LaneTask, lane: str) -> None:
    start = time.time()
    handoff_trace.mark("body_start", str(task.request.id), start)
    if _unpushed:
        client().rpush(RUNS_KEY, *(json.dumps(r) for r in _unpushed))
        _unpushed.clear()
    time.sleep(max(0.0, start + HEAVY_RUN_S - time.time()))
    # Work left: the lane is due again at its end, not a cadence (1 ms) later. Without it, a
    # tick that starts within that millisecond (most, once the hand-off got fast) finds the
    # lane not due yet and comes straight back for it: a second tick in every other hand-off,
    # beside the next run's start, that no lane with a real cadence would cause.
    task.report_backlog(1)
    end = time.time()
    handoff_trace.mark("body_end", str(task.request.id), end)
    _unpushed.append({"lane": lane, "kind": "heavy", "start": start, "end": end,
                      "fence": task.fence, "task": str(task.request.id)})
    if SCENARIO != "handoff":  # no gap measured: the record is pushed at once
        client().rpush(RUNS_KEY, *(json.dumps(r) for r in _unpushed))
        _unpushed.clear()


def light_delay_body(lane: str, cadence_s: float) -> None:
    start = time.time()
    # This run's own record still holds the previous run's end; beat's record holds the
    # dispatch of this message (written before it was sent, never while it is in flight).
    last_run_at = _field(client().hget(KEYS.lanes, run_field(lane)), "last_run_at")
    dispatched = _field(client().hget(KEYS.lanes, sched_field(lane)), "last_dispatch_at")
    _record({"lane": lane, "kind": "light", "start": start, "dispatch": dispatched,
             "due": None if last_run_at is None else last_run_at + cadence_s})


def _declare_heavy(name: str) -> None:
    @shared_task(base=LaneTask, bind=True, name=name,
                 lane=Lane(cadence_s=ALWAYS_DUE_S, kind=LaneKind.HEAVY))
    def heavy(self: LaneTask) -> None:
        heavy_body(self, name)


def _declare_light_delay(name: str, cadence_s: float) -> None:
    @shared_task(base=LaneTask, bind=True, name=name,
                 lane=Lane(cadence_s=cadence_s, kind=LaneKind.LIGHT))
    def light(self: LaneTask) -> None:
        light_delay_body(name, cadence_s)


def _declare_throughput(name: str) -> None:
    @shared_task(base=LaneTask, bind=True, name=name,
                 lane=Lane(cadence_s=ALWAYS_DUE_S, kind=LaneKind.LIGHT))
    def light(self: LaneTask) -> None:
        client().incr(DONE_KEY)

    # The bare beat's twin: the same body as a plain task. A lane task refuses a message that
    # its lane's current beat did not dispatch, so the peer sends this one instead.
    @shared_task(name=bare_name(name))
    def bare() -> None:
        client().incr(DONE_KEY)


def bare_name(name: str) -> str:
    """The plain twin of throughput lane ``name``, which the bare beat sends."""
    return f"bare.{name}"


#: The idle lane family of the hand-off-at-scale scenario: members that ran just now (seeded
#: by the bench), heavy, cadence one day — declared lanes that are never due.
IDLE_FAMILY = "bench.idle-family"


def _declare_idle_family() -> None:
    @shared_task(base=LaneTask, bind=True, name=IDLE_FAMILY,
                 lane=LaneFamily(cadence_s=86400.0, kind=LaneKind.HEAVY))
    def idle(self: LaneTask, key: str) -> None:
        heavy_body(self, f"{IDLE_FAMILY}[{key}]")


def _declare_floor() -> None:
    """A plain task on the heavy queue: its start minus the publish time it carries."""
    @shared_task(name=FLOOR_TASK)
    def floor(published: float) -> None:
        start = time.time()
        handoff_trace.mark("body_start", "floor", start)
        client().rpush(FLOOR_KEY, json.dumps({"published": published, "start": start}))


if os.environ.get("BENCH_TRACE_DIR"):
    handoff_trace.install(os.environ["BENCH_TRACE_DIR"])
if os.environ.get("BENCH_PROFILE_DIR"):
    handoff_trace.profile(os.environ["BENCH_PROFILE_DIR"])
if SCENARIO in ("handoff", "light-delay"):
    for _name in heavy_names():
        _declare_heavy(_name)
if SCENARIO == "handoff":
    _declare_idle_family()
    _declare_floor()
if SCENARIO == "light-delay":
    for _i, _name in enumerate(light_names()):
        _declare_light_delay(_name, light_cadence(_i))
if SCENARIO == "throughput":
    for _name in light_names():
        _declare_throughput(_name)
