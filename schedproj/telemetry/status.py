"""``schedproj status``: the deployment at a glance, from Redis alone."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from rich.console import Group
from rich.table import Table
from rich.text import Text

from schedproj.core.families import FamilyStats, fold, split_member
from schedproj.core.health import MISSED_IN_A_ROW, Health
from schedproj.core.pressure import Pressure, PressureYield
from schedproj.telemetry.entries_view import EntriesView
from schedproj.telemetry.observe import Observation

#: C0 and C1 control characters and DEL: an escape sequence in a lane's failure reason (say
#: ``ESC ] 0 ; title BEL``) would retitle, recolour or scramble the operator's terminal.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(value: Any) -> str:
    """``value`` as text safe for a terminal: control characters shown as ``\\xNN`` escapes.
    Markup is not a concern here: every cell and line is a :class:`rich.text.Text`, which
    Rich never parses as markup."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def cell(value: Any) -> Text:
    """A table cell or line holding data: never markup, never terminal control."""
    return Text(printable(value))


def _ago(now: float, then: float | None) -> str:
    if then is None:
        return "never"
    return f"{_duration(now - then)} ago"


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _ratio(value: float) -> str:
    return "∞" if math.isinf(value) or value >= 1e9 else f"{value:.2f}"


def lane_state_word(h: Any) -> str:
    if not h.enabled:
        return "disabled by profile"
    if h.paused:
        return "paused, running" if h.in_flight else "paused"
    if h.in_flight:
        return "running"
    if h.deferral_reason:
        return "deferred"
    return "due" if h.due else "idle"


def when_in(at: float, zone: str | None) -> datetime:
    """``at`` as a wall time in ``zone`` (UTC when the zone is not known here)."""
    try:
        tz: Any = UTC if zone is None else ZoneInfo(zone)
    except (ValueError, KeyError):   # ZoneInfoNotFoundError is a KeyError
        tz = UTC
    return datetime.fromtimestamp(at, tz)


def next_fire(obs: Observation, h: Any) -> dict[str, Any]:
    """A lane's schedule and next fire for the tools: ``schedule`` (in words; None for a
    cadence lane), ``next_fire_at`` (epoch seconds), ``next_fire_local`` (ISO 8601 in the
    lane's zone), ``next_fire_utc`` and ``next_fire_from`` — ``schedule`` when computed from
    its fire times, ``due index`` for a schedule only its code computes (the due index's next
    look, where beat will next judge it)."""
    at, source = h.next_fire_at, "schedule"
    if h.schedule is not None and at is None and h.name in obs.next_looks:
        at, source = obs.next_looks[h.name], "due index"
    if h.schedule is None or at is None:
        return {"next_fire_at": None, "next_fire_local": None, "next_fire_utc": None,
                "next_fire_from": None}
    return {"next_fire_at": at,
            "next_fire_local": when_in(at, h.timezone).isoformat(timespec="seconds"),
            "next_fire_utc": when_in(at, None).isoformat(timespec="seconds"),
            "next_fire_from": source}


def next_fire_words(now: float, lane: Mapping[str, Any]) -> str:
    """``in 3.0h — 02:30 CET (01:30 UTC)``: a lane's next fire (from :func:`next_fire`) as
    status, the page and ``schedproj lanes`` show it; ``-`` for a cadence lane."""
    at = lane.get("next_fire_at")
    if at is None:
        return "-" if lane.get("schedule") is None else "unknown"
    local, utc = when_in(at, lane.get("timezone")), when_in(at, None)
    day = "" if local.date() == when_in(now, lane.get("timezone")).date() else \
        local.strftime("%a %d %b ")
    words = (f"in {_duration(at - now)} — {day}{local:%H:%M %Z}"
             + ("" if local.utcoffset() == utc.utcoffset() else f" ({utc:%H:%M} UTC)"))
    return words + (" (due index)" if lane.get("next_fire_from") == "due index" else "")


def schedule_words(lane: Mapping[str, Any]) -> str:
    """A lane's schedule in words, or its cadence."""
    return str(lane["schedule"]) if lane.get("schedule") else _duration(lane["cadence_s"])


def missed_words(lane: Mapping[str, Any]) -> str:
    """How many fire times a calendar lane missed, in all (``4 (the last 2 in a row)`` while
    its latest ones were missed in a row: counted up to ``health.MISSED_IN_A_ROW``)."""
    if lane.get("schedule") is None:
        return "-"
    missed, row = lane.get("missed"), lane.get("missed_in_a_row") or 0
    if missed is None:
        return "unknown"   # `schedproj lanes` without Redis
    return f"{missed} (the last {row} in a row)" if row >= MISSED_IN_A_ROW else str(missed)


def undeclared_lanes(obs: Observation) -> list[str]:
    """Lanes with state under this prefix that the published lane set does not declare: what
    another app's beat on the same Redis and prefix leaves behind."""
    declared = {s.name for s in obs.specs}
    return sorted(lane for lane in obs.states if lane not in declared
                  and (split_member(lane) or ("",))[0] not in obs.families)


def families_folded(obs: Observation, health: Health) -> list[FamilyStats]:
    """One row per lane family: members, due, deferred, running, the worst ratio."""
    rows: dict[str, list[Any]] = {name: [] for name in obs.families}
    for h in health.lanes:
        parts = split_member(h.name)
        if parts is not None and parts[0] in rows:
            rows[parts[0]].append(h)
    return [fold(name, obs.families[name].kind.value, obs.family_sizes.get(name, 0), lanes)
            for name, lanes in sorted(rows.items())]


def shown_lanes(obs: Observation, health: Health, family: str | None) -> list[Any]:
    """The status rows to list: lanes of their own (members folded), or one family's."""
    out = []
    for h in health.lanes:
        parts = split_member(h.name)
        member_of = parts[0] if parts is not None and parts[0] in obs.families else None
        if member_of == family:
            out.append(h)
    return out


def undeclared_line(lanes: list[str]) -> str:
    return (f"lanes with state here that the last beat does not declare: {', '.join(lanes)} "
            "— another app's beat ran with this prefix. Fix: start their app's beat, or give "
            "each app its own SCHEDPROJ_KEY_PREFIX")


def undispatched_json(health: Health) -> list[dict[str, Any]]:
    """The lanes due past their bound that beat never acted on, and since when."""
    since = {h.name: h.due_since for h in health.lanes}
    return [{"lane": lane, "due_since": since[lane]} for lane in health.undispatched]


def undispatched_line(now: float, lanes: list[dict[str, Any]]) -> str:
    """One line naming the lanes scheduling stopped for (status and the page)."""
    return ("UNDISPATCHED (due, never dispatched, deferred or paused; is beat running?): "
            + ", ".join(f"{u['lane']} due since {_ago(now, u['due_since'])}" for u in lanes))


def as_json(obs: Observation, health: Health, family: str | None = None) -> dict[str, Any]:
    """The status as JSON (``schedproj status --json``, ``/api/status``). Every key, here and in
    the rows and dataclasses below, has its line in ``status_fields.CATALOG``, which the
    reference page is generated from; a test fails on a key the catalog lacks."""
    return {
        "now": obs.now,
        "posture": health.posture.value,
        "lease": asdict(health.lease) if health.lease else None,
        "chain_depth": health.chain_depth,
        "chain": list(health.chain),
        "undeclared_lanes": undeclared_lanes(obs),
        "starving": list(health.starving),
        "undispatched": undispatched_json(health),
        "missing": list(health.missing),
        "lease_over_cap": health.lease_over_cap,
        "slots_over_cap": list(health.slots_over_cap),
        "lanes": [lane_json(obs, h) for h in shown_lanes(obs, health, family)],
        "families": [{**asdict(f), "max_ratio": None if math.isinf(f.max_ratio)
                      else f.max_ratio, "schedule": family_schedule(obs, f.family)}
                     for f in families_folded(obs, health)],
        "beat": {**obs.beat, "lock_held": obs.beat_lock_held},
        "watchdog": obs.watchdog,
        "errors": obs.errors,
        "counters": obs.counters,
        "lease_acquisitions": obs.lease_acquisitions,
        "problems": obs.problems,
        "pressure": pressure_json(obs),
        "pools": pools_json(obs, health),
    }


def pools_json(obs: Observation, health: Health) -> list[dict[str, Any]]:
    """Every pool, the default pool first: slots, the busy ones' holders, the waiters and the
    pressure on the pool's holders."""
    return [{**asdict(gauge), "holders": [asdict(h) for h in gauge.holders],
             "waiters": list(gauge.waiters), "pressure": pool_pressure_json(obs, gauge.pool)}
            for gauge in health.pools]


def pool_pressure_json(obs: Observation, pool: str) -> dict[str, Any]:
    """The pressure on ``pool``'s holders, as :func:`pressure_json` gives the lease's."""
    if pool not in obs.pool_pressure:
        return pressure_json(obs)
    fields = obs.pool_pressure[pool]
    return _pressure_json(obs.now, fields.get("pressure"), fields.get("last_pressure_yield"),
                          fields.get("pressure_yields", 0))


def lane_json(obs: Observation, h: Any) -> dict[str, Any]:
    """One lane's status row as JSON (``schedproj status --json``, ``/api/status``)."""
    return {**asdict(h), "state": lane_state_word(h),
            "ratio": None if math.isinf(h.ratio) else h.ratio, **next_fire(obs, h)}


def missing_line(now: float, health: Health) -> str:
    """One line naming the heavy calendar lanes kept from their fire times."""
    rows = {h.name: h for h in health.lanes}
    return ("MISSED FIRE TIMES (heavy calendar lanes that missed their last fire times in a "
            "row, behind other heavy work or with no beat): "
            + ", ".join(f"{lane} (missed {rows[lane].missed} in all, the latest "
                        f"{_ago(now, rows[lane].missed_through)})" for lane in health.missing))


def pressure_json(obs: Observation) -> dict[str, Any]:
    """The pressure on the lease (the waiting lane and its ratio now), the last pressure yield
    and how many there were."""
    return _pressure_json(obs.now, obs.pressure, obs.last_pressure_yield, obs.pressure_yields)


def _pressure_json(now: float, p: Pressure | None, last: PressureYield | None,
                   yields: int) -> dict[str, Any]:
    ratio = p.ratio(now) if p is not None else None
    return {
        "current": None if p is None else {
            **asdict(p), "ratio": None if ratio is None or math.isinf(ratio) else ratio},
        "last_yield": asdict(last) if last is not None else None,
        "yields": yields,
    }


def pool_lines(obs: Observation, health: Health) -> list[str]:
    """One line per pool, with a line per busy slot: shown only when pools beyond the default
    are declared (the lease line says all there is to say of the default pool alone)."""
    if len(health.pools) < 2:
        return []
    lines = []
    for gauge in health.pools:
        waiters = ", ".join(gauge.waiters) + (
            f" and {gauge.waiting - len(gauge.waiters)} more"
            if gauge.waiting > len(gauge.waiters) else "")
        pressure = pool_pressure_json(obs, gauge.pool)["current"]
        ratio = math.inf if pressure is None or pressure["ratio"] is None else pressure["ratio"]
        pressing = "none" if pressure is None else (
            f"{pressure['lane']} (ratio {_ratio(ratio)}"
            + (", priority-0" if pressure["priority0"] else "") + ")")
        lines.append(f"pool {gauge.pool}: {gauge.busy}/{gauge.slots} slots busy; "
                     f"{gauge.waiting} waiting" + (f" ({waiters})" if gauge.waiting else "")
                     + f"; pressure: {pressing}")
        for held in gauge.holders:
            state = "running" if held.started_at is not None else "granted, not started"
            over = f"{gauge.pool}:{held.slot}" in health.slots_over_cap
            lines.append(f"  slot {held.slot}: {held.holder or '? (unreadable record)'} "
                         f"({state}) for {_duration(held.held_s)}, fence {held.fence}"
                         + (" — PAST THE HOLD CAP" if over else ""))
    return lines


def pressure_lines(obs: Observation) -> list[str]:
    now, p, last = obs.now, obs.pressure, obs.last_pressure_yield
    if p is None:
        lines = ["pressure: none (no heavy lane waits for the lease)"]
    else:
        lines = [f"pressure: {p.lane} waits for the lease (ratio {_ratio(p.ratio(now))}"
                 + (", priority-0" if p.priority0 else "") + f"), on fence {p.fence}"]
    if last is not None:
        lines.append(f"last pressure yield: {last.lane} yielded to {last.pressing} (ratio "
                     f"{_ratio(last.ratio)}) after {_duration(last.held_s)}, "
                     f"{_ago(now, last.at)}; {obs.pressure_yields} pressure yields")
    return lines


def family_schedule(obs: Observation, family: str) -> str | None:
    """A calendar family's schedule in words (None: a cadence family)."""
    spec = obs.families.get(family)
    return None if spec is None or spec.calendar is None else spec.calendar.text


def _family_table(obs: Observation, health: Health) -> Table:
    table = Table(title="lane families (schedproj status --family NAME lists the members)")
    for col in ("family", "kind", "cadence / schedule", "members", "due", "deferred",
                "running", "max ratio", "worst member"):
        table.add_column(col, no_wrap=col in ("family", "cadence / schedule", "worst member"))
    for f in families_folded(obs, health):
        spec = obs.families[f.family]
        table.add_row(*map(cell, (f.family, f.kind, family_schedule(obs, f.family)
                                  or _duration(spec.cadence_s), f.members, f.due, f.deferred,
                                  f.running, _ratio(f.max_ratio) if f.worst else "-",
                                  f.worst or "-")))
    return table


def _lane_table(obs: Observation, health: Health, family: str | None = None) -> Table:
    now = obs.now
    lanes = shown_lanes(obs, health, family)
    table = Table(title=f"schedproj — posture {health.posture.value.upper()}")
    whys = {h.name: (f"{h.deferral_reason} / {h.deferral_blocker} / "
                     f"{_duration(h.deferred_for_s or 0)}") if h.deferral_reason else ""
            for h in lanes}
    deferred = "deferred: reason / blocker / for"
    for col in ("lane", "kind", "queue", "class", "cadence / schedule", "next fire", "missed",
                "last run", "ratio", "state", deferred, "last outcome", "runs", "fail"):
        # Lane names, schedules and the deferral (its blocker) are never cut off; other
        # cells wrap.
        table.add_column(col, no_wrap=col in ("lane", "cadence / schedule", deferred),
                         overflow="fold",
                         min_width=max([len(w) for w in whys.values()] + [8])
                         if col == deferred else None)
    for h in lanes:
        why = whys[h.name]
        outcome = h.last_outcome or "-"
        if h.last_reason and h.last_outcome in ("failed", "skipped", "yielded"):
            outcome = f"{outcome}: {h.last_reason}"[:60]
        row = lane_json(obs, h)
        table.add_row(*map(cell, (h.name, h.kind, h.queue, h.deployment, schedule_words(row),
                                  next_fire_words(now, row), missed_words(row),
                                  _ago(now, h.last_run_at), _ratio(h.ratio),
                                  lane_state_word(h), why, outcome, h.runs, h.failures)))
    return table


def render(obs: Observation, health: Health, family: str | None = None) -> Group:
    now = obs.now
    table = _lane_table(obs, health, family)
    lines = []
    if health.lease:
        lease = health.lease
        state = "running" if lease.started_at else "granted, not started"
        lines.append(f"lease: held by {lease.holder} ({state}) for {_duration(lease.held_s)}, "
                     f"fence {lease.fence}" + (" — PAST THE HOLD CAP" if health.lease_over_cap
                                               else ""))
    else:
        lines.append("lease: free")
    lines += pressure_lines(obs)
    lines += pool_lines(obs, health)
    chain = " <- ".join(health.chain) if health.chain_depth else "-"
    lines.append(f"deferral chain depth: {health.chain_depth} ({chain})")
    if obs.beat:
        active = "active" if obs.beat_lock_held else "LOCK EXPIRED"
        lines.append(f"beat: {obs.beat.get('host')} pid {obs.beat.get('pid')} ({active}, since "
                     f"{_ago(now, float(obs.beat.get('since', now)))})")
    else:
        lines.append("beat: none has run with this prefix")
    if obs.watchdog:
        w = obs.watchdog
        reasons = ", ".join(map(str, w.get("reasons", [])))
        alarm = (f"STALL since {_ago(now, w.get('stall_since'))}: {reasons}"
                 if w.get("stalled") else "no stall")
        lines.append(f"watchdog: {w.get('posture')} ({alarm}; checked "
                     f"{_ago(now, w.get('assessed_at'))})")
    if health.undispatched:
        lines.append(undispatched_line(now, undispatched_json(health)))
    if health.missing:
        lines.append(missing_line(now, health))
    undeclared = undeclared_lanes(obs)
    if undeclared:
        lines.append(f"problem: {undeclared_line(undeclared)}")
    for lane, message in sorted(obs.errors.items()):
        lines.append(f"error [{lane}]: {message}")
    for problem in obs.problems:
        lines.append(f"problem: {problem}")
    folded = [_family_table(obs, health)] if obs.families and family is None else []
    return Group(table, *folded, *(cell(line) for line in lines))


#: At most this many schedule entries are listed (the earliest due first); the rest counted.
ENTRIES_SHOWN = 50


def entries_table(view: EntriesView, now: float | None = None) -> Group:
    """The schedule entries: the earliest due first, with last run, runs and problems."""
    import time

    now = time.time() if now is None else now
    rows = sorted(view.entries, key=lambda e: (e.next_due_at is None, e.next_due_at or 0.0))
    table = Table(title=f"schedule entries ({len(rows)})")
    for col in ("entry", "task", "schedule", "source", "last run", "next due", "runs", "state"):
        table.add_column(col, no_wrap=col == "entry")
    for e in rows[:ENTRIES_SHOWN]:
        due = "-" if e.next_due_at is None else (
            "now" if e.next_due_at <= now else f"in {_duration(e.next_due_at - now)}")
        table.add_row(*(cell(v) for v in (
            e.name, e.task, e.schedule, e.source, _ago(now, e.last_run_at), due, e.runs,
            "paused" if e.paused else ("error" if e.problem else "ok"))))
    lines = [f"... and {len(rows) - ENTRIES_SHOWN} more (schedproj entry list)"] \
        if len(rows) > ENTRIES_SHOWN else []
    lines += [f"error [entry {e.name}]: {e.problem}" for e in rows if e.problem]
    lines += [f"problem: {p}" for p in view.problems]
    if not rows and not lines:
        return Group()
    return Group(table, *(cell(line) for line in lines))
