"""Find lanes in a Celery app's task registry and validate them as a whole.

There is no second list of lanes: a task with a ``lane=Lane(...)`` option is a lane.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from schedproj.core import codec, defaults
from schedproj.core.calendar import CalendarError
from schedproj.core.errors import LaneDeclarationError, SchedprojError, StateError
from schedproj.core.families import LaneFamily, check_key, member_spec, split_member
from schedproj.core.lanes import DeploymentClass, Gate, Lane, LaneKind, LaneSpec, queue_for
from schedproj.core.pools import DEFAULT_POOL, Pool, declare_pools, pools_by_name
from schedproj.core.schedules import Converter, FireTimes, fire_times, from_text, nominal_period


@dataclass(frozen=True)
class LaneSet:
    """The validated lanes of one app, in declared order, with their tasks' lane options.
    ``families`` are the lane families (their spec is each member's, named for the family);
    a member lane ``family[key]`` resolves through :meth:`spec` and :meth:`option`."""

    specs: tuple[LaneSpec, ...]
    options: Mapping[str, Lane]
    families: Mapping[str, LaneSpec] = field(default_factory=dict)
    #: The pools by name, the default pool ``heavy`` (one slot) always among them.
    pools: Mapping[str, Pool] = field(default_factory=declare_pools)

    def spec(self, name: str) -> LaneSpec:
        found = self.find(name)
        if found is None:
            raise KeyError(name)
        return found

    def find(self, name: str) -> LaneSpec | None:
        """The lane's spec, or None for a lane the set does not know: :meth:`knows` and
        :meth:`spec` in one, which builds a member's spec once, not twice."""
        found = self._by_name.get(name)
        return found if found is not None else self.member_spec(name)

    def member_spec(self, name: str) -> LaneSpec | None:
        """The spec of a member of a declared family (None if ``name`` is not one)."""
        parts = split_member(name)
        if parts is None or parts[0] not in self.families:
            return None
        family, key = parts
        try:
            check_key(family, key)
        except SchedprojError:
            return None
        option = self.options[family]
        jitter = option.jitter if isinstance(option, LaneFamily) else 0.0
        return member_spec(self.families[family], jitter, key)

    def knows(self, name: str) -> bool:
        return self.find(name) is not None

    def option(self, name: str) -> Lane:
        """The lane options of a lane, or of a member's family."""
        parts = split_member(name)
        if name not in self.options and parts is not None:
            return self.options[parts[0]]
        return self.options[name]

    @property
    def _by_name(self) -> dict[str, LaneSpec]:
        index = self.__dict__.get("_index")
        if index is None:  # frozen dataclass: cache the index by hand, once
            index = {s.name: s for s in self.specs}
            object.__setattr__(self, "_index", index)
        return index

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.specs)


def lane_tasks(tasks: Mapping[str, Any]) -> list[tuple[str, Any, Lane]]:
    """(task name, task, lane options) for every task that declares a lane."""
    found = []
    for task_name, task in tasks.items():
        lane = getattr(task, "lane", None)
        if lane is None:
            continue
        if not isinstance(lane, Lane):
            raise LaneDeclarationError(
                task_name, f"the task's lane option is {type(lane).__name__}, not a Lane",
                "declare it as lane=schedproj.Lane(cadence_s=..., ...)",
            )
        found.append((task_name, task, lane))
    return found


def build_lane_set(tasks: Mapping[str, Any], routed_queue: Any = None,
                   cadence_scale: float = 1.0, timezone: str = "UTC",
                   converter: Converter = fire_times,
                   pools: Mapping[str, Pool] | Iterable[Pool] | None = None) -> LaneSet:
    """Validate every lane and the relations between them.

    ``routed_queue(task_name) -> str | None`` tells which queue the app's routing would send a
    task to, so a heavy lane routed elsewhere is caught at start. ``cadence_scale`` multiplies
    every duration a lane declares (cadence, retry delays, gate bounds): demos and tests run
    real lane sets in seconds instead of hours (calendar lanes keep their wall-clock fire
    times). A calendar lane's schedule is read in its own ``timezone`` or else in
    ``timezone`` (the app's) by ``converter`` (the edge's adapts every Celery schedule).
    ``pools`` are the declared pools (``pools.declare_pools``; None: only the default pool):
    a heavy lane must name one of them and fit in it.
    """
    table = pools_by_name(pools)
    specs: list[LaneSpec] = []
    families: dict[str, LaneSpec] = {}
    options: dict[str, Lane] = {}
    owners: dict[str, str] = {}
    for task_name, task, lane in sorted(lane_tasks(tasks), key=lambda t: t[0]):
        name = lane.name or task_name
        lane.check(name)
        if name in owners:
            raise LaneDeclarationError(
                name, f"declared twice, by tasks {owners[name]!r} and {task_name!r}",
                "give each lane a unique name (Lane(name=...) or the task name)",
            )
        _check_name(name)
        owners[name] = task_name
        _check_queue(name, task_name, lane, task, routed_queue)
        _check_pool(name, lane, table)
        options[name] = lane
        spec = _spec(name, task_name, lane, cadence_scale, _calendar(name, lane, timezone,
                                                                     converter))
        if isinstance(lane, LaneFamily):
            families[name] = replace(spec, family=name)
        else:
            specs.append(spec)
    _check_gates(specs, families)
    return LaneSet(specs=tuple(sorted(specs, key=lambda s: s.sort_key)), options=options,
                   families=families, pools=table)


def _check_pool(name: str, lane: Lane, pools: Mapping[str, Pool]) -> None:
    """A heavy lane's pool is declared and has the slots one run takes."""
    pool = pools.get(lane.pool or DEFAULT_POOL)
    if pool is None:
        declared = ", ".join(f"{p.name}={p.slots}" for p in pools.values())
        raise LaneDeclarationError(
            name, f"names pool {lane.pool!r}, which is declared nowhere (pools: {declared})",
            f"declare it (configure_app(app, pools=[Pool({lane.pool!r}, slots=2)]) or "
            f"SCHEDPROJ_POOLS='{lane.pool}=2'), or name a declared pool",
        )
    if lane.slots > pool.slots:
        raise LaneDeclarationError(
            name, f"takes slots={lane.slots} of pool {pool.name!r}, which has {pool.slots}",
            f"give pool {pool.name!r} at least {lane.slots} slots, or the lane "
            f"slots<={pool.slots}",
        )


def _check_name(name: str) -> None:
    if "[" in name or "]" in name or "|" in name:
        raise LaneDeclarationError(
            name, "the name holds '[', ']' or '|', which schedproj uses to name family "
            "members and state fields", "rename the lane (Lane(name=...)) without them")


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else float(value) * scale


def _calendar(name: str, lane: Lane, timezone: str,
              converter: Converter) -> FireTimes | None:
    if lane.schedule is None:
        return None
    try:
        return converter(lane.schedule, lane.timezone or timezone)
    except CalendarError as exc:
        raise LaneDeclarationError(name, exc.problem, exc.fix) from None


def _spec(name: str, task_name: str, lane: Lane, scale: float,
          calendar: FireTimes | None = None) -> LaneSpec:
    gates = tuple(replace(g, max_defer_s=_scaled(g.max_defer_s, scale)) for g in lane.gates)
    cadence = (nominal_period(calendar) if calendar is not None
               else float(lane.cadence_s or 0) * scale)
    return LaneSpec(
        name=name, task_name=task_name, kind=lane.kind,
        cadence_s=cadence, calendar=calendar,
        catchup_window_s=(None if lane.catchup_window_s is None
                          else float(lane.catchup_window_s)),
        priority0=lane.priority0, deployment=lane.deployment, gates=gates,
        order=defaults.DEFAULT_LANE_ORDER if lane.order is None else lane.order,
        backlog_driven=lane.backlog_driven,
        retry_after_failure_s=_scaled(lane.retry_after_failure_s, scale),
        retry_window_s=_scaled(lane.retry_window_s, scale),
        pool=lane.pool or DEFAULT_POOL, weight=float(lane.weight), slots=lane.slots,
    )


def _check_queue(name: str, task_name: str, lane: Lane, task: Any, routed_queue: Any) -> None:
    expected = queue_for(lane.kind, lane.pool)
    declared = getattr(task, "queue", None)
    routed = routed_queue(task_name) if routed_queue is not None else None
    for where, queue in (("its queue option", declared), ("the app's task_routes", routed)):
        if queue is not None and queue != expected:
            raise LaneDeclarationError(
                name, f"is a {lane.kind.value} lane but {where} sends it to queue {queue!r}",
                f"remove the queue setting; schedproj routes {lane.kind.value} lanes to "
                f"{expected!r}",
            )


def _check_gates(specs: Iterable[LaneSpec], families: Mapping[str, LaneSpec]) -> None:
    """Every gate names a declared lane, a family (blocked while any member is due and
    behind) or a member of one; the gates form no cycle (a family counts as one lane)."""
    by_name = {s.name: s for s in specs}
    by_name.update(families)
    for spec in by_name.values():
        for gate in spec.gates:
            parts = split_member(gate.blocker)
            if gate.blocker not in by_name and (parts is None or parts[0] not in families):
                known = ", ".join(sorted(by_name)) or "none"
                raise LaneDeclarationError(
                    spec.name, f"a gate names unknown lane {gate.blocker!r}",
                    f"name one of the declared lanes ({known})",
                )
    cycle = _find_cycle({n: [_owner(g.blocker, families) for g in s.gates]
                         for n, s in by_name.items()})
    if cycle:
        raise LaneDeclarationError(
            cycle[0], "its gates form a cycle " + " -> ".join(cycle),
            "remove one gate of the cycle; lanes waiting on each other would defer forever",
        )


def _owner(blocker: str, families: Mapping[str, LaneSpec]) -> str:
    parts = split_member(blocker)
    return parts[0] if parts is not None and parts[0] in families else blocker


def _find_cycle(edges: Mapping[str, list[str]]) -> list[str] | None:
    """Return one cycle as a path (first node repeated at the end), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, [])):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


REGISTRY_VERSION = 1


def registry_json(lanes: LaneSet, settings: Any) -> str:
    """The lane set as beat publishes it to Redis (versioned), for tools without the code."""
    data = {
        "profile": settings.profile.value,
        "hold_cap_s": settings.hold_cap_s,
        "starvation_threshold_s": settings.starvation_threshold_s,
        "lanes": [_registry_lane(s) for s in lanes.specs],
        "families": [{**_registry_lane(s),
                      "jitter": getattr(lanes.options[s.name], "jitter", 0.0)}
                     for s in getattr(lanes, "families", {}).values()],
    }
    pools = getattr(lanes, "pools", {})
    if set(pools) - {DEFAULT_POOL}:
        # Only when pools beyond the default are declared: the registry of a lane set without
        # them stays byte for byte what the earlier release wrote.
        data["pools"] = {name: pool.slots for name, pool in sorted(pools.items())}
    return codec.dumps(data, REGISTRY_VERSION)


def _registry_lane(spec: LaneSpec) -> dict[str, Any]:
    # The calendar as its text (read back by schedules.from_text); left out for a cadence
    # lane, so tools of the earlier release read the registry as before.
    data = {**asdict(replace(spec, calendar=None)), "gates": [asdict(g) for g in spec.gates]}
    del data["calendar"]
    if spec.calendar is not None:
        data["calendar"] = spec.calendar.text
    elif data["catchup_window_s"] is None:
        del data["catchup_window_s"]
    # The pool options too, while they hold their defaults: the earlier release builds
    # LaneSpec(**lane) and would refuse a field it does not know.
    for name, default in _POOL_DEFAULTS.items():
        if data[name] == default:
            del data[name]
    return data


_POOL_DEFAULTS: dict[str, Any] = {"pool": DEFAULT_POOL, "weight": 1.0, "slots": 1}


def specs_from_registry(raw: str, key: str) -> tuple[tuple[LaneSpec, ...], dict[str, Any]]:
    """Parse what :func:`registry_json` wrote: (lane specs, the settings it carried)."""
    try:
        data = codec.loads(raw, key, REGISTRY_VERSION)
        specs = tuple(
            LaneSpec(**{**lane, "kind": LaneKind(lane["kind"]),
                        "deployment": DeploymentClass(lane["deployment"]),
                        "gates": tuple(Gate(**g) for g in lane["gates"]),
                        "calendar": (None if lane.get("calendar") is None
                                     else from_text(lane["calendar"]))})
            for lane in data["lanes"])
    except StateError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StateError(key, f"unreadable lane registry ({exc})") from None
    return specs, {k: v for k, v in data.items() if k != "lanes"}
