"""Issue 22, in-process against real Redis: while every slot of a pool stays held by the same
runs, beat's tick does no work for the pool's waiters (as for the heavy lease's waiters while
the same lease is held); a slot freed, or a slot held under another token, or a held run
starting, makes the next tick plan them all again. The pool's pressure stays what the waiters
make it across the ticks that skip them. Beat's sends go to a real Redis broker; the tests
read the queued messages back instead of running workers."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import redis
from celery import Celery

from schedproj import Lane, LaneTask
from schedproj.core.pools import DEFAULT_POOL
from schedproj.core.pressure import decode as decode_pressure
from schedproj.core.records import RunRecord
from schedproj.on_celery import beat
from schedproj.on_celery.beat import FairScheduler
from schedproj.store.lane_store import LaneStore
from schedproj.store.lease import HeavyLease
from schedproj.store.protocol import Keys
from tests.conftest import make_app
from tests.on_celery.test_pool_ticks import grant, queued

#: gpu lanes t.g0 .. t.g29: the higher the number, the staler (t.g29 ranks first).
GPU = [f"t.g{i}" for i in range(30)]
#: Default-pool lanes, waiting for the heavy lease once one of them holds it.
HEAVY = [f"t.h{i}" for i in range(5)]


def nothing() -> None:
    """A lane body: these tests only look at what beat plans, sends and publishes."""


def lanes(app: Celery) -> None:
    for name in GPU:
        app.task(shared=False, base=LaneTask, name=name,
                 lane=Lane(cadence_s=60, pool="gpu"))(nothing)
    for name in HEAVY:
        app.task(shared=False, base=LaneTask, name=name, lane=Lane(cadence_s=60))(nothing)


@pytest.fixture
def queues(broker: redis.Redis) -> Iterator[redis.Redis]:
    broker.delete("gpu")
    yield broker
    broker.delete("gpu")


@pytest.fixture
def planned(monkeypatch: pytest.MonkeyPatch) -> list[set[str]]:
    """The lanes beat's planner was given, per tick that planned."""
    seen: list[set[str]] = []
    plan_tick = beat.plan_tick

    def spy(specs: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append({spec.name for spec in specs})
        return plan_tick(specs, *args, **kwargs)

    monkeypatch.setattr(beat, "plan_tick", spy)
    return seen


def scheduler(key_prefix: str, client: redis.Redis) -> FairScheduler:
    keys, now = Keys(key_prefix), time.time()
    for i, name in enumerate(GPU):
        LaneStore(client, keys).write_run(name, RunRecord(runs=1, last_run_at=now - 60 * (
            2 + i / 10), last_task_id=f"done-{name}"))
    app = make_app(key_prefix, lanes, beat_max_loop_interval_s=0.2, beat_lock_ttl_s=5.0,
                   start_deadline_s=30.0, pools="gpu=2", pressure_yield=True)
    return FairScheduler(app=app)


def gpu_pressure(client: redis.Redis, keys: Keys) -> Any:
    return decode_pressure(client.hget(keys.slot("gpu", 0).pressure, "current"), "pool")


def waiters_planned(planned: list[set[str]], waiters: int = 28) -> set[str]:
    """The gpu waiters (the ``waiters`` lanes ranked below the holders) the last tick
    planned."""
    return (planned[-1] if planned else set()) & set(GPU[:waiters])


def test_a_tick_with_every_slot_held_plans_none_of_the_pools_waiters(
        key_prefix: str, queues: redis.Redis, redis_client: redis.Redis,
        planned: list[set[str]]) -> None:
    sched = scheduler(key_prefix, redis_client)
    sched.tick()  # grants both gpu slots (the two stalest) and the heavy lease
    assert [m["task"] for m in queued(queues, "gpu")] == ["t.g29", "t.g28"]
    assert waiters_planned(planned) == set(GPU[:28])
    for _ in range(3):
        planned.clear()
        sched.tick()
        assert waiters_planned(planned) == set()
        assert not planned or not planned[-1] & {*GPU[:28], *HEAVY[1:]}
        assert sched.engine.memory.skipped == {"gpu": 28, DEFAULT_POOL: 4}
    assert len(queued(queues, "gpu")) == 2  # nothing more sent meanwhile
    sched.close()


def test_a_slot_freed_or_held_anew_or_started_makes_the_next_tick_plan_the_waiters(
        key_prefix: str, queues: redis.Redis, redis_client: redis.Redis,
        planned: list[set[str]]) -> None:
    keys = Keys(key_prefix)
    sched = scheduler(key_prefix, redis_client)
    sched.tick()
    first = queued(queues, "gpu")
    sched.tick()
    assert waiters_planned(planned) == set()
    # Slot 0's run starts (its worker says so under the same token): the pool's longest
    # holder may change, so the waiters are planned once, and skipped again after.
    slot0 = HeavyLease(redis_client, keys.slot("gpu", 0))
    assert slot0.start(grant(first[0])["token"], 30.0, time.time())[0]
    sched.tick()
    assert waiters_planned(planned) == set(GPU[:28])
    sched.tick()
    assert waiters_planned(planned) == set()
    # Slot 0 held anew under another token (say an operator cleared it and a holder took it
    # outside beat): planned again, nothing granted (no slot is free).
    assert slot0.release(grant(first[0])["token"])
    assert slot0.acquire("t.g29", "other", 30.0, time.time(), task_id=first[0]["id"]).granted
    sched.tick()
    assert waiters_planned(planned) == set(GPU[:28])
    sched.tick()
    assert waiters_planned(planned) == set()
    assert len(queued(queues, "gpu")) == 2
    # Slot 1's run ends: the next tick plans every waiter and grants the top-ranked one.
    done = RunRecord(runs=2, last_run_at=time.time(), last_task_id=first[1]["id"],
                     fence=grant(first[1])["fence"])
    assert LaneStore(redis_client, keys.slot("gpu", 1)).finish(
        "t.g28", done, token=grant(first[1])["token"], fence=done.fence,
        wake_message="t.g28:completed") == (True, 1)
    sched.tick()
    assert waiters_planned(planned) == set(GPU[:28])
    after = queued(queues, "gpu")
    assert [m["task"] for m in after][2:] == ["t.g27"] and grant(after[2])["slots"] == [1]
    sched.tick()  # full again under the grant just made: skipped
    assert waiters_planned(planned, 27) == set()
    assert sched.engine.memory.skipped["gpu"] == 27
    sched.close()


def test_the_pools_pressure_stands_across_the_ticks_that_skip_its_waiters(
        key_prefix: str, queues: redis.Redis, redis_client: redis.Redis,
        planned: list[set[str]]) -> None:
    keys = Keys(key_prefix)
    store = LaneStore(redis_client, keys)
    sched = scheduler(key_prefix, redis_client)
    sched.tick()
    published = gpu_pressure(redis_client, keys)
    assert published is not None and published.lane == "t.g27"
    for _ in range(3):
        sched.tick()
        assert waiters_planned(planned) == set()
        assert gpu_pressure(redis_client, keys) == published
    # A lower-ranked waiter changes (its record rewritten as it was): the tick sees it
    # alone, and must not take it for the pool's top waiter.
    store.touch(["t.g3"])
    sched.tick()
    assert waiters_planned(planned) == {"t.g3"}
    assert gpu_pressure(redis_client, keys) == published
    # A waiter now staler than every other changes: it is the pressure.
    stale = json.loads(redis_client.hget(keys.lanes, "t.g5|run"))
    store.write_run("t.g5", RunRecord(runs=1, last_run_at=stale["last_run_at"] - 3600,
                                      last_task_id="done-t.g5"))
    sched.tick()
    assert waiters_planned(planned) == {"t.g5"}
    moved = gpu_pressure(redis_client, keys)
    assert moved is not None and moved.lane == "t.g5" and moved.fence == published.fence
    # The pressing lane is paused: the tick plans every waiter to learn who presses next.
    store.pause("t.g5")
    sched.tick()
    assert waiters_planned(planned) >= set(GPU[:28]) - {"t.g5"}
    now_top = gpu_pressure(redis_client, keys)
    assert now_top is not None and replace(now_top, at=0.0) == replace(published, at=0.0)
    sched.tick()
    assert waiters_planned(planned) == set()
    sched.close()
