"""Property tests of ``pipeline.decide`` over random lane sets, states, leases and profiles.

The expectations are computed by a small oracle written from DESIGN.md (sections 1, 3 and 6),
not by calling the functions under test.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedproj.core.deferrals import Deferral
from schedproj.core.families import member_spec
from schedproj.core.lanes import (
    DeferralReason,
    DeploymentClass,
    Gate,
    GateCondition,
    LaneKind,
    LaneSpec,
    Profile,
)
from schedproj.core.pipeline import Decision, decide
from schedproj.core.records import LaneState, LeaseView, RunRecord, SchedRecord

PROPERTY = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

NAMES = ("backup", "backfill", "summary", "dream", "golden-path", "kb-sync", "heartbeat", "a")
CADENCES = (1.0, 60.0, 600.0, 1800.0, 3600.0, 86400.0)
TASK_IDS = ("t-1", "t-2", "t-3")
GATE_REASONS = (DeferralReason.DEPENDENCY, DeferralReason.GOLDEN_PATH_DEPENDENCY)
PICK_REASONS = (DeferralReason.LEASE_HELD, DeferralReason.BACKPRESSURE)


# -- strategies --------------------------------------------------------------------------------


# Strategies are built once: building them inside a draw costs more than drawing.
KINDS = st.sampled_from(tuple(LaneKind))
CONDITIONS = st.sampled_from(tuple(GateCondition))
DEPLOYMENTS = st.sampled_from(tuple(DeploymentClass))
PROFILES = st.sampled_from(tuple(Profile))
ALL_REASONS = st.sampled_from(tuple(DeferralReason))
GATE_REASON = st.sampled_from(GATE_REASONS)
CADENCE = st.sampled_from(CADENCES)
MAX_DEFER = st.sampled_from((None, 30.0, 600.0))
BACKLOG = st.sampled_from((0, 0, 0, 1, 7, -1))
ONE_IN_4 = st.integers(0, 3)
ONE_IN_10 = st.integers(0, 9)
OFFSET = st.integers(-120, 120)
AGO = st.integers(-5, 3 * 86400)
STREAK = st.integers(0, 5000)
NOW_S = st.integers(min_value=10**6, max_value=2 * 10**9)
MAYBE_ID = st.sampled_from((None, *TASK_IDS))
LANE_NAMES = st.lists(st.sampled_from(NAMES), min_size=1, max_size=7, unique=True)
#: A lane family ("fam") drawn with a few members, named fam[<key>].
FAMILY = "fam"
MEMBER_KEYS = st.lists(st.sampled_from(("k1", "k2", "k3", "k4")), max_size=4, unique=True)
JITTER = st.sampled_from((0.0, 0.2, 0.5))
# Blockers may name lanes absent from the set ("ghost" or a NAMES entry not drawn), the family
# (blocks while any member does) or one member.
BLOCKERS = st.lists(st.sampled_from((*NAMES, "ghost", FAMILY, "fam[k1]")), max_size=2,
                    unique=True)
MAYBE_BLOCKER = st.sampled_from((None, *NAMES, "ghost", FAMILY))
PROBES = st.dictionaries(st.sampled_from(NAMES), st.integers(0, 5), max_size=3)
UNREADABLE = st.lists(st.sampled_from(NAMES), unique=True, max_size=2)


def lane_spec(draw: st.DrawFn, name: str) -> LaneSpec:
    kind = draw(KINDS)
    gates = tuple(
        Gate(blocker=b, when=draw(CONDITIONS), reason=draw(GATE_REASON),
             max_defer_s=draw(MAX_DEFER))
        for b in draw(BLOCKERS) if b != name
    )
    return LaneSpec(
        name=name,
        task_name=f"tasks.{name}",
        kind=kind,
        cadence_s=draw(CADENCE),
        priority0=kind is LaneKind.HEAVY and draw(ONE_IN_4) == 0,
        deployment=draw(DEPLOYMENTS),
        gates=gates,
        order=draw(ONE_IN_4),  # a small range, so ties happen
        backlog_driven=draw(ONE_IN_4) == 0,
    )


@st.composite
def lane_specs(draw: st.DrawFn) -> list[LaneSpec]:
    """1-7 lanes with unique names; priority0 only on heavy lanes; and up to four members of
    a lane family (one spec, per-key jitter of the due ratio), ranked like any lane."""
    lanes = [lane_spec(draw, name) for name in draw(LANE_NAMES)]
    template = lane_spec(draw, FAMILY)
    template = LaneSpec(**{**template.__dict__, "priority0": False, "family": FAMILY,
                           "gates": tuple(g for g in template.gates
                                          if not g.blocker.startswith(FAMILY))})
    jitter = draw(JITTER)
    return lanes + [member_spec(template, jitter, key) for key in draw(MEMBER_KEYS)]


def lane_state(draw: st.DrawFn, spec: LaneSpec, now: float) -> LaneState:
    """A lane's state: never run or last run up to three days ago (a little clock skew too),
    an optional in-flight message, run bound, deferral streak (often behind one of its own
    gates' blockers, so max_defer_s comes into play); rarely paused."""
    never = draw(ONE_IN_4) == 0
    ago = draw(AGO)
    running = draw(ONE_IN_4) == 0
    run = RunRecord(
        last_run_at=None if never else now - ago,
        last_task_id=draw(MAYBE_ID),
        backlog=draw(BACKLOG),
        running_task_id=draw(MAYBE_ID) if running else None,
        running_until=now + draw(OFFSET) if running else None,
        # A family member that never ran has the time it was added (or a future one: the
        # adding host's clock ahead); it then counts as just due from then, not as ∞.
        since=(now - draw(AGO) if draw(st.booleans()) else now + draw(OFFSET))
        if never and spec.family is not None and draw(st.booleans()) else None,
    )
    deferral = None
    if draw(st.booleans()):
        blocker = draw(MAYBE_BLOCKER)
        reason = draw(ALL_REASONS)
        if spec.gates and draw(st.booleans()):
            own_gate = spec.gates[draw(st.integers(0, len(spec.gates) - 1))]
            blocker = own_gate.blocker
            reason = own_gate.reason if draw(st.booleans()) else reason
        since = now - draw(STREAK)
        # Sometimes the current blocker took over within the streak: its gate's clock (for
        # max_defer_s) runs from then, not from the streak's start.
        took_over = min(since + draw(STREAK), now) if draw(st.booleans()) else None
        deferral = Deferral(lane=spec.name, reason=reason, blocker=blocker, since=since,
                            blocker_since=took_over)
    inflight = draw(MAYBE_ID)
    sched = SchedRecord(
        inflight_task_id=inflight,
        inflight_deadline=None if inflight is None else now + draw(OFFSET),
        dispatches=draw(ONE_IN_4),
        deferral=deferral,
        paused=draw(ONE_IN_10) == 0,
    )
    return LaneState(run=run, sched=sched)


@dataclass
class Scenario:
    lanes: list[LaneSpec]
    states: dict[str, LaneState]
    lease: LeaseView | None
    now: float
    profile: Profile
    probes: dict[str, int] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)

    def decide(self, lanes: list[LaneSpec] | None = None) -> Decision:
        return decide(self.lanes if lanes is None else lanes, self.states, self.lease, self.now,
                      self.profile, probes=self.probes, unreadable=self.unreadable)

    def spec(self, name: str) -> LaneSpec:
        return next(s for s in self.lanes if s.name == name)

    def state(self, name: str) -> LaneState:
        return self.states.get(name, LaneState())


@st.composite
def scenarios(draw: st.DrawFn, lease: bool | None = None) -> Scenario:
    """Lanes, their states (some lanes have none), a lease or not, now, profile, probes and
    unreadable lanes. ``lease`` forces a lease (True) or none (False)."""
    lanes = draw(lane_specs())
    now = float(draw(NOW_S))
    states = {s.name: lane_state(draw, s, now) for s in lanes if draw(ONE_IN_4) != 0}
    holders = [s.name for s in lanes if s.kind is LaneKind.HEAVY] + ["ghost"]
    has_lease = draw(st.booleans()) if lease is None else lease
    holder = holders[draw(st.integers(0, len(holders) - 1))] if has_lease else None
    return Scenario(
        lanes=lanes,
        states=states,
        lease=None if holder is None else LeaseView(lane=holder, token="tok", fence=3,
                                                     granted_at=now - 10),
        now=now,
        profile=draw(PROFILES),
        probes=draw(PROBES),
        unreadable=draw(UNREADABLE),
    )


# -- the oracle --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fact:
    """What DESIGN.md says about one lane at one instant."""

    spec: LaneSpec
    ratio: float
    due: bool
    behind: bool
    in_flight: bool

    @property
    def rank(self) -> tuple[int, float, int, str]:
        """Priority-0 first, then the largest ratio, then declared order, then name."""
        return (0 if self.spec.priority0 else 1, -self.ratio, self.spec.order, self.spec.name)


def enabled(sc: Scenario, spec: LaneSpec) -> bool:
    """Lanes the decision may consider: allowed by the profile, not paused, readable."""
    if sc.profile is Profile.CLOUD and spec.deployment is DeploymentClass.LOCAL_ONLY:
        return False
    return spec.name not in sc.unreadable and not sc.state(spec.name).sched.paused


def light_in_flight(state: LaneState, now: float) -> bool:
    """A run that started and has not ended, within its heartbeat-refreshed bound, whatever
    the sched record says (after a state loss it may be gone); else a dispatched message not
    yet started (its id is not the run record's) within its start deadline."""
    sched, run = state.sched, state.run
    if (run.running_task_id is not None and run.running_task_id != run.last_task_id
            and run.running_until is not None and now < run.running_until):
        return True
    if sched.inflight_task_id is None or sched.inflight_task_id in (run.last_task_id,
                                                                     run.running_task_id):
        return False
    return sched.inflight_deadline is not None and now < sched.inflight_deadline


def fact(sc: Scenario, spec: LaneSpec) -> Fact:
    state = sc.state(spec.name)
    last, since = state.run.last_run_at, state.run.since
    if last is None and since is not None:
        # A family member that never ran is just due (at its due ratio, or 1) when added: as
        # if it ran that many cadences before.
        assumed = min(since, sc.now) - spec.cadence_s * max(1.0, spec.due_ratio)
        ratio = (sc.now - assumed) / spec.cadence_s
    elif last is not None and last - sc.now > spec.cadence_s:
        # A worker's clock more than one cadence ahead, with no dispatch of beat's to cap it:
        # the time is not trusted and the lane counts as having run its due ratio's worth of
        # cadences ago: just due now (issue 19, item 14).
        assumed = sc.now - spec.cadence_s * spec.due_ratio
        ratio = (sc.now - assumed) / spec.cadence_s
    else:
        ratio = math.inf if last is None else max(0.0, sc.now - last) / spec.cadence_s
    probe = sc.probes.get(spec.name)
    backlog = state.run.backlog if probe is None else probe
    if spec.backlog_driven:
        due = backlog > 0 or (last is None and probe is None)
    else:
        due = ratio >= spec.due_ratio or backlog > 0
    if spec.kind is LaneKind.HEAVY:
        in_flight = sc.lease is not None and sc.lease.lane == spec.name
    else:
        in_flight = light_in_flight(state, sc.now)
    return Fact(spec, ratio, due, backlog > 0 or last is None, in_flight)


def facts(sc: Scenario) -> dict[str, Fact]:
    return {s.name: fact(sc, s) for s in sc.lanes if enabled(sc, s)}


def gate_facts(sc: Scenario, known: Mapping[str, Fact]) -> dict[str, Fact]:
    """What gates see: ``known`` plus the lanes left out of the decision (paused, unreadable)
    that the profile enables. Those never count as due, yet block while they run; a light one
    whose record is missing because it was unreadable may be running, so it counts as running."""
    out = dict(known)
    for spec in sc.lanes:
        if spec.name in known or (sc.profile is Profile.CLOUD
                                  and spec.deployment is DeploymentClass.LOCAL_ONLY):
            continue
        f = fact(sc, spec)
        unknown = (spec.kind is LaneKind.LIGHT and spec.name in sc.unreadable
                   and spec.name not in sc.states)
        out[spec.name] = Fact(spec, f.ratio, False, f.behind, f.in_flight or unknown)
    return out


def family_fact(known: Mapping[str, Fact], family: str) -> Fact | None:
    """A gate naming a family blocks while a member would block it as a lane: ``known`` is
    what gates see (:func:`gate_facts`), so a paused member that runs counts, as a paused
    blocker that runs does (docs/guarantees.md)."""
    members = [f for f in known.values() if f.spec.family == family]
    if not members:
        return None
    hot = any(f.due and f.behind for f in members)
    busy = any(f.due or f.in_flight for f in members)
    return Fact(members[0].spec, 0.0, hot, hot, busy)


def gate_blocks(gate: Gate, blocker: Fact | None) -> bool:
    if blocker is None:  # not a lane here, or disabled: never blocks
        return False
    if gate.when is GateCondition.DUE_AND_BEHIND:
        return blocker.due and blocker.behind
    return blocker.due or blocker.in_flight


def gate_clock(previous: Deferral | None, blocker: str) -> float | None:
    """Since when the gate on ``blocker`` has deferred the lane, if the current streak is that
    gate's: from the moment that blocker took over within the streak, else from the streak's
    start (which never slides). A streak behind the lease or another blocker is not its."""
    if previous is None:
        return None
    owner = previous.gate_blocker
    if owner is None and previous.reason not in PICK_REASONS:
        owner = previous.blocker
    if owner != blocker:
        return None
    return previous.since if previous.blocker_since is None else previous.blocker_since


def holding_gate(sc: Scenario, name: str,
                 known: Mapping[str, Fact]) -> tuple[Gate | None, list[Gate]]:
    """DESIGN §3 promise 5 and the gate's bound: the first gate (in declared order) whose
    blocker blocks now — due-and-behind, or due-or-running — and whose own clock has not yet
    reached its ``max_defer_s``; and the blocking gates passed over because it had."""
    seen = gate_facts(sc, known)
    previous = sc.state(name).sched.deferral
    lapsed: list[Gate] = []
    for gate in sc.spec(name).gates:
        if not gate_blocks(gate, seen.get(gate.blocker, family_fact(seen, gate.blocker))):
            continue
        clock = gate_clock(previous, gate.blocker)
        if gate.max_defer_s is not None and clock is not None and (
                sc.now - clock >= gate.max_defer_s):
            lapsed.append(gate)
            continue
        return gate, lapsed
    return None, lapsed


def judged_by_gates(sc: Scenario, known: Mapping[str, Fact]) -> dict[str, Gate]:
    """The due, idle lanes a gate holds back, with that gate: light lanes always, heavy lanes
    only while the lease is free (a held lease defers them before any gate is looked at)."""
    held: dict[str, Gate] = {}
    for name, f in candidates(known).items():
        if f.spec.kind is LaneKind.HEAVY and sc.lease is not None:
            continue
        gate, _ = holding_gate(sc, name, known)
        if gate is not None:
            held[name] = gate
    return held


def gated(sc: Scenario, name: str, known: Mapping[str, Fact]) -> bool:
    """Some gate of the lane blocks right now (ignoring max_defer_s, which can only release)."""
    seen = gate_facts(sc, known)
    return any(gate_blocks(g, seen.get(g.blocker, family_fact(gate_facts(sc, known), g.blocker)))
               for g in sc.spec(name).gates)


def candidates(known: Mapping[str, Fact]) -> dict[str, Fact]:
    return {n: f for n, f in known.items() if f.due and not f.in_flight}


def gate_deferred(sc: Scenario, known: Mapping[str, Fact]) -> set[str]:
    """The lanes the oracle's gates hold back (never the decision's own say-so)."""
    return set(judged_by_gates(sc, known))


def survivors(sc: Scenario, known: Mapping[str, Fact]) -> dict[str, Fact]:
    """Due, idle heavy lanes that no gate defers."""
    held = gate_deferred(sc, known)
    return {n: f for n, f in candidates(known).items()
            if f.spec.kind is LaneKind.HEAVY and n not in held}


# -- properties --------------------------------------------------------------------------------


@PROPERTY
@given(scenarios())
def test_inputs_never_mutated(sc: Scenario) -> None:
    before = copy.deepcopy(sc)
    sc.decide()
    assert sc == before


@PROPERTY
@given(scenarios(), st.data())
def test_decision_independent_of_lane_order(sc: Scenario, data: st.DataObject) -> None:
    base = sc.decide()
    shuffled = sc.decide(data.draw(st.permutations(sc.lanes)))
    assert shuffled.winner == base.winner
    assert shuffled.also_dispatched == base.also_dispatched
    assert set(shuffled.deferred) == set(base.deferred)
    assert set(shuffled.expired_gates) == set(base.expired_gates)
    assert shuffled.views == base.views


@PROPERTY
@given(scenarios())
def test_views_agree_with_the_design(sc: Scenario) -> None:
    decision = sc.decide()
    known = facts(sc)
    assert set(decision.views) == set(known)
    for name, view in decision.views.items():
        expected = known[name]
        assert (view.due, view.in_flight) == (expected.due, expected.in_flight), name
        assert view.ratio == expected.ratio


@PROPERTY
@given(scenarios(lease=False))
def test_due_eligible_priority0_wins_when_lease_free(sc: Scenario) -> None:
    known = facts(sc)
    contenders = [f for n, f in candidates(known).items()
                  if f.spec.priority0 and not gated(sc, n, known)]
    decision = sc.decide()
    if contenders:
        assert decision.winner is not None
        assert sc.spec(decision.winner).priority0
        # Several priority-0 lanes: the best ranked one (a lane whose gate lapsed may win too).
        assert all(known[decision.winner].rank <= f.rank for f in contenders)


@PROPERTY
@given(scenarios())
def test_winner_has_the_best_rank_among_survivors(sc: Scenario) -> None:
    known = facts(sc)
    decision = sc.decide()
    alive = survivors(sc, known)
    if sc.lease is not None:
        assert decision.winner is None
        return
    if not alive:
        assert decision.winner is None
        return
    best = min(alive.values(), key=lambda f: f.rank)
    assert decision.winner == best.spec.name
    if not best.spec.priority0:
        assert all(best.ratio >= f.ratio for f in alive.values())
    losers = {d.lane: d.blocker for d in decision.deferred
              if d.reason is DeferralReason.BACKPRESSURE}
    assert losers == dict.fromkeys(set(alive) - {best.spec.name}, best.spec.name)


@PROPERTY
@given(scenarios())
def test_at_most_one_heavy_and_none_while_lease_held(sc: Scenario) -> None:
    decision = sc.decide()
    heavy = [n for n in decision.dispatched if sc.spec(n).kind is LaneKind.HEAVY]
    assert len(heavy) <= 1
    assert heavy == ([decision.winner] if decision.winner else [])
    if sc.lease is not None:
        assert heavy == []
        held = {d.lane: d.blocker for d in decision.deferred
                if d.reason is DeferralReason.LEASE_HELD}
        expected = {n for n, f in candidates(facts(sc)).items()
                    if f.spec.kind is LaneKind.HEAVY}
        assert held == dict.fromkeys(expected, sc.lease.lane)


@PROPERTY
@given(scenarios())
def test_light_lanes_dispatched_iff_due_idle_and_not_gated(sc: Scenario) -> None:
    known = facts(sc)
    decision = sc.decide()
    for name in decision.also_dispatched:
        f = known[name]
        assert f.spec.kind is LaneKind.LIGHT and f.due and not f.in_flight, name
    due_light = {n for n, f in candidates(known).items() if f.spec.kind is LaneKind.LIGHT}
    # Promise 3: every due, idle light lane goes this tick, whatever the lease, unless gated.
    assert set(decision.also_dispatched) == due_light - gate_deferred(sc, known)
    assert len(set(decision.also_dispatched)) == len(decision.also_dispatched)
    for d in decision.deferred:
        if d.lane in due_light:
            assert d.reason not in PICK_REASONS


@PROPERTY
@given(scenarios())
def test_deferrals_are_well_formed(sc: Scenario) -> None:
    known = facts(sc)
    decision = sc.decide()
    lanes = [d.lane for d in decision.deferred]
    assert len(lanes) == len(set(lanes))
    assert not set(lanes) & set(decision.dispatched)
    for d in decision.deferred:
        f = known[d.lane]
        assert f.due and not f.in_flight
        previous = sc.state(d.lane).sched.deferral
        assert d.since == (sc.now if previous is None else previous.since)
        if d.reason in GATE_REASONS:
            # A gate deferral names a gate of the lane whose blocker blocks right now.
            assert any(g.blocker == d.blocker and g.reason is d.reason
                       and gate_blocks(g, gate_facts(sc, known).get(
                           g.blocker, family_fact(gate_facts(sc, known), g.blocker)))
                       for g in f.spec.gates)
    # A due, idle lane is either dispatched or deferred (or a winner that could not be sent).
    accounted = set(decision.dispatched) | set(lanes)
    assert accounted == set(candidates(known))


@PROPERTY
@given(scenarios())
def test_disabled_lanes_appear_nowhere(sc: Scenario) -> None:
    decision = sc.decide()
    disabled = {s.name for s in sc.lanes if not enabled(sc, s)}
    named = set(decision.dispatched) | set(decision.views) | {d.lane for d in decision.deferred}
    named |= {lane for lane, _ in decision.expired_gates}
    assert not named & disabled
    # A paused or unreadable lane that runs still holds back the lanes gated on it, so it may
    # be named as a gate's blocker; a lane the profile disables never is.
    named |= {d.blocker for d in decision.deferred if d.reason in GATE_REASONS}
    if sc.profile is Profile.CLOUD:
        local_only = {s.name for s in sc.lanes if s.deployment is DeploymentClass.LOCAL_ONLY}
        assert not named & local_only


@PROPERTY
@given(scenarios(lease=False))
def test_expired_gates_are_streaks_past_max_defer(sc: Scenario) -> None:
    known = facts(sc)
    decision = sc.decide()
    for name, gate in decision.expired_gates:
        assert gate in sc.spec(name).gates
        seen = gate_facts(sc, known)
        assert gate.max_defer_s is not None and gate_blocks(
            gate, seen.get(gate.blocker, family_fact(seen, gate.blocker)))
        current = sc.state(name).sched.deferral
        assert current is not None and current.blocker == gate.blocker
        assert sc.now - current.since >= gate.max_defer_s


@PROPERTY
@given(scenarios())
def test_gates_defer_exactly_the_lanes_the_design_says(sc: Scenario) -> None:
    """Each gate deferral is the oracle's: the lane, the first blocking gate's reason and
    blocker; the gates that lapsed on the way are the decision's expired gates."""
    known = facts(sc)
    decision = sc.decide()
    expected = {n: (g.reason, g.blocker) for n, g in judged_by_gates(sc, known).items()}
    by_gate = {d.lane: (d.reason, d.blocker) for d in decision.deferred
               if d.reason not in PICK_REASONS}
    assert by_gate == expected
    lapsed = {(n, g) for n in candidates(known)
              if not (known[n].spec.kind is LaneKind.HEAVY and sc.lease is not None)
              for g in holding_gate(sc, n, known)[1]}
    assert set(decision.expired_gates) == lapsed
