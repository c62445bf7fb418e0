"""The due index: when beat must next look at a lane, and what beat keeps between ticks so a
tick costs what changed, not how many lanes exist. Pure: no I/O, no clock.

Redis holds a sorted set ``lane -> next look`` (``Keys.due``), written atomically with every
record that moves it, and a set of lanes whose records changed (``Keys.changed``). Each tick
beat reads the lanes that changed and the lanes whose next look came since its last tick;
:class:`TickMemory` keeps the lanes that are due (their states) from one tick to the next and
says which of them the planner must see now.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from schedproj.core.deferrals import LEASE_WAITS
from schedproj.core.due import NEVER, due_at
from schedproj.core.lanes import LaneSpec
from schedproj.core.pools import DEFAULT_POOL
from schedproj.core.records import LaneState, LeaseView, SchedRecord, new_state
from schedproj.core.views import is_in_flight

if TYPE_CHECKING:  # the worker files due times through this module: not the planner's imports
    from schedproj.core.planner import Plan

#: How often the active beat begins a reconcile cycle of the due index even when its stamps
#: and the changed set's agree (seconds, ``Settings.derived_reconcile_s``): bounds how long any
#: damage the stamps cannot see (a score moved by hand, a lane removed from the index, a mark
#: lost from a set restored in the same generation) lasts. The cycle goes a slice a tick
#: (:data:`RECONCILE_SLICE` lanes, ``LaneStore.reconcile_slice``): each lane of the slice is
#: put back in the index if missing and marked changed, so the next tick reads it and writes
#: its next look afresh - no tick reads more than a slice more than it would anyway, however
#: many lanes there are. A lane is so re-checked at least every
#: max(DERIVED_RECONCILE_S, ceil(lanes / RECONCILE_SLICE) ticks): at 1,000,000 lanes and beat's
#: 3 s longest sleep, 200 ticks, at most 600 s (a busy beat ticks more often).
#: A deleted, emptied, wrong-typed or restored key is seen at the next tick and healed in full.
DERIVED_RECONCILE_S = 300.0
#: Lanes a tick of the reconcile cycle re-checks (``Settings.reconcile_slice``): a read page.
RECONCILE_SLICE = 5000
#: :class:`TickMemory` rebuilds its containers once they hold under a quarter of the most
#: they held since they were last rebuilt, if that most was at least this many lanes. A
#: Python dict or set never shrinks its table when keys are deleted: a start-up tick that
#: learnt 1,000,000 lanes' states and then forgot all but the due ones kept two dicts sized
#: for 1,000,000 (about 40 MiB each) and sets as large, for as long as beat ran.
SHRINK_FLOOR = 4096


def next_look(spec: LaneSpec, state: LaneState, now: float, *, paused: bool = False,
              forced: bool = False, grace_s: float = 0.0, backlog: int | None = None) -> float:
    """When beat must look at the lane next: when it falls due (``core.due.due_at``; with
    ``backlog``, what its due check answered, else the record's), or, for a light lane in
    flight, when its in-flight mark (plus ``grace_s``, see ``views.is_in_flight``) or message
    expires (its end is a change anyway)."""
    if paused:
        return NEVER
    if forced:
        return 0.0
    if not spec.heavy and is_in_flight(state, now, grace_s):
        run, sched = state.run, state.sched
        mark = None if run.running_until is None else run.running_until + grace_s
        ends = [t for t in (mark, sched.inflight_deadline) if t is not None]
        return max(now, min(ends)) if ends else now
    return max(min(due_at(spec, state, now, backlog), NEVER), 0.0)


def waits_for_lease(state: LaneState) -> bool:
    """Is the lane's recorded deferral a wait for its pool — the heavy lease, or a pool's
    slots — (whose streak start is already recorded and does not move while the same holds
    stay)?"""
    d = state.sched.deferral
    return d is not None and d.reason in LEASE_WAITS


#: A full pool's holds as the skip compares them: each slot's (token, start of its run).
Holds = tuple[tuple[str, float | None], ...]


def full_holds(slots: Mapping[str, Sequence[LeaseView | None]]) -> dict[str, Holds]:
    """The holds of each pool with no free slot (``slots``: each pool's slot leases). A
    pool with a free slot is left out: its waiters may be granted, whatever they held before.
    A slot's start is in it because the pool's pressure is measured on its longest holder,
    which a run starting changes."""
    return {pool: tuple((lease.token, lease.started_at) for lease in leases
                        if lease is not None)
            for pool, leases in slots.items() if leases and None not in leases}


@dataclass(frozen=True)
class Quiet:
    """A lane beat reads every tick (a gate's blocker, a lane with a due check) as its last
    planning left it: nothing to do. What it was planned on - its record, its due check's
    answer, the heavy lease - and when, on those, it falls due or its message in flight
    expires (``next_look`` with the answer)."""

    state: LaneState
    probe: int | None
    lease_token: str | None
    until: float


@dataclass
class TickMemory:
    """What the active beat keeps between ticks: the lanes due (with their states and the
    score the index holds for them), the index position read so far, and the holds it saw.
    Due lanes are ``waiting`` (heavy, recorded as waiting for their pool — the heavy lease,
    or a pool's slots —: nothing to do for them while the same holds stay) or ``active``
    (the rest: planned every tick). ``waiting_of`` sorts the waiting lanes by pool.

    ``cursor`` None means nothing is known: the next read takes every due lane (a new or
    restarted beat, a beat that lost its lock, state loss)."""

    cursor: float | None = None
    states: dict[str, LaneState] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)
    active: set[str] = field(default_factory=set)
    waiting: set[str] = field(default_factory=set)
    waiting_of: dict[str, set[str]] = field(default_factory=dict)
    lease_token: str | None = None
    #: Each full pool's holds after the last tick (``full_holds``, this tick's grants in).
    holds: dict[str, Holds] = field(default_factory=dict)
    #: How many waiting lanes of each pool the last ``focus`` skipped (pools it skipped none
    #: of are left out): a publisher must not take a pool's skipped waiters for none.
    skipped: dict[str, int] = field(default_factory=dict)
    #: The lanes read every tick whose last planning left them with nothing to do (``hush``),
    #: skipped while nothing they were planned on changed (``quiet_now``).
    quiet: dict[str, Quiet] = field(default_factory=dict)
    #: The most lanes a container held since the containers were last rebuilt (``_shrink``).
    high: int = field(default=0, compare=False, repr=False)

    @property
    def due(self) -> set[str]:
        return self.active | self.waiting

    @property
    def waits_in_pools(self) -> bool:
        """Does a lane wait for the slots of a pool beyond the default? (Then the next focus
        needs the slot leases read.)"""
        return any(lanes for pool, lanes in self.waiting_of.items() if pool != DEFAULT_POOL)

    def reset(self) -> None:
        self.cursor, self.lease_token, self.high = None, None, 0
        for part in (self.states, self.scores, self.active, self.waiting, self.waiting_of,
                     self.holds, self.skipped, self.quiet):
            part.clear()  # (a cleared dict or set frees its table)

    @property
    def held(self) -> int:
        """How many lanes the largest container holds."""
        return max(len(self.states), len(self.scores), len(self.active), len(self.waiting))

    def _shrink(self) -> None:
        """Rebuild the containers when they hold under a quarter of the most they held
        (:data:`SHRINK_FLOOR`): a copy's table is sized for what it holds. Costs what they
        hold, at most once per three quarters of the most forgotten."""
        held = self.held
        if self.high >= SHRINK_FLOOR and 4 * held < self.high:
            self.states, self.scores = dict(self.states), dict(self.scores)
            self.active, self.waiting = set(self.active), set(self.waiting)
            self.waiting_of = {pool: set(lanes) for pool, lanes in self.waiting_of.items()}
            self.high = held

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
        self.high = max(self.high, self.held)
        return gone

    def forget(self, lane: str) -> None:
        self.states.pop(lane, None)
        self.scores.pop(lane, None)
        self.active.discard(lane)
        self._stop_waiting(lane)

    def _stop_waiting(self, lane: str) -> None:
        if lane in self.waiting:
            self.waiting.discard(lane)
            for lanes in self.waiting_of.values():
                lanes.discard(lane)

    def focus(self, looked: Iterable[str], lease: LeaseView | None,
              always: Collection[str],
              slots: Mapping[str, Sequence[LeaseView | None]] | None = None,
              replan: Collection[str] = ()) -> tuple[set[str], int]:
        """(lanes the planner must see this tick, how many due lanes it skips). The
        ``waiting`` lanes not looked at are skipped while their pool's holds are those the
        last tick left: the same heavy lease held, or (``slots``: each pool's slot leases
        as read this tick) every slot of the pool held under the same tokens, by runs that
        started or not as before. The planner would defer each again with the same streak,
        so the tick does no work for them — unless their pool is in ``replan`` (say, the lane
        its published pressure names changed: only planning them all tells who presses
        next). Costs the lanes looked at, the active ones and the holders, not the waiting
        ones. Sets ``skipped``."""
        focus = set(looked)
        focus.update(always, self.active)
        same = full_holds(slots or {})
        same = {pool: holds for pool, holds in same.items()
                if self.holds.get(pool) == holds and pool not in replan}
        if lease is not None and lease.token == self.lease_token:
            same[DEFAULT_POOL] = ()
            focus.add(lease.lane)
        for pool in same.keys() - {DEFAULT_POOL}:
            # The holders are planned, as the lease's: a holder is never one of its waiters.
            focus.update(held.lane for held in (slots or {})[pool]
                         if held is not None and held.lane)
        self.skipped = {}
        for pool, lanes in self.waiting_of.items():
            if pool not in same:
                focus.update(lanes)
            # ``&`` walks the smaller set: no per-lane work for the waiting ones.
            elif lanes and (skipped := len(lanes) - len(focus & lanes)):
                self.skipped[pool] = skipped
        return focus, sum(self.skipped.values())

    def resting(self, now: float) -> dict[str, LaneState]:
        """The lanes read every tick that are quiet (``hush``) until after ``now``, each with
        the state it was planned on: beat leaves them out of its read while they rest (every
        writer but a hand edit marks a changed record changed, so the read brings them when
        they change) and takes that state for the one it would read (``quiet_now``
        compares)."""
        return {lane: was.state for lane, was in self.quiet.items() if now < was.until}

    def wake_resting(self) -> None:
        """Read the lanes read every tick again from the next tick on, each planned on what
        it reads: a tick that stopped after its read (Redis refused a write; the active beat
        goes on) consumed the change marks that read carried, so the record a lane rests on
        may no longer be the one stored, and no mark will say so again."""
        self.quiet.clear()

    def quiet_now(self, lanes: Iterable[str], states: Mapping[str, LaneState],
                  probes: Mapping[str, int], lease: LeaseView | None, now: float, *,
                  planned: Collection[Collection[str]] = ()) -> dict[str, float]:
        """The lanes among ``lanes`` (those read every tick) the planner would leave with
        nothing to do now, each with when that may end (``Quiet.until``): planned last on
        the same record (``states``, as read now), due-check answer (``probes``) and heavy
        lease, left with nothing to do then, and neither due nor at their in-flight end by
        ``now``. Planning them would decide what it decided: nothing for them (they are not
        due), and what they tell other lanes only through a gate, whose consumer, if planned,
        needs them planned too (the caller adds them back). ``planned``: lanes planned
        whatever they were (their record, pause or run-now marked changed in this read;
        unreadable)."""
        token = lease.token if lease is not None else None
        quiet: dict[str, float] = {}
        for lane in lanes:
            was = self.quiet.get(lane)
            if (was is None or now >= was.until or was.lease_token != token
                    or probes.get(lane) != was.probe or states.get(lane) != was.state
                    or any(lane in them for them in planned)):
                continue
            quiet[lane] = was.until
        return quiet

    def hush(self, plan: Plan, lanes: Iterable[str], probes: Mapping[str, int],
             lease: LeaseView | None, grace_s: float) -> None:
        """After ``plan`` was carried out: remember each of ``lanes`` (those read every tick)
        it planned and left with nothing to do - viewed not due, no message, no record
        change, no deferral or missed fire time begun, no run to judge lost - with when it
        falls due on the same inputs (``next_look`` with its due check's answer and the
        lease's in-flight grace ``grace_s``); forget the others it planned."""
        token = lease.token if lease is not None else None
        touched = ({d.lane for d in plan.new_deferrals} | {m.lane for m in plan.misses}
                   | plan.sends.keys() | plan.changes.keys())
        for lane in lanes:
            state = plan.states.get(lane)
            if state is None:
                continue  # not planned this tick: what it was planned on still holds
            self.quiet.pop(lane, None)
            view = plan.decision.views.get(lane)
            if (view is None or view.due or lane in touched
                    or state.run.running_task_id is not None):
                continue
            probe = probes.get(lane)
            until = next_look(view.spec, state, plan.now, grace_s=grace_s, backlog=probe)
            if until > plan.now:
                self.quiet[lane] = Quiet(state, probe, token, until)

    def settle(self, looks: Mapping[str, float], now: float, lease_token: str | None,
               waiting: Collection[str] | Mapping[str, str],
               states: Mapping[str, LaneState],
               holds: Mapping[str, Holds] | None = None) -> dict[str, float]:
        """After the tick: record each planned lane's next look and its state as the plan
        leaves it (``waiting``: those now recorded as waiting for their pool; a mapping
        gives each one's pool, else the default pool's), and the holds the tick leaves
        (``holds``: ``full_holds`` of the slot leases with this tick's grants; None: the
        slots were not read, so no pool's waiters are skipped next tick); return the index
        scores that must be written (those that differ from what the index holds)."""
        pool_of = waiting if isinstance(waiting, Mapping) else {}
        writes: dict[str, float] = {}
        for lane, look in looks.items():
            if self.scores.get(lane) != look:
                writes[lane] = look
            if look <= now:
                self.scores[lane] = look
                self.states[lane] = states[lane]
                if lane in waiting:
                    mine = self.waiting_of.setdefault(pool_of.get(lane, DEFAULT_POOL), set())
                    if lane not in mine:
                        self._stop_waiting(lane)
                        self.waiting.add(lane)
                        mine.add(lane)
                    self.active.discard(lane)
                else:
                    self._stop_waiting(lane)
                    self.active.add(lane)
            else:
                self.forget(lane)
        self.high = max(self.high, self.held)
        self._shrink()
        self.cursor = now
        self.lease_token = lease_token
        self.holds = dict(holds or {})
        return writes


def gated_back(focus: set[str], quiet: dict[str, float],
               spec: Callable[[str], LaneSpec | None]) -> None:
    """Move into ``focus`` (the lanes to plan) each lane of ``quiet`` (``quiet_now``) a gate
    of a lane in ``focus`` names, then those their own gates name: the planner judges a gate
    on its blocker's view, and a blocker it does not see holds nothing back. Costs the lanes
    in focus only while a quiet lane is left."""
    todo = list(focus) if quiet else []
    while todo and quiet:
        found = spec(todo.pop())
        for gate in found.gates if found is not None else ():
            if quiet.pop(gate.blocker, None) is not None:
                focus.add(gate.blocker)
                todo.append(gate.blocker)


def with_changes(states: Mapping[str, LaneState],
                 changes: Mapping[str, SchedRecord]) -> dict[str, LaneState]:
    """The states as they are once the plan's beat-owned records are written."""
    # (new_state: ``replace`` cost 2 µs a changed lane, every lane of a bulk add's first tick.)
    return {lane: (new_state(st.run, changes[lane]) if lane in changes else st)
            for lane, st in states.items()}


#: ``NEVER`` and ``due_at`` (the due-time rule, ``core.due``) are named here too: the worker
#: files a finished run's due time through the due index.
__all__ = ["DERIVED_RECONCILE_S", "NEVER", "RECONCILE_SLICE", "SHRINK_FLOOR", "Holds", "Quiet",
           "TickMemory", "due_at", "full_holds", "gated_back", "next_look", "waits_for_lease",
           "with_changes"]
