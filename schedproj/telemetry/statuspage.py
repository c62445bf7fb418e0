"""The status page beat serves next to ``/metrics``: pure rendering, no I/O.

Everything here takes what :func:`schedproj.telemetry.status.as_json` reports (the same dict as
``schedproj status --json``) and the run journal (``Keys.journal`` entries ``{"ev": "start" |
"end" | "lost", "lane", "task", "fence", "t", "outcome", ...}``) and returns HTML, SVG or plain
data for the JSON endpoints. Plain HTML, CSS, a little JavaScript and SVG: no build step.
"""

from __future__ import annotations

import html
import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from schedproj.core.pools import DEFAULT_POOL
from schedproj.telemetry.sanity import as_count, as_number
from schedproj.telemetry.status import missed_words, next_fire_words, schedule_words

#: The timeline and ratio charts cover this much of the past (seconds).
WINDOW_S = 3600.0
#: Colours of run outcomes on the timeline (a run still going is "running").
OUTCOME_COLOURS = {
    "completed": "#2e7d32", "yielded": "#f9a825", "failed": "#c62828", "lost": "#6a1b9a",
    "skipped": "#9e9e9e", "running": "#1565c0",
}
LANE_COLOURS = ("#1565c0", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#ad1457", "#5d4037",
                "#455a64")
CHART_W, LABEL_W, ROW_H = 900, 190, 22
#: A journal time past this (the year 5138) is no time a run had: the page skips the entry.
LATEST_TIME = 1e11


@dataclass(frozen=True)
class Bar:
    """One run on the timeline: from its start to its end (None: still running)."""

    lane: str
    task: str
    fence: int
    start: float
    end: float | None
    outcome: str
    heavy: bool
    #: The pool and slots a pool run took, as its start was journaled ("" and none: the
    #: default pool's one slot, a light run, or a run journaled before runs named them).
    pool: str = ""
    slots: tuple[int, ...] = ()

    @property
    def lost(self) -> bool:
        return self.outcome == "lost"


def run_entry(e: Any) -> tuple[tuple[str, int], str, float] | None:
    """(task id and fence, event, time) of a journal entry that describes a run; None for
    anything else (not an object, a field missing, a time that is no time)."""
    if not isinstance(e, Mapping) or e.get("ev") not in ("start", "end", "lost"):
        return None
    fence, t = as_count(e.get("fence")), as_number(e.get("t"))
    if fence is None or t is None or not 0 <= t <= LATEST_TIME or "task" not in e:
        return None
    if e["ev"] == "start" and not isinstance(e.get("lane"), str):
        return None
    return (str(e["task"]), fence), str(e["ev"]), t


def runs_from_journal(journal: Iterable[Mapping[str, Any]], now: float,
                      window_s: float = WINDOW_S) -> list[Bar]:
    """Pair starts with ends (by task id and fence) and keep the runs that overlap the window.
    A run whose lease lapsed (a ``lost`` entry, or an end flagged lost) is marked lost."""
    starts: dict[tuple[str, int], Mapping[str, Any]] = {}
    ends: dict[tuple[str, int], Mapping[str, Any]] = {}
    lost: dict[str, Mapping[str, Any]] = {}
    for e in journal:
        parsed = run_entry(e)
        if parsed is None:
            continue  # not a run entry: nothing to draw
        key, ev, t = parsed
        entry = {**e, "t": t}
        if ev == "start":
            starts.setdefault(key, entry)
        elif ev == "end":
            ends[key] = entry
        else:
            lost[key[0]] = entry
    bars = [_bar(key, begun, ends.get(key), lost.get(key[0])) for key, begun in starts.items()]
    since = now - window_s
    return sorted((b for b in bars if b.end is None or b.end >= since),
                  key=lambda b: b.start)


def _bar(key: tuple[str, int], begun: Mapping[str, Any], ended: Mapping[str, Any] | None,
         lost: Mapping[str, Any] | None) -> Bar:
    end: float | None = None
    outcome = "running"
    if ended is not None:
        end, outcome = float(ended["t"]), str(ended.get("outcome") or "completed")
        if ended.get("lost"):
            outcome = "lost"
    elif lost is not None:
        end, outcome = float(lost["t"]), "lost"
    pool, slots = begun.get("pool"), begun.get("slots")
    taken = tuple(n for n in map(as_count, slots if isinstance(slots, list) else [])
                  if n is not None and n < MAX_SLOT_DRAWN)
    return Bar(lane=str(begun["lane"]), task=key[0], fence=key[1], start=float(begun["t"]),
               end=end, outcome=outcome, heavy=key[1] > 0,
               pool=pool if isinstance(pool, str) and taken else "", slots=taken)


#: A journaled slot number at or past this is no slot (a pool's slots are drawn one row each).
MAX_SLOT_DRAWN = 4096


def pool_runs(bars: Sequence[Bar], pool: str, lanes: Sequence[Mapping[str, Any]],
              ) -> list[tuple[int, Bar]]:
    """(slot, run) for each slot a run of ``pool`` took. A heavy run that names no pool ran
    in the default pool's one slot, unless its lane is in another pool (a run journaled
    before runs named their slots: its slot is not known, and it is not drawn)."""
    queue = {str(x["name"]): x.get("queue") for x in lanes}
    out = []
    for b in bars:
        if b.pool:
            out += [(slot, b) for slot in b.slots if b.pool == pool]
        elif b.heavy and pool == DEFAULT_POOL and queue.get(b.lane, DEFAULT_POOL) == pool:
            out.append((0, b))
    return out


def ratio_series(bars: Sequence[Bar], lanes: Sequence[Mapping[str, Any]], now: float,
                 window_s: float = WINDOW_S) -> dict[str, list[tuple[float, float]]]:
    """Each lane's staleness ratio over the window, ``(t, ratio)`` points: it grows by
    1/cadence per second and drops to 0 at each run's end (that is when ``last_run_at`` is
    set). Before the first end seen, the lane's ``last_run_at`` from the status anchors it."""
    series: dict[str, list[tuple[float, float]]] = {}
    since = now - window_s
    for lane in lanes:
        cadence = float(lane.get("cadence_s") or 0)
        if cadence <= 0:
            continue
        resets = sorted({b.end for b in bars
                         if b.lane == lane["name"] and b.end is not None and b.end <= now})
        last = lane.get("last_run_at")
        if last is not None and (not resets or last < resets[0]):
            resets.insert(0, float(last))
        series[str(lane["name"])] = _sawtooth(resets, cadence, since, now)
    return series


def _sawtooth(resets: list[float], cadence: float, since: float,
              now: float) -> list[tuple[float, float]]:
    before = [t for t in resets if t <= since]
    inside = [t for t in resets if since < t <= now]
    points: list[tuple[float, float]] = []
    anchor = before[-1] if before else None
    if anchor is not None:
        points.append((since, (since - anchor) / cadence))
    for t in inside:
        if anchor is not None:
            points.append((t, (t - anchor) / cadence))
        points.append((t, 0.0))
        anchor = t
    if anchor is not None:
        points.append((now, (now - anchor) / cadence))
    return points


def timeline_json(bars: Sequence[Bar]) -> list[dict[str, Any]]:
    return [{**asdict(b), "lost": b.lost} for b in bars]


# -- SVG --------------------------------------------------------------------------------------

def _x(t: float, now: float, window_s: float) -> float:
    return LABEL_W + (CHART_W - LABEL_W) * max(0.0, min(1.0, 1 - (now - t) / window_s))


def _axis(now: float, window_s: float, top: float, bottom: float) -> list[str]:
    parts = []
    step = window_s / 6
    for i in range(7):
        t = now - window_s + i * step
        x = _x(t, now, window_s)
        label = "now" if i == 6 else f"-{_duration(window_s - i * step)}"
        parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" '
                     'class="grid"/>')
        parts.append(f'<text x="{x:.1f}" y="{bottom + 14}" class="tick">{label}</text>')
    return parts


def timeline_svg(bars: Sequence[Bar], lanes: Sequence[Mapping[str, Any]], now: float,
                 window_s: float = WINDOW_S) -> str:
    """The lease timeline as a Gantt chart: a row per lane (heavy lanes first), a bar per run,
    coloured by outcome; yields end in a notch, lost runs are hatched and crossed."""
    names = [str(lane["name"]) for lane in sorted(lanes, key=lambda x: x.get("kind") != "heavy")]
    names += sorted({b.lane for b in bars} - set(names))
    row = {name: i for i, name in enumerate(names)}
    height = ROW_H * len(names) + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" id="timeline" class="chart" '
             f'viewBox="0 0 {CHART_W} {height}" width="100%" role="img" '
             f'aria-label="lease timeline, last {window_s / 60:.0f} minutes">',
             '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
             'patternTransform="rotate(45)"><rect width="6" height="6" fill="#6a1b9a"/>'
             '<line x1="0" y1="0" x2="0" y2="6" stroke="#fff" stroke-width="2"/></pattern>'
             '</defs>']
    for name, i in row.items():
        y = i * ROW_H
        parts.append(f'<text x="4" y="{y + 15}" class="lane">{html.escape(name)}</text>')
        parts.append(f'<line x1="{LABEL_W}" y1="{y + ROW_H}" x2="{CHART_W}" '
                     f'y2="{y + ROW_H}" class="row"/>')
    parts += _axis(now, window_s, 0, ROW_H * len(names))
    parts += [_bar_svg(b, row[b.lane] * ROW_H, now, window_s) for b in bars]
    parts.append("</svg>")
    return "\n".join(parts)


def pool_timeline_svg(pool: Mapping[str, Any], bars: Sequence[Bar],
                      lanes: Sequence[Mapping[str, Any]], now: float,
                      window_s: float = WINDOW_S) -> str:
    """One pool's slots as a Gantt chart: a row per slot, a bar per run on each slot it took
    (a run taking two slots shows on both), named by its lane and coloured by outcome."""
    name, count = str(pool["pool"]), max(1, int(pool["slots"]))
    height = ROW_H * count + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" id="pool-{html.escape(name)}" '
             f'class="chart pool" data-pool="{html.escape(name)}" '
             f'viewBox="0 0 {CHART_W} {height}" width="100%" role="img" '
             f'aria-label="slots of pool {html.escape(name)}, last {window_s / 60:.0f} '
             'minutes">']
    for i in range(count):
        y = i * ROW_H
        parts.append(f'<text x="4" y="{y + 15}" class="lane">{html.escape(name)} slot {i}'
                     "</text>")
        parts.append(f'<line x1="{LABEL_W}" y1="{y + ROW_H}" x2="{CHART_W}" '
                     f'y2="{y + ROW_H}" class="row"/>')
    parts += _axis(now, window_s, 0, ROW_H * count)
    for slot, b in pool_runs(bars, name, lanes):
        if slot < count:
            parts.append(_bar_svg(b, slot * ROW_H, now, window_s, slot=slot))
    parts.append("</svg>")
    return "\n".join(parts)


def pools_section(status: Mapping[str, Any], bars: Sequence[Bar], now: float,
                  window_s: float) -> str:
    """A lease timeline per pool, a row per slot: only when pools beyond the default are
    declared (the lease timeline above is the default pool's alone)."""
    pools = [p for p in status.get("pools") or [] if isinstance(p, Mapping)]
    if len(pools) < 2:
        return ""
    charts = "".join(
        f"<h3>pool {html.escape(str(p['pool']))}: {p['busy']}/{p['slots']} slots busy"
        + (f", {p['waiting']} waiting" if p.get("waiting") else "") + "</h3>"
        + pool_timeline_svg(p, bars, status["lanes"], now, window_s) for p in pools)
    return (f"<section><h2>Pools: each slot, last {_duration(window_s)}</h2>{legend()}"
            f"{charts}</section>")


def _bar_svg(b: Bar, y: float, now: float, window_s: float, slot: int | None = None) -> str:
    x0, x1 = _x(b.start, now, window_s), _x(b.end if b.end is not None else now, now, window_s)
    width = max(2.0, x1 - x0)
    fill = "url(#hatch)" if b.lost else OUTCOME_COLOURS.get(b.outcome, "#757575")
    h, top = (ROW_H - 6, y + 3) if b.heavy else (ROW_H - 12, y + 6)
    end = "running" if b.end is None else time.strftime("%H:%M:%S", time.localtime(b.end))
    title = (f"{b.lane}: {b.outcome}, {time.strftime('%H:%M:%S', time.localtime(b.start))}"
             f" to {end}" + (f", fence {b.fence}" if b.heavy else " (light)"))
    mark = ""
    if b.outcome == "yielded":
        mark = (f'<path d="M{x0 + width:.1f} {top} l-5 {h / 2:.1f} l5 {h / 2:.1f}z" '
                'class="yield-mark"/>')
    elif b.lost:
        mark = (f'<path d="M{x0 + width - 8:.1f} {top} l8 {h} m-8 0 l8 {-h}" '
                'class="lost-mark"/>')
    label = ""
    if slot is not None and width > 60:
        # On a slot row the lane is not the row's name: it is written on the bar.
        label = (f'<text x="{x0 + 3:.1f}" y="{top + h - 4}" class="on-bar">'
                 f"{html.escape(b.lane[:max(1, int(width // 7))])}</text>")
    where = "" if slot is None else f' data-slot="{slot}"'
    return (f'<g class="run {html.escape(b.outcome)}" data-lane="{html.escape(b.lane)}" '
            f'data-task="{html.escape(b.task)}" data-outcome="{html.escape(b.outcome)}"'
            f'{where}><rect x="{x0:.1f}" y="{top}" width="{width:.1f}" height="{h}" rx="2" '
            f'fill="{fill}"><title>{html.escape(title)}</title></rect>{mark}{label}</g>')


def ratio_svg(series: Mapping[str, list[tuple[float, float]]], now: float,
              window_s: float = WINDOW_S) -> str:
    """Staleness ratio over time, a line per lane, with the 1.0 (due) line dashed."""
    height, top = 220, 10
    bottom = height - 30
    peak = max([r for points in series.values() for _, r in points if math.isfinite(r)] + [2.0])
    ceiling = min(peak * 1.1, 1e6)

    def y(r: float) -> float:
        return bottom - (bottom - top) * min(r, ceiling) / ceiling

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" id="ratios" class="chart" '
             f'viewBox="0 0 {CHART_W} {height}" width="100%" role="img" '
             'aria-label="staleness ratio over time">']
    parts += _axis(now, window_s, top, bottom)
    parts.append(f'<line x1="{LABEL_W}" y1="{y(1.0):.1f}" x2="{CHART_W}" y2="{y(1.0):.1f}" '
                 'class="due-line"/>')
    parts.append(f'<text x="{LABEL_W - 4}" y="{y(1.0) + 4:.1f}" class="tick end">1.0 due'
                 f'</text><text x="{LABEL_W - 4}" y="{top + 8}" class="tick end">'
                 f'{ceiling:.3g}</text>')
    for i, (lane, points) in enumerate(sorted(series.items())):
        colour = LANE_COLOURS[i % len(LANE_COLOURS)]
        path = " ".join(f"{_x(t, now, window_s):.1f},{y(r):.1f}" for t, r in points)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" '
                     f'stroke-width="1.6" data-lane="{html.escape(lane)}"/>')
        parts.append(f'<text x="4" y="{top + 14 * (i + 1)}" fill="{colour}" class="lane">'
                     f'{html.escape(lane)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


# -- HTML -------------------------------------------------------------------------------------

def _esc(value: Any) -> str:
    return html.escape("-" if value is None or value == "" else str(value))


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h" if seconds < 172800 else f"{seconds / 86400:.1f}d"


def _ratio(value: float | None) -> str:
    return "∞" if value is None or value >= 1e9 else f"{value:.2f}"


TABLE_COLUMNS = ("lane", "kind", "queue", "cadence / schedule", "last run", "ratio", "state",
                 "deferred: reason / blocker / for", "backlog", "last outcome", "runs", "fail",
                 "next fire", "missed")


def lane_cells(lane: Mapping[str, Any], now: float) -> list[str]:
    """One table row's cells as text (the browser test reads them back)."""
    last = lane.get("last_run_at")
    why = ""
    if lane.get("deferral_reason"):
        why = (f"{lane['deferral_reason']} / {lane['deferral_blocker']} / "
               f"{_duration(lane.get('deferred_for_s'))}")
    outcome = lane.get("last_outcome") or "-"
    if lane.get("last_reason") and outcome in ("failed", "skipped", "yielded"):
        outcome = f"{outcome}: {lane['last_reason']}"
    return [str(lane["name"]), str(lane["kind"]), str(lane["queue"]), schedule_words(lane),
            "never" if last is None else f"{_duration(now - last)} ago",
            _ratio(lane.get("ratio")), str(lane["state"]), why or "-", str(lane["backlog"]),
            outcome, str(lane["runs"]), str(lane["failures"]), next_fire_words(now, lane),
            missed_words(lane)]


def status_table(status: Mapping[str, Any]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in TABLE_COLUMNS)
    rows = []
    for lane in status["lanes"]:
        cells = "".join(f"<td>{_esc(c)}</td>" for c in lane_cells(lane, status["now"]))
        rows.append(f'<tr data-lane="{_esc(lane["name"])}" class="state-'
                    f'{_esc(lane["state"]).replace(" ", "").replace(",", "-")}">{cells}</tr>')
    return (f'<table id="lanes"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


#: The page lists at most this many schedule entries, the earliest due first.
ENTRIES_SHOWN = 200
ENTRY_COLUMNS = ("entry", "task", "schedule", "source", "last run", "next due", "runs",
                 "state")


def entry_cells(entry: Mapping[str, Any], now: float) -> list[str]:
    last, due = entry.get("last_run_at"), entry.get("next_due_at")
    state = "paused" if entry.get("paused") else ("error" if entry.get("problem") else "ok")
    return [str(entry["name"]), str(entry["task"]), str(entry["schedule"]),
            str(entry["source"]), "never" if last is None else f"{_duration(now - last)} ago",
            "-" if due is None else ("now" if due <= now else f"in {_duration(due - now)}"),
            str(entry["runs"]), state]


def entries_section(status: Mapping[str, Any]) -> str:
    """The schedule entries (the app's beat_schedule and runtime entries); nothing when the
    app has none."""
    entries, total = status.get("entries") or [], int(status.get("entries_total") or 0)
    if not total:
        return ""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ENTRY_COLUMNS)
    rows = "".join(
        f'<tr data-entry="{_esc(e["name"])}">'
        + "".join(f"<td>{_esc(c)}</td>" for c in entry_cells(e, status["now"])) + "</tr>"
        for e in entries)
    more = (f"<p>{total - len(entries)} more: <code>schedproj entry list</code></p>"
            if total > len(entries) else "")
    return (f"<section><h2>Schedule entries ({total})</h2>"
            f'<table id="entries"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'
            f"{more}</section>")


def facts(status: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, text) lines under the table: lease, chain, watchdog, active beat, problems."""
    now, lease = status["now"], status.get("lease")
    out = [("lease", "free" if lease is None else
            f"held by {lease['holder']} for {_duration(lease['held_s'])}, fence "
            f"{lease['fence']}" + (" — PAST THE HOLD CAP" if status["lease_over_cap"] else ""))]
    pools = [p for p in status.get("pools") or [] if isinstance(p, Mapping)]
    if len(pools) > 1:
        out += [(f"pool {p['pool']}", pool_text(p)) for p in pools]
    chain = status.get("chain") or []
    out.append(("deferral chain", f"depth {status['chain_depth']}: "
                + (" ← ".join(chain) if chain else "none")))
    out.append(("watchdog", _watchdog_text(status)))
    out += [("UNDISPATCHED", f"{u['lane']}: due since {_duration(now - u['due_since'])} ago, "
             "never dispatched, deferred or paused (is beat running?)")
            for u in status.get("undispatched") or []]
    missed = {lane["name"]: lane for lane in status.get("lanes") or []}
    out += [("MISSED FIRE TIMES", f"{name}: missed its last fire times in a row ("
             + (f"{missed[name].get('missed')} in all" if name in missed else "see status")
             + "), behind other heavy work or with no beat")
            for name in status.get("missing") or []]
    beat = status.get("beat") or {}
    out.append(("active beat", "none has run with this prefix" if not beat.get("host") else
                f"{beat['host']} pid {beat.get('pid')} ("
                f"{'active' if beat.get('lock_held') else 'LOCK EXPIRED'}, since "
                f"{_duration(now - float(beat.get('since', now)))} ago)"))
    out += [("error", f"[{lane}] {message}") for lane, message in
            sorted((status.get("errors") or {}).items())]
    out += [("problem", str(p)) for p in status.get("problems") or []]
    if status.get("undeclared_lanes"):
        out.append(("problem", "lanes with state here that the last beat does not declare: "
                    + ", ".join(status["undeclared_lanes"])))
    return out


def pool_text(pool: Mapping[str, Any]) -> str:
    """``1/2 slots busy: slot 0 embed for 3s, fence 7; 1 waiting (retrain)``."""
    held = "; ".join(f"slot {h['slot']} {h['holder'] or '?'} for {_duration(h['held_s'])}, "
                     f"fence {h['fence']}" for h in pool.get("holders") or [])
    waiters = ", ".join(map(str, pool.get("waiters") or []))
    more = int(pool.get("waiting") or 0) - len(pool.get("waiters") or [])
    return (f"{pool['busy']}/{pool['slots']} slots busy" + (f": {held}" if held else "")
            + (f"; {pool['waiting']} waiting ({waiters}" + (f" and {more} more" if more > 0
                                                            else "") + ")"
               if pool.get("waiting") else ""))


def _watchdog_text(status: Mapping[str, Any]) -> str:
    text = f"posture {status['posture']}"
    w = status.get("watchdog")
    if not w:
        return text + " (the watchdog lane has not run yet)"
    alarm = "STALL: " + ", ".join(map(str, w.get("reasons", []))) if w.get("stalled") \
        else "no stall"
    checked = w.get("assessed_at")
    when = f", checked {_duration(status['now'] - checked)} ago" if checked else ""
    return f"{text}; {alarm}{when}"


def legend() -> str:
    items = "".join(f'<span><i style="background:{c}"></i>{html.escape(o)}</span>'
                    for o, c in OUTCOME_COLOURS.items() if o != "lost")
    return (f'<div class="legend">{items}<span><i class="lost"></i>lost (lease lapsed)'
            '</span><span>▶ notch: yielded at a checkpoint</span>'
            '<span>thin bars: light lanes</span></div>')


def fit_window(journal: Sequence[Mapping[str, Any]], now: float, *,
               floor_s: float = 30.0) -> float:
    """The charts' span: the last hour, or less when the journal starts later (a young
    deployment's runs would be a sliver at the right edge), never under ``floor_s``."""
    entries = [run_entry(e) for e in journal]
    starts = [t for e in entries if e is not None and e[1] == "start"
              for t in (e[2],) if now - t <= WINDOW_S]
    if not starts:
        return WINDOW_S
    return min(WINDOW_S, max(floor_s, (now - min(starts)) * 1.1))


def render_page(status: Mapping[str, Any], journal: Iterable[Mapping[str, Any]], *,
                refresh_s: float = 5.0, window_s: float | None = None) -> str:
    """The whole page: the status table, the facts, the lease timeline and the ratio chart."""
    now = float(status["now"])
    journal = list(journal)
    window_s = window_s or fit_window(journal, now)
    bars = runs_from_journal(journal, now, window_s)
    series = ratio_series(bars, status["lanes"], now, window_s)
    fact_rows = "".join(f'<tr class="fact"><th>{html.escape(k)}</th>'
                        f"<td>{html.escape(v)}</td></tr>" for k, v in facts(status))
    posture = html.escape(str(status["posture"]))
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    live = (f'<header><h1>schedproj <span class="posture {posture}">{posture.upper()}</span>'
            f'</h1><p class="stamp">as of {stamp} · refreshes every {refresh_s:g}s · '
            '<a href="api/status">status JSON</a> · <a href="api/timeline">timeline JSON</a> · '
            '<a href="metrics">metrics</a></p></header>'
            f"<section><h2>Lanes</h2>{status_table(status)}"
            f'<table id="facts">{fact_rows}</table></section>'
            f"{entries_section(status)}"
            f'<section><h2>Lease timeline, last {_duration(window_s)} (up to an hour)</h2>'
            f"{legend()}{timeline_svg(bars, status['lanes'], now, window_s)}</section>"
            f"{pools_section(status, bars, now, window_s)}"
            f"<section><h2>Staleness ratio</h2>{ratio_svg(series, now, window_s)}</section>")
    return PAGE.format(style=STYLE, live=live, script=SCRIPT.replace(
        "REFRESH_MS", str(int(refresh_s * 1000))))


def api_timeline(status: Mapping[str, Any], journal: Iterable[Mapping[str, Any]],
                 window_s: float = WINDOW_S) -> dict[str, Any]:
    """The runs of the window (the last hour) and each lane's staleness ratio over it."""
    now = float(status["now"])
    bars = runs_from_journal(journal, now, window_s)
    return {"now": now, "window_s": window_s, "runs": timeline_json(bars),
            "ratios": ratio_series(bars, status["lanes"], now, window_s)}


def dumps(data: Any) -> str:
    return json.dumps(data, default=str, allow_nan=False)


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>schedproj status</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{style}</style></head>
<body><main id="live">{live}</main><script>{script}</script></body></html>
"""

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #212121; background: #fafafa; }
h1 { font-size: 1.4em; margin: 0; } h2 { font-size: 1.1em; margin: 1.2em 0 .4em; }
.stamp { color: #616161; margin: .2em 0 0; }
.posture { padding: .1em .5em; border-radius: 4px; color: #fff; background: #757575; }
.posture.healthy { background: #2e7d32; } .posture.degraded { background: #c62828; }
table { border-collapse: collapse; background: #fff; }
#lanes th, #lanes td { border: 1px solid #e0e0e0; padding: .25em .5em; text-align: left;
  white-space: nowrap; }
#lanes th { background: #eeeeee; }
tr.state-running td, tr.state-paused-running td { background: #e3f2fd; }
tr.state-deferred td { background: #fff8e1; } tr.state-paused td { color: #9e9e9e; }
#facts { margin-top: .8em; } #facts th { text-align: right; padding-right: .8em; color: #616161;
  font-weight: normal; } #facts td { padding: .1em 0; }
.chart { background: #fff; border: 1px solid #e0e0e0; max-width: 1100px; display: block; }
.chart .lane { font-size: 12px; } .chart .tick { font-size: 10px; fill: #757575; }
.chart .tick.end { text-anchor: end; } .chart .grid { stroke: #eeeeee; }
.chart .row { stroke: #f5f5f5; } .due-line { stroke: #c62828; stroke-dasharray: 4 3; }
.chart .on-bar { font-size: 10px; fill: #fff; } h3 { font-size: 1em; margin: .8em 0 .3em; }
.yield-mark { fill: #fff; } .lost-mark { stroke: #fff; stroke-width: 2; }
.legend { display: flex; gap: 1em; flex-wrap: wrap; margin-bottom: .4em; font-size: 12px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px;
  vertical-align: -2px; border-radius: 2px; }
.legend i.lost { background: repeating-linear-gradient(45deg, #6a1b9a 0 3px, #fff 3px 5px); }
"""

SCRIPT = """
(function () {
  async function refresh() {
    try {
      const r = await fetch(window.location.href, {cache: "no-store"});
      if (!r.ok) return;
      const doc = new DOMParser().parseFromString(await r.text(), "text/html");
      const fresh = doc.getElementById("live");
      if (fresh) document.getElementById("live").innerHTML = fresh.innerHTML;
    } catch (e) { /* beat restarting: try again at the next refresh */ }
  }
  setInterval(refresh, REFRESH_MS);
})();
"""
