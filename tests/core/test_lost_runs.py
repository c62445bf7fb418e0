"""Which runs beat records lost, and what it records (core.lostruns, pure)."""

from __future__ import annotations

import pytest

from schedproj.core import lifecycle
from schedproj.core.lostruns import (
    explain,
    follow_lease,
    has_lapsed,
    lapsed_run,
    same_run,
    slot_leases_by_task,
    vanished_run,
)
from schedproj.core.records import LeaseView, Outcome, RunRecord

NOW = 1_000_000.0
GRACE = 10.0


def running(task_id: str = "T1", *, until: float = NOW + 5, fence: int = 4,
            since: float = NOW - 60) -> RunRecord:
    before = RunRecord(last_run_at=NOW - 600, last_task_id="T0", runs=3, backlog=7, fence=fence)
    return lifecycle.started(before, task_id=task_id, now=since, running_until=until,
                             fence=fence)


def lease(task_id: str | None = "T1", *, started: bool = True, fence: int = 4) -> LeaseView:
    return LeaseView(lane="heavy", token="tok", fence=fence, granted_at=NOW - 70,
                     started_at=NOW - 60 if started else None, task_id=task_id)


# -- has_lapsed --------------------------------------------------------------------------------

def test_a_heavy_run_lapses_when_its_lease_is_gone_or_names_another_run() -> None:
    run = running()
    assert not has_lapsed(run, heavy=True, lease=lease("T1"), now=NOW, grace_s=GRACE)
    assert has_lapsed(run, heavy=True, lease=None, now=NOW, grace_s=GRACE)
    assert has_lapsed(run, heavy=True, lease=lease("T2"), now=NOW, grace_s=GRACE)


def test_a_light_run_lapses_one_grace_past_its_mark() -> None:
    run = running(until=NOW)
    assert not has_lapsed(run, heavy=False, lease=None, now=NOW + GRACE - 0.001,
                          grace_s=GRACE)
    assert has_lapsed(run, heavy=False, lease=None, now=NOW + GRACE, grace_s=GRACE)
    no_mark = RunRecord(running_task_id="T1")
    assert not has_lapsed(no_mark, heavy=False, lease=None, now=NOW + 1e6, grace_s=GRACE)


def test_a_run_that_ended_never_lapses() -> None:
    ended = lifecycle.finished(running(), task_id="T1", outcome=Outcome.COMPLETED,
                               reason=None, backlog=0, now=NOW)
    assert not has_lapsed(ended, heavy=True, lease=None, now=NOW, grace_s=GRACE)
    assert not has_lapsed(ended, heavy=False, lease=None, now=NOW + 1e6, grace_s=GRACE)


# -- what is recorded ---------------------------------------------------------------------------

@pytest.mark.parametrize("heavy", [True, False])
def test_a_lapsed_run_is_recorded_lost_through_the_lifecycle(heavy: bool) -> None:
    run = running()
    lost = lapsed_run("L", run, heavy=heavy, now=NOW, put_back_at=None)
    why = "its lease lapsed" if heavy else "its in-flight mark lapsed"
    assert lost.why == why and lost.task_id == "T1" and lost.heavy is heavy
    assert lost.fence == (4 if heavy else 0)
    assert lost.record == lifecycle.lost(run, now=NOW, why=why)
    assert lost.record.last_outcome is Outcome.LOST and lost.record.last_task_id == "T1"
    assert lost.record.backlog == 7 and lost.record.failing_since == NOW


def test_a_run_started_before_a_put_back_may_have_lost_its_end_too() -> None:
    assert explain("x", NOW - 10, NOW - 5).startswith("x; Redis lost state while it ran")
    assert explain("x", NOW - 1, NOW - 5) == "x"
    assert explain("x", NOW - 10, None) == "x"
    lost = lapsed_run("L", running(since=NOW - 60), heavy=True, now=NOW,
                      put_back_at=NOW - 30)
    assert "Redis lost state while it ran" in lost.why
    assert lost.record.last_reason == f"lost: {lost.why}"


def test_a_stored_record_names_the_same_run_only_while_that_run_is_running() -> None:
    judged = running("T1")
    assert same_run(judged, running("T1"))
    assert not same_run(judged, running("T2"))
    ended = lifecycle.finished(judged, task_id="T1", outcome=Outcome.COMPLETED, reason=None,
                               backlog=0, now=NOW)
    assert not same_run(judged, ended)


# -- a run that vanished before its start mark landed -------------------------------------------

def test_beat_remembers_a_started_lease_and_notices_when_it_goes() -> None:
    seen, gone = follow_lease(None, lease("T1"))
    assert seen == lease("T1") and gone is None
    same, gone = follow_lease(seen, lease("T1"))
    assert same == seen and gone is None
    after, gone = follow_lease(seen, None)
    assert after is None and gone == seen
    replaced, gone = follow_lease(seen, lease("T2"))
    assert replaced == lease("T2") and gone == seen
    # A granted lease not started yet: the started one it replaced is gone, nothing kept.
    granted, gone = follow_lease(seen, lease("T2", started=False))
    assert granted is None and gone == seen
    # The same run's lease seen not started (a re-grant view): kept as it was.
    kept, gone = follow_lease(seen, lease("T1", started=False))
    assert kept == seen and gone is None
    assert follow_lease(None, lease("T1", started=False)) == (None, None)
    assert follow_lease(lease(None), None) == (None, None)


def test_a_vanished_run_with_no_start_mark_is_recorded_lost() -> None:
    record = RunRecord(last_run_at=NOW - 600, last_task_id="T0", backlog=3, fence=2)
    lost = vanished_run(lease("T1"), record, now=NOW, put_back_at=None)
    assert lost is not None
    assert (lost.lane, lost.task_id, lost.fence, lost.heavy) == ("heavy", "T1", 4, True)
    assert lost.why == "its lease lapsed before its start was recorded"
    assert lost.record == lifecycle.lost(record, now=NOW, why=lost.why, task_id="T1")
    assert lost.record.last_task_id == "T1" and lost.record.backlog == 3
    assert lost.record.last_outcome is Outcome.LOST


@pytest.mark.parametrize("record", [
    pytest.param(RunRecord(last_task_id="T1"), id="it-ended"),
    pytest.param(RunRecord(skipped_task_id="T1"), id="it-was-refused"),
    pytest.param(RunRecord(last_task_id="T9", fence=5), id="a-newer-run-wrote-since"),
    pytest.param(RunRecord(running_task_id="T1", fence=4), id="its-mark-landed"),
])
def test_a_vanished_run_is_not_lost_when_the_record_accounts_for_it(record: RunRecord) -> None:
    assert vanished_run(lease("T1"), record, now=NOW, put_back_at=None) is None


def test_a_pool_run_is_alive_while_any_slot_of_its_pool_names_it() -> None:
    """A run holding two slots, one of them released already (its end releases them one by
    one): alive; a run no slot names: lapsed; a free or unreadable slot names nobody."""
    two = lease("T1")
    other = lease("T2", fence=9)
    unreadable = LeaseView(lane="", token="", fence=0, granted_at=0.0)
    by_task = slot_leases_by_task({"gpu": [None, two], "db": [other, unreadable, None]})
    assert set(by_task) == {"T1", "T2"}
    assert not has_lapsed(running("T1"), heavy=True, lease=by_task.get("T1"), now=NOW,
                          grace_s=GRACE)
    assert has_lapsed(running("T3"), heavy=True, lease=by_task.get("T3"), now=NOW,
                      grace_s=GRACE)
