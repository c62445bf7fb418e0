"""Scheduling never stops silently (issue 19): a lane due past its bound that beat neither
dispatched, deferred nor paused makes the posture degraded, status names it with its due time,
and the watchdog fires, whatever broke scheduling. Beat in-process, real Redis."""

from __future__ import annotations

import time
from collections.abc import Callable
from unittest.mock import patch

import pytest
import redis
from celery import Celery
from prometheus_client import CollectorRegistry, generate_latest

from schedproj import Lane, LaneKind, LaneTask
from schedproj.core.health import Posture
from schedproj.core.records import Outcome, RunRecord
from schedproj.on_celery.beat import FairScheduler
from schedproj.ops.watchdog import step
from schedproj.store.lane_store import Snapshot
from schedproj.store.protocol import Keys
from schedproj.telemetry.metrics import SchedprojCollector
from schedproj.telemetry.observe import observe
from schedproj.telemetry.status import as_json
from tests.conftest import make_app, sent

LANE = "u.light"
#: The bound these tests judge by (the default, UNDISPATCHED_AFTER_S, is a minute).
BOUND_S = 0.5


def one_light_lane(app: Celery) -> None:
    @app.task(shared=False, base=LaneTask, name=LANE,
              lane=Lane(cadence_s=1, kind=LaneKind.LIGHT))
    def light() -> None: ...


def finish(sched: FairScheduler, broker: redis.Redis) -> None:
    """The newest message's run (the broker list's head) ends as a worker ends it: due again
    a second later."""
    now = time.time()
    sched.rt.store.finish(LANE, RunRecord(last_run_at=now, runs=1, last_outcome=Outcome.COMPLETED,
                                          last_task_id=sent(broker, "light")[0]["id"]),
                          token="", fence=0, wake_message="done", due_at=now + 1)


def no_heal(sched: FairScheduler) -> None:
    def as_read(snap: Snapshot, now: float) -> Snapshot:
        return snap
    sched._heal = as_read  # type: ignore[method-assign]


BREAKS: dict[str, Callable[[FairScheduler, redis.Redis, Keys], bool]] = {
    # Each breaks scheduling and says whether beat keeps ticking (False: frozen, SIGSTOP).
    "due index deleted, no heal": lambda s, c, k: (no_heal(s), c.delete(k.due)) and True,
    "beat frozen": lambda s, c, k: False,
    "beat lock held by a stranger": lambda s, c, k: bool(c.set(k.beat_lock, "stranger",
                                                               px=60_000)),
    "lanes hash of the wrong type": lambda s, c, k: bool(c.delete(k.lanes) or True)
    and bool(c.sadd(k.lanes, "x")),
    "beat fence not an integer": lambda s, c, k: bool(c.set(k.beat_fence, "abc")),
}


def assess(sched: FairScheduler, client: redis.Redis, keys: Keys) -> tuple[str, list, str]:
    obs = observe(client, keys, specs=tuple(sched.engine.lanes.lanes.specs))
    health = obs.health(undispatched_after_s=BOUND_S)
    _, event = step(None, health)
    status = as_json(obs, health)
    return status["posture"], status["undispatched"], str(event)


def run_for(sched: FairScheduler, seconds: float, ticking: bool) -> None:
    end = time.time() + seconds
    while time.time() < end:
        if ticking:
            sched.tick()
        time.sleep(0.05)


@pytest.mark.parametrize("how", sorted(BREAKS))
def test_scheduling_stopped_any_way_raises_the_alarm(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis, how: str) -> None:
    keys = Keys(key_prefix)
    sched = FairScheduler(app=make_app(key_prefix, one_light_lane, wake_on_release=False,
                                       beat_max_loop_interval_s=0.2, beat_lock_ttl_s=5.0))
    sched.tick()
    finish(sched, broker)
    sched.tick()
    assert assess(sched, redis_client, keys)[0] == Posture.HEALTHY.value
    ticking = BREAKS[how](sched, redis_client, keys)
    run_for(sched, 1 + 3 * BOUND_S, ticking)
    posture, undispatched, event = assess(sched, redis_client, keys)
    assert posture == Posture.DEGRADED.value, undispatched
    assert [u["lane"] for u in undispatched] == [LANE]
    assert time.time() - undispatched[0]["due_since"] >= BOUND_S
    assert event == "fired"
    registry = CollectorRegistry()
    registry.register(SchedprojCollector(redis_client, keys, sched.settings,
                                         tuple(sched.engine.lanes.lanes.specs)))
    with patch("schedproj.telemetry.observe.UNDISPATCHED_AFTER_S", BOUND_S):
        exported = generate_latest(registry).decode()
    assert "schedproj_undispatched_lanes 1.0" in exported


def test_a_working_beat_raises_no_alarm(key_prefix: str, broker: redis.Redis,
                                        redis_client: redis.Redis) -> None:
    keys = Keys(key_prefix)
    sched = FairScheduler(app=make_app(key_prefix, one_light_lane, wake_on_release=False,
                                       beat_max_loop_interval_s=0.2, beat_lock_ttl_s=5.0))
    sched.tick()
    for _ in range(3):
        finish(sched, broker)
        run_for(sched, 1 + BOUND_S, ticking=True)
        assert assess(sched, redis_client, keys)[:2] == (Posture.HEALTHY.value, [])
    assert len(sent(broker, "light")) >= 3
    sched.close()
