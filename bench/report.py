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
    if "floor" in s["wake_on"]:
        out += "\n" + floor_md(s["wake_on"])
    return out


def floor_md(r: dict[str, Any]) -> str:
    """The gap (wake on) beside the floor measured on the same worker in the same run."""
    gap, floor = r["gap_ms"], r["floor"]
    rows = [("hand-off gap (run end to next heavy start)", gap["n"], gap["median"],
             gap["p90"], gap["p99"], gap["max"]),
            *((label, floor[key]["n"], floor[key]["median"], floor[key]["p90"],
               floor[key]["p99"], floor[key]["max"])
              for key, label in (("floor_ms", "floor: publish to start + one round trip"),
                                 ("publish_to_start_ms", "  publish to an idle worker's start"),
                                 ("round_trip_ms", "  one Redis round trip (PING)")))]
    out = table(("", "samples", "median (ms)", "p90", "p99", "max"), rows)
    vs = r["against_floor"]
    return out + (f"\nGap over the floor's median: median **{fmt(vs['median_over_floor'])}x** "
                  f"(goal ≤ 2x — {fmt(vs['goals']['median_within_2x_floor'])}), p99 "
                  f"**{fmt(vs['p99_over_floor'])}x** (goal ≤ 4x — "
                  f"{fmt(vs['goals']['p99_within_4x_floor'])}).\n")


def profile_md(r: dict[str, Any]) -> str:
    """``bench.handoff --profile``: each profiled process's functions by own CPU time."""
    out = f"Gap (profiled, so slowed): median {fmt(r['gap_ms']['median'])} ms\n"
    for p in r["profiles"]:
        out += (f"\n*{p['calls']} calls, {fmt(p['cpu_ms_per_call'])} ms of CPU each "
                "(profiled)*\n\n" + table(
                    ("function", "own ms per call", "cumulative ms per call"),
                    [(x["function"], x["own_ms_per_call"], x["cumulative_ms_per_call"])
                     for x in p["top"]]))
    return out


def handoff_breakdown_md(r: dict[str, Any]) -> str:
    """The traced hand-off: gap and floor, then the median of each stage of both paths."""
    b = r["breakdown"]
    out = ""
    if "untraced" in r:
        out += "*Untraced, just before*\n\n" + floor_md(r["untraced"]) + "\n*Traced*\n\n"
    out += floor_md(r)
    out += (f"\n*Where the gap goes* ({b['handoffs_traced']} hand-offs traced, "
            f"{b['handoffs_unmatched']} unmatched; stage = from the previous stamp to this "
            "one)\n\n")
    rows = [(x["stamp"], x["process"], x["stage"], x["median_ms"], x["p90_ms"],
             x["offset_median_ms"]) for x in b["handoff_stages"]]
    out += table(("stamp", "process", "stage", "median (ms)", "p90", "at (median, ms)"), rows)
    out += f"\n*The floor's stages* ({b['floor_samples_traced']} samples)\n\n"
    rows = [(x["stamp"], x["process"], x["stage"], x["median_ms"], x["p90_ms"],
             x["offset_median_ms"]) for x in b["floor_stages"]]
    out += table(("stamp", "process", "stage", "median (ms)", "p90", "at (median, ms)"), rows)
    side = b["handoff_side"]
    if side:
        out += "\n*Beside the path* (medians, ms)\n\n" + table(("figure", "median", "p90"), [
            (key, g(side, key, "median"), g(side, key, "p90"))
            for key in side if isinstance(side[key], dict)])
        out += ("\nHand-offs in which the worker had not yet asked for the next message when "
                f"beat published it: {fmt(side['worker_not_yet_fetching_at_publish'])}.\n")
    return out


def tick_md(s: dict[str, Any]) -> str:
    """The tick section: one table per question the tick benchmark answers, then its goals."""
    return (_schedulers_md(s) + _ranking_md(s) + _interleaved_md(s) + _ratios_md(s)
            + _goals_md(s["goals"]) + _profile_md(s))


def _schedulers_md(s: dict[str, Any]) -> str:
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
    return table(("lanes", "scheduler", "idle tick (ms, median)", "round trips / idle tick",
                  "ticks to send all due", "send all due (ms)", "per entry (ms)",
                  "round trips / entry", "memory: entries declared (MiB)",
                  "memory: scheduler (MiB)", "start-up (s)"), rows)


def _ranking_md(s: dict[str, Any]) -> str:
    rank_rows = []
    for lanes, row in s["lanes"].items():
        rk = g(row, "fair", "rank")
        if rk:
            rank_rows.append((int(lanes), g(rk, "rank_tick", "ms", "median"),
                              g(rk, "rank_tick", "ms", "p90"),
                              g(rk, "rank_tick", "round_trips", "median"),
                              g(rk, "floor", "ms", "median"),
                              g(rk, "steady_held_tick", "ms", "median"),
                              g(rk, "held_tick", "ms", "median"),
                              g(rk, "held_tick", "round_trips", "median"),
                              g(row, "fair", "startup", "add_members_s"),
                              g(row, "fair", "startup", "beat_start_s"),
                              g(row, "fair", "redis_bytes_per_lane")))
    out = "\nFairScheduler, all lanes heavy and due (the tick that ranks them and grants the " \
          "lease, then the ticks that find the lease held: the first, right after the " \
          "ranking tick's writes, and the later ones of the same run; the floor: fetch the " \
          "due lanes' " \
          "records in one round trip and take the maximal ratio in plain Python), start-up " \
          "with N members (adding them; a new beat's construction and first tick) and Redis " \
          "memory per lane:\n\n"
    return out + table(("lanes", "rank + grant tick (ms, median)", "p90", "round trips",
                        "floor (ms)", "lease-held tick (ms, median)",
                        "first lease-held tick (ms, median)", "round trips",
                        "add N members (s)", "beat start-up (s)", "Redis bytes / lane"),
                       rank_rows)


def _interleaved_md(s: dict[str, Any]) -> str:
    pair_rows = [(int(lanes), g(row, "pair", "idle_pair", "reps"),
                  g(row, "pair", "idle_pair", "fair_ms", "median"),
                  g(row, "pair", "idle_pair", "redbeat_ms", "median"),
                  g(row, "pair", "idle_pair", "ratio"))
                 for lanes, row in s["lanes"].items() if "pair" in row]
    if not pair_rows:
        return ""
    return ("\nIdle ticks interleaved in one process (FairScheduler, celery-redbeat, "
            "FairScheduler, ...), so both see the same moments of the shared machine; the "
            "idle goal is judged on these:\n\n"
            + table(("lanes", "ticks each", "fair idle tick (ms, median)",
                     "redbeat idle tick (ms, median)", "fair / redbeat"), pair_rows))


def _ratios_md(s: dict[str, Any]) -> str:
    ratio_rows = [(int(lanes), *row["ratios"].values()) for lanes, row in s["lanes"].items()]
    return "\nRatios (medians):\n\n" + table(
        ("lanes", "idle: fair / redbeat (interleaved)",
         "idle: fair / redbeat (separate runs)", "idle: fair / persistent",
         "lease-held: fair / redbeat idle",
         "first lease-held: fair / redbeat idle", "rank: fair / floor",
         "per entry: fair / redbeat", "per entry: fair / persistent",
         "memory: fair / redbeat", "memory: fair / persistent",
         "start-up: fair / redbeat"), ratio_rows)


def _goals_md(goals: dict[str, Any]) -> str:
    return (f"\nGoals (issue 11): idle tick within 1x celery-redbeat at every size — "
            f"{fmt(goals['idle_within_1x_redbeat'])}; at {fmt(goals['at_lanes'])} lanes: "
            f"lease-held tick within 2x redbeat's idle — "
            f"{fmt(goals['held_within_2x_redbeat_idle'])}, rank + grant within 3x the floor — "
            f"{fmt(goals['rank_within_3x_floor'])}, light dispatch within 0.2x redbeat per "
            f"entry — {fmt(goals['light_dispatch_within_0.2x_redbeat'])}; at "
            f"{fmt(goals['largest'])} lanes: memory within 2x redbeat — "
            f"{fmt(goals['memory_within_2x_redbeat_at_largest'])}, start-up within redbeat's — "
            f"{fmt(goals['startup_within_1x_redbeat_at_largest'])}; constant round trips per "
            f"tick — {fmt(goals['constant_round_trips'])} "
            f"({goals['round_trips_per_tick_by_lane_count']}).\n")


def _profile_md(s: dict[str, Any]) -> str:
    at_lanes = s["goals"]["at_lanes"]
    largest = s["lanes"][str(at_lanes)]["fair"].get("profile")
    if not largest:
        return ""
    out = (f"\nProfile of one FairScheduler tick at {fmt(at_lanes)} lanes "
           "(cProfile; schedproj functions and socket sends by cumulative time):\n")
    for scenario, rows_ in largest.items():
        out += f"\n*{scenario} tick*\n\n" + table(
            ("function", "calls", "cumulative (ms)", "own (ms)"),
            [(r["function"], r["calls"], r["cumtime_ms"], r["tottime_ms"]) for r in rows_])
    return out


def handoff_scale_md(s: dict[str, Any]) -> str:
    rows = []
    for key, r in s.items():
        if key.startswith("lanes_"):
            gm = r["gap_ms"]
            rows.append((r["declared_lanes"], gm["n"], gm["median"], gm["p90"], gm["p99"],
                         gm["max"], r["overlaps"]))
    out = table(("declared lanes", "hand-offs", "median gap (ms)", "p90", "p99", "max",
                 "overlapping runs"), rows)
    goals = s["goals"]
    out += (f"\nMedian, many lanes over 10: **{fmt(s['median_ratio_large_over_10'])}x** "
            f"(goal ≤ 2x — {fmt(goals['median_within_2x_of_10_lanes'])}); p99 under 50 ms — "
            f"{fmt(goals['p99_under_50ms'])}.\n")
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


def entries_md(s: dict[str, Any]) -> str:
    """The entries section: start-up, idle tick and memory of both schedulers, the interleaved
    idle ticks, the ratios, issue 20's goals, then the profile and memory trace."""
    return (_entry_runs_md(s) + _entry_pairs_md(s) + _entry_ratios_md(s)
            + _entry_goals_md(s["goals"]) + _entry_profile_md(s))


def _entry_runs_md(s: dict[str, Any]) -> str:
    rows = []
    for entries, row in s["entries"].items():
        for key in ("fair", "redbeat"):
            r = row[key]
            if "skipped" in r:
                rows.append((int(entries), NAMES[key], r["skipped"], *([None] * 11)))
                continue
            rows.append((int(entries), NAMES[key], _started(r["start"]),
                         g(r, "start", "round_trips"), g(r, "start", "ticks"),
                         g(r, "start", "longest_tick_s"), g(r, "start", "lock_lost"),
                         _started(r["restart"]), g(r, "restart", "round_trips"),
                         g(r, "idle", "ms", "median"), g(r, "idle", "round_trips", "median"),
                         g(r, "memory", "declare_mib"), g(r, "memory", "scheduler_mib"),
                         g(r, "memory", "peak_rss_mib")))
    return ("Both schedulers hold the same `beat_schedule` (half `schedule(seconds)`, half "
            "`crontab`, none due during the run). Start-up: construction until every entry is "
            "judged (FairScheduler: its ticks until none is left unjudged in its due index; "
            "celery-redbeat: construction, which stores every entry, its lock and first tick); "
            "first on an empty Redis, then a restart on the state left. Memory: RSS after the "
            "first start-up over RSS with the app and its schedule built (gc and `malloc_trim` "
            "before each reading).\n\n"
            + table(("entries", "scheduler", "first start (s)", "round trips", "ticks",
                     "longest tick (s)", "beat lock lost", "restart (s)", "round trips",
                     "idle tick (ms, median, own process)",
                     "round trips / idle tick", "memory: schedule declared (MiB)",
                     "memory: scheduler (MiB)", "peak RSS (MiB)"), rows))


def _started(start: dict[str, Any]) -> Any:
    """A start-up's time, or why it has none."""
    if start.get("completed", True):
        return start["start_s"]
    return (f"**not completed**: gave up after {fmt(start['gave_up_after_s'])} s, "
            f"{fmt(start['unjudged_at_end'])} entries unjudged")


def _entry_pairs_md(s: dict[str, Any]) -> str:
    rows = [(int(entries), g(row, "pair", "idle_pair", "reps"),
             g(row, "pair", "idle_pair", "fair_ms", "median"),
             g(row, "pair", "idle_pair", "fair_ms", "p90"),
             g(row, "pair", "idle_pair", "redbeat_ms", "median"),
             g(row, "pair", "idle_pair", "redbeat_ms", "p90"),
             g(row, "pair", "idle_pair", "ratio"),
             g(row, "pair", "idle_pair", "fair_round_trips", "median"),
             g(row, "pair", "idle_pair", "redbeat_round_trips", "median"))
            for entries, row in s["entries"].items() if "idle_pair" in row["pair"]]
    if not rows:
        return ""
    return ("\nIdle ticks interleaved in one process, both schedulers started on the same "
            "schedule (the idle goal is judged on these):\n\n"
            + table(("entries", "ticks each", "fair (ms, median)", "p90",
                     "redbeat (ms, median)", "p90", "fair / redbeat", "fair round trips",
                     "redbeat round trips"), rows))


def _entry_ratios_md(s: dict[str, Any]) -> str:
    rows = [(int(entries), *row["ratios"].values()) for entries, row in s["entries"].items()]
    return "\nRatios, fair / redbeat:\n\n" + table(
        ("entries", "idle tick (interleaved)", "idle tick (own processes)", "first start",
         "restart", "memory: scheduler", "memory: with the schedule"), rows)


def _entry_goals_md(goals: dict[str, Any]) -> str:
    return (f"\nGoals (issue 20) at {fmt(goals['at_entries'])} entries: idle tick within 1x "
            f"celery-redbeat — {fmt(goals['idle_within_1x_redbeat'])}; start-up (first and "
            f"restart) within 0.5x — {fmt(goals['startup_within_0.5x_redbeat'])}; beat memory "
            f"(the scheduler's) within 1x — {fmt(goals['memory_within_1x_redbeat'])}. Round "
            f"trips per idle tick: {goals['round_trips_per_idle_tick']}; FairScheduler's beat "
            f"lock lost during its start-ups: {goals['fair_start_lock_lost']}.\n")


def _entry_profile_md(s: dict[str, Any]) -> str:
    largest = s["entries"][str(s["goals"]["at_entries"])]
    out = ""
    for scenario, rows_ in (g(largest, "fair", "profile") or {}).items():
        out += (f"\n*FairScheduler {scenario.replace('_', ' ')} at "
                f"{fmt(s['goals']['at_entries'])} entries under cProfile* (cumulative time; "
                "cProfile slows it: compare rows, not totals)\n\n" + table(
                    ("function", "line", "calls", "cumulative (ms)", "own (ms)"),
                    [(r["function"], str(r["line"]), r["calls"], r["cumtime_ms"],
                      r["tottime_ms"]) for r in rows_]))
    for key in ("fair", "redbeat"):
        trace = g(largest, key, "trace_memory")
        if trace:
            out += (f"\n*What {NAMES[key]} keeps after a restart (tracemalloc, "
                    f"{fmt(trace['traced_mib'])} MiB traced in all)*\n\n" + table(
                        ("allocated at", "KiB", "blocks"),
                        [(r["where"], r["kib"], r["blocks"]) for r in trace["top"]]))
    return out


def pools_md(s: dict[str, Any]) -> str:
    """Issue 22's benchmark: the pools against the single lease, interleaved in one process."""
    rank, idle = s["rank"], s["idle"]
    pools = ", ".join(f"{name} ({slots})" for name, slots in s["pools"]["pools"])
    rows = []
    for label, key, path in (("rank + grant tick (beat, Redis included)", "rank",
                              ("rank_tick",)),
                             ("the tick after it, every slot held", "rank", ("held_tick",)),
                             ("plan_tick alone (core, no Redis)", "plan", ()),
                             ("idle tick", "idle", ())):
        src = rank["plan"] if key == "plan" else rank if key == "rank" else idle
        one, many = g(src, "single", *path), g(src, "pools", *path)
        ratio = {"rank": rank["ratio_rank_pools_over_single"] if path == ("rank_tick",)
                 else rank["ratio_held_pools_over_single"],
                 "plan": rank["ratio_plan_pools_over_single"],
                 "idle": idle["ratio_pools_over_single"]}[key]
        rows.append((label, g(one, "ms", "median"), g(one, "ms", "p90"),
                     g(one, "round_trips", "median"), g(many, "ms", "median"),
                     g(many, "ms", "p90"), g(many, "round_trips", "median"), ratio))
    goals = s["goals"]
    return (f"{fmt(s['lanes'])} due heavy lanes (four families of a quarter each) in the "
            f"single lease against the same lanes in four pools: {pools} slots. Two "
            "schedulers in one process, their ticks interleaved; "
            f"{fmt(rank['cycles'])} ranking cycles and {fmt(idle['reps'])} idle ticks each; "
            f"grants per ranking tick: {rank['grants']['single']} and "
            f"{rank['grants']['pools']}; load average at start / end "
            f"{s['load_average_at_start']} / {s['load_average_at_end']}.\n\n"
            + table(("tick", "single lease (ms, median)", "p90", "round trips",
                     "four pools (ms, median)", "p90", "round trips", "pools / single"), rows)
            + f"\nGoals (issue 22): rank + grant within 1.2x the single lease — "
            f"{fmt(goals['rank_within_1.2x_single'])}; idle tick unchanged within noise "
            f"(same round trips, median within 1.1x) — {fmt(goals['idle_within_noise'])}.\n"
            + _pools_profile_md(s))


def _pools_profile_md(s: dict[str, Any]) -> str:
    prof = g(s, "rank", "profile")
    if not prof:
        return ""
    out = "\nProfile of one tick and one plan of each side (cProfile, cumulative time):\n"
    for scenario, rows_ in prof.items():
        out += f"\n*{scenario}*\n\n" + table(
            ("function", "calls", "cumulative (ms)", "own (ms)"),
            [(r["function"], r["calls"], r["cumtime_ms"], r["tottime_ms"]) for r in rows_])
    return out


def markdown(results: dict[str, Any]) -> str:
    parts = ["## Machine\n\n" + machine_md(results["machine"])]
    sections = results.get("sections", {})
    render = (("handoff", "Lease hand-off gap", handoff_md),
              ("tick", "Tick cost, round trips and memory", tick_md),
              ("light_delay", "Light dispatch delay while a heavy lane holds the lease",
               light_delay_md),
              ("throughput", "Light-path throughput, one light worker", throughput_md),
              ("handoff_scale", "Hand-off gap with many lanes declared", handoff_scale_md),
              ("handoff_breakdown", "Where the hand-off gap goes (traced)",
               handoff_breakdown_md),
              ("entries", "Schedule entries: start-up, idle tick and memory", entries_md),
              ("pools", "Pools: rank and grant across four pools, and the idle tick",
               pools_md))
    for key, title, fn in render:
        if key in sections:
            parts.append(f"## {title}\n\n{fn(sections[key])}")
    smoke = " (smoke run: tiny counts, figures not meaningful)" if results.get("smoke") else ""
    parts.append(f"Command: `{results['command'].strip()}`{smoke}; took "
                 f"{fmt(results['elapsed_s'])} s.\n")
    return "\n".join(parts)
