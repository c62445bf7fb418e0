"""Garbage never spins (issue 10, found #6): non-finite numbers are rejected when a stored value
is decoded, so the lane is reported unreadable; and a beat tick that sent nothing never comes
straight back, whatever the state says.

Before, a lane record holding ``NaN`` or ``Infinity`` (Python's json accepts both) passed
validation, the lane silently never fell due, the next wake became 0 and beat looped at
thousands of ticks a second.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest
import redis
from celery import Celery

from schedproj import Lane, LaneKind, LaneTask
from schedproj.core import codec, defaults
from schedproj.core.errors import StateError
from schedproj.core.records import RunRecord, SchedRecord, decode, encode
from schedproj.on_celery import beat as beat_module
from schedproj.on_celery.beat import FairScheduler
from schedproj.store.lane_store import parse_states
from schedproj.store.protocol import Keys
from tests.conftest import make_app

NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"]


@pytest.mark.parametrize("literal", NON_FINITE)
def test_codec_rejects_non_finite_numbers(literal: str) -> None:
    with pytest.raises(StateError) as info:
        codec.loads(f'{{"v":1,"x":{literal}}}', "the-key", 1)
    assert info.value.key == "the-key"
    assert "finite" in str(info.value)


def test_codec_still_reads_ordinary_numbers() -> None:
    assert codec.loads('{"v":1,"a":1.5,"b":-2,"c":1e300}', "k", 1) == {
        "a": 1.5, "b": -2, "c": 1e300}


@pytest.mark.parametrize("literal", NON_FINITE)
@pytest.mark.parametrize("field", ["last_run_at", "running_until", "failing_since"])
def test_run_record_with_non_finite_time_is_unreadable(field: str, literal: str) -> None:
    with pytest.raises(StateError):
        decode(RunRecord, f'{{"v":{defaults.STATE_VERSION},"{field}":{literal}}}', "lanes")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_record_written_by_code_does_not_read_back(value: float) -> None:
    """Even a record some buggy writer produced with a non-finite float is refused on read."""
    for record in (RunRecord(last_run_at=value), SchedRecord(inflight_deadline=value)):
        with pytest.raises(StateError):
            decode(type(record), encode(record), "lanes")


def test_deferral_with_non_finite_since_is_unreadable() -> None:
    raw = json.dumps({"v": defaults.STATE_VERSION, "deferral": {
        "lane": "a", "reason": "heavy-maintenance-lease-held", "since": "NaN"}})
    with pytest.raises(StateError):
        decode(SchedRecord, raw.replace('"NaN"', "NaN"), "lanes")


def test_non_finite_lane_record_marks_the_lane_unreadable() -> None:
    good = encode(RunRecord(last_run_at=1_000.0))
    states, errors = parse_states({"a|run": good, "b|run": '{"v":1,"last_run_at":NaN}',
                                   "c|run": '{"v":1,"last_run_at":Infinity}'}, "lanes")
    assert set(states) == {"a"}
    assert set(errors) == {"b", "c"}
    assert all("finite" in message for message in errors.values())


# -- beat: a tick that sent nothing sleeps at least the floor ----------------------------------


def build(key_prefix: str, **overrides: object) -> Celery:
    app = make_app(key_prefix, **{"beat_max_loop_interval_s": 1.0, "beat_lock_ttl_s": 3.0,
                                  "start_deadline_s": 5.0, "wake_on_release": False,
                                  **overrides})

    @app.task(shared=False, base=LaneTask, name="t.light",
              lane=Lane(cadence_s=600, kind=LaneKind.LIGHT))
    def light() -> None: ...

    return app


def test_beat_with_a_non_finite_record_reports_it_and_does_not_spin(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    keys = Keys(key_prefix)
    redis_client.hset(keys.lanes, "t.light|run",
                      f'{{"v":{defaults.STATE_VERSION},"last_run_at":NaN}}')
    sched = FairScheduler(app=build(key_prefix))
    try:
        sleeps = [sched.tick() for _ in range(3)]
        assert min(sleeps) >= defaults.BEAT_IDLE_SLEEP_FLOOR_S
        assert "t.light" in redis_client.hgetall(keys.errors)
        # (Shared tasks other test modules declared may join this app: look at ours.)
        sent = [json.loads(m)["headers"]["task"] for m in broker.lrange("light", 0, -1)]
        assert "t.light" not in sent
    finally:
        sched.close()


def zero_wait_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every plan says some lane falls due right now, yet sends nothing: the shape of state
    that reads as 'due now' and never dispatches."""
    original = beat_module.plan_tick

    def plan_tick(*args: Any, **kwargs: Any) -> Any:
        plan = original(*args, **kwargs)
        return replace(plan.only(set()), next_due_in_s=0.0)

    monkeypatch.setattr(beat_module, "plan_tick", plan_tick)


def test_idle_tick_sleeps_at_least_the_floor(key_prefix: str, broker: redis.Redis,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    zero_wait_plans(monkeypatch)
    sched = FairScheduler(app=build(key_prefix))
    try:
        assert sched.tick() >= defaults.BEAT_IDLE_SLEEP_FLOOR_S
    finally:
        sched.close()


def test_idle_tick_waits_for_a_wake_at_least_the_floor(key_prefix: str, broker: redis.Redis,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    zero_wait_plans(monkeypatch)
    sched = FairScheduler(app=build(key_prefix, wake_on_release=True))
    waits: list[float] = []
    assert sched.rt is not None
    monkeypatch.setattr(sched.rt.store, "wait_for_wake", waits.append)
    try:
        sched.tick()
        assert waits and waits[0] >= defaults.BEAT_IDLE_SLEEP_FLOOR_S
    finally:
        sched.close()


def test_floor_never_exceeds_the_loop_interval(key_prefix: str, broker: redis.Redis,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    zero_wait_plans(monkeypatch)
    interval = defaults.BEAT_IDLE_SLEEP_FLOOR_S / 2
    sched = FairScheduler(app=build(key_prefix, beat_max_loop_interval_s=interval,
                                    beat_lock_ttl_s=1.0))
    try:
        assert sched.tick() == pytest.approx(interval)
    finally:
        sched.close()
