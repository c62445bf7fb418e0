"""Live scenarios: real ``celery beat`` and ``celery worker`` processes on a private Redis.

Each scenario starts from an empty database and its own processes, and stops them afterwards.
All timestamps a figure subtracts come from the same clock (one machine).
"""

from __future__ import annotations

import itertools
import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench.cluster import Cluster, process_cpu_seconds, redis_server_pid, scenario_env
from bench.handoff import (
    FloorProbe,
    against_floor,
    floor_figures,
    per_event,
    redis_server_pid_of,
    usage,
)
from bench.stats import ratio, summary
from schedproj.core import defaults
from schedproj.core.records import Outcome, RunRecord, encode
from schedproj.devtools.processes import stop_all, wait_for
from schedproj.store.lane_store import LaneStore
from schedproj.store.protocol import Keys

PREFIX = "bench"
RUNS_KEY = f"{PREFIX}:bench:runs"
DONE_KEY = f"{PREFIX}:bench:done"


@dataclass(frozen=True)
class LiveOptions:
    """Sizes and timings of the live scenarios (``smoke()`` shrinks them)."""

    handoff_samples_on: int = 200
    handoff_samples_off: int = 20
    #: Floor samples (bench.handoff): half before beat starts, half after it stopped.
    handoff_floor_samples: int = 200
    handoff_lanes: int = 3
    handoff_run_s: float = 0.02
    #: Beat's loop interval in every live scenario: SCHEDPROJ_BEAT_MAX_LOOP_INTERVAL_S.
    interval_s: float = defaults.BEAT_MAX_LOOP_INTERVAL_S
    light_delay_s: float = 30.0
    light_lanes: int = 5
    light_cadence_s: float = 0.5
    light_heavy_run_s: float = 1.0
    light_concurrency: int = 2
    throughput_lanes: int = 20
    throughput_concurrency: int = 1
    throughput_warmup_s: float = 3.0
    throughput_window_s: float = 15.0
    warmup_runs: int = 2
    blpop_samples: int = 12

    @classmethod
    def smoke(cls) -> LiveOptions:
        return cls(handoff_samples_on=5, handoff_samples_off=2, handoff_floor_samples=4,
                   interval_s=0.5,
                   light_delay_s=3.0, light_heavy_run_s=0.3, throughput_warmup_s=0.5,
                   throughput_window_s=2.0, warmup_runs=1, blpop_samples=4)


@contextmanager
def fresh(url: str, scenario: str, extra: dict[str, str]) -> Iterator[tuple[Cluster,
                                                                             redis.Redis]]:
    """An empty database and a cluster for ``scenario``; everything stopped afterwards."""
    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushdb()
    # A new deployment: no state-loss quarantine before the first grant.
    LaneStore(client, Keys(PREFIX)).declare_fresh()
    with tempfile.TemporaryDirectory(prefix=f"bench-{scenario}-") as tmp, \
            Cluster(scenario_env(url, scenario, PREFIX, extra), Path(tmp)) as cluster:
        yield cluster, client
    client.close()


def runs(client: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(x) for x in client.lrange(RUNS_KEY, 0, -1)]


def heavy_runs(client: redis.Redis) -> list[dict[str, Any]]:
    return sorted((r for r in runs(client) if r["kind"] == "heavy"), key=lambda r: r["start"])


# -- lease hand-off gap -------------------------------------------------------------------------

#: bench.lanes.IDLE_FAMILY (not imported here: importing bench.lanes declares its tasks).
IDLE_FAMILY = "bench.idle-family"


def seed_idle_members(client: redis.Redis, n: int) -> None:
    """``n`` members of the idle family that ran just now: declared lanes, never due."""
    keys, now = Keys(PREFIX), time.time()
    record = encode(RunRecord(last_run_at=now, last_outcome=Outcome.COMPLETED, runs=1))
    for start in range(0, n, 5000):
        chunk = [f"k{i:06d}" for i in range(start, min(n, start + 5000))]
        lanes = [f"{IDLE_FAMILY}[{k}]" for k in chunk]
        pipe = client.pipeline(transaction=False)
        pipe.sadd(keys.family(IDLE_FAMILY), *chunk)
        pipe.hset(keys.lanes, mapping={f"{lane}|run": record for lane in lanes})
        pipe.zadd(keys.due, dict.fromkeys(lanes, now + 86400.0))
        pipe.execute()


def handoff(url: str, opts: LiveOptions, *, wake: bool, idle_members: int = 0,
            samples: int | None = None, floor_samples: int = 0,
            trace_dir: Path | None = None, profile_dir: Path | None = None) -> dict[str, Any]:
    """Heavy runs back to back while a backlog waits: next start minus previous end. With
    ``idle_members``, that many more lanes are declared (members of a family, never due).
    With ``floor_samples``, the floor is measured on the same worker, half before beat starts
    and half after it stopped (:mod:`bench.handoff`); with ``trace_dir``, every process
    stamps the hand-off path there (:mod:`bench.handoff_trace`); with ``profile_dir``, beat's
    ticks and the lane calls are profiled there."""
    if samples is None:
        samples = opts.handoff_samples_on if wake else opts.handoff_samples_off
    extra = {
        "SCHEDPROJ_WAKE_ON_RELEASE": "true" if wake else "false",
        "SCHEDPROJ_BEAT_MAX_LOOP_INTERVAL_S": str(opts.interval_s),
        "BENCH_HEAVY": str(opts.handoff_lanes),
        "BENCH_HEAVY_RUN_S": str(opts.handoff_run_s),
    }
    if trace_dir is not None:
        extra["BENCH_TRACE_DIR"] = str(trace_dir)
    if profile_dir is not None:  # beat's ticks and the lane calls in CPU time (cProfile)
        extra["BENCH_PROFILE_DIR"] = str(profile_dir)
    # The last run's record is pushed by the run after it (bench.lanes): one more to wait for.
    wanted = samples + opts.warmup_runs + 1
    with fresh(url, "handoff", extra) as (cluster, client):
        seed_idle_members(client, idle_members)
        worker = cluster.worker("heavy", defaults.HEAVY_QUEUE, 1)
        probe = FloorProbe(url, PREFIX) if floor_samples else None
        if probe is not None:
            probe.measure(floor_samples // 2, procs={"worker": worker})
        beat = cluster.fair_beat()
        budget = 60 + wanted * (opts.interval_s + opts.handoff_run_s) * 2
        _wait_for_runs(cluster, client, opts.warmup_runs, budget)
        procs, server = {"beat": beat, "worker": worker}, redis_server_pid_of(client)
        before, recorded = usage(client, procs, server, own_blpop=False), client.llen(RUNS_KEY)
        _wait_for_runs(cluster, client, wanted, budget)
        runs_in_window = int(client.llen(RUNS_KEY)) - recorded
        cost = per_event(before, usage(client, procs, server, own_blpop=False),
                         runs_in_window, runs_in_window)
        done = heavy_runs(client)
        if probe is not None:
            stop_all([beat])  # the worker finishes its run and goes idle: the floor again
            # A message beat sent before it stopped is fetched and run (a run is 20 ms); a
            # grant it made and never sent leaves the worker idle too.
            wait_for(lambda: not client.llen(defaults.HEAVY_QUEUE), 30, "the heavy queue empty")
            time.sleep(opts.handoff_run_s + 0.5)
            probe.measure(floor_samples - floor_samples // 2, procs={"worker": worker})
            probe.close()
    out = _handoff_figures(opts, wake, idle_members, done[opts.warmup_runs:wanted],
                           probe.samples if probe is not None else None,
                           keep_raw=trace_dir is not None)
    # Per hand-off (each run's own record, pushed by the bench, not counted) and per floor
    # sample: what each process spent, and the Redis commands sent.
    out["cost_per_handoff"] = cost
    if probe is not None:
        out["floor"]["cost_per_sample"] = probe.costs
    return out


def _wait_for_runs(cluster: Cluster, client: redis.Redis, wanted: int, budget: float) -> None:
    def enough() -> bool:
        cluster.check_alive()  # a process that died fails the scenario now, not at timeout
        return int(client.llen(RUNS_KEY)) >= wanted

    wait_for(enough, budget, f"{wanted} heavy runs")


def _handoff_figures(opts: LiveOptions, wake: bool, idle_members: int,
                     kept: list[dict[str, Any]], floor: list[dict[str, float]] | None, *,
                     keep_raw: bool) -> dict[str, Any]:
    gaps = [b["start"] - a["end"] for a, b in itertools.pairwise(kept)]
    fences = [r["fence"] for r in kept]
    out: dict[str, Any] = {
        "wake_on_release": wake,
        "loop_interval_s": opts.interval_s,
        "heavy_lanes": opts.handoff_lanes,
        "declared_lanes": opts.handoff_lanes + idle_members,
        "run_s": opts.handoff_run_s,
        "gap_ms": summary(gaps, 1000.0),
        "gap_samples_ms": [round(g * 1000.0, 3) for g in gaps],
        "overlaps": sum(1 for g in gaps if g < 0),
        "fences_increase": all(b > a for a, b in itertools.pairwise(fences)),
    }
    if floor is not None:
        out["floor"] = floor_figures(floor)
        out["floor"]["samples_ms"] = [round((s["start"] - s["published"] + s["rtt"]) * 1000.0,
                                            3) for s in floor]
        out["against_floor"] = against_floor(out["gap_ms"], out["floor"])
    if keep_raw:
        out["kept_runs"], out["floor_samples"] = kept, floor or []
    return out


def handoff_section(url: str, opts: LiveOptions) -> dict[str, Any]:
    on = handoff(url, opts, wake=True, floor_samples=opts.handoff_floor_samples)
    off = handoff(url, opts, wake=False)
    med_on, p99_on = on["gap_ms"]["median"], on["gap_ms"]["p99"]
    return {
        "wake_on": on,
        "wake_off": off,
        "median_ratio_off_over_on": ratio(off["gap_ms"]["median"], med_on, 1),
        "goals": {
            "median_under_50ms": med_on is not None and med_on < 50.0,
            "p99_under_250ms": p99_on is not None and p99_on < 250.0,
        },
        # Issue 23: the gap against the floor measured on the same worker in this run.
        "floor_goals": on["against_floor"]["goals"],
    }


def handoff_scale_section(url: str, opts: LiveOptions, large: int = 100_000) -> dict[str, Any]:
    """The hand-off gap with ``large`` lanes declared against the same with 10 (the extra
    lanes are members of an idle family): flat in N is the goal."""
    samples = max(5, opts.handoff_samples_on // 2)
    small = handoff(url, opts, wake=True, idle_members=10 - opts.handoff_lanes,
                    samples=samples)
    big = handoff(url, opts, wake=True, idle_members=large - opts.handoff_lanes,
                  samples=samples)
    med_small, med_big = small["gap_ms"]["median"], big["gap_ms"]["median"]
    ratio_big = ratio(med_big, med_small)
    return {
        "lanes_10": small, f"lanes_{large}": big,
        "median_ratio_large_over_10": ratio_big,
        "goals": {"median_within_2x_of_10_lanes": ratio_big is not None and ratio_big <= 2.0,
                  "p99_under_50ms": big["gap_ms"]["p99"] is not None
                  and big["gap_ms"]["p99"] < 50.0},
    }


# -- light dispatch delay while a heavy lane holds the lease --------------------------------------

def light_delay(url: str, opts: LiveOptions, *, heavy: bool) -> dict[str, Any]:
    extra = {
        "SCHEDPROJ_BEAT_MAX_LOOP_INTERVAL_S": str(opts.interval_s),
        "BENCH_HEAVY": "2" if heavy else "0",
        "BENCH_HEAVY_RUN_S": str(opts.light_heavy_run_s),
        "BENCH_LIGHT": str(opts.light_lanes),
        "BENCH_LIGHT_CADENCE_S": str(opts.light_cadence_s),
    }
    with fresh(url, "light-delay", extra) as (cluster, client):
        if heavy:
            cluster.worker("heavy", defaults.HEAVY_QUEUE, 1)
        cluster.worker("light", defaults.LIGHT_QUEUE, opts.light_concurrency)
        cluster.fair_beat()
        begin = time.time()
        time.sleep(opts.light_delay_s)
        cluster.check_alive()
        end = time.time()
        seen = runs(client)
    # Samples from the first second are start-up (the first runs have no previous run).
    window_start = begin + 1.0
    light = [r for r in seen if r["kind"] == "light" and r["due"] is not None
             and r["dispatch"] is not None and r["dispatch"] >= window_start]
    heavy_iv = [(r["start"], r["end"]) for r in seen if r["kind"] == "heavy"]

    def under_heavy(t: float) -> bool:
        return any(s <= t <= e for s, e in heavy_iv)

    during = [r for r in light if under_heavy(r["dispatch"])]
    covered = sum(max(0.0, min(e, end) - max(s, window_start)) for s, e in heavy_iv)
    return {
        "heavy_holding_lease": heavy,
        "loop_interval_s": opts.interval_s,
        "light_lanes": opts.light_lanes,
        "lease_busy_fraction": round(covered / max(1e-9, end - window_start), 3),
        "dispatch_delay_ms": summary([r["dispatch"] - r["due"] for r in light], 1000.0),
        "dispatch_delay_samples_ms": [round((r["dispatch"] - r["due"]) * 1000.0, 3)
                                      for r in light],
        "start_delay_ms": summary([r["start"] - r["due"] for r in light], 1000.0),
        "dispatch_delay_while_heavy_ran_ms": summary(
            [r["dispatch"] - r["due"] for r in during], 1000.0),
    }


def blpop_overshoot(url: str, samples: int) -> dict[str, Any]:
    """How late Redis ends a BLPOP that times out (beat's sleep until the next lane is due):
    the server checks blocked clients' timeouts on its own clock (``hz``)."""
    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushdb()
    late = []
    for i in range(samples):
        timeout = 0.01 + 0.29 * i / max(1, samples - 1)
        start = time.perf_counter()
        client.blpop(["bench:nothing"], timeout=timeout)
        late.append(time.perf_counter() - start - timeout)
    hz = client.config_get("hz").get("hz")
    client.close()
    return {"server_hz": None if hz is None else int(hz),
            "overshoot_ms": summary(late, 1000.0)}


def light_delay_section(url: str, opts: LiveOptions) -> dict[str, Any]:
    held = light_delay(url, opts, heavy=True)
    alone = light_delay(url, opts, heavy=False)
    p99 = held["dispatch_delay_ms"]["p99"]
    return {
        "heavy_running": held,
        "no_heavy_lanes": alone,
        "blpop_timeout": blpop_overshoot(url, opts.blpop_samples),
        "median_ratio_heavy_over_none": ratio(held["dispatch_delay_ms"]["median"],
                                              alone["dispatch_delay_ms"]["median"]),
        "goals": {"p99_within_one_tick": p99 is not None and p99 <= opts.interval_s * 1000},
    }


# -- light-path throughput ------------------------------------------------------------

def throughput(url: str, opts: LiveOptions, *, bare: bool) -> dict[str, Any]:
    extra = {
        "SCHEDPROJ_BEAT_MAX_LOOP_INTERVAL_S": str(opts.interval_s),
        "BENCH_LIGHT": str(opts.throughput_lanes),
    }
    with fresh(url, "throughput", extra) as (cluster, client):
        worker = cluster.worker("light", defaults.LIGHT_QUEUE, opts.throughput_concurrency)
        beat = cluster.bare_beat() if bare else cluster.fair_beat()
        time.sleep(opts.throughput_warmup_s)
        c0, t0 = int(client.get(DONE_KEY) or 0), time.monotonic()
        server = redis_server_pid(url)

        def cpu() -> tuple[float, float, float]:
            return (beat.cpu_seconds(), worker.cpu_seconds(),
                    process_cpu_seconds(server) if server else 0.0)

        cpu0 = cpu()
        time.sleep(opts.throughput_window_s)
        c1, t1 = int(client.get(DONE_KEY) or 0), time.monotonic()
        cpu1 = cpu()
        queued = client.llen(defaults.LIGHT_QUEUE)
        cluster.check_alive()
    return {
        "scheduler": "celery PersistentScheduler (bare beat)" if bare else "fair",
        "light_lanes": opts.throughput_lanes,
        "worker_concurrency": opts.throughput_concurrency,
        "window_s": round(t1 - t0, 2),
        "runs": c1 - c0,
        "runs_per_s": round((c1 - c0) / (t1 - t0), 1),
        "queued_at_end": queued,
        # CPU seconds per wall second in the window (the machine has os.cpu_count() cores).
        "beat_cpu": round((cpu1[0] - cpu0[0]) / (t1 - t0), 2),
        "worker_cpu": round((cpu1[1] - cpu0[1]) / (t1 - t0), 2),
        "redis_cpu": round((cpu1[2] - cpu0[2]) / (t1 - t0), 2) if server else None,
        "beat_cpu_ms_per_run": round((cpu1[0] - cpu0[0]) * 1000 / max(1, c1 - c0), 2),
    }


def throughput_section(url: str, opts: LiveOptions) -> dict[str, Any]:
    fair = throughput(url, opts, bare=False)
    bare = throughput(url, opts, bare=True)
    return {"fair": fair, "bare_beat": bare,
            "ratio_fair_over_bare": ratio(fair["runs_per_s"], bare["runs_per_s"])}
