"""Gates see running lanes even when paused or unreadable; every reference gate is bounded; the
watchdog sees light and gate-deferred lanes too (issue 10, found #7 and #8).

Before: `schedproj pause dream` while dream ran let golden-path (gated on dream "due or
running") dispatch, because a paused or unreadable lane was dropped before the gates looked at
it; golden-path's gate had no bound, and the watchdog, watching heavy lanes only, never saw it
starve. Pure tests (no Redis), except one that reads the reference lanes in a subprocess so
their shared tasks stay out of this test process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from schedproj.core.deferrals import Deferral
from schedproj.core.health import Health, Posture, assess
from schedproj.core.lanes import (
    DeferralReason,
    DeploymentClass,
    Gate,
    GateCondition,
    LaneKind,
    LaneSpec,
    Profile,
)
from schedproj.core.pipeline import decide
from schedproj.core.records import LaneState, LeaseView, RunRecord, SchedRecord
from schedproj.ops.watchdog import step

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_700_000_000.0
MIN, HOUR = 60.0, 3600.0
GOLDEN = DeferralReason.GOLDEN_PATH_DEPENDENCY

DREAM = LaneSpec(name="dream", task_name="t.dream", kind=LaneKind.HEAVY, cadence_s=HOUR,
                 order=20)
GOLDEN_PATH = LaneSpec(name="golden-path", task_name="t.golden", kind=LaneKind.LIGHT,
                       cadence_s=HOUR, order=40,
                       gates=(Gate("dream", GateCondition.DUE_OR_RUNNING, GOLDEN),))
LANES = [DREAM, GOLDEN_PATH]

STALE = LaneState(run=RunRecord(last_run_at=NOW - 2 * HOUR))
FRESH = LaneState(run=RunRecord(last_run_at=NOW - MIN))
DREAM_LEASE = LeaseView(lane="dream", token="tok", fence=3, granted_at=NOW - 5 * MIN,
                        started_at=NOW - 5 * MIN, task_id="dream-run")


def paused(state: LaneState) -> LaneState:
    return LaneState(run=state.run, sched=SchedRecord(paused=True))


def assert_golden_path_deferred_on_dream(states: dict[str, LaneState], lease: LeaseView | None,
                                         paused: tuple[str, ...] = (),
                                         unreadable: tuple[str, ...] = ()) -> None:
    decision = decide(LANES, states, lease, NOW, paused=paused, unreadable=unreadable)
    assert "golden-path" not in decision.dispatched
    (deferral,) = [d for d in decision.deferred if d.lane == "golden-path"]
    assert deferral.reason is GOLDEN and deferral.blocker == "dream"


@pytest.mark.parametrize("dream", [FRESH, STALE], ids=["dream-fresh", "dream-stale"])
def test_paused_dream_that_runs_still_holds_golden_path(dream: LaneState) -> None:
    assert_golden_path_deferred_on_dream({"dream": paused(dream), "golden-path": STALE},
                                         DREAM_LEASE)


def test_operator_paused_dream_that_runs_still_holds_golden_path() -> None:
    assert_golden_path_deferred_on_dream({"dream": FRESH, "golden-path": STALE}, DREAM_LEASE,
                                         paused=("dream",))


@pytest.mark.parametrize("with_state", [True, False], ids=["due-check-raised", "garbage-record"])
def test_unreadable_dream_that_runs_still_holds_golden_path(with_state: bool) -> None:
    states = {"golden-path": STALE, **({"dream": FRESH} if with_state else {})}
    assert_golden_path_deferred_on_dream(states, DREAM_LEASE, unreadable=("dream",))


def test_paused_dream_not_running_never_counts_as_due() -> None:
    """Paused means it will not be dispatched: its staleness must not hold golden-path."""
    decision = decide(LANES, {"dream": paused(STALE), "golden-path": STALE}, None, NOW)
    assert decision.dispatched == ("golden-path",)


LIGHT_PRODUCER = LaneSpec(name="producer", task_name="t.producer", kind=LaneKind.LIGHT,
                          cadence_s=HOUR, order=1)
CONSUMER = LaneSpec(name="consumer", task_name="t.consumer", kind=LaneKind.LIGHT,
                    cadence_s=HOUR, order=2,
                    gates=(Gate("producer", GateCondition.DUE_OR_RUNNING),))


def test_paused_light_blocker_with_a_live_run_holds_its_consumer() -> None:
    running = LaneState(
        run=RunRecord(last_run_at=NOW - HOUR, last_task_id="old", running_task_id="run-1",
                      running_since=NOW - 10, running_until=NOW + 20),
        sched=SchedRecord(inflight_task_id="run-1", inflight_deadline=NOW + 30,
                          last_dispatch_at=NOW - 15, paused=True))
    decision = decide([LIGHT_PRODUCER, CONSUMER], {"producer": running, "consumer": STALE},
                      None, NOW)
    assert decision.dispatched == ()
    assert [(d.lane, d.blocker) for d in decision.deferred] == [("consumer", "producer")]


def test_unreadable_light_blocker_may_be_running_so_it_holds_its_consumer() -> None:
    decision = decide([LIGHT_PRODUCER, CONSUMER], {"consumer": STALE}, None, NOW,
                      unreadable=["producer"])
    assert decision.dispatched == ()


def test_blocker_disabled_by_the_profile_still_never_blocks() -> None:
    local_dream = LaneSpec(name="dream", task_name="t.dream", kind=LaneKind.HEAVY,
                           cadence_s=HOUR, deployment=DeploymentClass.LOCAL_ONLY)
    decision = decide([local_dream, GOLDEN_PATH], {"dream": STALE, "golden-path": STALE},
                      DREAM_LEASE, NOW, Profile.CLOUD)
    assert decision.dispatched == ("golden-path",)


# -- every reference gate is bounded ----------------------------------------------------------

READ_REM_GATES = """
import json
from schedproj.rem import lanes
out = {}
for task in (lanes.summary, lanes.golden_path):
    out[task.lane.name] = [{"blocker": g.blocker, "max_defer_s": g.max_defer_s,
                            "reason": g.reason.value, "when": g.when.value}
                           for g in task.lane.gates]
out["GOLDEN_PATH_GATE_MAX_DEFER_S"] = lanes.GOLDEN_PATH_GATE_MAX_DEFER_S
print(json.dumps(out))
"""


def test_every_reference_gate_is_bounded() -> None:
    out = subprocess.run([sys.executable, "-c", READ_REM_GATES], cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    gates = json.loads(out.stdout)
    bound = gates.pop("GOLDEN_PATH_GATE_MAX_DEFER_S")
    assert gates["golden-path"][0]["blocker"] == "dream"
    assert gates["golden-path"][0]["max_defer_s"] == bound == 2 * HOUR
    for lane_gates in gates.values():
        assert lane_gates and all(g["max_defer_s"] for g in lane_gates), gates


BOUNDED_GOLDEN_PATH = LaneSpec(
    name="golden-path", task_name="t.golden", kind=LaneKind.LIGHT, cadence_s=HOUR, order=40,
    gates=(Gate("dream", GateCondition.DUE_OR_RUNNING, GOLDEN, max_defer_s=HOUR),))


def deferred_since(ago: float) -> LaneState:
    return LaneState(run=STALE.run, sched=SchedRecord(
        deferral=Deferral("golden-path", GOLDEN, "dream", NOW - ago)))


def test_bounded_golden_path_goes_once_dream_held_it_for_the_bound() -> None:
    lanes = [DREAM, BOUNDED_GOLDEN_PATH]
    held = decide(lanes, {"dream": STALE, "golden-path": deferred_since(HOUR - 1)},
                  DREAM_LEASE, NOW)
    assert "golden-path" not in held.dispatched
    freed = decide(lanes, {"dream": STALE, "golden-path": deferred_since(HOUR)},
                   DREAM_LEASE, NOW)
    assert "golden-path" in freed.dispatched
    assert [(lane, g.blocker) for lane, g in freed.expired_gates] == [("golden-path", "dream")]


# -- the watchdog sees light and gate-deferred lanes ------------------------------------------


def health_with(golden: LaneState, threshold: float = HOUR) -> Health:
    return assess(LANES, {"dream": STALE, "golden-path": golden}, DREAM_LEASE, NOW,
                  Profile.LOCAL, starvation_threshold_s=threshold, hold_cap_s=30 * MIN)


def test_light_lane_gate_deferred_past_the_threshold_degrades_and_latches() -> None:
    health = health_with(deferred_since(2 * HOUR))
    assert health.starving == ("golden-path",)
    assert health.posture is Posture.DEGRADED
    latch, event = step(None, health)
    assert event == "fired" and latch.stalled and latch.alarms == 1
    assert "starving:golden-path" in latch.reasons
    again, event = step(latch, health)
    assert event is None and again.alarms == 1  # one-shot: latched, not re-fired


def test_light_lane_deferred_under_the_threshold_is_healthy() -> None:
    health = health_with(deferred_since(HOUR - 1))
    assert health.posture is Posture.HEALTHY


def test_paused_light_lane_is_not_starving() -> None:
    golden = deferred_since(2 * HOUR)
    health = health_with(LaneState(run=golden.run, sched=SchedRecord(
        deferral=golden.sched.deferral, paused=True)))
    assert health.starving == ()


def test_heavy_lane_gate_deferred_past_the_threshold_degrades() -> None:
    summary = LaneSpec(name="summary", task_name="t.summary", kind=LaneKind.HEAVY,
                       cadence_s=10 * MIN, gates=(Gate("dream"),))
    state = LaneState(run=STALE.run, sched=SchedRecord(deferral=Deferral(
        "summary", DeferralReason.DEPENDENCY, "dream", NOW - 2 * HOUR)))
    health = assess([DREAM, summary], {"dream": STALE, "summary": state}, None, NOW,
                    Profile.LOCAL, starvation_threshold_s=HOUR, hold_cap_s=30 * MIN)
    assert health.starving == ("summary",) and health.posture is Posture.DEGRADED
