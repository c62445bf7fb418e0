"""The hand-off gap beside its floor, and where the gap goes (issue 23, item 3).

**The floor**, measured in the hand-off scenario's own cluster, on the same heavy worker
(``celery -A schedproj.app worker -Q heavy -c 1``), before beat starts and again after it
stopped: this process publishes the plain task ``bench.floor`` to queue ``heavy`` (Celery's
``send_task``, as beat sends a lane) while the worker is idle, and the task body stamps its
start; one sample is that start minus the publish time the message carries, plus one Redis
round trip (a ``PING`` from this process, timed just before). So the floor is one Redis round
trip + one publish + one fetch by an idle worker, on the same machine in the same run as the
gap it is compared with.

**The breakdown** (``python -m bench.handoff``, or ``bench.run --sections
handoff_breakdown``): the same scenario with every process stamping the hand-off path
(:mod:`bench.handoff_trace`); each hand-off's stamps are matched to its window (run A's end to
run B's start) and each stage's median is reported, with the floor's own stages beside.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from bench import handoff_trace
from bench.cluster import Proc, process_cpu_seconds
from bench.stats import ratio, summary
from schedproj.core import defaults

FLOOR_TASK = "bench.floor"


def floor_key(prefix: str) -> str:
    return f"{prefix}:bench:floor"


class FloorProbe:
    """Publishes ``bench.floor`` to the heavy queue from this process and waits for each
    message to start, one at a time, the worker idle before each publish."""

    def __init__(self, url: str, prefix: str, pause_s: float = 0.02) -> None:
        self.app = Celery("bench-floor", broker=url, set_as_current=False)
        self.app.conf.task_create_missing_queues = True
        self.app.conf.broker_connection_retry_on_startup = True
        self.client = redis.Redis.from_url(url, decode_responses=True)
        self.key, self.pause_s = floor_key(prefix), pause_s
        self.samples: list[dict[str, float]] = []
        #: What each ``measure`` cost per sample (CPU, Redis commands).
        self.costs: list[dict[str, Any]] = []

    def one(self) -> dict[str, float]:
        ping0 = time.perf_counter()
        self.client.ping()
        rtt = time.perf_counter() - ping0
        published = time.time()
        self.app.send_task(FLOOR_TASK, args=[published], queue=defaults.HEAVY_QUEUE)
        sent = time.time()
        reply = self.client.blpop([self.key], timeout=30)
        if reply is None:
            raise RuntimeError("the idle heavy worker did not start bench.floor within 30 s")
        run = json.loads(reply[1])
        time.sleep(self.pause_s)  # the worker acknowledges and waits on its queue again
        return {"published": run["published"], "start": run["start"], "rtt": rtt,
                "publish_s": sent - published}

    def measure(self, n: int, warmup: int = 3,
                procs: dict[str, Proc] | None = None) -> list[dict[str, float]]:
        """``n`` samples; with ``procs``, also what they cost (:attr:`cost`)."""
        for _ in range(warmup):  # connections made, scripts and imports warm
            self.one()
        server = redis_server_pid_of(self.client)
        before = usage(self.client, procs or {}, server)
        taken = [self.one() for _ in range(n)]
        self.costs.append(per_event(before, usage(self.client, procs or {}, server), n, n))
        self.samples += taken
        return taken

    def close(self) -> None:
        self.client.close()
        self.app.close()


def redis_server_pid_of(client: redis.Redis) -> int | None:
    return int(client.info("server")["process_id"])


def floor_figures(samples: Sequence[dict[str, float]]) -> dict[str, Any]:
    """The floor's figures: per sample, publish-to-start plus that sample's round trip."""
    fetch = [s["start"] - s["published"] for s in samples]
    rtt = [s["rtt"] for s in samples]
    return {
        "floor_ms": summary([f + r for f, r in zip(fetch, rtt, strict=True)], 1000.0),
        "publish_to_start_ms": summary(fetch, 1000.0),
        "round_trip_ms": summary(rtt, 1000.0),
        "publish_call_ms": summary([s["publish_s"] for s in samples], 1000.0),
    }


def against_floor(gap: dict[str, Any], floor: dict[str, Any]) -> dict[str, Any]:
    """The gap's median and p99 over the floor's median: issue 23's goals (at most 2x and 4x)."""
    base = floor["floor_ms"]["median"]
    med = ratio(gap["median"], base)
    p99 = ratio(gap["p99"], base)
    return {"median_over_floor": med, "p99_over_floor": p99,
            "goals": {"median_within_2x_floor": None if med is None else med <= 2.0,
                      "p99_within_4x_floor": None if p99 is None else p99 <= 4.0}}


# -- what a hand-off costs: CPU and Redis commands --------------------------------------------

#: Commands the benchmark itself sends (its polls, its probe's round trip and wait, the INFO
#: read here): not counted.
BENCH_COMMANDS = frozenset({"llen", "info", "ping", "blpop"})


def usage(client: redis.Redis, procs: dict[str, Proc], server: int | None,
          *, own_blpop: bool = True) -> dict[str, float]:
    """CPU seconds so far of each process (a worker's pool children apart from its main
    process) and of Redis, and the Redis commands processed so far less the benchmark's own
    (with ``own_blpop`` False, BLPOP is counted: beat's wait on the wake list)."""
    out: dict[str, float] = {}
    for name, proc in procs.items():
        total, main = proc.cpu_seconds(), process_cpu_seconds(proc.popen.pid)
        out[name] = main
        if name != "beat":
            out[f"{name} pool child"] = total - main
    out["redis"] = process_cpu_seconds(server) if server else 0.0
    stats = client.info("commandstats")
    skip = BENCH_COMMANDS - ({"blpop"} if not own_blpop else set())
    out["commands"] = sum(int(v["calls"]) for k, v in stats.items()
                          if k.removeprefix("cmdstat_") not in skip)
    return out


def per_event(before: dict[str, float], after: dict[str, float], events: int,
              own_writes: int) -> dict[str, Any]:
    """CPU milliseconds per event of each process and Redis commands per event, less the
    benchmark's ``own_writes`` records."""
    n = max(1, events)
    return {"events": events,
            "cpu_ms": {k: round((after[k] - before[k]) * 1000.0 / n, 3)
                       for k in after if k != "commands"},
            "redis_commands": round((after["commands"] - before["commands"] - own_writes) / n,
                                    1)}


# -- the breakdown ---------------------------------------------------------------------------

#: The hand-off's critical path, in order: (key, stamp, where it happens, the stage it ends).
HANDOFF_PATH = (
    ("body_end", "body_end", "worker child", "run A's body returns"),
    ("journal_end", "journal", "worker child", "lease renewer stopped, outcome computed "
                                               "(journaled apart: before issue 23: 3)"),
    ("journaled_end", "journaled", "worker child", "journal 'end' written (one round trip)"),
    ("finish_call", "finish_call", "worker child", "the lane's next due time computed (and "
                                                   "the renewer stopped, the outcome)"),
    ("blpop_return", "blpop_return", "beat", "finish (journal 'end', record, release, wake: "
                                             "one round trip) to beat's BLPOP returning"),
    ("tick_start", "tick_start", "beat", "Celery's beat loop back into tick() (the wake "
                                         "list's DEL: with the tick's read since 23: 3)"),
    ("snapshot", "snapshot", "beat", "the tick's read (one Lua call) and its parse"),
    ("planned", "planned", "beat", "memory, focus, plan_tick"),
    ("granted", "granted", "beat", "the heavy lease granted (one Lua call)"),
    ("recorded", "recorded", "beat", "the dispatch recorded with the due index (one Lua "
                                     "call; with the grant since issue 23: 3)"),
    ("send_entry", "send_entry", "beat", "the LaneEntry (the deferral logs after the send "
                                         "since issue 23: 3)"),
    ("publish", "publish", "beat", "Celery's apply_entry and apply_async building the "
                                   "message (the send logged)"),
    ("brpop_read", "brpop_read", "worker main", "kombu's publish (one LPUSH: Celery sends to "
                                                "the queue by name) to the worker's BRPOP "
                                                "answer being read"),
    ("appended", "appended", "worker main", "message parsed, recorded unacknowledged (one "
                                            "round trip)"),
    ("received", "received", "worker main", "Celery's request built, 'received' logged"),
    ("to_pool", "to_pool", "worker main", "task-received event published"),
    ("prerun", "prerun", "worker child", "the request through the pool's pipe to the child"),
    ("lease_started", "lease_started", "worker child", "lease checked and marked started "
                                                       "(one Lua call; with the run record "
                                                       "and the journal when expected)"),
    ("marked", "marked", "worker child", "run record marked running by its own compare and "
                                         "set (when the start did not)"),
    ("journal_start", "journal", "worker child", "run context made"),
    ("journaled_start", "journaled", "worker child", "journal 'start' written (one round "
                                                     "trip)"),
    ("body_start", "body_start", "worker child", "lease renewer handed to a kept thread "
                                                 "(a new thread's start before)"),
)
#: The stamps every version of the path passes (the others may be merged away by a change).
REQUIRED = frozenset({"blpop_return", "publish", "brpop_read", "prerun"})
#: Stamps beside the path: the worker's reply to finish, when it could fetch again, beat's
#: LPUSH reply and its return to waiting.
SIDE_EVENTS = ("finish_done", "acked", "brpop_sent", "pushed", "wait")
FLOOR_PATH = (
    ("published", "published", "bench", "send_task called"),
    ("brpop_read", "brpop_read", "worker main", "send_task (message built, one LPUSH) to the "
                                                "BRPOP answer being read"),
    ("appended", "appended", "worker main", "message parsed, recorded unacknowledged (one "
                                            "round trip)"),
    ("received", "received", "worker main", "Celery's request built, 'received' logged"),
    ("to_pool", "to_pool", "worker main", "task-received event published"),
    ("prerun", "prerun", "worker child", "the request through the pool's pipe to the child"),
    ("body_start", "body_start", "worker child", "task tracer to the body"),
)

Stamp = tuple[float, str, str, int]


def _first(stamps: Sequence[Stamp], event: str, after: float, until: float,
           ident: str | None = None) -> float | None:
    for t, name, who, _pid in stamps:
        if t < after:
            continue
        if t > until:
            return None
        if name == event and (ident is None or who == ident):
            return t
    return None


def handoff_times(stamps: Sequence[Stamp], a: dict[str, Any],
                  b: dict[str, Any]) -> dict[str, float] | None:
    """The path's stamps of the hand-off from run ``a`` to run ``b`` (None if one is
    missing or out of order)."""
    times = {"body_end": a["end"]}
    at = a["end"]
    for key, event, _where, _stage in HANDOFF_PATH[1:-1]:
        ident = {"publish": defaults.HEAVY_QUEUE, "prerun": b["task"]}.get(event)
        t = _first(stamps, event, at, b["start"], ident)
        if t is None and key in REQUIRED:
            return None
        if t is not None:  # a stamp the code under test no longer passes is left out
            times[key] = at = t
    times["body_start"] = b["start"]
    for event in SIDE_EVENTS:
        ident = defaults.HEAVY_QUEUE if event == "pushed" else None
        # Beat's return to waiting: after this hand-off's publish, maybe after B started.
        after = times["publish"] if event == "wait" else a["end"]
        t = _first(stamps, event, after, b["end"] if event == "wait" else b["start"], ident)
        if t is not None:
            times[event] = t
    return times


def floor_times(stamps: Sequence[Stamp], sample: dict[str, float]) -> dict[str, float] | None:
    times = {"published": sample["published"]}
    at = sample["published"]
    for key, event, _where, _stage in FLOOR_PATH[1:-1]:
        t = _first(stamps, event, at, sample["start"])
        if t is None:
            return None
        times[key] = at = t
    times["body_start"] = sample["start"]
    return times


def stage_table(timelines: Sequence[dict[str, float]],
                path: Sequence[tuple[str, str, str, str]]) -> list[dict[str, Any]]:
    """Per stage (the time from the previous stamp of the path that a timeline has to this
    one): how many timelines have it, its median and p90, and the median offset from the
    path's first stamp, in milliseconds. A stamp no timeline has is left out."""
    rows = []
    first = path[0][0]
    for i, (key, event, where, stage) in enumerate(path[1:], start=1):
        spans, offsets = [], []
        for tl in timelines:
            if key not in tl:
                continue
            prev = next(p[0] for p in reversed(path[:i]) if p[0] in tl)
            spans.append(tl[key] - tl[prev])
            offsets.append(tl[key] - tl[first])
        if spans:
            rows.append({"stamp": event, "process": where, "stage": stage, "n": len(spans),
                         "median_ms": round(statistics.median(spans) * 1000.0, 3),
                         "p90_ms": summary(spans, 1000.0)["p90"],
                         "offset_median_ms": round(statistics.median(offsets) * 1000.0, 3)})
    return rows


def side_figures(timelines: Sequence[dict[str, float]]) -> dict[str, Any]:
    """When the worker could fetch again against beat's publish, and beat's own replies."""
    def spans(late: str, early: str) -> list[float]:
        return [tl[late] - tl[early] for tl in timelines if late in tl and early in tl]

    brpop_after_publish = spans("brpop_sent", "publish")
    return {
        "acked_after_body_end_ms": summary(spans("acked", "body_end"), 1000.0),
        "brpop_sent_after_body_end_ms": summary(spans("brpop_sent", "body_end"), 1000.0),
        "brpop_sent_after_publish_ms": summary(brpop_after_publish, 1000.0),
        "worker_not_yet_fetching_at_publish": round(
            sum(1 for s in brpop_after_publish if s > 0) / max(1, len(brpop_after_publish)), 3),
        "finish_reply_after_call_ms": summary(spans("finish_done", "finish_call"), 1000.0),
        "publish_call_ms": summary(spans("pushed", "publish"), 1000.0),
        "beat_busy_after_publish_ms": summary(spans("wait", "publish"), 1000.0),
    }


def round_trips(stamps: Sequence[Stamp],
                timelines: Sequence[dict[str, float]]) -> dict[str, Any]:
    """The Redis round trips each hand-off waits for, counted where redis-py sends them
    (``rt`` stamps: a pipeline is one): the worker child's from run A's end to run B's start,
    beat's from its BLPOP's return to its LPUSH's answer, the worker main process's from the
    BRPOP answer to the pool. Medians and the spread of the totals."""
    def pids(event: str) -> set[int]:
        return {pid for _t, name, _who, pid in stamps if name == event}

    sends = [(t, pid) for t, name, _who, pid in stamps if name == "rt"]
    where = {"worker child": (pids("prerun"), "body_end", "body_start"),
             "beat": (pids("tick_start"), "blpop_return", "pushed"),
             "worker main": (pids("brpop_read"), "brpop_read", "to_pool")}
    counts: dict[str, list[int]] = {name: [] for name in where}
    totals: list[int] = []
    for tl in timelines:
        if not all(first in tl and last in tl for _p, first, last in where.values()):
            continue
        per = {name: sum(1 for t, pid in sends if pid in who and tl[first] <= t <= tl[last])
               for name, (who, first, last) in where.items()}
        for name, n in per.items():
            counts[name].append(n)
        totals.append(sum(per.values()))
    if not totals:
        return {}
    return {"handoffs": len(totals),
            **{f"{name}_median": statistics.median(n) for name, n in counts.items()},
            "total_median": statistics.median(totals),
            "total_counts": {str(k): totals.count(k) for k in sorted(set(totals))}}


def breakdown(trace_dir: Path, runs: Sequence[dict[str, Any]],
              floors: Sequence[dict[str, float]]) -> dict[str, Any]:
    """Each hand-off's and each floor sample's stamps, summarised per stage."""
    stamps = handoff_trace.read(trace_dir)
    pairs = list(itertools.pairwise(runs))
    handoffs = [tl for a, b in pairs if (tl := handoff_times(stamps, a, b)) is not None]
    floor = [tl for s in floors if (tl := floor_times(stamps, s)) is not None]
    return {
        "handoffs_traced": len(handoffs), "handoffs_unmatched": len(pairs) - len(handoffs),
        "handoff_stages": stage_table(handoffs, HANDOFF_PATH) if handoffs else [],
        "handoff_side": side_figures(handoffs) if handoffs else {},
        "handoff_round_trips": round_trips(stamps, handoffs) if handoffs else {},
        "floor_samples_traced": len(floor),
        "floor_stages": stage_table(floor, FLOOR_PATH) if floor else [],
        "stamps": len(stamps),
    }


def breakdown_section(url: str, opts: Any) -> dict[str, Any]:
    """The hand-off scenario traced (``bench.handoff_trace``): its gap and floor beside the
    per-stage medians; and untraced just before, so the stamps' own cost shows."""
    from bench import live

    plain = live.handoff(url, opts, wake=True, floor_samples=opts.handoff_floor_samples)
    with tempfile.TemporaryDirectory(prefix="bench-trace-") as tmp:
        traced = live.handoff(url, opts, wake=True, trace_dir=Path(tmp),
                              floor_samples=opts.handoff_floor_samples)
        traced["breakdown"] = breakdown(Path(tmp), traced.pop("kept_runs"),
                                        traced.pop("floor_samples"))
    traced["untraced"] = {key: plain[key] for key in ("gap_ms", "floor", "against_floor")}
    return traced


def profiled(url: str, opts: Any, top: int = 25) -> dict[str, Any]:
    """The hand-off scenario (untraced) with beat's ticks and the worker's lane calls
    profiled in CPU time: each process's functions by own CPU time, per hand-off."""
    import pstats

    from bench import live

    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        result = live.handoff(url, opts, wake=True, profile_dir=Path(tmp))
        out: dict[str, Any] = {"gap_ms": result["gap_ms"], "profiles": []}
        for path in sorted(Path(tmp).glob("*.prof")):
            stats = pstats.Stats(str(path))
            rows = sorted(stats.stats.items(),  # type: ignore[attr-defined]
                          key=lambda kv: kv[1][2], reverse=True)
            entry = [v[1] for k, v in rows if (k[0].endswith("on_celery/beat.py") and k[2] ==
                                               "tick") or (k[0].endswith("on_celery/task.py")
                                                           and k[2] == "__call__")]
            calls = max(1, max(entry, default=1))
            out["profiles"].append({
                "calls": calls, "cpu_ms_per_call": round(
                    stats.total_tt * 1000.0 / calls, 3),  # type: ignore[attr-defined]
                "top": [{"function": f"{Path(k[0]).name}:{k[1]}({k[2]})",
                         "own_ms_per_call": round(v[2] * 1000.0 / calls, 4),
                         "cumulative_ms_per_call": round(v[3] * 1000.0 / calls, 4)}
                        for k, v in rows[:top]]})
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.handoff``: the traced hand-off on a private Redis, as JSON and
    tables."""
    from bench import live, report
    from schedproj.devtools.embedded import private_redis

    parser = argparse.ArgumentParser(prog="python -m bench.handoff", description=__doc__)
    parser.add_argument("--samples", type=int, default=200, help="hand-offs (and floor "
                        "samples, half before beat starts and half after it stopped)")
    parser.add_argument("--plain", action="store_true", help="the gap and the floor only, "
                        "untraced (to compare two versions of the code, run after run)")
    parser.add_argument("--profile", action="store_true", help="profile beat's ticks and "
                        "the worker's lane calls in CPU time instead (cProfile)")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    opts = live.LiveOptions(handoff_samples_on=args.samples,
                            handoff_floor_samples=args.samples)
    load = [round(x, 2) for x in os.getloadavg()]
    with private_redis() as url:
        if args.profile:
            result = profiled(url, opts)
        elif args.plain:
            result = live.handoff(url, opts, wake=True, floor_samples=args.samples)
        else:
            result = breakdown_section(url, opts)
    result["load_average_at_start_and_end"] = [load, [round(x, 2) for x in os.getloadavg()]]
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.write(report.profile_md(result) if args.profile else report.floor_md(result)
                     if args.plain else report.handoff_breakdown_md(result))
    trips = result.get("breakdown", {}).get("handoff_round_trips")
    if trips:
        sys.stdout.write(f"\nRedis round trips each hand-off waits for (median over "
                         f"{trips['handoffs']}): worker child {trips['worker child_median']}, "
                         f"beat {trips['beat_median']}, worker main "
                         f"{trips['worker main_median']}; in all {trips['total_median']} "
                         f"(hand-offs per total: {trips['total_counts']})\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
