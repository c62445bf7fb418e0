"""Run variants side by side and report: terminal tables, JSON."""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from schedproj.core.pressure import PressureRule
from schedproj.sim.engine import SimRun, simulate
from schedproj.sim.index import Planning
from schedproj.sim.metrics import LowerBound, Metrics, json_dict, lower_bound, summarize
from schedproj.sim.model import VARIANTS, Scenario, Variant
from schedproj.sim.progress import Progress
from schedproj.sim.scenarios import random_lanes


@dataclass(frozen=True)
class Comparison:
    """Every variant on one scenario and seed."""

    scenario: Scenario
    seed: str
    bound: LowerBound
    metrics: tuple[Metrics, ...]
    runs: dict[str, SimRun] = field(default_factory=dict, compare=False, repr=False)

    def get(self, label: str) -> Metrics:
        for m in self.metrics:
            if m.variant == label:
                return m
        raise KeyError(label)

    def as_dict(self, runs: bool = False) -> dict[str, Any]:
        """The figures of every variant; ``runs``: each variant also lists every run's start
        (:func:`run_starts`)."""
        s = self.scenario
        variants = [m.as_dict() for m in self.metrics]
        if runs:
            for row in variants:
                row["runs"] = run_starts(self.runs[row["variant"]])
        return json_dict({
            "scenario": scenario_dict(s), "seed": self.seed,
            "lower_bound": asdict(self.bound),
            "variants": variants,
        })


def run_starts(run: SimRun) -> list[dict[str, Any]]:
    """Every run's start, ``{"lane": ..., "start_s": ...}`` in seconds after virtual time zero
    (the trace's ``start``), in order of start (then lane)."""
    starts = sorted((t, name) for name, trace in run.lanes.items() for t in trace.starts)
    return [{"lane": name, "start_s": t} for t, name in starts]


def scenario_dict(s: Scenario) -> dict[str, Any]:
    out = {"name": s.name, "description": s.description, "horizon_s": s.horizon_s,
           "tick_s": s.tick_s, "hold_cap_s": s.hold_cap_s, "profile": s.profile.value,
           "wake_on_release": s.wake_on_release, "params": dict(s.params),
           "lanes": [m.name for m in s.lanes],
           "pressure": None if s.pressure is None else asdict(s.pressure)}
    if s.pools:
        out["pools"] = {p.name: p.slots for p in s.pools}
    return out


def compare(scenario: Scenario, seed: int | str = 1,
            variants: Sequence[Variant] = VARIANTS, *, progress: Progress | None = None,
            planning: Planning | str = Planning.INDEX) -> Comparison:
    """Simulate ``scenario`` under each variant with the same seed (``progress``: say how
    far it got; ``planning``: which lanes a decision plans, the same output either way)."""
    bound = lower_bound(scenario, seed)
    runs = {v.label: simulate(scenario, v, seed,
                              progress.start(v.label) if progress is not None else None,
                              planning)
            for v in variants}
    if progress is not None:
        progress.done()
    return Comparison(scenario=scenario, seed=str(seed), bound=bound,
                      metrics=tuple(summarize(r, bound) for r in runs.values()), runs=runs)


# -- the H sweep --------------------------------------------------------------------------------

@dataclass(frozen=True)
class SweepPoint:
    h: float
    index: int
    metrics: Metrics
    #: Σ run/(cadence + run): the lease share if every lane ran exactly on time (a cadence
    #: counts from the end of the last run).
    h_effective: float = 0.0


@dataclass(frozen=True)
class Sweep:
    """Random lane sets at each heavy demand H, every variant on each set."""

    hs: tuple[float, ...]
    seed: str
    sets: int
    variants: tuple[str, ...]
    points: tuple[SweepPoint, ...]
    params: dict[str, Any]

    def select(self, h: float, variant: str) -> list[Metrics]:
        return [p.metrics for p in self.points if p.h == h and p.metrics.variant == variant]

    def rows(self) -> list[dict[str, Any]]:
        """One row per (H, variant), aggregated over the sets."""
        rows = []
        for h in self.hs:
            for label in self.variants:
                ms = self.select(h, label)
                maxes = [m.max_ratio for m in ms]
                drains = [m.drain_over_lb for m in ms if m.drain_over_lb is not None]
                delays = [m.light_delay_p99_s for m in ms if m.light_delay_p99_s is not None]
                jains = [m.jain for m in ms if m.jain is not None]
                busy = [m.busy_fraction for m in ms if m.busy_fraction is not None]
                effective = [p.h_effective for p in self.points
                             if p.h == h and p.metrics.variant == label]
                rows.append({
                    "H": h, "variant": label, "sets": len(ms),
                    "H_effective_mean": statistics.fmean(effective) if effective else None,
                    "max_ratio_mean": statistics.fmean(maxes) if maxes else None,
                    "max_ratio_min": min(maxes, default=None),
                    "max_ratio_max": max(maxes, default=None),
                    "p99_ratio_mean": statistics.fmean(m.p99_ratio for m in ms) if ms else None,
                    "longest_starvation_s_max": max((m.longest_starvation_s for m in ms),
                                                    default=None),
                    "jain_mean": statistics.fmean(jains) if jains else None,
                    "drained": sum(m.drained for m in ms),
                    "drain_over_lb_mean": statistics.fmean(drains) if drains else None,
                    "light_delay_p99_s_max": max(delays, default=None),
                    "busy_fraction_min": min(busy, default=None),
                    "falsifier": sum(m.falsifier for m in ms),
                    "ref_2H": 2 * h, "ref_4H": 4 * h,
                })
        return rows

    def as_dict(self) -> dict[str, Any]:
        return json_dict({
            "scenario": "random", "seed": self.seed, "sets": self.sets, "H": list(self.hs),
            "params": self.params, "rows": self.rows(),
            "points": [{"H": p.h, "H_effective": p.h_effective, "index": p.index,
                        **p.metrics.as_dict()}
                       for p in self.points],
        })


def _sweep_task(args: tuple[float, int, str, tuple[Variant, ...], dict[str, Any]]
                ) -> list[SweepPoint]:
    h, index, seed, variants, kwargs = args
    scenario = random_lanes(h, seed=seed, index=index, **kwargs)
    effective = float(scenario.params.get("H_effective", 0.0))
    return [SweepPoint(h, index, m, effective)
            for m in compare(scenario, seed, variants).metrics]


def sweep(hs: Sequence[float], seed: int | str = 1, sets: int = 3,
          variants: Sequence[Variant] = VARIANTS, jobs: int | None = None,
          **random_kwargs: Any) -> Sweep:
    """Every variant on ``sets`` random lane sets at each H (the same sets at every H, their
    cadences scaled). ``jobs`` processes (default: up to 2); results do not depend on it."""
    tasks = [(float(h), i, str(seed), tuple(variants), dict(random_kwargs))
             for h in hs for i in range(sets)]
    jobs = jobs if jobs is not None else min(2, os.cpu_count() or 1)
    if jobs > 1 and len(tasks) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(_sweep_task, tasks))
    else:
        results = [_sweep_task(t) for t in tasks]
    return Sweep(hs=tuple(float(h) for h in hs), seed=str(seed), sets=sets,
                 variants=tuple(v.label for v in variants),
                 points=tuple(p for ps in results for p in ps),
                 params={k: asdict(v) if is_dataclass(v) and not isinstance(v, type) else v
                         for k, v in random_kwargs.items()})


# -- terminal tables ----------------------------------------------------------------------------

def fmt_s(seconds: float | None) -> str:
    """A duration, in the unit that reads best."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def yielding(rule: PressureRule | None) -> str:
    """How heavy runs yield under ``rule``, in words."""
    if rule is None:
        return "hold cap alone"
    return (f"pressure-aware yielding (target {rule.target_ratio:g}, "
            f"min hold {rule.min_hold_s:g} s)")


def comparison_tables(c: Comparison) -> list[Table]:
    s = c.scenario
    title = (f"{s.name}: seed {c.seed}, horizon {fmt_s(s.horizon_s)}, tick {s.tick_s:g} s, "
             f"hold cap {fmt_s(s.hold_cap_s)}, {yielding(s.pressure)}; "
             f"lower bound {fmt_s(c.bound.total_s)}")
    main = Table(title=escape(title))
    for col in ("variant", "drain to idle", "÷ LB", "max ratio", "p99 ratio",
                "longest starvation", "light delay p50/p99", "busy", "Jain", "falsifier"):
        main.add_column(col, no_wrap=col == "variant")
    for m in c.metrics:
        main.add_row(*map(escape, (
            m.variant, fmt_s(m.drain_s) if m.drained else "never",
            _num(m.drain_over_lb), f"{m.max_ratio:.2f} ({m.max_ratio_lane})",
            f"{m.p99_ratio:.2f} ({m.p99_ratio_lane})",
            f"{fmt_s(m.longest_starvation_s)} ({m.longest_starvation_lane or '-'})",
            f"{fmt_s(m.light_delay_p50_s)} / {fmt_s(m.light_delay_p99_s)}",
            _num(m.busy_fraction, 3), _num(m.jain, 3), str(m.falsifier))))
    lanes = Table(title="per lane: runs · max ratio · p99 ratio · longest starvation")
    lanes.add_column("lane", no_wrap=True)
    for m in c.metrics:
        lanes.add_column(m.variant)
    for lm0 in c.metrics[0].lanes if c.metrics else ():
        cells = []
        for m in c.metrics:
            lm = m.lane(lm0.name)
            cells.append(f"{lm.runs} · {lm.max_ratio:.2f} · {lm.p99_ratio:.2f} · "
                         f"{fmt_s(lm.longest_starvation_s)}")
        lanes.add_row(escape(f"{lm0.name} ({lm0.kind})"), *map(escape, cells))
    return [main, lanes, *pool_tables(c.metrics)]


def pool_tables(metrics: Sequence[Metrics]) -> list[Table]:
    """Per pool (when the scenario declares pools): slots, utilisation, Jain over its lanes
    and its worst staleness ratio, one column per variant."""
    if not metrics or not metrics[0].pools:
        return []
    table = Table(title="per pool: slots · utilisation · Jain · max ratio (lane)")
    table.add_column("pool", no_wrap=True)
    for m in metrics:
        table.add_column(m.variant)
    for name, first in metrics[0].pools.items():
        cells = [f"{first.slots} · {m.pools[name].utilisation:.3f} · "
                 f"{_num(m.pools[name].jain, 3)} · {m.pools[name].max_ratio:.2f} "
                 f"({m.pools[name].max_ratio_lane or '-'})" for m in metrics]
        table.add_row(escape(name), *map(escape, cells))
    return [table]


def sweep_table(sw: Sweep) -> Table:
    table = Table(title=f"random lane sets: {sw.sets} set(s) per H, seed {sw.seed} "
                        f"(max ratio: mean (min-max) over sets)")
    for col in ("H", "variant", "max ratio", "p99 ratio", "2·H", "4·H", "Jain",
                "drained", "drain ÷ LB", "light p99", "busy", "falsifier"):
        table.add_column(col, no_wrap=col == "variant")
    for r in sw.rows():
        table.add_row(
            f"{r['H']:g}", r["variant"],
            f"{_num(r['max_ratio_mean'])} ({_num(r['max_ratio_min'])}-"
            f"{_num(r['max_ratio_max'])})",
            _num(r["p99_ratio_mean"]), f"{r['ref_2H']:.2f}", f"{r['ref_4H']:.2f}",
            _num(r["jain_mean"], 3), f"{r['drained']}/{r['sets']}",
            _num(r["drain_over_lb_mean"]), fmt_s(r["light_delay_p99_s_max"]),
            _num(r["busy_fraction_min"], 3), str(r["falsifier"]))
    return table


def print_tables(tables: Sequence[Table], out: TextIO) -> None:
    console = Console(file=out, width=None if out.isatty() else 200)
    for t in tables:
        console.print(t)


__all__ = ["Comparison", "Sweep", "SweepPoint", "compare", "comparison_tables", "fmt_s",
           "print_tables", "run_starts", "sweep", "sweep_table"]
