"""Hand-made messages that carry something real (another lane's lease token, a family name)
start nothing, and write nothing they should not (issue 19: 7, 8, 9)."""

from __future__ import annotations

import json
import time

import pytest
import redis
from celery import Celery

from schedproj import Lane, LaneKind, LaneTask
from schedproj.core.families import LaneFamily
from schedproj.on_celery.messages import heavy_kwargs, light_kwargs
from schedproj.store.families import FamilyStore
from schedproj.store.lease import HeavyLease
from schedproj.store.protocol import Keys
from tests.conftest import make_app

pytestmark = pytest.mark.timeout(60)

FAMILY = "g.tenant"


def forged_app(prefix: str, ran: list[str]) -> Celery:
    def declare(app: Celery) -> None:
        @app.task(shared=False, base=LaneTask, name="g.backup", lane=Lane(cadence_s=60))
        def backup() -> None:
            ran.append("backup")

        @app.task(shared=False, base=LaneTask, name="g.compact", lane=Lane(cadence_s=60))
        def compact() -> None:
            ran.append("compact")

        @app.task(shared=False, base=LaneTask, name="g.light",
                  lane=Lane(cadence_s=60, kind=LaneKind.LIGHT))
        def light() -> None:
            ran.append("light")

        @app.task(shared=False, base=LaneTask, name=FAMILY,
                  lane=LaneFamily(cadence_s=60, kind=LaneKind.LIGHT))
        def tenant(key: str) -> None:
            ran.append(f"tenant:{key}")

    return make_app(prefix, declare)


def call(app: Celery, task: str, task_id: str, *args: object, **kwargs: object) -> object:
    lane_task = app.tasks[task]
    lane_task.push_request(id=task_id)
    try:
        return lane_task(*args, **kwargs)
    finally:
        lane_task.pop_request()


def test_a_grant_for_one_lane_starts_no_other_lane(key_prefix: str,
                                                   redis_client: redis.Redis) -> None:
    ran: list[str] = []
    app = forged_app(key_prefix, ran)
    keys = Keys(key_prefix)
    redis_client.set(keys.beat_fence, 7)
    lease = HeavyLease(redis_client, keys)
    grant = lease.acquire("g.compact", "tok", 30, time.time(), task_id="real-compact")
    # compact's pending token on a hand-made backup message: refused, the lease untouched.
    reply = call(app, "g.backup", "forged-1", **heavy_kwargs("tok", grant.fence, 7))
    assert ran == [] and isinstance(reply, dict) and reply["reason"].startswith("stale-lease")
    held = lease.read()
    assert held is not None and held.started_at is None and held.lane == "g.compact"
    # compact's token and lane, another task id: not the message the grant was made for.
    call(app, "g.compact", "forged-2", **heavy_kwargs("tok", grant.fence, 7))
    assert ran == []
    # The real message still runs.
    call(app, "g.compact", "real-compact", **heavy_kwargs("tok", grant.fence, 7))
    assert ran == ["compact"]


def test_a_light_lane_with_an_unreadable_record_runs_nothing(
        key_prefix: str, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    ran: list[str] = []
    app = forged_app(key_prefix, ran)
    keys = Keys(key_prefix)
    redis_client.set(keys.beat_fence, 7)
    redis_client.hset(keys.lanes, "g.light|run", "{not json")
    with caplog.at_level("WARNING"):
        for n in range(3):
            call(app, "g.light", f"forged-{n}", **light_kwargs(99))
    assert ran == [], "a message ran with no dispatch check"
    assert redis_client.hget(keys.lanes, "g.light|run") == "{not json", "the record was touched"
    said = [r for r in caplog.records if "unreadable" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]


def test_a_key_that_is_not_a_member_runs_and_records_nothing(
        key_prefix: str, redis_client: redis.Redis) -> None:
    ran: list[str] = []
    app = forged_app(key_prefix, ran)
    keys = Keys(key_prefix)
    redis_client.set(keys.beat_fence, 7)
    FamilyStore(redis_client, keys).add(FAMILY, ["real"])
    call(app, FAMILY, "forged-ghost", "ghost", **light_kwargs(7))
    assert ran == []
    fields = redis_client.hkeys(keys.lanes)
    assert not [f for f in fields if "ghost" in f], fields
    assert not [f for f in redis_client.hkeys(keys.counters) if "ghost" in f]
    # A member's message is judged as before (not its current dispatch here: refused).
    call(app, FAMILY, "forged-real", "real", **light_kwargs(7))
    record = json.loads(redis_client.hget(keys.lanes, f"{FAMILY}[real]|run"))
    assert record["last_outcome"] == "skipped"
