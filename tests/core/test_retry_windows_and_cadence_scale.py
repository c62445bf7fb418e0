"""Failed-run retry windows (the original backup's) and cadence scaling. Pure."""

from __future__ import annotations

import pytest

from schedproj.core.errors import LaneDeclarationError
from schedproj.core.lanes import Gate, Lane, LaneKind, LaneSpec
from schedproj.core.laneset import build_lane_set
from schedproj.core.pipeline import decide
from schedproj.core.records import LaneState, Outcome, RunRecord

NOW = 1_000_000.0
MIN, HOUR, DAY = 60.0, 3600.0, 86400.0

BACKUP = LaneSpec(name="backup", task_name="backup", kind=LaneKind.HEAVY, cadence_s=DAY,
                  priority0=True, order=0, retry_after_failure_s=15 * MIN,
                  retry_window_s=HOUR)


def failed(ago: float, streak_ago: float | None = None) -> LaneState:
    return LaneState(run=RunRecord(last_run_at=NOW - ago, last_outcome=Outcome.FAILED,
                                   failing_since=None if streak_ago is None
                                   else NOW - streak_ago))


@pytest.mark.parametrize(("state", "due"), [
    (failed(10 * MIN), False),                       # too soon after the failure
    (failed(16 * MIN), True),                        # retry after 15 min
    (failed(16 * MIN, streak_ago=50 * MIN), True),   # still inside the 1 h window
    (failed(16 * MIN, streak_ago=2 * HOUR), False),  # window over: back to the cadence
    (LaneState(run=RunRecord(last_run_at=NOW - 16 * MIN,
                             last_outcome=Outcome.COMPLETED)), False),
], ids=["too-soon", "retry", "in-window", "window-over", "not-failed"])
def test_failed_backup_is_retried_within_its_window(state: LaneState, due: bool) -> None:
    decision = decide([BACKUP], {"backup": state}, None, NOW)
    assert (decision.winner == "backup") is due


class FakeTask:
    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.queue = None


def test_cadence_scale_scales_every_duration() -> None:
    lanes = build_lane_set({
        "a": FakeTask(Lane(cadence_s=600, retry_after_failure_s=60, retry_window_s=120)),
        "b": FakeTask(Lane(cadence_s=60, kind=LaneKind.LIGHT,
                           gates=(Gate("a", max_defer_s=300),))),
    }, cadence_scale=0.01)
    a, b = lanes.spec("a"), lanes.spec("b")
    assert a.cadence_s == pytest.approx(6.0)
    assert (a.retry_after_failure_s, a.retry_window_s) == pytest.approx((0.6, 1.2))
    assert b.gates[0].max_defer_s == pytest.approx(3.0)


@pytest.mark.parametrize(("after", "window"), [(900, None), (None, 3600), (0, 3600),
                                               (7200, 3600)])
def test_retry_options_must_fit(after: float | None, window: float | None) -> None:
    with pytest.raises(LaneDeclarationError, match=r"retry_after_failure_s.*Fix:"):
        build_lane_set({"x": FakeTask(Lane(cadence_s=60, retry_after_failure_s=after,
                                           retry_window_s=window))})
