"""A pool run that ends between the tick's read and the read of the pool's slots is not
granted again on that tick.

The lane's record is read by the tick's read (every tick: a gate blocker) as in flight; its run
ends; ``FairScheduler._read_slots`` (a round trip after the read) finds its slot free. Beat saw
the lane due and not running and granted it again: it re-ran at once. The read now gets the
slots just before it, in its round trip (``Snapshot.watched``), and beat grants nothing when a
slot changed hands between that and its read of the slots.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
import redis
from celery import Celery

from schedproj import Lane, LaneKind, LaneTask
from schedproj.core.lanes import DeferralReason, Gate, GateCondition
from schedproj.core.records import Outcome, RunRecord, encode
from schedproj.on_celery.beat import FairScheduler
from schedproj.store.protocol import Keys, run_field
from tests.conftest import make_app

pytestmark = pytest.mark.timeout(60)

GPU, LIGHT = "r.gpu", "r.after-gpu"
runs: list[str] = []


def declare(app: Celery) -> None:
    @app.task(shared=False, base=LaneTask, name=GPU, lane=Lane(cadence_s=3600, pool="gpu"))
    def gpu() -> None:
        runs.append("ran")

    @app.task(shared=False, base=LaneTask, name=LIGHT, lane=Lane(
        cadence_s=3600, kind=LaneKind.LIGHT,
        gates=(Gate(GPU, GateCondition.DUE_OR_RUNNING, DeferralReason.DEPENDENCY),)))
    def after() -> None: ...


def queued(broker: redis.Redis, queue: str) -> list[dict[str, Any]]:
    return [json.loads(m) for m in broker.lrange(queue, 0, -1)]


def run_message(app: Celery, message: dict[str, Any]) -> None:
    args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
    task = app.tasks[message["headers"]["task"]]
    task.push_request(id=message["headers"]["id"])
    try:
        task(*args, **kwargs)
    finally:
        task.pop_request()


def test_a_pool_run_ending_before_the_slot_read_is_not_granted_again(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    runs.clear()
    broker.delete("gpu")
    keys = Keys(key_prefix)
    app = make_app(key_prefix, declare, beat_max_loop_interval_s=0.2, beat_lock_ttl_s=5.0,
                   start_deadline_s=30.0, pools="gpu=1")
    now = time.time()
    redis_client.hset(keys.lanes, mapping={
        run_field(GPU): encode(RunRecord(last_run_at=now - 36000,
                                         last_outcome=Outcome.COMPLETED, runs=1)),
        run_field(LIGHT): encode(RunRecord(last_run_at=now - 10,
                                           last_outcome=Outcome.COMPLETED, runs=1))})
    sched = FairScheduler(app=app)
    sched.tick()
    first = queued(broker, "gpu")
    assert [m["headers"]["task"] for m in first] == [GPU]
    broker.delete("gpu")
    slots = sched.engine.slots
    real_read = slots.read
    done: list[bool] = []

    def read_after_the_run_ended() -> Any:
        if not done:
            done.append(True)
            run_message(app, first[0])
        return real_read()

    slots.read = read_after_the_run_ended
    time.sleep(0.05)
    sched.tick()
    assert done and runs == ["ran"]
    again = queued(broker, "gpu")
    if again:
        run_message(app, again[0])
    assert runs == ["ran"], f"{GPU} ran again right after its run ({len(runs)} runs)"
    sched.close()
    broker.delete("gpu")
