"""The lane registry and the active beat's record, deleted while beat runs, are published again.

Beat writes both only on taking the lock. With ``<prefix>:lanes:published`` deleted, status and
the watchdog knew no lanes: the posture read unknown while beat dispatched on, a stall alarm
that was firing was cleared, and no stall could fire one (nothing said why but "no beat has
run with this prefix", with a beat running). Beat now publishes them again at the start of a
reconcile cycle, keeping the time it took over (the undispatched clock counts from it).
"""

from __future__ import annotations

import time

import pytest
import redis
from celery import Celery

from schedproj import Lane, LaneKind, LaneTask
from schedproj.core.health import Posture
from schedproj.on_celery.beat import FairScheduler
from schedproj.store.protocol import Keys
from schedproj.telemetry.observe import observe
from tests.conftest import make_app

pytestmark = pytest.mark.timeout(60)


def nothing() -> None:
    """A lane body: only what beat publishes is looked at."""


def declare(app: Celery) -> None:
    app.task(shared=False, base=LaneTask, name="p.light",
             lane=Lane(cadence_s=60, kind=LaneKind.LIGHT))(nothing)


def test_a_deleted_registry_and_beat_record_are_published_again(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    keys = Keys(key_prefix)
    app = make_app(key_prefix, declare, beat_max_loop_interval_s=0.2, beat_lock_ttl_s=5.0,
                   derived_reconcile_s=0.2)
    sched = FairScheduler(app=app)
    sched.tick()
    since = redis_client.hget(keys.beat_info, "since")
    assert observe(redis_client, keys).health().posture is Posture.HEALTHY
    redis_client.delete(keys.published_lanes, keys.beat_info)
    blind = observe(redis_client, keys)
    assert blind.health().posture is Posture.UNKNOWN
    assert any(keys.published_lanes in p and "deleted" in p for p in blind.problems)
    time.sleep(0.3)  # a reconcile cycle is due
    for _ in range(3):
        sched.tick()
    sched.close()
    assert redis_client.exists(keys.published_lanes), "the registry stays deleted"
    assert redis_client.hget(keys.beat_info, "since") == since, "the take-over time is kept"
    assert observe(redis_client, keys).health().posture is Posture.HEALTHY
