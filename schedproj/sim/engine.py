"""A discrete-event simulator in virtual time that drives the project's own scheduling core.

Every tick is :func:`schedproj.core.planner.plan_tick` — the planner ``FairScheduler`` carries
out — on :class:`~schedproj.core.records.LaneState` records and a lease view built from the
simulator's state; the plan's beat-owned changes (in-flight message, deferral streaks) are
applied as beat writes them. Run records change by the same transitions ``LaneTask`` uses
(:mod:`schedproj.core.lifecycle`); a failed run reports no backlog; yields keep the lane due.

Beat is modelled as the real loop: after a decision at ``t`` it polls again after
``min(tick, seconds_until_next_due)``, and a finishing run wakes it at once (wake on release).
Polls at which nothing can have changed are skipped: they would decide exactly the same, so
the simulation is the same as polling every tick, only faster. A decision plans the lanes
beat's due index names (:mod:`schedproj.sim.index`), not every lane, with the same outcome:
``Planning.FULL`` still plans every lane, and ``Planning.CHECK`` compares the two.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from schedproj.core import defaults, gates, lifecycle
from schedproj.core.collector import cyclic_gc_paused
from schedproj.core.deferrals import LEASE_WAITS
from schedproj.core.due import (
    NEVER,
    calendar_due_at_for,
    calendar_last_run,
    due_at,
    effective_last_run,
    retry_at,
    staleness,
)
from schedproj.core.dueindex import next_look, waits_for_lease
from schedproj.core.frozen import evolve, is_plain
from schedproj.core.lanes import DeferralReason, LaneSpec, enabled_under
from schedproj.core.picker import Policy, pick
from schedproj.core.pipeline import Decision
from schedproj.core.planner import Plan, TickInput, plan_tick
from schedproj.core.pools import DEFAULT_POOL, pools_by_name
from schedproj.core.pressure import HOLD_CAP, Pressure, measure, yield_reason
from schedproj.core.records import (
    LaneState,
    LeaseView,
    Outcome,
    RunRecord,
    SchedRecord,
)
from schedproj.core.views import is_in_flight
from schedproj.sim.index import LOOK_SLACK_S, LaneIndex, Planning, Rank, check_plans
from schedproj.sim.model import Arrival, Durations, LaneModel, Scenario, SimError, Variant
from schedproj.sim.pools import lease_decision, pool_pressure

_new = object.__new__
assert is_plain(LaneState)  # _Lane.state builds it as its __init__ would
#: A lease of the defaults the simulation does not set (lane and token are always set).
_NO_LEASE = LeaseView(lane="", token="", fence=0, granted_at=0.0)

#: A simulation that needs more decisions than this is stopped (a modelling error, not a run).
MAX_DECISIONS = 5_000_000
#: Float tolerance for "this instant is on the poll grid".
_EPS = 1e-9
#: Each outcome's text, as a run's trace records it (``Outcome.value`` is a property).
_OUTCOME_TEXT = {outcome: outcome.value for outcome in Outcome}

_ARRIVAL, _STEP, _FAIL, _LIGHT_END = range(4)


def _ignore(lane: str) -> None:
    """A lane's change, unheard (full planning looks at every lane anyway)."""


@dataclass
class LaneTrace:
    """What happened to one lane during a simulation (raw observations for the metrics)."""

    name: str
    spec: LaneSpec
    enabled: bool
    #: Staleness-ratio clock: (origin, start, end) — for t in [start, end] the ratio is
    #: (t - origin) / cadence for a cadence lane, and for a calendar lane the calendar ratio
    #: (``schedules.calendar_ratio``) of a lane last run at ``origin`` (-inf: never ran);
    #: outside all segments it is 0 (a backlog-driven lane with no backlog).
    segments: list[tuple[float, float, float]] = field(default_factory=list)
    #: Lengths of the lane's "due but not started" episodes (the last one may be cut by the
    #: horizon).
    starvation: list[float] = field(default_factory=list)
    #: Light lanes: dispatch time minus the time the lane became dispatchable, per dispatch.
    light_delays: list[float] = field(default_factory=list)
    #: (start, end, outcome) of every run that ended within the horizon.
    runs: list[tuple[float, float, str]] = field(default_factory=list)
    #: The start of every run (those still going at the horizon too).
    starts: list[float] = field(default_factory=list)
    dispatches: int = 0
    #: Light lanes: ticks at which the lane was ready but a heavy winner took the only slot.
    falsifier: int = 0
    falsifier_episodes: int = 0
    items_done: int = 0
    final_backlog: int = 0


@dataclass
class SimRun:
    """The raw result of one simulation: one scenario, one seed, one variant."""

    scenario: Scenario
    variant: Variant
    seed: str
    lanes: dict[str, LaneTrace]
    #: (lane, start, end) of every lease hold (the last may be cut by the horizon).
    lease: list[tuple[str, float, float]]
    drained_at: float | None
    held_s: float
    #: Time the lease was free while some heavy lane was due (work-conservation loss).
    idle_due_s: float
    falsifier: int
    falsifier_episodes: int
    #: Single-winner mode: ready light lanes that waited because another light lane was sent.
    light_behind_light: int
    decisions: int
    deferrals: dict[str, int]
    expired_gates: int
    #: Every heavy yield: (time, lane, reason, was another heavy lane due then?).
    yields: list[tuple[float, str, str, bool]] = field(default_factory=list)
    #: Every heavy run start: (lane, time, staleness ratio then, seconds it waited while due).
    starts: list[tuple[str, float, float, float]] = field(default_factory=list)
    #: Seconds of heavy runs' fixed start-up parts (``run_s``) paid on the lease.
    startup_s: float = 0.0
    #: (pool, lane, slots, start, end) of every run in a pool beyond the default (the last
    #: ones may be cut by the horizon); the default pool's holds are ``lease``.
    pool_holds: list[tuple[str, str, int, float, float]] = field(default_factory=list)


class _Published:
    """The pressure on the lease beat published with one decision (``pressure.measure`` on
    it), measured the first time a holder reads it: a holder reads only what was published
    by its renewals, and most holds end before their first, so most are never measured."""

    __slots__ = ("_args", "_value")

    def __init__(self, decision: Decision, states: dict[str, LaneState], lease: LeaseView,
                 t: float) -> None:
        self._args: tuple[Decision, dict[str, LaneState], LeaseView, float] | None = (
            decision, states, lease, t)
        self._value: Pressure | None = None

    def pressure(self) -> Pressure | None:
        if self._args is not None:
            decision, states, lease, t = self._args
            self._value = measure(lease_decision(decision), states, lease, t)
            self._args = None
        return self._value


@dataclass
class _HeavyRun:
    rt: _Lane
    task_id: str
    index: int
    start: float
    fence: int
    pos: int = 0
    step: int = 0
    chunk: tuple[int, list[int], list[tuple[int, int]]] | None = None


@dataclass
class _LightRun:
    rt: _Lane
    task_id: str
    index: int
    start: float
    snapshot: int
    failed: bool


class _Lane:
    """The simulator's mutable view of one lane."""

    def __init__(self, model: LaneModel, seed: str, enabled: bool) -> None:
        self.m = model
        self.spec = model.spec
        self.name = model.name
        self.heavy = model.spec.heavy
        self.cadence = model.spec.cadence_s
        #: A heavy lane of a pool beyond the default: its runs take slots, not the lease.
        self.in_pool = model.spec.heavy and model.spec.pool != DEFAULT_POOL
        self.enabled = enabled
        self.dur = Durations(model, seed)
        self.trace = LaneTrace(model.name, model.spec, enabled)
        # Work: heavy lanes a queue of (item id, producer count it needs); light lanes a
        # version counter bumped by their feeders and the version their last run saw.
        self.pool: list[tuple[int, int]] = [(i, 0) for i in range(model.backlog)]
        if model.blocked is not None:
            b = model.blocked
            blocked = [(model.backlog + k, b.per_item * (k + 1)) for k in range(b.count)]
            self.pool = blocked + self.pool
        self.next_id = len(self.pool)
        self.producer: _Lane | None = None
        self.done = 0
        self.version = 0
        self.seen = 0
        self.fed = False
        # Records as the project stores them.
        last = None if model.last_run_ago_s is None else -float(model.last_run_ago_s)
        self.run = RunRecord() if last is None else RunRecord(
            last_run_at=last, last_outcome=Outcome.COMPLETED, runs=1)
        self.sched = SchedRecord()
        self._state: LaneState | None = None
        #: Told the lane's name whenever its records or its backlog change (the due index's
        #: changed set; set by the simulation once every lane exists).
        self.notify: Callable[[str], None] = _ignore
        self.started = 0
        # Metric bookkeeping.
        self.backlog_since: float | None = 0.0 if self.has_backlog() else None
        self.due_since: float | None = None
        self.gated = False
        self.gate_clear: float | None = None
        self.fals_flag = False
        self.origin: float | None = None
        self.seg_start = 0.0
        if not self.spec.backlog_driven or self.has_backlog():
            self.origin = self._origin_at(0.0)

    # -- records ------------------------------------------------------------------------------
    def state(self) -> LaneState:
        if self._state is None:
            # LaneState(run=, sched=) without the frozen dataclass __init__ (core.frozen).
            state = self._state = _new(LaneState)
            d = state.__dict__
            d["run"] = self.run
            d["sched"] = self.sched
            return state
        return self._state

    def set_run(self, run: RunRecord) -> None:
        self.run = run
        self._state = None
        self.notify(self.name)

    def set_sched(self, sched: SchedRecord) -> None:
        self.sched = sched
        self._state = None
        self.notify(self.name)

    # -- work -----------------------------------------------------------------------------------
    def has_backlog(self) -> bool:
        return bool(self.pool) if self.heavy else self.version != self.seen

    def probe(self) -> int:
        return len(self.pool) if self.heavy else int(self.version != self.seen)

    @property
    def probed(self) -> bool:
        """Does the lane have a due-check hook reporting its backlog? (Heavy lanes: always,
        their queue; light lanes: when something feeds them.)"""
        return self.heavy or self.fed

    # -- staleness clock ------------------------------------------------------------------------
    def _origin_at(self, t: float) -> float:
        """Where the ratio counts from when the clock (re)starts at ``t``: the last run's end,
        but at most one cadence back (a lane older than that starts the clock as just due).
        A calendar lane's ratio is the picker's (``due.staleness``), which counts from its last
        run as beat's rules count it (-inf: never ran, its previous fire time is missed)."""
        if self.spec.calendar is not None:
            ran = calendar_last_run(self.spec, self.state(), t)
            return -math.inf if ran is None else ran
        last = self.run.last_run_at
        floor = t - self.cadence
        return floor if last is None else max(last, floor)

    def ratio_at(self, t: float) -> float:
        """The staleness ratio at ``t`` while the clock runs: the calendar ratio the picker
        ranks by for a calendar lane (``due.staleness``), ``(t - origin) / cadence`` else."""
        if self.origin is None:
            return 0.0
        if self.spec.calendar is not None:
            return staleness(self.spec, self.state(), t)
        return (t - self.origin) / self.cadence

    def close_segment(self, t: float) -> None:
        if self.origin is not None and t > self.seg_start:
            self.trace.segments.append((self.origin, self.seg_start, t))
        self.seg_start = t

    def backlog_changed(self, t: float) -> None:
        self.notify(self.name)
        has = self.has_backlog()
        if has and self.backlog_since is None:
            self.backlog_since = t
        elif not has:
            self.backlog_since = None
        if self.spec.backlog_driven:
            if has and self.origin is None:
                self.seg_start = t
                self.origin = self._origin_at(t)
            elif not has and self.origin is not None:
                self.close_segment(t)
                self.origin = None

    def run_ended(self, t: float) -> None:
        """The last run ended at ``t`` (``run.last_run_at`` already says so)."""
        self.close_segment(t)
        if self.spec.backlog_driven and not self.has_backlog():
            self.origin = None
        else:
            self.origin = t
        self.backlog_changed(t)

    def onset(self, t: float) -> float:
        """When the lane's current "due" began (exactly, from the model), for a lane that a
        decision at ``t`` found due and idle."""
        spec, last = self.spec, self.run.last_run_at
        candidates = [retry_at(spec, self.state(), t)]
        if self.backlog_since is not None:
            candidates.append(self.backlog_since)
        if spec.calendar is not None:
            candidates.append(calendar_due_at_for(spec, self.state(), t))
        elif not spec.backlog_driven:
            ran = effective_last_run(self.state(), self.cadence, t, spec.due_ratio)
            candidates.append(-math.inf if ran is None else ran + self.cadence * spec.due_ratio)
        valid = [c for c in candidates if c <= t + _EPS]
        start = min(valid) if valid else t
        if last is not None:
            start = max(start, last)
        return max(0.0, start)


class Simulation:
    """One simulation; :meth:`run` returns the :class:`SimRun`."""

    def __init__(self, scenario: Scenario, variant: Variant, seed: int | str = 1,
                 planning: Planning | str = Planning.INDEX) -> None:
        self.s = scenario
        self.v = variant
        self.seed = str(seed)
        self.rts = [_Lane(m, self.seed, enabled_under(scenario.profile, m.spec.deployment))
                     for m in scenario.lanes]
        self.by_name = {rt.name: rt for rt in self.rts}
        for rt in self.rts:
            for target in rt.m.feeds:
                self.by_name[target].fed = True
            if rt.m.blocked is not None:
                rt.producer = self.by_name[rt.m.blocked.producer]
        self.specs = scenario.specs
        self.enabled = [rt for rt in self.rts if rt.enabled]
        self.probed = [rt for rt in self.rts if rt.probed]
        self.planning = Planning(planning)
        self._tick = TickInput(states={}, lease=None)  # what _plan_lanes fills in
        #: Pools beyond the default: their runs by lane, and every pool by name for decide.
        self.pool_table = pools_by_name(scenario.pools) if scenario.pools else None
        self.pool_runs: dict[str, _HeavyRun] = {}
        self.pool_holds: list[tuple[str, str, int, float, float]] = []
        if self.pool_table is not None and variant.policy is Policy.REGISTRY:
            raise SimError(f"scenario {scenario.name!r} declares pools, which the legacy "
                           f"registry policy does not know. Fix: run the staleness variants")
        self._index_setup()
        self.lease: LeaseView | None = None
        self.lease_start = 0.0
        self.fence = 0
        self.heap: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        # Beat's loop.
        self.last_decision = 0.0
        self.first_change: float | None = None
        self.next_due = math.inf
        self.trigger: float | None = None
        # Observations.
        self.decisions = 0
        self.drained_at: float | None = None
        self.held_s = 0.0
        self.idle_due_s = 0.0
        self.lease_free_since = 0.0
        self.lease_log: list[tuple[str, float, float]] = []
        self.falsifier = 0
        self.falsifier_episodes = 0
        self.light_behind_light = 0
        self.deferrals: dict[DeferralReason, int] = {}
        self.expired_gates = 0
        # Pressure-aware yielding: what beat published during the current hold.
        self.rule = scenario.pressure if variant.policy is Policy.STALENESS else None
        self.published: list[tuple[float, _Published]] = []
        #: The same for each pool beyond the default, on its longest holder's hold.
        self.pool_published: dict[str, list[tuple[float, Pressure | None]]] = {}
        self.yields: list[tuple[float, str, str, bool]] = []
        self.starts: list[tuple[str, float, float, float]] = []
        self.startup_s = 0.0
        #: Arrivals not yet happened: the system is not idle while more work is on its way.
        self.arrivals_left = len(scenario.arrivals)
        for a in scenario.arrivals:
            self._push(a.at_s, _ARRIVAL, a)

    def _index_setup(self) -> None:
        """The due index and what it keeps beside (unused when planning every lane)."""
        # A pool's grant walks at most its slots plus its lanes taking more than one slot.
        walks = {p.name: p.slots for p in self.s.pools}
        for rt in self.enabled:
            if rt.in_pool and rt.spec.slots > 1:
                walks[rt.spec.pool] += 1
        self.index = LaneIndex(by_order=self.v.policy is Policy.REGISTRY, walks=walks)
        self.position = {rt.name: i for i, rt in enumerate(self.rts)}
        # Planned at every decision: calendar lanes (their missed fire times are counted as
        # time passes, due or not).
        self.always = {rt.name for rt in self.enabled if rt.spec.calendar is not None}
        # Only lanes with gates can set off a trigger (a gate's max_defer_s running out).
        self.gated = [rt for rt in self.enabled if rt.spec.gates]
        #: When each gate's max_defer_s runs out, sorted (:meth:`_triggers`; None: to find).
        self._trigger_ats: list[float] | None = None
        #: What each gated lane's gates judge: the blockers, and the members of a family a
        #: gate names. Beat reads them every tick; the simulator plans them with a gated lane
        #: it plans (a gate is judged only for a lane that is due, and a due lane is planned).
        named: dict[str, list[str]] = {}  # a lane's name, or a family's: the lanes it names
        for x in self.enabled:
            for key in (x.name, x.spec.family):
                if key is not None:
                    named.setdefault(key, []).append(x.name)
        self.blockers_of = {rt.name: frozenset(lane for g in rt.spec.gates
                                               for lane in named.get(g.blocker, ()))
                            for rt in self.gated}
        self.gated_names = frozenset(self.blockers_of)
        #: Gated lanes at rest (:meth:`_rest`): due, deferred by a gate (or, heavy, waiting for
        #: the lease behind a gate that blocks), and planned again only when that could change:
        #: lane -> (for a heavy lane, whether its record is a wait for the lease — its outcome
        #: flips when the lease is taken or freed —, None for a light one; the instant its
        #: gate's max_defer_s runs out). Their blockers are not planned for them meanwhile.
        self.resting: dict[str, tuple[bool | None, float]] = {}
        #: The decision whose lanes ``_settle`` files (what ``_rest`` judges them by).
        self._decision: Decision | None = None
        #: Heavy lanes due and not started: when each became due (``_Lane.due_since``).
        self.heavy_due: dict[str, float] = {}
        #: The same as a heap (stale entries dropped when they come up): the earliest in O(1).
        self.heavy_due_heap: list[tuple[float, str]] = []
        #: Lanes with backlog as last filed (with the dirty ones: every lane that may have).
        self.backlogged: set[str] = set()
        if self.planning is Planning.FULL:
            return
        for rt in self.enabled:
            rt.notify = self.index.dirty.add
        self.index.dirty.update(rt.name for rt in self.enabled)

    # -- event queue ----------------------------------------------------------------------------
    def _push(self, t: float, kind: int, obj: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, obj))

    def _changed(self, t: float) -> None:
        if self.first_change is None:
            self.first_change = t

    def _grid(self, c: float) -> float:
        """The first poll at or after ``c`` on the grid that starts at the last decision."""
        td = self.last_decision
        k = max(1, math.ceil((c - td) / self.s.tick_s - _EPS))
        return td + k * self.s.tick_s

    def _next_poll(self) -> float:
        t = self.next_due
        if self.first_change is not None:
            t = min(t, self._grid(self.first_change))
        if self.trigger is not None:
            t = min(t, self._grid(self.trigger))
        return t

    # -- main loop ------------------------------------------------------------------------------
    def run(self, progress: Callable[[float, float], None] | None = None) -> SimRun:
        """Simulate to the horizon. ``progress(virtual seconds done, horizon)`` is called
        about every 1 % of the horizon, for runs long enough to want it."""
        # (No cyclic collection while it runs: it makes almost no cyclic garbage and
        # millions of short-lived objects; see core.collector.)
        with cyclic_gc_paused():
            return self._run(progress)

    def _run(self, progress: Callable[[float, float], None] | None) -> SimRun:
        horizon = self.s.horizon_s
        step = horizon / 100
        next_report = step
        self._decide(0.0)
        while True:
            if progress is not None and self.last_decision >= next_report:
                progress(self.last_decision, horizon)
                next_report = (self.last_decision // step + 1) * step
            t_ev = self.heap[0][0] if self.heap else math.inf
            t_poll = self._next_poll()
            if min(t_ev, t_poll) > horizon:
                break
            if t_ev <= t_poll:
                wake = False
                while self.heap and self.heap[0][0] == t_ev:
                    _, _, kind, obj = heapq.heappop(self.heap)
                    wake |= self._handle(kind, obj, t_ev)
                if wake and self.s.wake_on_release:
                    self._decide(t_ev)
            else:
                self._decide(t_poll)
            if self.decisions > MAX_DECISIONS:
                raise SimError(f"scenario {self.s.name!r}: more than {MAX_DECISIONS} decisions; "
                               f"shorten the horizon or lengthen the tick")
        self._finalize(horizon)
        return SimRun(
            scenario=self.s, variant=self.v, seed=self.seed,
            lanes={rt.name: rt.trace for rt in self.rts}, lease=self.lease_log,
            drained_at=self.drained_at, held_s=self.held_s, idle_due_s=self.idle_due_s,
            falsifier=self.falsifier, falsifier_episodes=self.falsifier_episodes,
            light_behind_light=self.light_behind_light, decisions=self.decisions,
            deferrals={reason.value: n for reason, n in sorted(self.deferrals.items())},
            expired_gates=self.expired_gates,
            yields=self.yields, starts=self.starts, startup_s=self.startup_s,
            pool_holds=self.pool_holds,
        )

    def _handle(self, kind: int, obj: Any, t: float) -> bool:
        """Apply one event; True if it wakes beat (a run ended)."""
        if kind == _ARRIVAL:
            self._arrive(obj, t)
            return False
        if kind == _STEP:
            return self._step(obj, t)
        if kind == _FAIL:
            self._end_heavy(obj, t, Outcome.FAILED)
            return True
        self._end_light(obj, t)
        return True

    def _arrive(self, a: Arrival, t: float) -> None:
        self.arrivals_left -= 1
        rt = self.by_name[a.lane]
        rt.pool.extend((rt.next_id + i, 0) for i in range(a.items))
        rt.next_id += a.items
        rt.backlog_changed(t)
        self._changed(t)

    # -- decisions ------------------------------------------------------------------------------
    def _observe_due(self, decision: Decision, t: float) -> None:
        by_name = self.by_name
        for name, view in decision.views.items():
            if view.in_flight:
                continue
            rt = by_name[name]
            if view.due:
                if rt.due_since is None:
                    rt.due_since = rt.onset(t)
                    if rt.heavy and not rt.in_pool:
                        self.heavy_due[name] = rt.due_since
                        heapq.heappush(self.heavy_due_heap, (rt.due_since, name))
            elif rt.due_since is not None:  # stopped being due without running
                rt.trace.starvation.append(t - rt.due_since)
                rt.due_since = None
                self.heavy_due.pop(name, None)

    def _idle(self, decision: Decision) -> bool:
        if self.lease is not None or self.pool_runs or self.arrivals_left:
            return False
        if any(v.due for v in decision.views.values() if v.spec.heavy):
            return False
        if any(self.by_name[name].heavy for name in self.resting):  # due, unplanned
            return False
        if self.planning is Planning.FULL:
            return not any(rt.has_backlog() for rt in self.enabled)
        # A lane's backlog changes only with a change the index hears of.
        maybe = self.backlogged | self.index.dirty | self.always
        return not any(self.by_name[name].has_backlog() for name in maybe)

    def _decide(self, t: float, observe_only: bool = False) -> Decision:
        plan, states = self._plan(t)
        decision = plan.decision
        self.decisions += 1
        self._observe_due(decision, t)
        if observe_only:
            return decision
        if self.rule is not None:
            self._publish(decision, states, t)
        if self.drained_at is None and self._idle(decision):
            self.drained_at = t
        self._track_gates(decision, t)
        chosen = self._choose(decision, plan)
        if decision.pool_grants:
            chosen += [g.lane for g in decision.pool_grants if g.lane not in chosen]
        if len(chosen) < len(plan.sends):
            plan = plan.only(chosen)
        self._write(plan)
        for name in chosen:
            rt = self.by_name[name]
            if rt.in_pool:
                self._start_pool_run(rt, plan.sends[name].task_id, t)
            elif rt.heavy:
                self._start_heavy(rt, plan.sends[name].task_id, t)
            else:
                self._start_light(rt, plan.sends[name].task_id, t)
        wait = self._settle(plan, t)
        self.next_due = math.inf if wait is None else t + max(wait, 1e-6)
        self.last_decision = t
        self.first_change = t if chosen else None
        self.trigger = self._triggers(t)
        return decision

    def _write(self, plan: Plan) -> None:
        """Beat writes the plan's records (and the simulation counts its deferrals)."""
        gated, by_name = self.blockers_of, self.by_name
        for name, rec in plan.changes.items():
            by_name[name].set_sched(rec)
            if name in gated:
                self._trigger_ats = None  # a gate's clock may have moved
        counts = self.deferrals
        for d in plan.new_deferrals:
            # Counted by reason (an enum's ``.value`` is a property, 0.3 µs a read: named
            # once, in the run's result).
            counts[d.reason] = counts.get(d.reason, 0) + 1
        self.expired_gates += len(plan.decision.expired_gates)

    def _publish(self, decision: Decision, states: dict[str, LaneState], t: float) -> None:
        """Beat publishes the pressure it computed with its tick (FairScheduler does too):
        on the lease from the lanes waiting for it (the default pool's), and on each pool's
        longest holder from that pool's waiting lanes. (The lease's is measured when a holder reads
        it: :class:`_Published`.)"""
        if self.lease is not None:
            self.published.append((t, _Published(decision, states, self.lease, t)))
        if self.pool_runs:
            for pool, pressure in pool_pressure(decision, states, self._holds(), t).items():
                self.pool_published.setdefault(pool, []).append((t, pressure))

    # -- which lanes a decision plans (schedproj.sim.index) --------------------------------------
    def _plan(self, t: float) -> tuple[Plan, dict[str, LaneState]]:
        """Plan a decision at ``t``: on every lane, or on those the due index names (the
        lanes due, changed, read always, a pool's holders and the waiting lanes' leaders;
        not the lease's holder, nor a gated lane at rest: see ``resting``) and the blockers
        of the gated lanes among them."""
        if self.planning is Planning.FULL:
            return self._plan_lanes(self.rts, t)
        index = self.index
        index.advance(t)
        focus = index.active | index.dirty
        if self.always:
            focus |= self.always
        focus.update(index.leaders(t))
        # Not the lease's holder: its view (in flight) decides nothing but the gates naming
        # it, and a gated lane planned brings its blockers below. (A pool's holders are: the
        # pool's pressure is measured on its longest holder's view.)
        focus.update(self.pool_runs)
        if self.resting:
            self._wake(focus, t)
        for gated in focus.intersection(self.gated_names):
            focus.update(self.blockers_of[gated])
        position = self.position
        lanes = [self.by_name[n] for n in sorted(focus, key=position.__getitem__)]
        plan, states = self._plan_lanes(lanes, t)
        if self.planning is Planning.CHECK:
            self._full = self._plan_lanes(self.rts, t)[0]
            check_plans(plan, self._full, self.lease, t, pressure=self.rule is not None,
                        heavy_resting=any(self.by_name[n].heavy for n in self.resting))
        return plan, states

    def _wake(self, focus: set[str], t: float) -> None:
        """Add to ``focus`` the resting gated lanes whose plan could differ from the one that
        put them to rest: changed (in ``focus``), a blocker planned (its view may have moved:
        a lane's view changes only with its records, its backlog or its next look, each of
        which plans it), the lease taken or freed (a heavy lane's record flips between a
        gate's deferral and a wait for the lease), or its gate's max_defer_s run out."""
        held = self.lease is not None
        blockers_of = self.blockers_of
        for name, (waits, until) in self.resting.items():
            if (name in focus or (waits is not None and waits != held)
                    or t + LOOK_SLACK_S >= until or not focus.isdisjoint(blockers_of[name])):
                focus.add(name)  # planned, so filed again (_file)

    def _plan_lanes(self, lanes: list[_Lane], t: float) -> tuple[Plan, dict[str, LaneState]]:
        # The states, the probes of the lanes ``rt.probed`` (``rt.probe()``) and the specs in
        # one walk (a decision plans two or three lanes: three comprehensions cost more).
        states: dict[str, LaneState] = {}
        probes: dict[str, int] = {}
        specs: list[LaneSpec] = []
        for rt in lanes:
            name = rt.name
            states[name] = rt.state()
            specs.append(rt.spec)
            if rt.heavy:
                probes[name] = len(rt.pool)
            elif rt.fed:
                probes[name] = int(rt.version != rt.seen)
        # TickInput(states=, lease=, probes=) without the frozen dataclass __init__.
        tick = evolve(self._tick, states=states, lease=self.lease, probes=probes)
        if self.pool_table is not None:
            # Every pool, and per pool the lane holding each busy slot (k for k slots).
            holders: dict[str, list[str]] = {}
            for name, run in self.pool_runs.items():
                holders.setdefault(run.rt.spec.pool, []).extend([name] * run.rt.spec.slots)
            tick = TickInput(states=states, lease=self.lease, probes=probes,
                             pools=self.pool_table, holders=holders)
        plan = plan_tick(specs, tick,
                         t, profile=self.s.profile, policy=self.v.policy,
                         start_deadline_s=defaults.START_DEADLINE_S,
                         task_id=lambda n: f"{n}#{self.by_name[n].started}")
        return plan, states

    def _settle(self, plan: Plan, t: float) -> float | None:
        """File every lane planned or changed at ``t`` in the due index; return the seconds
        until some lane falls due by time (the plan's ``next_due_in_s`` over every lane)."""
        wait = plan.next_due_in_s
        if self.planning is Planning.FULL:
            return wait
        index = self.index
        # Lanes planned always need no filing: the plan's own next_due_in_s covers them; a
        # waiting lane planned as a leader and unchanged stays where it is. (The changed set
        # is filed in place and emptied: filing changes no lane's records, so it stays put.)
        self._decision = plan.decision
        filed, waiting = index.dirty, index.waiting
        for name in plan.states:  # (not ``keys() - keys()``: that walks every waiting lane)
            if name not in waiting:
                filed.add(name)
        if self.always:
            filed -= self.always
        by_name, file = self.by_name, self._file
        for name in filed:
            file(by_name[name], t)
        filed.clear()
        wake = index.next_wake()
        if wake is not None:
            rest = max(0.0, wake - t)
            wait = rest if wait is None else min(wait, rest)
        if self.planning is Planning.CHECK:
            full = self._full.next_due_in_s
            if wait != full:
                raise SimError(f"t={t}: the due index wakes after {wait} s, planning every "
                               f"lane after {full} s")
        return wait

    def _file(self, rt: _Lane, t: float) -> None:
        """The lane's next look (``dueindex.next_look``, or sooner when its due-check reports
        backlog: the simulator knows every change of a queue, so it files the lane by the
        due time its backlog gives, as a worker files a finished run through ``due_at``), the
        instant it falls due by time, and whether it only waits for the lease."""
        spec, state, name, heavy = rt.spec, rt.state(), rt.name, rt.heavy
        # (rt.has_backlog() and rt.probe(), inline: a decision files a lane or two.)
        queued = len(rt.pool) if heavy else int(rt.version != rt.seen)
        if queued:
            self.backlogged.add(name)
        else:
            self.backlogged.discard(name)
        resting, index = self.resting, self.index
        if resting:
            resting.pop(name, None)
        if heavy:
            if self._file_holder(name, t):
                return
        elif is_in_flight(state, t):
            index.file(name, next_look(spec, state, t), None, t)
            return
        # As ``pipeline.seconds_until_next_due`` computes it for an idle lane not due yet:
        # with the backlog the lane's view sees (its due-check's, else its record's).
        probe = queued if heavy or rt.fed else None  # (rt.probed)
        wake = due_at(spec, state, t, max(0, probe if probe is not None else state.run.backlog))
        # A lane with a due-check is due by what it reports (the wake); another by its record,
        # as the index files it (the earlier of the two, should they ever differ).
        look = wake if probe is not None else min(next_look(spec, state, t), wake)
        if look > t + LOOK_SLACK_S:
            index.file(name, look, wake, t)
            return
        if spec.gates:
            rest = self._rest(rt, state, t)
            if rest is not None:
                index.file(name, math.inf, None, t)  # neither active nor waiting
                resting[name] = rest
                return
        index.file(name, look, wake, t, self._rank(rt, state, t))

    def _file_holder(self, name: str, t: float) -> bool:
        """File a heavy lane holding a slot of its pool or the lease as such (True), or say it
        holds neither (False)."""
        index = self.index
        if name in self.pool_runs:
            # A pool's holder: planned while it holds. Filed once (refiling an active lane
            # moves nothing: no look or wake of it is pending).
            if name not in index.active:
                index.file(name, t, None, t)
            return True
        lease = self.lease
        if lease is not None and lease.lane == name:
            # The lease's holder: not planned while it holds (its run's end changes it).
            index.file(name, math.inf, None, t)
            return True
        return False

    def _rest(self, rt: _Lane, state: LaneState, t: float) -> tuple[bool | None, float] | None:
        """Whether a due gated lane just planned may rest (see ``resting``): the decision
        deferred it and planning it again would write nothing — deferred by the same gate, or
        (heavy, the lease held) waiting for the lease, its streak going on, behind a gate that
        blocks (so it does not press the holder) — until a blocker moves, the lease is taken or
        freed, or the gate's max_defer_s runs out. None: it stays planned at every decision
        (no deferral, a gate that lapsed, a retry pending or a last run in the future, which
        a decision may see change by time alone, a lane of a pool beyond the default, a
        calendar lane)."""
        decision = self._decision
        if decision is None:
            return None
        name, spec, run = rt.name, rt.spec, state.run
        view = decision.views.get(name)
        deferral = state.sched.deferral
        if (view is None or not view.due or view.in_flight or deferral is None or rt.in_pool
                or name in self.always or retry_at(spec, state, t) != NEVER
                or (run.last_run_at is not None and run.last_run_at > t)
                or (run.last_run_at is None and run.since is not None and run.since > t)):
            return None
        mine = [d for d in decision.deferred if d.lane == name]
        if len(mine) != 1 or any(lane == name for lane, _ in decision.expired_gates):
            return None
        legacy = self.v.policy is Policy.REGISTRY
        gate, lapsed = gates.evaluate(view, decision.gate_views, deferral, t, legacy=legacy)
        if gate is None or lapsed:
            return None
        waits = mine[0].reason in LEASE_WAITS
        if waits:
            # Waiting for the lease: only while it was held (not lost to a winner).
            if not spec.heavy or self.lease is None or deferral.reason not in LEASE_WAITS:
                return None
        elif (mine[0].reason, mine[0].blocker) != (gate.reason, gate.blocker):
            return None
        clock = deferral.gate_clock(gate.blocker)
        until = (clock + gate.max_defer_s
                 if gate.max_defer_s is not None and clock is not None and not legacy
                 else math.inf)
        return (waits if spec.heavy else None), until

    def _rank(self, rt: _Lane, state: LaneState, t: float) -> Rank | None:
        """A due heavy lane recorded as waiting for the lease that planning may skip (the
        planner would defer it again, with the same streak, while it stays due): its rank,
        which moves only with time. None for a lane that must be planned: gated or read
        always, not recorded waiting, with a retry pending (its window may close, ending its
        due), or a last run in the future (its ratio would not follow the clock)."""
        spec, run = rt.spec, state.run
        if (not spec.heavy or spec.gates or rt.name in self.always
                or not waits_for_lease(state) or retry_at(spec, state, t) != NEVER):
            return None
        if run.last_run_at is not None and run.last_run_at > t:
            return None
        if run.last_run_at is None and run.since is not None and run.since > t:
            return None
        last = effective_last_run(state, spec.cadence_s, t, spec.due_ratio)
        return Rank(0 if spec.priority0 else 1, spec.cadence_s, last, spec.order, spec.name,
                    spec.pool, spec.weight)

    def _track_gates(self, decision: Decision, t: float) -> None:
        """When did a light lane's gate stop deferring it? (For the dispatch delay.)"""
        if not (decision.also_dispatched or decision.deferred):
            return
        expired = dict(decision.expired_gates)
        for name in decision.also_dispatched:
            rt = self.by_name[name]
            if not rt.gated:
                continue
            rt.gated = False
            old = rt.sched.deferral
            gate = expired.get(name)
            if gate is not None and gate.max_defer_s is not None and old is not None:
                rt.gate_clear = old.behind_blocker_since + gate.max_defer_s
            else:
                # Gates change only when state changes: the first change since the last
                # decision bounds the moment it cleared from below (exact when changes are
                # more than a tick apart).
                rt.gate_clear = self.first_change if self.first_change is not None else t
        for d in decision.deferred:
            rt = self.by_name[d.lane]
            if not rt.heavy and d.reason not in LEASE_WAITS:
                rt.gated = True

    def _choose(self, decision: Decision, plan: Plan) -> list[str]:
        """Which lanes this decision sends: all of ``dispatched`` with the second pass (the
        plan's sends, in that order), else the single winner of the old
        one-winner-per-poll rule."""
        if self.v.second_pass:
            return list(plan.sends)
        if decision.winner is not None:
            for name in decision.also_dispatched:
                rt = self.by_name[name]
                rt.trace.falsifier += 1
                self.falsifier += 1
                if not rt.fals_flag:
                    rt.fals_flag = True
                    rt.trace.falsifier_episodes += 1
                    self.falsifier_episodes += 1
            return [decision.winner]
        if decision.also_dispatched:
            best = pick((decision.views[n] for n in decision.also_dispatched), self.v.policy)
            assert best is not None
            self.light_behind_light += len(decision.also_dispatched) - 1
            return [best.name]
        return []

    def _triggers(self, t: float) -> float | None:
        """The next instant a poll would see something new without any state change: a
        gate's ``max_defer_s`` running out. (A failed lane's retry is a due time like any
        other: the plan's ``next_due_in_s`` wakes beat for it, as it does beat.) The instants
        move only with a gated lane's record: kept, sorted, until one changes."""
        ats = self._trigger_ats
        if ats is None:
            ats = self._trigger_ats = sorted(
                [d.behind_blocker_since + gate.max_defer_s
                 for rt in self.gated if (d := rt.sched.deferral) is not None
                 for gate in rt.spec.gates
                 if gate.max_defer_s is not None and gate.blocker == d.blocker])
        i = bisect.bisect_right(ats, t)
        return ats[i] if i < len(ats) else None

    # -- heavy runs -----------------------------------------------------------------------------
    def _dispatched(self, rt: _Lane, t: float) -> None:
        rt.trace.dispatches += 1
        rt.trace.starts.append(t)
        if rt.due_since is not None:
            rt.trace.starvation.append(t - rt.due_since)

    def _start_heavy(self, rt: _Lane, task_id: str, t: float) -> None:
        # Work conservation: how long the lease sat free while some heavy lane was due.
        dues = ([x.due_since for x in self.enabled
                 if x.heavy and not x.in_pool and x.due_since is not None]
                if self.planning is Planning.FULL else self._earliest_heavy_due())
        if dues:
            self.idle_due_s += max(0.0, t - max(self.lease_free_since, min(dues)))
        self.fence += 1
        self.published = []
        # LeaseView(lane=, token=, fence=, granted_at=, started_at=, task_id=), built fast
        # (core.frozen): one per heavy run.
        self.lease = evolve(_NO_LEASE, lane=rt.name, token=f"sim-{self.fence}",
                            fence=self.fence, granted_at=t, started_at=t, task_id=task_id)
        self.lease_start = t
        self._begin_heavy(rt, task_id, t)

    def _start_pool_run(self, rt: _Lane, task_id: str, t: float) -> None:
        """A grant of ``rt.spec.slots`` slots of the lane's pool (``Decision.pool_grants``):
        its run holds them, fenced like a lease, until it ends."""
        self.fence += 1
        self.pool_runs[rt.name] = self._begin_heavy(rt, task_id, t)

    def _begin_heavy(self, rt: _Lane, task_id: str, t: float) -> _HeavyRun:
        """A heavy run starts at ``t`` on fence ``self.fence``: recorded, marked started."""
        waited = t - rt.due_since if rt.due_since is not None else 0.0
        self.starts.append((rt.name, t, rt.ratio_at(t), waited))
        self._dispatched(rt, t)
        rt.due_since = None
        self.heavy_due.pop(rt.name, None)
        bound = defaults.LEASE_TTL_S + defaults.HEAVY_TIME_LIMIT_S
        rt.set_run(lifecycle.started(rt.run, task_id=task_id, now=t, running_until=t + bound,
                                     fence=self.fence))
        run = _HeavyRun(rt, task_id, rt.started, t, self.fence)
        rt.started += 1
        self.startup_s += rt.dur.run(run.index)
        self._schedule_step(run, t, rt.dur.run(run.index))
        return run

    def _earliest_heavy_due(self) -> list[float]:
        """[When the heavy lane due longest became due], or [] if none is due."""
        heap, due = self.heavy_due_heap, self.heavy_due
        while heap and due.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return [heap[0][0]] if heap else []

    def _holds(self) -> dict[str, LeaseView]:
        """Each pool's holds as its runs know them: lane -> its slot lease (its fence)."""
        return {name: LeaseView(lane=name, token=f"sim-{run.fence}", fence=run.fence,
                                granted_at=run.start, started_at=run.start,
                                task_id=run.task_id)
                for name, run in self.pool_runs.items()}

    def _seen_pressure(self, run: _HeavyRun, t: float) -> Pressure | None:
        """The pressure the holder knows at ``t``: what beat had published (on the lease, or
        on the run's pool) by the holder's last renewal (every third of the lease TTL since
        the start, as LeaseRenewer renews the lease and a slot lease)."""
        every = defaults.LEASE_TTL_S / 3
        renewed = run.start + math.floor((t - run.start) / every) * every
        if renewed <= run.start:
            return None
        if not run.rt.in_pool:
            for at, lazy in reversed(self.published):
                if at <= renewed:
                    return lazy.pressure()
            return None
        for at, pressure in reversed(self.pool_published.get(run.rt.spec.pool, [])):
            if at <= renewed:
                return pressure
        return None

    def _others_due(self, rt: _Lane, t: float) -> bool:
        """Is another heavy lane due at ``t``, by the due-time rule beat uses (cadence at its
        due ratio, backlog its due-check reports, never run, or a retry)? Asked of the lanes
        the due index says may be due by ``t``: a lane looked at later is not."""
        if self.planning is Planning.FULL:
            lanes: Iterable[_Lane] = self.enabled
        else:
            index = self.index
            index.advance(t)
            names = chain(index.waiting, index.active, index.dirty, self.always, self.resting)
            lanes = (self.by_name[name] for name in names)
        pool = rt.spec.pool
        return any(x is not rt and x.heavy and x.spec.pool == pool
                   and due_at(x.spec, x.state(), t, x.probe()) <= t for x in lanes)

    def _schedule_step(self, run: _HeavyRun, t: float, duration: float) -> None:
        if run.rt.dur.fails(run.index, run.step):
            self._push(t + duration / 2, _FAIL, run)
        else:
            self._push(t + duration, _STEP, run)

    def _step(self, run: _HeavyRun, t: float) -> bool:
        """A step of a heavy run ended: apply its batch, then go on, yield or finish."""
        rt = run.rt
        if run.chunk is not None:
            self._apply_chunk(run, t)
        if run.pos >= len(rt.pool):
            self._end_heavy(run, t, Outcome.COMPLETED)
            return True
        reason = yield_reason(held_s=t - run.start, hold_cap_s=self.s.hold_cap_s,
                              pressure=self._seen_pressure(run, t) if self.rule else None,
                              rule=self.rule, now=t, fence=run.fence)
        if reason is not None:  # should_yield() before the next batch
            self._end_heavy(run, t, Outcome.YIELDED, reason)
            return True
        chunk = rt.pool[run.pos:run.pos + rt.m.batch]
        have = rt.producer.done if rt.producer is not None else 0
        done: list[int] = []
        skipped: list[tuple[int, int]] = []
        duration = 0.0
        for item in chunk:
            if item[1] <= have:
                done.append(item[0])
                duration += rt.dur.item(item[0])
            else:
                skipped.append(item)
                duration += rt.m.skip_s
        run.chunk = (len(chunk), done, skipped)
        run.step += 1
        self._schedule_step(run, t, duration)
        return False

    def _apply_chunk(self, run: _HeavyRun, t: float) -> None:
        rt = run.rt
        assert run.chunk is not None
        size, done, skipped = run.chunk
        run.chunk = None
        rt.pool[run.pos:run.pos + size] = skipped
        run.pos += len(skipped)
        rt.done += len(done)
        rt.trace.items_done += len(done)
        if done:
            for target in rt.m.feeds:
                other = self.by_name[target]
                if other.heavy:
                    other.pool.extend((other.next_id + i, 0) for i in range(len(done)))
                    other.next_id += len(done)
                else:
                    other.version += 1
                other.backlog_changed(t)
        rt.backlog_changed(t)
        self._changed(t)

    def _end_heavy(self, run: _HeavyRun, t: float, outcome: Outcome,
                   why: str = HOLD_CAP) -> None:
        rt = run.rt
        failed = outcome is Outcome.FAILED
        if outcome is Outcome.YIELDED and not rt.pool:
            outcome = Outcome.COMPLETED
        if outcome is Outcome.YIELDED:
            self.yields.append((t, rt.name, why, self._others_due(rt, t)))
        # A failed run never reported its backlog.
        rt.set_run(lifecycle.finished(
            rt.run, task_id=run.task_id, outcome=outcome,
            reason=why if outcome is Outcome.YIELDED else
            ("sim: step failed" if failed else None),
            backlog=0 if failed else len(rt.pool), now=t, fence=run.fence))
        rt.trace.runs.append((run.start, t, _OUTCOME_TEXT[outcome]))
        rt.run_ended(t)
        if rt.in_pool:
            del self.pool_runs[rt.name]
            self.pool_holds.append((rt.spec.pool, rt.name, rt.spec.slots, run.start, t))
        else:
            self.lease = None
            self.held_s += t - run.start
            self.lease_log.append((rt.name, run.start, t))
            self.lease_free_since = t
        self._changed(t)

    # -- light runs -----------------------------------------------------------------------------
    def _start_light(self, rt: _Lane, task_id: str, t: float) -> None:
        eligible = rt.due_since if rt.due_since is not None else t
        if rt.gate_clear is not None:
            eligible = max(eligible, rt.gate_clear)
        delay = t - eligible
        # Below a microsecond is float noise (a lane falls due exactly when beat polls).
        rt.trace.light_delays.append(delay if delay > 1e-5 else 0.0)
        rt.gate_clear = None
        rt.fals_flag = False
        self._dispatched(rt, t)
        rt.due_since = None
        rt.set_run(lifecycle.started(rt.run, task_id=task_id, now=t,
                                     running_until=t + defaults.LIGHT_TIME_LIMIT_S))
        index = rt.started
        rt.started += 1
        failed = rt.dur.fails(index, 0)
        duration = rt.dur.run(index)
        self._push(t + (duration / 2 if failed else duration), _LIGHT_END,
                   _LightRun(rt, task_id, index, t, rt.version, failed))

    def _end_light(self, run: _LightRun, t: float) -> None:
        rt = run.rt
        outcome = Outcome.FAILED if run.failed else Outcome.COMPLETED
        if not run.failed:
            rt.seen = run.snapshot
        rt.set_run(lifecycle.finished(
            rt.run, task_id=run.task_id, outcome=outcome,
            reason="sim: run failed" if run.failed else None, backlog=0, now=t))
        rt.trace.runs.append((run.start, t, _OUTCOME_TEXT[outcome]))
        rt.run_ended(t)
        self._changed(t)

    # -- the end --------------------------------------------------------------------------------
    def _finalize(self, horizon: float) -> None:
        self._decide(horizon, observe_only=True)
        for rt in self.rts:
            if rt.due_since is not None:
                rt.trace.starvation.append(horizon - rt.due_since)
            rt.close_segment(horizon)
            rt.trace.final_backlog = rt.probe()
        for name, run in self.pool_runs.items():
            spec = run.rt.spec
            self.pool_holds.append((spec.pool, name, spec.slots, run.start, horizon))
        if self.lease is not None:
            self.held_s += horizon - self.lease_start
            self.lease_log.append((self.lease.lane, self.lease_start, horizon))
        else:
            dues = [x.due_since for x in self.enabled
                    if x.heavy and not x.in_pool and x.due_since is not None]
            if dues:
                self.idle_due_s += max(0.0, horizon - max(self.lease_free_since, min(dues)))


def simulate(scenario: Scenario, variant: Variant, seed: int | str = 1,
             progress: Callable[[float, float], None] | None = None,
             planning: Planning | str = Planning.INDEX) -> SimRun:
    """Run one scenario under one variant. Deterministic for a given seed; ``progress`` as
    in :meth:`Simulation.run`; ``planning`` says which lanes a decision plans (the same
    output either way: :class:`~schedproj.sim.index.Planning`)."""
    return Simulation(scenario, variant, seed, planning).run(progress)


def run_many(scenario: Scenario, variants: tuple[Variant, ...], seed: int | str = 1
             ) -> Mapping[str, SimRun]:
    """The same scenario and seed under every variant, by label."""
    return {v.label: simulate(scenario, v, seed) for v in variants}


__all__ = ["LaneTrace", "SimRun", "Simulation", "run_many", "simulate"]
