"""A run's lifecycle as record transitions: what a lane's run record becomes when a run
starts and when it ends. Pure.

``LaneTask`` writes these records to Redis (the end atomically with the lease release, in
``run_finish.lua``); the simulator applies the same transitions in virtual time.
"""

from __future__ import annotations

import math

from schedproj.core.frozen import evolve
from schedproj.core.lanes import fixed_unit
from schedproj.core.records import Outcome, RunRecord
from schedproj.core.schedules import FireTimes


def started(before: RunRecord, *, task_id: str, now: float, running_until: float,
            fence: int = 0) -> RunRecord:
    """The record once run ``task_id`` started at ``now``; it counts as running until
    ``running_until`` unless refreshed. A fenced (heavy) run raises the record's fence."""
    # (evolve: dataclasses.replace without its cost, core.frozen; a run's start and end are
    # the simulator's every run.)
    return evolve(before, running_task_id=task_id, running_since=now,
                  running_until=running_until,
                  fence=before.fence if before.fence >= fence else fence)


def finished(before: RunRecord, *, task_id: str, outcome: Outcome, reason: str | None,
             backlog: int, now: float, fence: int = 0) -> RunRecord:
    """The record once run ``task_id`` ended at ``now`` with ``outcome``, leaving ``backlog``.

    A failure starts (or continues) the failing streak that the retry window counts from; any
    other outcome ends it. A run without a fence of its own (a light lane) keeps the record's,
    so a lane that was ever fenced can still record its outcomes.
    """
    failed = outcome in (Outcome.FAILED, Outcome.LOST)
    # A new record (the fields not named keep their defaults), built as RunRecord(...) would.
    return evolve(
        _NEW_RUN, last_run_at=now, last_outcome=outcome, last_reason=reason,
        failing_since=(before.failing_since or now) if failed else None,
        last_task_id=task_id, backlog=backlog, runs=before.runs + 1,
        failures=before.failures + failed, fence=fence or before.fence,
    )


#: A run record of defaults: what :func:`finished` builds from.
_NEW_RUN = RunRecord()


def lost(before: RunRecord, *, now: float, why: str, task_id: str | None = None) -> RunRecord:
    """The record once run ``task_id`` (default: the running run the record names) is known
    lost at ``now`` (its lease or in-flight mark lapsed with no end recorded). It counts as a
    failure (so a retry policy applies) and keeps the backlog last reported: the work is still
    there."""
    run = task_id or before.running_task_id
    assert run is not None
    return finished(before, task_id=run, outcome=Outcome.LOST, reason=f"lost: {why}",
                    backlog=before.backlog, now=now)


#: The reason prefix of a run an operator cleared (``schedproj clear-lease``); it is recorded
#: like a lost run otherwise (outcome ``lost``: the work did not finish, so a retry applies).
CLEARED = "cleared"


def is_running(before: RunRecord) -> bool:
    """Does the record name a run that started and has not ended?"""
    return (before.running_task_id is not None
            and before.running_task_id != before.last_task_id)


#: The reason a run record put back after Redis lost state carries when nothing was known.
ESTIMATED_AFTER_LOSS = "estimated: Redis lost this lane's state"


def rebuilt(remembered: RunRecord | None, *, lane: str, cadence_s: float,
            lost_at: float, due_ratio: float = 1.0,
            calendar: FireTimes | None = None) -> RunRecord:
    """The run record to put back for a lane whose record Redis lost at ``lost_at``.

    What the active beat remembered of it (a due lane) is put back as it was, running mark
    included: a run still alive refreshes it, a dead one is recorded lost. Otherwise the lane
    was not due when beat last looked, so it last ran less than one due interval (``cadence
    * due_ratio``) before the loss: its last run is estimated at ``lost_at - u * interval``
    for the lane's fixed ``u`` in [0, 1). So it falls due within one interval of the loss
    (lanes spread over it, not all at once) and runs early by less than one interval (it may
    have run just before the loss), never by more.

    A calendar lane not due when beat last looked had run for its latest fire time: its last
    run is put back at that fire time, so it runs at its next one — never twice for one fire
    time (promise 12) — or at once if it never had a fire time."""
    if remembered is not None:
        return remembered
    if calendar is not None:
        fire = calendar.previous_fire(lost_at)
        return RunRecord(last_run_at=fire if math.isfinite(fire) else None,
                         last_reason=ESTIMATED_AFTER_LOSS)
    return RunRecord(last_run_at=lost_at - fixed_unit(lane) * cadence_s * due_ratio,
                     last_reason=ESTIMATED_AFTER_LOSS)


__all__ = ["CLEARED", "ESTIMATED_AFTER_LOSS", "finished", "is_running", "lost", "rebuilt",
           "started"]
