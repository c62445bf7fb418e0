"""Trace files: a user's own lane set and backlog arrivals, as JSON (docs/simulator.md).

Every problem is reported as a :class:`TraceError` naming the file and the field (a JSON path
such as ``lanes[2].cadence_s``, or the line and column of a syntax error) and the fix.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

from schedproj.core import defaults, pressure
from schedproj.core.errors import LaneDeclarationError
from schedproj.core.families import (
    FamilyError,
    LaneFamily,
    check_key,
    jitter_unit,
    member_spec,
    split_member,
)
from schedproj.core.lanes import (
    DeferralReason,
    DeploymentClass,
    Gate,
    GateCondition,
    Lane,
    LaneKind,
    LaneSpec,
    Profile,
)
from schedproj.core.pools import DEFAULT_POOL, Pool, PoolError
from schedproj.core.schedules import FireTimes, ShiftedFireTimes, fire_times
from schedproj.sim.model import BEAT_PRESSURE, Arrival, Blocked, LaneModel, Scenario, SimError

#: Format version this reader understands (the ``version`` field; optional, default 1).
TRACE_VERSION = 1

TOP_FIELDS = {"version", "name", "description", "tick_s", "hold_cap_s", "horizon_s", "profile",
              "wake_on_release", "lanes", "arrivals", "pressure", "start", "pools"}
LANE_FIELDS = {"name", "kind", "cadence_s", "run_s", "item_s", "batch", "backlog",
               "blocked_backlog", "skip_s", "feeds", "priority0", "order", "backlog_driven",
               "deployment", "gates", "retry_after_failure_s", "retry_window_s",
               "last_run_ago_s", "jitter", "fail_prob", "family", "cron", "timezone",
               "catchup_window_s", "pool", "weight", "slots"}
#: The instant a trace's virtual time zero stands for when it names none (``start``); calendar
#: lanes fire at their wall-clock times counted from it. A Monday, 00:00 UTC.
DEFAULT_START = "2027-01-04T00:00:00Z"
#: A lane with ``family`` is a lane family: one entry, many members (``members``: a count or
#: a list of keys), due at a ratio jittered per key (``jitter``), last runs spread evenly
#: over one cadence by key (``stagger``) or all ``last_run_ago_s`` ago.
FAMILY_FIELDS = {"members", "jitter", "stagger"}
GATE_FIELDS = {"blocker", "when", "reason", "max_defer_s", "in_legacy"}
BLOCKED_FIELDS = {"count", "producer", "per_item"}
ARRIVAL_FIELDS = {"at_s", "lane", "items"}
PRESSURE_FIELDS = {"target_ratio", "min_hold_s"}


class TraceError(SimError):
    """A trace file is unreadable or invalid; the message names the file, the field and the
    fix."""


T = TypeVar("T")


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, problem: str, fix: str) -> TraceError:
        return TraceError(f"trace {self.source}: {where}: {problem}. Fix: {fix}")

    def obj(self, value: Any, where: str, allowed: set[str],
            required: tuple[str, ...] = ()) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected a JSON object, found {_kind(value)}",
                            "write {\"field\": value, ...}")
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise self.fail(f"{where}.{unknown[0]}", "unknown field",
                            f"use only {', '.join(sorted(allowed))}")
        for name in required:
            if name not in value:
                raise self.fail(f"{where}.{name}", "missing", f"give {name}")
        return value

    def number(self, d: Mapping[str, Any], key: str, where: str, default: float | None = None,
               *, positive: bool = False, below: float | None = None) -> float:
        value = d.get(key, default)
        path = f"{where}.{key}"
        if value is None:
            raise self.fail(path, "missing", f"give {key} as a number")
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value):
            raise self.fail(path, f"must be a number, got {value!r}", f"give {key} as a number")
        if value < 0 or (positive and value == 0):
            raise self.fail(path, f"must be {'> 0' if positive else '>= 0'}, got {value!r}",
                            f"give a {'positive' if positive else 'non-negative'} number")
        if below is not None and value >= below:
            raise self.fail(path, f"must be below {below}, got {value!r}",
                            f"give a number in [0, {below})")
        return float(value)

    def optional_number(self, d: Mapping[str, Any], key: str, where: str,
                        *, positive: bool = False) -> float | None:
        if d.get(key) is None:
            return None
        return self.number(d, key, where, positive=positive)

    def integer(self, d: Mapping[str, Any], key: str, where: str, default: int,
                minimum: int = 0) -> int:
        value = d.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(f"{where}.{key}", f"must be an integer >= {minimum}, got {value!r}",
                            f"give {key} as a whole number")
        return value

    def string(self, d: Mapping[str, Any], key: str, where: str,
               default: str | None = None) -> str:
        value = d.get(key, default)
        if not isinstance(value, str) or not value:
            raise self.fail(f"{where}.{key}", f"must be a non-empty string, got {value!r}",
                            f"give {key} as a string")
        return value

    def boolean(self, d: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
        value = d.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(f"{where}.{key}", f"must be true or false, got {value!r}",
                            f"write {key}: true or false")
        return value

    def choice(self, d: Mapping[str, Any], key: str, where: str, enum: Callable[[str], T],
               options: list[str], default: str | None = None) -> T:
        value = d.get(key, default)
        try:
            return enum(value)
        except (ValueError, TypeError):
            raise self.fail(f"{where}.{key}", f"{value!r} is not one of {options}",
                            f"write one of {', '.join(options)}") from None

    def array(self, value: Any, where: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(where, f"expected a JSON array, found {_kind(value)}",
                            "write [ ... ]")
        return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


def load_trace(path: str | Path) -> Scenario:
    """Read a trace file into a :class:`Scenario`."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"trace {p}: cannot read it ({exc.strerror or exc}). Fix: give the "
                         f"path of a readable JSON file") from None
    return parse_trace(text, source=str(p))


def parse_trace(text: str, source: str = "<trace>") -> Scenario:
    """Parse trace JSON text into a :class:`Scenario`."""
    r = _Reader(source)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"trace {source}: line {exc.lineno} column {exc.colno}: not valid "
                         f"JSON ({exc.msg}). Fix: correct the JSON there") from None
    top = r.obj(data, "(top level)", TOP_FIELDS, ("lanes",))
    version = top.get("version", TRACE_VERSION)
    if version != TRACE_VERSION:
        raise r.fail("version", f"format version {version!r}, this schedproj reads "
                                f"{TRACE_VERSION}", f"write \"version\": {TRACE_VERSION}")
    raw_lanes = r.array(top["lanes"], "lanes")
    if not raw_lanes:
        raise r.fail("lanes", "no lanes", "declare at least one lane")
    where_of: dict[str, str] = {}
    parsed: list[tuple[LaneModel, Lane]] = []
    for i, raw in enumerate(raw_lanes):
        where = f"lanes[{i}]"
        model, lane = _lane(r, raw, where)
        if model.name in where_of:
            raise r.fail(f"{where}.name", f"lane {model.name!r} is also {where_of[model.name]}",
                         "give each lane a unique name")
        where_of[model.name] = f"{where} ({model.name})"
        parsed.append((model, lane))
    start = _start(r, top)
    pools = _pools(r, top)
    lanes = _check_declarations(r, parsed, where_of, start, pools)
    arrivals = tuple(_arrival(r, raw, f"arrivals[{i}]")
                     for i, raw in enumerate(r.array(top.get("arrivals", []), "arrivals")))
    try:
        return Scenario(
            name=r.string(top, "name", "(top level)", Path(source).stem or "trace"),
            description=str(top.get("description", "")),
            lanes=tuple(lanes), arrivals=arrivals,
            tick_s=r.number(top, "tick_s", "(top level)", defaults.BEAT_MAX_LOOP_INTERVAL_S,
                            positive=True),
            hold_cap_s=r.number(top, "hold_cap_s", "(top level)", defaults.HOLD_CAP_S,
                                positive=True),
            horizon_s=r.number(top, "horizon_s", "(top level)", 24 * 3600.0, positive=True),
            profile=r.choice(top, "profile", "(top level)", Profile,
                             [p.value for p in Profile], Profile.LOCAL.value),
            wake_on_release=r.boolean(top, "wake_on_release", "(top level)", True),
            pressure=_pressure(r, top), pools=pools,
            params={"source": source, "start": start},
        )
    except TraceError:
        raise
    except SimError as exc:
        raise TraceError(f"trace {source}: {exc}") from None


def _lane(r: _Reader, raw: Any, where: str) -> tuple[LaneModel, Lane]:
    hint = raw.get("name") if isinstance(raw, dict) else None
    if isinstance(hint, str) and hint:
        where = f"{where} ({hint})"
    d = r.obj(raw, where, LANE_FIELDS, ("name", "kind", "run_s"))
    name = r.string(d, "name", where)
    if "cron" in d and "cadence_s" in d:
        raise r.fail(where, "has both cadence_s and cron",
                     "give \"cadence_s\": <seconds> or \"cron\": \"30 2 * * *\"")
    calendar: dict[str, Any] = {}
    if "cron" in d:
        calendar = {"schedule": r.string(d, "cron", where),
                    "timezone": d.get("timezone") and r.string(d, "timezone", where),
                    "catchup_window_s": r.optional_number(d, "catchup_window_s", where)}
    elif "timezone" in d or "catchup_window_s" in d:
        raise r.fail(where, "timezone and catchup_window_s apply to calendar lanes only",
                     "add \"cron\": \"...\" instead of cadence_s, or drop them")
    kind = r.choice(d, "kind", where, LaneKind, [k.value for k in LaneKind])
    gates = tuple(_gate(r, g, f"{where}.gates[{j}]")
                  for j, g in enumerate(r.array(d.get("gates", []), f"{where}.gates")))
    order = d.get("order")
    if order is not None:
        order = r.integer(d, "order", where, 0, minimum=-(2**31))
    feeds = r.array(d.get("feeds", []), f"{where}.feeds")
    for j, f in enumerate(feeds):
        if not isinstance(f, str):
            raise r.fail(f"{where}.feeds[{j}]", f"must be a lane name, got {f!r}",
                         "write the name of a declared lane")
    blocked = None
    if d.get("blocked_backlog") is not None:
        bw = f"{where}.blocked_backlog"
        b = r.obj(d["blocked_backlog"], bw, BLOCKED_FIELDS, ("count", "producer", "per_item"))
        blocked = Blocked(count=r.integer(b, "count", bw, 0),
                          producer=r.string(b, "producer", bw),
                          per_item=r.integer(b, "per_item", bw, 1, minimum=1))
    family = _family(r, d.get("family"), f"{where}.family") if "family" in d else None
    lane_type = LaneFamily if family is not None else Lane
    extra: dict[str, Any] = ({"jitter": family.jitter, "members": _FamilyMembers(family)}
                             if family is not None else {})
    lane = lane_type(
        **extra, **calendar, **_pool_options(r, d, where), name=name, kind=kind,
        cadence_s=None if calendar else r.number(d, "cadence_s", where, positive=True),
        priority0=r.boolean(d, "priority0", where, False),
        deployment=r.choice(d, "deployment", where, DeploymentClass,
                            [c.value for c in DeploymentClass], DeploymentClass.SHARED.value),
        gates=gates, order=order, backlog_driven=r.boolean(d, "backlog_driven", where, False),
        retry_after_failure_s=r.optional_number(d, "retry_after_failure_s", where,
                                                positive=True),
        retry_window_s=r.optional_number(d, "retry_window_s", where, positive=True),
    )
    return LaneModel(
        spec=_placeholder_spec(lane, name), run_s=r.number(d, "run_s", where),
        item_s=r.number(d, "item_s", where, 0.0),
        batch=r.integer(d, "batch", where, 50, minimum=1),
        backlog=r.integer(d, "backlog", where, 0), blocked=blocked,
        skip_s=r.number(d, "skip_s", where, 0.0), feeds=tuple(feeds),
        jitter=r.number(d, "jitter", where, 0.0, below=1.0),
        fail_prob=r.number(d, "fail_prob", where, 0.0, below=1.0),
        last_run_ago_s=r.optional_number(d, "last_run_ago_s", where),
    ), lane


@dataclass(frozen=True)
class FamilyTrace:
    """A trace lane's ``family`` field, as read."""

    keys: tuple[str, ...]
    jitter: float
    stagger: bool


class _FamilyMembers:
    """Carries a family's trace fields through the lane declaration (as its members hook)."""

    def __init__(self, family: FamilyTrace) -> None:
        self.family = family

    def __call__(self) -> tuple[str, ...]:
        return self.family.keys


def _family(r: _Reader, raw: Any, where: str) -> FamilyTrace:
    f = r.obj(raw, where, FAMILY_FIELDS, ("members",))
    members = f["members"]
    if isinstance(members, int) and not isinstance(members, bool) and members > 0:
        keys = tuple(f"m{i:06d}" for i in range(members))
    elif isinstance(members, list) and members:
        keys = tuple(members)
    else:
        raise r.fail(f"{where}.members", f"must be a positive count or a list of keys, got "
                     f"{members!r}", "write \"members\": 1000 or [\"repo-a\", \"repo-b\"]")
    for i, key in enumerate(keys):
        try:
            check_key("trace", key)
        except FamilyError as exc:
            raise r.fail(f"{where}.members[{i}]", exc.problem, exc.fix) from None
    if len(set(keys)) != len(keys):
        raise r.fail(f"{where}.members", "a key is listed twice", "list each key once")
    return FamilyTrace(keys=keys, jitter=r.number(f, "jitter", where, 0.0, below=0.51),
                       stagger=r.boolean(f, "stagger", where, False))


def expand_family(model: LaneModel, template: LaneSpec, family: FamilyTrace) -> list[LaneModel]:
    """One model per member: the family's spec named for the key, its own due ratio, and its
    last run spread over one cadence by key (``stagger``) or the family's."""
    out = []
    for key in family.keys:
        spec = member_spec(template, family.jitter, key)
        ago = model.last_run_ago_s
        if family.stagger:
            ago = max(1.0, jitter_unit(template.name, key) * template.cadence_s)
        out.append(replace(model, spec=spec, last_run_ago_s=ago))
    return out


def _placeholder_spec(lane: Lane, name: str) -> LaneSpec:
    """Replaced by the registry-built spec in :func:`_check_declarations`."""
    return LaneSpec(name=name, task_name=f"trace.{name}", kind=lane.kind,
                    cadence_s=float(lane.cadence_s or 1.0))


def _gate(r: _Reader, raw: Any, where: str) -> Gate:
    g = r.obj(raw, where, GATE_FIELDS, ("blocker",))
    return Gate(
        blocker=r.string(g, "blocker", where),
        when=r.choice(g, "when", where, GateCondition, [c.value for c in GateCondition],
                      GateCondition.DUE_AND_BEHIND.value),
        reason=r.choice(g, "reason", where, DeferralReason, [x.value for x in DeferralReason],
                        DeferralReason.DEPENDENCY.value),
        max_defer_s=r.optional_number(g, "max_defer_s", where, positive=True),
        in_legacy=r.boolean(g, "in_legacy", where, False),
    )


def _pressure(r: _Reader, top: Mapping[str, Any]) -> pressure.PressureRule | None:
    """``"pressure": {"target_ratio": 1.5, "min_hold_s": 10}`` sets the pressure-aware
    yielding rule; absent: beat's default rule (on, as beat runs by default); null: off, runs
    yield at the hold cap alone."""
    if "pressure" not in top:
        return BEAT_PRESSURE
    if top["pressure"] is None:
        return None
    d = r.obj(top["pressure"], "pressure", PRESSURE_FIELDS)
    return pressure.PressureRule(
        target_ratio=r.number(d, "target_ratio", "pressure", pressure.DEFAULT_TARGET_RATIO,
                              positive=True),
        min_hold_s=r.number(d, "min_hold_s", "pressure", pressure.DEFAULT_MIN_HOLD_S))


def _arrival(r: _Reader, raw: Any, where: str) -> Arrival:
    a = r.obj(raw, where, ARRIVAL_FIELDS, ("at_s", "lane", "items"))
    return Arrival(at_s=r.number(a, "at_s", where), lane=r.string(a, "lane", where),
                   items=r.integer(a, "items", where, 0))


def _pool_options(r: _Reader, d: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A lane's ``pool``, ``weight`` and ``slots``, as given (the lane declaration checks
    them as it checks a real lane's)."""
    out: dict[str, Any] = {}
    if "pool" in d:
        out["pool"] = r.string(d, "pool", where)
    if "weight" in d:
        out["weight"] = r.number(d, "weight", where, positive=True)
    if "slots" in d:
        out["slots"] = r.integer(d, "slots", where, 1, minimum=1)
    return out


def _pools(r: _Reader, top: Mapping[str, Any]) -> tuple[Pool, ...]:
    """``"pools": {"gpu": 4}``: the pools beyond the default, with their slots."""
    raw = top.get("pools", {})
    if not isinstance(raw, dict):
        raise r.fail("pools", f"expected a JSON object, found {_kind(raw)}",
                     "write \"pools\": {\"gpu\": 4}")
    pools = []
    for name, slots in raw.items():
        try:
            pools.append(Pool(name, slots))
        except PoolError as exc:
            raise r.fail(f"pools.{name}", exc.problem, exc.fix) from None
    return tuple(pools)


def _start(r: _Reader, top: Mapping[str, Any]) -> float:
    """The ``start`` instant (ISO 8601 with a zone, e.g. ``2027-03-27T00:00:00Z``) in epoch
    seconds: what virtual time zero stands for."""
    text = top.get("start", DEFAULT_START)
    try:
        when = datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise r.fail("start", f"must be an instant with its zone, got {text!r}",
                     "write e.g. \"start\": \"2027-03-27T00:00:00Z\"")
    return when.timestamp()


def _check_declarations(r: _Reader, parsed: list[tuple[LaneModel, Lane]],
                        where_of: Mapping[str, str], start: float = 0.0,
                        pools: tuple[Pool, ...] = ()) -> list[LaneModel]:
    """Validate the declarations with the project's own registry code (cadence, gates naming
    unknown lanes or forming a cycle, priority-0 on a light lane, retry settings) and put the
    specs it builds into the models. Calendar lanes' fire times are counted in seconds after
    ``start`` (virtual time zero) and computed by the same code as beat's."""
    from schedproj.core.laneset import build_lane_set

    tasks = {f"trace.{model.name}": SimpleNamespace(lane=lane) for model, lane in parsed}
    declared = {DEFAULT_POOL, *(p.name for p in pools)}
    for model, lane in parsed:
        if lane.pool is not None and lane.pool not in declared:
            raise r.fail(where_of[model.name], f"names pool {lane.pool!r}, declared nowhere",
                         f"declare it at the top level, \"pools\": {{\"{lane.pool}\": 2}}, "
                         f"or name one of {', '.join(sorted(declared))}")

    def in_virtual_time(schedule: Any, zone: str) -> FireTimes:
        return ShiftedFireTimes(fire_times(schedule, zone), start)

    try:
        lane_set = build_lane_set(tasks, converter=in_virtual_time, pools=pools)
    except LaneDeclarationError as exc:
        raise r.fail(where_of.get(exc.lane, f"lane {exc.lane!r}"), exc.problem,
                     exc.fix) from None
    specs = {s.name: s for s in lane_set.specs}
    out: list[LaneModel] = []
    for model, lane in parsed:
        if isinstance(lane, LaneFamily) and isinstance(lane.members, _FamilyMembers):
            out += expand_family(model, lane_set.families[model.name], lane.members.family)
        else:
            out.append(replace(model, spec=specs[model.name]))
    return out


def _optional_fields(m: LaneModel) -> dict[str, Any]:
    """A trace lane's fields that are left out while they hold their defaults (None)."""
    optional: dict[str, Any] = {
        "item_s": m.item_s or None, "batch": m.batch if m.batch != 50 else None,
        "backlog": m.backlog or None, "skip_s": m.skip_s or None,
        "feeds": list(m.feeds) or None, "priority0": m.spec.priority0 or None,
        "backlog_driven": m.spec.backlog_driven or None,
        "deployment": (m.spec.deployment.value
                       if m.spec.deployment is not DeploymentClass.SHARED else None),
        "retry_after_failure_s": m.spec.retry_after_failure_s,
        "retry_window_s": m.spec.retry_window_s,
        "last_run_ago_s": m.last_run_ago_s, "jitter": m.jitter or None,
        "fail_prob": m.fail_prob or None,
        "pool": m.spec.pool if m.spec.heavy and m.spec.pool != DEFAULT_POOL else None,
        "weight": m.spec.weight if m.spec.weight != 1.0 else None,
        "slots": m.spec.slots if m.spec.slots != 1 else None,
    }
    if m.blocked is not None:
        optional["blocked_backlog"] = {"count": m.blocked.count,
                                       "producer": m.blocked.producer,
                                       "per_item": m.blocked.per_item}
    if m.spec.gates:
        optional["gates"] = [
            {"blocker": g.blocker, "when": g.when.value, "reason": g.reason.value,
             **({"max_defer_s": g.max_defer_s} if g.max_defer_s is not None else {}),
             **({"in_legacy": True} if g.in_legacy else {})}
            for g in m.spec.gates]
    return optional


def _calendar_fields(spec: LaneSpec) -> dict[str, Any]:
    assert spec.calendar is not None
    words = spec.calendar.text.split()   # crontab <five fields> <zone>
    fields: dict[str, Any] = {"cron": " ".join(words[1:6]), "timezone": words[6]}
    if spec.catchup_window_s is not None:
        fields["catchup_window_s"] = spec.catchup_window_s
    return fields


def scenario_to_trace(s: Scenario) -> dict[str, Any]:
    """The trace-file form of a scenario (``load_trace`` reads it back to the same one)."""
    lanes = []
    folded: dict[str, dict[str, Any]] = {}
    for m in s.lanes:
        spec = m.spec
        parts = split_member(spec.name) if spec.family is not None else None
        if parts is not None:
            if parts[0] in folded:
                folded[parts[0]]["family"]["members"].append(parts[1])
                continue
            m = replace(m, spec=replace(spec, name=parts[0]))
            spec = m.spec
        lane: dict[str, Any] = {
            "name": spec.name, "kind": spec.kind.value, "cadence_s": spec.cadence_s,
            "run_s": m.run_s, "order": spec.order,
        }
        if spec.calendar is not None:
            del lane["cadence_s"]
            lane.update(_calendar_fields(spec))
        optional = _optional_fields(m)
        lane.update({k: v for k, v in optional.items() if v is not None})
        if parts is not None:
            # Each member's own due ratio gives back the family's jitter: 1 + j * (2u - 1).
            u = jitter_unit(parts[0], parts[1])
            jitter = 0.0 if u == 0.5 else round((m.spec.due_ratio - 1.0) / (2 * u - 1), 6)
            lane["family"] = {"members": [parts[1]], "jitter": jitter}
            folded[parts[0]] = lane
        lanes.append(lane)
    out: dict[str, Any] = {
        "version": TRACE_VERSION, "name": s.name, "description": s.description,
        "tick_s": s.tick_s, "hold_cap_s": s.hold_cap_s, "horizon_s": s.horizon_s,
        "profile": s.profile.value, "wake_on_release": s.wake_on_release, "lanes": lanes,
    }
    # Written even when off (null): an absent rule reads back as beat's default.
    out["pressure"] = None if s.pressure is None else {"target_ratio": s.pressure.target_ratio,
                                                       "min_hold_s": s.pressure.min_hold_s}
    if s.pools:
        out["pools"] = {p.name: p.slots for p in s.pools}
    if "start" in s.params:
        out["start"] = datetime.fromtimestamp(float(s.params["start"]), UTC).isoformat()
    if s.arrivals:
        out["arrivals"] = [{"at_s": a.at_s, "lane": a.lane, "items": a.items}
                           for a in s.arrivals]
    return out


__all__ = ["TRACE_VERSION", "TraceError", "load_trace", "parse_trace", "scenario_to_trace"]
