"""Per-tick facts about one lane (core/views.py): staleness ratio, due, in flight, backlog,
behind — as DESIGN §3 defines them (promises 3 and 4)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from schedproj.core.lanes import LaneKind, LaneSpec
from schedproj.core.records import LaneState, LeaseView, Outcome, RunRecord, SchedRecord
from schedproj.core.views import is_in_flight, staleness_ratio, view_all, view_lane

NOW = 1_700_000_000.0
HOUR = 3600.0


def spec(name: str = "a", kind: LaneKind = LaneKind.LIGHT, **kw: object) -> LaneSpec:
    return LaneSpec(name=name, task_name=f"t.{name}", kind=kind, cadence_s=HOUR,
                    **kw)  # type: ignore[arg-type]


def ran(ago: float | None, **run: object) -> LaneState:
    return LaneState(run=RunRecord(last_run_at=None if ago is None else NOW - ago,
                                   **run))  # type: ignore[arg-type]


def test_the_staleness_ratio_is_time_since_the_last_run_over_the_cadence() -> None:
    assert staleness_ratio(NOW - 90, 60.0, NOW) == 1.5
    assert staleness_ratio(NOW, 60.0, NOW) == 0.0
    assert staleness_ratio(NOW + 30, 60.0, NOW) == 0.0  # a clock ahead never goes negative
    assert staleness_ratio(None, 60.0, NOW) == math.inf


def test_a_lane_view_names_its_lane_and_carries_its_spec() -> None:
    lane = spec("x")
    view = view_lane(lane, ran(HOUR / 2), None, NOW)
    assert view.name == "x" and view.spec is lane
    assert view.ratio == 0.5 and not view.due and not view.never_run


@pytest.mark.parametrize(("ago", "due"), [(HOUR, True), (HOUR - 1, False), (None, True)])
def test_a_time_driven_lane_is_due_from_ratio_one(ago: float | None, due: bool) -> None:
    assert view_lane(spec(), ran(ago), None, NOW).due is due


def test_backlog_makes_a_lane_due_and_behind_and_the_probe_wins_over_the_record() -> None:
    recorded = view_lane(spec(), ran(1, backlog=3), None, NOW)
    assert (recorded.due, recorded.backlog, recorded.behind) == (True, 3, True)
    probed = view_lane(spec(), ran(1, backlog=3), None, NOW, probed_backlog=0)
    assert (probed.due, probed.backlog, probed.behind) == (False, 0, False)
    up = view_lane(spec(), ran(1), None, NOW, probed_backlog=2)
    assert (up.due, up.backlog) == (True, 2)


def test_a_negative_backlog_counts_as_none() -> None:
    view = view_lane(spec(), ran(1, backlog=-4), None, NOW)
    assert (view.backlog, view.due, view.behind) == (0, False, False)


def test_a_lane_that_never_ran_is_behind() -> None:
    view = view_lane(spec(), ran(None), None, NOW)
    assert view.never_run and view.behind and view.backlog == 0


@pytest.mark.parametrize(("state", "probe", "due"), [
    (ran(5 * HOUR), None, False), (ran(5 * HOUR, backlog=1), None, True),
    (ran(None), None, True), (ran(None), 0, False), (ran(None), 2, True),
    (ran(1, backlog=1), 0, False)])
def test_a_backlog_driven_lane_is_due_only_while_behind(state: LaneState, probe: int | None,
                                                         due: bool) -> None:
    view = view_lane(spec(backlog_driven=True), state, None, NOW, probed_backlog=probe)
    assert view.due is due
    assert view.ratio == staleness_ratio(state.run.last_run_at, HOUR, NOW)


def test_a_forced_lane_is_due_at_once() -> None:
    assert view_lane(spec(), ran(1), None, NOW, forced=True).due
    assert view_lane(spec(backlog_driven=True), ran(1), None, NOW, forced=True).due


def test_a_failed_run_is_retried_inside_its_window_only() -> None:
    lane = spec(retry_after_failure_s=900, retry_window_s=HOUR)
    failed = ran(901, last_outcome=Outcome.FAILED)
    assert view_lane(lane, failed, None, NOW).due
    assert not view_lane(lane, ran(899, last_outcome=Outcome.FAILED), None, NOW).due
    assert not view_lane(lane, ran(901, last_outcome=Outcome.COMPLETED), None, NOW).due
    late = ran(901, last_outcome=Outcome.FAILED, failing_since=NOW - 2 * HOUR)
    assert not view_lane(lane, late, None, NOW).due
    assert not view_lane(spec(), failed, None, NOW).due  # no retry policy


def test_a_due_ratio_moves_when_a_lane_is_due_not_its_ratio() -> None:
    early = replace(spec(), due_ratio=0.75)
    assert view_lane(early, ran(0.75 * HOUR), None, NOW).due
    assert not view_lane(early, ran(0.74 * HOUR), None, NOW).due
    assert view_lane(early, ran(0.75 * HOUR), None, NOW).ratio == 0.75


def test_a_heavy_lane_is_in_flight_exactly_while_it_holds_the_lease() -> None:
    heavy = spec("h", LaneKind.HEAVY)
    lease = LeaseView(lane="h", token="t", fence=1, granted_at=NOW)
    busy = LaneState(run=RunRecord(running_task_id="r", running_until=NOW + 60),
                     sched=SchedRecord(inflight_task_id="m", inflight_deadline=NOW + 60))
    assert view_lane(heavy, LaneState(), lease, NOW).in_flight
    assert not view_lane(heavy, busy, None, NOW).in_flight
    assert not view_lane(heavy, busy, replace(lease, lane="other"), NOW).in_flight


def test_a_light_lane_is_not_in_flight_by_the_lease() -> None:
    lease = LeaseView(lane="a", token="t", fence=1, granted_at=NOW)
    assert not view_lane(spec("a"), LaneState(), lease, NOW).in_flight


def state(*, running: str | None = None, until: float | None = None, last: str | None = None,
          skipped: str | None = None, inflight: str | None = None,
          deadline: float | None = None) -> LaneState:
    return LaneState(run=RunRecord(running_task_id=running, running_until=until,
                                   last_task_id=last, skipped_task_id=skipped),
                     sched=SchedRecord(inflight_task_id=inflight, inflight_deadline=deadline))


@pytest.mark.parametrize(("lane", "grace", "expected"), [
    pytest.param(state(), 0.0, False, id="nothing"),
    pytest.param(state(running="r", until=NOW + 1), 0.0, True, id="running-mark-fresh"),
    pytest.param(state(running="r", until=NOW), 0.0, False, id="mark-ends-now"),
    pytest.param(state(running="r", until=NOW - 5), 10.0, True, id="mark-within-grace"),
    pytest.param(state(running="r", until=NOW - 10), 10.0, False, id="mark-past-grace"),
    pytest.param(state(running="r", until=NOW + 60, last="r"), 0.0, False, id="run-ended"),
    pytest.param(state(running="r"), 0.0, False, id="running-without-mark"),
    pytest.param(state(inflight="m", deadline=NOW + 1), 0.0, True, id="message-not-started"),
    pytest.param(state(inflight="m", deadline=NOW), 0.0, False, id="message-expired"),
    pytest.param(state(inflight="m"), 0.0, False, id="message-without-deadline"),
    pytest.param(state(inflight="m", deadline=NOW + 60, last="m"), 0.0, False,
                 id="message-ran"),
    pytest.param(state(inflight="m", deadline=NOW + 60, skipped="m"), 0.0, False,
                 id="message-refused"),
    pytest.param(state(inflight="m", deadline=NOW + 60, running="m", until=NOW - 1), 0.0,
                 False, id="message-started-mark-lapsed"),
    pytest.param(state(inflight="m", deadline=NOW + 60, running="m", until=NOW + 1), 0.0,
                 True, id="message-started-mark-fresh"),
    pytest.param(state(inflight="m", deadline=NOW + 60, running="old", last="old"), 0.0,
                 True, id="new-message-after-an-ended-run"),
])
def test_a_light_lane_is_in_flight_while_its_run_or_message_may_still_go(
        lane: LaneState, grace: float, expected: bool) -> None:
    assert is_in_flight(lane, NOW, grace) is expected
    assert view_lane(spec(), lane, None, NOW, grace_s=grace).in_flight is expected


def test_view_all_views_each_lane_with_its_own_probe_force_and_grace() -> None:
    lanes = (spec("a"), spec("b"), spec("c"))
    states = {"a": ran(1), "c": state(running="r", until=NOW - 5)}
    views = view_all(lanes, states, None, NOW, {"a": 4}, forced={"b"}, grace_s=10)
    assert list(views) == ["a", "b", "c"]
    assert (views["a"].due, views["a"].backlog) == (True, 4)
    assert views["b"].due and views["b"].never_run
    assert views["c"].in_flight
    plain = view_all(lanes, states, None, NOW, {})
    assert not plain["a"].due and not plain["c"].in_flight


def test_without_a_grace_a_run_is_in_flight_only_until_its_mark() -> None:
    assert not is_in_flight(state(running="r", until=NOW - 0.5), NOW)
    assert is_in_flight(state(running="r", until=NOW + 0.5), NOW)
    lapsed = state(running="r", until=NOW - 0.5)
    assert not view_lane(spec(), lapsed, None, NOW).in_flight
    assert not view_all((spec(),), {"a": lapsed}, None, NOW, {})["a"].in_flight
