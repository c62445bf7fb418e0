"""The legacy registry policy, kept only to show the starvation ADR 0022 fixed. Pure."""

from __future__ import annotations

from schedproj.core.lanes import DeferralReason, Gate, GateCondition, LaneKind, LaneSpec
from schedproj.core.picker import Policy
from schedproj.core.pipeline import decide
from schedproj.core.records import LaneState, RunRecord

NOW = 1_000_000.0


def heavy(name: str, order: int, cadence: float = 600, gates: tuple[Gate, ...] = ()) -> LaneSpec:
    return LaneSpec(name=name, task_name=name, kind=LaneKind.HEAVY, cadence_s=cadence,
                    order=order, gates=gates)


SUMMARY = heavy("summary", 10, gates=(Gate("memory-summary-backfill"),))
DREAM = heavy("dream", 20, cadence=3600)
BACKFILL = heavy("memory-summary-backfill", 30)
GOLDEN = LaneSpec(name="golden-path", task_name="golden-path", kind=LaneKind.LIGHT,
                  cadence_s=3600, order=40,
                  gates=(Gate("dream", GateCondition.DUE_OR_RUNNING,
                              DeferralReason.GOLDEN_PATH_DEPENDENCY, in_legacy=True),))


def test_summary_with_backlog_monopolizes_under_registry_only() -> None:
    states = {
        "summary": LaneState(run=RunRecord(last_run_at=NOW - 1, backlog=50)),
        "dream": LaneState(run=RunRecord(last_run_at=NOW - 86400)),
        "memory-summary-backfill": LaneState(run=RunRecord(last_run_at=NOW - 5, backlog=9)),
    }
    lanes = [SUMMARY, DREAM, BACKFILL, GOLDEN]
    legacy = decide(lanes, states, None, NOW, policy=Policy.REGISTRY)
    assert legacy.winner == "summary"  # first due in the list, ADR-0022 gate not applied
    fair = decide(lanes, states, None, NOW)
    assert fair.winner == "dream"  # a day stale out-ranks a just-drained summary
    assert {d.lane for d in fair.deferred} >= {"summary"}
    # The dream -> golden-path gate predates ADR 0022: both policies apply it.
    for decision in (legacy, fair):
        assert "golden-path" in {d.lane for d in decision.deferred}
