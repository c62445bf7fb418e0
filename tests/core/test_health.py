"""Stall observability from durable state (core/health.py): every gauge a lane row carries,
the deferral chain, starvation past the threshold, the lease over its hold cap, and the
posture the watchdog alarms on."""

from __future__ import annotations

from dataclasses import replace

import pytest

from schedproj.core.deferrals import Deferral
from schedproj.core.health import (
    Health,
    LaneHealth,
    LeaseGauge,
    Posture,
    assess,
    deferral_chain,
)
from schedproj.core.lanes import (
    DeferralReason,
    DeploymentClass,
    LaneKind,
    LaneSpec,
    Profile,
)
from schedproj.core.records import LaneState, LeaseView, Outcome, RunRecord, SchedRecord

NOW = 1_700_000_000.0
THRESHOLD = 600.0
CAP = 900.0


def spec(name: str, kind: LaneKind = LaneKind.HEAVY, order: int = 100,
         deployment: DeploymentClass = DeploymentClass.SHARED) -> LaneSpec:
    return LaneSpec(name=name, task_name=f"t.{name}", kind=kind, cadence_s=100.0, order=order,
                    deployment=deployment)


def deferred(ago: float, blocker: str | None = "x", paused: bool = False,
             reason: DeferralReason = DeferralReason.DEPENDENCY) -> LaneState:
    return LaneState(sched=SchedRecord(paused=paused, deferral=Deferral(
        lane="?", reason=reason, blocker=blocker, since=NOW - ago)))


def health(specs: list[LaneSpec], states: dict[str, LaneState], lease: LeaseView | None = None,
           profile: Profile = Profile.LOCAL, unreadable: tuple[str, ...] = ()) -> Health:
    return assess(specs, states, lease, NOW, profile, starvation_threshold_s=THRESHOLD,
                  hold_cap_s=CAP, unreadable=unreadable)


def test_a_lane_row_carries_every_gauge_of_its_records() -> None:
    run = RunRecord(last_run_at=NOW - 250, last_outcome=Outcome.FAILED, last_reason="boom",
                    backlog=4, runs=7, failures=3)
    sched = SchedRecord(dispatches=9, paused=True, inflight_task_id="m",
                        inflight_deadline=NOW + 5,
                        deferral=Deferral(lane="b", reason=DeferralReason.LEASE_HELD,
                                          blocker="a", since=NOW - 30))
    (row,) = health([spec("b", LaneKind.LIGHT, deployment=DeploymentClass.LOCAL_ONLY)],
                    {"b": LaneState(run=run, sched=sched)}).lanes
    assert row == LaneHealth(
        name="b", kind="light", queue="light", deployment="local-only", enabled=True,
        paused=True, cadence_s=100.0, last_run_at=NOW - 250, ratio=2.5, due=True,
        in_flight=True, backlog=4, last_outcome="failed", last_reason="boom", runs=7,
        failures=3, dispatches=9, deferral_reason="heavy-maintenance-lease-held",
        deferral_blocker="a", deferred_for_s=30.0)


def test_a_heavy_lane_holding_the_lease_is_shown_running() -> None:
    holder = LeaseView(lane="h", token="t", fence=1, granted_at=NOW - 5, started_at=NOW - 4)
    rows = health([spec("h"), spec("o")], {}, holder).lanes
    assert [(r.name, r.in_flight) for r in rows] == [("h", True), ("o", False)]


def test_a_lane_without_records_has_an_empty_row() -> None:
    (row,) = health([spec("a")], {}).lanes
    assert (row.kind, row.queue, row.deployment, row.paused, row.last_run_at, row.in_flight,
            row.backlog, row.last_outcome, row.last_reason, row.runs, row.failures,
            row.dispatches, row.deferral_reason, row.deferral_blocker, row.deferred_for_s) == (
        "heavy", "heavy", "shared", False, None, False, 0, None, None, 0, 0, 0, None, None,
        None)
    assert row.due


def test_a_deferral_stamped_in_the_future_counts_as_zero_seconds() -> None:
    (row,) = health([spec("a")], {"a": deferred(-50)}).lanes
    assert row.deferred_for_s == 0.0


def test_rows_come_in_declared_order_then_name() -> None:
    specs = [spec("c", order=1), spec("a", order=2), spec("b", order=1)]
    assert [h.name for h in health(specs, {}).lanes] == ["b", "c", "a"]


def test_a_lane_disabled_by_the_profile_is_shown_disabled() -> None:
    specs = [spec("a", deployment=DeploymentClass.LOCAL_ONLY)]
    assert not health(specs, {}, profile=Profile.CLOUD).lanes[0].enabled
    assert health(specs, {}, profile=Profile.LOCAL).lanes[0].enabled


def test_a_lane_deferred_from_the_threshold_on_is_starving() -> None:
    specs = [spec("at"), spec("under"), spec("over"), spec("idle")]
    states = {"at": deferred(THRESHOLD), "under": deferred(THRESHOLD - 1),
              "over": deferred(THRESHOLD * 10)}
    verdict = health(specs, states)
    assert verdict.starving == ("at", "over")
    assert verdict.posture is Posture.DEGRADED and verdict.stalled


def test_paused_or_disabled_lanes_never_count_as_starving() -> None:
    specs = [spec("p"), spec("off", deployment=DeploymentClass.LOCAL_ONLY)]
    states = {"p": deferred(THRESHOLD * 2, paused=True), "off": deferred(THRESHOLD * 2)}
    verdict = health(specs, states, profile=Profile.CLOUD)
    assert verdict.starving == ()
    assert verdict.posture is Posture.HEALTHY and not verdict.stalled


def lease(granted_ago: float, started_ago: float | None) -> LeaseView:
    return LeaseView(lane="a", token="t", fence=4, granted_at=NOW - granted_ago,
                     started_at=None if started_ago is None else NOW - started_ago)


def test_the_lease_gauge_counts_from_the_start_else_the_grant() -> None:
    started = health([spec("a")], {}, lease(100, 40)).lease
    assert started == LeaseGauge(holder="a", fence=4, granted_at=NOW - 100,
                                 started_at=NOW - 40, held_s=40.0)
    granted = health([spec("a")], {}, lease(100, None)).lease
    assert granted is not None and granted.held_s == 100.0 and granted.started_at is None
    future = health([spec("a")], {}, lease(-5, None)).lease
    assert future is not None and future.held_s == 0.0
    assert health([spec("a")], {}).lease is None
    assert health([spec("a")], {}).lease_over_cap is False


@pytest.mark.parametrize(("granted_ago", "started_ago", "over"), [
    (CAP * 3, CAP + 1, True), (CAP * 3, CAP, False), (CAP * 3, None, False),
    (CAP + 1, CAP - 1, False)])
def test_a_started_lease_held_past_the_cap_is_over_it(granted_ago: float,
                                                       started_ago: float | None,
                                                       over: bool) -> None:
    verdict = health([spec("a")], {}, lease(granted_ago, started_ago))
    assert verdict.lease_over_cap is over
    assert verdict.posture is (Posture.DEGRADED if over else Posture.HEALTHY)


def test_unreadable_lanes_or_no_lanes_give_no_verdict() -> None:
    verdict = health([spec("a")], {"a": deferred(THRESHOLD * 2)}, unreadable=("z", "b"))
    assert verdict.unreadable == ("b", "z")
    assert verdict.posture is Posture.UNKNOWN and not verdict.stalled
    assert health([], {}).posture is Posture.UNKNOWN
    assert health([spec("a")], {}).unreadable == ()


def test_the_chain_of_deferred_lanes_is_reported_with_its_depth() -> None:
    specs = [spec(n) for n in ("golden", "dream", "summary", "backfill", "other")]
    states = {"golden": deferred(10, "dream"), "dream": deferred(10, "summary"),
              "summary": deferred(10, "backfill"), "other": deferred(10, "summary")}
    verdict = health(specs, states)
    assert verdict.chain == ("golden", "dream", "summary", "backfill")
    assert verdict.chain_depth == 3
    assert verdict.now == NOW


def test_no_deferral_no_chain() -> None:
    verdict = health([spec("a")], {})
    assert (verdict.chain, verdict.chain_depth) == ((), 0)
    lone = health([spec("a")], {"a": deferred(10, None)})
    assert (lone.chain, lone.chain_depth) == (("a",), 0)


def test_deferral_chain_follows_blockers_and_prefers_the_first_longest() -> None:
    assert deferral_chain({}) == ()
    assert deferral_chain({"a": None}) == ("a",)
    assert deferral_chain({"a": "b"}) == ("a", "b")
    assert deferral_chain({"c": "d", "a": "b"}) == ("a", "b")
    assert deferral_chain({"a": "b", "b": "c", "x": "a"}) == ("x", "a", "b", "c")


def test_deferral_chain_cuts_a_cycle_instead_of_following_it() -> None:
    assert deferral_chain({"a": "b", "b": "a"}) == ("a", "b")
    assert deferral_chain({"a": "a"}) == ("a",)
    assert deferral_chain({"a": "b", "b": "c", "c": "b"}) == ("a", "b", "c")


def test_each_pool_shows_its_slots_holders_and_ranked_waiters() -> None:
    def gpu(name: str, **over: object) -> LaneSpec:
        return replace(spec(name), pool="gpu", **over)

    ran = {name: LaneState(run=RunRecord(last_run_at=NOW - ago)) for name, ago in
           (("held", 500), ("low", 250), ("heavier", 150), ("p0", 110), ("fresh", 10))}
    specs = [gpu("held"), gpu("low"), gpu("heavier", weight=2.0), gpu("p0", priority0=True),
             gpu("fresh"), spec("plain")]
    slot = LeaseView(lane="held", token="t", fence=7, granted_at=NOW - 40,
                     started_at=NOW - 30)
    h = assess(specs, ran, None, NOW, Profile.LOCAL, starvation_threshold_s=THRESHOLD,
               hold_cap_s=CAP, pools={"gpu": 2}, slots={"gpu": [None, slot]})
    rows = {row.name: row for row in h.lanes}
    assert rows["held"].queue == "gpu" and rows["held"].in_flight
    assert rows["plain"].queue == "heavy" and not rows["plain"].in_flight
    heavy, pool = h.pools
    assert (heavy.pool, heavy.slots, heavy.busy, heavy.waiters) == ("heavy", 1, 0, ("plain",))
    assert (pool.pool, pool.slots, pool.busy) == ("gpu", 2, 1)
    (holder,) = pool.holders
    assert (holder.slot, holder.holder, holder.fence, holder.held_s) == (1, "held", 7, 30.0)
    # Beat's ranking: priority-0 first, then the weighted ratio (2 x 1.5 = 3 > 2.5); the
    # holder and the lane not yet due do not wait.
    assert pool.waiters == ("p0", "heavier", "low") and pool.waiting == 3


def test_a_slot_held_past_the_hold_cap_degrades_the_posture_as_the_lease_does() -> None:
    """A pool's run past the cap stalls its pool as a lease holder past it stalls the lease:
    the posture is degraded and the slot is named; granted but not started, it is not."""
    specs = [replace(spec("a"), pool="gpu"), replace(spec("b"), pool="gpu")]
    ran = {name: LaneState(run=RunRecord(last_run_at=NOW - 10)) for name in ("a", "b")}

    def held(started_ago: float | None, lane: str = "a") -> LeaseView:
        return LeaseView(lane=lane, token="t", fence=3, granted_at=NOW - 2 * CAP,
                         started_at=None if started_ago is None else NOW - started_ago)

    def judge(*slots: LeaseView | None) -> tuple[str, tuple[str, ...]]:
        h = assess(specs, ran, None, NOW, Profile.LOCAL, starvation_threshold_s=THRESHOLD,
                   hold_cap_s=CAP, pools={"gpu": 2}, slots={"gpu": list(slots)})
        return h.posture.value, h.slots_over_cap

    assert judge(None, held(CAP - 1)) == ("healthy", ())
    assert judge(None, held(CAP + 1)) == ("degraded", ("gpu:1",))
    assert judge(held(None), None) == ("healthy", ())
