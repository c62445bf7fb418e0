"""The due index and beat's tick memory (``core.dueindex``): a lane the index says needs no
look now is never one the full planner would dispatch or newly defer, and planning only the
lanes the index and memory name decides exactly what planning every lane decides."""

from __future__ import annotations

import math
import sys
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedproj.core.deferrals import LEASE_WAITS, Deferral
from schedproj.core.dueindex import (
    NEVER,
    TickMemory,
    gated_back,
    next_look,
    waits_for_lease,
    with_changes,
)
from schedproj.core.lanes import (
    DeferralReason,
    Gate,
    GateCondition,
    LaneKind,
    LaneSpec,
    Profile,
)
from schedproj.core.picker import Policy
from schedproj.core.pipeline import decide
from schedproj.core.planner import TickInput, plan_tick
from schedproj.core.pressure import measure
from schedproj.core.records import LaneState, LeaseView, Outcome, RunRecord, SchedRecord
from schedproj.core.views import dispatch_ended
from tests.core.test_picker_properties import PROPERTY, Scenario, scenarios


def plan(sc: Scenario, names: set[str] | None = None):  # type: ignore[no-untyped-def]
    lanes = [s for s in sc.lanes if names is None or s.name in names]
    states = {n: st for n, st in sc.states.items() if names is None or n in names}
    return plan_tick(lanes, TickInput(states=states, lease=sc.lease, probes=sc.probes,
                                      unreadable=frozenset(sc.unreadable)),
                     sc.now, profile=sc.profile, policy=Policy.STALENESS,
                     start_deadline_s=60.0, task_id=lambda lane: f"id-{lane}")


def looks(sc: Scenario) -> dict[str, float]:
    return {s.name: next_look(s, sc.state(s.name), sc.now,
                              paused=sc.state(s.name).sched.paused) for s in sc.lanes}


def focus_of(sc: Scenario) -> set[str]:
    """What beat plans: lanes due by the index, plus those it reads every tick (gate blockers,
    lanes with a due-check probe) and the lease holder."""
    due = {name for name, look in looks(sc).items() if look <= sc.now}
    blockers = {g.blocker for s in sc.lanes for g in s.gates}
    family_members = {s.name for s in sc.lanes if s.family in blockers}
    holder = {sc.lease.lane} if sc.lease is not None else set()
    return due | blockers | family_members | set(sc.probes) | holder


@PROPERTY
@given(scenarios())
def test_a_lane_due_and_idle_is_due_in_the_index(sc: Scenario) -> None:
    decision = plan(sc).decision
    index = looks(sc)
    for name, view in decision.views.items():
        if view.due and not view.in_flight and name not in sc.probes:
            assert index[name] <= sc.now, name


@PROPERTY
@given(scenarios())
def test_planning_the_focus_decides_what_planning_every_lane_decides(sc: Scenario) -> None:
    full, part = plan(sc), plan(sc, focus_of(sc))
    assert part.decision.winner == full.decision.winner
    assert part.decision.also_dispatched == full.decision.also_dispatched
    assert set(part.decision.deferred) <= set(full.decision.deferred)
    # Lanes left out are either not due or in flight: the full plan changes nothing of
    # theirs except ending a streak (which the lane's next look then does).
    left_out = {s.name for s in sc.lanes} - focus_of(sc)
    for lane in left_out:
        assert lane not in full.sends
        change = full.changes.get(lane)
        assert change is None or change.deferral is None


@PROPERTY
@given(scenarios(lease=True), st.data())
def test_skipping_lanes_that_wait_for_the_same_lease_changes_nothing(
        sc: Scenario, data: st.DataObject) -> None:
    """While the same lease is held, a heavy lane already recorded as waiting for it needs no
    work: the full plan writes nothing for it and nothing else depends on it. The lanes that
    wait are the ones this test records as waiting (not what ``waits_for_lease`` says)."""
    assert sc.lease is not None
    blockers = {g.blocker for s in sc.lanes for g in s.gates}
    states = dict(sc.states)
    recorded: set[str] = set()
    for s in sc.lanes:
        if s.kind is LaneKind.HEAVY and data.draw(st.booleans()):
            old = states.get(s.name, LaneState())
            reason = data.draw(st.sampled_from(sorted(LEASE_WAITS)))
            # As the plan that recorded the wait left it: a dispatch that had ended by then
            # forgotten (planner.sched_changes); a run ending since marks its lane looked.
            sched = (replace(old.sched, inflight_task_id=None, inflight_deadline=None)
                     if dispatch_ended(old) else old.sched)
            states[s.name] = replace(old, sched=replace(sched, deferral=Deferral(
                lane=s.name, reason=reason, blocker="someone", since=sc.now - 50)))
            recorded.add(s.name)
    sc = replace(sc, states=states)
    for s in sc.lanes:
        deferral = sc.state(s.name).sched.deferral
        gate_deferred = deferral is not None and deferral.reason not in LEASE_WAITS
        assert waits_for_lease(sc.state(s.name)) is (deferral is not None
                                                     and not gate_deferred)
        assert s.name not in recorded or waits_for_lease(sc.state(s.name))
    full = plan(sc)
    # Beat keeps as waiting the lanes its last plan deferred for the lease (due, idle), that
    # were recorded as waiting and that no gate names (directly or through their family).
    quiet = {d.lane for d in full.decision.deferred
             if d.reason in LEASE_WAITS and d.lane in recorded
             and d.lane not in blockers and full.decision.views[d.lane].spec.family
             not in blockers}
    for lane in quiet:
        assert lane not in full.changes, "a waiting lane's record was rewritten"
        assert lane not in full.new_deferrals
    names = {s.name for s in sc.lanes} - quiet
    part = plan(sc, names)
    assert part.sends == full.sends
    assert {k: v for k, v in full.changes.items() if k not in quiet} == part.changes


def test_a_lane_recorded_waiting_for_the_lease_is_skipped_without_changing_the_plan() -> None:
    """The example the property above must meet at least once: two heavy lanes recorded as
    waiting behind the holder; planning without them sends and writes what the full plan
    does, and the full plan writes nothing for them."""
    now = 10_000.0
    lanes = [LaneSpec(name=n, task_name=n, kind=LaneKind.HEAVY, cadence_s=60.0, order=i)
             for i, n in enumerate(("holder", "w1", "w2"))]
    lanes.append(LaneSpec(name="light", task_name="light", kind=LaneKind.LIGHT,
                          cadence_s=60.0, order=9))
    lease = LeaseView(lane="holder", token="t", fence=1, granted_at=now - 30)

    def waiting(lane: str, reason: DeferralReason) -> LaneState:
        return LaneState(run=RunRecord(last_run_at=now - 600), sched=SchedRecord(
            deferral=Deferral(lane, reason, "holder", now - 30)))
    states = {"holder": LaneState(run=RunRecord(last_run_at=now - 600)),
              "w1": waiting("w1", DeferralReason.LEASE_HELD),
              "w2": waiting("w2", DeferralReason.BACKPRESSURE),
              "light": LaneState(run=RunRecord(last_run_at=now - 600))}
    sc = Scenario(lanes=lanes, states=states, lease=lease, now=now, profile=Profile.LOCAL)
    full = plan(sc)
    assert {d.lane for d in full.decision.deferred} == {"w1", "w2"}
    assert not {"w1", "w2"} & set(full.changes)
    part = plan(sc, {"holder", "light"})
    assert part.sends == full.sends and set(full.sends) == {"light"}
    assert part.changes == full.changes


def test_memory_skips_waiting_lanes_only_while_the_same_lease_is_held() -> None:
    mem = TickMemory()
    now = 1000.0
    waiting = LaneState()
    waiting = replace(waiting, sched=replace(waiting.sched, deferral=Deferral(
        lane="h", reason=DeferralReason.LEASE_HELD, blocker="x", since=10.0)))
    mem.learn({"h": waiting, "l": LaneState()}, {"h": 0.0, "l": 0.0}, ())
    mem.settle({"h": now - 5, "l": now - 5}, now, "tok", waiting={"h"},
               states={"h": waiting, "l": LaneState()})
    lease = LeaseView(lane="x", token="tok", fence=1, granted_at=now)
    focus, skipped = mem.focus((), lease, ())
    assert "h" not in focus and "l" in focus and skipped == 1
    focus, skipped = mem.focus((), replace(lease, token="new"), ())
    assert "h" in focus and skipped == 0
    focus, skipped = mem.focus(("h",), lease, ())  # it changed: planned again
    assert "h" in focus and skipped == 0
    # A lane whose next look is later leaves the memory; a removed one is forgotten.
    writes = mem.settle({"l": now + 60}, now, "tok", waiting=set(), states={})
    assert writes == {"l": now + 60} and "l" not in mem.due
    assert mem.learn({}, {"h": None}, ()) == {"h"} and not mem.due


# -- next_look: exactly when the lane falls due ------------------------------------------------

T = 1_000_000.0
HOUR = 3600.0


def lane(name: str = "x", kind: LaneKind = LaneKind.HEAVY, cadence_s: float = 600.0,
         **kw: object) -> LaneSpec:
    return LaneSpec(name=name, task_name=name, kind=kind, cadence_s=cadence_s,
                    **kw)  # type: ignore[arg-type]


def state(last: float | None = None, **run: object) -> LaneState:
    return LaneState(run=RunRecord(last_run_at=last, **run))  # type: ignore[arg-type]


def due_by_decide(spec: LaneSpec, st_: LaneState, now: float) -> bool:
    return decide([spec], {spec.name: st_}, None, now).views[spec.name].due


@pytest.mark.parametrize(("spec", "st_", "expected"), [
    (lane(), state(T - 100), T + 500),
    (lane(due_ratio=1.2), state(T - 100), T + 620),
    (lane(due_ratio=0.8), state(T - 100), T + 380),
    (lane(cadence_s=HOUR), state(T + 30), T + 30 + HOUR),  # a run ending as beat reads
    # A worker clock an hour ahead, beat dispatched at T - 10: capped to dispatch + cadence.
    (lane(), LaneState(run=RunRecord(last_run_at=T + HOUR),
                       sched=SchedRecord(last_dispatch_at=T - 10)), T - 10 + 1200),
    # A family member added at T - 60 that never ran: due by its cadence from being added.
    (lane(due_ratio=1.2), state(since=T - 60), T - 60),
    (lane(due_ratio=0.8), state(since=T - 60), T - 60 - 120),
    # A failed run with a retry policy: its retry, before the cadence.
    (lane(retry_after_failure_s=60.0, retry_window_s=300.0),
     state(T - 10, last_outcome=Outcome.FAILED), T + 50),
    (lane(retry_after_failure_s=60.0, retry_window_s=300.0),
     state(T - 10, last_outcome=Outcome.LOST, failing_since=T - 250), T + 50),
], ids=["cadence", "late-ratio", "early-ratio", "near-future-run", "skewed-clock",
        "member-late", "member-early", "retry", "retry-last-in-window"])
def test_next_look_is_the_instant_the_lane_falls_due(spec: LaneSpec, st_: LaneState,
                                                     expected: float) -> None:
    at = next_look(spec, st_, T)
    assert at == pytest.approx(expected)
    if at > T:
        assert not due_by_decide(spec, st_, T)
        assert not due_by_decide(spec, st_, at - 0.01)
    assert due_by_decide(spec, st_, max(at, T))


@pytest.mark.parametrize(("spec", "st_", "expected"), [
    (lane(), state(), 0.0),                                   # never ran: at once
    (lane(backlog_driven=True), state(), 0.0),                # its first run measures it
    (lane(), state(T - 5, backlog=3), T - 5),                 # backlog: due since its run
    (lane(), state(T + 20, backlog=3), T),                    # ... never later than now
    (lane(), state(since=T - 60, backlog=1), 0.0),            # a new member with backlog
    (lane(backlog_driven=True), state(T - 5), NEVER),         # no backlog: never by time
    (lane(cadence_s=60.0), state(-10_000.0), 0.0),            # long overdue: not below 0
    (lane(backlog_driven=True, retry_after_failure_s=60.0, retry_window_s=120.0),
     state(T - 5, last_outcome=Outcome.FAILED), T + 55),      # ... but a retry is
], ids=["never-ran", "backlog-driven-never-ran", "backlog", "backlog-future-run",
        "new-member-with-backlog", "backlog-driven-idle", "long-overdue", "backlog-driven-retry"])
def test_next_look_of_lanes_due_by_backlog_or_never_by_time(
        spec: LaneSpec, st_: LaneState, expected: float) -> None:
    assert next_look(spec, st_, T) == expected


def test_a_retry_past_its_window_is_not_filed_the_cadence_is() -> None:
    spec = lane(retry_after_failure_s=60.0, retry_window_s=300.0)
    late = state(T - 10, last_outcome=Outcome.FAILED, failing_since=T - 260)
    assert next_look(spec, late, T) == T - 10 + 600
    done = state(T - 10, last_outcome=Outcome.COMPLETED, failing_since=None)
    assert next_look(spec, done, T) == T - 10 + 600


def test_paused_is_never_and_forced_is_now_whatever_the_state() -> None:
    for st_ in (state(), state(T - 5), state(T - 5, backlog=3)):
        assert next_look(lane(), st_, T, paused=True) == NEVER
        assert next_look(lane(), st_, T, paused=True, forced=True) == NEVER
        assert next_look(lane(), st_, T, forced=True) == 0.0


def in_flight(mark: float | None, deadline: float | None, started: bool = True) -> LaneState:
    run = RunRecord(last_run_at=T - 30, last_task_id="old",
                    running_task_id="new" if started else None, running_until=mark)
    return LaneState(run=run, sched=SchedRecord(inflight_task_id="new",
                                                inflight_deadline=deadline))


@pytest.mark.parametrize(("st_", "grace", "expected"), [
    (in_flight(T + 20, None), 0.0, T + 20),           # the mark runs out
    (in_flight(T + 20, None), 15.0, T + 35),          # ... plus the grace
    (in_flight(T - 5, None), 15.0, T + 10),           # lapsed, still inside the grace
    (in_flight(None, T + 40, started=False), 0.0, T + 40),  # a message not started yet
    (in_flight(T + 90, T + 40), 0.0, T + 40),         # whichever ends first
    (in_flight(T + 20, T + 40), 30.0, T + 40),
], ids=["mark", "mark-and-grace", "in-grace", "message", "deadline-first", "grace-longer"])
def test_a_light_lane_in_flight_is_looked_at_when_its_run_or_message_expires(
        st_: LaneState, grace: float, expected: float) -> None:
    spec = lane(kind=LaneKind.LIGHT, cadence_s=10.0)
    assert next_look(spec, st_, T, grace_s=grace) == expected


def test_without_a_grace_a_light_run_is_looked_at_when_its_mark_runs_out() -> None:
    spec = lane(kind=LaneKind.LIGHT, cadence_s=10.0)
    assert next_look(spec, in_flight(T + 20, None), T) == T + 20


def test_a_light_lane_no_longer_in_flight_is_filed_by_its_due_time() -> None:
    spec = lane(kind=LaneKind.LIGHT, cadence_s=600.0)
    assert next_look(spec, in_flight(T - 5, None), T) == T - 30 + 600
    # A heavy lane's run lives as its lease: its in-flight mark is not its next look.
    assert next_look(lane(cadence_s=600.0), in_flight(T + 20, None), T) == T - 30 + 600


# -- the tick memory ---------------------------------------------------------------------------

WAIT = replace(LaneState(), sched=SchedRecord(deferral=Deferral(
    lane="h", reason=DeferralReason.LEASE_HELD, blocker="x", since=10.0)))


def memory_with(now: float, *, waiting: dict[str, LaneState],
                active: dict[str, LaneState], token: str | None = "tok") -> TickMemory:
    mem = TickMemory()
    both = {**waiting, **active}
    mem.learn(both, dict.fromkeys(both, 0.0), ())
    mem.settle(dict.fromkeys(both, now - 5), now, token, waiting=set(waiting), states=both)
    return mem


def test_settle_keeps_due_lanes_sorted_into_waiting_and_active_and_writes_what_moved() -> None:
    mem = TickMemory()
    states = {"h": WAIT, "l": LaneState(), "later": LaneState()}
    mem.learn(states, {"h": 0.0, "l": 90.0, "later": 5.0}, ())
    writes = mem.settle({"h": 0.0, "l": 95.0, "later": 200.0}, 100.0, "tok", waiting={"h"},
                        states=states)
    assert writes == {"l": 95.0, "later": 200.0}  # h's score is what the index holds
    assert (mem.waiting, mem.active, mem.due) == ({"h"}, {"l"}, {"h", "l"})
    assert mem.scores == {"h": 0.0, "l": 95.0} and set(mem.states) == {"h", "l"}
    # It keeps each lane's state as the plan leaves it (not as it was read).
    planned = {**states, "l": LaneState(sched=SchedRecord(dispatches=1))}
    mem.settle({"h": 0.0, "l": 95.0}, 100.0, "tok", waiting={"h"}, states=planned)
    assert mem.states == {"h": WAIT, "l": planned["l"]}
    assert (mem.cursor, mem.lease_token) == (100.0, "tok")
    # Next tick h stops waiting (its lease wait ended) and l starts: they swap sides.
    mem.settle({"h": 0.0, "l": 95.0}, 110.0, None, waiting={"l"}, states=states)
    assert (mem.waiting, mem.active) == ({"l"}, {"h"})
    assert (mem.cursor, mem.lease_token) == (110.0, None)


def test_settle_files_a_lane_looked_at_exactly_now_as_due() -> None:
    mem = TickMemory()
    mem.settle({"l": 100.0}, 100.0, None, waiting=set(), states={"l": LaneState()})
    assert mem.active == {"l"} and mem.scores == {"l": 100.0}


def test_learn_forgets_lanes_gone_from_the_index_and_lanes_it_cannot_read() -> None:
    now = 1000.0
    mem = memory_with(now, waiting={"h": WAIT}, active={"a": LaneState(), "b": LaneState()})
    gone = mem.learn({"a": LaneState(), "new": WAIT}, {"h": None, "new": 7.0}, ["b"])
    assert gone == {"h"}
    assert mem.due == {"a"} and "b" not in mem.states and "h" not in mem.scores
    assert mem.states["new"] == WAIT and mem.scores["new"] == 7.0
    assert "new" not in mem.due  # learnt, but due only once a plan settles it
    assert mem.states["a"] == LaneState() and mem.scores["a"] == now - 5


def test_focus_plans_what_changed_what_is_active_and_what_the_caller_always_sees() -> None:
    now = 1000.0
    mem = memory_with(now, waiting={"h1": WAIT, "h2": WAIT}, active={"l": LaneState()})
    lease = LeaseView(lane="holder", token="tok", fence=1, granted_at=now)
    focus, skipped = mem.focus(["changed"], lease, ["blocker"])
    assert focus == {"changed", "blocker", "l", "holder"} and skipped == 2
    # A waiting lane that changed, or the holder itself, is planned: not skipped.
    focus, skipped = mem.focus(["h1"], replace(lease, lane="h2"), ())
    assert focus == {"h1", "h2", "l"} and skipped == 0
    # Another hold (or none): every waiting lane is planned again.
    for other in (replace(lease, token="other"), None):
        focus, skipped = mem.focus((), other, ())
        assert focus == {"h1", "h2", "l"} and skipped == 0


def test_reset_forgets_everything_so_the_next_read_takes_every_due_lane() -> None:
    mem = memory_with(1000.0, waiting={"h": WAIT}, active={"l": LaneState()})
    mem.reset()
    assert mem == TickMemory()


def test_with_changes_applies_only_the_changed_beat_records() -> None:
    changed = SchedRecord(dispatches=3)
    states = {"a": state(5.0), "b": state(6.0)}
    out = with_changes(states, {"a": changed, "ghost": changed})
    assert out == {"a": LaneState(run=RunRecord(last_run_at=5.0), sched=changed),
                   "b": states["b"]}
    assert list(vars(out["a"]).items()) == list(vars(replace(states["a"], sched=changed)).items())
    assert out["b"] is states["b"]


def test_forgetting_a_lane_the_memory_never_held_is_harmless() -> None:
    mem = memory_with(1000.0, waiting={}, active={"l": LaneState()})
    mem.forget("never-seen")
    assert mem.learn({}, {"other": None}, ["unknown"]) == {"other"}
    settled = mem.settle({"new": 2000.0}, 1000.0, None, waiting=set(), states={})
    assert settled == {"new": 2000.0} and mem.due == {"l"}


# -- quiet lanes: the lanes read every tick, left out while nothing they were planned on moved --

def always_of(sc: Scenario) -> list[str]:
    """The lanes beat reads every tick: gate blockers and lanes with a due-check probe."""
    return sorted({g.blocker for s in sc.lanes for g in s.gates} | set(sc.probes))


def wake_of(p, now: float) -> float:  # type: ignore[no-untyped-def]
    return math.inf if p.next_due_in_s is None else now + p.next_due_in_s


def resting(sc: Scenario, data: st.DataObject) -> Scenario:
    """``sc`` with some of the lanes read every tick at rest, as on an idle tick: run a
    moment ago (within their cadence), no backlog, their probe (if any) saying none, and
    nothing of theirs running; a message in flight sometimes. (Random states leave few
    lanes not due: without this the property would seldom meet a quiet lane.)"""
    states, probes = dict(sc.states), dict(sc.probes)
    declared = {s.name for s in sc.lanes}
    for name in always_of(sc):
        if name not in declared or not data.draw(st.booleans()):
            continue
        spec, old = sc.spec(name), sc.state(name)
        ran = sc.now - data.draw(st.floats(0.0, spec.cadence_s * 1.2))
        sched = old.sched
        if data.draw(st.booleans()):
            sched = replace(sched, inflight_task_id="msg",
                            inflight_deadline=sc.now + data.draw(st.floats(-30.0, 300.0)))
        states[name] = replace(old, run=replace(old.run, last_run_at=ran, backlog=0,
                                                running_task_id=None, last_task_id="done"),
                               sched=sched)
        if name in probes:
            probes[name] = 0
    return replace(sc, states=states, probes=probes)


@PROPERTY
@given(scenarios(), st.floats(0.0, 3 * HOUR), st.booleans(), st.data())
def test_leaving_out_quiet_lanes_decides_what_planning_them_decides(
        sc: Scenario, later_s: float, planned_twice: bool, data: st.DataObject) -> None:
    """A tick plans every lane and remembers the lanes read every tick it left with nothing
    to do (``hush``); a later tick with the same inputs for them (the records as the plan
    left them, the same probes and lease) leaves out those still quiet (``quiet_now``, with
    their gates' blockers put back: ``gated_back``). Its plan sends, writes, defers and
    presses what planning every lane does, the full plan touches no lane left out, and beat
    wakes no later (each left-out lane's ``until`` is looked at)."""
    sc = resting(sc, data)
    mem, always = TickMemory(), always_of(sc)
    first = plan(sc)
    mem.hush(first, always, sc.probes, sc.lease, GRACE)
    after = replace(sc, states=with_changes(sc.states, first.changes))
    if planned_twice:  # the records as the plan left them, planned again at the same instant
        again = plan(after)
        mem.hush(again, always, sc.probes, sc.lease, GRACE)
    later = replace(after, now=sc.now + later_s)
    quiet = mem.quiet_now(always, later.states, later.probes, later.lease, later.now,
                          planned=(later.unreadable,))
    names = {s.name for s in sc.lanes}
    focus = names - set(quiet)
    gated_back(focus, quiet, later.spec)
    assert not focus & set(quiet)
    full, part = plan(later), plan(later, focus)
    assert part.sends == full.sends
    assert part.changes == full.changes
    assert part.new_deferrals == full.new_deferrals and part.misses == full.misses
    assert part.decision.deferred == full.decision.deferred
    assert (measure(part.decision, later.states, later.lease, later.now)
            == measure(full.decision, later.states, later.lease, later.now))
    assert min([wake_of(part, later.now), *quiet.values()]) <= wake_of(full, later.now)
    for lane in quiet:
        # A light lane in flight is looked at when its flight ends (``next_look``: its end is
        # a change anyway), though its cadence may pass meanwhile; planning it then sends and
        # changes nothing for it (compared above). Any other quiet lane is not due.
        view = full.decision.views[lane]
        assert not view.due or (view.in_flight and not view.spec.heavy), view


GRACE = 30.0


def gate_pair(now: float) -> tuple[list[LaneSpec], dict[str, LaneState]]:
    """A light lane ``b`` whose message is in flight (not started) until now + 60, and a
    lane ``c`` gated on it (defers while ``b`` is due or running), due by its probe."""
    b = LaneSpec(name="b", task_name="b", kind=LaneKind.LIGHT, cadence_s=3600.0, order=1)
    c = LaneSpec(name="c", task_name="c", kind=LaneKind.LIGHT, cadence_s=3600.0, order=2,
                 gates=(Gate("b", GateCondition.DUE_OR_RUNNING,
                             DeferralReason.GOLDEN_PATH_DEPENDENCY),))
    states = {"b": LaneState(run=RunRecord(last_run_at=now - 10, last_task_id="t0"),
                             sched=SchedRecord(inflight_task_id="t1",
                                               inflight_deadline=now + 60)),
              "c": LaneState(run=RunRecord(last_run_at=now - 10))}
    return [b, c], states


def test_a_quiet_blocker_of_a_lane_planned_is_planned_and_still_holds_it_back() -> None:
    """The gate's example: ``b`` is quiet (not due, its message in flight, nothing changed);
    ``c``'s probe says it is behind, so ``c`` is planned; its gate names ``b``, so ``b`` is
    put back and ``c`` is deferred. Left out, ``b`` would hold nothing back and ``c`` would
    be sent."""
    now = 10_000.0
    lanes, states = gate_pair(now)
    sc = Scenario(lanes=lanes, states=states, lease=None, now=now, profile=Profile.LOCAL,
                  probes={"c": 0})
    mem = TickMemory()
    first = plan(sc)
    assert not first.sends and not first.changes
    mem.hush(first, always_of(sc), sc.probes, None, GRACE)
    assert mem.quiet.keys() == {"b", "c"}
    assert mem.quiet["b"].until == now + 60  # its message's expiry: looked at then
    # Resting (left out of beat's read) on the states they were planned on, until then.
    assert mem.resting(now + 59.9)["b"] == states["b"]
    assert "b" not in mem.resting(now + 60)
    behind = replace(sc, now=now + 5, probes={"c": 3})
    quiet = mem.quiet_now(always_of(behind), behind.states, behind.probes, None, behind.now)
    assert quiet == {"b": now + 60}, "c's probe moved: planned"
    focus = {"c"}
    without = plan(behind, focus)
    assert set(without.sends) == {"c"}, "the test proves nothing: b holds nothing back"
    gated_back(focus, quiet, behind.spec)
    assert focus == {"b", "c"} and quiet == {}
    held = plan(behind, focus)
    assert not held.sends and [d.lane for d in held.decision.deferred] == ["c"]
    assert held.changes == plan(behind).changes


def test_a_quiet_lane_is_planned_again_when_anything_it_was_planned_on_moves() -> None:
    now = 10_000.0
    lanes, states = gate_pair(now)
    sc = Scenario(lanes=lanes, states=states, lease=None, now=now, profile=Profile.LOCAL,
                  probes={"c": 0})
    mem = TickMemory()
    mem.hush(plan(sc), ["b", "c"], sc.probes, None, GRACE)

    def quiet(**moved: object) -> set[str]:
        at = moved.pop("now", now + 1)
        st_ = {**sc.states, **moved.pop("states", {})}  # type: ignore[dict-item]
        return set(mem.quiet_now(["b", "c"], st_, moved.pop("probes", sc.probes),  # type: ignore[arg-type]
                                 moved.pop("lease", None), at,  # type: ignore[arg-type]
                                 planned=moved.pop("planned", ())))  # type: ignore[arg-type]

    assert quiet() == {"b", "c"}
    assert quiet(now=now + 60) == {"c"}, "b's message expires: looked at"
    assert quiet(now=now + 3589) == {"c"}
    assert quiet(now=now + 3590) == set(), "c falls due by its cadence"
    assert quiet(probes={"c": 1}) == {"b"}
    assert quiet(states={"c": LaneState(run=RunRecord(last_run_at=now))}) == {"b"}
    lease = LeaseView(lane="x", token="other", fence=1, granted_at=now)
    assert quiet(lease=lease) == set()
    assert quiet(planned=({"b"}, set())) == {"c"}
    mem.reset()
    assert quiet() == set()


def test_a_lane_left_with_work_or_a_run_to_judge_is_never_quiet() -> None:
    now = 10_000.0
    lanes, states = gate_pair(now)
    states["b"] = replace(states["b"], sched=SchedRecord())  # nothing in flight: c is sent
    sc = Scenario(lanes=lanes, states=states, lease=None, now=now, profile=Profile.LOCAL,
                  probes={"c": 2})  # c is due: sent
    mem = TickMemory()
    first = plan(sc)
    assert set(first.sends) == {"c"}
    mem.hush(first, ["b", "c"], sc.probes, None, GRACE)
    assert mem.quiet.keys() == {"b"}
    running = replace(states["b"], run=replace(states["b"].run, running_task_id="t1",
                                               running_until=now + 30))
    mem.hush(plan(replace(sc, states={**states, "b": running}, probes={"c": 0})),
             ["b", "c"], {"c": 0}, None, GRACE)
    assert "b" not in mem.quiet, "a run under way may lapse: judged every tick"


def test_forgetting_most_lanes_gives_back_the_tables_they_needed() -> None:
    """A dict or set never shrinks its table when keys are deleted: a start-up read of
    N lanes, all but a few of them not due, must not leave beat holding tables sized for N."""
    now, n = 1000.0, 50_000
    lanes = [f"fam[t{i:07d}]" for i in range(n)]
    states = dict.fromkeys(lanes, LaneState())
    mem = TickMemory()
    mem.learn(states, dict.fromkeys(lanes, now - 1), ())
    assert sys.getsizeof(mem.states) > 1_000_000  # as large as the read (the test's premise)
    # Every lane due: kept (active); then all but ten ran and are not due any more.
    mem.settle(dict.fromkeys(lanes, now), now, None, waiting=lanes[:100], states=states)
    assert len(mem.active) == n - 100 and sys.getsizeof(mem.active) > 1_000_000
    mem.settle({lane: (now if i < 10 else now + 60) for i, lane in enumerate(lanes)}, now, None,
               waiting=(), states=states)
    assert mem.due == set(lanes[:10]) and set(mem.states) == set(lanes[:10])
    for part in (mem.states, mem.scores, mem.active, mem.waiting, *mem.waiting_of.values()):
        assert sys.getsizeof(part) < 4096, type(part)


def test_memory_that_shrinks_little_is_not_copied_every_tick() -> None:
    now = 1000.0
    lanes = [f"l{i}" for i in range(10_000)]
    states = dict.fromkeys(lanes, LaneState())
    mem = TickMemory()
    mem.learn(states, dict.fromkeys(lanes, now), ())
    mem.settle(dict.fromkeys(lanes, now), now, None, waiting=(), states=states)
    kept = mem.states
    # Half forgotten: under the quarter that makes a copy worth its cost, the table is kept.
    mem.settle(dict.fromkeys(lanes[:5000], now + 60), now, None, waiting=(), states=states)
    assert mem.states is kept and len(mem.states) == 5000
