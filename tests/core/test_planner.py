"""The tick planner (core/planner.py): from what beat read and ``now`` to a Plan — the messages
with their ids and start deadlines, the beat-owned record changes, the quarantine after a
state loss, the narrowed plan of a refused grant, and how long beat may sleep."""

from __future__ import annotations

from schedproj.core.deferrals import Deferral
from schedproj.core.lanes import DeferralReason, DeploymentClass, LaneKind, LaneSpec, Profile
from schedproj.core.picker import Policy
from schedproj.core.pipeline import decide
from schedproj.core.planner import Plan, Send, TickInput, plan_tick, quarantine
from schedproj.core.records import LaneState, LeaseView, RunRecord, SchedRecord

NOW = 1_700_000_000.0
HOUR = 3600.0
DEADLINE_S = 30.0
QUARANTINE = DeferralReason.STATE_LOSS_QUARANTINE


def spec(name: str, kind: LaneKind = LaneKind.HEAVY, cadence_s: float = HOUR,
         order: int = 100) -> LaneSpec:
    return LaneSpec(name=name, task_name=f"t.{name}", kind=kind, cadence_s=cadence_s,
                    order=order)


def ran(ago: float, sched: SchedRecord | None = None) -> LaneState:
    return LaneState(run=RunRecord(last_run_at=NOW - ago), sched=sched or SchedRecord())


LANES = [spec("h1", order=1), spec("h2", order=2), spec("l1", LaneKind.LIGHT, order=3),
         spec("idle", LaneKind.LIGHT, order=4)]


def states() -> dict[str, LaneState]:
    return {"h1": ran(3 * HOUR), "h2": ran(2 * HOUR), "l1": ran(2 * HOUR),
            "idle": ran(HOUR / 4)}


def plan(tick: TickInput, lanes: list[LaneSpec] = LANES, now: float = NOW) -> Plan:
    return plan_tick(lanes, tick, now, profile=Profile.LOCAL, policy=Policy.STALENESS,
                     start_deadline_s=DEADLINE_S, task_id=lambda lane: f"id-{lane}")


def test_a_plan_sends_the_winner_and_the_light_lanes_with_ids_and_deadlines() -> None:
    result = plan(TickInput(states=states(), lease=None))
    assert result.decision.winner == "h1"
    assert result.sends == {"h1": Send("h1", "id-h1", NOW + DEADLINE_S),
                            "l1": Send("l1", "id-l1", NOW + DEADLINE_S)}
    assert result.heavy == Send("h1", "id-h1", NOW + DEADLINE_S)
    assert result.now == NOW
    assert result.changes["h1"] == SchedRecord(inflight_task_id="id-h1",
                                               inflight_deadline=NOW + DEADLINE_S,
                                               last_dispatch_at=NOW, dispatches=1)
    behind = Deferral(lane="h2", reason=DeferralReason.BACKPRESSURE, blocker="h1", since=NOW)
    assert result.changes["h2"] == SchedRecord(deferral=behind)
    assert result.new_deferrals == (behind,)
    # "idle" ran a quarter of its cadence ago: due in three quarters of an hour.
    assert result.next_due_in_s == 0.75 * HOUR


def test_a_plan_is_the_decision_of_the_same_input() -> None:
    tick = TickInput(states=states(), lease=None, paused={"h1"}, forced={"idle"},
                     probes={"l1": 2}, inflight_grace_s=5.0, unreadable={"h2"})
    result = plan(tick)
    assert result.decision == decide(LANES, tick.states, None, NOW, Profile.LOCAL,
                                     probes={"l1": 2}, paused={"h1"}, forced={"idle"},
                                     inflight_grace_s=5.0, unreadable={"h2"})
    assert result.decision.winner is None
    assert result.decision.also_dispatched == ("l1", "idle")


def test_the_profile_reaches_the_decision() -> None:
    local_only = LaneSpec(name="home", task_name="t.home", kind=LaneKind.HEAVY, cadence_s=HOUR,
                          deployment=DeploymentClass.LOCAL_ONLY)
    tick = TickInput(states={}, lease=None)
    cloud = plan_tick([local_only], tick, NOW, profile=Profile.CLOUD, policy=Policy.STALENESS,
                      start_deadline_s=1, task_id=str)
    assert cloud.sends == {} and cloud.decision.views == {}
    assert plan(tick, [local_only]).decision.winner == "home"


def test_a_plan_without_a_heavy_winner_has_no_heavy_send() -> None:
    lease = LeaseView(lane="h1", token="t", fence=1, granted_at=NOW - 5)
    result = plan(TickInput(states=states(), lease=lease))
    assert result.decision.winner is None and result.heavy is None
    assert set(result.sends) == {"l1"}


def test_the_registry_policy_reaches_the_picker() -> None:
    lanes = [spec("first", order=1), spec("stalest", order=2)]
    tick = TickInput(states={"first": ran(HOUR), "stalest": ran(9 * HOUR)}, lease=None)
    registry = plan_tick(lanes, tick, NOW, profile=Profile.LOCAL, policy=Policy.REGISTRY,
                         start_deadline_s=1, task_id=str)
    assert registry.decision.winner == "first"
    assert plan(tick, lanes).decision.winner == "stalest"


def test_a_quarantined_tick_dispatches_nothing_and_says_why() -> None:
    previous = Deferral(lane="l1", reason=QUARANTINE, blocker=None, since=NOW - 7)
    tick = TickInput(states={**states(), "l1": ran(2 * HOUR, SchedRecord(deferral=previous))},
                     lease=None, quarantined=True)
    result = plan(tick)
    assert result.sends == {} and result.heavy is None
    assert result.decision.winner is None and result.decision.also_dispatched == ()
    held = {d.lane: d for d in result.decision.deferred}
    assert held["h1"] == Deferral(lane="h1", reason=QUARANTINE, blocker=None, since=NOW)
    # The streak keeps its start, and one streak is logged once.
    assert (held["l1"].reason, held["l1"].since) == (QUARANTINE, NOW - 7)
    assert "h2" in held  # its backpressure deferral is kept beside the held lanes
    assert result.changes["h1"].deferral == held["h1"]
    assert sorted(d.lane for d in result.new_deferrals) == ["h1", "h2"]


def test_quarantine_of_a_lane_without_state_starts_a_streak_now() -> None:
    decision = decide([spec("new")], {}, None, NOW)
    assert decision.winner == "new"
    held = quarantine(decision, {}, NOW)
    assert held.deferred == (Deferral(lane="new", reason=QUARANTINE, blocker=None, since=NOW),)
    assert held.dispatched == ()


def test_only_sends_the_lanes_left_and_the_others_keep_their_state() -> None:
    full = plan(TickInput(states=states(), lease=None))
    light_only = full.only({"l1"})
    assert light_only.sends == {"l1": full.sends["l1"]}
    assert light_only.heavy is None
    assert "h1" not in light_only.changes
    assert light_only.changes["l1"] == full.changes["l1"]
    assert light_only.changes["h2"] == full.changes["h2"]
    assert light_only.new_deferrals == full.new_deferrals
    assert light_only.decision == full.decision and light_only.now == NOW
    assert light_only.next_due_in_s == full.next_due_in_s
    nothing = full.only(())
    assert nothing.sends == {} and set(nothing.changes) == {"h2"}


def test_beat_sleeps_until_the_next_lane_falls_due_at_most_the_interval() -> None:
    result = plan(TickInput(states=states(), lease=None))
    assert result.sleep_s(HOUR) == 0.75 * HOUR
    assert result.sleep_s(60.0) == 60.0
    all_running = plan(TickInput(states={}, lease=None), lanes=[])
    assert all_running.next_due_in_s is None
    assert all_running.sleep_s(12.5) == 12.5
