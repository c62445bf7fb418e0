"""Built-in scenarios: the original's forensic backlog on the real REM lanes, and random lane
sets at a given heavy demand H = Σ run_time / cadence."""

from __future__ import annotations

import random
import statistics
from types import ModuleType
from typing import Any

from schedproj.core import defaults
from schedproj.core.lanes import DeferralReason, Gate, GateCondition, Lane, LaneKind, LaneSpec
from schedproj.core.pressure import PressureRule
from schedproj.sim.model import BEAT_PRESSURE, Blocked, LaneModel, Scenario

HOUR = 3600.0
WEEK = 7 * 24 * HOUR

# -- the forensic backlog (DESIGN.md section 4, ADR 0022) ------------------------------------

#: The backlog of ``schedproj demo`` (the defaults of ``schedproj.rem.seed.seed_forensic``):
#: 24 long sessions of 60 turns (1,440 turns to backfill), 150 short sessions to summarize,
#: 371 summaries waiting for the dream.
LONG_SESSIONS = 24
LONG_TURNS = 60
SHORT_SESSIONS = 150
UNDIGESTED = 371

#: Model times of the REM lanes (seconds): minutes-scale local model inference. A heavy run
#: pays ``run_s`` once (loading the model and scanning the store), then ``item_s`` per item
#: in batches of 50 (the hold cap is checked between batches):
#:
#: * backfill: one mini-summary per turn, 4 s (a 50-turn batch ~3.3 min; all 1,440 ~96 min);
#: * summary: one session summary, 12 s (a batch ~10 min); a session whose backfill is
#:   unfinished is looked at and skipped, 0.05 s;
#: * dream: digesting one summary into the graph (concepts, edges), 5 s (a batch ~4 min);
#: * backup: a snapshot, 3 min; golden-path: scoring the graph, 30 s (light, pure math);
#:   swarm-heartbeat: 1 s (light).
FORENSIC_WORK: dict[str, dict[str, Any]] = {
    "backup": {"run_s": 180.0},
    "memory-summary-backfill": {"run_s": 20.0, "item_s": 4.0,
                                "backlog": LONG_SESSIONS * LONG_TURNS},
    "summary": {"run_s": 20.0, "item_s": 12.0, "skip_s": 0.05, "backlog": SHORT_SESSIONS,
                "blocked": Blocked(LONG_SESSIONS, "memory-summary-backfill", LONG_TURNS),
                "feeds": ("dream",)},
    "dream": {"run_s": 20.0, "item_s": 5.0, "backlog": UNDIGESTED, "feeds": ("golden-path",)},
    "golden-path": {"run_s": 30.0},
    "swarm-heartbeat": {"run_s": 1.0},
}
#: Lanes the REM module declares that this model does not know run this long (heavy/light).
DEFAULT_RUN_S = {LaneKind.HEAVY: 60.0, LaneKind.LIGHT: 5.0}
#: Durations vary by ±25 % (seeded); the lower bound uses the very same draws.
FORENSIC_JITTER = 0.25


def rem_specs(module: ModuleType | None = None) -> tuple[LaneSpec, ...]:
    """The REM lanes exactly as ``schedproj.rem.lanes`` declares them (cadences, kinds,
    priority-0, gates, order), validated by the project's own registry code."""
    from schedproj.core.laneset import build_lane_set

    if module is None:
        from schedproj.rem import lanes as module
    tasks = {}
    for obj in vars(module).values():
        lane = getattr(obj, "lane", None) if _is_task(obj) else None
        if isinstance(lane, Lane):
            tasks[str(obj.name)] = obj
    return build_lane_set(tasks).specs


def _is_task(obj: Any) -> bool:
    from celery import Task
    from celery.local import Proxy

    return isinstance(obj, Proxy | Task)


def forensic_history() -> dict[str, float]:
    """Seconds since each lane's last run at time 0, as ``schedproj demo`` seeds it: summary
    just drained, dream and golden-path three weeks stale, backup an hour ago; the rest never
    ran."""
    from schedproj.rem.seed import SEEDED_HISTORY

    return {lane: max(1.0, weeks * WEEK) for lane, weeks in SEEDED_HISTORY.items()}


def forensic(*, horizon_s: float = 24 * HOUR, tick_s: float = defaults.BEAT_MAX_LOOP_INTERVAL_S,
             hold_cap_s: float = defaults.HOLD_CAP_S, jitter: float = FORENSIC_JITTER,
             fail_prob: float = 0.0) -> Scenario:
    """The REM chain with the original's backlog (ADR 0022's starting point)."""
    from schedproj.rem.work import DEFAULT_BATCH

    history = forensic_history()
    lanes = []
    for spec in rem_specs():
        work = FORENSIC_WORK.get(spec.name, {"run_s": DEFAULT_RUN_S[spec.kind]})
        lanes.append(LaneModel(spec=spec, batch=DEFAULT_BATCH, jitter=jitter,
                               fail_prob=fail_prob, last_run_ago_s=history.get(spec.name),
                               **work))
    return Scenario(
        name="forensic", lanes=tuple(lanes), tick_s=tick_s, hold_cap_s=hold_cap_s,
        horizon_s=horizon_s,
        description="REM lanes from schedproj.rem.lanes with the demo's backlog: 1,440 "
                    "backfill turns, 174 unsummarized (24 long ones wait for backfill), "
                    "371 + 174 undigested",
        params={"long_sessions": LONG_SESSIONS, "long_turns": LONG_TURNS,
                "short_sessions": SHORT_SESSIONS, "undigested": UNDIGESTED, "jitter": jitter,
                "fail_prob": fail_prob},
    )


# -- random lane sets at a heavy demand H ------------------------------------------------------

#: Sweep of heavy demands: under load, near saturation, and overload.
DEFAULT_HS = (0.25, 0.5, 0.75, 0.9, 1.2)


def random_lanes(h: float, *, seed: int | str = 1, index: int = 0, n_heavy: int = 8,
                 run_s: float = 60.0, periods: float = 20.0, horizon_s: float | None = None,
                 tick_s: float = defaults.BEAT_MAX_LOOP_INTERVAL_S,
                 hold_cap_s: float = defaults.HOLD_CAP_S, fail_prob: float = 0.0,
                 wake_on_release: bool = True,
                 cadence_range: tuple[float, float] | None = None,
                 pressure: PressureRule | None = BEAT_PRESSURE) -> Scenario:
    """``n_heavy`` heavy lanes whose runs all take ``run_s`` (unit-length runs, as in the
    scheduling-theory results) with cadences chosen so that Σ run_s / cadence = ``h``: lane i
    gets the share h·w_i/Σw of the lease, w_i ~ U(0.5, 1.5). Declared order is a random
    permutation. Every heavy lane starts overdue (its last run 1 to 2 cadences ago), so the
    set starts by catching up. Two light lanes: ``light-gated`` (cadence the median heavy
    cadence, 5 s, gated on the first heavy lane while it is due or running) and ``light``
    (twice that cadence, 2 s). The set depends on ``seed`` and ``index``, not on ``h``: a
    sweep scales the same set's cadences. Horizon: ``periods`` times the longest cadence.
    With ``cadence_range`` (low, high seconds): a spread set, :func:`_spread`. ``pressure``:
    beat's default rule unless given (None: the hold cap alone)."""
    if cadence_range is not None:
        return _spread(h, seed, index, n_heavy, cadence_range, horizon_s, tick_s, hold_cap_s,
                       fail_prob, wake_on_release, pressure)
    if h <= 0:
        raise ValueError(f"H must be > 0, got {h}")
    if n_heavy < 1:
        raise ValueError(f"n_heavy must be >= 1, got {n_heavy}")
    rng = random.Random(f"random-lanes|{seed}|{index}")
    weights = [rng.uniform(0.5, 1.5) for _ in range(n_heavy)]
    overdue = [rng.uniform(1.0, 2.0) for _ in range(n_heavy)]
    orders = rng.sample(range(n_heavy), n_heavy)
    total = sum(weights)
    cadences = [run_s * total / (h * w) for w in weights]
    lanes = [
        LaneModel(spec=LaneSpec(name=f"h{i + 1:02d}", task_name=f"sim.h{i + 1:02d}",
                                kind=LaneKind.HEAVY, cadence_s=cadence,
                                order=10 * (orders[i] + 1)),
                  run_s=run_s, fail_prob=fail_prob, last_run_ago_s=cadence * overdue[i])
        for i, cadence in enumerate(cadences)
    ]
    median = statistics.median(cadences)
    gate = Gate(lanes[0].name, GateCondition.DUE_OR_RUNNING, DeferralReason.DEPENDENCY,
                in_legacy=True)
    lanes.append(LaneModel(spec=LaneSpec(name="light-gated", task_name="sim.light-gated",
                                         kind=LaneKind.LIGHT, cadence_s=median,
                                         order=10 * (n_heavy + 1), gates=(gate,)),
                           run_s=5.0, fail_prob=fail_prob, last_run_ago_s=median * 0.5))
    lanes.append(LaneModel(spec=LaneSpec(name="light", task_name="sim.light",
                                         kind=LaneKind.LIGHT, cadence_s=2 * median,
                                         order=10 * (n_heavy + 2)),
                           run_s=2.0, fail_prob=fail_prob, last_run_ago_s=median * 0.25))
    horizon = horizon_s if horizon_s is not None else periods * max(cadences)
    return Scenario(
        name=f"random-H{h:g}-{index}", lanes=tuple(lanes), tick_s=tick_s,
        hold_cap_s=hold_cap_s, horizon_s=horizon, wake_on_release=wake_on_release,
        pressure=pressure,
        description=f"{n_heavy} heavy lanes of {run_s:g} s runs at H = {h:g}, 2 light lanes",
        params={"H": h, "index": index, "n_heavy": n_heavy, "run_s": run_s,
                "H_check": sum(run_s / c for c in cadences),
                # A lane's cadence counts from the end of its last run, so a lane run exactly
                # on time holds the lease run/(cadence + run) of the time.
                "H_effective": sum(run_s / (c + run_s) for c in cadences)},
    )


def _spread(h: float, seed: int | str, index: int, n_heavy: int,
            cadence_range: tuple[float, float], horizon_s: float | None, tick_s: float,
            hold_cap_s: float, fail_prob: float, wake_on_release: bool,
            pressure: PressureRule | None) -> Scenario:
    """A spread random set: cadences log-uniform over ``cadence_range`` and run lengths that
    differ between lanes, work arriving each period in items (the ``mixed`` scenario's sets,
    :func:`schedproj.sim.mixed.mixed_lanes`; ``run_s`` does not apply)."""
    from schedproj.sim.mixed import mixed_lanes

    return mixed_lanes(h, seed=seed, index=index, n_heavy=n_heavy, cadence_range=cadence_range,
                       horizon_s=horizon_s, tick_s=tick_s, hold_cap_s=hold_cap_s,
                       fail_prob=fail_prob, wake_on_release=wake_on_release,
                       pressure=pressure)


__all__ = ["DEFAULT_HS", "FORENSIC_WORK", "forensic", "forensic_history", "random_lanes",
           "rem_specs"]
