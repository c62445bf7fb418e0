"""Clock skew is bounded (issue 10, found #10): a ``last_run_at`` in the future — written by a
worker whose clock is ahead — never delays a lane by more than one cadence.

``last_run_at`` comes from the worker's clock; beat's own record of the lane's last dispatch
comes from beat's. A future ``last_run_at`` is capped at that dispatch plus one cadence (the run
ended after its dispatch), so the lane falls due at most one cadence later than if the run had
ended the moment it was dispatched. Before, an hour of skew made a 10-minute lane wait 70
minutes. Pure tests: ``now`` is passed in.
"""

from __future__ import annotations

import pytest

from schedproj.core.health import assess
from schedproj.core.lanes import LaneKind, LaneSpec, Profile
from schedproj.core.pipeline import decide, seconds_until_next_due
from schedproj.core.records import LaneState, RunRecord, SchedRecord
from schedproj.core.views import effective_last_run, view_lane

T0 = 1_700_000_000.0
MIN, HOUR = 60.0, 3600.0
CADENCE = 10 * MIN
SUMMARY = LaneSpec(name="summary", task_name="t.summary", kind=LaneKind.HEAVY,
                   cadence_s=CADENCE)
LIGHT = LaneSpec(name="pulse", task_name="t.pulse", kind=LaneKind.LIGHT, cadence_s=CADENCE)


def skewed(spec: LaneSpec, skew_s: float, run_s: float = 30.0) -> LaneState:
    """Dispatched by beat at T0 (beat's clock); the run took ``run_s`` and ended at
    T0 + run_s real time, which the worker, ``skew_s`` ahead, wrote as its last_run_at."""
    return LaneState(
        run=RunRecord(last_run_at=T0 + run_s + skew_s, last_task_id="m-1", runs=1),
        sched=SchedRecord(inflight_task_id="m-1", inflight_deadline=T0 + MIN,
                          last_dispatch_at=T0, dispatches=1))


@pytest.mark.parametrize("spec", [SUMMARY, LIGHT], ids=["heavy", "light"])
def test_an_hour_ahead_delays_a_ten_minute_lane_at_most_one_cadence(spec: LaneSpec) -> None:
    state = skewed(spec, skew_s=HOUR)
    true_end = T0 + 30.0
    # Due at the latest one cadence after it should have been: true end + 2 cadences.
    latest = true_end + 2 * CADENCE
    assert view_lane(spec, state, None, latest).due
    decision = decide([spec], {spec.name: state}, None, latest)
    assert decision.dispatched == (spec.name,)
    # Beat's next wake is no later than that either.
    just_after = true_end + 1.0
    views = decide([spec], {spec.name: state}, None, just_after).views
    wait = seconds_until_next_due(views, {spec.name: state}, just_after)
    assert wait is not None and just_after + wait <= latest


@pytest.mark.parametrize("skew_s", [2.0, MIN, 9 * MIN, HOUR, 24 * HOUR, 365 * 24 * HOUR])
@pytest.mark.parametrize("run_s", [0.0, 30.0, 5 * MIN, 25 * MIN])
def test_any_forward_skew_is_bounded_by_one_cadence(skew_s: float, run_s: float) -> None:
    state = skewed(SUMMARY, skew_s, run_s)
    true_end = T0 + run_s
    honest_due = true_end + CADENCE
    assert view_lane(SUMMARY, state, None, honest_due + CADENCE).due
    last = effective_last_run(state, CADENCE, true_end)
    assert last is not None and T0 <= last <= true_end + CADENCE


@pytest.mark.parametrize("run_s", [30.0, 25 * MIN])
def test_honest_clocks_are_taken_at_their_word(run_s: float) -> None:
    """No skew: nothing changes, long runs included (a 25-minute run of a 10-minute lane is
    due one cadence after it ended, not at once)."""
    state = skewed(SUMMARY, 0.0, run_s)
    end = T0 + run_s
    for now in (end, end + CADENCE / 2, end + CADENCE - 1, end + CADENCE):
        assert effective_last_run(state, CADENCE, now) == end
        view = view_lane(SUMMARY, state, None, now)
        assert view.ratio == pytest.approx((now - end) / CADENCE)
        assert view.due is (now >= end + CADENCE)


def test_small_skew_within_a_cadence_is_kept() -> None:
    """A worker a few seconds ahead: the lane waits those seconds (less than a cadence)."""
    state = skewed(SUMMARY, 5.0)
    end_as_written = T0 + 35.0
    assert not view_lane(SUMMARY, state, None, end_as_written + CADENCE - 1).due
    assert view_lane(SUMMARY, state, None, end_as_written + CADENCE).due


def test_status_ratio_agrees_with_the_scheduler() -> None:
    state = skewed(SUMMARY, HOUR)
    now = T0 + 2 * CADENCE
    health = assess([SUMMARY], {"summary": state}, None, now, Profile.LOCAL,
                    starvation_threshold_s=HOUR, hold_cap_s=30 * MIN)
    (lane,) = health.lanes
    view = view_lane(SUMMARY, state, None, now)
    assert lane.due and lane.ratio == view.ratio >= 1.0


def test_a_run_that_ended_while_the_tick_read_is_not_clamped() -> None:
    """Beat takes ``now`` before it reads; a long run (25 min of a 10-minute lane) ending in
    between writes a last_run_at a moment after ``now``. That is no skew: the lane is due one
    cadence after the run, not at once."""
    end = T0 + 25 * MIN
    state = LaneState(run=RunRecord(last_run_at=end, last_task_id="m-1", runs=1),
                      sched=SchedRecord(inflight_task_id="m-1", last_dispatch_at=T0))
    for now in (end - 0.2, end, end + CADENCE - 1):
        assert effective_last_run(state, CADENCE, now) == end
        assert not view_lane(SUMMARY, state, None, now).due
