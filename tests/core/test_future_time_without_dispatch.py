"""A future ``last_run_at`` with no dispatch recorded by beat (a lost or hand-made sched record,
a run that ended before beat's record landed) delays a lane by at most one cadence too (issue
19: 14). Before, a 600 s lane an hour ahead was next due in 4,200 s. Pure: ``now`` passed in."""

from __future__ import annotations

import pytest

from schedproj.core.due import due_at, effective_last_run
from schedproj.core.lanes import LaneKind, LaneSpec
from schedproj.core.records import LaneState, RunRecord

NOW = 1_700_000_000.0
CADENCE = 600.0
LANE = LaneSpec(name="summary", task_name="t.summary", kind=LaneKind.HEAVY, cadence_s=CADENCE)


@pytest.mark.parametrize("ahead_s", [CADENCE + 1, 3600.0, 86_400.0 * 365])
def test_a_far_future_time_without_dispatch_delays_at_most_one_cadence(ahead_s: float) -> None:
    state = LaneState(run=RunRecord(last_run_at=NOW + ahead_s, runs=1))
    assert due_at(LANE, state, NOW) <= NOW, "more than a cadence ahead: just due now"



def test_the_bound_holds_tick_after_tick_not_only_once() -> None:
    """A clamp anchored on 'now' would move with every tick and never fall due."""
    state = LaneState(run=RunRecord(last_run_at=NOW + 3600.0, runs=1))
    assert all(due_at(LANE, state, NOW + t) <= NOW + CADENCE for t in range(0, 601, 30))


@pytest.mark.parametrize("ahead_s", [1.0, CADENCE])
def test_up_to_one_cadence_ahead_is_taken_as_it_is(ahead_s: float) -> None:
    state = LaneState(run=RunRecord(last_run_at=NOW + ahead_s, runs=1))
    assert effective_last_run(state, CADENCE, NOW) == NOW + ahead_s
