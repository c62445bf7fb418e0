"""The hot path's records built without their dataclass ``__init__`` (``core.frozen``) are the
records ``__init__`` builds: equal, hashable alike, frozen, their fields in the same order (a
record's JSON is its ``__dict__`` in order: ``records.encode``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace

import pytest

from schedproj.core.deferrals import Deferral, new_deferral
from schedproj.core.frozen import evolve, is_plain
from schedproj.core.lanes import DeferralReason, LaneKind, LaneSpec
from schedproj.core.pipeline import Decision, new_decision
from schedproj.core.planner import Plan, Send, TickInput
from schedproj.core.pools import Grant, Grants
from schedproj.core.records import LaneState, RunRecord, SchedRecord, encode
from schedproj.core.views import LaneView, new_view

SPEC = LaneSpec(name="a", task_name="t.a", kind=LaneKind.HEAVY, cadence_s=60.0)


def _same(fast: object, slow: object) -> None:
    assert fast == slow and repr(fast) == repr(slow)
    assert list(vars(fast).items()) == list(vars(slow).items())
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.x = 1  # type: ignore[attr-defined]


def test_the_fast_constructors_build_what_init_builds() -> None:
    _same(new_view(SPEC, 1.5, 2, True, False, False),
          LaneView(spec=SPEC, ratio=1.5, backlog=2, due=True, in_flight=False, never_run=False))
    _same(new_deferral("a", DeferralReason.LEASE_HELD, "b", 3.0),
          Deferral(lane="a", reason=DeferralReason.LEASE_HELD, blocker="b", since=3.0))
    _same(new_deferral("a", DeferralReason.DEPENDENCY, "b", 3.0, 4.0, "c"),
          Deferral("a", DeferralReason.DEPENDENCY, "b", 3.0, 4.0, "c"))
    _same(new_decision("a", ("b",), (), (), {}, {}, (), {}),
          Decision(winner="a", also_dispatched=("b",)))
    assert hash(new_deferral("a", DeferralReason.LEASE_HELD, None, 1.0)) == hash(
        Deferral("a", DeferralReason.LEASE_HELD, None, 1.0))


def test_evolve_is_replace_for_plain_records() -> None:
    sched = SchedRecord(dispatches=2, paused=True)
    changed = evolve(sched, deferral=new_deferral("a", DeferralReason.LEASE_HELD, None, 1.0),
                     dispatches=3)
    _same(changed, replace(sched, deferral=Deferral("a", DeferralReason.LEASE_HELD, None, 1.0),
                           dispatches=3))
    assert encode(changed) == encode(replace(changed))
    run = RunRecord(last_run_at=5.0, runs=1)
    _same(evolve(run, fence=2), replace(run, fence=2))
    _same(evolve(LaneState(), run=run, sched=sched), LaneState(run=run, sched=sched))
    assert evolve(sched) is not sched and evolve(sched) == sched


def test_every_record_built_fast_is_plain_and_a_checked_class_goes_through_replace() -> None:
    for cls in (LaneView, Deferral, Decision, Plan, Send, TickInput, Grant, Grants, LaneState,
                RunRecord, SchedRecord):
        assert is_plain(cls), cls

    @dataclass(frozen=True)
    class Checked:
        n: int

        def __post_init__(self) -> None:
            if self.n < 0:
                raise ValueError("negative")

    assert not is_plain(Checked)
    with pytest.raises(ValueError, match="negative"):
        evolve(Checked(1), n=-1)
