"""The due index and beat's tick memory (``core.dueindex``): a lane the index says needs no
look now is never one the full planner would dispatch or newly defer, and planning only the
lanes the index and memory name decides exactly what planning every lane decides."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from schedproj.core.deferrals import LEASE_WAITS, Deferral
from schedproj.core.dueindex import TickMemory, next_look, waits_for_lease
from schedproj.core.lanes import DeferralReason, LaneKind
from schedproj.core.picker import Policy
from schedproj.core.planner import TickInput, plan_tick
from schedproj.core.records import LaneState, LeaseView
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
    work: the full plan writes nothing for it and nothing else depends on it."""
    assert sc.lease is not None
    blockers = {g.blocker for s in sc.lanes for g in s.gates}
    states = dict(sc.states)
    for s in sc.lanes:
        if s.kind is LaneKind.HEAVY and data.draw(st.booleans()):
            old = states.get(s.name, LaneState())
            reason = data.draw(st.sampled_from(sorted(LEASE_WAITS)))
            states[s.name] = replace(old, sched=replace(old.sched, deferral=Deferral(
                lane=s.name, reason=reason, blocker="someone", since=sc.now - 50)))
    sc = replace(sc, states=states)
    full = plan(sc)
    # Beat keeps as waiting the lanes its last plan deferred for the lease (due, idle).
    quiet = {d.lane for d in full.decision.deferred
             if d.reason in LEASE_WAITS and waits_for_lease(sc.state(d.lane))
             and d.lane not in blockers and full.decision.views[d.lane].spec.family
             not in blockers}
    for lane in quiet:
        assert lane not in full.changes, "a waiting lane's record was rewritten"
        assert lane not in full.new_deferrals
    names = {s.name for s in sc.lanes} - quiet
    part = plan(sc, names)
    assert part.sends == full.sends
    assert {k: v for k, v in full.changes.items() if k not in quiet} == part.changes


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
