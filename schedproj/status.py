"""``schedproj status``: the deployment at a glance, from Redis alone."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from schedproj.health import Health
from schedproj.observe import Observation


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
    return "∞" if math.isinf(value) else f"{value:.2f}"


def lane_state_word(h: Any) -> str:
    if not h.enabled:
        return "disabled by profile"
    if h.paused:
        return "paused"
    if h.in_flight:
        return "running"
    if h.deferral_reason:
        return "deferred"
    return "due" if h.due else "idle"


def as_json(obs: Observation, health: Health) -> dict[str, Any]:
    return {
        "now": obs.now,
        "posture": health.posture.value,
        "lease": asdict(health.lease) if health.lease else None,
        "chain_depth": health.chain_depth,
        "chain": list(health.chain),
        "starving": list(health.starving),
        "lease_over_cap": health.lease_over_cap,
        "lanes": [{**asdict(h), "state": lane_state_word(h),
                   "ratio": None if math.isinf(h.ratio) else h.ratio} for h in health.lanes],
        "beat": {**obs.beat, "lock_held": obs.beat_lock_held},
        "watchdog": obs.watchdog,
        "errors": obs.errors,
        "counters": obs.counters,
        "lease_acquisitions": obs.lease_acquisitions,
        "problems": obs.problems,
    }


def render(obs: Observation, health: Health) -> Group:
    now = obs.now
    table = Table(title=f"schedproj — posture {health.posture.value.upper()}")
    for col in ("lane", "kind", "queue", "class", "cadence", "last run", "ratio", "state",
                "reason / blocker / for", "last outcome", "runs", "fail"):
        table.add_column(col, no_wrap=col == "lane")
    for h in health.lanes:
        why = ""
        if h.deferral_reason:
            why = f"{h.deferral_reason} / {h.deferral_blocker} / {_duration(h.deferred_for_s or 0)}"
        outcome = h.last_outcome or "-"
        if h.last_reason and h.last_outcome in ("failed", "skipped", "yielded"):
            outcome = f"{outcome}: {h.last_reason}"[:60]
        table.add_row(h.name, h.kind, h.queue, h.deployment, _duration(h.cadence_s),
                      _ago(now, h.last_run_at), _ratio(h.ratio), lane_state_word(h), why,
                      outcome, str(h.runs), str(h.failures))
    lines = []
    if health.lease:
        lease = health.lease
        state = "running" if lease.started_at else "granted, not started"
        lines.append(f"lease: held by {lease.holder} ({state}) for {_duration(lease.held_s)}, "
                     f"fence {lease.fence}" + (" — PAST THE HOLD CAP" if health.lease_over_cap
                                               else ""))
    else:
        lines.append("lease: free")
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
        alarm = (f"STALL since {_ago(now, w.get('stall_since'))}: {', '.join(w['reasons'])}"
                 if w.get("stalled") else "no stall")
        lines.append(f"watchdog: {w.get('posture')} ({alarm}; checked "
                     f"{_ago(now, w.get('assessed_at'))})")
    for lane, message in sorted(obs.errors.items()):
        lines.append(f"error [{lane}]: {message}")
    for problem in obs.problems:
        lines.append(f"problem: {problem}")
    return Group(table, *(Text(line) for line in lines))
