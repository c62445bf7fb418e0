"""Deferral rules, in one place: what a deferral records, how a streak continues from one tick
to the next (its start never slides), how a gate's own clock runs inside a streak (for its
``max_defer_s``), and which changes are worth writing. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from schedproj.core.frozen import is_plain
from schedproj.core.lanes import DeferralReason

#: Reasons that mean "waiting for the heavy lease" (held, or another heavy lane won the pick),
#: as opposed to a gate's reason.
LEASE_WAITS = frozenset({DeferralReason.LEASE_HELD, DeferralReason.BACKPRESSURE})


@dataclass(frozen=True)
class Deferral:
    """A lane deferred by a gate or by the lease. ``since`` marks the streak start and never
    slides while the lane stays deferred; ``blocker_since`` is when the current blocker took
    over within the streak (None: from the start)."""

    lane: str
    reason: DeferralReason
    blocker: str | None
    since: float
    blocker_since: float | None = None
    #: The gate blocker whose clock ``blocker_since`` is, when a lease wait interrupts a gate
    #: deferral (the wait must not restart the gate's clock). None: ``blocker`` itself.
    gate_blocker: str | None = None

    @property
    def behind_blocker_since(self) -> float:
        """How long the current blocker has deferred the lane counts from here."""
        return self.since if self.blocker_since is None else self.blocker_since

    @property
    def gate_owner(self) -> str | None:
        """The gate blocker whose clock this deferral carries, if any."""
        if self.gate_blocker is not None:
            return self.gate_blocker
        return None if self.reason in LEASE_WAITS else self.blocker

    def gate_clock(self, blocker: str) -> float | None:
        """Since when the gate on ``blocker`` has been deferring this lane, if it is."""
        return self.behind_blocker_since if self.gate_owner == blocker else None


_new = object.__new__
assert is_plain(Deferral)  # new_deferral below fills what Deferral's __init__ would


def new_deferral(lane: str, reason: DeferralReason, blocker: str | None, since: float,
                 blocker_since: float | None = None, gate_blocker: str | None = None
                 ) -> Deferral:
    """``Deferral(...)`` without the frozen dataclass ``__init__`` (a tick builds one per
    waiting lane: see ``core.frozen``), its fields in their order (``records.encode``)."""
    deferral = _new(Deferral)
    d = deferral.__dict__
    d["lane"] = lane
    d["reason"] = reason
    d["blocker"] = blocker
    d["since"] = since
    d["blocker_since"] = blocker_since
    d["gate_blocker"] = gate_blocker
    return deferral


def continue_streak(previous: Deferral | None, lane: str, reason: DeferralReason,
                    blocker: str | None, now: float) -> Deferral:
    """This tick's deferral of ``lane``, continuing ``previous`` (its streak start never
    slides). Within the streak a gate's clock (for its max_defer_s) runs while that gate's
    blocker defers the lane; waiting for the lease in between neither stops nor restarts it,
    or a busy lease would keep a gated lane waiting forever."""
    if previous is None:
        return new_deferral(lane, reason, blocker, now)
    if reason in LEASE_WAITS:
        owner = previous.gate_owner
        return new_deferral(lane, reason, blocker, previous.since,
                            previous.blocker_since if owner is not None else None, owner)
    clock = previous.gate_clock(blocker) if blocker is not None else None
    if clock is None:
        clock = now
    return new_deferral(lane, reason, blocker, previous.since,
                        None if clock == previous.since else clock)


def same_wait(old: Deferral | None, new: Deferral) -> bool:
    """A heavy lane waiting for the lease waits on, whichever lane holds it: its reason flips
    between lost-the-pick and lease-held, and the holder changes, on every hand-off.
    Rewriting (and re-logging) every waiting lane each time would make a tick's writes grow
    with the lane count for no new information; the record keeps the streak's start and the
    blocker it began behind (status shows the current holder from the lease)."""
    return (old is not None and old.since == new.since
            and old.reason in LEASE_WAITS and new.reason in LEASE_WAITS
            and old.gate_owner == new.gate_owner
            and old.behind_blocker_since == new.behind_blocker_since)
