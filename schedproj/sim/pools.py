"""Pools in the simulator (issue 22): what the simulation publishes and reports per pool, and
the ``pools`` scenario.

The grants are beat's own: every decision is ``core.planner.plan_tick`` with the pools and
their holders in its ``TickInput`` (``core.pipeline.decide(pools=, holders=)``, which grants
through ``core.pools.grant``). The pressure is beat's rule per pool
(``on_celery.pool_pressure`` and ``on_celery.dispatch``): ``core.pressure.measure`` on the
lease with the default pool's lanes alone, and on each pool's longest holder with that pool's
lanes alone (:func:`lease_decision`, :func:`pool_pressure`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from schedproj.core import defaults
from schedproj.core.families import jitter_unit, member_spec
from schedproj.core.lanes import LaneKind, LaneSpec
from schedproj.core.pipeline import Decision
from schedproj.core.pools import DEFAULT_POOL, Pool
from schedproj.core.pressure import Pressure, measure
from schedproj.core.records import LaneState, LeaseView
from schedproj.sim.model import BEAT_PRESSURE, LaneModel, Scenario

if TYPE_CHECKING:  # the engine imports this module
    from schedproj.sim.engine import SimRun


def lease_decision(decision: Decision) -> Decision:
    """The decision as the lease's pressure sees it: only lanes of the default pool (a lane
    waiting for a slot of another pool does not press the lease's holder). The same decision
    when every lane is in the default pool."""
    return _pool_only(decision, DEFAULT_POOL)


def _pool_only(decision: Decision, pool: str) -> Decision:
    views = decision.views
    if all(v.spec.pool == pool for v in views.values()):
        return decision
    return replace(decision, views={n: v for n, v in views.items() if v.spec.pool == pool})


def pool_pressure(decision: Decision, states: Mapping[str, LaneState],
                  holds: Mapping[str, LeaseView], now: float) -> dict[str, Pressure | None]:
    """The pressure on each pool holding a slot (``holds``: lane -> its slot lease): its
    waiting lanes' (``measure`` on the pool's heavy lanes) on its longest holder, the hold
    that began first (then the lowest fence): only that holder yields to it."""
    first: dict[str, LeaseView] = {}
    for lease in holds.values():
        pool = decision.views[lease.lane].spec.pool if lease.lane in decision.views else None
        if pool is None:
            continue
        best = first.get(pool)
        if best is None or (lease.started_at or 0.0, lease.fence) < (best.started_at or 0.0,
                                                                     best.fence):
            first[pool] = lease
    return {pool: measure(_pool_only(decision, pool), states, holder, now)
            for pool, holder in first.items()}


@dataclass(frozen=True)
class PoolMetrics:
    """One pool's figures over [0, T]: ``utilisation`` = slot-seconds held / (slots x T);
    ``jain`` = Jain's index of achieved / entitled runs over the pool's lanes whose
    entitlement is their schedule (not backlog-driven); ``max_ratio`` the worst staleness
    ratio of any of its lanes (which, ``max_ratio_lane``)."""

    pool: str
    slots: int
    lanes: int
    runs: int
    utilisation: float
    jain: float | None
    max_ratio: float
    max_ratio_lane: str | None


def pool_metrics(run: SimRun, lanes: Sequence[tuple[str, bool, float, float, str]]
                 ) -> dict[str, PoolMetrics]:
    """Every pool's figures, for a run of a scenario that declares pools (else {}).
    ``lanes``: per enabled heavy lane, (name, backlog-driven, achieved / entitled, max
    ratio, pool)."""
    from schedproj.sim.metrics import jain

    s = run.scenario
    if not s.pools:
        return {}
    horizon = s.horizon_s
    table = {DEFAULT_POOL: 1, **{p.name: p.slots for p in s.pools}}
    held = {name: 0.0 for name in table}
    runs = dict.fromkeys(table, 0)
    for _, start, end in run.lease:
        held[DEFAULT_POOL] += end - start
        runs[DEFAULT_POOL] += 1
    for pool, _, slots, start, end in run.pool_holds:
        held[pool] += slots * (end - start)
        runs[pool] += 1
    out: dict[str, PoolMetrics] = {}
    for name, slots in table.items():
        mine = [lane for lane in lanes if lane[4] == name]
        worst = max(mine, key=lambda lane: lane[3], default=None)
        out[name] = PoolMetrics(
            pool=name, slots=slots, lanes=len(mine), runs=runs[name],
            utilisation=held[name] / (slots * horizon),
            jain=jain([lane[2] for lane in mine if not lane[1]]),
            max_ratio=worst[3] if worst is not None else 0.0,
            max_ratio_lane=worst[0] if worst is not None else None)
    return out


# -- the pools scenario ---------------------------------------------------------------------------

HOUR = 3600.0
#: The pools scenario's pool and family.
POOL, POOL_SLOTS, FAMILY = "gpu", 4, "tenant-sync"
#: The family's cadence and jitter (the original's tenant syncs: 30 minutes, 20 %).
FAMILY_CADENCE_S, FAMILY_JITTER = 30 * 60.0, 0.2
#: The pool's other lanes, of other cadences: (name, cadence, run, slots, weight). ``train``
#: needs two slots at once (the backfill rule's case); ``reindex`` is weighted 2.
POOL_LANES: tuple[tuple[str, float, float, int, float], ...] = (
    ("embed", 600.0, 120.0, 1, 1.0),
    ("reindex", HOUR, 540.0, 1, 2.0),
    ("report", 4 * HOUR, 600.0, 1, 1.0),
    ("train", 6 * HOUR, 900.0, 2, 1.0),
)
#: Goals of issue 22's simulator proof, for the family's members.
MAX_RATIO_GOAL, JAIN_GOAL = 2.5, 0.95


def slot_demand(models: Sequence[LaneModel]) -> float:
    """Slot-seconds asked per second: Σ slots x run_s / cadence over the lanes given."""
    return sum(m.spec.slots * m.run_s / m.spec.cadence_s for m in models)


def pools_scenario(members: int = 1000, h: float = 0.9, *, horizon_s: float = 8 * HOUR,
                   slots: int = POOL_SLOTS, tick_s: float = defaults.BEAT_MAX_LOOP_INTERVAL_S,
                   pressure: Any = BEAT_PRESSURE) -> Scenario:
    """A pool of ``slots`` slots (``gpu``) with a ``members``-member family (30 min, jitter
    0.2, last runs spread over a cadence) and lanes of other cadences (:data:`POOL_LANES`), at
    ``h`` per slot: Σ slots x run / cadence over the pool's lanes = ``h x slots``; beside it, on
    the one lease, a heavy ``backup`` (1 h, 5 min runs) and a light ``heartbeat`` (1 min)."""
    def lane(name: str, cadence: float, **kw: Any) -> LaneSpec:
        return LaneSpec(name=name, task_name=f"pools.{name}", kind=kw.pop("kind", LaneKind.HEAVY),
                        cadence_s=cadence, **kw)
    others = tuple(LaneModel(spec=lane(n, c, pool=POOL, slots=k, weight=w), run_s=r,
                             jitter=0.25, last_run_ago_s=c * jitter_unit(POOL, n))
                   for n, c, r, k, w in POOL_LANES)
    share = h * slots - slot_demand(others)
    if members < 1 or share <= 0:
        raise ValueError(f"H={h} per slot leaves no share for {members} members (the pool's "
                         f"other lanes need {slot_demand(others) / slots:.3f} per slot)")
    run_s = share * FAMILY_CADENCE_S / members
    template = lane(FAMILY, FAMILY_CADENCE_S, family=FAMILY, pool=POOL)
    family = tuple(
        LaneModel(spec=member_spec(template, FAMILY_JITTER, key), run_s=run_s, jitter=0.25,
                  last_run_ago_s=max(1.0, jitter_unit(FAMILY, key) * FAMILY_CADENCE_S))
        for key in (f"t{i:05d}" for i in range(members)))
    beside = (LaneModel(spec=lane("backup", HOUR), run_s=300.0, jitter=0.25,
                        last_run_ago_s=1800.0),
              LaneModel(spec=lane("heartbeat", 60.0, kind=LaneKind.LIGHT), run_s=1.0))
    return Scenario(
        name=f"pools-{members}-H{h:g}", lanes=(*others, *family, *beside),
        pools=(Pool(POOL, slots),), horizon_s=horizon_s, tick_s=tick_s, pressure=pressure,
        description=f"pool {POOL} of {slots} slots: {members} members of {FAMILY} "
                    f"({run_s:.2f} s every {FAMILY_CADENCE_S:g} s, jitter {FAMILY_JITTER:g}) "
                    f"and {', '.join(n for n, *_ in POOL_LANES)} at H = {h:g} per slot; "
                    f"backup and heartbeat on the lease",
        params={"members": members, "H_per_slot": h, "slots": slots, "member_run_s": run_s})


@dataclass(frozen=True)
class PoolsReport:
    """What the pools scenario is judged by: the family's members' worst ratio and Jain's
    index over them, and every lane's worst ratio."""

    members: int
    member_max_ratio: float
    worst_member: str | None
    jain_members: float | None
    lanes_max_ratio: dict[str, float]

    def verdicts(self) -> dict[str, bool]:
        return {f"member_max_ratio_at_most_{MAX_RATIO_GOAL:g}":
                    self.member_max_ratio <= MAX_RATIO_GOAL,
                f"jain_members_at_least_{JAIN_GOAL:g}":
                    self.jain_members is not None and self.jain_members >= JAIN_GOAL}


def pools_report(metrics: Any, family: str = FAMILY) -> PoolsReport:
    """Fold one run's metrics (:class:`schedproj.sim.metrics.Metrics`)."""
    from schedproj.sim.metrics import jain

    prefix = f"{family}["
    members = [lm for lm in metrics.lanes if lm.name.startswith(prefix)]
    worst = max(members, key=lambda lm: lm.max_ratio, default=None)
    return PoolsReport(
        members=len(members), member_max_ratio=worst.max_ratio if worst else 0.0,
        worst_member=worst.name if worst else None,
        jain_members=jain([lm.achieved / lm.entitled for lm in members]),
        lanes_max_ratio={lm.name: lm.max_ratio for lm in metrics.lanes
                         if not lm.name.startswith(prefix)})


__all__ = ["POOL_LANES", "PoolMetrics", "PoolsReport", "lease_decision", "pool_metrics",
           "pool_pressure", "pools_report", "pools_scenario", "slot_demand"]
