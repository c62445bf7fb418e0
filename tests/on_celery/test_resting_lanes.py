"""Beat in-process on real Redis: a lane read every tick (here: one with a due check) is left
out of the read while it rests on the record it was planned on (9961958), so every change to
that record must reach beat's memory through the read that carried its change mark - also
when the tick that read it did not get as far as planning."""

from __future__ import annotations

import time

import pytest
import redis
from celery import Celery

from schedproj import Lane, LaneKind, LaneTask
from schedproj.core.records import Outcome, RunRecord
from schedproj.on_celery.beat import FairScheduler
from tests.conftest import make_app, sent

pytestmark = pytest.mark.timeout(60)

CHECKED = "r.checked"


class Check:
    """A due check that answers no backlog, or raises once when told to."""

    def __init__(self) -> None:
        self.fail_next = False

    def __call__(self) -> int:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the store the check reads is unreachable")
        return 0


def scheduler(key_prefix: str, check: Check) -> FairScheduler:
    def declare(app: Celery) -> None:
        @app.task(shared=False, base=LaneTask, name=CHECKED,
                  lane=Lane(cadence_s=3600, kind=LaneKind.LIGHT, due_check=check))
        def checked() -> None: ...

    return FairScheduler(app=make_app(key_prefix, declare, beat_max_loop_interval_s=0.2,
                                      beat_lock_ttl_s=5.0, start_deadline_s=5.0,
                                      wake_on_release=False))


def finish(sched: FairScheduler, task_id: str, runs: int) -> None:
    """A run of the lane ends as a worker ends it (``run_finish.lua``: record written, lane
    marked changed), next due in an hour."""
    now = time.time()
    sched.rt.store.finish(CHECKED, RunRecord(last_run_at=now, runs=runs, last_task_id=task_id,
                                             last_outcome=Outcome.COMPLETED),
                          token="", fence=0, wake_message="done", due_at=now + 3600)


def remembered_runs(sched: FairScheduler) -> int:
    memory = sched.engine.memory
    state = memory.resting(time.time()).get(CHECKED) or memory.states.get(CHECKED)
    assert state is not None
    return state.run.runs


def test_a_change_read_by_a_tick_that_stopped_short_is_not_lost_to_the_resting_record(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    """A tick Redis refused a write in (a key of the wrong type: beat names it and keeps
    running, ``_say_refused``) after its read had consumed a resting lane's change mark: the
    next ticks took the record the lane rested on for the one they would have read, and
    wrote it back over the fresh one beat had learnt, so a finished run stayed unseen until
    the lane's quiet ended (here an hour) or the reconcile marked it changed again."""
    check = Check()
    sched = scheduler(key_prefix, check)
    sched.tick()  # takes the lock, dispatches the never-run lane
    finish(sched, sent(broker, "light")[0]["id"], runs=1)
    for _ in range(2):
        sched.tick()  # reads the end, plans the lane: not due for an hour, so it rests
    assert CHECKED in sched.engine.memory.resting(time.time())
    assert remembered_runs(sched) == 1
    # A worker records another run (its write marks the lane changed, as every writer's
    # does); the tick that reads it stops short: the due check raises, and recording that
    # error is refused because the counters hash holds a string (garbage in a key).
    finish(sched, "t-2", runs=2)
    redis_client.set(sched.rt.keys.counters, "garbage")
    check.fail_next = True
    sched.tick()
    for _ in range(3):
        sched.tick()
    assert remembered_runs(sched) == 2, "beat went on with the record the lane rested on"
    sched.close()
