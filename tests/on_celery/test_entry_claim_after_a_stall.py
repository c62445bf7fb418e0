"""An entry judged in a tick that stalled is still sent once per due time (issue 20, promise 12).

The chaos run's entries audit found it (``schedproj/chaos/audit.py``: ``audit_entries``): a
beat whose tick took its time, then waited seconds on Redis (frozen by ``block-redis``, or a
Sentinel failing over) sent ``chaos.every-2s`` at 32.33 s and again at 32.34 s, and
``chaos.every-3s`` at 32.34 s and 32.42 s: the first claim recorded ``last_run_at`` = the
tick's start (29.37 s), while Celery's ``is_due`` had judged the entry on the clock of the
moment (32.3 s), so the next tick found it due again at once. Celery's beat coalesces missed
occurrences into one run.

Here the stall is a lane's due-check that takes 2.5 s once (a slow query), in process against
real Redis; a Redis frozen mid-tick stalls the tick the same way.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from schedproj import Lane, LaneKind, LaneTask
from schedproj.on_celery.beat import FairScheduler
from tests.conftest import make_app

#: Longer than the entry's interval: a stalled tick that sends it leaves its next due time
#: already past on the clock if the claim records the tick's start.
STALL_S = 2.5
EVERY_S = 1.0


@pytest.fixture
def default_queue(broker: redis.Redis) -> Iterator[redis.Redis]:
    broker.delete("celery")
    yield broker
    broker.delete("celery")


def sent_entries(broker: redis.Redis) -> list[str]:
    return [json.loads(m)["headers"]["id"] for m in broker.lrange("celery", 0, -1)]


def stalling_app(key_prefix: str, stall: dict[str, float]) -> Celery:
    def backlog() -> int:
        time.sleep(stall["s"])
        return 0

    def declare(app: Celery) -> None:
        @app.task(shared=False, name="shop.ping")
        def ping() -> None: ...

        @app.task(shared=False, base=LaneTask, name="t.slow-check",
                  lane=Lane(cadence_s=3600, kind=LaneKind.LIGHT, due_check=backlog))
        def slow_check() -> None: ...

        app.conf.beat_schedule = {"ping": {"task": "shop.ping", "schedule": EVERY_S}}

    # A beat lock that outlives the stall: the beat keeps it throughout.
    return make_app(key_prefix, declare, beat_max_loop_interval_s=0.2, beat_lock_ttl_s=30.0)


def test_an_entry_judged_after_a_stall_is_sent_once_for_its_due_time(
        key_prefix: str, default_queue: redis.Redis) -> None:
    stall = {"s": 0.0}
    sched = FairScheduler(app=stalling_app(key_prefix, stall))
    try:
        sched.tick()  # the entry counts from now
        time.sleep(EVERY_S + 0.1)
        sched.tick()
        assert len(sent_entries(default_queue)) == 1
        time.sleep(EVERY_S + 0.1)
        stall["s"] = STALL_S
        sched.tick()  # takes its time, then waits on the hook: the entry is due, sent
        stall["s"] = 0.0
        assert len(sent_entries(default_queue)) == 2
        sched.tick()  # a moment after that send: nothing is due
        sent: Any = sent_entries(default_queue)
        assert len(sent) == 2, f"one due time sent twice in a row: {sent}"
    finally:
        sched.close()
