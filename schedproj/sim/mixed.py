"""Mixed cadences: lane sets whose cadences span 1 minute to 24 hours, work arriving each period
in items, a fixed start-up cost per run, and the metrics that mean something when work arrives
by itself. Compares, on the same sets and seed, pressure-aware yielding (the project's
default), the hold cap alone (30 min), a short fixed hold cap (120 s) and the legacy picker.
"""

from __future__ import annotations

import math
import os
import random
import statistics
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from rich.table import Table

from schedproj.core import defaults
from schedproj.core.lanes import LaneKind, LaneSpec
from schedproj.core.picker import Policy
from schedproj.core.pressure import HOLD_CAP, PRESSURE, PressureRule
from schedproj.sim.engine import SimRun, simulate
from schedproj.sim.metrics import percentile, ratio_max
from schedproj.sim.model import BEAT_PRESSURE, Arrival, LaneModel, Scenario, Variant

MINUTE, HOUR = 60.0, 3600.0
#: Cadences are drawn log-uniform over this range (seconds): 1 minute to 24 hours.
DEFAULT_CADENCE_RANGE = (MINUTE, 24 * HOUR)
#: The default sweep: half load and near saturation.
MIXED_HS = (0.5, 0.9)
#: Sets per H of the default sweep.
MIXED_SETS = 20
#: Seconds per work item, items per batch (a checkpoint every ~30 s).
ITEM_S, BATCH = 10.0, 3
#: A run's fixed start-up cost is drawn from this range (seconds), at most a quarter of the
#: lane's work per period.
STARTUP_RANGE = (5.0, 60.0)
#: The fixed short hold cap compared against (seconds).
SHORT_CAP_S = 120.0


def mixed_lanes(h: float, *, seed: int | str = 1, index: int = 0, n_heavy: int = 8,
                cadence_range: tuple[float, float] = DEFAULT_CADENCE_RANGE,
                item_s: float = ITEM_S, batch: int = BATCH, periods: float = 2.0,
                horizon_s: float | None = None, tick_s: float = defaults.BEAT_MAX_LOOP_INTERVAL_S,
                hold_cap_s: float = defaults.HOLD_CAP_S,
                pressure: PressureRule | None = BEAT_PRESSURE,
                fail_prob: float = 0.0, wake_on_release: bool = True) -> Scenario:
    """``n_heavy`` heavy lanes, cadences log-uniform over ``cadence_range``; lane i gets the
    share h·w_i/Σw of the lease (w_i ~ U(0.5, 1.5)), so its work per period is that share of
    its cadence: a fixed start-up cost (U(5 s, 60 s), at most a quarter of it) paid by every run,
    and items of about ``item_s`` that arrive once per cadence (at a random phase) and are done
    in batches of ``batch`` (the checkpoint). Run lengths thus differ between lanes as their
    cadences do. Every lane last ran less than one cadence before 0. The set depends on
    ``seed`` and ``index``, not on ``h``. Horizon: ``periods`` times the longest cadence."""
    lo, hi = cadence_range
    if h <= 0 or n_heavy < 1 or not 0 < lo <= hi:
        raise ValueError(f"need H > 0, n_heavy >= 1, 0 < low <= high; got {h}, {n_heavy}, "
                         f"{cadence_range}")
    rng = random.Random(f"mixed-lanes|{seed}|{index}")
    cadences = [math.exp(rng.uniform(math.log(lo), math.log(hi))) for _ in range(n_heavy)]
    weights = [rng.uniform(0.5, 1.5) for _ in range(n_heavy)]
    startups = [rng.uniform(*STARTUP_RANGE) for _ in range(n_heavy)]
    phases = [rng.random() for _ in range(n_heavy)]
    ages = [rng.random() for _ in range(n_heavy)]
    orders = rng.sample(range(n_heavy), n_heavy)
    horizon = horizon_s if horizon_s is not None else periods * max(cadences)
    lanes, arrivals = [], []
    for i, cadence in enumerate(cadences):
        name = f"m{i + 1:02d}"
        period_s = h * weights[i] / sum(weights) * cadence
        startup = min(startups[i], period_s / 4)
        items = max(1, round((period_s - startup) / item_s))
        lanes.append(LaneModel(
            spec=LaneSpec(name=name, task_name=f"sim.{name}", kind=LaneKind.HEAVY,
                          cadence_s=cadence, order=10 * (orders[i] + 1)),
            run_s=startup, item_s=(period_s - startup) / items, batch=batch,
            fail_prob=fail_prob, last_run_ago_s=cadence * ages[i]))
        at = phases[i] * cadence
        while at < horizon:
            arrivals.append(Arrival(at, name, items))
            at += cadence
    return Scenario(
        name=f"mixed-H{h:g}-{index}", lanes=tuple(lanes), arrivals=tuple(arrivals),
        tick_s=tick_s, hold_cap_s=hold_cap_s, horizon_s=horizon, pressure=pressure,
        wake_on_release=wake_on_release,
        description=f"{n_heavy} heavy lanes, cadences log-uniform {lo:g}-{hi:g} s, work "
                    f"arriving each period in ~{item_s:g} s items at H = {h:g}",
        params={"H": h, "index": index, "n_heavy": n_heavy, "cadence_range": [lo, hi],
                "cadences_s": [round(c, 1) for c in cadences]},
    )


# -- configurations compared on the same sets ---------------------------------------------------

@dataclass(frozen=True)
class Config:
    """One way of yielding to compare: the picker policy, the hold cap, pressure on or off."""

    label: str
    policy: Policy
    hold_cap_s: float
    pressure: PressureRule | None


def configs(rule: PressureRule | None = None,
            hold_cap_s: float = defaults.HOLD_CAP_S) -> tuple[Config, ...]:
    """Pressure-aware yielding (``rule``, default beat's), the hold cap alone, the short
    fixed cap, and the legacy picker (first due in declared order, hold cap alone)."""
    rule = rule or BEAT_PRESSURE or PressureRule()
    return (
        Config("pressure", Policy.STALENESS, hold_cap_s, rule),
        Config(f"cap-{hold_cap_s:g}s", Policy.STALENESS, hold_cap_s, None),
        Config(f"cap-{SHORT_CAP_S:g}s", Policy.STALENESS, SHORT_CAP_S, None),
        Config("legacy", Policy.REGISTRY, hold_cap_s, None),
    )


# -- metrics ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MixedMetrics:
    """One configuration on one set. Ratios are staleness ratios; ``*_per_h`` per hour of
    virtual time."""

    config: str
    #: Largest staleness ratio of any heavy lane at the instant one of its runs started.
    start_ratio_max: float
    #: Nearest-rank 99th percentile of the ratios at run start.
    start_ratio_p99: float
    start_ratio_lane: str | None
    #: Largest staleness ratio of any heavy lane at any instant (including during its run).
    max_ratio: float
    #: Longest a due heavy lane waited for the lease (seconds).
    longest_wait_s: float
    yields_per_h: float
    pressure_yields: int
    cap_yields: int
    #: Yields at an instant when no other heavy lane was due (nobody was waiting).
    idle_yields: int
    #: Time the lease was held ÷ the horizon.
    busy_fraction: float
    #: Start-up cost paid on the lease (seconds) and as a fraction of the horizon.
    startup_s: float
    startup_fraction: float


def mixed_metrics(run: SimRun, label: str) -> MixedMetrics:
    horizon = run.scenario.horizon_s
    starts = run.starts
    best = max(starts, key=lambda s: s[2], default=None)
    heavy = [t for t in run.lanes.values() if t.enabled and t.spec.heavy]
    reasons = [y[2] for y in run.yields]
    return MixedMetrics(
        config=label,
        start_ratio_max=best[2] if best else 0.0,
        start_ratio_p99=percentile([s[2] for s in starts], 99) or 0.0,
        start_ratio_lane=best[0] if best else None,
        max_ratio=max((ratio_max(t.segments, t.spec.cadence_s) for t in heavy), default=0.0),
        longest_wait_s=max((s[3] for s in starts), default=0.0),
        yields_per_h=len(run.yields) / horizon * HOUR,
        pressure_yields=reasons.count(PRESSURE), cap_yields=reasons.count(HOLD_CAP),
        idle_yields=sum(1 for y in run.yields if not y[3]),
        busy_fraction=run.held_s / horizon,
        startup_s=run.startup_s, startup_fraction=run.startup_s / horizon,
    )


# -- the sweep ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class MixedPoint:
    h: float
    index: int
    metrics: MixedMetrics


def _task(args: tuple[float, int, str, tuple[Config, ...], dict[str, Any]]) -> list[MixedPoint]:
    h, index, seed, cfgs, kwargs = args
    base = mixed_lanes(h, seed=seed, index=index, **kwargs)
    points = []
    for cfg in cfgs:
        scenario = base.with_(hold_cap_s=cfg.hold_cap_s, pressure=cfg.pressure)
        run = simulate(scenario, Variant(cfg.policy, True), seed)
        points.append(MixedPoint(h, index, mixed_metrics(run, cfg.label)))
    return points


@dataclass(frozen=True)
class MixedSweep:
    hs: tuple[float, ...]
    seed: str
    sets: int
    configs: tuple[Config, ...]
    points: tuple[MixedPoint, ...]
    params: dict[str, Any]

    def select(self, h: float, label: str) -> list[MixedMetrics]:
        return [p.metrics for p in self.points if p.h == h and p.metrics.config == label]

    def rows(self) -> list[dict[str, Any]]:
        """One row per (H, configuration), aggregated over the sets."""
        rows = []
        for h in self.hs:
            for cfg in self.configs:
                ms = self.select(h, cfg.label)
                starts = [m.start_ratio_max for m in ms]
                maxes = [m.max_ratio for m in ms]
                rows.append({
                    "H": h, "config": cfg.label, "sets": len(ms),
                    "start_ratio_median": statistics.median(starts),
                    "start_ratio_max": max(starts),
                    "start_ratio_p99_mean": statistics.fmean(m.start_ratio_p99 for m in ms),
                    "max_ratio_median": statistics.median(maxes), "max_ratio_max": max(maxes),
                    "longest_wait_s_max": max(m.longest_wait_s for m in ms),
                    "yields_per_h_mean": statistics.fmean(m.yields_per_h for m in ms),
                    "pressure_yields": sum(m.pressure_yields for m in ms),
                    "cap_yields": sum(m.cap_yields for m in ms),
                    "idle_yields": sum(m.idle_yields for m in ms),
                    "busy_fraction_mean": statistics.fmean(m.busy_fraction for m in ms),
                    "startup_fraction_mean": statistics.fmean(m.startup_fraction for m in ms),
                })
        return rows

    def as_dict(self) -> dict[str, Any]:
        return {"scenario": "mixed", "seed": self.seed, "sets": self.sets, "H": list(self.hs),
                "params": self.params,
                "configs": [{"label": c.label, "policy": c.policy.value,
                             "hold_cap_s": c.hold_cap_s,
                             "pressure": asdict(c.pressure) if c.pressure else None}
                            for c in self.configs],
                "rows": self.rows(),
                "points": [{"H": p.h, "index": p.index, **asdict(p.metrics)}
                           for p in self.points]}


def mixed_sweep(hs: Sequence[float] = MIXED_HS, seed: int | str = 1, sets: int = MIXED_SETS,
                cfgs: Sequence[Config] | None = None, jobs: int | None = None,
                **lane_kwargs: Any) -> MixedSweep:
    """Every configuration on ``sets`` mixed lane sets at each H (the same sets at every H).
    ``jobs`` processes (default: up to 2); results do not depend on it."""
    chosen = tuple(cfgs) if cfgs is not None else configs()
    tasks = [(float(h), i, str(seed), chosen, dict(lane_kwargs)) for h in hs
             for i in range(sets)]
    jobs = jobs if jobs is not None else min(2, os.cpu_count() or 1)
    if jobs > 1 and len(tasks) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(_task, tasks))
    else:
        results = [_task(t) for t in tasks]
    params = {k: (list(v) if isinstance(v, tuple) else v) for k, v in lane_kwargs.items()}
    return MixedSweep(hs=tuple(float(h) for h in hs), seed=str(seed), sets=sets,
                      configs=chosen, points=tuple(p for ps in results for p in ps),
                      params=params)


def mixed_table(sw: MixedSweep) -> Table:
    table = Table(title=f"mixed cadences: {sw.sets} set(s) per H, seed {sw.seed} (ratios: "
                        f"median / max over sets)")
    for col in ("H", "config", "ratio at start", "p99 at start", "max ratio", "longest wait",
                "yields/h", "pressure / cap yields", "yields, none due", "busy",
                "start-up paid"):
        table.add_column(col, no_wrap=col == "config")
    for r in sw.rows():
        table.add_row(
            f"{r['H']:g}", r["config"],
            f"{r['start_ratio_median']:.2f} / {r['start_ratio_max']:.2f}",
            f"{r['start_ratio_p99_mean']:.2f}",
            f"{r['max_ratio_median']:.2f} / {r['max_ratio_max']:.2f}",
            f"{r['longest_wait_s_max'] / 60:.1f} min", f"{r['yields_per_h_mean']:.2f}",
            f"{r['pressure_yields']} / {r['cap_yields']}", str(r["idle_yields"]),
            f"{r['busy_fraction_mean']:.3f}", f"{100 * r['startup_fraction_mean']:.1f} %")
    return table


__all__ = ["DEFAULT_CADENCE_RANGE", "MIXED_HS", "MIXED_SETS", "Config", "MixedMetrics",
           "MixedSweep", "configs", "mixed_lanes", "mixed_metrics", "mixed_sweep",
           "mixed_table"]
