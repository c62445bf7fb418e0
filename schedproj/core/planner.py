"""The tick planner: from what beat read (lane states, the lease, operator requests, due-check
probes) and ``now`` to a :class:`Plan` — the lease grant to ask for, the messages to send, the
beat-owned records that change, the deferral streaks that began, and when to look again.

``FairScheduler`` carries a plan out against Redis and Celery; the simulator carries the very
same plan out in virtual time. Pure: no I/O, no clock; task ids come from the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from schedproj.core.deferrals import Deferral, continue_streak, same_wait
from schedproj.core.due import calendar_last_run
from schedproj.core.frozen import evolve, is_plain
from schedproj.core.lanes import DeferralReason, LaneSpec, Profile
from schedproj.core.picker import Policy
from schedproj.core.pipeline import Decision, decide, seconds_until_next_due
from schedproj.core.pools import Grant, Pool
from schedproj.core.records import EMPTY_STATE, LaneState, LeaseView, SchedRecord
from schedproj.core.schedules import missed_fires
from schedproj.core.views import dispatch_ended


@dataclass(frozen=True)
class Send:
    """One message to send for a decision."""

    lane: str
    task_id: str
    deadline: float


@dataclass(frozen=True)
class TickInput:
    """Everything a tick decides from, as read from the store in one go."""

    states: Mapping[str, LaneState]
    lease: LeaseView | None
    #: Lanes an operator paused: left out of the decision.
    paused: Collection[str] = frozenset()
    #: Lanes an operator asked to run now: due whatever their cadence (still via the lease).
    forced: Collection[str] = frozenset()
    #: Lanes whose state or due-check could not be read this tick: left out, reported.
    unreadable: Collection[str] = frozenset()
    #: Backlog reported by the lanes' due-check hooks this tick.
    probes: Mapping[str, int] = field(default_factory=dict)
    #: Redis lost state a moment ago: dispatch nothing while earlier runs re-assert.
    quarantined: bool = False
    #: The heavy lease or a pool's slot changed hands while the states were read (a run
    #: ended between its record's read and the lease's): grant nothing this tick.
    holds_moved: bool = False
    #: How long past its mark a light run still counts as in flight (beat: one lease TTL,
    #: the grace after which it records the run lost).
    inflight_grace_s: float = 0.0
    #: The declared pools (None: the default pool alone, whose one slot is ``lease``).
    pools: Mapping[str, Pool] | None = None
    #: Per pool beyond the default, the lane holding each busy slot (``""``: unknown).
    holders: Mapping[str, Sequence[str]] | None = None


@dataclass(frozen=True)
class Plan:
    """What one tick does. ``sends`` holds the heavy winner (which needs the lease granted
    first) and every light lane dispatched in the same tick; ``changes`` are the beat-owned
    records to write before anything is sent; ``new_deferrals`` are the streaks that began or
    changed reason or blocker (logged and counted once per streak; a lane waiting for the
    lease through several hand-offs is one streak)."""

    decision: Decision
    now: float
    states: Mapping[str, LaneState]
    sends: Mapping[str, Send]
    changes: Mapping[str, SchedRecord]
    new_deferrals: tuple[Deferral, ...]
    #: Seconds until some idle lane falls due by time alone (None: none will).
    next_due_in_s: float | None
    #: Calendar lanes' fire times that passed their catch-up window unrun, newly counted
    #: (logged, counted and reported once each; recorded in ``changes``).
    misses: tuple[Missed, ...] = ()

    @property
    def heavy(self) -> Send | None:
        """The heavy winner's message, which needs the lease granted before it is sent."""
        winner = self.decision.winner
        return self.sends.get(winner) if winner is not None else None

    @property
    def pool_sends(self) -> tuple[tuple[Grant, Send], ...]:
        """The messages of the grants in pools beyond the default, each needing its slot
        leases granted before it is sent."""
        return tuple((g, self.sends[g.lane]) for g in self.decision.pool_grants
                     if g.lane in self.sends)

    def only(self, lanes: Collection[str]) -> Plan:
        """The same plan sending only ``lanes`` (a refused grant, or the simulator's
        one-winner-per-poll variant): the lanes left out keep their state and stay due."""
        sends = {lane: send for lane, send in self.sends.items() if lane in lanes}
        changes, news = sched_changes(self.decision, self.states, sends, self.now)
        misses = record_misses(self.decision, self.states, changes, self.now)
        return replace(self, sends=sends, changes=changes, new_deferrals=tuple(news),
                       misses=misses)

    def sleep_s(self, max_interval_s: float) -> float:
        """How long beat may wait before the next tick: until the next lane falls due by time,
        at most ``max_interval_s`` (due-check hooks and backlog are re-polled then); a
        finishing run wakes it earlier."""
        if self.next_due_in_s is None:
            return max_interval_s
        return min(max_interval_s, self.next_due_in_s)


def plan_tick(
    lanes: Collection[LaneSpec],
    tick: TickInput,
    now: float,
    *,
    profile: Profile,
    policy: Policy,
    start_deadline_s: float,
    task_id: Callable[[str], str],
) -> Plan:
    """Plan one tick: decide (due -> gates -> pick), give every dispatched lane a message id
    and a start deadline, and derive the beat-owned record changes."""
    decision = decide(lanes, tick.states, tick.lease, now, profile, probes=tick.probes,
                      unreadable=tick.unreadable, paused=tick.paused, forced=tick.forced,
                      policy=policy, inflight_grace_s=tick.inflight_grace_s,
                      pools=tick.pools, holders=tick.holders)
    if tick.quarantined:
        decision = quarantine(decision, tick.states, now)
    elif tick.holds_moved:
        decision = hold_grants(decision)
    deadline = now + start_deadline_s
    sends = {lane: _new_send(lane, task_id(lane), deadline) for lane in decision.dispatched}
    states = tick.states
    changes, news = sched_changes(decision, states, sends, now)
    misses = record_misses(decision, states, changes, now)
    # Plan(...) without the frozen dataclass __init__ (core.frozen): once a tick.
    plan = _new(Plan)
    d = plan.__dict__
    d["decision"] = decision
    d["now"] = now
    d["states"] = states
    d["sends"] = sends
    d["changes"] = changes
    d["new_deferrals"] = tuple(news)
    d["next_due_in_s"] = seconds_until_next_due(decision.views, states, now)
    d["misses"] = misses
    return plan


_new = object.__new__
assert is_plain(Plan) and is_plain(Send)  # built as their __init__ would


def _new_send(lane: str, task_id: str, deadline: float) -> Send:
    """``Send(lane, task_id, deadline)`` without the frozen dataclass ``__init__``."""
    send = _new(Send)
    d = send.__dict__
    d["lane"] = lane
    d["task_id"] = task_id
    d["deadline"] = deadline
    return send


@dataclass(frozen=True)
class Missed:
    """Fire times of a calendar lane skipped because they passed its catch-up window."""

    lane: str
    #: The latest fire time skipped (epoch seconds).
    through: float
    #: How many fire times were skipped (at most ``schedules.MISSED_COUNT_CAP`` at once).
    count: int
    #: The lane's catch-up window (seconds).
    window_s: float


def record_misses(decision: Decision, states: Mapping[str, LaneState],
                  changes: dict[str, SchedRecord], now: float) -> tuple[Missed, ...]:
    """Count the fire times of the calendar lanes this tick viewed that passed their catch-up
    window with no run (``schedules.missed_fires``) and record them in ``changes`` (the
    lane's sched record: ``missed_through`` so each is counted once, ``missed`` the total).
    A lane dispatched now is dispatched for a fire time within its window."""
    misses: list[Missed] = []
    empty = EMPTY_STATE
    for lane, view in decision.views.items():
        spec = view.spec
        if spec.calendar is None or spec.catchup_window_s is None:
            continue
        state = states.get(lane, empty)
        found = missed_fires(spec.calendar, calendar_last_run(spec, state, now),
                             state.sched.missed_through, now, spec.catchup_window_s,
                             abs(spec.due_ratio - 1.0))
        if found is None:
            continue
        through, count = found
        old = changes.get(lane, state.sched)
        changes[lane] = replace(old, missed_through=through, missed=(old.missed or 0) + count)
        misses.append(Missed(lane, through, count, spec.catchup_window_s))
    return tuple(misses)


def quarantine(decision: Decision, states: Mapping[str, LaneState], now: float) -> Decision:
    """The decision with every lane it would dispatch deferred instead — the lease's winner,
    every pool's slot grants and the light lanes: after a state loss a run whose lease, slot
    lease or in-flight mark vanished may still be running, and it re-asserts itself within
    the quarantine. The deferral records why, so operators see it."""
    held = tuple(
        continue_streak(states[lane].sched.deferral if lane in states else None, lane,
                        DeferralReason.STATE_LOSS_QUARANTINE, None, now)
        for lane in decision.dispatched)
    return replace(decision, winner=None, pool_grants=(), also_dispatched=(),
                   deferred=decision.deferred + held)


def hold_grants(decision: Decision) -> Decision:
    """The decision without its grants (the lease's winner, the pools' slots); its light
    lanes still go. The tick read a run's record as in flight and its lease or slot as free
    after the run ended in between: its lane looks due and not running, and granting on that
    would run it again at once. The lanes stay due, unrecorded, for the next tick, which
    reads the run's end (it marked the lane changed) with the lease as it is then."""
    return replace(decision, winner=None, pool_grants=())


def forget_ended_dispatch(state: LaneState) -> SchedRecord:
    """The lane's sched record without its in-flight message once that message ended
    (``views.dispatch_ended``); the record itself otherwise. A lane at rest then keeps a
    sched record in Redis's 64-byte allocation class instead of the 160-byte one (about 96
    bytes a lane: docs/performance.md, "Where the bytes go"). Every release reads it: a
    missing field takes its default (the previous release's beat wrote such records itself
    when a message never left), and a worker of any release refuses a redelivered copy of the
    ended message as not the lane's current dispatch. Unlike the compact format, nothing
    waits for the whole fleet to run this release. It costs one more record in the write beat
    makes anyway once a run ended (the lane's next look)."""
    old = state.sched
    if not dispatch_ended(state):
        return old
    # (evolve: dataclasses.replace without its cost, core.frozen.)
    return evolve(old, inflight_task_id=None, inflight_deadline=None)


def sched_changes(
    decision: Decision,
    states: Mapping[str, LaneState],
    sends: Mapping[str, Send],
    now: float,
) -> tuple[dict[str, SchedRecord], list[Deferral]]:
    """The beat-owned records that change, and the deferrals that are new or changed (to log
    once per streak, not every tick)."""
    empty = EMPTY_STATE.sched
    changes: dict[str, SchedRecord] = {}
    news: list[Deferral] = []
    deferred = {d.lane: d for d in decision.deferred}
    views = decision.views
    get = states.get

    for lane in views:
        state = get(lane)
        old = empty if state is None else _ended_forgotten(lane, state, sends, changes)
        if lane in sends:
            send = sends[lane]
            # (evolve: dataclasses.replace without its cost, core.frozen.)
            changes[lane] = evolve(old, inflight_task_id=send.task_id,
                                   inflight_deadline=send.deadline, last_dispatch_at=now,
                                   dispatches=old.dispatches + 1, deferral=None)
        elif lane in deferred:
            new = deferred[lane]
            if old.deferral is not None and same_wait(old.deferral, new):
                continue
            if old.deferral != new:
                changes[lane] = evolve(old, deferral=new)
                if (old.deferral is None or old.deferral.reason != new.reason
                        or old.deferral.blocker != new.blocker):
                    news.append(new)
        elif old.deferral is not None:
            changes[lane] = evolve(old, deferral=None)
    if len(states) > len(views) or not views.keys() >= states.keys():
        _end_streaks_outside(views, states, changes)
    return changes, news


def _ended_forgotten(lane: str, state: LaneState, sends: Mapping[str, Send],
                     changes: dict[str, SchedRecord]) -> SchedRecord:
    """The lane's sched record with an ended dispatch forgotten (then recorded in
    ``changes``); a lane sent now gets its new dispatch instead."""
    old = state.sched
    if lane in sends or old.inflight_task_id is None:
        return old
    forgotten = forget_ended_dispatch(state)
    if forgotten is not old:
        changes[lane] = forgotten
    return forgotten


def _end_streaks_outside(views: Mapping[str, object], states: Mapping[str, LaneState],
                         changes: dict[str, SchedRecord]) -> None:
    """Lanes outside this decision (paused, disabled by the profile) are not deferred now: end
    their streaks, so a lane resumed later does not inherit a stale start."""
    for lane in states.keys() - views.keys():
        st = states[lane]
        if st.sched.deferral is not None:
            changes[lane] = evolve(st.sched, deferral=None)


__all__ = ["Missed", "Plan", "Send", "TickInput", "forget_ended_dispatch", "hold_grants",
           "plan_tick", "quarantine", "record_misses", "sched_changes"]
