"""When a lane is due (``core.due``): the retry rule and the due-time rule, and that the time
``due_at`` names is exactly when the views start calling the lane due."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from schedproj.core.due import NEVER, due_at, retry_at
from schedproj.core.lanes import LaneKind, LaneSpec
from schedproj.core.pipeline import decide, seconds_until_next_due
from schedproj.core.records import LaneState, Outcome, RunRecord, SchedRecord
from schedproj.core.views import view_lane
from tests.core.test_picker_properties import PROPERTY

NOW = 1_000_000.0
BACKUP = LaneSpec(name="backup", task_name="t.backup", kind=LaneKind.HEAVY, cadence_s=86400.0,
                  retry_after_failure_s=900.0, retry_window_s=3600.0)


def failed(ended_ago: float, streak_ago: float | None = None,
           outcome: Outcome = Outcome.FAILED) -> LaneState:
    """A lane whose last run ended ``ended_ago`` before NOW with ``outcome``, its failing
    streak begun ``streak_ago`` before NOW."""
    return LaneState(run=RunRecord(
        last_run_at=NOW - ended_ago, last_outcome=outcome,
        failing_since=None if streak_ago is None else NOW - streak_ago))


# -- the retry rule ------------------------------------------------------------------------------

def test_a_failed_run_is_retried_its_retry_delay_after_it_ended() -> None:
    state = failed(ended_ago=100.0)
    assert retry_at(BACKUP, state, NOW) == NOW + 800.0
    assert due_at(BACKUP, state, NOW) == NOW + 800.0
    assert not view_lane(BACKUP, state, None, NOW).due
    assert view_lane(BACKUP, state, None, NOW + 800.0).due


def test_a_lost_run_is_retried_like_a_failed_one() -> None:
    assert retry_at(BACKUP, failed(ended_ago=900.0, outcome=Outcome.LOST), NOW) == NOW


def test_no_retry_after_a_success_or_without_a_policy() -> None:
    assert retry_at(BACKUP, failed(ended_ago=900.0, outcome=Outcome.COMPLETED), NOW) == NEVER
    plain = LaneSpec(name="a", task_name="t.a", kind=LaneKind.HEAVY, cadence_s=86400.0)
    assert retry_at(plain, failed(ended_ago=900.0), NOW) == NEVER
    assert retry_at(BACKUP, LaneState(), NOW) == NEVER


def test_the_retry_must_fall_inside_the_window_counted_from_the_streak_start() -> None:
    # Streak began 2,700 s ago, last failure ended now: the retry at +900 is exactly at the
    # window's end (3,600 s): still retried. One second later in the streak: not.
    assert retry_at(BACKUP, failed(ended_ago=0.0, streak_ago=2700.0), NOW) == NOW + 900.0
    assert retry_at(BACKUP, failed(ended_ago=0.0, streak_ago=2701.0), NOW) == NEVER
    # Without failing_since the streak starts at the last run.
    assert retry_at(BACKUP, failed(ended_ago=0.0), NOW) == NOW + 900.0


def test_a_retry_not_taken_before_its_window_closed_is_no_longer_due() -> None:
    # Retry fell due at NOW - 300 while the lease was busy; the window closes at NOW + 100.
    state = failed(ended_ago=1200.0, streak_ago=3500.0)
    assert retry_at(BACKUP, state, NOW) == NOW - 300.0
    assert view_lane(BACKUP, state, None, NOW).due
    later = NOW + 101.0
    assert retry_at(BACKUP, state, later) == NEVER
    assert not view_lane(BACKUP, state, None, later).due
    # The lane then waits for its cadence: the due time says so, not a past retry.
    assert due_at(BACKUP, state, later) == NOW - 1200.0 + 86400.0


def test_the_beat_sleep_wakes_for_a_retry_before_the_cadence() -> None:
    states = {"backup": failed(ended_ago=100.0)}
    views = decide([BACKUP], states, None, NOW).views
    assert seconds_until_next_due(views, states, NOW) == 800.0


# -- the due-time rule agrees with the views -----------------------------------------------------

KIND = st.sampled_from(tuple(LaneKind))
CADENCE = st.sampled_from((1.0, 60.0, 600.0, 3600.0, 86400.0))
DUE_RATIO = st.sampled_from((1.0, 0.8, 1.2))
RETRY = st.sampled_from(((None, None), (60.0, 300.0), (900.0, 3600.0)))
OUTCOME = st.sampled_from((Outcome.COMPLETED, Outcome.FAILED, Outcome.LOST, Outcome.YIELDED))
AGO = st.one_of(st.none(), st.integers(-120, 3 * 86400))
BACKLOG = st.sampled_from((0, 0, 1, 7, -1))
PROBE = st.sampled_from((None, None, 0, 3))


@st.composite
def lanes(draw: st.DrawFn) -> tuple[LaneSpec, LaneState, int | None]:
    after, window = draw(RETRY)
    spec = LaneSpec(name="x", task_name="t.x", kind=draw(KIND), cadence_s=draw(CADENCE),
                    backlog_driven=draw(st.booleans()), retry_after_failure_s=after,
                    retry_window_s=window, due_ratio=draw(DUE_RATIO),
                    family="f" if draw(st.booleans()) else None)
    ago, streak, dispatched, since = draw(AGO), draw(AGO), draw(AGO), draw(AGO)
    run = RunRecord(last_run_at=None if ago is None else NOW - ago,
                    last_outcome=draw(OUTCOME), backlog=draw(BACKLOG),
                    failing_since=None if streak is None else NOW - streak,
                    since=None if since is None or ago is not None else NOW - since)
    sched = SchedRecord(last_dispatch_at=None if dispatched is None else NOW - dispatched)
    return spec, LaneState(run=run, sched=sched), draw(PROBE)


@PROPERTY
@given(lanes())
def test_a_lane_is_due_exactly_when_its_due_time_has_come(
        lane: tuple[LaneSpec, LaneState, int | None]) -> None:
    spec, state, probe = lane
    at = due_at(spec, state, NOW, probe)
    due = view_lane(spec, state, None, NOW, probe).due
    # A microsecond either way: the views compare a ratio, the due time a time.
    if due:
        assert at <= NOW + 1e-6
    else:
        assert at > NOW - 1e-6


def test_a_backlog_driven_lane_never_run_is_due_by_what_its_due_check_reports() -> None:
    """Before its first run a backlog-driven lane is due unless its due-check reported no
    backlog: one item (the smallest backlog) is enough, none keeps it waiting, and without a
    due-check its first run measures it."""
    spec = LaneSpec(name="b", task_name="b", kind=LaneKind.HEAVY, cadence_s=600.0,
                    backlog_driven=True)
    never_run = LaneState()
    assert due_at(spec, never_run, 1000.0, backlog=1) <= 1000.0
    assert due_at(spec, never_run, 1000.0, backlog=0) == NEVER
    assert due_at(spec, never_run, 1000.0) <= 1000.0
