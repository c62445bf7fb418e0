"""Read-only views of a deployment's durable state, shared by status, metrics and watchdog.

Everything here reads Redis only (lane records, lease, registry, watchdog latch, counters), so
it works from any machine that reaches Redis, without the lanes' code.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from schedproj.core.errors import SchedprojError, StateError
from schedproj.core.families import member_spec, split_member
from schedproj.core.health import UNDISPATCHED_AFTER_S, Health, assess
from schedproj.core.lanes import DeploymentClass, Gate, LaneKind, LaneSpec, Profile
from schedproj.core.laneset import specs_from_registry
from schedproj.core.pools import DEFAULT_POOL, Pool
from schedproj.core.pressure import Pressure, PressureYield, decode_yield
from schedproj.core.pressure import decode as decode_pressure
from schedproj.core.records import LaneState, LeaseView, SchedRecord, replace
from schedproj.core.schedules import from_text
from schedproj.store.lane_store import UNREADABLE_LEASE, parse_states
from schedproj.store.lease import PoolSlots, parse_lease
from schedproj.store.protocol import LEASE_ACQUISITIONS, Keys
from schedproj.telemetry.sanity import as_count, as_number, bad_field, shown, watchdog_problem


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
    #: The due index's next look (epoch seconds) of each calendar lane whose fire times this
    #: process cannot compute (a custom Celery schedule read from the registry as its text):
    #: what the tools show as its next fire.
    next_looks: dict[str, float] = field(default_factory=dict)
    #: The slot count of each pool beyond the default the last beat declared, each such
    #: pool's slot leases (None: free; garbage reads as busy by nobody known) and the
    #: pressure on its holders (the ``pressure``, ``last_pressure_yield`` and
    #: ``pressure_yields`` of the pool's own hash).
    pools: dict[str, int] = field(default_factory=dict)
    slots: dict[str, list[LeaseView | None]] = field(default_factory=dict)
    pool_pressure: dict[str, dict[str, Any]] = field(default_factory=dict)

    def health(self, *, starvation_threshold_s: float | None = None,
               hold_cap_s: float | None = None, profile: Profile | None = None,
               undispatched_after_s: float | None = None) -> Health:
        reg = self.registry
        published = reg.get("profile")
        return assess(
            self.specs, self.states, self.lease, self.now,
            profile or (Profile(published) if published in set(Profile) else Profile.LOCAL),
            starvation_threshold_s=starvation_threshold_s
            or positive(reg.get("starvation_threshold_s"), 3600.0),
            hold_cap_s=hold_cap_s or positive(reg.get("hold_cap_s"), 1800.0),
            unreadable=[k for k in self.errors if not k.startswith("<")]
            + (["<lease>"] if "<lease>" in self.errors else []),
            beat_since=positive(self.beat.get("since"), 0.0) or None,
            undispatched_after_s=undispatched_after_s or UNDISPATCHED_AFTER_S,
            pools=self.pools, slots=self.slots,
        )


#: What :func:`observe` reads: (Keys attribute, command, the Redis type it expects, the value
#: an absent key reads as). A key of another type is reported and read as that empty value.
READS: tuple[tuple[str, str, str, Any], ...] = (
    ("published_lanes", "get", "string", None), ("lanes", "hgetall", "hash", {}),
    ("lease", "get", "string", None), ("errors", "hgetall", "hash", {}),
    ("beat_info", "hgetall", "hash", {}), ("beat_lock", "get", "string", None),
    ("watchdog", "get", "string", None), ("counters", "hgetall", "hash", {}),
    ("paused", "smembers", "set", set()), ("pressure", "hgetall", "hash", {}),
)


def wrong_type(client: redis.Redis, key: str, expected: str, exc: Exception) -> str:
    """The problem line for a key Redis refused to read as ``expected`` (WRONGTYPE)."""
    try:
        found = str(client.type(key))
    except redis.ResponseError:
        found = "another type"
    return (f"Redis key {key!r} is unreadable: it holds a {found} where schedproj keeps a "
            f"{expected} ({exc}); reported and read as empty, not a Redis outage. Fix: inspect "
            f"it (redis-cli TYPE/DUMP) and delete it (redis-cli DEL {key}); schedproj writes it "
            "again")


def read_all(client: redis.Redis, keys: Keys, problems: list[str]) -> dict[str, Any]:
    """Every key of :data:`READS` in one round trip, by attribute. Connection errors raise
    (Redis is unreachable); a key of the wrong type is reported in ``problems``."""
    pipe = client.pipeline(transaction=False)
    for attr, command, _, _ in READS:
        getattr(pipe, command)(getattr(keys, attr))
    out: dict[str, Any] = {}
    for (attr, _, expected, empty), reply in zip(READS, pipe.execute(raise_on_error=False),
                                                 strict=True):
        if isinstance(reply, redis.ResponseError):
            problems.append(wrong_type(client, getattr(keys, attr), expected, reply))
            reply = empty
        elif isinstance(reply, Exception):
            raise reply
        out[attr] = reply
    return out


def positive(value: Any, default: float) -> float:
    """A published setting, if it is a positive number; else the default."""
    number = as_number(value)
    return number if number is not None and number > 0 else default


def observe(client: redis.Redis, keys: Keys, specs: tuple[LaneSpec, ...] | None = None,
            now: float | None = None,
            families: list[dict[str, Any]] | None = None) -> Observation:
    """Read everything the operator views need in one round trip. Whatever a key holds, this
    returns: what cannot be used is named in ``problems`` or ``errors`` and left out."""
    problems: list[str] = []
    raw = read_all(client, keys, problems)
    pressure = read_pressure(raw["pressure"], keys, problems)
    registry: dict[str, Any] = {}
    if specs is None:
        specs, registry = read_registry(raw["published_lanes"], keys, problems)
    states, errors = parse_states(raw["lanes"], keys.lanes)
    errors = {**raw["errors"], **errors, **drop_insane(states, keys.lanes)}
    if families is not None:
        registry = {**registry, "families": families}
    families_, members = family_specs(registry, states, problems, keys.published_lanes)
    specs = (*specs, *members)
    for lane in raw["paused"]:  # an operator's pause lives apart from beat's records
        state = states.get(lane, LaneState())
        states[lane] = replace(state, sched=replace(state.sched or SchedRecord(), paused=True))
    lease = read_lease(raw["lease"], keys, errors)
    beat = read_beat_info(raw["beat_info"], keys, problems)
    counters, acquisitions = read_counters(raw["counters"], keys, problems)
    pools = read_pools(registry if "pools" in registry else
                       pools_of_registry(raw["published_lanes"], keys), keys, problems)
    slots, pool_pressure = read_slots(client, keys, pools, problems)
    return Observation(
        now=time.time() if now is None else now, specs=tuple(specs), registry=registry,
        states=states, lease=lease, errors=errors, beat=beat,
        beat_lock_held=raw["beat_lock"] is not None
        and raw["beat_lock"] == raw["beat_info"].get("token"),
        watchdog=read_watchdog(raw["watchdog"], keys, problems),
        counters=counters, lease_acquisitions=acquisitions, problems=problems,
        families=families_, family_sizes=family_sizes(client, keys, families_, problems),
        next_looks=next_looks(client, keys, specs, time.time() if now is None else now,
                              problems),
        pools=pools, slots=slots, pool_pressure=pool_pressure,
        **pressure,
    )


def pools_of_registry(raw: str | None, keys: Keys) -> dict[str, Any]:
    """The registry's settings (its pools among them) when the caller gave the specs and the
    registry was not read for them (beat's metrics); an unreadable registry is reported where
    it is read for the lanes, so here it reads as no pools."""
    if raw is None or '"pools"' not in raw:   # no pools beyond the default: skip the parse
        return {}
    try:
        return specs_from_registry(raw, keys.published_lanes)[1]
    except StateError:
        return {}


def read_pools(registry: dict[str, Any], keys: Keys, problems: list[str]) -> dict[str, int]:
    """The pools beyond the default the registry declares, with their slot counts; an entry
    that is not a pool is reported and left out."""
    declared = registry.get("pools") or {}
    if not isinstance(declared, dict):
        problems.append(f"Redis key {keys.published_lanes!r}: pools = {shown(declared)} is not "
                        "a map of pool to slots: left out. Fix: restart beat (it publishes "
                        "the lane set again)")
        return {}
    pools = {}
    for name, slots in sorted(declared.items()):
        count = as_count(slots)
        if name == DEFAULT_POOL:
            continue
        if count is None or count > MAX_SLOTS_SHOWN or not _is_pool(name, count):
            problems.append(f"Redis key {keys.published_lanes!r}: pool {shown(name)} with "
                            f"{shown(slots)} slots is not a pool: left out. Fix: restart beat "
                            "(it publishes the lane set again)")
            continue
        pools[name] = count
    return pools


#: More slots than this in one pool is garbage in the registry, not a pool: reading that many
#: slot keys on every status read would be the outage.
MAX_SLOTS_SHOWN = 4096


def _is_pool(name: Any, slots: int) -> bool:
    try:
        Pool(name, slots=slots)
    except (SchedprojError, ValueError, TypeError):
        return False
    return True


def read_slots(client: redis.Redis, keys: Keys, pools: dict[str, int], problems: list[str],
               ) -> tuple[dict[str, list[LeaseView | None]], dict[str, dict[str, Any]]]:
    """Every slot lease of ``pools`` (one MGET) and each pool's pressure hash (one round
    trip); a pressure hash of the wrong type is reported and read as empty."""
    if not pools:
        return {}, {}
    slots = PoolSlots(client, keys, {n: Pool(n, slots=c) for n, c in pools.items()}).read()
    pipe = client.pipeline(transaction=False)
    for name in pools:
        pipe.hgetall(keys.slot(name, 0).pressure)
    pressure = {}
    for name, reply in zip(pools, pipe.execute(raise_on_error=False), strict=True):
        hash_key = keys.slot(name, 0)
        if isinstance(reply, redis.ResponseError):
            problems.append(wrong_type(client, hash_key.pressure, "hash", reply))
            reply = {}
        elif isinstance(reply, Exception):
            raise reply
        pressure[name] = read_pressure(reply, hash_key, problems)
    return slots, pressure


def next_looks(client: redis.Redis, keys: Keys, specs: tuple[LaneSpec, ...], now: float,
               problems: list[str]) -> dict[str, float]:
    """The due index's next look of the calendar lanes whose next fire is unknown here (one
    round trip, none when there are no such lanes); a due index of the wrong type is
    reported."""
    opaque = [s.name for s in specs
              if s.calendar is not None and not math.isfinite(s.calendar.next_fire(now))]
    if not opaque:
        return {}
    try:
        scores = client.zmscore(keys.due, opaque)
    except redis.ResponseError as exc:
        problems.append(wrong_type(client, keys.due, "zset", exc))
        return {}
    return {lane: float(score) for lane, score in zip(opaque, scores, strict=True)
            if score is not None and math.isfinite(float(score))}


def drop_insane(states: dict[str, LaneState], key: str) -> dict[str, str]:
    """Take out the lanes whose records hold a number no tool can use (a huge integer the
    codec let through); their errors, by lane."""
    errors = {}
    for lane, state in list(states.items()):
        problem = bad_field(state)
        if problem is not None:
            del states[lane]
            errors[lane] = (f"state at Redis key {key!r} of lane {lane!r}: {problem}. Fix: "
                            f"delete the lane's fields (redis-cli HDEL {key} '{lane}|run' "
                            f"'{lane}|sched'); the lane is then scheduled afresh")
    return errors


def read_lease(raw: Any, keys: Keys, errors: dict[str, str]) -> LeaseView | None:
    """The lease record; an unreadable one is an error under ``<lease>``."""
    try:
        lease = parse_lease(raw, keys.lease)
        problem = bad_field(lease)
        if problem is not None:
            raise StateError(keys.lease, problem)
    except StateError as exc:
        errors["<lease>"] = str(exc)
        return UNREADABLE_LEASE
    return lease


def read_beat_info(raw: dict[str, str], keys: Keys, problems: list[str]) -> dict[str, str]:
    """What the active beat says of itself, without its lock token (a secret: whoever has it
    can act as the active beat) and without a start time that is not a time."""
    beat = {k: v for k, v in raw.items() if k != "token"}
    if "token" in raw:
        # The beat's short id, as its log lines and the dispatch log name it; the rest of the
        # token stays secret.
        beat["id"] = str(raw["token"])[:8]
    if "since" in beat and as_number(beat["since"]) is None:
        problems.append(f"Redis key {keys.beat_info!r} field since = {shown(beat.pop('since'))}"
                        " is not a time: reported and left out. Fix: restart beat (it "
                        "rewrites the key) or delete the key")
    return beat


def read_watchdog(raw: str | None, keys: Keys, problems: list[str]) -> dict[str, Any] | None:
    """The watchdog latch, if it is one; what is not is reported and left out."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        data = raw
    problem = watchdog_problem(data)
    if problem is not None:
        problems.append(f"{keys.watchdog}: unreadable watchdog record ({problem}). Fix: "
                        f"delete the key (redis-cli DEL {keys.watchdog}); the watchdog lane "
                        "writes it again")
        return None
    return dict(data)


def read_counters(raw: dict[str, str], keys: Keys,
                  problems: list[str]) -> tuple[dict[str, int], int]:
    """(the labelled counters, the lease grants); a field that is not a count is reported."""
    counters: dict[str, int] = {}
    for name, value in raw.items():
        count = as_count(value)
        if count is None:
            problems.append(f"Redis key {keys.counters!r} field {name!r} = {shown(value)} is "
                            f"not a count: reported and left out. Fix: redis-cli HDEL "
                            f"{keys.counters} '{name}' (the count starts again from 0)")
            continue
        counters[name] = count
    return ({k: v for k, v in counters.items() if k != LEASE_ACQUISITIONS},
            max(0, counters.get(LEASE_ACQUISITIONS, 0)))


def read_registry(raw: str | None, keys: Keys,
                  problems: list[str]) -> tuple[tuple[LaneSpec, ...], dict[str, Any]]:
    """The lanes (and settings, families) the last beat published; problems noted. A lane
    whose spec holds a value no tool can use (a cadence of 0 or 1e400) is reported and left
    out."""
    if raw is None:
        problems.append(f"no lane registry in Redis ({keys.published_lanes!r}): no beat has "
                        "run with this prefix, or the key was deleted (the active beat "
                        "publishes it again within SCHEDPROJ_DERIVED_RECONCILE_S; restarting "
                        "beat publishes it at once)")
        return (), {}
    try:
        specs, registry = specs_from_registry(raw, keys.published_lanes)
    except StateError as exc:
        problems.append(str(exc))
        return (), {}
    usable = []
    for spec in specs:
        problem = bad_field(spec) or (None if (as_number(spec.cadence_s) or 0) > 0
                                      else "cadence_s is not above 0")
        if problem is None:
            usable.append(spec)
        else:
            problems.append(f"Redis key {keys.published_lanes!r}: lane {spec.name!r} has "
                            f"{problem}: left out. Fix: restart beat (it publishes the lane "
                            "set again)")
    return tuple(usable), registry


def family_sizes(client: redis.Redis, keys: Keys, families: dict[str, LaneSpec],
                 problems: list[str]) -> dict[str, int]:
    """How many members each family has (one round trip); a member set of the wrong type is
    reported and counts 0."""
    if not families:
        return {}
    pipe = client.pipeline(transaction=False)
    for name in families:
        pipe.scard(keys.family(name))
    sizes = {}
    for name, n in zip(families, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(n, redis.ResponseError):
            problems.append(wrong_type(client, keys.family(name), "set", n))
        elif isinstance(n, Exception):
            raise n
        sizes[name] = n if isinstance(n, int) else 0
    return sizes


def family_specs(registry: dict[str, Any], states: dict[str, LaneState], problems: list[str],
                 key: str = "the lane registry",
                 ) -> tuple[dict[str, LaneSpec], list[LaneSpec]]:
    """The published families, and the specs of their members that have state."""
    families: dict[str, LaneSpec] = {}
    jitters: dict[str, float] = {}
    declared = registry.get("families", [])
    for raw in declared if isinstance(declared, list) else [declared]:
        try:
            spec = LaneSpec(**{**{k: v for k, v in raw.items() if k != "jitter"},
                               "kind": LaneKind(raw["kind"]),
                               "deployment": DeploymentClass(raw["deployment"]),
                               "gates": tuple(Gate(**g) for g in raw["gates"]),
                               # A calendar family's schedule is stored as its text.
                               "calendar": (None if raw.get("calendar") is None
                                            else from_text(str(raw["calendar"])))})
            jitter = as_number(raw.get("jitter", 0.0))
            problem = bad_field(spec) or (None if (as_number(spec.cadence_s) or 0) > 0
                                          and jitter is not None and 0 <= jitter <= 0.5
                                          else "a cadence or jitter out of range")
            if problem is not None:
                raise ValueError(problem)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            problems.append(f"unreadable family in the lane registry at Redis key {key!r} "
                            f"({exc}): left out. Fix: restart beat (it publishes the lane set "
                            "again)")
            continue
        families[spec.name] = spec
        jitters[spec.name] = jitter or 0.0
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
    count = as_count(raw.get("yields", "0"))
    if count is None:
        problems.append(f"Redis key {keys.pressure!r} field yields = "
                        f"{shown(raw.get('yields'))} is not a count: reported, read as 0")
    out["pressure_yields"] = max(0, count or 0)
    return out
