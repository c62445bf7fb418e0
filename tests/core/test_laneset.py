"""Finding lanes in a task registry and validating them as a whole (core/laneset.py): names,
queues, gates and cycles refused at start naming the lane and the fix; families resolve their
members; the published registry round-trips."""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from schedproj.core import defaults
from schedproj.core.errors import LaneDeclarationError, StateError
from schedproj.core.families import LaneFamily, member_spec
from schedproj.core.lanes import DeploymentClass, Gate, Lane, LaneKind, LaneSpec, Profile
from schedproj.core.laneset import (
    LaneSet,
    build_lane_set,
    lane_tasks,
    registry_json,
    specs_from_registry,
)

HEAVY, LIGHT = LaneKind.HEAVY, LaneKind.LIGHT


def task(lane: Any = None, queue: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(lane=lane, queue=queue)


def refused(tasks: dict[str, Any], **kw: Any) -> LaneDeclarationError:
    with pytest.raises(LaneDeclarationError) as caught:
        build_lane_set(tasks, **kw)
    return caught.value


def test_only_tasks_with_a_lane_option_are_lanes() -> None:
    a = Lane(cadence_s=60)
    b = Lane(cadence_s=60)
    tasks = {"t.plain": task(), "t.a": task(a), "t.other": SimpleNamespace(), "t.b": task(b)}
    assert lane_tasks(tasks) == [("t.a", tasks["t.a"], a), ("t.b", tasks["t.b"], b)]
    error = refused({"t.bad": task({"cadence_s": 60})})
    assert (error.lane, error.problem, error.fix) == (
        "t.bad", "the task's lane option is dict, not a Lane",
        "declare it as lane=schedproj.Lane(cadence_s=..., ...)")


def test_lanes_come_out_in_declared_order_then_name_never_registry_order() -> None:
    tasks = {"t.z": task(Lane(cadence_s=60, order=1)), "t.b": task(Lane(cadence_s=60)),
             "t.a": task(Lane(cadence_s=60)), "t.y": task(Lane(cadence_s=60, order=2))}
    lanes = build_lane_set(tasks)
    assert lanes.names == ("t.z", "t.y", "t.a", "t.b")
    assert lanes.spec("t.a").order == defaults.DEFAULT_LANE_ORDER
    assert build_lane_set(dict(reversed(tasks.items()))).names == lanes.names


def test_a_spec_carries_the_declaration_scaled() -> None:
    lane = Lane(cadence_s=100, kind=LIGHT, gates=(Gate("t.b", max_defer_s=10),), order=4,
                retry_after_failure_s=20, retry_window_s=40, backlog_driven=True,
                deployment=DeploymentClass.LOCAL_ONLY)
    lanes = build_lane_set({"t.a": task(lane), "t.b": task(Lane(cadence_s=5))},
                           cadence_scale=0.5)
    spec = lanes.spec("t.a")
    assert spec == LaneSpec(name="t.a", task_name="t.a", kind=LIGHT, cadence_s=50.0,
                            gates=(Gate("t.b", max_defer_s=5.0),), order=4,
                            backlog_driven=True, retry_after_failure_s=10.0,
                            retry_window_s=20.0, deployment=DeploymentClass.LOCAL_ONLY)
    assert build_lane_set({"t.p": task(Lane(cadence_s=5, priority0=True))}).spec(
        "t.p").priority0
    assert lanes.spec("t.b").gates == () and lanes.spec("t.b").retry_window_s is None
    assert lanes.option("t.a") is lane


def test_a_lane_may_take_its_own_name() -> None:
    lanes = build_lane_set({"t.a": task(Lane(cadence_s=60, name="backup"))})
    assert lanes.names == ("backup",)
    assert lanes.spec("backup").task_name == "t.a"
    assert lanes.knows("backup") and not lanes.knows("t.a")


def test_a_lane_declared_twice_names_both_tasks() -> None:
    error = refused({"t.a": task(Lane(cadence_s=60, name="x")),
                     "t.b": task(Lane(cadence_s=60, name="x"))})
    assert (error.lane, error.problem, error.fix) == (
        "x", "declared twice, by tasks 't.a' and 't.b'",
        "give each lane a unique name (Lane(name=...) or the task name)")


@pytest.mark.parametrize("name", ["a[b", "a]", "a|run"])
def test_names_holding_member_or_field_separators_are_refused(name: str) -> None:
    error = refused({"t.a": task(Lane(cadence_s=60, name=name))})
    assert (error.lane, error.problem, error.fix) == (
        name, "the name holds '[', ']' or '|', which schedproj uses to name family members "
        "and state fields", "rename the lane (Lane(name=...)) without them")


def test_each_lane_is_checked_with_its_name() -> None:
    assert refused({"t.a": task(Lane(cadence_s=0))}).lane == "t.a"


@pytest.mark.parametrize(("kind", "queue"), [(HEAVY, "light"), (LIGHT, "heavy"),
                                             (HEAVY, "celery")])
def test_a_lane_whose_queue_option_is_not_its_kinds_is_refused(kind: LaneKind,
                                                                 queue: str) -> None:
    error = refused({"t.a": task(Lane(cadence_s=60, kind=kind), queue=queue)})
    assert error.lane == "t.a"
    assert error.problem == (f"is a {kind.value} lane but its queue option sends it to queue "
                             f"{queue!r}")
    assert error.fix == (f"remove the queue setting; schedproj routes {kind.value} lanes to "
                         f"{kind.value!r}")


def test_a_lane_the_apps_routes_send_elsewhere_is_refused() -> None:
    routes = {"t.a": "celery"}
    error = refused({"t.a": task(Lane(cadence_s=60))}, routed_queue=routes.get)
    assert error.problem == "is a heavy lane but the app's task_routes sends it to queue 'celery'"
    assert "'heavy'" in error.fix


def test_a_lane_on_its_own_queue_is_accepted() -> None:
    tasks = {"t.h": task(Lane(cadence_s=60), queue=defaults.HEAVY_QUEUE),
             "t.l": task(Lane(cadence_s=60, kind=LIGHT))}
    routes = {"t.l": defaults.LIGHT_QUEUE}
    assert build_lane_set(tasks, routed_queue=routes.get).names == ("t.h", "t.l")


def test_a_gate_on_an_unknown_lane_names_the_known_ones() -> None:
    error = refused({"t.a": task(Lane(cadence_s=60, gates=(Gate("t.zz"),))),
                     "t.b": task(Lane(cadence_s=60))})
    assert error.lane == "t.a" and "'t.zz'" in error.problem
    assert "t.a, t.b" in error.fix


@pytest.mark.parametrize("length", [2, 3])
def test_gates_forming_a_cycle_are_refused_showing_the_cycle(length: int) -> None:
    names = [f"t.{i}" for i in range(length)]
    tasks = {name: task(Lane(cadence_s=60, gates=(Gate(names[(i + 1) % length]),)))
             for i, name in enumerate(names)}
    tasks["t.free"] = task(Lane(cadence_s=60, gates=(Gate("t.0"),)))
    error = refused(tasks)
    assert error.lane == names[0]
    assert error.problem == "its gates form a cycle " + " -> ".join([*names, names[0]])
    assert error.fix == ("remove one gate of the cycle; lanes waiting on each other would "
                         "defer forever")


def test_a_chain_of_gates_without_a_cycle_is_accepted() -> None:
    tasks = {"t.a": task(Lane(cadence_s=60, gates=(Gate("t.b"), Gate("t.c")))),
             "t.b": task(Lane(cadence_s=60, gates=(Gate("t.c"),))),
             "t.c": task(Lane(cadence_s=60))}
    assert build_lane_set(tasks).names == ("t.a", "t.b", "t.c")


def family_set() -> LaneSet:
    return build_lane_set({
        "t.fam": task(LaneFamily(cadence_s=60, kind=LIGHT, jitter=0.2,
                                 gates=(Gate("t.free", max_defer_s=9),))),
        "t.free": task(Lane(cadence_s=60, kind=LIGHT)),
        "t.nojit": task(LaneFamily(cadence_s=60, kind=LIGHT)),
        "t.c": task(Lane(cadence_s=60, kind=LIGHT, gates=(Gate("t.fam"), Gate("t.nojit[k]")))),
    })


def test_families_are_not_lanes_but_resolve_their_members() -> None:
    lanes = family_set()
    assert lanes.names == ("t.c", "t.free")
    assert set(lanes.families) == {"t.fam", "t.nojit"}
    assert lanes.families["t.fam"].family == "t.fam"
    member = lanes.spec("t.fam[acme]")
    assert member == member_spec(lanes.families["t.fam"], 0.2, "acme")
    assert member.name == "t.fam[acme]" and member.due_ratio != 1.0
    assert lanes.spec("t.nojit[acme]").due_ratio == 1.0
    assert lanes.option("t.fam[acme]") is lanes.option("t.fam")
    assert lanes.knows("t.fam[acme]") and lanes.knows("t.c")


@pytest.mark.parametrize("name", ["t.fam[]", "t.fam[a b]", "t.c[x]", "t.other[x]", "nope"])
def test_names_that_are_no_member_of_a_family_are_unknown(name: str) -> None:
    lanes = family_set()
    assert lanes.member_spec(name) is None
    assert not lanes.knows(name)
    with pytest.raises(KeyError) as caught:
        lanes.spec(name)
    assert caught.value.args == (name,)


def test_options_of_an_unknown_lane_are_a_key_error() -> None:
    lanes = family_set()
    for name in ("nope", "t.zz[k]"):
        with pytest.raises(KeyError):
            lanes.option(name)


def test_a_gate_on_a_member_of_an_unknown_family_is_refused() -> None:
    error = refused({"t.c": task(Lane(cadence_s=60, gates=(Gate("t.x[k]"),)))})
    assert "'t.x[k]'" in error.problem


def test_a_cycle_through_a_family_is_refused() -> None:
    error = refused({
        "t.fam": task(LaneFamily(cadence_s=60, kind=LIGHT, gates=(Gate("t.c"),))),
        "t.c": task(Lane(cadence_s=60, kind=LIGHT, gates=(Gate("t.fam[k]"),))),
    })
    assert error.problem == "its gates form a cycle t.c -> t.fam -> t.c"


@dataclass
class Settings:
    profile: Profile = Profile.CLOUD
    hold_cap_s: float = 900.0
    starvation_threshold_s: float = 7200.0


def test_the_published_registry_round_trips() -> None:
    lanes = family_set()
    raw = registry_json(lanes, Settings())
    specs, carried = specs_from_registry(raw, "k:lanes")
    assert specs == lanes.specs
    assert carried["profile"] == "cloud"
    assert (carried["hold_cap_s"], carried["starvation_threshold_s"]) == (900.0, 7200.0)
    assert [(f["name"], f["jitter"]) for f in carried["families"]] == [
        ("t.fam", 0.2), ("t.nojit", 0.0)]
    assert carried["families"][0]["gates"] == [
        {"blocker": "t.free", "when": "due-and-behind", "reason": "dependency-backpressure",
         "max_defer_s": 9.0, "in_legacy": False}]
    assert carried["families"][1]["gates"] == []
    assert "lanes" not in carried


@pytest.mark.parametrize("raw", [
    "not json",
    json.dumps({"v": 1, "lanes": [{"name": "a"}]}),
    json.dumps({"v": 1}),
    json.dumps({"v": 1, "lanes": "abc"}),
    json.dumps({"v": 1, "lanes": [{"kind": "odd", "deployment": "shared", "gates": []}]}),
    json.dumps({"v": 2, "lanes": []}),
])
def test_an_unreadable_registry_is_a_state_error_naming_the_key(raw: str) -> None:
    with pytest.raises(StateError) as caught:
        specs_from_registry(raw, "k:lanes")
    assert caught.value.key == "k:lanes"
    assert caught.value.problem.startswith(("unreadable lane registry (", "not valid JSON",
                                            "format version"))
