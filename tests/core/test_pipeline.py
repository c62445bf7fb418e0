"""Table tests of the pure scheduling core: ``pipeline.decide``, ``picker.pick``,
``pipeline.seconds_until_next_due`` and ``dispatch.sched_changes``.

No Redis, no clock: every test passes ``now`` and hand-built state records.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from schedproj.core.deferrals import Deferral
from schedproj.core.lanes import (
    DeferralReason,
    DeploymentClass,
    Gate,
    GateCondition,
    LaneKind,
    LaneSpec,
    Profile,
)
from schedproj.core.picker import Policy, pick
from schedproj.core.pipeline import Decision, decide, seconds_until_next_due
from schedproj.core.planner import Send, sched_changes
from schedproj.core.records import LaneState, LeaseView, RunRecord, SchedRecord
from schedproj.core.views import view_lane

NOW = 1_700_000_000.0
MIN = 60.0
HOUR = 3600.0
DAY = 24 * HOUR
WEEK = 7 * DAY

HEAVY = LaneKind.HEAVY
LIGHT = LaneKind.LIGHT
LEASE_HELD = DeferralReason.LEASE_HELD
BACKPRESSURE = DeferralReason.BACKPRESSURE
DEPENDENCY = DeferralReason.DEPENDENCY
GOLDEN = DeferralReason.GOLDEN_PATH_DEPENDENCY


# -- builders -------------------------------------------------------------------------------


def lane(name: str, kind: LaneKind = HEAVY, cadence_s: float = HOUR, order: int = 100,
         **kw: object) -> LaneSpec:
    return LaneSpec(name=name, task_name=f"tasks.{name}", kind=kind, cadence_s=cadence_s,
                    order=order, **kw)  # type: ignore[arg-type]


def heavy(name: str, cadence_s: float = HOUR, order: int = 100, **kw: object) -> LaneSpec:
    return lane(name, HEAVY, cadence_s, order, **kw)


def light(name: str, cadence_s: float = HOUR, order: int = 100, **kw: object) -> LaneSpec:
    return lane(name, LIGHT, cadence_s, order, **kw)


def ran(ago: float | None, backlog: int = 0, *, sched: SchedRecord | None = None,
        **run: object) -> LaneState:
    """State of a lane whose last run ended ``ago`` seconds before NOW (None: never ran)."""
    last = None if ago is None else NOW - ago
    return LaneState(run=RunRecord(last_run_at=last, backlog=backlog, **run),  # type: ignore[arg-type]
                     sched=sched or SchedRecord())


def deferred_since(ago: float, lane_name: str, reason: DeferralReason,
                   blocker: str | None) -> SchedRecord:
    return SchedRecord(deferral=Deferral(lane=lane_name, reason=reason, blocker=blocker,
                                         since=NOW - ago))


def lease_of(lane_name: str) -> LeaseView:
    return LeaseView(lane=lane_name, token="tok", fence=7, granted_at=NOW - MIN)


def apply(states: dict[str, LaneState], changes: dict[str, SchedRecord]) -> dict[str, LaneState]:
    out = dict(states)
    for name, rec in changes.items():
        out[name] = replace(out.get(name, LaneState()), sched=rec)
    return out


def deferrals(decision: Decision) -> dict[str, tuple[DeferralReason, str | None]]:
    return {d.lane: (d.reason, d.blocker) for d in decision.deferred}


def mentioned(decision: Decision) -> set[str]:
    """Every lane name a decision mentions anywhere."""
    names = set(decision.dispatched) | set(decision.views)
    names |= {d.lane for d in decision.deferred} | {d.blocker for d in decision.deferred
                                                    if d.blocker}
    names |= {lane_name for lane_name, _ in decision.expired_gates}
    return names


# -- the REM-chain lanes of DESIGN.md section 4 -----------------------------------------------

BACKUP = heavy("backup", DAY, order=90, priority0=True)
BACKFILL = heavy("memory-summary-backfill", 10 * MIN, order=20, backlog_driven=True)
SUMMARY = heavy("summary", 10 * MIN, order=30,
                gates=(Gate("memory-summary-backfill", GateCondition.DUE_AND_BEHIND),))
DREAM = heavy("dream", HOUR, order=40)
GOLDEN_PATH = light("golden-path", HOUR, order=50,
                    gates=(Gate("dream", GateCondition.DUE_OR_RUNNING, GOLDEN),))
KB_SYNC = heavy("kb-sync", 30 * MIN, order=10)
PRIMARY_DEV_SYNC = heavy("primary-dev-sync", 10 * MIN, order=60,
                         deployment=DeploymentClass.LOCAL_ONLY)
HEARTBEAT = light("swarm-heartbeat", 20 * MIN, order=70, deployment=DeploymentClass.LOCAL_ONLY)
WATCHDOG = light("embed-drain-liveness-watchdog", HOUR, order=80)


# -- the original system's picker suite (DESIGN.md section 4) ---------------------------------


@pytest.mark.parametrize(
    ("other", "other_state"),
    [
        pytest.param(KB_SYNC, ran(31 * MIN), id="fresher-registry-earlier-lane"),
        pytest.param(KB_SYNC, ran(5 * HOUR), id="staler-registry-earlier-lane"),
        pytest.param(BACKFILL, ran(8 * WEEK, backlog=371), id="hugely-stale-backfill"),
        pytest.param(BACKFILL, ran(None), id="never-run-backfill"),
    ],
)
def test_backup_priority0_wins(other: LaneSpec, other_state: LaneState) -> None:
    # backup is declared later and is only just due (ratio ~1.04) yet wins outright.
    decision = decide([other, BACKUP], {"backup": ran(25 * HOUR), other.name: other_state},
                      None, NOW)
    assert decision.views["backup"].ratio == pytest.approx(25 / 24)
    assert decision.winner == "backup"
    assert deferrals(decision) == {other.name: (BACKPRESSURE, "backup")}


def test_weeks_stale_golden_path_outranks_just_drained_summary() -> None:
    # A ranking statement: golden-path made heavy so that both compete for the lease.
    golden_heavy = replace(GOLDEN_PATH, kind=HEAVY, gates=(), order=50)
    summary = replace(SUMMARY, gates=())
    states = {"golden-path": ran(3 * WEEK), "summary": ran(10, backlog=4)}
    decision = decide([summary, golden_heavy], states, None, NOW)
    assert decision.winner == "golden-path"
    assert deferrals(decision) == {"summary": (BACKPRESSURE, "golden-path")}


def test_weeks_stale_golden_path_outranks_just_drained_summary_via_picker() -> None:
    golden = view_lane(replace(GOLDEN_PATH, kind=HEAVY), ran(3 * WEEK), None, NOW)
    summary = view_lane(SUMMARY, ran(10, backlog=4), None, NOW)
    assert golden.ratio == pytest.approx(3 * WEEK / HOUR)
    assert summary.due and summary.ratio < 1
    assert pick([summary, golden]) is golden
    assert pick([golden, summary]) is golden


def test_never_run_backfill_outranks_recently_run_lane() -> None:
    states = {"kb-sync": ran(31 * MIN), "memory-summary-backfill": ran(None)}
    decision = decide([KB_SYNC, BACKFILL], states, None, NOW)
    assert decision.views["memory-summary-backfill"].ratio == math.inf
    assert decision.winner == "memory-summary-backfill"
    assert deferrals(decision) == {"kb-sync": (BACKPRESSURE, "memory-summary-backfill")}


@pytest.mark.parametrize(
    ("lanes", "expected"),
    [
        pytest.param([heavy("zeta", order=2), heavy("alpha", order=1)], "alpha",
                     id="earlier-order-beats-name"),
        pytest.param([heavy("alpha", order=2), heavy("zeta", order=1)], "zeta",
                     id="earlier-order-beats-earlier-name"),
        pytest.param([heavy("zeta", order=1), heavy("alpha", order=1)], "alpha",
                     id="same-order-name-decides"),
        pytest.param([heavy("beta"), heavy("alpha"), heavy("gamma")], "alpha",
                     id="default-order-name-decides"),
    ],
)
def test_equal_ratios_go_to_declared_order_then_name(lanes: list[LaneSpec],
                                                     expected: str) -> None:
    states = {s.name: ran(2 * HOUR) for s in lanes}
    for given in (lanes, list(reversed(lanes))):
        decision = decide(given, states, None, NOW)
        assert decision.winner == expected
        assert {d.lane for d in decision.deferred} == {s.name for s in lanes} - {expected}


def test_no_metadata_falls_back_to_declared_order() -> None:
    lanes = [DREAM, SUMMARY, KB_SYNC]  # orders 40, 30, 10; nothing ever ran anywhere
    for given in (lanes, list(reversed(lanes))):
        decision = decide(given, {}, None, NOW)
        assert decision.winner == "kb-sync"
        assert all(v.ratio == math.inf for v in decision.views.values())


def test_no_metadata_backup_still_wins() -> None:
    decision = decide([KB_SYNC, DREAM, BACKUP], {}, None, NOW)
    assert decision.winner == "backup"


def test_picker_empty_pool() -> None:
    assert pick([]) is None
    assert pick([], Policy.REGISTRY) is None


# -- the heavy lease and backpressure ----------------------------------------------------------


def test_heavy_lanes_deferred_while_lease_held_light_lanes_still_go() -> None:
    lanes = [BACKUP, KB_SYNC, DREAM, WATCHDOG, HEARTBEAT]
    states = {name: ran(None) for name in ("backup", "kb-sync", "watchdog")}
    states["dream"] = ran(2 * HOUR)
    decision = decide(lanes, states, lease_of("dream"), NOW)
    assert decision.winner is None
    assert deferrals(decision) == {
        "backup": (LEASE_HELD, "dream"),
        "kb-sync": (LEASE_HELD, "dream"),
    }
    # dream holds the lease: it counts as in flight, is not deferred behind itself.
    assert decision.views["dream"].in_flight
    assert set(decision.also_dispatched) == {"embed-drain-liveness-watchdog", "swarm-heartbeat"}


def test_lease_held_by_a_lane_not_in_the_set_still_defers() -> None:
    decision = decide([KB_SYNC], {}, lease_of("retired-lane"), NOW)
    assert decision.winner is None
    assert deferrals(decision) == {"kb-sync": (LEASE_HELD, "retired-lane")}


def test_losers_deferred_with_backpressure_behind_winner() -> None:
    lanes = [KB_SYNC, DREAM, SUMMARY, WATCHDOG]
    states = {"kb-sync": ran(31 * MIN), "dream": ran(5 * HOUR), "summary": ran(11 * MIN),
              "embed-drain-liveness-watchdog": ran(2 * HOUR)}
    decision = decide(lanes, states, None, NOW)
    assert decision.winner == "dream"
    assert deferrals(decision) == {"kb-sync": (BACKPRESSURE, "dream"),
                                   "summary": (BACKPRESSURE, "dream")}
    assert decision.also_dispatched == ("embed-drain-liveness-watchdog",)
    assert decision.dispatched == ("dream", "embed-drain-liveness-watchdog")
    assert all(d.since == NOW for d in decision.deferred)


def test_nothing_due_nothing_dispatched() -> None:
    states = {"kb-sync": ran(MIN), "dream": ran(MIN), "embed-drain-liveness-watchdog": ran(MIN)}
    decision = decide([KB_SYNC, DREAM, WATCHDOG], states, None, NOW)
    assert decision == Decision(winner=None, views=decision.views)
    assert decision.dispatched == ()


# -- in-flight light lanes ---------------------------------------------------------------------


def inflight(deadline_in: float, last_task_id: str | None = "older",
             running: tuple[str, float] | None = None) -> LaneState:
    run = RunRecord(last_run_at=NOW - 2 * HOUR, last_task_id=last_task_id)
    if running is not None:
        run = replace(run, running_task_id=running[0], running_until=NOW + running[1])
    return LaneState(run=run, sched=SchedRecord(inflight_task_id="t-1",
                                                inflight_deadline=NOW + deadline_in))


@pytest.mark.parametrize(
    ("state", "dispatched"),
    [
        pytest.param(inflight(30), False, id="deadline-ahead"),
        pytest.param(inflight(30, last_task_id=None), False, id="deadline-ahead-first-run"),
        pytest.param(inflight(-1), True, id="deadline-passed"),
        pytest.param(inflight(0), True, id="deadline-now"),
        pytest.param(inflight(30, last_task_id="t-1"), True, id="finished"),
        pytest.param(inflight(-30, running=("t-1", 60)), False, id="running-within-bound"),
        pytest.param(inflight(-30, running=("t-1", -1)), True, id="running-past-bound"),
        # An older run still running (its mark fresh) keeps the lane in flight: at most one
        # run per light lane, even when beat's record of the newer message is past its deadline.
        pytest.param(inflight(-30, running=("t-0", 60)), False, id="other-task-running"),
    ],
)
def test_light_lane_in_flight_not_dispatched_again(state: LaneState, dispatched: bool) -> None:
    decision = decide([WATCHDOG], {WATCHDOG.name: state}, None, NOW)
    assert decision.views[WATCHDOG.name].due
    assert decision.views[WATCHDOG.name].in_flight is not dispatched
    assert decision.also_dispatched == ((WATCHDOG.name,) if dispatched else ())
    assert decision.deferred == ()


def test_heavy_lane_in_flight_is_the_lease_holder() -> None:
    # A heavy run lives exactly as long as its lease: the lease holder is in flight ...
    held = decide([DREAM, KB_SYNC], {"dream": ran(5 * HOUR), "kb-sync": ran(HOUR)},
                  lease_of("dream"), NOW)
    assert held.views["dream"].in_flight
    assert held.winner is None
    assert deferrals(held) == {"kb-sync": (LEASE_HELD, "dream")}
    # ... and a heavy lane whose lease is gone is not, whatever its in-flight record says.
    free = decide([DREAM, KB_SYNC], {"dream": inflight(30), "kb-sync": ran(31 * MIN)},
                  None, NOW)
    assert not free.views["dream"].in_flight
    assert free.winner == "dream"
    assert deferrals(free) == {"kb-sync": (BACKPRESSURE, "dream")}


# -- soft gates --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backfill_state", "probe", "deferred"),
    [
        pytest.param(ran(MIN, backlog=371), None, True, id="due-with-backlog"),
        pytest.param(ran(None), None, True, id="never-run"),
        pytest.param(ran(MIN, backlog=0), 12, True, id="probe-reports-backlog"),
        pytest.param(ran(MIN, backlog=0), None, False, id="drained"),
        pytest.param(ran(None), 0, False, id="never-run-probe-empty"),
        pytest.param(ran(MIN, backlog=5), 0, False, id="probe-overrides-stale-backlog"),
    ],
)
def test_due_and_behind_gate(backfill_state: LaneState, probe: int | None,
                             deferred: bool) -> None:
    probes = {} if probe is None else {"memory-summary-backfill": probe}
    states = {"memory-summary-backfill": backfill_state, "summary": ran(HOUR)}
    decision = decide([SUMMARY, BACKFILL], states, None, NOW, probes=probes)
    if deferred:
        assert deferrals(decision)["summary"] == (DEPENDENCY, "memory-summary-backfill")
        assert decision.winner == "memory-summary-backfill"
    else:
        assert decision.winner == "summary"
        assert "summary" not in deferrals(decision)


def test_due_and_behind_gate_blocker_due_by_time_but_not_behind() -> None:
    producer = heavy("producer", HOUR, order=1)
    consumer = light("consumer", MIN, gates=(Gate("producer"),))
    states = {"producer": ran(2 * HOUR, backlog=0), "consumer": ran(HOUR)}
    decision = decide([producer, consumer], states, None, NOW)
    assert decision.views["producer"].due and not decision.views["producer"].behind
    assert decision.winner == "producer"
    assert decision.also_dispatched == ("consumer",)


@pytest.mark.parametrize(
    ("dream_state", "lease", "deferred"),
    [
        pytest.param(ran(2 * HOUR), None, True, id="dream-due"),
        pytest.param(ran(10 * MIN), lease_of("dream"), True, id="dream-running-holds-lease"),
        pytest.param(ran(10 * MIN, sched=SchedRecord(inflight_task_id="d-1",
                                                     inflight_deadline=NOW + 30)),
                     None, False, id="dream-inflight-record-without-lease"),
        pytest.param(ran(10 * MIN), None, False, id="dream-idle"),
        pytest.param(ran(10 * MIN), lease_of("kb-sync"), False, id="other-lane-holds-lease"),
    ],
)
def test_due_or_running_gate(dream_state: LaneState, lease: LeaseView | None,
                             deferred: bool) -> None:
    states = {"dream": dream_state, "golden-path": ran(3 * HOUR)}
    decision = decide([DREAM, GOLDEN_PATH], states, lease, NOW)
    if deferred:
        assert deferrals(decision)["golden-path"] == (GOLDEN, "dream")
        assert "golden-path" not in decision.dispatched
    else:
        assert decision.also_dispatched == ("golden-path",)
        assert "golden-path" not in deferrals(decision)


@pytest.mark.parametrize(("deadline_in", "deferred"), [(30, True), (-1, False)])
def test_due_or_running_gate_on_light_blocker_in_flight(deadline_in: float,
                                                        deferred: bool) -> None:
    producer = light("producer", HOUR, order=1)
    consumer = light("consumer", HOUR, gates=(Gate("producer", GateCondition.DUE_OR_RUNNING),))
    states = {"producer": replace(inflight(deadline_in), run=RunRecord(last_run_at=NOW - MIN)),
              "consumer": ran(2 * HOUR)}
    decision = decide([producer, consumer], states, None, NOW)
    assert not decision.views["producer"].due
    if deferred:
        assert deferrals(decision) == {"consumer": (DEPENDENCY, "producer")}
        assert decision.also_dispatched == ()
    else:
        assert decision.also_dispatched == ("consumer",)


def test_heavy_lane_gated_gets_gate_reason_and_producer_wins() -> None:
    states = {"summary": ran(2 * HOUR), "memory-summary-backfill": ran(MIN, backlog=10),
              "kb-sync": ran(2 * HOUR)}
    decision = decide([SUMMARY, BACKFILL, KB_SYNC], states, None, NOW)
    assert decision.winner == "kb-sync"  # ratio 4 beats backfill's 0.1 and gated summary's 12
    assert deferrals(decision) == {
        "summary": (DEPENDENCY, "memory-summary-backfill"),
        "memory-summary-backfill": (BACKPRESSURE, "kb-sync"),
    }


def test_gate_whose_blocker_is_disabled_by_profile_does_not_defer() -> None:
    local_producer = heavy("primary-dev-sync", 10 * MIN, deployment=DeploymentClass.LOCAL_ONLY)
    consumer = light("consumer", MIN,
                     gates=(Gate("primary-dev-sync", GateCondition.DUE_OR_RUNNING),))
    states = {"primary-dev-sync": ran(HOUR, backlog=3), "consumer": ran(HOUR)}
    local = decide([local_producer, consumer], states, None, NOW, Profile.LOCAL)
    assert deferrals(local) == {"consumer": (DEPENDENCY, "primary-dev-sync")}
    cloud = decide([local_producer, consumer], states, None, NOW, Profile.CLOUD)
    assert cloud.also_dispatched == ("consumer",)
    assert cloud.deferred == ()


def test_first_matching_gate_reports_its_own_reason() -> None:
    a, b = heavy("a", order=1), heavy("b", order=2)
    consumer = light("consumer", MIN, gates=(
        Gate("a", GateCondition.DUE_OR_RUNNING, GOLDEN),
        Gate("b", GateCondition.DUE_OR_RUNNING, DEPENDENCY),
    ))
    states = {"a": ran(MIN), "b": ran(2 * HOUR), "consumer": ran(HOUR)}
    decision = decide([a, b, consumer], states, None, NOW)
    assert deferrals(decision)["consumer"] == (DEPENDENCY, "b")


# -- max_defer_s and the deferral streak -------------------------------------------------------

CAPPED_GATE = Gate("dream", GateCondition.DUE_OR_RUNNING, GOLDEN, max_defer_s=600)
CAPPED = light("golden-path", HOUR, gates=(CAPPED_GATE,))


@pytest.mark.parametrize(
    ("previous", "released"),
    [
        pytest.param(None, False, id="no-streak"),
        pytest.param(deferred_since(599, "golden-path", GOLDEN, "dream"), False,
                     id="streak-shorter-than-cap"),
        pytest.param(deferred_since(600, "golden-path", GOLDEN, "dream"), True,
                     id="streak-equal-to-cap"),
        pytest.param(deferred_since(7200, "golden-path", GOLDEN, "dream"), True,
                     id="streak-longer-than-cap"),
        pytest.param(deferred_since(7200, "golden-path", DEPENDENCY, "kb-sync"), False,
                     id="long-streak-behind-another-blocker"),
    ],
)
def test_max_defer_s_releases_a_long_streak(previous: SchedRecord | None,
                                            released: bool) -> None:
    states = {"dream": ran(2 * HOUR),
              "golden-path": ran(3 * HOUR, sched=previous or SchedRecord())}
    decision = decide([DREAM, CAPPED], states, None, NOW)
    if released:
        assert decision.also_dispatched == ("golden-path",)
        assert decision.expired_gates == (("golden-path", CAPPED_GATE),)
        assert "golden-path" not in deferrals(decision)
    else:
        assert decision.also_dispatched == ()
        assert decision.expired_gates == ()
        assert deferrals(decision)["golden-path"] == (GOLDEN, "dream")


def test_expired_gate_lets_the_next_gate_defer() -> None:
    second = Gate("kb-sync", GateCondition.DUE_OR_RUNNING, DEPENDENCY)
    consumer = light("golden-path", HOUR, gates=(CAPPED_GATE, second))
    states = {"dream": ran(2 * HOUR), "kb-sync": ran(2 * HOUR),
              "golden-path": ran(3 * HOUR, sched=deferred_since(900, "golden-path", GOLDEN,
                                                                "dream"))}
    decision = decide([DREAM, KB_SYNC, consumer], states, None, NOW)
    assert decision.expired_gates == (("golden-path", CAPPED_GATE),)
    assert deferrals(decision)["golden-path"] == (DEPENDENCY, "kb-sync")


@pytest.mark.parametrize("lease", [None, lease_of("dream")], ids=["gate", "lease"])
def test_deferral_since_is_kept_from_existing_streak(lease: LeaseView | None) -> None:
    reason, blocker = (GOLDEN, "dream") if lease is None else (LEASE_HELD, "dream")
    spec = light("golden-path", HOUR, gates=(Gate("dream", GateCondition.DUE_OR_RUNNING,
                                                  GOLDEN),))
    if lease is not None:
        spec = heavy("golden-path", HOUR)
    previous = deferred_since(1234, "golden-path", reason, blocker)
    states = {"dream": ran(2 * HOUR), "golden-path": ran(3 * HOUR, sched=previous)}
    decision = decide([DREAM, spec], states, lease, NOW)
    (deferral,) = [d for d in decision.deferred if d.lane == "golden-path"]
    assert deferral == previous.deferral
    assert deferral.since == NOW - 1234


def test_deferral_since_starts_now_without_a_streak() -> None:
    states = {"dream": ran(2 * HOUR), "golden-path": ran(3 * HOUR)}
    decision = decide([DREAM, GOLDEN_PATH], states, None, NOW)
    (deferral,) = decision.deferred
    assert deferral == Deferral("golden-path", GOLDEN, "dream", NOW)


def test_max_defer_s_streak_counts_only_time_behind_that_blocker() -> None:
    # Light lanes only, so the lease plays no part. "consumer" waits on a, then on b (capped).
    capped = Gate("b", GateCondition.DUE_OR_RUNNING, max_defer_s=600)
    lanes = [light("a", HOUR, order=1), light("b", HOUR, order=2),
             light("consumer", MIN, order=3,
                   gates=(Gate("a", GateCondition.DUE_OR_RUNNING), capped))]
    # consumer has been deferred behind a for two hours; a has just finished, b is due.
    states = {"a": ran(MIN), "b": ran(2 * HOUR),
              "consumer": ran(3 * HOUR, sched=deferred_since(2 * HOUR, "consumer", DEPENDENCY,
                                                              "a"))}
    first = decide(lanes, states, None, NOW)
    assert deferrals(first) == {"consumer": (DEPENDENCY, "b")}
    assert first.also_dispatched == ("b",)
    changes, news = sched_changes(first, states, {"b": Send("b", "b-1", NOW + HOUR)}, NOW)
    # The streak keeps its start (two hours ago); b's clock starts now, when b took over.
    behind_b = Deferral(lane="consumer", reason=DEPENDENCY, blocker="b", since=NOW - 2 * HOUR,
                        blocker_since=NOW)
    assert changes["consumer"] == SchedRecord(deferral=behind_b)
    assert news == [behind_b]
    states = apply(states, changes)
    # Three seconds later b is still running: it has deferred consumer for 3 s, not 600 s.
    second = decide(lanes, states, None, NOW + 3)
    assert second.views["b"].in_flight
    assert second.expired_gates == ()
    assert deferrals(second) == {"consumer": (DEPENDENCY, "b")}
    assert second.deferred == (behind_b,)
    # b still runs, but 600 s behind it have passed: its gate lets consumer go.
    assert decide(lanes, states, None, NOW + 599).deferred == (behind_b,)
    released = decide(lanes, states, None, NOW + 601)
    assert released.expired_gates == (("consumer", capped),)
    assert released.also_dispatched == ("consumer",)


# -- deployment profile, paused, unreadable ----------------------------------------------------

ALL_LANES = [BACKUP, BACKFILL, SUMMARY, DREAM, GOLDEN_PATH, KB_SYNC, PRIMARY_DEV_SYNC,
             HEARTBEAT, WATCHDOG]
LOCAL_ONLY = {"primary-dev-sync", "swarm-heartbeat"}


@pytest.mark.parametrize("lease", [None, lease_of("kb-sync")], ids=["lease-free", "lease-held"])
def test_local_only_lanes_absent_under_cloud(lease: LeaseView | None) -> None:
    # The local-only lanes are the stalest of all: under LOCAL one of them wins.
    states = {s.name: ran(WEEK) for s in ALL_LANES if s.name not in LOCAL_ONLY}
    states["backup"] = ran(HOUR)
    local = decide(ALL_LANES, states, None, NOW, Profile.LOCAL)
    assert local.winner == "primary-dev-sync"
    assert "swarm-heartbeat" in local.also_dispatched
    cloud = decide(ALL_LANES, states, lease, NOW, Profile.CLOUD)
    assert not mentioned(cloud) & LOCAL_ONLY
    assert set(cloud.views) == {s.name for s in ALL_LANES} - LOCAL_ONLY


def test_local_only_winner_only_under_local_profile() -> None:
    decision = decide([PRIMARY_DEV_SYNC, HEARTBEAT], {}, None, NOW, Profile.CLOUD)
    assert decision == Decision(winner=None)


@pytest.mark.parametrize("how", ["paused", "unreadable"])
def test_paused_and_unreadable_lanes_excluded(how: str) -> None:
    states = {"dream": ran(5 * HOUR), "kb-sync": ran(HOUR),
              "embed-drain-liveness-watchdog": ran(2 * HOUR)}
    unreadable: tuple[str, ...] = ()
    if how == "paused":
        for name in ("dream", "embed-drain-liveness-watchdog"):
            states[name] = replace(states[name], sched=SchedRecord(paused=True))
    else:
        unreadable = ("dream", "embed-drain-liveness-watchdog")
    decision = decide([DREAM, KB_SYNC, WATCHDOG], states, None, NOW, unreadable=unreadable)
    assert decision.winner == "kb-sync"
    assert decision.also_dispatched == ()
    assert decision.deferred == ()
    assert set(decision.views) == {"kb-sync"}


# -- backlog-driven lanes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "probe", "due"),
    [
        pytest.param(ran(None), None, True, id="never-run-no-probe"),
        pytest.param(ran(None), 0, False, id="never-run-probe-empty"),
        pytest.param(ran(None), 5, True, id="never-run-probe-backlog"),
        pytest.param(ran(WEEK), None, False, id="stale-without-backlog"),
        pytest.param(ran(MIN, backlog=3), None, True, id="run-reported-backlog"),
        pytest.param(ran(MIN, backlog=3), 0, False, id="probe-overrides-run-backlog"),
        pytest.param(ran(MIN), 2, True, id="probe-reports-backlog"),
        pytest.param(ran(WEEK, backlog=-4), None, False, id="negative-backlog-not-due"),
    ],
)
def test_backlog_driven_due_only_with_backlog(state: LaneState, probe: int | None,
                                              due: bool) -> None:
    probes = {} if probe is None else {BACKFILL.name: probe}
    decision = decide([BACKFILL], {BACKFILL.name: state}, None, NOW, probes=probes)
    assert decision.views[BACKFILL.name].due is due
    assert decision.views[BACKFILL.name].backlog >= 0
    assert decision.winner == (BACKFILL.name if due else None)


def test_backlog_driven_lane_ranked_with_its_cadence() -> None:
    # Backlog-driven, cadence 10 min, last ran 25 min ago: ratio 2.5 beats kb-sync's 2.
    states = {BACKFILL.name: ran(25 * MIN, backlog=1), "kb-sync": ran(HOUR)}
    decision = decide([KB_SYNC, BACKFILL], states, None, NOW)
    assert decision.views[BACKFILL.name].ratio == pytest.approx(2.5)
    assert decision.winner == BACKFILL.name


@pytest.mark.parametrize(
    ("state", "probe", "due"),
    [
        pytest.param(ran(59 * MIN), None, False, id="ratio-below-one"),
        pytest.param(ran(HOUR), None, True, id="ratio-exactly-one"),
        pytest.param(ran(MIN, backlog=2), None, True, id="backlog-makes-due"),
        pytest.param(ran(MIN), 4, True, id="probe-makes-due"),
        pytest.param(ran(-MIN), None, False, id="clock-skew-future-run"),
    ],
)
def test_time_driven_due(state: LaneState, probe: int | None, due: bool) -> None:
    probes = {} if probe is None else {"dream": probe}
    view = decide([DREAM], {"dream": state}, None, NOW, probes=probes).views["dream"]
    assert view.due is due
    assert view.ratio >= 0


# -- legacy registry policy --------------------------------------------------------------------


def test_registry_policy_picks_first_due_in_declared_order() -> None:
    states = {"kb-sync": ran(31 * MIN), "dream": ran(3 * WEEK), "backup": ran(2 * DAY)}
    lanes = [BACKUP, DREAM, KB_SYNC]
    assert decide(lanes, states, None, NOW, policy=Policy.REGISTRY).winner == "kb-sync"
    assert decide(lanes, states, None, NOW, policy=Policy.STALENESS).winner == "backup"
    without_backup = decide([DREAM, KB_SYNC], states, None, NOW)
    assert without_backup.winner == "dream"


def test_registry_policy_starves_the_chain() -> None:
    # The original failure: summary always due with backlog and registry-first wins forever.
    summary = replace(SUMMARY, gates=(), order=1)
    states = {"summary": ran(5, backlog=1354), "dream": ran(3 * WEEK)}
    registry = decide([DREAM, summary], states, None, NOW, policy=Policy.REGISTRY)
    assert registry.winner == "summary"
    assert deferrals(registry) == {"dream": (BACKPRESSURE, "summary")}
    assert decide([DREAM, summary], states, None, NOW).winner == "dream"


# -- seconds_until_next_due --------------------------------------------------------------------


def next_due(lanes: list[LaneSpec], states: dict[str, LaneState],
             lease: LeaseView | None = None) -> float | None:
    decision = decide(lanes, states, lease, NOW)
    return seconds_until_next_due(decision.views, states, NOW)


def test_seconds_until_next_due_is_the_earliest_idle_lane() -> None:
    states = {"dream": ran(10 * MIN), "kb-sync": ran(25 * MIN),
              "embed-drain-liveness-watchdog": ran(59 * MIN)}
    assert next_due([DREAM, KB_SYNC, WATCHDOG], states) == pytest.approx(MIN)


@pytest.mark.parametrize(
    ("lanes", "states", "lease", "expected"),
    [
        pytest.param([], {}, None, None, id="no-lanes"),
        pytest.param([DREAM], {}, None, None, id="never-run-is-due-now"),
        pytest.param([DREAM], {"dream": ran(2 * HOUR)}, None, None, id="already-due"),
        pytest.param([DREAM], {"dream": ran(10 * MIN)}, lease_of("dream"), None,
                     id="in-flight"),
        pytest.param([BACKFILL], {BACKFILL.name: ran(MIN)}, None, None, id="backlog-driven"),
        pytest.param([DREAM, BACKFILL], {"dream": ran(45 * MIN), BACKFILL.name: ran(MIN)},
                     None, 15 * MIN, id="backlog-driven-ignored"),
        pytest.param([DREAM], {"dream": ran(-MIN)}, None, HOUR + MIN, id="future-run"),
    ],
)
def test_seconds_until_next_due_cases(lanes: list[LaneSpec], states: dict[str, LaneState],
                                      lease: LeaseView | None,
                                      expected: float | None) -> None:
    result = next_due(lanes, states, lease)
    if expected is None:
        assert result is None
    else:
        assert result == pytest.approx(expected)


# -- dispatch.sched_changes --------------------------------------------------------------------


def test_sched_changes_dispatched_lanes_get_inflight() -> None:
    old_deferral = Deferral("dream", BACKPRESSURE, "kb-sync", NOW - 300)
    states = {"dream": ran(2 * HOUR, sched=SchedRecord(dispatches=4, deferral=old_deferral)),
              "embed-drain-liveness-watchdog": ran(2 * HOUR)}
    decision = decide([DREAM, WATCHDOG], states, None, NOW)
    sends = {name: Send(name, f"id-{name}", NOW + 60) for name in decision.dispatched}
    changes, news = sched_changes(decision, states, sends, NOW)
    assert changes == {
        "dream": SchedRecord(inflight_task_id="id-dream", inflight_deadline=NOW + 60,
                             last_dispatch_at=NOW, dispatches=5, deferral=None),
        "embed-drain-liveness-watchdog": SchedRecord(
            inflight_task_id="id-embed-drain-liveness-watchdog", inflight_deadline=NOW + 60,
            last_dispatch_at=NOW, dispatches=1),
    }
    assert news == []


def test_sched_changes_keep_other_fields() -> None:
    states = {"dream": ran(2 * HOUR, sched=SchedRecord(inflight_task_id="old",
                                                       inflight_deadline=NOW - 5,
                                                       last_dispatch_at=NOW - HOUR,
                                                       dispatches=2))}
    decision = decide([DREAM], states, None, NOW)
    changes, _ = sched_changes(decision, states, {"dream": Send("dream", "new", NOW + 9)}, NOW)
    assert changes["dream"] == SchedRecord(inflight_task_id="new", inflight_deadline=NOW + 9,
                                           last_dispatch_at=NOW, dispatches=3)


def test_sched_changes_report_a_streak_once() -> None:
    lanes = [DREAM, GOLDEN_PATH, KB_SYNC]
    states = {"dream": ran(2 * HOUR), "golden-path": ran(3 * HOUR), "kb-sync": ran(31 * MIN)}
    first = decide(lanes, states, None, NOW)
    assert first.winner == "dream"
    sends = {"dream": Send("dream", "d-1", NOW + 60)}
    changes, news = sched_changes(first, states, sends, NOW)
    expected_news = [Deferral("golden-path", GOLDEN, "dream", NOW),
                     Deferral("kb-sync", BACKPRESSURE, "dream", NOW)]
    assert sorted(news, key=lambda d: d.lane) == expected_news
    assert {d.lane: changes[d.lane].deferral for d in expected_news} == {
        d.lane: d for d in expected_news}

    # Next tick: dream in flight holds the lease; golden-path's streak is unchanged.
    states = apply(states, changes)
    second = decide(lanes, states, lease_of("dream"), NOW + 3)
    assert deferrals(second) == {"golden-path": (GOLDEN, "dream"),
                                 "kb-sync": (LEASE_HELD, "dream")}
    changes, news = sched_changes(second, states, {}, NOW + 3)
    # golden-path: same reason and blocker, same since -> neither written nor reported.
    assert "golden-path" not in changes
    # kb-sync: lost the pick to dream, now waits for dream's lease: one wait, same blocker
    # and streak -> neither rewritten nor reported (a hand-off must not rewrite every lane).
    assert news == [] and changes == {}

    # Third tick: still the same; nothing to write, nothing to report.
    states = apply(states, changes)
    third = decide(lanes, states, lease_of("dream"), NOW + 6)
    assert sched_changes(third, states, {}, NOW + 6) == ({}, [])


def test_sched_changes_clear_deferrals_of_lanes_no_longer_deferred() -> None:
    states = {
        "dream": ran(10 * MIN, last_task_id="d-1",
                     sched=SchedRecord(inflight_task_id="d-1", dispatches=1)),
        "golden-path": ran(3 * HOUR, sched=deferred_since(300, "golden-path", GOLDEN,
                                                          "dream")),
        "kb-sync": ran(MIN, sched=deferred_since(300, "kb-sync", LEASE_HELD, "dream")),
    }
    decision = decide([DREAM, GOLDEN_PATH, KB_SYNC], states, None, NOW)
    assert decision.also_dispatched == ("golden-path",)
    sends = {"golden-path": Send("golden-path", "g-1", NOW + 60)}
    changes, news = sched_changes(decision, states, sends, NOW)
    assert news == []
    assert changes["kb-sync"] == SchedRecord()  # no longer due: deferral cleared
    assert changes["golden-path"].deferral is None
    assert changes["golden-path"].inflight_task_id == "g-1"
    # dream's dispatch ended (its run recorded d-1): only its in-flight fields are forgotten.
    assert changes["dream"] == SchedRecord(dispatches=1)


def test_sched_changes_forget_a_dispatch_once_its_run_ended_or_was_refused() -> None:
    sched = SchedRecord(inflight_task_id="d-1", inflight_deadline=NOW + 60,
                        last_dispatch_at=NOW - 600, dispatches=4)
    forgotten = replace(sched, inflight_task_id=None, inflight_deadline=None)
    cases = {
        "ended": (RunRecord(last_run_at=NOW - 10, last_task_id="d-1", runs=4), forgotten),
        "refused": (RunRecord(last_run_at=NOW - 900, last_task_id="d-0", runs=3,
                              skipped_task_id="d-1"), forgotten),
        # Started, not ended: the record still names the message, whose end is to come.
        "running": (RunRecord(last_run_at=NOW - 900, last_task_id="d-0", runs=3,
                              running_task_id="d-1", running_since=NOW - 5,
                              running_until=NOW + 55), None),
        # Not started: the message may still be delivered until its deadline.
        "sent": (RunRecord(last_run_at=NOW - 900, last_task_id="d-0", runs=3), None),
    }
    for case, (run, expected) in cases.items():
        states = {"dream": LaneState(run=run, sched=sched)}
        decision = decide([DREAM], states, None, NOW)
        assert decision.dispatched == ()
        changes, _ = sched_changes(decision, states, {}, NOW)
        assert changes.get("dream") == expected, case
    # Forgotten once: the record written reads back with nothing to forget.
    states = {"dream": LaneState(run=cases["ended"][0], sched=forgotten)}
    assert sched_changes(decide([DREAM], states, None, NOW), states, {}, NOW) == ({}, [])


def test_sched_changes_winner_without_send_stays_as_it_was() -> None:
    # The beat could not get the lease: the winner is not sent and not deferred either.
    states = {"dream": ran(2 * HOUR)}
    decision = decide([DREAM], states, None, NOW)
    assert sched_changes(decision, states, {}, NOW) == ({}, [])


def test_sched_changes_end_the_streak_of_lanes_outside_the_decision() -> None:
    """A paused lane is not deferred: its old streak ends, so on resume it starts afresh."""
    paused = SchedRecord(paused=True, deferral=Deferral("dream", GOLDEN, "x", NOW - 5))
    states = {"dream": ran(2 * HOUR, sched=paused)}
    decision = decide([DREAM], states, None, NOW)
    assert sched_changes(decision, states, {}, NOW) == (
        {"dream": SchedRecord(paused=True)}, [])


# -- light lanes' order within a tick, and due ratios other than 1 ------------------------------


def test_light_lanes_go_out_in_declared_order_then_name_whatever_order_given() -> None:
    lanes = [light("zeta", order=1), light("beta", order=3), light("alpha", order=3),
             light("omega", order=2), light("mid", order=-1)]
    states = {s.name: ran(2 * HOUR) for s in lanes}
    expected = ("mid", "zeta", "omega", "alpha", "beta")
    assert decide(lanes, states, None, NOW).also_dispatched == expected
    assert decide(lanes[::-1], states, None, NOW).also_dispatched == expected
    assert list(decide(lanes[::-1], states, None, NOW).views) == list(expected)


def test_deferrals_are_listed_in_declared_order() -> None:
    lanes = [heavy("c", order=1), heavy("a", order=2), heavy("b", order=2)]
    states = {s.name: ran(2 * HOUR) for s in lanes}
    decision = decide(lanes[::-1], states, lease_of("other"), NOW)
    assert [d.lane for d in decision.deferred] == ["c", "a", "b"]


@pytest.mark.parametrize(("due_ratio", "ago", "due"), [
    (0.8, 0.8 * HOUR, True), (0.8, 0.79 * HOUR, False), (1.2, 1.19 * HOUR, False),
    (1.2, 1.2 * HOUR, True)])
def test_a_lane_is_due_at_its_due_ratio(due_ratio: float, ago: float, due: bool) -> None:
    spec = replace(light("member"), due_ratio=due_ratio)
    decision = decide([spec], {"member": ran(ago)}, None, NOW)
    assert decision.views["member"].due is due
    assert decision.also_dispatched == (("member",) if due else ())
    # Ranking still uses the true staleness ratio, not the due ratio.
    assert decision.views["member"].ratio == pytest.approx(ago / HOUR)


@pytest.mark.parametrize("due_ratio", [0.7, 1.3])
def test_the_next_due_time_follows_the_due_ratio(due_ratio: float) -> None:
    spec = replace(light("member"), due_ratio=due_ratio)
    states = {"member": ran(0.5 * HOUR)}
    assert next_due([spec], states) == pytest.approx((due_ratio - 0.5) * HOUR)


def test_a_new_family_member_is_just_due_at_its_due_ratio_from_when_it_was_added() -> None:
    early = replace(light("fam[a]"), family="fam", due_ratio=0.8)
    late = replace(light("fam[b]"), family="fam", due_ratio=1.25)
    states = {"fam[a]": ran(None, since=NOW - 10), "fam[b]": ran(None, since=NOW - 10)}
    decision = decide([early, late], states, None, NOW)
    assert decision.also_dispatched == ("fam[a]", "fam[b]")
    # "a" counts as having run one cadence before it was added, "b" its due ratio's worth.
    assert decision.views["fam[a]"].ratio == pytest.approx(1.0 + 10 / HOUR)
    assert decision.views["fam[b]"].ratio == pytest.approx(1.25 + 10 / HOUR)


def test_a_forced_lane_is_due_whatever_its_cadence_and_still_needs_the_lease() -> None:
    lanes = [heavy("h"), light("l")]
    states = {"h": ran(MIN), "l": ran(MIN)}
    assert decide(lanes, states, None, NOW).dispatched == ()
    forced = decide(lanes, states, None, NOW, forced={"h", "l"})
    assert forced.winner == "h" and forced.also_dispatched == ("l",)
    held = decide(lanes, states, lease_of("x"), NOW, forced={"h"})
    assert deferrals(held) == {"h": (LEASE_HELD, "x")}


def test_the_inflight_grace_keeps_a_stalled_light_run_in_flight() -> None:
    run = ran(2 * HOUR, running_task_id="r", running_until=NOW - 5)
    assert decide([light("l")], {"l": run}, None, NOW).also_dispatched == ("l",)
    graced = decide([light("l")], {"l": run}, None, NOW, inflight_grace_s=10)
    assert graced.also_dispatched == () and graced.views["l"].in_flight


def test_a_paused_lane_given_as_an_argument_is_left_out() -> None:
    lanes = [light("a"), light("b")]
    states = {"a": ran(2 * HOUR), "b": ran(2 * HOUR)}
    decision = decide(lanes, states, None, NOW, paused={"a"})
    assert decision.also_dispatched == ("b",) and set(decision.views) == {"b"}


def test_a_paused_blocker_that_still_runs_keeps_blocking_but_is_never_due() -> None:
    gated = light("consumer", gates=(Gate("producer", GateCondition.DUE_OR_RUNNING),))
    producer = light("producer")
    running = ran(2 * HOUR, running_task_id="r", running_until=NOW + 60)
    states = {"consumer": ran(2 * HOUR), "producer": running}
    held = decide([gated, producer], states, None, NOW, paused={"producer"})
    assert deferrals(held) == {"consumer": (DEPENDENCY, "producer")}
    assert held.gate_views["producer"].in_flight and not held.gate_views["producer"].due
    idle = {"consumer": ran(2 * HOUR), "producer": ran(2 * HOUR)}
    free = decide([gated, producer], idle, None, NOW, paused={"producer"})
    assert free.also_dispatched == ("consumer",)


def test_a_blocker_the_profile_disables_is_not_viewed_for_gates() -> None:
    producer = light("producer", deployment=DeploymentClass.LOCAL_ONLY)
    gated = light("consumer", gates=(Gate("producer", GateCondition.DUE_OR_RUNNING),))
    states = {"consumer": ran(2 * HOUR),
              "producer": ran(2 * HOUR, running_task_id="r", running_until=NOW + 60)}
    decision = decide([gated, producer], states, None, NOW, Profile.CLOUD,
                      paused={"producer"})
    assert "producer" not in decision.gate_views
    assert decision.also_dispatched == ("consumer",)


def test_an_unreadable_light_blocker_without_a_record_counts_as_running() -> None:
    gated = light("consumer", gates=(Gate("producer", GateCondition.DUE_OR_RUNNING),))
    states = {"consumer": ran(2 * HOUR)}
    decision = decide([gated, light("producer")], states, None, NOW, unreadable={"producer"})
    assert deferrals(decision) == {"consumer": (DEPENDENCY, "producer")}
    # With its record read (it is merely unreadable this tick for its due-check), it is idle.
    known = {**states, "producer": ran(MIN)}
    read = decide([gated, light("producer")], known, None, NOW, unreadable={"producer"})
    assert read.also_dispatched == ("consumer",)


def test_a_family_gate_blocks_whichever_member_is_busy() -> None:
    members = [replace(light(f"fam[{k}]"), family="fam") for k in ("a", "b", "c")]
    gated = light("consumer", gates=(Gate("fam", GateCondition.DUE_OR_RUNNING),))
    for busy in ("fam[a]", "fam[c]"):
        states = {m.name: ran(MIN) for m in members}
        states[busy] = ran(MIN, running_task_id="r", running_until=NOW + 60)
        states["consumer"] = ran(2 * HOUR)
        decision = decide([gated, *members], states, None, NOW)
        assert deferrals(decision) == {"consumer": (DEPENDENCY, "fam")}, busy
    idle = {m.name: ran(MIN) for m in members} | {"consumer": ran(2 * HOUR)}
    assert decide([gated, *members], idle, None, NOW).also_dispatched == ("consumer",)


def test_the_next_due_time_is_exact_below_a_second() -> None:
    assert next_due([DREAM], {"dream": ran(HOUR - 0.25)}) == pytest.approx(0.25)


def test_the_next_due_time_takes_the_backlog_the_due_check_reported() -> None:
    # The record still says 3 items behind, but this tick's due-check found none: the lane is
    # due by time only, not at once.
    states = {"dream": ran(45 * MIN, backlog=3)}
    decision = decide([DREAM], states, None, NOW, probes={"dream": 0})
    assert not decision.views["dream"].due
    assert seconds_until_next_due(decision.views, states, NOW) == pytest.approx(15 * MIN)


def test_a_paused_blocker_whose_mark_just_lapsed_blocks_within_the_grace() -> None:
    gated = light("consumer", gates=(Gate("producer", GateCondition.DUE_OR_RUNNING),))
    stalled = ran(2 * HOUR, running_task_id="r", running_until=NOW - 5)
    states = {"consumer": ran(2 * HOUR), "producer": stalled}
    graced = decide([gated, light("producer")], states, None, NOW, paused={"producer"},
                    inflight_grace_s=10)
    assert deferrals(graced) == {"consumer": (DEPENDENCY, "producer")}
    assert graced.gate_views["producer"].due is False
    ungraced = decide([gated, light("producer")], states, None, NOW, paused={"producer"})
    assert ungraced.also_dispatched == ("consumer",)


def test_the_gates_see_only_the_families_a_gate_names() -> None:
    members = [replace(light(f"{f}[a]"), family=f) for f in ("fam", "other")]
    gated = light("consumer", gates=(Gate("fam"),))
    decision = decide([gated, *members], {}, None, NOW)
    assert "fam" in decision.gate_views and "other" not in decision.gate_views
