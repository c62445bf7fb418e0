"""Beat records a dispatch (and grants its lease) before any message leaves: a beat that stalls
in between (the chaos run's beat freeze) has nothing in flight that Redis does not know of.
The stall goes through the dispatch path's seam, which a subclass fills: no test hook sits in
the production path."""

from __future__ import annotations

import json
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import redis

from schedproj.core.planner import Plan
from schedproj.on_celery.beat import FairScheduler, stall_before_send
from schedproj.settings import Settings
from schedproj.store.protocol import Keys
from tests.conftest import sent
from tests.on_celery.test_fair_scheduler_tick import build, three_lanes


def test_a_stall_between_recording_and_sending_finds_everything_recorded_and_nothing_sent(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    keys = Keys(key_prefix)
    seen: list[dict[str, object]] = []

    def look(plan: Plan) -> None:
        lease = json.loads(redis_client.get(keys.lease) or "null")
        light = json.loads(redis_client.hget(keys.lanes, "t.light|sched") or "{}")
        seen.append({"sends": sorted(plan.sends), "queued": len(sent(broker, "heavy"))
                     + len(sent(broker, "light")),
                     "lease": lease and lease["lane"],
                     "light in flight": light.get("inflight_task_id") == plan.sends[
                         "t.light"].task_id})

    class Stalling(FairScheduler):
        def dispatch_seams(self, settings: Settings) -> dict[str, Callable[[Plan], None]]:
            return {"before_send": look}

    sched = Stalling(app=build(key_prefix, three_lanes))
    sched.tick()
    assert seen == [{"sends": ["t.heavy-a", "t.light"], "queued": 0, "lease": "t.heavy-a",
                     "light in flight": True}]
    assert [m["task"] for m in sent(broker, "heavy")] == ["t.heavy-a"]
    assert [m["task"] for m in sent(broker, "light")] == ["t.light"]
    sched.close()


def test_the_plain_scheduler_stalls_only_when_the_fault_run_asks(
        key_prefix: str, broker: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = FairScheduler(app=build(key_prefix, three_lanes))
    assert plain.dispatch_seams(plain.settings) == {}
    # The fault run's frozen beat is a subclass of its own (no production setting stalls).
    from schedproj.chaos.scheduler import FREEZE_ENV, FreezingScheduler

    monkeypatch.setenv(FREEZE_ENV, "2.5")
    frozen = FreezingScheduler(app=build(key_prefix, three_lanes))
    assert set(frozen.dispatch_seams(frozen.settings)) == {"before_send"}
    plain.close()
    frozen.close()


def test_the_fault_runs_stall_waits_only_for_a_plan_that_sends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("schedproj.on_celery.beat.time.sleep", slept.append)
    stall = stall_before_send(2.5)
    stall(SimpleNamespace(sends={}))  # type: ignore[arg-type]
    assert slept == []
    stall(SimpleNamespace(sends={"t.light": object()}))  # type: ignore[arg-type]
    assert slept == [2.5]
