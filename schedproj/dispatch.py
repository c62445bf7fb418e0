"""How a decision turns into beat-owned state changes. Pure: takes ``now`` and the task ids."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from schedproj.pipeline import LEASE_WAITS, Decision
from schedproj.state import Deferral, LaneState, SchedRecord


@dataclass(frozen=True)
class Send:
    """One message to send for a decision."""

    lane: str
    task_id: str
    deadline: float




def same_wait(old: Deferral | None, new: Deferral) -> bool:
    """A heavy lane's reason flips between lost-the-pick and lease-held on every hand-off to
    the same blocker; rewriting (and re-logging) every waiting lane each time would make a
    tick's writes grow with the lane count for no new information."""
    return (old is not None and old.blocker == new.blocker and old.since == new.since
            and old.reason in LEASE_WAITS and new.reason in LEASE_WAITS)


def sched_changes(
    decision: Decision,
    states: Mapping[str, LaneState],
    sends: Mapping[str, Send],
    now: float,
) -> tuple[dict[str, SchedRecord], list[Deferral]]:
    """The beat-owned records that change, and the deferrals that are new or changed (to log
    once per streak, not every tick)."""
    empty = SchedRecord()
    changes: dict[str, SchedRecord] = {}
    news: list[Deferral] = []
    deferred = {d.lane: d for d in decision.deferred}

    for lane in decision.views:
        old = states[lane].sched if lane in states else empty
        if lane in sends:
            send = sends[lane]
            changes[lane] = replace(old, inflight_task_id=send.task_id,
                                    inflight_deadline=send.deadline, last_dispatch_at=now,
                                    dispatches=old.dispatches + 1, deferral=None)
        elif lane in deferred:
            new = deferred[lane]
            if same_wait(old.deferral, new):
                continue
            if old.deferral != new:
                changes[lane] = replace(old, deferral=new)
                if (old.deferral is None or old.deferral.reason != new.reason
                        or old.deferral.blocker != new.blocker):
                    news.append(new)
        elif old.deferral is not None:
            changes[lane] = replace(old, deferral=None)
    # Lanes outside this decision (paused, disabled by the profile) are not deferred now: end
    # their streaks, so a lane resumed later does not inherit a stale start.
    for lane, state in states.items():
        if lane not in decision.views and state.sched.deferral is not None:
            changes[lane] = replace(state.sched, deferral=None)
    return changes, news
