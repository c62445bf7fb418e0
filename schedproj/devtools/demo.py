"""``schedproj demo``: the original's forensic backlog, drained by the real processes.

Seeds the REM store with the situation the ADR starts from (1,354 summaries, 371 undigested,
304 session nodes, long sessions waiting for backfill, short ones waiting for summary), starts
beat and one worker per queue with cadences scaled down, shows each lane's progress live, and
ends when the chain has drained to idle (or the time budget runs out) with a report.
``--policy registry`` runs the legacy first-due-in-list picker on the same seed.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, TextIO

import redis
from rich.console import Console
from rich.live import Live
from rich.table import Table

from schedproj.core.errors import SchedprojError
from schedproj.core.picker import Policy
from schedproj.core.records import LeaseView, Outcome, RunRecord, SchedRecord, encode
from schedproj.devtools import embedded, redis_server
from schedproj.devtools.processes import ProcessGroup, layout
from schedproj.rem.lanes import CADENCES_S, LANE_NAMES
from schedproj.rem.seed import SEEDED_HISTORY, seed_forensic
from schedproj.rem.store import MemoryStore
from schedproj.store.connection import connect, mask
from schedproj.store.lane_store import LaneStore, parse_states
from schedproj.store.lease import parse_lease
from schedproj.store.protocol import Keys

#: The chain whose drain the demo watches (heartbeat is local-only housekeeping).
CHAIN = ("memory-summary-backfill", "summary", "dream", "golden-path")
#: Where the demo lives when it uses a shared Redis no one configured: not database 0.
DEMO_DB = 11
#: How often the progress view samples Redis (seconds).
SAMPLE_S = 0.25


@dataclass(frozen=True)
class DemoOptions:
    scale: float = 0.005
    policy: Policy = Policy.STALENESS
    budget_s: float = 300.0
    hold_cap_s: float = 3.0
    latency_s: float = 0.01
    long_sessions: int = 24
    long_turns: int = 60
    short_sessions: int = 150
    redis_url: str | None = None
    default_url: str = "redis://127.0.0.1:6379/0"
    live: bool = True


@dataclass
class Tracker:
    """What the demo measures while it watches; sampled, so figures are approximate."""

    started: float
    cadences: Mapping[str, float]
    max_ratio: dict[str, float] = field(default_factory=dict)
    samples: int = 0
    busy_samples: int = 0
    streaks: set[tuple[str, str, float]] = field(default_factory=set)
    idle_at: float | None = None
    #: Runs each lane had before the demo started (the seeded history): reports count the rest.
    runs_before: dict[str, int] = field(default_factory=dict)
    #: (seconds since start, lease holder or None, each chain lane's backlog) per sample.
    history: list[tuple[float, str | None, dict[str, int]]] = field(default_factory=list)

    def sample(self, now: float, lease: LeaseView | None, counts: Mapping[str, Any]) -> None:
        self.history.append((round(now - self.started, 3), lease.lane if lease else None,
                             chain_backlogs(counts)))

    def runs_during(self, runs: Mapping[str, RunRecord]) -> dict[str, int]:
        return {lane: runs.get(lane, RunRecord()).runs - self.runs_before.get(lane, 0)
                for lane in self.cadences}

    def observe(self, now: float, runs: Mapping[str, RunRecord],
                scheds: Mapping[str, SchedRecord], lease: LeaseView | None) -> None:
        self.samples += 1
        self.busy_samples += lease is not None
        for lane, cadence in self.cadences.items():
            last = runs[lane].last_run_at if lane in runs else None
            ratio = (now - (last if last is not None else self.started)) / cadence
            self.max_ratio[lane] = max(self.max_ratio.get(lane, 0.0), ratio)
        for lane, sched in scheds.items():
            if sched.deferral is not None:
                self.streaks.add((lane, sched.deferral.reason.value, sched.deferral.since))

    def deferrals_by_reason(self) -> dict[str, int]:
        return dict(Counter(reason for _, reason, _ in self.streaks))


def chain_backlogs(counts: Mapping[str, Any]) -> dict[str, int]:
    """Each chain lane's backlog as the store counts it (not as the lane last reported)."""
    return {"memory-summary-backfill": int(counts.get("backfill_backlog", 0)),
            "summary": int(counts.get("unsummarized", 0)),
            "dream": int(counts.get("undigested", 0)),
            "golden-path": max(0, int(counts.get("graph_version", 0))
                               - int(counts.get("golden_path_version", 0)))}


def counts_dict(counts: Any) -> dict[str, Any]:
    if is_dataclass(counts) and not isinstance(counts, type):
        return asdict(counts)
    return dict(counts)


def drained(counts: Mapping[str, Any], runs_during: Mapping[str, int],
            lease: LeaseView | None) -> bool:
    """Idle: no backlog anywhere, golden-path reflects the latest graph, every chain lane has
    run during the demo, and no heavy run holds the lease."""
    return (counts["backfill_backlog"] == 0 and counts["unsummarized"] == 0
            and counts["undigested"] == 0
            and counts["golden_path_version"] == counts["graph_version"]
            and all(runs_during.get(lane, 0) > 0 for lane in CHAIN)
            and lease is None)


@contextlib.contextmanager
def demo_redis(opts: DemoOptions, say: TextIO) -> Iterator[tuple[str, bool]]:
    """(url, private): the configured Redis, the default one (database 11), or a private one."""
    configured = opts.redis_url or os.environ.get("CELERY_BROKER_URL") \
        or os.environ.get("SCHEDPROJ_REDIS_URL")
    if configured:
        yield configured, False
        return
    default = opts.default_url.rsplit("/", 1)[0] + f"/{DEMO_DB}"
    if redis_server.answers(default):
        yield default, False
        return
    say.write(f"demo: nothing answers at {mask(opts.default_url)}; starting a private Redis\n")
    with embedded.private_redis() as url:
        yield url, True


def declare_new_deployment(client: redis.Redis, keys: Keys) -> None:
    """The demo's deployment is new: its key prefix was made up by this run (a random id), so
    nothing ever ran under it and beat grants the first heavy lease at once instead of waiting
    out a state-loss quarantine — on the demo's private Redis and on a shared one alike.

    (An empty prefix someone else uses keeps its quarantine: empty is also what a Redis that
    just lost its state looks like, and that is when a worker may still run under a lease
    Redis forgot. A prefix no one has used before cannot have such a worker.)"""
    if not LaneStore(client, keys).declare_fresh():
        raise SchedprojError(f"the demo's Redis already holds schedproj state under its new "
                             f"{keys.prefix!r}: not declared a new deployment")


def child_env(opts: DemoOptions, url: str, prefix: str, backup_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDPROJ_")}
    env.update({
        "CELERY_BROKER_URL": url, "SCHEDPROJ_REDIS_URL": url, "SCHEDPROJ_KEY_PREFIX": prefix,
        "SCHEDPROJ_LANE_MODULES": "schedproj.rem.lanes",
        "SCHEDPROJ_CADENCE_SCALE": repr(opts.scale), "SCHEDPROJ_POLICY": opts.policy.value,
        "SCHEDPROJ_HOLD_CAP_S": repr(opts.hold_cap_s), "SCHEDPROJ_LEASE_TTL_S": "5",
        # Pressure-aware yielding at the demo's scale: a run holds a third of the cap first.
        "SCHEDPROJ_PRESSURE_MIN_HOLD_S": repr(opts.hold_cap_s / 3),
        "SCHEDPROJ_START_DEADLINE_S": "10", "SCHEDPROJ_BEAT_MAX_LOOP_INTERVAL_S": "0.25",
        "SCHEDPROJ_BEAT_LOCK_TTL_S": "2",
        "SCHEDPROJ_REM_SUMMARIZER_LATENCY_S": repr(opts.latency_s),
        "SCHEDPROJ_REM_BACKUP_DIR": str(backup_dir),
        "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])),
    })
    return env


def seed_lane_history(client: redis.Redis, keys: Keys, now: float, scale: float) -> None:
    """The forensic moment: summary just drained, dream and golden-path weeks stale, backup
    an hour ago."""
    week = 7 * 86400 * scale
    history = {lane: RunRecord(last_run_at=now - max(1.0, weeks * week), runs=1,
                               last_outcome=Outcome.COMPLETED)
               for lane, weeks in SEEDED_HISTORY.items()}
    client.hset(keys.lanes, mapping={f"{lane}|run": encode(r) for lane, r in history.items()})


def read_state(client: redis.Redis, keys: Keys) -> tuple[dict[str, RunRecord],
                                                          dict[str, SchedRecord],
                                                          LeaseView | None]:
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.lanes)
    pipe.get(keys.lease)
    raw, raw_lease = pipe.execute()
    states, _ = parse_states(raw, keys.lanes)
    lease = parse_lease(raw_lease, keys.lease)
    return ({k: v.run for k, v in states.items()}, {k: v.sched for k, v in states.items()},
            lease)


def progress_table(now: float, tracker: Tracker, runs: Mapping[str, RunRecord],
                   scheds: Mapping[str, SchedRecord], lease: LeaseView | None,
                   counts: Mapping[str, Any], policy: Policy) -> Table:
    table = Table(title=f"schedproj demo ({policy.value}) — {now - tracker.started:5.1f}s — "
                        f"lease: {lease.lane if lease else 'free'}")
    for col in ("lane", "runs", "last outcome", "backlog", "staleness", "deferred"):
        table.add_column(col)
    for lane in LANE_NAMES:
        run = runs.get(lane, RunRecord())
        last = run.last_run_at if run.last_run_at is not None else tracker.started
        ratio = (now - last) / tracker.cadences[lane]
        deferral = scheds.get(lane, SchedRecord()).deferral
        done = run.runs - tracker.runs_before.get(lane, 0)
        table.add_row(lane, str(done), run.last_outcome.value if run.last_outcome else "-",
                      str(run.backlog), f"{ratio:6.2f}",
                      f"{deferral.reason.value} ({deferral.blocker})" if deferral else "")
    table.caption = ("backfill backlog {backfill_backlog} · unsummarized {unsummarized} · "
                     "undigested {undigested} · session nodes {session_nodes} · graph v"
                     "{graph_version} · golden-path v{golden_path_version}").format(**counts)
    return table


def run_demo(opts: DemoOptions, say: TextIO = sys.stderr) -> dict[str, Any]:
    """Run the demo and return its report."""
    prefix = f"schedproj-demo-{uuid.uuid4().hex[:8]}"
    keys = Keys(prefix)
    with demo_redis(opts, say) as (url, private), \
            tempfile.TemporaryDirectory(prefix="schedproj-demo-") as tmp:
        client = connect(url)
        store = MemoryStore(client, prefix)
        if private:
            client.delete("heavy", "light")
        declare_new_deployment(client, keys)
        seeded_at = time.time()
        initial = counts_dict(seed_forensic(
            store, long_sessions=opts.long_sessions, long_turns=opts.long_turns,
            short_sessions=opts.short_sessions))
        seed_lane_history(client, keys, seeded_at, opts.scale)
        log_path = Path(tmp) / "processes.log"
        cadences = {lane: CADENCES_S[lane] * opts.scale for lane in LANE_NAMES}
        tracker = Tracker(started=time.time(), cadences=cadences,
                          runs_before={lane: 1 for lane in SEEDED_HISTORY})
        with log_path.open("w") as log:
            group = ProcessGroup(layout("schedproj.app", light_concurrency=2, loglevel="info"),
                                 child_env(opts, url, prefix, Path(tmp) / "backups"), log)
            group.start()
            try:
                final = watch(opts, client, store, keys, tracker, group, say)
            finally:
                group.stop()
            log_tail = log_path.read_text(errors="replace")[-4000:]
        runs, _, _ = read_state(client, keys)
        report = build_report(opts, tracker, initial, final, runs, url, prefix,
                              pressure_yields=pressure_yields(client, keys))
        report["history"] = tracker.history
        if report["died"]:
            report["process_log_tail"] = log_tail
        cleanup(client, prefix)
        return report


def watch(opts: DemoOptions, client: redis.Redis, store: MemoryStore, keys: Keys,
          tracker: Tracker, group: ProcessGroup, say: TextIO) -> dict[str, Any]:
    """Sample until drained to idle, the budget runs out, or a process dies."""
    console = Console(file=say)
    live = Live(console=console, refresh_per_second=4, transient=False) \
        if opts.live and say.isatty() else None
    last_line = 0.0
    counts: dict[str, Any] = {}
    with live if live is not None else contextlib.nullcontext():
        while True:
            now = time.time()
            runs, scheds, lease = read_state(client, keys)
            counts = counts_dict(store.counts())
            tracker.observe(now, runs, scheds, lease)
            tracker.sample(now, lease, counts)
            if live is not None:
                live.update(progress_table(now, tracker, runs, scheds, lease, counts,
                                           opts.policy))
            elif now - last_line >= 5:
                last_line = now
                say.write(f"demo {now - tracker.started:6.1f}s: lease "
                          f"{lease.lane if lease else 'free'}; " + ", ".join(
                              f"{lane} {n}" for lane, n in tracker.runs_during(runs).items())
                          + f"; {counts}\n")
            if drained(counts, tracker.runs_during(runs), lease):
                tracker.idle_at = now
                break
            if now - tracker.started > opts.budget_s or group.dead():
                break
            time.sleep(SAMPLE_S)
    counts["died"] = group.dead()
    return counts


def build_report(opts: DemoOptions, tracker: Tracker, initial: Mapping[str, Any],
                 final: Mapping[str, Any], runs: Mapping[str, RunRecord], url: str,
                 prefix: str, *, pressure_yields: int = 0) -> dict[str, Any]:
    elapsed = (tracker.idle_at or time.time()) - tracker.started
    return {
        "policy": opts.policy.value,
        "scale": opts.scale,
        "drained_to_idle": tracker.idle_at is not None,
        "time_to_idle_s": round(elapsed, 2) if tracker.idle_at is not None else None,
        "elapsed_s": round(elapsed, 2),
        "budget_s": opts.budget_s,
        "runs": tracker.runs_during(runs),
        "outcomes": {lane: _outcome(runs.get(lane)) for lane in LANE_NAMES},
        "max_staleness_ratio": {lane: (round(r, 2) if math.isfinite(r) else None)
                                for lane, r in tracker.max_ratio.items()},
        "lease_busy_fraction": round(tracker.busy_samples / max(1, tracker.samples), 3),
        "deferrals_by_reason": tracker.deferrals_by_reason(),
        "pressure_yields": pressure_yields,
        "initial": dict(initial),
        "final": {k: v for k, v in final.items() if k != "died"},
        "died": final.get("died", []),
        "redis": mask(url),
        "key_prefix": prefix,
    }


def pressure_yields(client: redis.Redis, keys: Keys) -> int:
    """Heavy runs that yielded to pressure (a waiting lane past the target ratio)."""
    raw = client.hget(keys.pressure, "yields")
    return int(raw) if raw is not None and str(raw).isdigit() else 0


def _outcome(run: RunRecord | None) -> str | None:
    return run.last_outcome.value if run is not None and run.last_outcome is not None else None


def cleanup(client: redis.Redis, prefix: str) -> None:
    keys = list(client.scan_iter(f"{prefix}:*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i:i + 500])


def render_report(report: Mapping[str, Any], out: TextIO) -> None:
    console = Console(file=out, width=None if out.isatty() else 110)
    verdict = (f"drained to idle in {report['time_to_idle_s']}s" if report["drained_to_idle"]
               else f"NOT idle after {report['elapsed_s']}s (budget {report['budget_s']}s)")
    console.print(f"[bold]schedproj demo — policy {report['policy']}: {verdict}[/bold]")
    table = Table()
    for col in ("lane", "runs", "last outcome", "max staleness ratio"):
        table.add_column(col)
    for lane, n in report["runs"].items():
        table.add_row(lane, str(n), str(report["outcomes"][lane]),
                      str(report["max_staleness_ratio"].get(lane)))
    console.print(table)
    console.print(f"lease busy fraction: {report['lease_busy_fraction']:.0%}")
    console.print(f"deferrals by reason: {report['deferrals_by_reason'] or 'none'}")
    console.print(f"pressure yields: {report.get('pressure_yields', 0)}")
    first, last = report["initial"], report["final"]
    for name in ("backfill_backlog", "unsummarized", "undigested", "session_nodes",
                 "summaries", "graph_version", "golden_path_version"):
        console.print(f"  {name:20} {first.get(name)!s:>6} -> {last.get(name)}")
    if report["died"]:
        console.print(f"[red]processes died: {report['died']}[/red]")
        console.print(report.get("process_log_tail", ""))


#: Colours per chain lane, in the simulator plots' palette.
LANE_COLOURS = {"memory-summary-backfill": "#1565c0", "summary": "#2e7d32", "dream": "#ef6c00",
                "golden-path": "#6a1b9a", "backup": "#455a64"}


def plot_drain(reports: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """One column per run: on top the lease timeline (which heavy lane held the lease when),
    below each chain lane's backlog over time (log scale). Headless (Agg)."""
    from schedproj.sim.plot import pyplot

    plt = pyplot()
    out = Path(path)
    fig, axes = plt.subplots(2, len(reports), figsize=(7.5 * len(reports), 6.5), squeeze=False,
                             sharex="col", gridspec_kw={"height_ratios": [1, 2.2]})
    lanes = [lane for lane in LANE_NAMES if lane in LANE_COLOURS]
    for col, report in enumerate(reports):
        history = report.get("history") or []
        top, bottom = axes[0][col], axes[1][col]
        _lease_rows(top, history, lanes)
        top.set_title(f"policy {report['policy']}: " + (
            f"idle after {report['time_to_idle_s']}s" if report["drained_to_idle"]
            else f"not idle after {report['elapsed_s']}s"), fontsize=11)
        times = [t for t, _, _ in history]
        for lane in CHAIN:
            values = [max(0.8, b.get(lane, 0)) for _, _, b in history]
            bottom.plot(times, values, label=lane, color=LANE_COLOURS[lane], linewidth=1.6)
        bottom.set_yscale("log")
        bottom.set_ylabel("backlog (items; 0 drawn at 0.8)")
        bottom.set_xlabel("seconds since the demo started")
        bottom.grid(alpha=0.3)
        bottom.legend(fontsize=8, loc="best")
    fig.suptitle("schedproj demo: the REM chain draining", fontsize=13)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _lease_rows(ax: Any, history: list[Any], lanes: list[str]) -> None:
    """Broken bars: the sampled spans during which each lane held the heavy lease."""
    spans: dict[str, list[tuple[float, float]]] = {lane: [] for lane in lanes}
    for (t, holder, _), nxt in itertools.pairwise(history):
        if holder in spans:
            spans[holder].append((t, max(nxt[0] - t, 0.05)))
    for row, lane in enumerate(lanes):
        ax.broken_barh(spans[lane], (row + 0.15, 0.7), color=LANE_COLOURS[lane])
    ax.set_yticks([row + 0.5 for row in range(len(lanes))], lanes, fontsize=8)
    ax.set_ylim(0, len(lanes))
    ax.set_ylabel("lease held by")
    ax.grid(axis="x", alpha=0.3)


def default_plot_path(policy: str) -> Path:
    return Path(tempfile.gettempdir()) / f"schedproj-demo-{policy}-{time.strftime('%H%M%S')}.png"


def compare_rows(reports: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[str]]]:
    """(figure, one cell per report): what the two reports say, row by row."""
    def verdict(r: Mapping[str, Any]) -> str:
        return f"idle in {r['time_to_idle_s']}s" if r["drained_to_idle"] else \
            f"NOT idle after {r['elapsed_s']}s"

    rows = [("outcome", [verdict(r) for r in reports])]
    for lane in LANE_NAMES:
        rows.append((f"runs: {lane}", [str(r["runs"].get(lane)) for r in reports]))
    for lane in LANE_NAMES:
        rows.append((f"max staleness: {lane}",
                     [str(r["max_staleness_ratio"].get(lane)) for r in reports]))
    rows.append(("lease busy", [f"{r['lease_busy_fraction']:.0%}" for r in reports]))
    rows.append(("deferrals", [str(r["deferrals_by_reason"] or "none") for r in reports]))
    for name in ("backfill_backlog", "unsummarized", "undigested", "golden_path_version"):
        rows.append((name, [f"{r['initial'].get(name)} -> {r['final'].get(name)}"
                            for r in reports]))
    return rows


def render_compare(reports: Sequence[Mapping[str, Any]], out: TextIO) -> None:
    console = Console(file=out, width=None if out.isatty() else 120)
    table = Table(title="schedproj demo — the same seed and budget under both policies")
    table.add_column("")
    for r in reports:
        table.add_column(f"policy {r['policy']}")
    for name, cells in compare_rows(reports):
        table.add_row(name, *cells)
    console.print(table)
    died = [r["died"] for r in reports if r["died"]]
    if died:
        console.print(f"[red]processes died: {died}[/red]")


__all__ = ["DemoOptions", "plot_drain", "render_compare", "render_report", "run_demo"]
