"""Which runs are lost, and what to record for them. Pure.

A run is lost when it started and its keep-alive lapsed with no end recorded: a heavy run's
lease is gone (or names another run), a light run's in-flight mark is one grace past its end.
A heavy run can also vanish before its start mark landed: beat saw its lease started on an
earlier tick, the lease is gone now, and the record neither says it ended nor that it runs
(its worker died between the lease's start and the record's; a failover can hold that write
back for a second).

Beat reads the state, asks these functions, and writes what they return (compare and set on
the raw record it read); the records themselves come from :func:`lifecycle.lost`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from schedproj.core import lifecycle
from schedproj.core.records import LeaseView, RunRecord


@dataclass(frozen=True)
class LostRun:
    """A run to record lost: ``record`` is the lane's run record once the loss is written."""

    lane: str
    task_id: str
    #: The lease fence of a heavy run (0 for a light one), for the journal.
    fence: int
    heavy: bool
    why: str
    record: RunRecord
    #: An operator cleared it (``schedproj clear-lease``): not a loss nobody intended.
    cleared: bool = False


#: What ``schedproj clear-lease`` did to a run, by the action of its request.
CLEARED_HOW = {"clear": "its lease cleared once its worker said it no longer ran it",
               "terminate": "its process terminated with --terminate"}


def cleared(lost: LostRun, *, action: str, task_id: str) -> LostRun:
    """``lost`` as recorded when an operator's request (``action`` on run ``task_id``) names
    it: reason ``cleared: by an operator (...)`` instead of ``lost: ...``. Unchanged when the
    request is about another run or asked only for a yield (a yielding run records its own
    end)."""
    how = CLEARED_HOW.get(action)
    if how is None or not lost.heavy or task_id != lost.task_id:
        return lost
    why = f"by an operator (schedproj clear-lease: {how})"
    return replace(lost, why=why, cleared=True,
                   record=replace(lost.record, last_reason=f"{lifecycle.CLEARED}: {why}"))


def explain(why: str, started_at: float | None, put_back_at: float | None) -> str:
    """``why``, plus a warning when the run started before beat put back records after a state
    loss: beat cannot tell a run killed around the loss from one whose end was lost with it."""
    if put_back_at is not None and started_at is not None and started_at < put_back_at:
        return f"{why}; Redis lost state while it ran, so its end may have been lost too"
    return why


def has_lapsed(run: RunRecord, *, heavy: bool, lease: LeaseView | None, now: float,
               grace_s: float) -> bool:
    """Does ``run`` name a started run whose lease (heavy) or in-flight mark (light, with
    ``grace_s`` for clock skew) lapsed with no end recorded?"""
    if not lifecycle.is_running(run):
        return False
    if heavy:
        return lease is None or lease.task_id != run.running_task_id
    return run.running_until is not None and now >= run.running_until + grace_s


def slot_leases_by_task(slots: Mapping[str, Sequence[LeaseView | None]],
                        ) -> dict[str, LeaseView]:
    """Each pool's slot leases (None: free) by the task id of the run they name. A run is
    judged on every slot of its pool: it is alive while any of them names it (a run holding k
    slots releases them one by one as it ends, the last with its record); the run no slot
    names lapsed (:func:`has_lapsed` judges it)."""
    out: dict[str, LeaseView] = {}
    for leases in slots.values():
        for lease in leases:
            if lease is not None and lease.task_id:
                out.setdefault(lease.task_id, lease)
    return out


def same_run(judged: RunRecord, stored: RunRecord) -> bool:
    """Does the record read now still name the running run judged on an older copy? (If not,
    it ended or a newer run marked it since: that run is not lost.)"""
    return stored.running_task_id == judged.running_task_id and lifecycle.is_running(stored)


def lapsed_run(lane: str, run: RunRecord, *, heavy: bool, now: float,
               put_back_at: float | None) -> LostRun:
    """What to record for the lapsed run ``run`` names (see :func:`has_lapsed`)."""
    assert run.running_task_id is not None
    why = explain("its lease lapsed" if heavy else "its in-flight mark lapsed",
                  run.running_since, put_back_at)
    return LostRun(lane=lane, task_id=run.running_task_id, fence=run.fence if heavy else 0,
                   heavy=heavy, why=why, record=lifecycle.lost(run, now=now, why=why))


def follow_lease(seen: LeaseView | None,
                 lease: LeaseView | None) -> tuple[LeaseView | None, LeaseView | None]:
    """Beat's view of started heavy leases across ticks: ``seen`` is the started lease it
    remembered, ``lease`` the one read now. Returns the lease to remember, and the run whose
    lease went since (its lease is gone or names another run), if any."""
    remember = seen
    if lease is not None and lease.started_at is not None and lease.task_id:
        remember = lease
    elif lease is None or seen is None or lease.task_id != seen.task_id:
        remember = None
    if seen is None or not seen.task_id or (lease is not None
                                             and lease.task_id == seen.task_id):
        return remember, None
    return remember, seen


def vanished_run(gone: LeaseView, record: RunRecord, *, now: float,
                 put_back_at: float | None) -> LostRun | None:
    """What to record for the run of lease ``gone`` (see :func:`follow_lease`) given its
    lane's run record now; None when nothing was lost: it ended or was refused, a newer run
    wrote the record since, or a run's mark is there (then :func:`has_lapsed` judges it)."""
    assert gone.task_id
    if gone.task_id in (record.last_task_id, record.skipped_task_id):
        return None
    if record.fence > gone.fence or lifecycle.is_running(record):
        return None
    why = explain("its lease lapsed before its start was recorded", gone.started_at,
                  put_back_at)
    return LostRun(lane=gone.lane, task_id=gone.task_id, fence=gone.fence, heavy=True, why=why,
                   record=lifecycle.lost(record, now=now, why=why, task_id=gone.task_id))


__all__ = ["CLEARED_HOW", "LostRun", "cleared", "explain", "follow_lease", "has_lapsed",
           "lapsed_run", "same_run", "slot_leases_by_task", "vanished_run"]
