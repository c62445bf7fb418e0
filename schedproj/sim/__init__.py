"""``schedproj simulate``: a discrete-event simulator of the fair scheduler in virtual time.

It drives the project's own pipeline (:func:`schedproj.core.pipeline.decide`), picker and
:func:`schedproj.core.planner.sched_changes` with a model of run durations, backlog, arrivals,
yields at the hold cap, gates and failures, and compares policy variants on the same scenario
and seed. See docs/simulator.md.

    from schedproj.sim import compare, forensic
    c = compare(forensic(), seed=1)
    c.get("staleness+pass").drain_s
"""

from __future__ import annotations

from schedproj.sim.engine import LaneTrace, SimRun, Simulation, simulate
from schedproj.sim.metrics import (
    LaneMetrics,
    LowerBound,
    Metrics,
    jain,
    lower_bound,
    percentile,
    summarize,
)
from schedproj.sim.model import (
    VARIANTS,
    Arrival,
    Blocked,
    LaneModel,
    Scenario,
    SimError,
    Variant,
)
from schedproj.sim.report import Comparison, Sweep, compare, sweep
from schedproj.sim.scenarios import DEFAULT_HS, forensic, random_lanes
from schedproj.sim.trace import TraceError, load_trace, parse_trace, scenario_to_trace

__all__ = [
    "DEFAULT_HS",
    "VARIANTS",
    "Arrival",
    "Blocked",
    "Comparison",
    "LaneMetrics",
    "LaneModel",
    "LaneTrace",
    "LowerBound",
    "Metrics",
    "Scenario",
    "SimError",
    "SimRun",
    "Simulation",
    "Sweep",
    "TraceError",
    "Variant",
    "compare",
    "forensic",
    "jain",
    "load_trace",
    "lower_bound",
    "parse_trace",
    "percentile",
    "random_lanes",
    "scenario_to_trace",
    "simulate",
    "summarize",
    "sweep",
]
