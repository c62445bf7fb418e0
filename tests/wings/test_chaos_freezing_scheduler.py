"""The beat-freeze fault lives in the chaos run, not in the production settings (issue 19): the
frozen beat is a :class:`FreezingScheduler` started with ``-S``; the plain scheduler and the
settings know nothing of it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from schedproj.chaos import processes
from schedproj.chaos.scheduler import FREEZE_ENV, FREEZING_SCHEDULER, FreezingScheduler, freeze_s
from schedproj.on_celery.beat import FairScheduler
from schedproj.settings import Settings
from tests.on_celery.test_fair_scheduler_tick import build, three_lanes


def test_no_production_setting_stalls_beat(key_prefix: str, broker: redis.Redis,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    assert not [name for name in Settings.model_fields if "freeze" in name]
    monkeypatch.setenv("SCHEDPROJ_TEST_FREEZE_BEFORE_SEND_S", "2.5")
    monkeypatch.setenv(FREEZE_ENV, "2.5")
    plain = FairScheduler(app=build(key_prefix, three_lanes))
    assert plain.dispatch_seams(plain.settings) == {}
    plain.close()


def test_the_freezing_scheduler_fills_the_seam_only_when_asked(
        key_prefix: str, broker: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FREEZE_ENV, raising=False)
    sched = FreezingScheduler(app=build(key_prefix, three_lanes))
    assert sched.dispatch_seams(sched.settings) == {}
    monkeypatch.setenv(FREEZE_ENV, "2.5")
    assert set(sched.dispatch_seams(sched.settings)) == {"before_send"}
    sched.close()


@pytest.mark.parametrize(("raw", "seconds"), [("2.5", 2.5), ("", 0.0), ("-1", 0.0),
                                              ("soon", 0.0), ("nan", 0.0)])
def test_the_freeze_length_is_read_safely(raw: str, seconds: float) -> None:
    assert freeze_s({FREEZE_ENV: raw}) == seconds


def test_the_fleet_starts_the_frozen_beat_with_the_freezing_scheduler(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[dict[str, Any]] = []

    def fake_spawn(name: str, argv: list[str], env: dict[str, str], log: Path) -> Any:
        started.append({"argv": argv, "env": env})
        return SimpleNamespace(name=name, popen=None, log=log)

    monkeypatch.setattr(processes, "spawn", fake_spawn)
    fleet = processes.Fleet(env={}, logdir=tmp_path)
    fleet.spawn("beat")
    fleet.spawn("beat", freeze_before_send_s=2.5)
    plain, frozen = started
    assert plain["argv"][plain["argv"].index("-S") + 1] == "fair"
    assert FREEZE_ENV not in plain["env"]
    assert frozen["argv"][frozen["argv"].index("-S") + 1] == FREEZING_SCHEDULER
    assert frozen["env"][FREEZE_ENV] == "2.5"
