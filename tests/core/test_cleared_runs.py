"""A heavy run an operator cleared (``schedproj clear-lease``) is recorded ``cleared``, not
``lost`` (issue 19: 1). Pure: core.lostruns."""

from __future__ import annotations

import pytest

from schedproj.core import lifecycle
from schedproj.core.lostruns import cleared, lapsed_run, vanished_run
from schedproj.core.records import LeaseView, Outcome, RunRecord

NOW = 1_000_000.0


def running(task_id: str = "T1") -> RunRecord:
    before = RunRecord(last_run_at=NOW - 600, last_task_id="T0", runs=3, backlog=7, fence=4)
    return lifecycle.started(before, task_id=task_id, now=NOW - 60, running_until=NOW + 5,
                             fence=4)


@pytest.mark.parametrize("action", ["clear", "terminate"])
def test_a_run_the_operator_cleared_is_recorded_cleared(action: str) -> None:
    lost = lapsed_run("L", running(), heavy=True, now=NOW, put_back_at=None)
    judged = cleared(lost, action=action, task_id="T1")
    assert judged.cleared and judged.record.last_reason is not None
    assert judged.record.last_reason.startswith("cleared: by an operator")
    assert not judged.record.last_reason.startswith("lost")
    # Otherwise the same end: the work did not finish, its backlog is kept.
    assert judged.record.last_outcome is Outcome.LOST and judged.record.backlog == 7
    assert judged.record.last_task_id == "T1"


def test_a_vanished_run_the_operator_cleared_is_recorded_cleared() -> None:
    gone = LeaseView(lane="L", token="tok", fence=4, granted_at=NOW - 70, started_at=NOW - 60,
                     task_id="T1")
    lost = vanished_run(gone, RunRecord(last_run_at=NOW - 600, fence=3), now=NOW,
                        put_back_at=None)
    assert lost is not None
    assert cleared(lost, action="terminate", task_id="T1").cleared


@pytest.mark.parametrize(("action", "task_id", "heavy"), [
    ("clear", "T2", True),  # another run's clear
    ("stop", "T1", True),  # a stop: the run records its own yield
    ("nonsense", "T1", True),
    ("clear", "T1", False),  # light runs hold no lease to clear
])
def test_anything_else_is_still_lost(action: str, task_id: str, heavy: bool) -> None:
    lost = lapsed_run("L", running(), heavy=heavy, now=NOW, put_back_at=None)
    judged = cleared(lost, action=action, task_id=task_id)
    assert judged == lost and not judged.cleared
