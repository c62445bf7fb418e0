"""PNG plots of a benchmark run (matplotlib, headless): ``python -m bench.plot results.json DIR``
or ``python -m bench.run --plots DIR``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.report import NAMES, g
from schedproj.sim.plot import pyplot

COLORS = {"fair": "tab:blue", "redbeat": "tab:red", "persistent": "tab:green"}


def tick_plot(section: dict[str, Any], out: Path) -> Path:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    sizes = sorted(section["lanes"], key=int)
    xs = [int(n) for n in sizes]
    for key in ("fair", "redbeat", "persistent"):
        idle = [g(section["lanes"][n], key, "idle", "ms", "median") for n in sizes]
        per = [g(section["lanes"][n], key, "dispatch", "per_entry_ms", "median") for n in sizes]
        if all(v is not None for v in idle):
            ax1.plot(xs, idle, "o-", color=COLORS[key], label=f"{NAMES[key]}: idle tick")
        if all(v is not None for v in per):
            ax2.plot(xs, per, "o-", color=COLORS[key], label=NAMES[key])
    rank = [g(section["lanes"][n], "fair", "rank", "rank_tick", "ms", "median") for n in sizes]
    if all(v is not None for v in rank):
        ax1.plot(xs, rank, "s--", color=COLORS["fair"], label="FairScheduler: ranking tick")
    ax1.axhline(50, color="grey", lw=0.8, ls=":")
    ax1.text(xs[0], 55, "50 ms goal (ranking tick)", fontsize=8, color="grey")
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("declared lanes / entries")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_ylabel("median tick time (ms)")
    ax1.set_title("Tick cost (sends are no-ops)")
    ax2.set_ylabel("time to send all due entries / entries (ms)")
    ax2.set_title("Dispatch cost per due entry")
    fig.tight_layout()
    path = out / "bench_tick_cost.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _ecdf(ax: Any, samples: list[float], label: str, color: str) -> None:
    values = sorted(samples)
    if not values:
        return
    ys = [(i + 1) / len(values) for i in range(len(values))]
    ax.step(values, ys, where="post", label=f"{label} (n={len(values)})", color=color)


def latency_plot(handoff: dict[str, Any] | None, light: dict[str, Any] | None,
                 out: Path) -> Path:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    if handoff:
        _ecdf(ax1, handoff["wake_on"].get("gap_samples_ms", []), "wake on release", "tab:blue")
        _ecdf(ax1, handoff["wake_off"].get("gap_samples_ms", []),
              f"polling only (every {handoff['wake_off']['loop_interval_s']:g} s)", "tab:orange")
        ax1.axvline(50, color="grey", lw=0.8, ls=":")
        ax1.axvline(250, color="grey", lw=0.8, ls="--")
        ax1.set_xscale("log")
        ax1.set_title("Lease hand-off gap (50 ms / 250 ms goals dotted / dashed)")
        ax1.set_xlabel("next heavy start - previous heavy end (ms)")
    if light:
        _ecdf(ax2, light["heavy_running"].get("dispatch_delay_samples_ms", []),
              "heavy lanes holding the lease", "tab:blue")
        _ecdf(ax2, light["no_heavy_lanes"].get("dispatch_delay_samples_ms", []),
              "no heavy lanes", "tab:orange")
        ax2.set_title("Light lane: due -> dispatched")
        ax2.set_xlabel(f"delay (ms); one tick = "
                       f"{light['heavy_running']['loop_interval_s'] * 1000:g} ms")
    for ax in (ax1, ax2):
        ax.set_ylabel("fraction of samples")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path = out / "bench_latency.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot(results: dict[str, Any], outdir: str | Path) -> list[Path]:
    """Write the plots this run has data for; [] (and a note) without matplotlib."""
    try:
        pyplot()
    except ImportError:
        sys.stderr.write("bench: plots need matplotlib (pip install matplotlib); skipped\n")
        return []
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    sections = results.get("sections", {})
    made = []
    if "tick" in sections:
        made.append(tick_plot(sections["tick"], out))
    if "handoff" in sections or "light_delay" in sections:
        made.append(latency_plot(sections.get("handoff"), sections.get("light_delay"), out))
    return made


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.stderr.write("usage: python -m bench.plot RESULTS.json OUTDIR\n")
        return 2
    for path in plot(json.loads(Path(args[0]).read_text()), args[1]):
        sys.stdout.write(f"{path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
