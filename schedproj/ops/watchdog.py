"""The starvation watchdog lane: posture plus a one-shot alarm latch, on durable state.

In the style of the original's embed-drain-liveness-watchdog: the alarm fires once when a
stall begins (any lane — heavy or light, deferred behind the lease, the pick or a gate — waiting
undispatched past ``SCHEDPROJ_STARVATION_THRESHOLD_S``, the lease held past the hold cap, or a
heavy calendar lane that missed its last ``core.health.MISSED_IN_A_ROW`` fire times in a row),
records when, and clears when the stall ends. ``schedproj.app`` always has it; another app
adds it with ``configure_app(app, watchdog=True)`` (or :func:`register`).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from celery import Celery

from schedproj.core import codec
from schedproj.core.health import Health, Posture
from schedproj.core.lanes import Lane, LaneKind
from schedproj.on_celery.runtime import runtime_for
from schedproj.on_celery.task import LaneTask
from schedproj.store.protocol import WATCHDOG_VERSION
from schedproj.telemetry.observe import observe

logger = logging.getLogger(__name__)

#: How often the watchdog looks (seconds, before SCHEDPROJ_CADENCE_SCALE).
WATCHDOG_CADENCE_S = 60.0


@dataclass(frozen=True)
class Latch:
    """The watchdog's durable record."""

    posture: str
    assessed_at: float
    stalled: bool
    stall_since: float | None
    alarm_fired_at: float | None
    cleared_at: float | None
    alarms: int
    reasons: tuple[str, ...]


def reasons_of(health: Health) -> tuple[str, ...]:
    out = [f"starving:{lane}" for lane in health.starving]
    out += [f"undispatched:{lane}" for lane in health.undispatched]
    out += [f"missed-fires:{lane}" for lane in health.missing]
    if health.lease_over_cap and health.lease is not None:
        out.append(f"lease-over-cap:{health.lease.holder}")
    out += [f"slot-over-cap:{slot}" for slot in health.slots_over_cap]
    out += [f"unreadable:{name}" for name in health.unreadable]
    return tuple(out)


def step(previous: Latch | None, health: Health) -> tuple[Latch, str | None]:
    """Advance the latch; return the new latch and 'fired' / 'cleared' / None. Pure."""
    now, stalled = health.now, health.stalled
    was = previous is not None and previous.stalled
    base = previous or Latch(Posture.UNKNOWN.value, now, False, None, None, None, 0, ())
    if stalled and not was:
        latch = Latch(health.posture.value, now, True, now, now, None, base.alarms + 1,
                      reasons_of(health))
        return latch, "fired"
    if not stalled and was:
        latch = Latch(health.posture.value, now, False, None, base.alarm_fired_at, now,
                      base.alarms, reasons_of(health))
        return latch, "cleared"
    return Latch(health.posture.value, now, stalled, base.stall_since, base.alarm_fired_at,
                 base.cleared_at, base.alarms, reasons_of(health)), None


def load_latch(raw: dict[str, Any] | None) -> Latch | None:
    if not raw or raw.get(codec.VERSION_FIELD) != WATCHDOG_VERSION:
        return None
    data = {k: v for k, v in raw.items() if k != codec.VERSION_FIELD}
    data["reasons"] = tuple(data.get("reasons", ()))
    try:
        return Latch(**data)
    except TypeError:
        return None


def register(app: Celery) -> Any:
    """Declare the watchdog lane on ``app`` (not a shared task: only apps that ask get it)."""
    return app.task(shared=False, base=LaneTask, bind=True, name="schedproj.watchdog",
                    lane=Lane(name="starvation-watchdog", cadence_s=WATCHDOG_CADENCE_S,
                              kind=LaneKind.LIGHT, order=900))(starvation_watchdog)


def starvation_watchdog(self: LaneTask) -> dict[str, Any]:
    """Assess the stall gauges and advance the alarm latch."""
    rt = runtime_for(self.app)
    obs = observe(rt.store.client, rt.keys)
    s = rt.settings
    health = obs.health(starvation_threshold_s=s.starvation_threshold_s,
                        hold_cap_s=s.hold_cap_s, profile=s.profile)
    latch, event = step(load_latch(obs.watchdog), health)
    rt.store.client.set(rt.keys.watchdog, codec.dumps(asdict(latch), WATCHDOG_VERSION))
    if event == "fired":
        logger.error("schedproj watchdog: STALL began (%s); posture %s",
                     ", ".join(latch.reasons), latch.posture)
    elif event == "cleared":
        logger.warning("schedproj watchdog: stall cleared; posture %s", latch.posture)
    return {"posture": latch.posture, "event": event, "reasons": list(latch.reasons)}
