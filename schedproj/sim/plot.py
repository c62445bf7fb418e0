"""PNG plots of simulations (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from schedproj.sim.engine import LaneTrace, SimRun
from schedproj.sim.model import SimError
from schedproj.sim.report import Comparison, Sweep


def pyplot() -> Any:
    """matplotlib's pyplot on the headless Agg backend, or a SimError saying how to get it."""
    try:
        import matplotlib
    except ImportError:
        raise SimError("plots need matplotlib. Fix: pip install matplotlib (or run without "
                       "--plot)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def sweep_plot(sw: Sweep, path: str | Path) -> Path:
    """Maximal staleness ratio (over heavy lanes) against H per variant, mean over the sets
    with their min-max range, and the scheduling-theory reference lines 2·H and 4·H."""
    plt = pyplot()
    out = Path(path)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    n = len(sw.variants)
    span = (max(sw.hs) - min(sw.hs)) if len(sw.hs) > 1 else max(sw.hs)
    width = 0.012 * max(span, 0.5)
    for k, label in enumerate(sw.variants):
        xs, ys, lo, hi = [], [], [], []
        for h in sw.hs:
            vals = [m.max_ratio for m in sw.select(h, label)]
            if not vals:
                continue
            mean = sum(vals) / len(vals)
            xs.append(h + (k - (n - 1) / 2) * width)
            ys.append(mean)
            lo.append(mean - min(vals))
            hi.append(max(vals) - mean)
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, linewidth=1.2, label=label)
    top = max(sw.hs) * 1.05
    grid = [0.0, top]
    ax.plot(grid, [2 * x for x in grid], "k--", linewidth=1,
            label="2·H (optimal schedules stay near it)")
    ax.plot(grid, [4 * x for x in grid], "k:", linewidth=1,
            label="4·H (proven bound, most-overdue-first)")
    ax.axhline(1.0, color="grey", linewidth=0.8, alpha=0.6, label="ratio 1 (due)")
    ax.set_xlabel("heavy demand H = Σ run_time / cadence")
    ax.set_ylabel("maximal staleness ratio (heavy lanes)")
    ax.set_title(f"max staleness ratio vs H — {sw.sets} random set(s) per H, "
                 f"seed {sw.seed}")
    ax.set_xlim(0, top)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _curve(trace: LaneTrace, horizon: float) -> tuple[list[float], list[float]]:
    """The staleness-ratio sawtooth of one lane, in hours and ratio."""
    c = trace.spec.cadence_s
    xs: list[float] = []
    ys: list[float] = []
    last = 0.0
    for origin, start, end in trace.segments:
        if start > last:
            xs += [last / 3600, start / 3600]
            ys += [0.0, 0.0]
        xs += [start / 3600, end / 3600]
        ys += [(start - origin) / c, (end - origin) / c]
        last = end
    if last < horizon:
        xs += [last / 3600, horizon / 3600]
        ys += [0.0, 0.0]
    return xs, ys


def timeline_plot(c: Comparison, path: str | Path) -> Path:
    """Per variant: every lane's staleness ratio over time (symlog scale), the lease holder
    below it, and the drain-to-idle instant."""
    plt = pyplot()
    out = Path(path)
    runs: list[SimRun] = list(c.runs.values())
    if not runs:
        raise SimError("nothing to plot: the comparison holds no runs")
    horizon = c.scenario.horizon_s
    names = [m.name for m in c.scenario.lanes]
    colours = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(names)}
    fig, axes = plt.subplots(2 * len(runs), 1, figsize=(11, 3.2 * len(runs)), sharex=True,
                             gridspec_kw={"height_ratios": [4, 1] * len(runs)})
    for k, run in enumerate(runs):
        ax, lease_ax = axes[2 * k], axes[2 * k + 1]
        for name, trace in run.lanes.items():
            if not trace.enabled:
                continue
            xs, ys = _curve(trace, horizon)
            ax.plot(xs, ys, linewidth=0.9, color=colours[name], label=name)
        ax.set_yscale("symlog", linthresh=1.0)
        ax.axhline(1.0, color="grey", linewidth=0.6, alpha=0.6)
        drained = run.drained_at
        verdict = f"drained at {drained / 3600:.2f} h" if drained is not None else "never idle"
        ax.set_title(f"{run.variant.label}: {verdict}", fontsize=10)
        ax.set_ylabel("staleness ratio")
        if drained is not None:
            ax.axvline(drained / 3600, color="k", linestyle="--", linewidth=0.8)
            lease_ax.axvline(drained / 3600, color="k", linestyle="--", linewidth=0.8)
        spans: dict[str, list[tuple[float, float]]] = {}
        for lane, start, end in run.lease:
            spans.setdefault(lane, []).append((start / 3600, max(end - start, 1.0) / 3600))
        for lane, bars in spans.items():
            lease_ax.broken_barh(bars, (0, 1), color=colours.get(lane, "k"))
        lease_ax.set_yticks([])
        lease_ax.set_ylabel("lease", fontsize=8)
        if k == 0:
            ax.legend(fontsize=7, ncol=3, loc="upper right")
    axes[-1].set_xlabel("virtual time (h)")
    axes[-1].set_xlim(0, horizon / 3600)
    fig.suptitle(f"{c.scenario.name}, seed {c.seed}", fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


__all__ = ["sweep_plot", "timeline_plot"]
