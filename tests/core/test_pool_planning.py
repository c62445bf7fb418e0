"""The planner with pools (pure): every grant of every pool gets a message in the same tick,
and a state-loss quarantine grants nothing in any pool (``planner.quarantine``)."""

from __future__ import annotations

from hypothesis import given

from schedproj.core.deferrals import Deferral
from schedproj.core.lanes import DeferralReason
from schedproj.core.picker import Policy
from schedproj.core.planner import Plan, TickInput, plan_tick
from tests.core.test_picker_properties import Scenario
from tests.core.test_pools import POOLS, PROPERTY, pooled_scenarios


def plan(sc: Scenario, holders: dict[str, list[str]], *, quarantined: bool) -> Plan:
    return plan_tick(sc.lanes, TickInput(states=sc.states, lease=sc.lease,
                                         unreadable=sc.unreadable, probes=sc.probes,
                                         quarantined=quarantined, pools=POOLS,
                                         holders=holders),
                     sc.now, profile=sc.profile, policy=Policy.STALENESS,
                     start_deadline_s=30.0, task_id=lambda lane: f"id-{lane}")


@PROPERTY
@given(pooled_scenarios())
def test_every_pool_grant_is_sent_in_the_tick(drawn: tuple[Scenario, dict[str, list[str]]]
                                              ) -> None:
    sc, holders = drawn
    p = plan(sc, holders, quarantined=False)
    granted = [g.lane for g in p.decision.pool_grants]
    assert [g.lane for g, _ in p.pool_sends] == granted
    assert set(p.sends) == set(p.decision.dispatched)
    assert set(granted) <= set(p.sends)
    for grant, send in p.pool_sends:
        assert send.lane == grant.lane and send.task_id == f"id-{grant.lane}"
        assert p.changes[grant.lane].inflight_task_id == send.task_id
    # Never more slots than are free, per pool.
    for name, pool in POOLS.items():
        if name != "heavy":
            used = sum(g.slots for g in p.decision.pool_grants if g.pool == name)
            assert used <= pool.slots - len(holders.get(name, []))


@PROPERTY
@given(pooled_scenarios())
def test_a_quarantine_grants_nothing_in_any_pool(drawn: tuple[Scenario, dict[str, list[str]]]
                                                 ) -> None:
    sc, holders = drawn
    would = plan(sc, holders, quarantined=False).decision.dispatched
    p = plan(sc, holders, quarantined=True)
    assert p.sends == {} and p.pool_sends == () and p.heavy is None
    assert p.decision.dispatched == () and p.decision.pool_grants == ()
    held: dict[str, Deferral] = {d.lane: d for d in p.decision.deferred
                                 if d.reason is DeferralReason.STATE_LOSS_QUARANTINE}
    assert set(held) == set(would)
