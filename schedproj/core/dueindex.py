"""The due index: when beat must next look at a lane, and what beat keeps between ticks so a
tick costs what changed, not how many lanes exist. Pure: no I/O, no clock.

Redis holds a sorted set ``lane -> next look`` (``Keys.due``), written atomically with every
record that moves it, and a set of lanes whose records changed (``Keys.changed``). Each tick
beat reads the lanes that changed and the lanes whose next look came since its last tick;
:class:`TickMemory` keeps the lanes that are due (their states) from one tick to the next and
says which of them the planner must see now.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from schedproj.core.deferrals import LEASE_WAITS
from schedproj.core.due import NEVER, due_at
from schedproj.core.lanes import LaneSpec
from schedproj.core.records import LaneState, LeaseView, SchedRecord
from schedproj.core.views import is_in_flight

#: How often the active beat rebuilds the due index and the changed set from the lane records
#: even when their stamps agree (seconds): bounds how long any damage the stamps cannot see
#: (a score moved by hand, a mark lost from a set restored in the same generation) lasts.
#: A deleted, emptied, wrong-typed or restored key is seen and healed at the next tick.
DERIVED_RECONCILE_S = 300.0


def next_look(spec: LaneSpec, state: LaneState, now: float, *, paused: bool = False,
              forced: bool = False, grace_s: float = 0.0) -> float:
    """When beat must look at the lane next: when it falls due (``core.due.due_at``), or, for
    a light lane in flight, when its in-flight mark (plus ``grace_s``, see
    ``views.is_in_flight``) or message expires (its end is a change anyway)."""
    if paused:
        return NEVER
    if forced:
        return 0.0
    if not spec.heavy and is_in_flight(state, now, grace_s):
        run, sched = state.run, state.sched
        mark = None if run.running_until is None else run.running_until + grace_s
        ends = [t for t in (mark, sched.inflight_deadline) if t is not None]
        return max(now, min(ends)) if ends else now
    return max(min(due_at(spec, state, now), NEVER), 0.0)


def waits_for_lease(state: LaneState) -> bool:
    """Is the lane's recorded deferral a wait for the heavy lease (whose streak start is
    already recorded and does not move while the same lease is held)?"""
    d = state.sched.deferral
    return d is not None and d.reason in LEASE_WAITS


@dataclass
class TickMemory:
    """What the active beat keeps between ticks: the lanes due (with their states and the
    score the index holds for them), the index position read so far, and the lease it saw.
    Due lanes are ``waiting`` (heavy, recorded as waiting for the lease: nothing to do for
    them while the same lease is held) or ``active`` (the rest: planned every tick).

    ``cursor`` None means nothing is known: the next read takes every due lane (a new or
    restarted beat, a beat that lost its lock, state loss)."""

    cursor: float | None = None
    states: dict[str, LaneState] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)
    active: set[str] = field(default_factory=set)
    waiting: set[str] = field(default_factory=set)
    lease_token: str | None = None

    @property
    def due(self) -> set[str]:
        return self.active | self.waiting

    def reset(self) -> None:
        self.cursor, self.lease_token = None, None
        for part in (self.states, self.scores, self.active, self.waiting):
            part.clear()

    def learn(self, states: Mapping[str, LaneState], scores: Mapping[str, float | None],
              errors: Collection[str]) -> set[str]:
        """Take in what this tick read. Returns the lanes gone from the index (removed)."""
        gone = {lane for lane, score in scores.items() if score is None}
        for lane in gone | set(errors):
            self.forget(lane)
        for lane, state in states.items():
            if lane not in gone:
                self.states[lane] = state
        for lane, score in scores.items():
            if score is not None:
                self.scores[lane] = score
        return gone

    def forget(self, lane: str) -> None:
        self.states.pop(lane, None)
        self.scores.pop(lane, None)
        self.active.discard(lane)
        self.waiting.discard(lane)

    def focus(self, looked: Iterable[str], lease: LeaseView | None,
              always: Collection[str]) -> tuple[set[str], int]:
        """(lanes the planner must see this tick, how many due lanes it skips). While the same
        lease is held, the ``waiting`` lanes not looked at are skipped: the planner would
        defer each again with the same streak, so the tick does no work for them. Costs the
        lanes looked at and the active ones, not the waiting ones."""
        focus = set(looked)
        focus.update(always, self.active)
        if lease is None or lease.token != self.lease_token:
            focus.update(self.waiting)
            return focus, 0
        focus.add(lease.lane)
        # ``&`` walks the smaller set: no per-lane work for the waiting ones.
        return focus, len(self.waiting) - len(focus & self.waiting)

    def settle(self, looks: Mapping[str, float], now: float, lease_token: str | None,
               waiting: Collection[str],
               states: Mapping[str, LaneState]) -> dict[str, float]:
        """After the tick: record each planned lane's next look and its state as the plan
        leaves it (``waiting``: those now recorded as waiting for the lease); return the
        index scores that must be written (those that differ from what the index holds)."""
        writes: dict[str, float] = {}
        for lane, look in looks.items():
            if self.scores.get(lane) != look:
                writes[lane] = look
            if look <= now:
                self.scores[lane] = look
                self.states[lane] = states[lane]
                (self.waiting if lane in waiting else self.active).add(lane)
                (self.active if lane in waiting else self.waiting).discard(lane)
            else:
                self.forget(lane)
        self.cursor = now
        self.lease_token = lease_token
        return writes


def with_changes(states: Mapping[str, LaneState],
                 changes: Mapping[str, SchedRecord]) -> dict[str, LaneState]:
    """The states as they are once the plan's beat-owned records are written."""
    return {lane: (replace(st, sched=changes[lane]) if lane in changes else st)
            for lane, st in states.items()}


#: ``NEVER`` and ``due_at`` (the due-time rule, ``core.due``) are named here too: the worker
#: files a finished run's due time through the due index.
__all__ = ["DERIVED_RECONCILE_S", "NEVER", "TickMemory", "due_at", "next_look",
           "waits_for_lease", "with_changes"]
