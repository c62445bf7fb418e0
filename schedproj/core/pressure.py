"""Pressure-aware yielding: when a heavy run gives the lease back before its hold cap. Pure.

A heavy run holds the one lease; every other due heavy lane waits behind it and grows staler.
The hold cap bounds that wait, but a cap long enough for a 24-hour lane's backlog (30 min) lets
a 1-minute lane behind it reach staleness ratio 30, and a cap short enough for the 1-minute
lane makes every long run pay its start-up cost again even when nobody waits. So the holder
also yields when somebody is actually *pressing*:

* beat computes the **pressure** each tick (:func:`measure`): among the heavy lanes waiting for
  the lease that no soft gate would hold back once it is free, the one the staleness picker
  would choose next — its name, cadence and last run (so its ratio can be computed at any later
  instant without another tick) and whether it is priority-0;
* beat publishes it; the holder learns it in its lease renewal's reply;
* at each checkpoint the holder asks :func:`yield_reason`: the hold cap is reached, or it has
  held at least ``min_hold_s`` and the pressing lane is priority-0 or its staleness ratio has
  reached ``target_ratio``.

``FairScheduler`` (beat), ``LaneTask.should_yield`` (the worker) and the simulator call these
same functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from schedproj.core import codec, gates
from schedproj.core.errors import StateError
from schedproj.core.lanes import LaneKind, LaneSpec
from schedproj.core.picker import pick, rank_key
from schedproj.core.pipeline import Decision
from schedproj.core.records import EMPTY_STATE, LaneState, LeaseView
from schedproj.core.views import LaneView, effective_last_run, staleness_ratio

#: Format version of the published pressure record.
PRESSURE_VERSION = 1
#: A waiting heavy lane this stale (staleness ratio, dimensionless) makes the holder yield.
#: Measured with ``schedproj simulate --scenario mixed`` (docs/simulator.md): the waiting lane
#: starts up to one checkpoint (~30 s of batches) plus a tick after it crosses the target, so
#: a 1-minute lane starts near target + 0.5; 1.5 keeps the maximum at or below 2.5.
DEFAULT_TARGET_RATIO = 1.5
#: A run holds the lease at least this long (seconds) before pressure can make it yield, so a
#: run always does some work for the start-up cost it paid.
DEFAULT_MIN_HOLD_S = 10.0

#: Yield reasons (the run record's ``last_reason`` of a yielded run).
HOLD_CAP = "hold-cap"
PRESSURE = "pressure"


@dataclass(frozen=True)
class PressureRule:
    """When pressure makes a holder yield. ``target_ratio`` is a staleness ratio, ``min_hold_s``
    seconds."""

    target_ratio: float = DEFAULT_TARGET_RATIO
    min_hold_s: float = DEFAULT_MIN_HOLD_S


@dataclass(frozen=True)
class Pressure:
    """The waiting heavy lane that presses hardest on the lease, as beat saw it at ``at``.

    ``last_run_at`` is the lane's last run end (None: it never ran, so it is maximally stale):
    with the cadence its ratio at any later instant follows, since a waiting lane cannot run
    while the lease is held. ``fence`` is the lease hold it presses on."""

    lane: str
    cadence_s: float
    last_run_at: float | None
    priority0: bool
    fence: int
    at: float

    def ratio(self, now: float) -> float:
        """The pressing lane's staleness ratio at ``now``."""
        return staleness_ratio(self.last_run_at, self.cadence_s, now)

    def presses(self, now: float, rule: PressureRule) -> bool:
        """Is this pressure enough to yield for, at ``now``?"""
        return self.priority0 or self.ratio(now) >= rule.target_ratio


def measure(decision: Decision, states: Mapping[str, LaneState], lease: LeaseView | None,
            now: float, *, legacy: bool = False) -> Pressure | None:
    """The pressure on the lease at ``now``: among the heavy lanes the decision found due and
    waiting (not the holder), leaving out those a soft gate would still defer once the lease is
    free, the one the staleness picker would choose. None when the lease is free or nobody
    waits."""
    if lease is None:
        return None
    # The views decide judged gates on (family views, paused blockers): a lane they hold back
    # once the lease is free must not make the holder yield.
    gate_views = decision.gate_views
    empty = EMPTY_STATE
    waiting = []
    holder, heavy = lease.lane, LaneKind.HEAVY
    for view in decision.views.values():
        spec = view.spec
        if spec.kind is not heavy or not view.due or view.in_flight or view.name == holder:
            # (The holder itself: a lease granted this tick is not yet in its view.)
            continue
        # A lane without gates has none to defer it (gates.evaluate would say so): a tick
        # with 10,000 waiting lanes asks this 10,000 times.
        if spec.gates:
            deferral = states.get(view.name, empty).sched.deferral
            gate, _ = gates.evaluate(view, gate_views, deferral, now, legacy=legacy)
            if gate is not None:
                continue
        waiting.append(view)
    best = pick(waiting)
    if best is None:
        return None
    state = states.get(best.name, empty)
    if best.spec.calendar is not None:
        # A calendar lane's ratio is measured on its period around now; while it waits it
        # grows by about one per nominal period, so it is published as the last run that
        # gives today's ratio on that period (workers extrapolate as for a cadence lane).
        last: float | None = now - best.ratio * best.spec.cadence_s
    else:
        last = effective_last_run(state, best.spec.cadence_s, now, best.spec.due_ratio)
    return Pressure(lane=best.name, cadence_s=best.spec.cadence_s,
                    last_run_at=last,
                    priority0=best.spec.priority0, fence=lease.fence, at=now)


def yield_reason(*, held_s: float, hold_cap_s: float | None, pressure: Pressure | None,
                 rule: PressureRule | None, now: float, fence: int = 0) -> str | None:
    """Should a run that has held the lease ``held_s`` seconds yield at this checkpoint?
    :data:`HOLD_CAP` once it held ``hold_cap_s``; :data:`PRESSURE` once it held
    ``rule.min_hold_s`` and ``pressure`` (on this hold, ``fence``) presses; else None.
    ``rule`` None turns pressure yielding off."""
    if hold_cap_s is not None and held_s >= hold_cap_s:
        return HOLD_CAP
    if rule is None or pressure is None or held_s < rule.min_hold_s:
        return None
    if fence and pressure.fence and pressure.fence != fence:
        return None  # published for another hold
    return PRESSURE if pressure.presses(now, rule) else None


def outranks(new: Pressure | None, old: Pressure | None, now: float,
             spec_of: Callable[[str], LaneSpec | None]) -> bool:
    """Would the picker choose ``new``'s lane over ``old``'s at ``now``? Ranked by the
    picker's own key (priority-0, ratio, declared order, name) on each lane's spec
    (``spec_of``; a lane it no longer knows ranks last)."""
    if new is None:
        return False
    new_spec = spec_of(new.lane)
    if new_spec is None:
        return False
    old_spec = spec_of(old.lane) if old is not None else None
    if old is None or old_spec is None:
        return True
    return rank_key(_view(new, new_spec, now)) < rank_key(_view(old, old_spec, now))


def _view(pressure: Pressure, spec: LaneSpec, now: float) -> LaneView:
    """The pressing lane as the picker sees it (due and waiting)."""
    return LaneView(spec=spec, ratio=pressure.ratio(now), backlog=0, due=True,
                    in_flight=False, never_run=pressure.last_run_at is None)


def changed(old: Pressure | None, new: Pressure | None) -> bool:
    """Does ``new`` say something ``old`` did not? ``at`` aside: a lane waiting on the same
    hold since the same last run presses the same way whenever beat looks again (its ratio
    follows from cadence and last run), so beat republishes only when this is True."""
    if old is None or new is None:
        return old is not new
    return replace(old, at=0.0) != replace(new, at=0.0)


@dataclass(frozen=True)
class PressureYield:
    """A run that stopped at a checkpoint because ``pressure.lane`` pressed: who yielded
    (``lane``, ``task_id``, ``fence``), after holding the lease ``held_s`` seconds, at ``at``,
    when the pressing lane's ratio was ``ratio``."""

    lane: str
    task_id: str
    fence: int
    held_s: float
    at: float
    pressing: str
    ratio: float


def yielded(*, lane: str, task_id: str, fence: int, held_s: float, now: float,
            pressure: Pressure) -> PressureYield:
    """The record of a pressure yield at ``now`` (the ratio capped so it stays finite JSON)."""
    ratio = pressure.ratio(now)
    return PressureYield(lane=lane, task_id=task_id, fence=fence, held_s=held_s, at=now,
                         pressing=pressure.lane, ratio=ratio if ratio < 1e9 else 1e9)


def encode_yield(record: PressureYield) -> str:
    """The ``last-yield`` field (versioned JSON)."""
    return codec.dumps({"lane": record.lane, "task_id": record.task_id, "fence": record.fence,
                        "held_s": record.held_s, "at": record.at, "pressing": record.pressing,
                        "ratio": record.ratio}, PRESSURE_VERSION)


def decode_yield(raw: str | bytes | None, key: str) -> PressureYield | None:
    """Parse the ``last-yield`` field; None when absent. Raises :class:`StateError`."""
    if raw is None:
        return None
    data: dict[str, Any] = codec.loads(raw, key, PRESSURE_VERSION)
    try:
        return PressureYield(lane=str(data["lane"]), task_id=str(data["task_id"]),
                             fence=int(data["fence"]), held_s=float(data["held_s"]),
                             at=float(data["at"]), pressing=str(data["pressing"]),
                             ratio=float(data["ratio"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise StateError(key, f"pressure yield record missing or bad field ({exc})") from None


def encode(pressure: Pressure | None) -> str:
    """The published record (versioned JSON); ``{"v":1,"lane":null}`` when nobody presses."""
    if pressure is None:
        return codec.dumps({"lane": None}, PRESSURE_VERSION)
    return codec.dumps({"lane": pressure.lane, "cadence_s": pressure.cadence_s,
                        "last_run_at": pressure.last_run_at, "priority0": pressure.priority0,
                        "fence": pressure.fence, "at": pressure.at}, PRESSURE_VERSION)


def decode(raw: str | bytes | None, key: str) -> Pressure | None:
    """Parse a published record; None when absent or nobody presses. Raises
    :class:`StateError` naming ``key`` for garbage or another version."""
    if raw is None:
        return None
    data: dict[str, Any] = codec.loads(raw, key, PRESSURE_VERSION)
    if data.get("lane") is None:
        return None
    try:
        last = data.get("last_run_at")
        return Pressure(lane=str(data["lane"]), cadence_s=float(data["cadence_s"]),
                        last_run_at=None if last is None else float(last),
                        priority0=bool(data.get("priority0", False)),
                        fence=int(data.get("fence", 0)), at=float(data["at"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise StateError(key, f"pressure record missing or bad field ({exc})") from None


__all__ = [
    "DEFAULT_MIN_HOLD_S",
    "DEFAULT_TARGET_RATIO",
    "HOLD_CAP",
    "PRESSURE",
    "PRESSURE_VERSION",
    "Pressure",
    "PressureRule",
    "PressureYield",
    "changed",
    "decode",
    "decode_yield",
    "encode",
    "encode_yield",
    "measure",
    "outranks",
    "yield_reason",
    "yielded",
]
