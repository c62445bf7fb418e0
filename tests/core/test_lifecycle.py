"""A run's lifecycle as record transitions (``core.lifecycle``): what a start and an end write,
how a failing streak is counted (so a lane that keeps failing is retried only inside its
``retry_window_s``, and that retry is what the due index files), how a lost run is recorded,
and what is put back after Redis lost a lane's record.

Pure: the transitions, then the retry they lead to as ``decide`` and ``next_look`` see it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from schedproj.core.dueindex import next_look
from schedproj.core.lanes import LaneKind, LaneSpec, fixed_unit
from schedproj.core.lifecycle import (
    ESTIMATED_AFTER_LOSS,
    finished,
    is_running,
    lost,
    rebuilt,
    started,
)
from schedproj.core.pipeline import decide
from schedproj.core.records import LaneState, Outcome, RunRecord

T0 = 1_000_000.0
MIN, HOUR, DAY = 60.0, 3600.0, 86400.0
FAILED, LOST, DONE = Outcome.FAILED, Outcome.LOST, Outcome.COMPLETED


def end(before: RunRecord, outcome: Outcome, at: float, task_id: str = "t",
        backlog: int = 0, fence: int = 0) -> RunRecord:
    return finished(before, task_id=task_id, outcome=outcome, reason=str(outcome),
                    backlog=backlog, now=at, fence=fence)


# -- start and end -----------------------------------------------------------------------------


def test_a_start_marks_the_run_and_raises_the_fence_never_lowers_it() -> None:
    before = RunRecord(last_run_at=T0 - HOUR, last_task_id="old", runs=3, fence=5)
    run = started(before, task_id="new", now=T0, running_until=T0 + 30, fence=7)
    assert (run.running_task_id, run.running_since, run.running_until, run.fence) == (
        "new", T0, T0 + 30, 7)
    assert (run.last_run_at, run.last_task_id, run.runs) == (T0 - HOUR, "old", 3)
    assert is_running(run) and not is_running(before)
    assert started(before, task_id="light", now=T0, running_until=T0 + 30).fence == 5
    assert started(RunRecord(), task_id="light", now=T0, running_until=T0 + 30).fence == 0
    assert started(before, task_id="stale", now=T0, running_until=T0 + 30, fence=2).fence == 5


def test_an_end_records_the_outcome_and_counts_the_run() -> None:
    run = started(RunRecord(runs=2, failures=1, fence=4), task_id="r", now=T0,
                  running_until=T0 + 30, fence=4)
    done = finished(run, task_id="r", outcome=Outcome.YIELDED, reason="hold-cap", backlog=12,
                    now=T0 + 20, fence=4)
    assert done == RunRecord(last_run_at=T0 + 20, last_outcome=Outcome.YIELDED,
                             last_reason="hold-cap", last_task_id="r", backlog=12, runs=3,
                             failures=1, fence=4)
    assert not is_running(done)
    # A run without a fence of its own (a light lane) keeps the record's.
    assert end(RunRecord(fence=9), DONE, T0).fence == 9
    assert end(RunRecord(fence=9), DONE, T0, fence=11).fence == 11


def test_is_running_means_started_and_not_ended() -> None:
    assert not is_running(RunRecord())
    assert is_running(RunRecord(running_task_id="a"))
    assert is_running(RunRecord(running_task_id="b", last_task_id="a"))
    assert not is_running(RunRecord(running_task_id="a", last_task_id="a"))


# -- the failing streak ------------------------------------------------------------------------


def test_a_failing_streak_starts_at_the_first_failure_and_any_other_end_closes_it() -> None:
    first = end(RunRecord(), FAILED, T0)
    assert (first.failing_since, first.failures, first.runs) == (T0, 1, 1)
    again = end(first, LOST, T0 + 900)
    assert (again.failing_since, again.failures, again.runs) == (T0, 2, 2)
    third = end(again, FAILED, T0 + 1800)
    assert (third.failing_since, third.failures) == (T0, 3)
    for outcome in (DONE, Outcome.YIELDED, Outcome.SKIPPED):
        closed = end(third, outcome, T0 + 2700)
        assert (closed.failing_since, closed.failures, closed.runs) == (None, 3, 4)
        assert end(closed, FAILED, T0 + 3600).failing_since == T0 + 3600


def test_a_lost_run_is_a_failure_that_keeps_the_backlog_and_says_why() -> None:
    run = started(RunRecord(backlog=40, last_task_id="a", failures=2, runs=5), task_id="b",
                  now=T0, running_until=T0 + 30, fence=3)
    record = lost(run, now=T0 + 100, why="lease lapsed")
    assert record == RunRecord(last_run_at=T0 + 100, last_outcome=LOST,
                               last_reason="lost: lease lapsed", last_task_id="b",
                               backlog=40, runs=6, failures=3, fence=3,
                               failing_since=T0 + 100)
    assert not is_running(record)


def test_a_run_named_only_by_its_lease_is_recorded_lost_under_that_id() -> None:
    """A heavy run whose lease lapsed before its start was recorded is recorded lost under
    the task id the lease named, not under the record's older run."""
    before = RunRecord(last_run_at=T0 - HOUR, last_task_id="a", running_task_id="a")
    record = lost(before, now=T0, why="never started", task_id="b")
    assert (record.last_task_id, record.last_outcome, record.failing_since) == ("b", LOST, T0)
    assert lost(replace(before, running_task_id="c"), now=T0, why="x").last_task_id == "c"


BACKUP = LaneSpec(name="backup", task_name="backup", kind=LaneKind.HEAVY, cadence_s=DAY,
                  priority0=True, retry_after_failure_s=15 * MIN, retry_window_s=HOUR)


def due(record: RunRecord, now: float) -> bool:
    return decide([BACKUP], {"backup": LaneState(run=record)}, None, now).winner == "backup"


def look(record: RunRecord, now: float) -> float:
    return next_look(BACKUP, LaneState(run=record), now)


def test_a_lane_that_keeps_failing_is_retried_only_inside_its_window() -> None:
    """Backup fails at T0 and at every retry: retried 15 min after each failure while the
    streak (from T0) is at most an hour old, then back to its daily cadence."""
    record = end(RunRecord(last_run_at=T0 - DAY), FAILED, T0)
    retries, last = [], T0
    for _ in range(6):
        at = look(record, last)
        if at >= last + DAY:
            break
        assert not due(record, at - 1) and due(record, at)
        retries.append(at - T0)
        record, last = end(record, FAILED, at), at
    assert retries == [15 * MIN, 30 * MIN, 45 * MIN, 60 * MIN]
    # The window is over: no retry; the next look is the cadence's.
    assert record.last_run_at == last == T0 + HOUR and record.failing_since == T0
    assert look(record, last) == last + DAY
    assert not due(record, last + 15 * MIN) and not due(record, last + DAY - 1)
    assert due(record, last + DAY)


def test_a_success_ends_the_streak_so_the_next_failure_gets_a_fresh_window() -> None:
    record = end(end(end(RunRecord(), FAILED, T0), FAILED, T0 + 15 * MIN), DONE, T0 + HOUR)
    record = end(record, FAILED, T0 + 2 * HOUR)
    assert look(record, T0 + 2 * HOUR) == T0 + 2 * HOUR + 15 * MIN
    assert due(record, T0 + 2 * HOUR + 15 * MIN)


def test_a_lost_run_is_retried_like_a_failed_one() -> None:
    run = started(RunRecord(last_run_at=T0 - DAY, last_task_id="a"), task_id="b", now=T0,
                  running_until=T0 + 30)
    record = lost(run, now=T0 + 60, why="worker died")
    assert look(record, T0 + 60) == T0 + 60 + 15 * MIN
    assert not due(record, T0 + 60 + 15 * MIN - 1) and due(record, T0 + 60 + 15 * MIN)


def test_a_lane_without_a_retry_policy_waits_its_cadence_after_a_failure() -> None:
    plain = LaneSpec(name="backup", task_name="backup", kind=LaneKind.HEAVY, cadence_s=DAY)
    record = end(RunRecord(), FAILED, T0)
    assert next_look(plain, LaneState(run=record), T0) == T0 + DAY


# -- put back after Redis lost state -----------------------------------------------------------


def test_a_remembered_record_is_put_back_as_it_was() -> None:
    remembered = started(RunRecord(last_run_at=T0 - 5), task_id="r", now=T0,
                         running_until=T0 + 30, fence=2)
    assert rebuilt(remembered, lane="x", cadence_s=600, lost_at=T0 + 1) is remembered


@pytest.mark.parametrize(("lane", "cadence", "ratio"), [
    ("summary", 600.0, 1.0), ("dream", HOUR, 1.0), ("repo[acme]", 1800.0, 1.15),
    ("repo[zeta]", 1800.0, 0.85)])
def test_a_forgotten_lane_is_estimated_to_have_run_within_one_interval_before_the_loss(
        lane: str, cadence: float, ratio: float) -> None:
    record = rebuilt(None, lane=lane, cadence_s=cadence, lost_at=T0, due_ratio=ratio)
    last = record.last_run_at
    assert last == pytest.approx(T0 - fixed_unit(lane) * cadence * ratio)
    assert last is not None and T0 - cadence * ratio < last <= T0
    assert record.last_reason == ESTIMATED_AFTER_LOSS
    assert record == RunRecord(last_run_at=record.last_run_at,
                               last_reason=ESTIMATED_AFTER_LOSS)
    # The same lane gets the same estimate on every beat (fixed per name).
    assert rebuilt(None, lane=lane, cadence_s=cadence, lost_at=T0, due_ratio=ratio) == record


def test_a_forgotten_lane_without_a_due_ratio_is_estimated_within_one_cadence() -> None:
    record = rebuilt(None, lane="dream", cadence_s=HOUR, lost_at=T0)
    assert record.last_run_at == pytest.approx(T0 - fixed_unit("dream") * HOUR)
