"""Read-only views of a deployment's durable state, shared by status, metrics and watchdog.

Everything here reads Redis only (lane records, lease, registry, watchdog latch, counters), so
it works from any machine that reaches Redis, without the lanes' code.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from schedproj.errors import StateError
from schedproj.health import Health, assess
from schedproj.keys import Keys
from schedproj.lanes import LaneSpec
from schedproj.lease import parse_lease
from schedproj.registry import specs_from_registry
from schedproj.settings import Profile
from schedproj.state import LaneState, LeaseView, SchedRecord, replace
from schedproj.store import UNREADABLE_LEASE, parse_states


@dataclass(frozen=True)
class Observation:
    """One consistent-enough read of a deployment (one pipeline round trip)."""

    now: float
    specs: tuple[LaneSpec, ...]
    registry: dict[str, Any]
    states: dict[str, LaneState]
    lease: LeaseView | None
    errors: dict[str, str]
    beat: dict[str, str]
    beat_lock_held: bool
    watchdog: dict[str, Any] | None
    counters: dict[str, int]
    lease_acquisitions: int
    problems: list[str] = field(default_factory=list)

    def health(self, *, starvation_threshold_s: float | None = None,
               hold_cap_s: float | None = None, profile: Profile | None = None) -> Health:
        reg = self.registry
        return assess(
            self.specs, self.states, self.lease, self.now,
            profile or Profile(reg.get("profile", Profile.LOCAL.value)),
            starvation_threshold_s=starvation_threshold_s
            or float(reg.get("starvation_threshold_s", 3600.0)),
            hold_cap_s=hold_cap_s or float(reg.get("hold_cap_s", 1800.0)),
            unreadable=[k for k in self.errors if not k.startswith("<")]
            + (["<lease>"] if "<lease>" in self.errors else []),
        )


def observe(client: redis.Redis, keys: Keys, specs: tuple[LaneSpec, ...] | None = None,
            now: float | None = None) -> Observation:
    """Read everything the operator views need in one round trip."""
    pipe = client.pipeline(transaction=False)
    pipe.get(keys.registry)
    pipe.hgetall(keys.lanes)
    pipe.get(keys.lease)
    pipe.hgetall(keys.errors)
    pipe.hgetall(keys.beat_info)
    pipe.get(keys.beat_lock)
    pipe.get(keys.watchdog)
    pipe.hgetall(keys.counters)
    pipe.smembers(keys.paused)
    (raw_registry, raw_lanes, raw_lease, raw_errors, beat, lock, raw_watchdog, counters,
     paused) = pipe.execute()
    problems: list[str] = []
    registry: dict[str, Any] = {}
    if specs is None:
        specs = ()
        if raw_registry is None:
            problems.append("no lane registry in Redis yet: no beat has run with this prefix")
        else:
            try:
                specs, registry = specs_from_registry(raw_registry, keys.registry)
            except StateError as exc:
                problems.append(str(exc))
    states, errors = parse_states(raw_lanes, keys.lanes)
    errors = {**raw_errors, **errors}
    for lane in paused:  # an operator's pause lives apart from beat's records
        state = states.get(lane, LaneState())
        states[lane] = replace(state, sched=replace(state.sched or SchedRecord(), paused=True))
    try:
        lease = parse_lease(raw_lease, keys.lease)
    except StateError as exc:
        errors["<lease>"] = str(exc)
        lease = UNREADABLE_LEASE
    watchdog = None
    if raw_watchdog is not None:
        try:
            watchdog = json.loads(raw_watchdog)
        except ValueError:
            problems.append(f"{keys.watchdog}: unreadable watchdog record")
    return Observation(
        now=time.time() if now is None else now, specs=tuple(specs), registry=registry,
        states=states, lease=lease, errors=errors, beat=beat,
        beat_lock_held=lock is not None and lock == beat.get("token"),
        watchdog=watchdog,
        counters={k: int(v) for k, v in counters.items()
                  if k != "lease_acquisitions" and str(v).lstrip("-").isdigit()},
        lease_acquisitions=int(counters.get("lease_acquisitions", "0"))
        if str(counters.get("lease_acquisitions", "0")).isdigit() else 0,
        problems=problems,
    )
