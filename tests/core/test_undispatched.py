"""``core.health``: a lane due past its bound with beat never acting on it is undispatched,
whatever the cause; a dispatch, a deferral, a pause or a run in flight is beat acting."""

from __future__ import annotations

from dataclasses import replace

import pytest

from schedproj.core.deferrals import Deferral, DeferralReason
from schedproj.core.health import UNDISPATCHED_AFTER_S, Posture, assess
from schedproj.core.lanes import LaneKind, LaneSpec, Profile
from schedproj.core.records import LaneState, RunRecord, SchedRecord

NOW = 1_000_000.0
LIGHT = LaneSpec(name="l", task_name="t.l", kind=LaneKind.LIGHT, cadence_s=100.0)


def ran(ago: float, dispatched_ago: float | None = None) -> LaneState:
    """Ran ``ago`` seconds before NOW (due 100 s later); last dispatched then unless said."""
    at = NOW - (ago if dispatched_ago is None else dispatched_ago)
    return LaneState(run=RunRecord(last_run_at=NOW - ago, runs=1),
                     sched=SchedRecord(last_dispatch_at=at, dispatches=1))


def judge(state: LaneState, beat_since: float | None = None):  # type: ignore[no-untyped-def]
    return assess([LIGHT], {"l": state}, None, NOW, Profile.LOCAL, starvation_threshold_s=1e9,
                  hold_cap_s=1e9, beat_since=beat_since)


def test_due_past_the_bound_with_no_dispatch_is_undispatched_since_it_fell_due() -> None:
    h = judge(ran(100 + UNDISPATCHED_AFTER_S + 1))
    assert h.undispatched == ("l",) and h.posture is Posture.DEGRADED
    assert h.lanes[0].due_since == NOW - UNDISPATCHED_AFTER_S - 1


def test_due_within_the_bound_is_not() -> None:
    h = judge(ran(100 + UNDISPATCHED_AFTER_S - 1))
    assert h.undispatched == () and h.posture is Posture.HEALTHY


@pytest.mark.parametrize("acted", ["deferred", "paused", "in flight"])
def test_beat_acting_on_the_lane_is_never_undispatched(acted: str) -> None:
    state = ran(10_000)
    if acted == "deferred":
        state = replace(state, sched=replace(state.sched, deferral=Deferral(
            lane="l", reason=DeferralReason.DEPENDENCY, blocker="x", since=NOW - 5000)))
    elif acted == "paused":
        state = replace(state, sched=replace(state.sched, paused=True))
    else:
        state = replace(state, sched=replace(state.sched, inflight_task_id="t",
                                             inflight_deadline=NOW + 10))
    assert judge(state).undispatched == ()


def test_a_recent_dispatch_or_a_new_beat_restarts_the_count() -> None:
    assert judge(ran(10_000, dispatched_ago=5)).undispatched == ()
    assert judge(ran(10_000), beat_since=NOW - 5).undispatched == ()
    assert judge(ran(10_000), beat_since=NOW - UNDISPATCHED_AFTER_S - 1).undispatched == ("l",)


def test_a_lane_never_run_with_no_beat_ever_is_not_judged() -> None:
    assert judge(LaneState()).undispatched == ()
    assert judge(LaneState(), beat_since=NOW - UNDISPATCHED_AFTER_S - 1).undispatched == ("l",)
