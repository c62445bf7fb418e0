"""A fleet mid-rollout of ``SCHEDPROJ_COMPACT_RECORDS``: a beat with the setting one way, the
workers the other, in-process against real Redis. Beat dispatches on the run records the
workers wrote (either format), the workers start and end their runs on beat's sched records
(the light start checks its dispatch there) and on run records of either format, and each lane
counts every run: nothing is refused, misread or reported broken."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import redis
from celery import Celery

from schedproj import Lane, LaneKind, LaneTask
from schedproj.core.records import COMPACT_FORMAT, LONG_FORMAT, RunRecord, SchedRecord
from schedproj.on_celery.beat import FairScheduler
from schedproj.store.lane_store import LaneStore
from schedproj.store.protocol import Keys, run_field, sched_field
from tests.conftest import make_app

pytestmark = pytest.mark.timeout(60)

HEAVY, LIGHT = "c.heavy", "c.light"
FORMATS = {False: LONG_FORMAT, True: COMPACT_FORMAT}


def declare(app: Celery) -> None:
    @app.task(shared=False, base=LaneTask, name=HEAVY, lane=Lane(cadence_s=3600))
    def heavy() -> None: ...

    @app.task(shared=False, base=LaneTask, name=LIGHT,
              lane=Lane(cadence_s=3600, kind=LaneKind.LIGHT))
    def light() -> None: ...


def run_all(app: Celery, broker: redis.Redis) -> int:
    """Run every message waiting in the broker's queues on ``app``'s worker path, in-process;
    how many ran."""
    ran = 0
    for queue in ("heavy", "light"):
        while (raw := broker.rpop(queue)) is not None:
            message = json.loads(raw)
            args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
            task = app.tasks[message["headers"]["task"]]
            task.push_request(id=message["headers"]["id"])
            try:
                task(*args, **kwargs)
            finally:
                task.pop_request()
            ran += 1
    return ran


@pytest.mark.parametrize(("beat_compact", "worker_compact"),
                         [(False, True), (True, False), (True, True)])
def test_a_mixed_fleet_runs_every_lane_on_records_of_both_formats(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis, beat_compact: bool,
        worker_compact: bool) -> None:
    settings: dict[str, Any] = {"beat_max_loop_interval_s": 0.2, "beat_lock_ttl_s": 5.0,
                                "start_deadline_s": 30.0}
    beat_app = make_app(key_prefix, declare, compact_records=beat_compact, **settings)
    worker_app = make_app(key_prefix, declare, compact_records=worker_compact, **settings)
    keys, sched = Keys(key_prefix), FairScheduler(app=beat_app)
    operator = LaneStore(redis_client, keys)
    try:
        for _ in range(3):
            sched.tick()
            assert run_all(worker_app, broker) == 2
            for lane in (HEAVY, LIGHT):
                operator.run_now(lane)  # due again at once
        sched.tick()  # beat reads the last ends and writes its records once more
        assert not redis_client.hgetall(keys.errors)
        for lane in (HEAVY, LIGHT):
            run_raw = redis_client.hget(keys.lanes, run_field(lane))
            sched_raw = redis_client.hget(keys.lanes, sched_field(lane))
            assert json.loads(run_raw)["v"] == FORMATS[worker_compact]
            assert json.loads(sched_raw)["v"] == FORMATS[beat_compact]
            run = operator.read_run(lane)
            assert (run.runs, run.failures, run.running_task_id) == (3, 0, None), run
            assert run.last_outcome == "completed"
        states = operator.snapshot("reader", 1.0).states
        assert all(isinstance(states[lane].sched, SchedRecord)
                   and states[lane].sched.dispatches >= 3 for lane in (HEAVY, LIGHT))
        assert isinstance(states[HEAVY].run, RunRecord)
    finally:
        sched.close()
