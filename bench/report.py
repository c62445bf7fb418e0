"""Markdown tables from a results dict (what ``python -m bench.run`` prints)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

NAMES = {"fair": "schedproj FairScheduler", "redbeat": "celery-redbeat",
         "persistent": "Celery PersistentScheduler"}


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "met" if value else "**missed**"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return f"{int(value):,}"
        if value >= 100:
            return f"{value:,.0f}"
        if value >= 10:
            return f"{value:.1f}"
        if value >= 1:
            return f"{value:.2f}"
        return f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |",
             "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def g(d: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def machine_md(m: dict[str, Any]) -> str:
    pk = m.get("packages", {})
    rows = [
        ("CPU", f"{m.get('cpu')} ({m.get('cores')} cores)"),
        ("memory", m.get("memory")),
        ("kernel / Python", f"{m.get('kernel')} / {m.get('python')}"),
        ("Redis", m.get("redis_server")),
        ("packages", ", ".join(f"{k} {v}" for k, v in pk.items() if v)),
        ("schedproj commit", str(m.get("commit"))
         + (" (with uncommitted changes)" if m.get("schedproj_modified") else "")),
        ("date", m.get("date")),
        ("load average (1/5/15 min) at start / end",
         f"{m.get('load_average_at_start')} / {m.get('load_average_at_end')}"),
    ]
    return table(("", ""), rows)


def handoff_md(s: dict[str, Any]) -> str:
    rows = []
    for key, label in (("wake_on", "wake on release (default)"),
                       ("wake_off", "beat polling only (SCHEDPROJ_WAKE_ON_RELEASE=false)")):
        r = s[key]
        gap = r["gap_ms"]
        rows.append((label, r["loop_interval_s"], gap["n"], gap["median"], gap["p90"],
                     gap["p99"], gap["max"], r["overlaps"]))
    out = table(("beat", "loop interval (s)", "hand-offs", "median gap (ms)", "p90", "p99",
                 "max", "overlapping runs"), rows)
    out += (f"\nMedian gap, polling over wake: **{fmt(s['median_ratio_off_over_on'])}x**. "
            f"Goals (wake on): median under 50 ms — {fmt(s['goals']['median_under_50ms'])}; "
            f"p99 under 250 ms — {fmt(s['goals']['p99_under_250ms'])}.\n")
    return out


def tick_md(s: dict[str, Any]) -> str:
    rows = []
    for lanes, row in s["lanes"].items():
        for key in ("fair", "redbeat", "persistent"):
            r = row[key]
            if "skipped" in r:
                rows.append((lanes, NAMES[key], r["skipped"], *([None] * 8)))
                continue
            d = r["dispatch"]
            rows.append((int(lanes), NAMES[key], g(r, "idle", "ms", "median"),
                         g(r, "idle", "round_trips", "median"), d["ticks"],
                         g(d, "total_ms", "median"), g(d, "per_entry_ms", "median"),
                         g(d, "round_trips_per_entry", "median"),
                         g(r, "memory", "declare_mib"), g(r, "memory", "scheduler_mib"),
                         g(r, "setup_s")))
    out = table(("lanes", "scheduler", "idle tick (ms, median)", "round trips / idle tick",
                 "ticks to send all due", "send all due (ms)", "per entry (ms)",
                 "round trips / entry", "memory: entries declared (MiB)",
                 "memory: scheduler (MiB)", "start-up (s)"), rows)
    rank_rows = []
    for lanes, row in s["lanes"].items():
        rk = g(row, "fair", "rank")
        if rk:
            rank_rows.append((int(lanes), g(rk, "rank_tick", "ms", "median"),
                              g(rk, "rank_tick", "ms", "p90"),
                              g(rk, "rank_tick", "round_trips", "median"),
                              g(rk, "held_tick", "ms", "median"),
                              g(rk, "held_tick", "round_trips", "median")))
    out += "\nFairScheduler, all lanes heavy and due (the tick that ranks them and grants the " \
           "lease, then the tick that finds the lease held):\n\n"
    out += table(("lanes", "rank + grant tick (ms, median)", "p90", "round trips",
                  "lease-held tick (ms, median)", "round trips"), rank_rows)
    ratio_rows = [(int(lanes), *row["ratios"].values()) for lanes, row in s["lanes"].items()]
    out += "\nRatios (medians):\n\n"
    out += table(("lanes", "idle: fair / redbeat", "idle: fair / persistent",
                  "per entry: fair / redbeat", "per entry: fair / persistent",
                  "memory: fair / redbeat", "memory: fair / persistent"), ratio_rows)
    goals = s["goals"]
    out += (f"\nGoals at {fmt(goals['at_lanes'])} lanes: constant round trips per tick — "
            f"{fmt(goals['constant_round_trips'])} (by lane count: "
            f"{goals['round_trips_per_tick_by_lane_count']}); idle tick within 2x "
            f"celery-redbeat — {fmt(goals['idle_within_2x_redbeat'])}; ranking tick under 50 ms "
            f"— {fmt(goals['rank_tick_under_50ms'])}; light dispatch no slower than "
            f"celery-redbeat per entry — {fmt(goals['light_dispatch_no_slower_than_redbeat'])}."
            "\n")
    largest = s["lanes"][str(goals["at_lanes"])]["fair"].get("profile")
    if largest:
        out += (f"\nProfile of one FairScheduler tick at {fmt(goals['at_lanes'])} lanes "
                "(cProfile; schedproj functions and socket sends by cumulative time):\n")
        for scenario, rows_ in largest.items():
            out += f"\n*{scenario} tick*\n\n" + table(
                ("function", "calls", "cumulative (ms)", "own (ms)"),
                [(r["function"], r["calls"], r["cumtime_ms"], r["tottime_ms"])
                 for r in rows_])
    return out


def light_delay_md(s: dict[str, Any]) -> str:
    rows = []
    for key, label in (("heavy_running", "heavy lanes holding the lease"),
                       ("no_heavy_lanes", "no heavy lanes (baseline)")):
        r = s[key]
        d, st = r["dispatch_delay_ms"], r["start_delay_ms"]
        rows.append((label, r["lease_busy_fraction"], d["n"], d["median"], d["p90"], d["p99"],
                     d["max"], st["median"], st["p99"]))
    out = table(("run", "lease busy", "light runs", "due → dispatch median (ms)", "p90", "p99",
                 "max", "due → start median (ms)", "p99"), rows)
    held = s["heavy_running"]
    out += (f"\nDispatches made while a heavy run was executing: "
            f"{held['dispatch_delay_while_heavy_ran_ms']['n']}, p99 "
            f"{fmt(held['dispatch_delay_while_heavy_ran_ms']['p99'])} ms. Goal: p99 within one "
            f"tick ({fmt(held['loop_interval_s'])} s) — "
            f"{fmt(s['goals']['p99_within_one_tick'])}.\n")
    bl = s.get("blpop_timeout")
    if bl:
        o = bl["overshoot_ms"]
        out += (f"\nA BLPOP that times out (beat's sleep until the next lane falls due) ends "
                f"late on this Redis (hz {fmt(bl['server_hz'])}): median {fmt(o['median'])} ms, "
                f"max {fmt(o['max'])} ms over {fmt(o['n'])} timeouts.\n")
    return out


def throughput_md(s: dict[str, Any]) -> str:
    rows = [(r["scheduler"], r["light_lanes"], r["worker_concurrency"], r["window_s"], r["runs"],
             r["runs_per_s"], r["queued_at_end"], r.get("beat_cpu"), r.get("worker_cpu"),
             r.get("redis_cpu"), r.get("beat_cpu_ms_per_run"))
            for r in (s["fair"], s["bare_beat"])]
    out = table(("beat", "light lanes", "worker slots", "window (s)", "runs", "runs / s",
                 "messages queued at end", "beat CPU (cores)", "worker CPU (cores)",
                 "Redis CPU (cores)", "beat CPU per run (ms)"), rows)
    out += f"\nFair over bare: **{fmt(s['ratio_fair_over_bare'])}x**.\n"
    return out


def markdown(results: dict[str, Any]) -> str:
    parts = ["## Machine\n\n" + machine_md(results["machine"])]
    sections = results.get("sections", {})
    render = (("handoff", "Lease hand-off gap", handoff_md),
              ("tick", "Tick cost, round trips and memory", tick_md),
              ("light_delay", "Light dispatch delay while a heavy lane holds the lease",
               light_delay_md),
              ("throughput", "Light-path throughput, one light worker", throughput_md))
    for key, title, fn in render:
        if key in sections:
            parts.append(f"## {title}\n\n{fn(sections[key])}")
    smoke = " (smoke run: tiny counts, figures not meaningful)" if results.get("smoke") else ""
    parts.append(f"Command: `{results['command'].strip()}`{smoke}; took "
                 f"{fmt(results['elapsed_s'])} s.\n")
    return "\n".join(parts)
