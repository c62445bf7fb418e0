"""Find lanes in a Celery app's task registry and validate them as a whole.

There is no second list of lanes: a task with a ``lane=Lane(...)`` option is a lane.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from schedproj import defaults
from schedproj.errors import LaneDeclarationError, StateError
from schedproj.lanes import DeploymentClass, Gate, Lane, LaneKind, LaneSpec


@dataclass(frozen=True)
class LaneSet:
    """The validated lanes of one app, in declared order, with their tasks' lane options."""

    specs: tuple[LaneSpec, ...]
    options: Mapping[str, Lane]

    def spec(self, name: str) -> LaneSpec:
        return self._by_name[name]

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


def queue_for(kind: LaneKind) -> str:
    return defaults.HEAVY_QUEUE if kind is LaneKind.HEAVY else defaults.LIGHT_QUEUE


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
                   cadence_scale: float = 1.0) -> LaneSet:
    """Validate every lane and the relations between them.

    ``routed_queue(task_name) -> str | None`` tells which queue the app's routing would send a
    task to, so a heavy lane routed elsewhere is caught at start. ``cadence_scale`` multiplies
    every duration a lane declares (cadence, retry delays, gate bounds): demos and tests run
    real lane sets in seconds instead of hours.
    """
    specs: list[LaneSpec] = []
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
        owners[name] = task_name
        _check_queue(name, task_name, lane, task, routed_queue)
        options[name] = lane
        specs.append(_spec(name, task_name, lane, cadence_scale))
    _check_gates(specs)
    return LaneSet(specs=tuple(sorted(specs, key=lambda s: s.sort_key)), options=options)


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else float(value) * scale


def _spec(name: str, task_name: str, lane: Lane, scale: float) -> LaneSpec:
    gates = tuple(replace(g, max_defer_s=_scaled(g.max_defer_s, scale)) for g in lane.gates)
    return LaneSpec(
        name=name, task_name=task_name, kind=lane.kind,
        cadence_s=float(lane.cadence_s or 0) * scale,
        priority0=lane.priority0, deployment=lane.deployment, gates=gates,
        order=defaults.DEFAULT_LANE_ORDER if lane.order is None else lane.order,
        backlog_driven=lane.backlog_driven,
        retry_after_failure_s=_scaled(lane.retry_after_failure_s, scale),
        retry_window_s=_scaled(lane.retry_window_s, scale),
    )


def _check_queue(name: str, task_name: str, lane: Lane, task: Any, routed_queue: Any) -> None:
    expected = queue_for(lane.kind)
    declared = getattr(task, "queue", None)
    routed = routed_queue(task_name) if routed_queue is not None else None
    for where, queue in (("its queue option", declared), ("the app's task_routes", routed)):
        if queue is not None and queue != expected:
            raise LaneDeclarationError(
                name, f"is a {lane.kind.value} lane but {where} sends it to queue {queue!r}",
                f"remove the queue setting; schedproj routes {lane.kind.value} lanes to "
                f"{expected!r}",
            )


def _check_gates(specs: Iterable[LaneSpec]) -> None:
    by_name = {s.name: s for s in specs}
    for spec in by_name.values():
        for gate in spec.gates:
            if gate.blocker not in by_name:
                known = ", ".join(sorted(by_name)) or "none"
                raise LaneDeclarationError(
                    spec.name, f"a gate names unknown lane {gate.blocker!r}",
                    f"name one of the declared lanes ({known})",
                )
    cycle = _find_cycle({n: [g.blocker for g in s.gates] for n, s in by_name.items()})
    if cycle:
        raise LaneDeclarationError(
            cycle[0], "its gates form a cycle " + " -> ".join(cycle),
            "remove one gate of the cycle; lanes waiting on each other would defer forever",
        )


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
    return json.dumps({
        "v": REGISTRY_VERSION,
        "profile": settings.profile.value,
        "hold_cap_s": settings.hold_cap_s,
        "starvation_threshold_s": settings.starvation_threshold_s,
        "lanes": [{**asdict(s), "gates": [asdict(g) for g in s.gates]} for s in lanes.specs],
    })


def specs_from_registry(raw: str, key: str) -> tuple[tuple[LaneSpec, ...], dict[str, Any]]:
    """Parse what :func:`registry_json` wrote: (lane specs, the settings it carried)."""
    try:
        data = json.loads(raw)
        if data.get("v") != REGISTRY_VERSION:
            raise StateError(key, f"format version {data.get('v')!r}, this schedproj reads "
                                  f"version {REGISTRY_VERSION}")
        specs = tuple(
            LaneSpec(**{**lane, "kind": LaneKind(lane["kind"]),
                        "deployment": DeploymentClass(lane["deployment"]),
                        "gates": tuple(Gate(**g) for g in lane["gates"])})
            for lane in data["lanes"])
    except StateError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StateError(key, f"unreadable lane registry ({exc})") from None
    return specs, {k: v for k, v in data.items() if k not in ("v", "lanes")}
