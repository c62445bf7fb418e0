"""Stall observability, computed from durable state (ADR 0022 AC-3). Pure: state and ``now`` in.

"Is the chain draining to idle?" is answered from what Redis holds — lane records, deferral
streaks, the lease — never from a process's memory, so the answer survives restarts and is
the same from any machine.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from schedproj.core.due import calendar_last_run, due_at
from schedproj.core.lanes import LaneSpec, Profile, enabled_under, queue_for
from schedproj.core.pools import DEFAULT_POOL
from schedproj.core.records import LaneState, LeaseView
from schedproj.core.views import view_lane

#: A lane due this long (seconds) with no dispatch, no deferral recorded and no pause is
#: "undispatched": scheduling stopped for it, whatever the cause (beat frozen or gone, its lock
#: held by a stranger, a broken key, a lost index). Longer than a beat failover (the lock TTL)
#: plus the quarantine after a state loss, so a recovery that works is never flagged.
UNDISPATCHED_AFTER_S = 60.0
#: A heavy calendar lane whose last this many fire times in a row passed their catch-up window
#: unrun (``catchup_window_s``) is "missing": kept from its fire times — behind other heavy
#: work, or with no beat — so the posture is degraded. One miss is a late night; two in a row
#: is a pattern, and with a daily schedule waiting for a third would take another day.
MISSED_IN_A_ROW = 2
#: A pool's waiters are named up to this many (the top-ranked first); all are counted. A
#: family of 10,000 members in one pool would otherwise make every status read a list of
#: 10,000 names.
WAITERS_NAMED = 20


class Posture(StrEnum):
    """The starvation watchdog's verdict."""

    #: Nothing has waited past the threshold and the lease is within its hold cap.
    HEALTHY = "healthy"
    #: A lane (heavy or light, deferred behind the lease, a gate or the pick) has waited
    #: undispatched past the threshold, or the lease (or a pool's slot) is held past the hold
    #: cap, or a lane has
    #: been due past :data:`UNDISPATCHED_AFTER_S` with beat neither dispatching nor deferring
    #: it, or a heavy calendar lane missed :data:`MISSED_IN_A_ROW` fire times in a row.
    DEGRADED = "degraded"
    #: State could not be read (or no lanes): no verdict.
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class LeaseGauge:
    holder: str
    fence: int
    granted_at: float
    started_at: float | None
    held_s: float


@dataclass(frozen=True)
class SlotGauge:
    """One busy slot of a pool: its index, the lane holding it (``""``: a record nobody can
    read, which still counts as busy), its fence and how long it has been held."""

    slot: int
    holder: str
    fence: int
    granted_at: float
    started_at: float | None
    held_s: float


@dataclass(frozen=True)
class PoolGauge:
    """A pool at one instant: its slots, the busy ones with their holders, and its waiters:
    the lanes of the pool that are due, enabled, not paused and hold no slot, ranked as beat
    ranks them (``waiting`` counts them all; ``waiters`` names the first
    :data:`WAITERS_NAMED`)."""

    pool: str
    slots: int
    busy: int
    holders: tuple[SlotGauge, ...]
    waiting: int
    waiters: tuple[str, ...]


@dataclass(frozen=True)
class LaneHealth:
    name: str
    kind: str
    queue: str
    deployment: str
    enabled: bool
    paused: bool
    cadence_s: float
    last_run_at: float | None
    ratio: float
    due: bool
    in_flight: bool
    backlog: int
    last_outcome: str | None
    last_reason: str | None
    runs: int
    failures: int
    dispatches: int
    deferral_reason: str | None
    deferral_blocker: str | None
    deferred_for_s: float | None
    #: Due since then with no dispatch, deferral or pause (None: not due, or beat acted).
    due_since: float | None = None
    #: A calendar lane's schedule in words (``crontab 30 2 * * * Europe/Berlin``); None: a
    #: cadence lane.
    schedule: str | None = None
    #: The IANA zone a calendar lane's fire times are read in (None when not known here).
    timezone: str | None = None
    #: A calendar lane's next fire time after now (None: a cadence lane, a schedule that fires
    #: no more, or one only its own code computes — tools then show the due index's next look).
    next_fire_at: float | None = None
    #: Fire times skipped for the catch-up window, in all, and the latest of them.
    missed: int = 0
    missed_through: float | None = None
    #: Fire times missed in a row since the lane last ran (counted up to
    #: :data:`MISSED_IN_A_ROW`).
    missed_in_a_row: int = 0


@dataclass(frozen=True)
class Health:
    now: float
    lease: LeaseGauge | None
    chain_depth: int
    chain: tuple[str, ...]
    lanes: tuple[LaneHealth, ...]
    starving: tuple[str, ...]
    lease_over_cap: bool
    unreadable: tuple[str, ...]
    #: Lanes due past :data:`UNDISPATCHED_AFTER_S` that beat never acted on (see
    #: ``LaneHealth.due_since``).
    undispatched: tuple[str, ...] = ()
    #: Heavy calendar lanes that missed their last :data:`MISSED_IN_A_ROW` fire times in a
    #: row and are not running now (see ``LaneHealth.missed_in_a_row``).
    missing: tuple[str, ...] = ()
    #: Every pool, the default pool ``heavy`` (the lease) first, then the others by name.
    pools: tuple[PoolGauge, ...] = ()
    #: Slots of the pools beyond the default whose run has held them past the hold cap, as
    #: ``pool:slot`` (the lease's own is ``lease_over_cap``).
    slots_over_cap: tuple[str, ...] = ()

    @property
    def posture(self) -> Posture:
        if self.unreadable or not self.lanes:
            return Posture.UNKNOWN
        if (self.starving or self.lease_over_cap or self.slots_over_cap or self.undispatched
                or self.missing):
            return Posture.DEGRADED
        return Posture.HEALTHY

    @property
    def stalled(self) -> bool:
        return self.posture is Posture.DEGRADED


def deferral_chain(blockers: Mapping[str, str | None]) -> tuple[str, ...]:
    """The longest chain of lanes deferred behind one another, deferred lane first.

    ``golden-path <- dream <- summary <- backfill`` is ``(golden-path, dream, summary,
    backfill)``: depth 3 (the number of links). Cycles cannot occur in valid declarations but
    are cut rather than followed forever.
    """
    best: tuple[str, ...] = ()
    for start in sorted(blockers):
        chain = [start]
        seen = {start}
        nxt = blockers.get(start)
        while nxt is not None and nxt not in seen:
            chain.append(nxt)
            seen.add(nxt)
            nxt = blockers.get(nxt)
        if len(chain) > len(best):
            best = tuple(chain)
    return best


def assess(
    specs: Collection[LaneSpec],
    states: Mapping[str, LaneState],
    lease: LeaseView | None,
    now: float,
    profile: Profile,
    *,
    starvation_threshold_s: float,
    hold_cap_s: float,
    unreadable: Collection[str] = (),
    beat_since: float | None = None,
    undispatched_after_s: float = UNDISPATCHED_AFTER_S,
    pools: Mapping[str, int] | None = None,
    slots: Mapping[str, Sequence[LeaseView | None]] | None = None,
) -> Health:
    """Every gauge the status table, the metrics and the watchdog report. ``beat_since``: when
    the active beat took over (a lane due from before is judged from then). ``pools``: the
    slot count of each pool beyond the default; ``slots``: each such pool's slot leases
    (None: free). A lane of such a pool is in flight while it holds one of them."""
    slots = slots or {}
    held_by = {held.lane: held for leases in slots.values() for held in leases
               if held is not None and held.lane}
    ordered = sorted(specs, key=lambda s: s.sort_key)
    lanes = tuple(_lane_health(s, states.get(s.name, LaneState()),
                               lease if s.pool == DEFAULT_POOL else held_by.get(s.name),
                               now, profile, beat_since)
                  for s in ordered)
    blockers = {h.name: h.deferral_blocker for h in lanes if h.deferral_reason is not None}
    chain = deferral_chain(blockers)
    # Any lane kept waiting, heavy or light, by the lease, the pick or a gate: an unbounded gate
    # (or one bounded past the threshold) starving its consumer is seen here too.
    starving = tuple(h.name for h in lanes
                     if h.enabled and not h.paused
                     and h.deferred_for_s is not None
                     and h.deferred_for_s >= starvation_threshold_s)
    gauge = None
    over_cap = False
    if lease is not None:
        since = lease.started_at if lease.started_at is not None else lease.granted_at
        gauge = LeaseGauge(holder=lease.lane, fence=lease.fence, granted_at=lease.granted_at,
                           started_at=lease.started_at, held_s=max(0.0, now - since))
        over_cap = lease.started_at is not None and gauge.held_s > hold_cap_s
    bad = set(unreadable)
    undispatched = tuple(h.name for h in lanes if h.due_since is not None
                         and now - h.due_since >= undispatched_after_s and h.name not in bad)
    # A heavy calendar lane kept from its fire times: starvation measured in fire times, which
    # a lane whose window is shorter than the starvation threshold never shows as a deferral.
    missing = tuple(h.name for h in lanes
                    if h.kind == "heavy" and h.enabled and not h.paused and not h.in_flight
                    and h.missed_in_a_row >= MISSED_IN_A_ROW and h.name not in bad)
    gauges = pool_gauges(ordered, lanes, lease, now, pools or {}, slots)
    # A pool's run held past the cap is the same stall as the lease's: its pool waits on it.
    slots_over = tuple(f"{pool.pool}:{held.slot}" for pool in gauges if pool.pool != DEFAULT_POOL
                       for held in pool.holders
                       if held.started_at is not None and held.held_s > hold_cap_s)
    return Health(now=now, lease=gauge, chain_depth=max(0, len(chain) - 1), chain=chain,
                  lanes=lanes, starving=starving, lease_over_cap=over_cap,
                  unreadable=tuple(sorted(unreadable)), undispatched=undispatched,
                  missing=missing, pools=gauges, slots_over_cap=slots_over)


def _slot_gauge(index: int, held: LeaseView, now: float) -> SlotGauge:
    since = held.started_at if held.started_at is not None else held.granted_at
    return SlotGauge(slot=index, holder=held.lane, fence=held.fence,
                     granted_at=held.granted_at, started_at=held.started_at,
                     held_s=max(0.0, now - since))


def pool_gauges(specs: Sequence[LaneSpec], lanes: Sequence[LaneHealth],
                lease: LeaseView | None, now: float, pools: Mapping[str, int],
                slots: Mapping[str, Sequence[LeaseView | None]]) -> tuple[PoolGauge, ...]:
    """The default pool (its one slot is the lease), then every other pool by name."""
    table = {DEFAULT_POOL: [lease], **{name: list(slots.get(name, ()))[:count]
                                       + [None] * max(0, count - len(slots.get(name, ())))
                                       for name, count in sorted(pools.items())
                                       if name != DEFAULT_POOL}}
    waiting: dict[str, list[tuple[tuple[int, float, int, str], str]]] = {p: [] for p in table}
    for spec, h in zip(specs, lanes, strict=True):
        if (spec.heavy and spec.pool in waiting and h.due and not h.in_flight
                and h.enabled and not h.paused):
            # Beat's rank (core.picker.rank_key): priority-0, weighted ratio, order, name.
            key = (0 if spec.priority0 else 1, -(spec.weight * h.ratio), spec.order, spec.name)
            waiting[spec.pool].append((key, spec.name))
    out = []
    for name, leases in table.items():
        held = tuple(_slot_gauge(i, x, now) for i, x in enumerate(leases) if x is not None)
        ranked = [lane for _, lane in sorted(waiting[name])]
        out.append(PoolGauge(pool=name, slots=len(leases), busy=len(held), holders=held,
                             waiting=len(ranked), waiters=tuple(ranked[:WAITERS_NAMED])))
    return tuple(out)


def missed_in_a_row(spec: LaneSpec, state: LaneState, now: float,
                    cap: int = MISSED_IN_A_ROW) -> int:
    """How many fire times a calendar lane missed in a row since it last ran (at most ``cap``):
    its fire times after its last run up to the latest one recorded missed
    (``SchedRecord.missed_through``). A lane that never ran missed every one it recorded. A
    schedule only its own code computes (``schedules.OpaqueFireTimes``) counts 1 while a miss
    is newer than its last run: its fire times cannot be walked here."""
    sched = state.sched
    if spec.calendar is None or sched.missed_through is None or not sched.missed:
        return 0
    last = calendar_last_run(spec, state, now)
    if last is None:
        return min(sched.missed, cap)
    if last >= sched.missed_through:
        return 0
    count, fire = 0, spec.calendar.next_fire(last)
    if not math.isfinite(fire):
        return 1
    while fire <= sched.missed_through and count < cap:
        count, fire = count + 1, spec.calendar.next_fire(fire)
    return max(count, 1)


def _due_since(spec: LaneSpec, state: LaneState, now: float,
               beat_since: float | None) -> float | None:
    """Since when the lane has been due with beat not acting on it: the latest of when it fell
    due, beat's last dispatch of it and the active beat's start. Status must never compute
    "due" from the records alone and call it healthy when beat never acted."""
    since = max(due_at(spec, state, now), state.sched.last_dispatch_at or 0.0,
                beat_since or 0.0)
    return since if 0.0 < since <= now else None


def _lane_health(spec: LaneSpec, state: LaneState, lease: LeaseView | None, now: float,
                 profile: Profile, beat_since: float | None = None) -> LaneHealth:
    view = view_lane(spec, state, lease, now)
    run, sched = state.run, state.sched
    deferral = sched.deferral
    enabled = enabled_under(profile, spec.deployment)
    waiting = view.due and not view.in_flight and deferral is None and not sched.paused
    return LaneHealth(
        name=spec.name, kind=spec.kind.value, queue=queue_for(spec.kind, spec.pool),
        deployment=spec.deployment.value, enabled=enabled,
        paused=sched.paused, cadence_s=spec.cadence_s, last_run_at=run.last_run_at,
        ratio=view.ratio, due=view.due,
        in_flight=view.in_flight, backlog=view.backlog,
        last_outcome=run.last_outcome.value if run.last_outcome else None,
        last_reason=run.last_reason, runs=run.runs, failures=run.failures,
        dispatches=sched.dispatches,
        deferral_reason=deferral.reason.value if deferral else None,
        deferral_blocker=deferral.blocker if deferral else None,
        deferred_for_s=max(0.0, now - deferral.since) if deferral else None,
        due_since=_due_since(spec, state, now, beat_since) if enabled and waiting else None,
        **calendar_fields(spec, state, now),
    )


def calendar_fields(spec: LaneSpec, state: LaneState, now: float) -> dict[str, Any]:
    """A calendar lane's schedule, zone, next fire and misses (nothing for a cadence lane)."""
    times = spec.calendar
    if times is None:
        return {}
    zone = getattr(times, "zone", None)   # CronFireTimes: a name; Celery's others: a ZoneInfo
    following = times.next_fire(now)
    return {"schedule": times.text, "timezone": None if zone is None else str(zone),
            "next_fire_at": following if math.isfinite(following) else None,
            "missed": state.sched.missed or 0, "missed_through": state.sched.missed_through,
            "missed_in_a_row": missed_in_a_row(spec, state, now)}
