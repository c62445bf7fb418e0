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

from schedproj.core.errors import StateError
from schedproj.core.families import member_spec, split_member
from schedproj.core.health import Health, assess
from schedproj.core.lanes import DeploymentClass, Gate, LaneKind, LaneSpec, Profile
from schedproj.core.laneset import specs_from_registry
from schedproj.core.pressure import Pressure, PressureYield, decode_yield
from schedproj.core.pressure import decode as decode_pressure
from schedproj.core.records import LaneState, LeaseView, SchedRecord, replace
from schedproj.store.lane_store import UNREADABLE_LEASE, parse_states
from schedproj.store.lease import parse_lease
from schedproj.store.protocol import LEASE_ACQUISITIONS, Keys


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
    #: What beat last published as pressing on the lease (None: nobody), the last run that
    #: yielded to pressure, and how many did.
    pressure: Pressure | None = None
    last_pressure_yield: PressureYield | None = None
    pressure_yields: int = 0
    #: The lane families the last beat declared (their spec, named for the family) and how
    #: many members each has; members with state are among ``specs`` and ``states``.
    families: dict[str, LaneSpec] = field(default_factory=dict)
    family_sizes: dict[str, int] = field(default_factory=dict)

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
            now: float | None = None,
            families: list[dict[str, Any]] | None = None) -> Observation:
    """Read everything the operator views need in one round trip."""
    pipe = client.pipeline(transaction=False)
    pipe.get(keys.published_lanes)
    pipe.hgetall(keys.lanes)
    pipe.get(keys.lease)
    pipe.hgetall(keys.errors)
    pipe.hgetall(keys.beat_info)
    pipe.get(keys.beat_lock)
    pipe.get(keys.watchdog)
    pipe.hgetall(keys.counters)
    pipe.smembers(keys.paused)
    pipe.hgetall(keys.pressure)
    replies = pipe.execute(raise_on_error=False)
    for reply in replies[:-1]:
        if isinstance(reply, Exception):
            raise reply
    (raw_registry, raw_lanes, raw_lease, raw_errors, beat, lock, raw_watchdog, counters,
     paused, raw_pressure) = replies
    problems: list[str] = []
    pressure = read_pressure(raw_pressure, keys, problems)
    registry: dict[str, Any] = {}
    if specs is None:
        specs, registry = read_registry(raw_registry, keys, problems)
    states, errors = parse_states(raw_lanes, keys.lanes)
    errors = {**raw_errors, **errors}
    if families is not None:
        registry = {**registry, "families": families}
    families_, members = family_specs(registry, states, problems)
    specs = (*specs, *members)
    sizes = family_sizes(client, keys, families_)
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
                  if k != LEASE_ACQUISITIONS and str(v).lstrip("-").isdigit()},
        lease_acquisitions=int(counters.get(LEASE_ACQUISITIONS, "0"))
        if str(counters.get(LEASE_ACQUISITIONS, "0")).isdigit() else 0,
        problems=problems, families=families_, family_sizes=sizes, **pressure,
    )


def read_registry(raw: str | None, keys: Keys,
                  problems: list[str]) -> tuple[tuple[LaneSpec, ...], dict[str, Any]]:
    """The lanes (and settings, families) the last beat published; problems noted."""
    if raw is None:
        problems.append("no lane registry in Redis yet: no beat has run with this prefix")
        return (), {}
    try:
        return specs_from_registry(raw, keys.published_lanes)
    except StateError as exc:
        problems.append(str(exc))
        return (), {}


def family_sizes(client: redis.Redis, keys: Keys, families: dict[str, LaneSpec]) -> dict[str, int]:
    """How many members each family has (one round trip)."""
    if not families:
        return {}
    pipe = client.pipeline(transaction=False)
    for name in families:
        pipe.scard(keys.family(name))
    return {name: int(n) for name, n in zip(families, pipe.execute(), strict=True)}


def family_specs(registry: dict[str, Any], states: dict[str, LaneState],
                 problems: list[str]) -> tuple[dict[str, LaneSpec], list[LaneSpec]]:
    """The published families, and the specs of their members that have state."""
    families: dict[str, LaneSpec] = {}
    jitters: dict[str, float] = {}
    for raw in registry.get("families", []):
        try:
            spec = LaneSpec(**{**{k: v for k, v in raw.items() if k != "jitter"},
                               "kind": LaneKind(raw["kind"]),
                               "deployment": DeploymentClass(raw["deployment"]),
                               "gates": tuple(Gate(**g) for g in raw["gates"])})
        except (ValueError, KeyError, TypeError) as exc:
            problems.append(f"unreadable family in the lane registry ({exc})")
            continue
        families[spec.name] = spec
        jitters[spec.name] = float(raw.get("jitter", 0.0))
    members = []
    for lane in states:
        parts = split_member(lane)
        if parts is not None and parts[0] in families:
            members.append(member_spec(families[parts[0]], jitters[parts[0]], parts[1]))
    return families, members


def read_pressure(raw: Any, keys: Keys, problems: list[str]) -> dict[str, Any]:
    """The pressure hash's fields as :class:`Observation` fields; what cannot be read is
    noted in ``problems`` and left out."""
    if isinstance(raw, Exception):
        problems.append(f"{keys.pressure}: unreadable ({raw}); delete the key")
        return {}
    out: dict[str, Any] = {}
    for name, fld, decode in (("pressure", "current", decode_pressure),
                              ("last_pressure_yield", "last-yield", decode_yield)):
        try:
            out[name] = decode(raw.get(fld), f"{keys.pressure} field {fld}")
        except StateError as exc:
            problems.append(str(exc))
    count = str(raw.get("yields", "0"))
    out["pressure_yields"] = int(count) if count.isdigit() else 0
    return out
