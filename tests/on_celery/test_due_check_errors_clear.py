"""A lane's recorded due-check error clears when its hook next succeeds, so status, posture
and the watchdog recover without anyone deleting the field by hand."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis
from celery import Celery

from schedproj import Lane, LaneTask
from schedproj.core.health import Posture
from schedproj.on_celery.beat import FairScheduler
from schedproj.ops.watchdog import step
from schedproj.store.protocol import Keys
from schedproj.telemetry.observe import observe
from tests.conftest import sent
from tests.on_celery.test_fair_scheduler_tick import build

HOUR = 3600.0


def raises_first(times: int) -> Callable[[], int]:
    """A due-check hook that raises on its first ``times`` calls, then reports no backlog."""
    calls = []

    def hook() -> int:
        calls.append(1)
        if len(calls) <= times:
            raise RuntimeError("backlog store down")
        return 0
    return hook


def lanes_with(hook: Callable[[], int]) -> Callable[[Celery], None]:
    def declare(app: Celery) -> None:
        @app.task(shared=False, base=LaneTask, name="t.probed",
                  lane=Lane(cadence_s=60, backlog_driven=True, due_check=hook, order=3))
        def probed() -> None: ...

        @app.task(shared=False, base=LaneTask, name="t.holder", lane=Lane(cadence_s=60, order=1))
        def holder() -> None: ...

        @app.task(shared=False, base=LaneTask, name="t.waits", lane=Lane(cadence_s=60, order=2))
        def waits() -> None: ...
    return declare


def test_a_hook_that_raises_once_then_succeeds_clears_its_error(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    keys = Keys(key_prefix)
    sched = FairScheduler(app=build(key_prefix, lanes_with(raises_first(1))))
    sched.tick()
    assert "backlog store down" in (redis_client.hget(keys.errors, "t.probed") or "")
    assert observe(redis_client, keys).health().posture is Posture.UNKNOWN

    sched.tick()  # the hook succeeds
    assert redis_client.hget(keys.errors, "t.probed") is None, "the error stayed recorded"
    assert observe(redis_client, keys).health().posture is Posture.HEALTHY
    # A later stall alarms: t.waits has waited behind t.holder's lease for two hours.
    later = observe(redis_client, keys, now=time.time() + 2 * HOUR)
    health = later.health(starvation_threshold_s=HOUR)
    assert "t.waits" in health.starving
    _, event = step(None, health)
    assert event == "fired"
    assert [m["task"] for m in sent(broker, "heavy")] == ["t.holder"]
    sched.close()


def test_clearing_costs_nothing_on_ticks_where_nothing_changed(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    sched = FairScheduler(app=build(key_prefix, lanes_with(raises_first(1))))
    clears: list[list[str]] = []
    clear = sched.rt.store.clear_errors
    monkeypatch.setattr(sched.rt.store, "clear_errors",
                        lambda lanes: (clears.append(lanes), clear(lanes)))
    for _ in range(4):
        sched.tick()
    assert clears == [["t.probed"]], "cleared more than once, or on ticks with no error"
    sched.close()


def test_a_new_beat_clears_an_error_an_earlier_beat_left(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    keys = Keys(key_prefix)
    first = FairScheduler(app=build(key_prefix, lanes_with(raises_first(1))))
    first.tick()
    first.close()
    assert redis_client.hget(keys.errors, "t.probed") is not None
    second = FairScheduler(app=build(key_prefix, lanes_with(raises_first(0))))
    second.tick()
    assert redis_client.hget(keys.errors, "t.probed") is None
    second.close()


def test_a_hook_that_keeps_raising_keeps_its_error(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    keys = Keys(key_prefix)
    sched = FairScheduler(app=build(key_prefix, lanes_with(raises_first(3))))
    for _ in range(3):
        sched.tick()
    assert redis_client.hget(keys.errors, "t.probed") is not None
    assert observe(redis_client, keys).health().posture is Posture.UNKNOWN
    sched.close()
