"""Run the live benchmarks: ``python -m bench.run`` (``--smoke`` for CI's short run).

Starts a private ``redis-server`` on a free loopback port (never a shared Redis), runs each
section with real Celery processes or, for tick cost, one process per scheduler and size, and
writes every figure as JSON (``--json``) and as Markdown tables (``--markdown``, also printed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import handoff, live, million, plot, report
from bench.cluster import ROOT
from bench.stats import ratio
from schedproj.devtools.embedded import private_redis

SECTIONS = ("handoff", "tick", "light_delay", "throughput", "handoff_scale", "entries", "pools")
#: Sections run only when named in ``--sections``: ``million`` is slow (a 1,000,000-lane run
#: takes most of an hour, celery-redbeat's start-up alone ten minutes).
EXTRA_SECTIONS = ("handoff_breakdown", "million")
SCHEDULERS = ("fair", "redbeat", "persistent")


def say(message: str) -> None:
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


# -- the machine ---------------------------------------------------------------------------------

def _first(path: str, key: str) -> str:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _command(*argv: str) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, cwd=ROOT)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def machine() -> dict[str, Any]:
    dirty = _command("git", "status", "--porcelain", "--", "schedproj")
    return {
        "cpu": _first("/proc/cpuinfo", "model name"),
        "cores": os.cpu_count(),
        "memory": _first("/proc/meminfo", "MemTotal"),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "redis_server": _command("redis-server", "--version"),
        "packages": {p: _version(p) for p in ("celery", "kombu", "redis", "celery-redbeat")},
        "commit": _command("git", "rev-parse", "--short", "HEAD"),
        "schedproj_modified": dirty not in ("", "unknown"),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


# -- tick cost -----------------------------------------------------------------------------------

def tickcost_one(url: str, scheduler: str, lanes: int, *, smoke: bool,
                 profile: bool) -> dict[str, Any]:
    reps = (20 if smoke else 1000) if scheduler == "pair" else 5 if smoke else 30
    due_reps = 1 if smoke else (5 if lanes <= 1000 else 3 if lanes <= 10_000 else 1)
    if scheduler == "persistent" and lanes > 1000:
        due_reps = 1  # one full pass takes minutes at 10,000 entries
    argv = [sys.executable, "-m", "bench.tickcost", "--scheduler", scheduler, "--lanes",
            str(lanes), "--redis", url, "--reps", str(reps), "--due-reps", str(due_reps)]
    if profile:
        argv.append("--profile")
    return run_json(argv)


def run_json(argv: list[str]) -> dict[str, Any]:
    """Run one measuring process (``python -m bench.tickcost|bench.entries ...``): the JSON
    object it prints last."""
    out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[2:])} failed:\n{out.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


#: PersistentScheduler sends one entry per tick: past this many entries a pass takes too long.
PERSISTENT_MAX = 10_000
#: The size the rank, lease-held and per-entry goals are judged at (issue 11).
GOAL_AT = 10_000


def tick_section(url: str, lane_counts: list[int], smoke: bool) -> dict[str, Any]:
    by_size: dict[str, dict[str, Any]] = {}
    profile_at = GOAL_AT if GOAL_AT in lane_counts else max(lane_counts)
    for lanes in lane_counts:
        row: dict[str, Any] = {}
        for scheduler in SCHEDULERS:
            if scheduler == "persistent" and lanes > PERSISTENT_MAX:
                row[scheduler] = {"skipped": f"over {PERSISTENT_MAX} entries (one send per "
                                             "tick: a pass takes too long)"}
                continue
            say(f"tick cost: {scheduler} with {lanes} entries")
            row[scheduler] = tickcost_one(url, scheduler, lanes, smoke=smoke,
                                          profile=scheduler == "fair" and lanes == profile_at)
        say(f"tick cost: fair and redbeat idle ticks interleaved, {lanes} entries")
        row["pair"] = tickcost_one(url, "pair", lanes, smoke=smoke, profile=False)
        row["ratios"] = tick_ratios(row)
        by_size[str(lanes)] = row
    return {"lanes": by_size, "goals": tick_goals(by_size)}


def _get(d: dict[str, Any], *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def tick_ratios(row: dict[str, Any]) -> dict[str, Any]:
    fair, rb, ps = row["fair"], row["redbeat"], row["persistent"]
    idle_rb = _get(rb, "idle", "ms", "median")
    return {
        # The idle goal is judged on ticks interleaved in one process (``pair``): the separate
        # runs, minutes apart on a shared machine, drift by more than the difference measured.
        "idle_fair_over_redbeat": _get(row.get("pair", {}), "idle_pair", "ratio"),
        "idle_fair_over_redbeat_separate_runs": ratio(_get(fair, "idle", "ms", "median"),
                                                      idle_rb),
        "idle_fair_over_persistent": ratio(_get(fair, "idle", "ms", "median"),
                                           _get(ps, "idle", "ms", "median")),
        # The goal's case, "nothing changed since the last tick": the lease-held ticks of a
        # run after its first one (reported too: it follows the ranking tick's writes).
        "held_fair_over_redbeat_idle": ratio(
            _get(fair, "rank", "steady_held_tick", "ms", "median"), idle_rb),
        "first_held_fair_over_redbeat_idle": ratio(
            _get(fair, "rank", "held_tick", "ms", "median"), idle_rb),
        "rank_fair_over_floor": ratio(_get(fair, "rank", "rank_tick", "ms", "median"),
                                      _get(fair, "rank", "floor", "ms", "median")),
        "per_entry_fair_over_redbeat": ratio(
            _get(fair, "dispatch", "per_entry_ms", "median"),
            _get(rb, "dispatch", "per_entry_ms", "median")),
        "per_entry_fair_over_persistent": ratio(
            _get(fair, "dispatch", "per_entry_ms", "median"),
            _get(ps, "dispatch", "per_entry_ms", "median")),
        "memory_fair_over_redbeat": ratio(_get(fair, "memory", "delta_mib"),
                                          _get(rb, "memory", "delta_mib")),
        "memory_fair_over_persistent": ratio(_get(fair, "memory", "delta_mib"),
                                             _get(ps, "memory", "delta_mib")),
        "startup_fair_over_redbeat": ratio(_get(fair, "startup", "beat_start_s"),
                                           _get(rb, "setup_s")),
    }


def _at_most(value: Any, limit: float) -> bool | None:
    return None if value is None else value <= limit


def tick_goals(by_size: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Issue 11's goals, each a ratio measured in this run (None: not measured)."""
    largest = max(by_size, key=int)
    at = str(GOAL_AT) if str(GOAL_AT) in by_size else largest
    rts = {kind: sorted({_get(row["fair"], *path, "round_trips", "median")
                         for row in by_size.values()})
           for kind, path in (("idle", ("idle",)), ("rank", ("rank", "rank_tick")),
                              ("held", ("rank", "held_tick")))}
    idle = {size: row["ratios"]["idle_fair_over_redbeat"] for size, row in by_size.items()}
    ratios = by_size[at]["ratios"]
    return {
        "at_lanes": int(at),
        "largest": int(largest),
        "round_trips_per_tick_by_lane_count": rts,
        "constant_round_trips": all(len(v) == 1 for v in rts.values())
        if len(by_size) > 1 else None,
        "idle_fair_over_redbeat_by_size": idle,
        "idle_within_1x_redbeat": None if any(v is None for v in idle.values())
        else all(v <= 1.0 for v in idle.values()),
        "held_within_2x_redbeat_idle": _at_most(ratios["held_fair_over_redbeat_idle"], 2.0),
        "rank_within_3x_floor": _at_most(ratios["rank_fair_over_floor"], 3.0),
        "light_dispatch_within_0.2x_redbeat": _at_most(ratios["per_entry_fair_over_redbeat"],
                                                       0.2),
        "memory_within_2x_redbeat_at_largest": _at_most(
            by_size[largest]["ratios"]["memory_fair_over_redbeat"], 2.0),
        "startup_within_1x_redbeat_at_largest": _at_most(
            by_size[largest]["ratios"]["startup_fair_over_redbeat"], 1.0),
        "redis_bytes_per_lane": _get(by_size[largest]["fair"], "redis_bytes_per_lane"),
    }


# -- schedule entries (issue 20) ------------------------------------------------------------------

ENTRY_RUNS = ("fair", "redbeat", "pair")


def entries_one(url: str, scheduler: str, entries: int, *, smoke: bool,
                profile: bool) -> dict[str, Any]:
    reps = (20 if smoke else 1000) if scheduler == "pair" else 5 if smoke else 30
    argv = [sys.executable, "-m", "bench.entries", "--scheduler", scheduler, "--entries",
            str(entries), "--redis", url, "--reps", str(reps)]
    if profile:
        argv += ["--trace-memory"] + (["--profile"] if scheduler == "fair" else [])
    return run_json(argv)


def entries_section(url: str, counts: list[int], smoke: bool) -> dict[str, Any]:
    """FairScheduler and celery-redbeat with the same N ``beat_schedule`` entries: start-up,
    idle tick (interleaved in one process) and beat memory (``bench/entries.py``)."""
    by_size: dict[str, dict[str, Any]] = {}
    for entries in counts:
        row: dict[str, Any] = {}
        for run in ENTRY_RUNS:
            say(f"entries: {run} with {entries} entries")
            row[run] = entries_one(url, run, entries, smoke=smoke,
                                   profile=run != "pair" and entries == max(counts))
        row["ratios"] = entries_ratios(row)
        by_size[str(entries)] = row
    return {"entries": by_size, "goals": entries_goals(by_size)}


def entries_ratios(row: dict[str, Any]) -> dict[str, Any]:
    fair, rb = row["fair"], row["redbeat"]
    return {
        "idle_fair_over_redbeat": _get(row["pair"], "idle_pair", "ratio"),
        "idle_fair_over_redbeat_separate_runs": ratio(_get(fair, "idle", "ms", "median"),
                                                      _get(rb, "idle", "ms", "median")),
        "start_fair_over_redbeat": ratio(_get(fair, "start", "start_s"),
                                         _get(rb, "start", "start_s")),
        "restart_fair_over_redbeat": ratio(_get(fair, "restart", "start_s"),
                                           _get(rb, "restart", "start_s")),
        "memory_fair_over_redbeat": ratio(_get(fair, "memory", "scheduler_mib"),
                                          _get(rb, "memory", "scheduler_mib")),
        "memory_with_schedule_fair_over_redbeat": ratio(_get(fair, "memory", "delta_mib"),
                                                        _get(rb, "memory", "delta_mib")),
    }


def entries_goals(by_size: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Issue 20's goals at the largest count, each a ratio measured in this run."""
    largest = max(by_size, key=int)
    r = by_size[largest]["ratios"]
    starts = [r["start_fair_over_redbeat"], r["restart_fair_over_redbeat"]]
    # A start-up that never judged every entry (the beat lock lost each pass) has no time.
    incomplete = any(_get(by_size[largest]["fair"], kind, "completed") is False
                     for kind in ("start", "restart"))
    return {
        "at_entries": int(largest),
        "idle_within_1x_redbeat": _at_most(r["idle_fair_over_redbeat"], 1.0),
        "startup_within_0.5x_redbeat": False if incomplete else None if None in starts
        else all(x <= 0.5 for x in starts),
        "fair_start_lock_lost": {kind: _get(by_size[largest]["fair"], kind, "lock_lost")
                                 for kind in ("start", "restart")},
        "memory_within_1x_redbeat": _at_most(r["memory_fair_over_redbeat"], 1.0),
        "round_trips_per_idle_tick": {
            run: _get(by_size[largest]["pair"], "idle_pair", f"{run}_round_trips", "median")
            for run in ("fair", "redbeat")},
    }


# -- pools (issue 22) -----------------------------------------------------------------------------

def pools_section(url: str, lanes: int, smoke: bool) -> dict[str, Any]:
    """Rank and grant with N due heavy lanes across four pools (1+2+3+4 slots) against the
    same lanes in the single lease, and the idle tick with pools declared against none: two
    schedulers in one process, their ticks interleaved (``bench/pools.py``)."""
    say(f"pools: {lanes} due heavy lanes, four pools against the single lease, interleaved")
    argv = [sys.executable, "-m", "bench.pools", "--lanes", str(lanes), "--redis", url,
            "--cycles", "3" if smoke else "30", "--plans", "3" if smoke else "30",
            "--idle-reps", "20" if smoke else "1000", "--profile"]
    return run_json(argv)


# -- main ------------------------------------------------------------------------------------------

def run_sections(url: str, sections: list[str], lanes: list[int], smoke: bool,
                 opts: live.LiveOptions, entries: list[int],
                 pool_lanes: int = 10_000, million_lanes: int = 1_000_000,
                 million_due: int = 10_000) -> dict[str, Any]:
    steps: dict[str, Callable[[], dict[str, Any]]] = {
        "handoff": lambda: live.handoff_section(url, opts),
        "tick": lambda: tick_section(url, lanes, smoke),
        "light_delay": lambda: live.light_delay_section(url, opts),
        "throughput": lambda: live.throughput_section(url, opts),
        "handoff_scale": lambda: live.handoff_scale_section(
            url, opts, large=500 if smoke else 100_000),
        "entries": lambda: entries_section(url, entries, smoke),
        "handoff_breakdown": lambda: handoff.breakdown_section(url, opts),
        "pools": lambda: pools_section(url, pool_lanes, smoke),
        "million": lambda: million.section(url, million_lanes, million_due, smoke, run_json),
    }
    out: dict[str, Any] = {}
    for name in sections:
        say(f"section {name}")
        start = time.monotonic()
        out[name] = steps[name]()
        out[name]["elapsed_s"] = round(time.monotonic() - start, 1)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--smoke", action="store_true",
                        help="tiny counts and short windows (CI): figures are produced, not "
                             "meaningful")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {','.join(SECTIONS)} (default: all "
                             f"of them), or also {','.join(EXTRA_SECTIONS)}")
    parser.add_argument("--lanes", default=None,
                        help="declared lane counts for tick cost (default 1000,10000,100000; "
                             "smoke 20,100)")
    parser.add_argument("--entries", default=None,
                        help="beat_schedule entry counts for the entries section (default "
                             "1000,10000,100000; smoke 1000)")
    parser.add_argument("--pool-lanes", type=int, default=None,
                        help="due heavy lanes in the pools section (default 10000, smoke 100)")
    parser.add_argument("--million", type=int, default=None,
                        help="lanes of the million section (default 1000000, smoke 2000; "
                             "e.g. 100000 while developing)")
    parser.add_argument("--million-due", type=int, default=None,
                        help="due lanes of the million section's rank and dispatch (default "
                             "10000, smoke 100)")
    parser.add_argument("--interval", type=float, default=None,
                        help="beat loop interval in the live scenarios (default 3 s, smoke "
                             "0.5 s): SCHEDPROJ_BEAT_MAX_LOOP_INTERVAL_S")
    parser.add_argument("--json", dest="json_path", default=None, help="write results here")
    parser.add_argument("--markdown", default=None, help="write the tables here")
    parser.add_argument("--plots", default=None,
                        help="write PNG plots to this directory (needs matplotlib)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sections = [s.strip().replace("-", "_") for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS) - set(EXTRA_SECTIONS))
    if unknown:
        sys.stderr.write(f"unknown sections {unknown}; choose from "
                         f"{[*SECTIONS, *EXTRA_SECTIONS]}\n")
        return 2
    lanes = [int(x) for x in (args.lanes or ("20,100" if args.smoke else
                                             "1000,10000,100000")).split(",")]
    entries = [int(x) for x in (args.entries or ("1000" if args.smoke else
                                                 "1000,10000,100000")).split(",")]
    opts = live.LiveOptions.smoke() if args.smoke else live.LiveOptions()
    if args.interval is not None:
        opts = live.LiveOptions(**{**opts.__dict__, "interval_s": args.interval})
    started = time.monotonic()
    results: dict[str, Any] = {
        "smoke": args.smoke,
        "machine": machine(),
        "command": "python -m bench.run " + " ".join(argv if argv is not None
                                                      else sys.argv[1:]),
        "live_options": opts.__dict__,
    }
    with private_redis() as url:
        say(f"private Redis at {url}")
        pool_lanes = args.pool_lanes or (100 if args.smoke else 10_000)
        results["sections"] = run_sections(
            url, sections, lanes, args.smoke, opts, entries, pool_lanes,
            args.million or (2000 if args.smoke else 1_000_000),
            args.million_due or (100 if args.smoke else 10_000))
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    results["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.plots:
        results["plots"] = [str(p) for p in plot.plot(results, args.plots)]
    text = report.markdown(results)
    if "million" in results["sections"]:
        text += "\n" + million.markdown(results["sections"]["million"])
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=2) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
