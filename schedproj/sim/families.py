"""Fairness at scale (issue 11): a heavy lane family of many members sharing the lease with the
REM chain, in virtual time, through the very planner beat runs.

``schedproj simulate --scenario family --members 1000 --H 0.9``: the forensic REM chain (its
backlog included) and a ``tenant-repo-sync`` family whose members each run ``run_s`` every
``cadence_s`` (the original's 30 minutes, jitter 20 %), with ``run_s`` chosen so that the heavy
demand of the members plus the REM lanes' steady demand is ``H``. Members' last runs are spread
over one cadence by key (a deployment in steady state). Pressure-aware yielding is on, as in
beat by default (``--no-pressure``: the hold cap alone). The report says whether the REM chain
drained, every member's maximal staleness ratio, and Jain's index over the members.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from schedproj.core import defaults
from schedproj.core.families import jitter_unit, member_spec
from schedproj.core.lanes import LaneKind, LaneSpec
from schedproj.core.pressure import PressureRule
from schedproj.sim.engine import SimRun
from schedproj.sim.metrics import Metrics, jain, ratio_max
from schedproj.sim.model import BEAT_PRESSURE, LaneModel, Scenario
from schedproj.sim.scenarios import HOUR, forensic

FAMILY = "tenant-repo-sync"
#: The original's per-repository cadence and jitter (DESIGN.md section 4).
CADENCE_S = 30 * 60.0
JITTER = 0.2
#: Goals of the issue: every member's maximal staleness ratio, Jain's index over members.
MAX_RATIO_GOAL = 2.5
JAIN_GOAL = 0.95


def rem_demand(lanes: tuple[LaneModel, ...]) -> float:
    """The REM chain's steady heavy demand: Σ run_s / cadence over its time-driven heavy
    lanes (its backlog comes on top, while it drains)."""
    return sum(m.run_s / m.spec.cadence_s for m in lanes
               if m.spec.heavy and not m.spec.backlog_driven)


def family_rem(members: int = 1000, h: float = 0.9, *, horizon_s: float = 24 * HOUR,
               cadence_s: float = CADENCE_S, jitter: float = JITTER,
               tick_s: float = defaults.BEAT_MAX_LOOP_INTERVAL_S,
               pressure: PressureRule | None = BEAT_PRESSURE) -> Scenario:
    """The REM chain plus a heavy family of ``members`` members at total heavy demand ``h``.

    ``pressure`` defaults to the rule beat runs by default (``SCHEDPROJ_PRESSURE_YIELD`` is on):
    the scenario judges the fleet as deployed. None: the hold cap alone, for comparison."""
    rem = forensic(horizon_s=horizon_s, tick_s=tick_s)
    share = h - rem_demand(rem.lanes)
    if members < 1 or share <= 0:
        raise ValueError(f"H={h} leaves no share for {members} members (the REM chain "
                         f"alone needs {rem_demand(rem.lanes):.3f})")
    run_s = share * cadence_s / members
    template = LaneSpec(name=FAMILY, task_name=FAMILY, kind=LaneKind.HEAVY,
                        cadence_s=cadence_s, order=defaults.DEFAULT_LANE_ORDER, family=FAMILY)
    family = tuple(
        LaneModel(spec=member_spec(template, jitter, key), run_s=run_s, jitter=0.25,
                  last_run_ago_s=max(1.0, jitter_unit(FAMILY, key) * cadence_s))
        for key in (f"repo-{i:05d}" for i in range(members)))
    return replace(
        rem, name=f"family-{members}-H{h:g}", lanes=rem.lanes + family, pressure=pressure,
        description=f"the REM chain (forensic backlog) and {members} members of {FAMILY} "
                    f"({run_s:.2f} s every {cadence_s:g} s, jitter {jitter:g}) at H = {h:g}",
        params={**rem.params, "members": members, "H": h, "member_run_s": run_s,
                "rem_demand": rem_demand(rem.lanes)})


@dataclass(frozen=True)
class FamilyReport:
    """What the family scenario is judged by."""

    members: int
    member_max_ratio: float
    worst_member: str | None
    members_over_goal: int
    #: The members' largest ratio in the second half of the horizon (after the REM backlog's
    #: catch-up, at the steady demand H).
    member_max_ratio_second_half: float
    jain_members: float | None
    rem_drained: bool
    rem: dict[str, dict[str, Any]]

    def verdicts(self) -> dict[str, bool]:
        return {"rem_chain_drained": self.rem_drained,
                f"member_max_ratio_at_most_{MAX_RATIO_GOAL:g}":
                    self.member_max_ratio <= MAX_RATIO_GOAL,
                f"jain_members_at_least_{JAIN_GOAL:g}":
                    self.jain_members is not None and self.jain_members >= JAIN_GOAL}


def family_report(metrics: Metrics, run: SimRun, family: str = FAMILY) -> FamilyReport:
    """Fold one run's metrics: the members' worst ratio and fairness, and the REM lanes."""
    prefix = f"{family}["
    half = run.scenario.horizon_s / 2
    late = max((ratio_max([seg for seg in t.segments if seg[2] > half], t.spec.cadence_s)
                for name, t in run.lanes.items() if name.startswith(prefix)), default=0.0)
    members = [lm for lm in metrics.lanes if lm.name.startswith(prefix)]
    rem = [lm for lm in metrics.lanes if not lm.name.startswith(prefix)]
    worst = max(members, key=lambda lm: lm.max_ratio, default=None)
    return FamilyReport(
        members=len(members),
        member_max_ratio=worst.max_ratio if worst is not None else 0.0,
        worst_member=worst.name if worst is not None else None,
        members_over_goal=sum(lm.max_ratio > MAX_RATIO_GOAL for lm in members),
        member_max_ratio_second_half=late,
        jain_members=jain([lm.achieved / lm.entitled for lm in members]),
        rem_drained=all(lm.final_backlog == 0 for lm in rem),
        rem={lm.name: {"max_ratio": lm.max_ratio, "runs": lm.runs,
                       "final_backlog": lm.final_backlog} for lm in rem})


__all__ = ["FAMILY", "FamilyReport", "family_rem", "family_report", "rem_demand"]
