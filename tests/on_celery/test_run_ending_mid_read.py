"""A run that ends while beat reads is not granted again on that read.

A heavy run ending between two pages of beat's paged tick read: the gate blocker (an ``always``
lane, like REM's dream) is read by the tick's first call; its run ends (the real worker path,
in-process) before the next page; the lease is read by the last page, free. Beat saw the lane
due (its record as it was before the run ended) and not in flight (a heavy lane is in flight
only while the lease names it), and granted it again: it re-ran at once - a state no single
read shows (the lease held by it, or its record updated). The read now tells beat the lease
changed hands while it went (``Snapshot.holds_moved``), and beat grants nothing on it; the next
tick reads the run's end.
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
from schedproj.core.families import LaneFamily, member_lane
from schedproj.core.lanes import DeferralReason, Gate, GateCondition
from schedproj.core.records import Outcome, RunRecord, encode
from schedproj.on_celery.beat import FairScheduler
from schedproj.store.families import FamilyStore
from schedproj.store.protocol import Keys, run_field
from tests.conftest import make_app

pytestmark = pytest.mark.timeout(60)

HEAVY, LIGHT, FAMILY = "r.dream", "r.golden", "r.fam"
PAGE = 20
CADENCE_S = 3600.0
runs: list[str] = []


def declare(app: Celery) -> None:
    @app.task(shared=False, base=LaneTask, name=HEAVY, lane=Lane(cadence_s=CADENCE_S))
    def dream() -> None:
        runs.append("ran")

    @app.task(shared=False, base=LaneTask, name=LIGHT, lane=Lane(
        cadence_s=CADENCE_S, kind=LaneKind.LIGHT,
        gates=(Gate(HEAVY, GateCondition.DUE_OR_RUNNING, DeferralReason.DEPENDENCY),)))
    def golden() -> None: ...

    @app.task(shared=False, base=LaneTask, name=FAMILY,
              lane=LaneFamily(cadence_s=CADENCE_S, kind=LaneKind.LIGHT))
    def fam(key: str) -> None: ...


def heavy_messages(broker: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(m) for m in broker.lrange("heavy", 0, -1)]


def run_message(app: Celery, message: dict[str, Any]) -> None:
    """The worker's path for one heavy message (lease start, body, run end), in-process."""
    args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
    task = app.tasks[message["headers"]["task"]]
    task.push_request(id=message["headers"]["id"])
    try:
        task(*args, **kwargs)
    finally:
        task.pop_request()


@pytest.mark.parametrize("page", [PAGE, 100_000])
def test_a_heavy_run_ending_between_pages_is_not_granted_again(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis, page: int) -> None:
    runs.clear()
    keys = Keys(key_prefix)
    app = make_app(key_prefix, declare, beat_max_loop_interval_s=0.2, beat_lock_ttl_s=5.0,
                   start_deadline_s=30.0)
    members = [f"m{i:04d}" for i in range(8 * PAGE)]
    FamilyStore(redis_client, keys, [FAMILY]).add(FAMILY, members)
    now = time.time()
    redis_client.hset(keys.lanes, mapping={
        run_field(HEAVY): encode(RunRecord(last_run_at=now - 10 * CADENCE_S,
                                           last_outcome=Outcome.COMPLETED, runs=1)),
        run_field(LIGHT): encode(RunRecord(last_run_at=now - 10,
                                           last_outcome=Outcome.COMPLETED, runs=1)),
        **{run_field(member_lane(FAMILY, m)): encode(RunRecord(
            last_run_at=now - 10, last_outcome=Outcome.COMPLETED, runs=1)) for m in members}})
    sched = FairScheduler(app=app)
    store = sched.rt.store
    store.read_page = page
    sched.tick()
    first = heavy_messages(broker)
    assert [m["headers"]["task"] for m in first] == [HEAVY]
    broker.delete("heavy")
    # Something marks many lanes changed (a family's churn, an operator's touch): the next read
    # goes by pages (with page=100_000 it is one call).
    store.touch([member_lane(FAMILY, m) for m in members])
    real_page = store._tick_page
    done: list[bool] = []

    def page_call(**kwargs: Any) -> Any:
        if not done:  # after the first call (which read HEAVY, a gate blocker), before the rest
            done.append(True)
            run_message(app, first[0])
        return real_page(**kwargs)

    store._tick_page = page_call
    if page != PAGE:  # one call: the run ends just before it
        run_message(app, first[0])
        done.append(True)
    time.sleep(0.05)
    sched.tick()
    assert runs == ["ran"] and done
    again = heavy_messages(broker)
    record = store.read_run(HEAVY)
    assert record.runs == 2 and record.last_run_at is not None and record.last_run_at > now
    if again:  # what the worker does with it: runs the lane again, at once
        run_message(app, again[0])
    assert runs == ["ran"], f"{HEAVY} ran again {len(runs) - 1} time(s) right after its run"
    assert again == [], (
        f"{HEAVY} ran {now - (record.last_run_at or 0):.1f}s ago (ratio ~0) and was granted the "
        f"lease again: {[m['headers']['task'] for m in again]}")
    sched.close()
