"""The simulator's metrics, each defined precisely (docs/simulator.md repeats the definitions).

All are computed from a :class:`~schedproj.sim.engine.SimRun` over virtual time [0, T], T the
horizon; lanes disabled by the profile are left out of everything.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from schedproj.core.lanes import LaneSpec
from schedproj.core.schedules import calendar_ratio
from schedproj.sim.engine import LaneTrace, SimRun
from schedproj.sim.model import Durations, Scenario, feed_order
from schedproj.sim.pools import PoolMetrics, pool_metrics

#: A calendar lane's ratio over a segment is split at every fire time in it; past this many
#: pieces per segment the rest is one piece (a minutely schedule over days of starvation).
MAX_PIECES = 100_000

#: Outcomes that count as an achieved run (a failed run achieved nothing).
ACHIEVED = ("completed", "yielded")


# -- small, hand-checkable pieces ---------------------------------------------------------------

def jain(xs: Sequence[float]) -> float | None:
    """Jain's fairness index (Σx)² / (n·Σx²): 1 when all equal, 1/n when one takes all.
    None for no values; 1.0 when every value is 0 (nobody got anything: equally unfair)."""
    if not xs:
        return None
    sq = sum(x * x for x in xs)
    if sq == 0:
        return 1.0
    return sum(xs) ** 2 / (len(xs) * sq)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in (0, 100]): the smallest value with at least q % of the
    values at or below it. None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def ratio_max(segments: Iterable[tuple[float, float, float]], cadence: float) -> float:
    """The largest staleness ratio over the segments (0 if none)."""
    return max(((end - origin) / cadence for origin, _, end in segments), default=0.0)


def ratio_time_quantile(segments: Sequence[tuple[float, float, float]], cadence: float,
                        horizon: float, q: float) -> float:
    """Time-weighted quantile of the staleness ratio over [0, horizon]: the smallest x such
    that the ratio exceeds x during at most (1 - q) of the time. Outside the segments the
    ratio is 0. Exact up to the bisection's 1e-9 relative tolerance."""
    lines = [((s - o) / cadence, (e - o) / cadence, e - s) for o, s, e in segments if e > s]
    return lines_time_quantile(lines, horizon, q)


def calendar_lines(spec: LaneSpec, segments: Iterable[tuple[float, float, float]]
                   ) -> list[tuple[float, float, float]]:
    """A calendar lane's staleness ratio over its segments as straight pieces (ratio at the
    start, ratio just before the end, seconds): the picker's ratio
    (``schedules.calendar_ratio``, of a lane last run at the segment's origin) is a straight
    line between two fire times — its first missed fire and the period around now stay the
    same — so each piece runs from a fire time (or the segment's start) to the next, and its
    end is read off the line through its start and middle."""
    times = spec.calendar
    assert times is not None
    lines = []
    for origin, start, end in segments:
        last = None if origin == -math.inf else origin
        t0, pieces = start, 0
        while t0 < end:
            pieces += 1
            t1 = min(times.next_fire(t0), end) if pieces < MAX_PIECES else end
            a = calendar_ratio(times, last, t0)
            mid = calendar_ratio(times, last, (t0 + t1) / 2)
            lines.append((a, a + 2 * (mid - a), t1 - t0))
            t0 = t1
    return lines


def lines_time_quantile(lines: Sequence[tuple[float, float, float]], horizon: float,
                        q: float) -> float:
    """:func:`ratio_time_quantile` of a ratio given as straight pieces (ratio at the start,
    ratio at the end, seconds)."""
    budget = (1.0 - q) * horizon

    def above(x: float) -> float:
        total = 0.0
        for a, b, d in lines:
            if b <= x:
                continue
            total += d if a >= x else d * (b - x) / (b - a)
        return total

    if above(0.0) <= budget:
        return 0.0
    lo, hi = 0.0, max(b for _, b, _ in lines)
    for _ in range(100):
        mid = (lo + hi) / 2
        if above(mid) <= budget:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-9 * max(1.0, hi):
            break
    return hi


# -- the lower bound -------------------------------------------------------------------------

@dataclass(frozen=True)
class LowerBound:
    """A lower bound on drain-to-idle time, the same for every policy (``total_s``).

    ``heavy_work_s``: every heavy item that must be done before idle (the backlog at 0, what
    arrives, and what producers will feed), with the scenario's own seeded durations, plus the
    shortest possible fixed part of one run of every heavy lane that must run at all (it has
    work, or it is due at 0). All of it runs on the one lease, one run at a time.
    ``critical_path_s``: the chain's unavoidable path: a light lane fed by a heavy lane (its
    consumer: golden-path after dream) must run after that lane's last item, and that item
    comes after all the work of the lanes upstream of it (those that feed it, and the
    producer its blocked items wait on), which is serial on the lease too. So: upstream heavy
    work + the light lane's shortest run. For the REM chain every heavy item is upstream of
    dream's last one, so this is the total heavy work plus one golden-path run.
    ``release_s``: with arrivals, the classic single-machine bound max_k(a_k + minimal work
    of the items arriving at or after a_k).
    ``total_s`` = max(heavy_work_s, critical_path_s, release_s).
    """

    heavy_work_s: float
    critical_path_s: float
    critical_path: tuple[str, ...]
    release_s: float
    total_s: float


def _propagate(s: Scenario, direct: dict[str, int]) -> dict[str, int]:
    """Add to each heavy lane's own items one per item of each heavy lane that feeds it."""
    items = {m.name: direct.get(m.name, 0) for m in s.lanes if m.spec.heavy}
    models = {m.name: m for m in s.lanes}
    for name in feed_order(s.lanes):
        if name not in items:
            continue
        for target in models[name].feeds:
            if target in items:
                items[target] += items[name]
    return items


def total_items(s: Scenario) -> dict[str, int]:
    """Items each heavy lane must do in all: its backlog at 0, its arrivals, and one per item
    of each heavy lane that feeds it."""
    direct = {m.name: m.initial_items for m in s.lanes}
    for a in s.arrivals:
        direct[a.lane] += a.items
    return _propagate(s, direct)


def _enabled(s: Scenario) -> dict[str, bool]:
    from schedproj.core.lanes import enabled_under

    return {m.name: enabled_under(s.profile, m.spec.deployment) for m in s.lanes}


def _lane_work(s: Scenario, seed: str, items: dict[str, int],
               enabled: dict[str, bool]) -> dict[str, float]:
    work: dict[str, float] = {}
    for m in s.lanes:
        if not m.spec.heavy or not enabled[m.name]:
            continue
        dur = Durations(m, seed)
        n = items[m.name]
        due_at_0 = not m.spec.backlog_driven and (
            m.last_run_ago_s is None or m.last_run_ago_s >= m.spec.cadence_s)
        fixed = dur.min_run() if n > 0 or due_at_0 else 0.0
        work[m.name] = fixed + sum(dur.item(k) for k in range(n))
    return work


def _upstream(s: Scenario, seed: str, items: dict[str, int], work: dict[str, float],
              name: str) -> dict[str, float]:
    """Heavy work that must be done before lane ``name``'s last item, by lane: its own, all
    of every lane that feeds it, and what the producer its blocked items wait on must do."""
    need = {name: work[name]}

    def merge(more: dict[str, float]) -> None:
        for lane, w in more.items():
            need[lane] = max(need.get(lane, 0.0), w)

    for f in s.lanes:
        if name in f.feeds and f.name in work and items[f.name] > 0:
            merge(_upstream(s, seed, items, work, f.name))
    b = s.lane(name).blocked
    if b is not None and b.count and b.producer in work:
        n = b.count * b.per_item
        if n >= items[b.producer]:
            merge(_upstream(s, seed, items, work, b.producer))
        else:
            p = s.lane(b.producer)
            dur = Durations(p, seed)
            # Its queue is first-in first-out (exactly so without blocked items of its own).
            part = (sum(dur.item(k) for k in range(n)) if p.blocked is None
                    else n * p.item_s * (1.0 - p.jitter))
            merge({b.producer: dur.min_run() + part})
    return need


def _critical_path(s: Scenario, seed: str, items: dict[str, int], work: dict[str, float],
                   enabled: dict[str, bool]) -> tuple[float, tuple[str, ...]]:
    best: tuple[float, tuple[str, ...]] = (0.0, ())
    for m in s.lanes:
        if m.spec.heavy or not enabled[m.name]:
            continue
        for f in s.lanes:
            if m.name in f.feeds and f.name in work and items[f.name] > 0:
                need = _upstream(s, seed, items, work, f.name)
                length = sum(need.values()) + Durations(m, seed).min_run()
                if length > best[0]:
                    order = [n for n in feed_order(s.lanes) if n in need]
                    best = (length, (*order, m.name))
    return best


def _release_bound(s: Scenario, enabled: dict[str, bool]) -> float:
    release = 0.0
    for at in sorted({a.at_s for a in s.arrivals}):
        direct: dict[str, int] = {}
        for a in s.arrivals:
            if a.at_s >= at:
                direct[a.lane] = direct.get(a.lane, 0) + a.items
        later = sum(n * s.lane(name).item_s * (1.0 - s.lane(name).jitter)
                    for name, n in _propagate(s, direct).items() if enabled[name])
        release = max(release, at + later)
    return release


def lower_bound(s: Scenario, seed: int | str = 1) -> LowerBound:
    """See :class:`LowerBound`."""
    enabled = _enabled(s)
    items = total_items(s)
    work = _lane_work(s, str(seed), items, enabled)
    critical, path = _critical_path(s, str(seed), items, work, enabled)
    release = _release_bound(s, enabled)
    heavy_work = sum(work.values())
    return LowerBound(heavy_work_s=heavy_work, critical_path_s=critical, critical_path=path,
                      release_s=release, total_s=max(heavy_work, critical, release))


# -- per run ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LaneMetrics:
    name: str
    kind: str
    cadence_s: float
    runs: int
    achieved: int
    entitled: float
    yields: int
    failures: int
    items_done: int
    final_backlog: int
    max_ratio: float
    p99_ratio: float
    longest_starvation_s: float
    dispatches: int
    light_delay_p50_s: float | None
    light_delay_p99_s: float | None
    falsifier: int


@dataclass(frozen=True)
class Metrics:
    """One variant's figures on one scenario and seed."""

    variant: str
    drained: bool
    drain_s: float | None
    lower_bound_s: float
    drain_over_lb: float | None
    max_ratio: float
    max_ratio_lane: str | None
    p99_ratio: float
    p99_ratio_lane: str | None
    longest_starvation_s: float
    longest_starvation_lane: str | None
    light_delay_p50_s: float | None
    light_delay_p99_s: float | None
    busy_fraction: float | None
    jain: float | None
    falsifier: int
    falsifier_episodes: int
    light_behind_light: int
    decisions: int
    deferrals: dict[str, int]
    expired_gates: int
    lanes: tuple[LaneMetrics, ...]
    #: Per pool, when the scenario declares pools beyond the default (left out of the JSON
    #: when it declares none).
    pools: dict[str, PoolMetrics] = field(default_factory=dict)

    def lane(self, name: str) -> LaneMetrics:
        for lm in self.lanes:
            if lm.name == name:
                return lm
        raise KeyError(name)

    def as_dict(self) -> dict[str, Any]:
        out = json_dict(asdict(self))
        if not self.pools:
            del out["pools"]
        return out


def json_dict(value: dict[str, Any]) -> dict[str, Any]:
    """A JSON-safe copy of a dict (see :func:`json_safe`)."""
    return {k: json_safe(v) for k, v in value.items()}


def json_safe(value: Any) -> Any:
    """JSON-safe: non-finite floats become None, floats are rounded to 4 decimals."""
    if isinstance(value, float):
        return round(value, 4) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def fires_within(spec: LaneSpec, horizon: float) -> int:
    """A calendar lane's fire times in (0, horizon], plus the one it is due for at 0."""
    times = spec.calendar
    assert times is not None
    count, fire = 1, times.next_fire(0.0)
    while fire <= horizon:
        count, fire = count + 1, times.next_fire(fire)
    return count


def _ratio_figures(trace: LaneTrace, horizon: float) -> tuple[float, float, float]:
    """(entitled runs, maximal ratio, p99 ratio): a cadence lane's from its cadence, a
    calendar lane's from its fire times and the picker's calendar ratio."""
    spec = trace.spec
    if spec.calendar is None:
        cadence = spec.cadence_s
        return (horizon / cadence, ratio_max(trace.segments, cadence),
                ratio_time_quantile(trace.segments, cadence, horizon, 0.99))
    lines = calendar_lines(spec, trace.segments)
    return (float(fires_within(spec, horizon)), max((b for _, b, _ in lines), default=0.0),
            lines_time_quantile(lines, horizon, 0.99))


def lane_metrics(trace: LaneTrace, horizon: float) -> LaneMetrics:
    spec = trace.spec
    cadence = spec.cadence_s
    outcomes = [o for _, _, o in trace.runs]
    heavy = spec.heavy
    entitled, worst, p99 = _ratio_figures(trace, horizon)
    return LaneMetrics(
        name=trace.name, kind=spec.kind.value, cadence_s=cadence, runs=len(trace.runs),
        achieved=sum(o in ACHIEVED for o in outcomes), entitled=entitled,
        yields=outcomes.count("yielded"), failures=outcomes.count("failed"),
        items_done=trace.items_done, final_backlog=trace.final_backlog,
        max_ratio=worst, p99_ratio=p99,
        longest_starvation_s=max(trace.starvation, default=0.0),
        dispatches=trace.dispatches,
        light_delay_p50_s=None if heavy else percentile(trace.light_delays, 50),
        light_delay_p99_s=None if heavy else percentile(trace.light_delays, 99),
        falsifier=trace.falsifier,
    )


def _argmax(pairs: Iterable[tuple[str, float]]) -> tuple[str | None, float]:
    best: tuple[str | None, float] = (None, 0.0)
    for name, value in pairs:
        if best[0] is None or value > best[1]:
            best = (name, value)
    return best


def summarize(run: SimRun, bound: LowerBound | None = None) -> Metrics:
    """Every metric of one simulation."""
    s = run.scenario
    horizon = s.horizon_s
    bound = bound or lower_bound(s, run.seed)
    traces = [t for t in run.lanes.values() if t.enabled]
    lanes = tuple(lane_metrics(t, horizon) for t in traces)
    heavy = [lm for lm in lanes if lm.kind == "heavy"]
    light_traces = [t for t in traces if not t.spec.heavy]
    delays = [d for t in light_traces for d in t.light_delays]
    # Jain over the heavy lanes whose entitlement is their cadence (backlog-driven lanes are
    # due only while they have backlog, so horizon/cadence is not what they are owed).
    fair = [lm.achieved / lm.entitled for lm, t in zip(lanes, traces, strict=True)
            if t.spec.heavy and not t.spec.backlog_driven]
    max_lane, max_ratio = _argmax((lm.name, lm.max_ratio) for lm in heavy)
    p99_lane, p99_ratio = _argmax((lm.name, lm.p99_ratio) for lm in heavy)
    starve_lane, starve = _argmax((lm.name, lm.longest_starvation_s) for lm in lanes)
    pending = run.held_s + run.idle_due_s
    drain = run.drained_at
    pools = pool_metrics(run, [(lm.name, t.spec.backlog_driven, lm.achieved / lm.entitled,
                                lm.max_ratio, t.spec.pool)
                               for lm, t in zip(lanes, traces, strict=True) if t.spec.heavy])
    return Metrics(
        variant=run.variant.label, drained=drain is not None, drain_s=drain,
        lower_bound_s=bound.total_s,
        drain_over_lb=(drain / bound.total_s if drain is not None and bound.total_s > 0
                       else None),
        max_ratio=max_ratio, max_ratio_lane=max_lane,
        p99_ratio=p99_ratio, p99_ratio_lane=p99_lane,
        longest_starvation_s=starve, longest_starvation_lane=starve_lane if starve else None,
        light_delay_p50_s=percentile(delays, 50), light_delay_p99_s=percentile(delays, 99),
        busy_fraction=run.held_s / pending if pending > 0 else None,
        jain=jain(fair), falsifier=run.falsifier, falsifier_episodes=run.falsifier_episodes,
        light_behind_light=run.light_behind_light, decisions=run.decisions,
        deferrals=run.deferrals, expired_gates=run.expired_gates, lanes=lanes, pools=pools,
    )


__all__ = [
    "LaneMetrics",
    "LowerBound",
    "Metrics",
    "calendar_lines",
    "fires_within",
    "jain",
    "json_dict",
    "json_safe",
    "lines_time_quantile",
    "lower_bound",
    "percentile",
    "ratio_max",
    "ratio_time_quantile",
    "summarize",
    "total_items",
]
