"""Soft gates (``core.gates``): when a blocker holds its consumer back, how a lane family looks
to a gate that names it (busy while ANY member is busy, whichever member that is), and how
``max_defer_s`` lets a long streak go — except under the legacy registry policy, which had
no bound and applied only the gates the original had.

Pure. Paused and unreadable blockers that still run are in test_gates_see_running_blockers.py.
"""

from __future__ import annotations

from itertools import permutations
from typing import Any

import pytest

from schedproj.core.deferrals import Deferral
from schedproj.core.gates import blocks, evaluate, family_views
from schedproj.core.lanes import DeferralReason, Gate, GateCondition, LaneKind, LaneSpec
from schedproj.core.pipeline import decide
from schedproj.core.records import LaneState, LeaseView, RunRecord
from schedproj.core.views import LaneView

NOW = 1_000_000.0
BEHIND = GateCondition.DUE_AND_BEHIND
BUSY = GateCondition.DUE_OR_RUNNING
DEP = DeferralReason.DEPENDENCY


def view(name: str, *, due: bool = False, backlog: int = 0, in_flight: bool = False,
         never_run: bool = False, family: str | None = None,
         gates: tuple[Gate, ...] = ()) -> LaneView:
    spec = LaneSpec(name=name, task_name=name, kind=LaneKind.HEAVY, cadence_s=60.0,
                    family=family, gates=gates)
    return LaneView(spec=spec, ratio=2.0, backlog=backlog, due=due, in_flight=in_flight,
                    never_run=never_run)


#: How a blocker (or a family member) stands: keyword arguments of :func:`view`.
Kind = dict[str, Any]
IDLE: Kind = {"due": False}
HOT: Kind = {"due": True, "backlog": 5}          # due and behind
DUE_ONLY: Kind = {"due": True}                   # due by time, no backlog left
RUNNING: Kind = {"in_flight": True}
NEVER_RUN: Kind = {"due": True, "never_run": True}


def members(*kinds: Kind) -> dict[str, LaneView]:
    out = {}
    for i, kind in enumerate(kinds):
        v = view(f"fam[{i}]", family="fam", **kind)
        out[v.name] = v
    return out


# -- blocks ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("blocker", "behind", "busy"), [
    (None, False, False),
    (view("p", **IDLE), False, False),
    (view("p", **DUE_ONLY), False, True),
    (view("p", **HOT), True, True),
    (view("p", **NEVER_RUN), True, True),
    (view("p", **RUNNING), False, True),
    (view("p", in_flight=True, backlog=3), False, True),
], ids=["absent", "idle", "due-not-behind", "due-and-behind", "never-run", "running",
        "running-with-backlog"])
def test_a_gate_blocks_while_its_blocker_meets_its_condition(
        blocker: LaneView | None, behind: bool, busy: bool) -> None:
    assert blocks(Gate("p", BEHIND), blocker) is behind
    assert blocks(Gate("p", BUSY), blocker) is busy


# -- family views ------------------------------------------------------------------------------


@pytest.mark.parametrize("order", list(permutations([IDLE, RUNNING, IDLE])))
def test_a_family_is_running_while_any_member_runs_whichever_comes_first(
        order: tuple[Kind, ...]) -> None:
    fam = family_views(members(*order))["fam"]
    assert fam.in_flight and not fam.due and fam.backlog == 0
    assert blocks(Gate("fam", BUSY), fam) and not blocks(Gate("fam", BEHIND), fam)


@pytest.mark.parametrize("order", list(permutations([IDLE, HOT, DUE_ONLY])))
def test_a_family_is_due_and_behind_while_any_member_is_whichever_comes_first(
        order: tuple[Kind, ...]) -> None:
    fam = family_views(members(*order))["fam"]
    assert fam.due and fam.backlog == 1 and fam.in_flight
    assert blocks(Gate("fam", BEHIND), fam) and blocks(Gate("fam", BUSY), fam)


@pytest.mark.parametrize("order", list(permutations([IDLE, RUNNING, HOT])))
def test_a_running_member_and_a_hot_member_make_the_family_both(
        order: tuple[Kind, ...]) -> None:
    fam = family_views(members(*order))["fam"]
    assert (fam.due, fam.backlog, fam.in_flight) == (True, 1, True)


@pytest.mark.parametrize("order", list(permutations([IDLE, DUE_ONLY])))
def test_a_member_due_by_time_alone_makes_the_family_busy_but_not_behind(
        order: tuple[Kind, ...]) -> None:
    fam = family_views(members(*order))["fam"]
    assert (fam.due, fam.backlog, fam.in_flight) == (False, 0, True)
    assert blocks(Gate("fam", BUSY), fam) and not blocks(Gate("fam", BEHIND), fam)


def test_an_idle_family_blocks_nothing_and_is_named_for_the_family() -> None:
    fam = family_views(members(IDLE, IDLE))["fam"]
    assert fam.name == "fam" and fam.spec.family == "fam"
    assert (fam.due, fam.backlog, fam.in_flight, fam.never_run) == (False, 0, False, False)
    assert not blocks(Gate("fam", BUSY), fam)


@pytest.mark.parametrize("order", list(permutations([IDLE, NEVER_RUN])))
def test_a_never_run_member_makes_its_family_behind_but_the_family_has_run(
        order: tuple[Kind, ...]) -> None:
    fam = family_views(members(*order))["fam"]
    assert fam.due and fam.behind and not fam.never_run
    # A member added but never run, not due yet, leaves the family idle.
    added = family_views(members({"never_run": True}, IDLE))["fam"]
    assert (added.due, added.behind, added.in_flight, added.never_run) == (
        False, False, False, False)


def test_only_the_named_families_and_only_family_members_get_a_view() -> None:
    views = {**members(RUNNING), "solo": view("solo", **RUNNING),
             "other[x]": view("other[x]", family="other", **HOT)}
    assert set(family_views(views)) == {"fam", "other"}
    assert set(family_views(views, {"other"})) == {"other"}
    assert family_views(views, set()) == {}
    assert family_views(views, {"solo"}) == {}


def test_a_family_gate_holds_its_consumer_whichever_member_is_busy() -> None:
    """Through ``decide``: the consumer waits while the second member (not the first) runs
    or is due and behind, and goes once no member is."""
    def spec(name: str, kind: LaneKind, **kw: object) -> LaneSpec:
        return LaneSpec(name=name, task_name=name, kind=kind, cadence_s=3600.0,
                        **kw)  # type: ignore[arg-type]
    lanes = [spec("fam[a]", LaneKind.HEAVY, family="fam", order=1),
             spec("fam[b]", LaneKind.HEAVY, family="fam", order=2),
             spec("busy", LaneKind.LIGHT, order=3, gates=(Gate("fam", BUSY),)),
             spec("behind", LaneKind.LIGHT, order=4, gates=(Gate("fam", BEHIND),))]
    fresh = LaneState(run=RunRecord(last_run_at=NOW - 10))
    stale = LaneState(run=RunRecord(last_run_at=NOW - 7200))
    states = {"fam[a]": fresh, "fam[b]": fresh, "busy": stale, "behind": stale}
    assert decide(lanes, states, None, NOW).dispatched == ("busy", "behind")
    lease = LeaseView(lane="fam[b]", token="t", fence=1, granted_at=NOW - 5)
    held = decide(lanes, states, lease, NOW)
    assert held.dispatched == ("behind",)
    assert [(d.lane, d.blocker) for d in held.deferred] == [("busy", "fam")]
    with_backlog = {**states, "fam[b]": LaneState(run=RunRecord(last_run_at=NOW - 10,
                                                                backlog=4))}
    hot = decide(lanes, with_backlog, None, NOW)
    assert hot.winner == "fam[b]" and hot.also_dispatched == ()
    assert {d.lane for d in hot.deferred} == {"busy", "behind"}


@pytest.mark.parametrize("left_out", ["paused", "unreadable"])
def test_a_paused_or_unreadable_family_member_that_runs_still_holds_the_family_gate(
        left_out: str) -> None:
    """A member left out of the tick (paused by an operator, or its record unreadable) is
    still running while it holds the lease: the family runs, so a consumer gated on the
    family waits, exactly as it does while the member is not paused."""
    member = LaneSpec(name="fam[a]", task_name="fam", kind=LaneKind.HEAVY, cadence_s=3600.0,
                      family="fam", order=1)
    gated = LaneSpec(name="consumer", task_name="consumer", kind=LaneKind.LIGHT,
                     cadence_s=60.0, order=2, gates=(Gate("fam", BUSY),))
    lease = LeaseView(lane="fam[a]", token="t", fence=1, granted_at=NOW - 5,
                      started_at=NOW - 4)
    states = {"fam[a]": LaneState(run=RunRecord(last_run_at=NOW - 10)),
              "consumer": LaneState(run=RunRecord(last_run_at=NOW - 600))}
    running = decide([member, gated], states, lease, NOW)
    assert running.dispatched == () and [d.blocker for d in running.deferred] == ["fam"]
    left = decide([member, gated], states, lease, NOW, **{left_out: {"fam[a]"}})
    assert left.dispatched == ()
    assert [(d.lane, d.blocker) for d in left.deferred] == [("consumer", "fam")]


# -- evaluate: the first gate that defers, and the bound ---------------------------------------


def consumer(*gates: Gate) -> LaneView:
    return view("c", due=True, gates=gates)


def streak(blocker: str, age: float, reason: DeferralReason = DEP) -> Deferral:
    return Deferral(lane="c", reason=reason, blocker=blocker, since=NOW - age)


BLOCKERS = {"p": view("p", **RUNNING), "q": view("q", **RUNNING), "idle": view("idle")}


def test_the_first_gate_that_blocks_defers_and_later_ones_are_not_asked() -> None:
    first, second = Gate("idle", BUSY), Gate("p", BUSY)
    assert evaluate(consumer(first, second, Gate("q", BUSY)), BLOCKERS, None, NOW) == (
        second, ())
    assert evaluate(consumer(first), BLOCKERS, None, NOW) == (None, ())
    assert evaluate(consumer(Gate("missing", BUSY)), BLOCKERS, None, NOW) == (None, ())


@pytest.mark.parametrize(("age", "expired"), [(599.0, False), (600.0, True), (5000.0, True)])
def test_a_bounded_gate_lets_go_once_its_blocker_deferred_the_lane_that_long(
        age: float, expired: bool) -> None:
    gate = Gate("p", BUSY, max_defer_s=600)
    result = evaluate(consumer(gate), BLOCKERS, streak("p", age), NOW)
    assert result == ((None, (gate,)) if expired else (gate, ()))


def test_a_bound_counts_only_that_blockers_own_clock() -> None:
    gate = Gate("p", BUSY, max_defer_s=600)
    # A long streak behind another blocker, or a lease wait, starts no clock for p.
    assert evaluate(consumer(gate), BLOCKERS, streak("q", 5000), NOW) == (gate, ())
    assert evaluate(consumer(gate), BLOCKERS,
                    streak("x", 5000, DeferralReason.LEASE_HELD), NOW) == (gate, ())
    assert evaluate(consumer(gate), BLOCKERS, None, NOW) == (gate, ())
    # p took over 100 s ago inside a long streak: its clock is 100 s.
    switched = Deferral("c", DEP, "p", NOW - 5000, blocker_since=NOW - 100)
    assert evaluate(consumer(gate), BLOCKERS, switched, NOW) == (gate, ())


def test_an_expired_gate_lets_the_next_blocking_gate_defer() -> None:
    bounded, nxt = Gate("p", BUSY, max_defer_s=600), Gate("q", BUSY)
    assert evaluate(consumer(bounded, nxt), BLOCKERS, streak("p", 700), NOW) == (
        nxt, (bounded,))


def test_the_legacy_policy_applies_only_legacy_gates_and_never_lets_go() -> None:
    new = Gate("p", BUSY)
    old = Gate("q", BUSY, max_defer_s=600, in_legacy=True)
    lane = consumer(new, old)
    assert evaluate(lane, BLOCKERS, streak("q", 7000), NOW) == (new, ())
    assert evaluate(lane, BLOCKERS, streak("q", 7000), NOW, legacy=True) == (old, ())
    assert evaluate(consumer(new), BLOCKERS, None, NOW, legacy=True) == (None, ())
