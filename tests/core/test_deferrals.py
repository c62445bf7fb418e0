"""Deferral streaks (``core.deferrals``): a streak's start never slides, a gate's clock runs
only while that gate's blocker defers the lane (a wait for the lease in between neither stops
nor restarts it), a switch to another blocker starts that blocker's clock and is written,
and a lane that only waits on for the lease is not rewritten at each hand-off.

Pure: the streak rules directly, then several ticks of ``plan_tick`` as beat runs them (each
tick's record changes written back before the next)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest

from schedproj.core.deferrals import LEASE_WAITS, Deferral, continue_streak, same_wait
from schedproj.core.lanes import (
    DeferralReason,
    Gate,
    GateCondition,
    LaneKind,
    LaneSpec,
    Profile,
)
from schedproj.core.picker import Policy
from schedproj.core.planner import Plan, TickInput, plan_tick
from schedproj.core.records import LaneState, LeaseView, RunRecord

T0 = 1_000_000.0
HELD = DeferralReason.LEASE_HELD
PRESSURE = DeferralReason.BACKPRESSURE
DEP = DeferralReason.DEPENDENCY


# -- the streak rules --------------------------------------------------------------------------


def test_a_new_streak_starts_now_with_no_clock_of_its_own() -> None:
    d = continue_streak(None, "c", DEP, "a", T0)
    assert d == Deferral(lane="c", reason=DEP, blocker="a", since=T0)
    assert (d.blocker_since, d.gate_blocker, d.behind_blocker_since) == (None, None, T0)
    assert d.gate_owner == "a" and d.gate_clock("a") == T0 and d.gate_clock("b") is None


@pytest.mark.parametrize("reason", sorted(LEASE_WAITS))
def test_a_lease_wait_owns_no_gate_clock(reason: DeferralReason) -> None:
    d = continue_streak(None, "c", reason, "holder", T0)
    assert d.gate_owner is None
    assert d.gate_clock("holder") is None


def test_the_same_blocker_keeps_the_streak_and_its_clock() -> None:
    first = continue_streak(None, "c", DEP, "a", T0)
    again = continue_streak(first, "c", DEP, "a", T0 + 50)
    assert again == first


def test_a_switch_to_another_blocker_starts_that_blockers_clock() -> None:
    first = continue_streak(None, "c", DEP, "a", T0)
    switched = continue_streak(first, "c", DEP, "b", T0 + 100)
    assert (switched.since, switched.blocker, switched.blocker_since) == (T0, "b", T0 + 100)
    assert switched.gate_clock("b") == T0 + 100 and switched.gate_clock("a") is None
    # It stays B's clock while B defers on; back to A, A's clock starts afresh.
    assert continue_streak(switched, "c", DEP, "b", T0 + 200) == switched
    back = continue_streak(switched, "c", DEP, "a", T0 + 300)
    assert (back.since, back.blocker_since, back.gate_clock("a")) == (T0, T0 + 300, T0 + 300)


def test_a_lease_wait_inside_a_gate_streak_carries_the_gates_clock() -> None:
    gated = continue_streak(continue_streak(None, "c", DEP, "a", T0), "c", DEP, "b", T0 + 100)
    waits = continue_streak(gated, "c", HELD, "holder", T0 + 150)
    assert (waits.reason, waits.blocker, waits.since) == (HELD, "holder", T0)
    assert (waits.gate_blocker, waits.blocker_since) == ("b", T0 + 100)
    assert waits.gate_owner == "b" and waits.gate_clock("b") == T0 + 100
    # Several ticks of waiting (the reason flips on hand-offs) keep it.
    for i, reason in enumerate([PRESSURE, HELD, PRESSURE]):
        waits = continue_streak(waits, "c", reason, f"holder-{i}", T0 + 200 + i)
        assert (waits.gate_blocker, waits.gate_clock("b")) == ("b", T0 + 100)
    # B defers again once the lease is free: its clock goes on from T0 + 100.
    again = continue_streak(waits, "c", DEP, "b", T0 + 400)
    assert again == Deferral("c", DEP, "b", T0, blocker_since=T0 + 100)


def test_a_lease_wait_from_the_streak_start_keeps_the_start_as_the_gates_clock() -> None:
    waits = continue_streak(continue_streak(None, "c", DEP, "a", T0), "c", HELD, "h", T0 + 5)
    assert (waits.gate_blocker, waits.blocker_since, waits.gate_clock("a")) == ("a", None, T0)
    assert continue_streak(waits, "c", DEP, "a", T0 + 9) == Deferral("c", DEP, "a", T0)


def test_a_lease_wait_without_a_gate_before_it_carries_no_clock() -> None:
    waits = continue_streak(continue_streak(None, "c", PRESSURE, "w", T0), "c", HELD, "w",
                            T0 + 5)
    assert (waits.gate_blocker, waits.blocker_since, waits.since) == (None, None, T0)
    gated = continue_streak(waits, "c", DEP, "a", T0 + 9)
    assert (gated.since, gated.blocker_since, gated.gate_clock("a")) == (T0, T0 + 9, T0 + 9)


def test_a_lease_wait_that_carries_no_gate_drops_a_clock_of_its_own() -> None:
    """A lease wait has no gate clock to keep: a record that holds one anyway (written by
    hand, or by an older release) does not pass it on."""
    odd = Deferral("c", HELD, "h", T0, blocker_since=T0 + 5)
    assert continue_streak(odd, "c", PRESSURE, "w", T0 + 10) == Deferral("c", PRESSURE, "w", T0)


def test_a_deferral_without_a_blocker_starts_its_own_clock_inside_the_streak() -> None:
    """The state-loss quarantine defers with no blocker: inside a lease-wait streak it keeps
    the streak's start, and its own clock starts when it began."""
    quarantine = DeferralReason.STATE_LOSS_QUARANTINE
    waits = continue_streak(None, "c", HELD, "h", T0)
    held = continue_streak(waits, "c", quarantine, None, T0 + 10)
    assert held == Deferral("c", quarantine, None, T0, blocker_since=T0 + 10)


def wait(reason: DeferralReason, blocker: str, since: float = T0,
         blocker_since: float | None = None, gate_blocker: str | None = None) -> Deferral:
    return Deferral("c", reason, blocker, since, blocker_since, gate_blocker)


@pytest.mark.parametrize(("old", "new", "same"), [
    (wait(HELD, "x"), wait(PRESSURE, "y"), True),
    (wait(PRESSURE, "x"), wait(HELD, "x"), True),
    (wait(HELD, "x", gate_blocker="g", blocker_since=T0 + 1),
     wait(HELD, "y", gate_blocker="g", blocker_since=T0 + 1), True),
    (wait(HELD, "x"), wait(HELD, "x", since=T0 + 1), False),
    (wait(HELD, "x"), wait(DEP, "x"), False),
    (wait(DEP, "x"), wait(HELD, "x"), False),
    (wait(HELD, "x", gate_blocker="g"), wait(HELD, "x"), False),
    (wait(HELD, "x", gate_blocker="g"), wait(HELD, "x", gate_blocker="h"), False),
    (wait(HELD, "x", gate_blocker="g"),
     wait(HELD, "x", gate_blocker="g", blocker_since=T0 + 1), False),
    (None, wait(HELD, "x"), False),
], ids=["hand-off", "lost-pick-then-held", "carried-clock", "new-streak", "to-gate",
        "from-gate", "clock-dropped", "other-gate", "clock-moved", "no-record"])
def test_only_a_wait_for_the_lease_that_carries_the_same_facts_is_the_same_wait(
        old: Deferral | None, new: Deferral, same: bool) -> None:
    assert same_wait(old, new) is same


# -- several ticks, as beat runs them ----------------------------------------------------------


def spec(name: str, kind: LaneKind = LaneKind.HEAVY, order: int = 1, cadence_s: float = 60.0,
         gates: tuple[Gate, ...] = ()) -> LaneSpec:
    return LaneSpec(name=name, task_name=name, kind=kind, cadence_s=cadence_s, order=order,
                    gates=gates)


def lease(holder: str, token: str = "tok") -> LeaseView:
    return LeaseView(lane=holder, token=token, fence=1, granted_at=T0)


def running(since: float, until: float) -> LaneState:
    """A light lane whose run started at ``since`` and keeps its mark fresh until ``until``."""
    return LaneState(run=RunRecord(last_run_at=since - 3600.0, last_task_id="old",
                                   running_task_id="now", running_since=since,
                                   running_until=until))


def tick(lanes: list[LaneSpec], states: Mapping[str, LaneState], held: LeaseView | None,
         now: float) -> tuple[Plan, dict[str, LaneState]]:
    """One tick: plan it, then write its record changes back (the sends are not run)."""
    plan = plan_tick(lanes, TickInput(states=states, lease=held), now,
                     profile=Profile.LOCAL, policy=Policy.STALENESS, start_deadline_s=60.0,
                     task_id=lambda lane: f"{lane}@{now}")
    after = dict(states)
    for lane, record in plan.changes.items():
        after[lane] = replace(after.get(lane, LaneState()), sched=record)
    return plan, after


def deferral_of(states: Mapping[str, LaneState], lane: str) -> Deferral | None:
    return states[lane].sched.deferral


def test_a_gated_lane_waiting_ticks_for_the_lease_keeps_its_gates_clock() -> None:
    """A heavy lane gated on a light producer that runs on: between gate deferrals it waits
    several ticks for the lease. The gate's max_defer_s still counts from the first gate
    deferral, so it lets the lane go on time instead of holding it as long as the lease is
    busy and the producer runs."""
    gate = Gate("producer", GateCondition.DUE_OR_RUNNING, max_defer_s=600)
    lanes = [spec("producer", LaneKind.LIGHT, 1, 3600.0), spec("consumer", order=2, gates=(gate,)),
             spec("other", order=3)]
    states = {"producer": running(T0 - 10, T0 + 10_000),
              "consumer": LaneState(run=RunRecord(last_run_at=T0 - 6000)),
              "other": LaneState(run=RunRecord(last_run_at=T0 - 120))}
    plan, states = tick(lanes, states, None, T0)
    assert plan.decision.winner == "other"
    assert deferral_of(states, "consumer") == Deferral("consumer", DEP, "producer", T0)

    plan, states = tick(lanes, states, lease("other", "t1"), T0 + 100)
    assert "consumer" in plan.changes  # from the gate to the lease: written once
    for i, now in enumerate((T0 + 200, T0 + 300, T0 + 400)):
        plan, states = tick(lanes, states, lease(f"other-{i}", f"t{i + 2}"), now)
        assert "consumer" not in plan.changes  # a hand-off rewrites nothing
    d = deferral_of(states, "consumer")
    assert d is not None and (d.reason, d.since, d.gate_clock("producer")) == (HELD, T0, T0)

    plan, states = tick(lanes, states, None, T0 + 599)
    assert plan.decision.winner == "other" and plan.decision.expired_gates == ()
    assert deferral_of(states, "consumer") == Deferral("consumer", DEP, "producer", T0)
    plan, states = tick(lanes, states, None, T0 + 600)
    assert plan.decision.winner == "consumer"
    assert plan.decision.expired_gates == (("consumer", gate),)


def test_a_switch_from_blocker_a_to_b_is_written_and_b_keeps_its_own_clock() -> None:
    """consumer waits behind a, then behind b (whose gate is bounded), with lease waits in
    between: the switch is written and reported, and b's bound counts from the switch, not
    from the streak start (which would release the lane 1000 s early)."""
    bounded = Gate("b", GateCondition.DUE_OR_RUNNING, max_defer_s=600)
    lanes = [spec("a", LaneKind.LIGHT, 1, 3600.0), spec("b", LaneKind.LIGHT, 2, 3600.0),
             spec("consumer", order=3, gates=(Gate("a", GateCondition.DUE_OR_RUNNING), bounded)),
             spec("other", order=4)]
    states = {"a": running(T0 - 10, T0 + 900),
              "b": LaneState(run=RunRecord(last_run_at=T0 - 10)),
              "consumer": LaneState(run=RunRecord(last_run_at=T0 - 6000)),
              "other": LaneState(run=RunRecord(last_run_at=T0 - 120))}
    _, states = tick(lanes, states, None, T0)
    assert deferral_of(states, "consumer") == Deferral("consumer", DEP, "a", T0)

    # a has finished; b runs now.
    states["a"] = LaneState(run=RunRecord(last_run_at=T0 + 999), sched=states["a"].sched)
    states["b"] = replace(running(T0 + 1000, T0 + 10_000), sched=states["b"].sched)
    plan, states = tick(lanes, states, None, T0 + 1000)
    switched = Deferral("consumer", DEP, "b", T0, blocker_since=T0 + 1000)
    assert plan.changes["consumer"].deferral == switched
    assert switched in plan.new_deferrals
    assert deferral_of(states, "consumer") == switched

    for i, now in enumerate((T0 + 1100, T0 + 1200)):
        _, states = tick(lanes, states, lease("other", f"t{i}"), now)
    d = deferral_of(states, "consumer")
    assert d is not None and (d.gate_blocker, d.gate_clock("b")) == ("b", T0 + 1000)

    plan, states = tick(lanes, states, None, T0 + 1599)
    assert "consumer" not in plan.decision.dispatched
    assert deferral_of(states, "consumer") == switched
    plan, _ = tick(lanes, states, None, T0 + 1600)
    assert plan.decision.winner == "consumer"
    assert plan.decision.expired_gates == (("consumer", bounded),)
