"""Pools (core/pools.py, issue 22): declaring them (in code, in ``SCHEDPROJ_POOLS``, on a lane),
refused at start naming the pool or lane and the fix; and the per-pool grant, checked against an
oracle written from the rule in docs/pools.md, with the weight rule, the default pool's
equivalence with the one-lease pick, and the backfill bound in a simulated run of ticks.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedproj.core.errors import ConfigurationError, LaneDeclarationError
from schedproj.core.families import LaneFamily
from schedproj.core.lanes import Lane, LaneKind, LaneSpec, Profile
from schedproj.core.laneset import build_lane_set, registry_json, specs_from_registry
from schedproj.core.picker import pick
from schedproj.core.pipeline import decide
from schedproj.core.pools import (
    BACKFILL_RATIO,
    DEFAULT,
    DEFAULT_POOL,
    Pool,
    PoolError,
    declare_pools,
    grant,
    parse_pools,
)
from schedproj.core.records import LaneState, LeaseView, RunRecord
from schedproj.core.views import LaneView, view_lane
from tests.core.test_picker_properties import Scenario, scenarios

PROPERTY = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
HEAVY, LIGHT = LaneKind.HEAVY, LaneKind.LIGHT


# -- declaring pools ---------------------------------------------------------------------------


def pool_refused(make: Any) -> PoolError:
    with pytest.raises(PoolError) as caught:
        make()
    error = caught.value
    assert isinstance(error, ConfigurationError)
    assert str(error) == f"pool {error.pool!r}: {error.problem}. Fix: {error.fix}"
    return error


def test_a_pool_has_a_name_and_slots_and_the_default_pool_is_the_one_lease() -> None:
    assert Pool("gpu", slots=2) == Pool("gpu", 2)
    assert Pool("db").slots == 1
    assert (DEFAULT.name, DEFAULT.slots, DEFAULT_POOL) == ("heavy", 1, "heavy")
    assert Pool("heavy", 1) == DEFAULT  # declaring it as it is changes nothing
    assert Pool("a.b_c-9", 3).name == "a.b_c-9"


@pytest.mark.parametrize(("slots", "shown"), [(0, "0"), (-1, "-1"), (1.5, "1.5"), (True, "True"),
                                              ("2", "'2'"), (None, "None")])
def test_slots_below_one_or_not_whole_are_refused_naming_the_pool(slots: Any, shown: str) -> None:
    error = pool_refused(lambda: Pool("gpu", slots))
    assert (error.pool, error.problem) == ("gpu", f"slots must be an integer >= 1, got {shown}")
    assert error.fix == ("declare Pool('gpu', slots=<how many runs at once>), e.g. slots=2")


@pytest.mark.parametrize(("name", "problem"), [
    ("", "the pool name '' is not 1 to 64 characters"),
    ("gpu pool", "the pool name 'gpu pool' is not 1 to 64"),
    ("gpu:0", "the pool name 'gpu:0' is not"),
    ("-gpu", "the pool name '-gpu' is not"),
    ("g" * 65, "is not 1 to 64 characters"),
    ("light", "the pool name 'light' is the light lanes' queue"),
    (7, "the pool name must be text, got 7"),
])
def test_pool_names_follow_the_rule(name: Any, problem: str) -> None:
    error = pool_refused(lambda: Pool(name, 2))
    assert problem in error.problem
    assert error.fix.startswith("name it with 1 to 64 characters out of letters, digits")
    Pool("g" * 64, 1)  # the longest allowed


def test_the_default_pool_keeps_its_one_slot() -> None:
    error = pool_refused(lambda: Pool("heavy", 2))
    assert error.problem == ("the default pool 'heavy' always has 1 slot (the heavy lease), "
                             "got slots=2")
    assert "Pool('gpu', slots=2)" in error.fix and "Lane(pool='gpu')" in error.fix


def test_the_environment_value_declares_pools() -> None:
    assert parse_pools("gpu=2,db=3") == (Pool("gpu", 2), Pool("db", 3))
    assert parse_pools(" gpu = 2 , db=3 ") == (Pool("gpu", 2), Pool("db", 3))
    assert parse_pools("") == parse_pools("  ") == parse_pools(None) == ()
    assert parse_pools("heavy=1") == (DEFAULT,)


@pytest.mark.parametrize(("text", "problem", "fix"), [
    ("gpu", "the entry 'gpu' has no '=<slots>'", "write gpu=<slots>, e.g. gpu=2"),
    ("gpu=two", "the entry 'gpu=two' has slots 'two', not a whole number",
     "write gpu=<slots>, e.g. gpu=2"),
    ("gpu=-1", "has slots '-1', not a whole number", "write gpu=<slots>, e.g. gpu=2"),
    ("gpu=2.5", "has slots '2.5', not a whole number", "write gpu=<slots>, e.g. gpu=2"),
    ("gpu=0", "the entry 'gpu=0': slots must be an integer >= 1, got 0",
     "declare Pool('gpu', slots=<how many runs at once>), e.g. slots=2"),
    ("gpu=2,,db=1", "an empty entry in 'gpu=2,,db=1'", "separate pools by single commas"),
    ("gpu=2,", "an empty entry", "separate pools by single commas: gpu=2,db=3"),
    ("gpu=2,gpu=3", "pool 'gpu' is declared twice in 'gpu=2,gpu=3'", "keep one gpu=<slots>"),
    ("=2", "the entry '=2': the pool name '' is not", "name it with 1 to 64 characters"),
    ("light=2", "the pool name 'light' is the light lanes' queue", "name it with"),
    ("heavy=4", "the default pool 'heavy' always has 1 slot", "declare a pool of its own"),
])
def test_a_bad_environment_value_names_the_setting_the_entry_and_the_fix(
        text: str, problem: str, fix: str) -> None:
    error = pool_refused(lambda: parse_pools(text))
    assert error.pool == "SCHEDPROJ_POOLS"
    assert problem in error.problem
    assert fix in error.fix
    assert pool_refused(lambda: parse_pools(text, "MY_POOLS")).pool == "MY_POOLS"


def test_declared_pools_always_hold_the_default_and_the_environment_wins() -> None:
    assert declare_pools() == {"heavy": DEFAULT}
    code = [Pool("gpu", 2), Pool("db", 3)]
    env = parse_pools("gpu=4,api=1")
    assert declare_pools(code, env) == {"heavy": DEFAULT, "gpu": Pool("gpu", 4),
                                        "db": Pool("db", 3), "api": Pool("api", 1)}
    error = pool_refused(lambda: declare_pools([Pool("gpu", 2), Pool("gpu", 3)]))
    assert (error.pool, error.problem) == ("gpu", "declared twice in code")
    error = pool_refused(lambda: declare_pools(["gpu=2"]))  # type: ignore[list-item]
    assert error.problem == "'gpu=2' is not a schedproj Pool"


# -- the lane options --------------------------------------------------------------------------


def lane_refused(lane: Lane, name: str = "my.lane") -> LaneDeclarationError:
    with pytest.raises(LaneDeclarationError) as caught:
        lane.check(name)
    assert caught.value.lane == name
    assert f"lane {name!r}: " in str(caught.value) and "Fix: " in str(caught.value)
    return caught.value


def test_a_lanes_pool_options_default_to_todays_lease() -> None:
    lane = Lane(cadence_s=60)
    assert (lane.pool, lane.weight, lane.slots) == (None, 1.0, 1)
    spec = LaneSpec(name="a", task_name="t.a", kind=HEAVY, cadence_s=60)
    assert (spec.pool, spec.weight, spec.slots) == ("heavy", 1.0, 1)
    Lane(cadence_s=60, pool="gpu", weight=2, slots=2).check("ok")
    Lane(cadence_s=60, pool="heavy").check("ok")
    Lane(cadence_s=60, kind=LIGHT, weight=1, slots=1).check("ok")  # the defaults, spelled out


@pytest.mark.parametrize("weight", [0, -1, math.nan, math.inf, True, "2", None])
def test_a_weight_is_a_positive_finite_number(weight: Any) -> None:
    error = lane_refused(Lane(cadence_s=60, weight=weight))
    assert error.problem == f"weight must be a positive finite number, got {weight!r}"
    assert error.fix.startswith("pass weight=2 to rank the lane as if twice as stale")


@pytest.mark.parametrize("slots", [0, -2, 1.0, 2.5, True, "2", None])
def test_slots_are_a_whole_number_of_at_least_one(slots: Any) -> None:
    error = lane_refused(Lane(cadence_s=60, slots=slots))
    assert error.problem == f"slots must be an integer >= 1, got {slots!r}"
    assert "slots=2" in error.fix


@pytest.mark.parametrize(("pool", "problem"), [
    ("gpu pool", "the pool name 'gpu pool' is not 1 to 64 characters"),
    ("light", "the pool name 'light' is the light lanes' queue"),
    (3, "the pool name must be text, got 3"),
])
def test_a_lane_naming_a_malformed_pool_is_refused(pool: Any, problem: str) -> None:
    error = lane_refused(Lane(cadence_s=60, pool=pool))
    assert error.problem.startswith(problem)
    assert "SCHEDPROJ_POOLS='gpu=2'" in error.fix and "default pool 'heavy'" in error.fix


@pytest.mark.parametrize(("kw", "used"), [
    ({"pool": "gpu"}, "pool='gpu'"),
    ({"slots": 2}, "slots=2"),
    ({"weight": 3.0}, "weight=3.0"),
    ({"pool": "gpu", "weight": 2}, "pool='gpu' and weight=2"),
])
def test_only_heavy_lanes_take_a_pool_slots_or_a_weight(kw: dict[str, Any], used: str) -> None:
    error = lane_refused(Lane(cadence_s=60, kind=LIGHT, **kw))
    assert error.problem == f"{used} is set on a light lane"
    assert error.fix.startswith("pools, slots and weights apply to heavy lanes")


def task(lane: Any) -> SimpleNamespace:
    return SimpleNamespace(lane=lane, queue=None)


def test_a_lane_set_knows_its_pools_and_its_lanes_carry_their_options() -> None:
    tasks = {"t.train": task(Lane(cadence_s=3600, pool="gpu", slots=2, weight=2)),
             "t.infer": task(Lane(cadence_s=600, pool="gpu")),
             "t.backup": task(Lane(cadence_s=86400, priority0=True)),
             "t.sync": task(LaneFamily(cadence_s=1800, pool="db", weight=0.5))}
    for pools in ([Pool("gpu", 2), Pool("db", 8)], {"gpu": Pool("gpu", 2), "db": Pool("db", 8)}):
        lanes = build_lane_set(tasks, pools=pools)
        assert dict(lanes.pools) == {"heavy": DEFAULT, "gpu": Pool("gpu", 2),
                                     "db": Pool("db", 8)}
        got = {s.name: (s.pool, s.weight, s.slots) for s in lanes.specs}
        assert got == {"t.train": ("gpu", 2.0, 2), "t.infer": ("gpu", 1.0, 1),
                       "t.backup": ("heavy", 1.0, 1)}
        member = lanes.spec("t.sync[tenant-7]")
        assert (member.pool, member.weight, member.slots) == ("db", 0.5, 1)
    assert dict(build_lane_set({"t.a": task(Lane(cadence_s=60))}).pools) == {"heavy": DEFAULT}


def test_a_lane_naming_a_pool_declared_nowhere_is_refused_with_the_fix() -> None:
    tasks = {"t.train": task(Lane(cadence_s=3600, pool="gpu"))}
    with pytest.raises(LaneDeclarationError) as caught:
        build_lane_set(tasks, pools=[Pool("db", 3)])
    error = caught.value
    assert error.lane == "t.train"
    assert error.problem == ("names pool 'gpu', which is declared nowhere (pools: heavy=1, "
                             "db=3)")
    assert error.fix == ("declare it (configure_app(app, pools=[Pool('gpu', slots=2)]) or "
                         "SCHEDPROJ_POOLS='gpu=2'), or name a declared pool")
    with pytest.raises(LaneDeclarationError):
        build_lane_set(tasks)  # only the default pool


def test_a_lane_needing_more_slots_than_its_pool_has_is_refused() -> None:
    with pytest.raises(LaneDeclarationError) as caught:
        build_lane_set({"t.train": task(Lane(cadence_s=3600, pool="gpu", slots=3))},
                       pools=[Pool("gpu", 2)])
    assert caught.value.problem == "takes slots=3 of pool 'gpu', which has 2"
    assert caught.value.fix == "give pool 'gpu' at least 3 slots, or the lane slots<=2"
    with pytest.raises(LaneDeclarationError) as caught:
        build_lane_set({"t.big": task(Lane(cadence_s=60, slots=2))})
    assert caught.value.problem == "takes slots=2 of pool 'heavy', which has 1"


class _Settings:
    profile: Profile = Profile.LOCAL
    hold_cap_s: float = 1800.0
    starvation_threshold_s: float = 3600.0


def test_the_registry_leaves_the_pool_options_out_while_they_hold_their_defaults() -> None:
    """The earlier release builds LaneSpec(**lane) from the registry: a lane set that uses no
    pool reads there exactly as before (no new key anywhere)."""
    plain = build_lane_set({"t.a": task(Lane(cadence_s=60)),
                            "t.f": task(LaneFamily(cadence_s=60, kind=LIGHT))})
    raw = registry_json(plain, _Settings())
    data = json.loads(raw)
    assert "pools" not in data
    for lane in data["lanes"] + data["families"]:
        assert not {"pool", "weight", "slots"} & set(lane)
    specs, _ = specs_from_registry(raw, "k")
    assert specs == plain.specs


def test_the_registry_carries_pools_and_the_lanes_that_use_them() -> None:
    lanes = build_lane_set({"t.train": task(Lane(cadence_s=60, pool="gpu", slots=2)),
                            "t.rank": task(Lane(cadence_s=60, weight=2)),
                            "t.a": task(Lane(cadence_s=60))}, pools=[Pool("gpu", 2)])
    raw = registry_json(lanes, _Settings())
    data = json.loads(raw)
    assert data["pools"] == {"gpu": 2, "heavy": 1}
    by_name = {lane["name"]: lane for lane in data["lanes"]}
    assert (by_name["t.train"]["pool"], by_name["t.train"]["slots"]) == ("gpu", 2)
    assert "weight" not in by_name["t.train"] and "pool" not in by_name["t.rank"]
    assert by_name["t.rank"]["weight"] == 2.0
    specs, carried = specs_from_registry(raw, "k")
    assert specs == lanes.specs
    assert carried["pools"] == {"gpu": 2, "heavy": 1}


# -- the grant: an oracle written from the rule ------------------------------------------------


POOLS = {"heavy": DEFAULT, "gpu": Pool("gpu", 2), "db": Pool("db", 4)}
NAMES = tuple("abcdefghij")


def make_view(name: str, *, pool: str = "heavy", slots: int = 1, weight: float = 1.0,
              ratio: float = 1.0, order: int = 1000, priority0: bool = False,
              kind: LaneKind = HEAVY, due_ratio: float = 1.0) -> LaneView:
    spec = LaneSpec(name=name, task_name=f"t.{name}", kind=kind, cadence_s=60.0, order=order,
                    priority0=priority0, pool=pool, slots=slots, weight=weight,
                    due_ratio=due_ratio)
    return LaneView(spec=spec, ratio=ratio, backlog=0, due=True, in_flight=False,
                    never_run=math.isinf(ratio))


@st.composite
def candidate_sets(draw: st.DrawFn) -> tuple[list[LaneView], dict[str, list[str]]]:
    """Due heavy lanes spread over three pools (a few light ones and some already holding a
    slot mixed in), and the slots held now."""
    views = []
    for name in draw(st.lists(st.sampled_from(NAMES), min_size=0, max_size=10, unique=True)):
        pool = draw(st.sampled_from(sorted(POOLS)))
        views.append(make_view(
            name, pool=pool, slots=draw(st.integers(1, POOLS[pool].slots)),
            weight=draw(st.sampled_from((0.5, 1.0, 1.0, 2.0, 3.0))),
            ratio=draw(st.sampled_from((0.0, 0.5, 1.0, 1.2, 1.5, 1.6, 2.5, 3.0, math.inf))),
            order=draw(st.integers(0, 2)), priority0=draw(st.integers(0, 5)) == 0,
            kind=LIGHT if draw(st.integers(0, 9)) == 0 else HEAVY,
            due_ratio=draw(st.sampled_from((0.8, 1.0, 1.3)))))
    holders: dict[str, list[str]] = {}
    for pool in POOLS:
        busy = draw(st.integers(0, POOLS[pool].slots))
        holders[pool] = [draw(st.sampled_from(("", "x", "y", *NAMES))) for _ in range(busy)]
    return views, holders


def rank(view: LaneView) -> tuple[Any, ...]:
    """docs/pools.md: priority-0 first, then the largest weight x ratio, then order, name."""
    return (not view.spec.priority0, -view.spec.weight * view.ratio, view.spec.order, view.name)


def oracle(views: list[LaneView], holders: dict[str, list[str]], backfill: float
           ) -> dict[str, list[str]]:
    """The lanes granted per pool, by the rule as docs/pools.md states it."""
    holding = {lane for held in holders.values() for lane in held}
    out: dict[str, list[str]] = {}
    for pool, declared in POOLS.items():
        free = declared.slots - len(holders.get(pool, []))
        reserved = False
        out[pool] = []
        for v in sorted((v for v in views if v.spec.pool == pool and v.spec.heavy
                         and v.name not in holding), key=rank):
            if reserved:
                break
            if v.spec.slots <= free:
                out[pool].append(v.name)
                free -= v.spec.slots
            elif v.spec.priority0 or v.ratio >= v.spec.due_ratio + backfill:
                reserved = True
    return out


BACKFILLS = st.sampled_from((BACKFILL_RATIO, 0.0, 2.0, 1e9))


@PROPERTY
@given(candidate_sets(), BACKFILLS, st.randoms(use_true_random=False))
def test_the_grant_is_the_oracles(drawn: tuple[list[LaneView], dict[str, list[str]]],
                                  backfill: float, rnd: random.Random) -> None:
    views, holders = drawn
    shuffled = list(views)
    rnd.shuffle(shuffled)  # the order the candidates come in never matters
    result = grant(shuffled, POOLS, holders, backfill_ratio=backfill)
    expected = oracle(views, holders, backfill)
    assert {p: [g.lane for g in result.granted if g.pool == p] for p in POOLS} == expected


@PROPERTY
@given(candidate_sets(), BACKFILLS)
def test_grants_never_exceed_free_slots_and_no_lane_is_granted_twice(
        drawn: tuple[list[LaneView], dict[str, list[str]]], backfill: float) -> None:
    views, holders = drawn
    result = grant(views, POOLS, holders, backfill_ratio=backfill)
    by_name = {v.name: v for v in views}
    lanes = [g.lane for g in result.granted]
    assert len(lanes) == len(set(lanes))
    holding = {lane for held in holders.values() for lane in held}
    for pool, declared in POOLS.items():
        mine = [g for g in result.granted if g.pool == pool]
        assert sum(g.slots for g in mine) <= declared.slots - len(holders[pool])
        for g in mine:
            spec = by_name[g.lane].spec
            assert (spec.pool, spec.slots, spec.heavy) == (pool, g.slots, True)
            assert g.lane not in holding
    # Every heavy candidate of a pool that holds nothing is granted or waits behind someone.
    heavy = {v.name for v in views if v.spec.heavy and v.name not in holding}
    assert set(lanes) | set(result.waiting) == heavy
    assert not set(lanes) & set(result.waiting)
    for pool, lane in result.reserved.items():
        assert by_name[lane].spec.pool == pool and lane in result.waiting


@PROPERTY
@given(candidate_sets(), BACKFILLS)
def test_priority0_first_no_other_lane_is_granted_while_one_waits(
        drawn: tuple[list[LaneView], dict[str, list[str]]], backfill: float) -> None:
    views, holders = drawn
    result = grant(views, POOLS, holders, backfill_ratio=backfill)
    by_name = {v.name: v for v in views}
    for pool in POOLS:
        waiting_p0 = [n for n in result.waiting
                      if by_name[n].spec.pool == pool and by_name[n].spec.priority0]
        if waiting_p0:
            assert all(by_name[g.lane].spec.priority0 for g in result.granted if g.pool == pool)


def test_the_weight_rule_weight_two_at_one_and_a_half_outranks_weight_one_at_two_and_a_half(
        ) -> None:
    heavy_weight = make_view("w2", weight=2.0, ratio=1.5, order=9)
    plain = make_view("w1", weight=1.0, ratio=2.5, order=0)
    assert grant([plain, heavy_weight], POOLS, {}).lanes == ("w2",)
    assert pick([plain, heavy_weight]) == heavy_weight  # the single-lease pick agrees
    assert grant([plain, replace(heavy_weight, ratio=1.2)], POOLS, {}).lanes == ("w1",)
    # Priority-0 still comes first, whatever the weight.
    p0 = make_view("p0", ratio=0.1, priority0=True)
    assert grant([heavy_weight, p0], POOLS, {}).lanes == ("p0",)


WEIGHTS = st.sampled_from((0.25, 0.5, 2.0, 7.0, 1e6))


@PROPERTY
@given(scenarios(), st.data())
def test_weights_never_change_due_ness(sc: Scenario, data: st.DataObject) -> None:
    """Random weights on every lane change no lane's view (due, ratio, in flight) and which
    lanes are due and idle; the decision still dispatches or defers every one of them."""
    weighted = [replace(s, weight=data.draw(WEIGHTS)) if s.heavy else s for s in sc.lanes]
    base, other = sc.decide(), sc.decide(weighted)
    for name, view in base.views.items():
        got = other.views[name]
        assert (got.due, got.ratio, got.in_flight, got.backlog) == (
            view.due, view.ratio, view.in_flight, view.backlog)
    assert set(base.dispatched) | {d.lane for d in base.deferred} == (
        set(other.dispatched) | {d.lane for d in other.deferred})
    assert base.also_dispatched == other.also_dispatched  # light lanes: weights do nothing


@PROPERTY
@given(st.floats(0, 1e6), st.floats(-1e5, 1e5), st.sampled_from((1.0, 60.0, 3600.0)), WEIGHTS)
def test_a_weight_never_moves_when_a_lane_falls_due(last: float, now: float, cadence: float,
                                                     weight: float) -> None:
    spec = LaneSpec(name="a", task_name="t.a", kind=HEAVY, cadence_s=cadence)
    state = LaneState(run=RunRecord(last_run_at=last))
    assert view_lane(replace(spec, weight=weight), state, None, now).due == (
        view_lane(spec, state, None, now).due)


@PROPERTY
@given(scenarios(lease=False), st.sampled_from((0.5, 2.0, 4.0)))
def test_one_weight_for_every_lane_changes_no_pick(sc: Scenario, weight: float) -> None:
    """Weights are relative: scaling every lane's by the same power of two (exact in floating
    point) picks the same winner."""
    same = [replace(s, weight=weight) for s in sc.lanes]
    assert sc.decide(same).winner == sc.decide().winner


# -- the default pool is today's one lease -----------------------------------------------------


@PROPERTY
@given(scenarios())
def test_with_only_the_default_pool_the_grant_is_the_one_lease_pick(sc: Scenario) -> None:
    """The heavy candidates ``decide`` ranks (its winner and the lanes it deferred behind the
    pick or the lease), granted as one pool of one slot held by the lease's lane: the grant is
    the winner, and every other lane waits behind the lane ``decide`` names."""
    decision = sc.decide()
    behind = {d.lane: d.blocker for d in decision.deferred
              if d.reason.value.startswith("heavy-maintenance-")}
    names = [*behind, *([decision.winner] if decision.winner else [])]
    ranked = [decision.views[n] for n in names]
    holders = {"heavy": [sc.lease.lane]} if sc.lease is not None else {}
    result = grant(ranked, {"heavy": DEFAULT}, holders)
    assert result.lanes == ((decision.winner,) if decision.winner else ())
    assert dict(result.waiting) == behind


# -- the backfill bound ------------------------------------------------------------------------


@dataclass
class SimLane:
    view: LaneView
    cadence: float
    last_end: float
    running_until: float | None = None


def simulate(slots: int, big: SimLane, small: list[SimLane], ticks: int, max_run: int,
             rnd: random.Random, backfill: float) -> float:
    """Run ``ticks`` one-second ticks of one pool: every tick, the due idle lanes are ranked
    and granted (``grant``); a granted run lasts 1 to ``max_run`` ticks (random), and the lane's
    ratio counts from its end. Returns the big lane's worst staleness ratio while it waited
    (at each grant, and at the end if it still waits)."""
    pools = {"p": Pool("p", slots)}
    lanes = [big, *small]
    worst = 0.0
    for now in range(ticks):
        for lane in lanes:
            if lane.running_until is not None and lane.running_until <= now:
                lane.last_end, lane.running_until = lane.running_until, None
        views, holders = [], []
        for lane in lanes:
            if lane.running_until is not None:
                holders += [lane.view.name] * lane.view.spec.slots
                continue
            ratio = (now - lane.last_end) / lane.cadence
            if ratio >= 1.0:
                views.append(replace(lane.view, ratio=ratio))
        result = grant(views, pools, {"p": holders}, backfill_ratio=backfill)
        by_name = {lane.view.name: lane for lane in lanes}
        for g in result.granted:
            if g.lane == big.view.name:
                worst = max(worst, (now - big.last_end) / big.cadence)
            by_name[g.lane].running_until = now + rnd.randint(1, max_run)
    if big.running_until is None:
        worst = max(worst, (ticks - big.last_end) / big.cadence)
    return worst


def backfill_bound(big: SimLane, small: list[SimLane], max_run: int, backfill: float) -> float:
    """The bound docs/pools.md states: the big lane's ratio stays below
    ``max(due + backfill, R) + W / cadence``, with W = 2 n max_run + 1 ticks (n other lanes)
    and R = W x max(weight / cadence of the others) / its weight. Past R every other lane,
    once run, needs longer than W to outrank it again; so within W ticks of reserving comes a
    tick with no run at all, and the pool is all free for it."""
    window = 2 * len(small) * max_run + 1
    rate = max(s.view.spec.weight / s.cadence for s in small)
    reserve_at = max(big.view.spec.due_ratio + backfill, window * rate / big.view.spec.weight)
    return reserve_at + window / big.cadence


def sim_lane(name: str, slots: int, weight: float, cadence: float, last_end: float,
             order: int = 1000) -> SimLane:
    view = make_view(name, pool="p", slots=slots, weight=weight, order=order)
    return SimLane(view=view, cadence=cadence, last_end=last_end)


class _Fixed(random.Random):
    """Every run lasts its longest: small lanes that keep a pool partly busy in lockstep."""

    def randint(self, a: int, b: int) -> int:
        return b


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(slots=st.integers(2, 4), data=st.data(), rnd=st.randoms(use_true_random=False),
       max_run=st.integers(1, 6), backfill=st.sampled_from((BACKFILL_RATIO, 0.0, 1.0)),
       lockstep=st.booleans())
def test_the_big_lanes_wait_is_bounded_whatever_the_run_lengths(
        slots: int, data: st.DataObject, rnd: random.Random, max_run: int,
        backfill: float, lockstep: bool) -> None:
    if lockstep:
        rnd = _Fixed()
    cadence = data.draw(st.sampled_from((5.0, 20.0, 60.0)))
    big = sim_lane("big", data.draw(st.integers(2, slots)),
                   data.draw(st.sampled_from((0.5, 1.0, 2.0))), cadence,
                   -data.draw(st.floats(0, cadence)), order=data.draw(st.integers(0, 2)))
    small = [sim_lane(f"s{i}", data.draw(st.integers(1, slots)),
                      data.draw(st.sampled_from((0.5, 1.0, 2.0))),
                      data.draw(st.sampled_from((1.0, 1.0, 2.0, 5.0, 20.0))),
                      -data.draw(st.integers(-3, 30) | st.floats(0, 30)),
                      order=data.draw(st.integers(0, 2)))
             for i in range(data.draw(st.integers(1, 4)))]
    bound = backfill_bound(big, small, max_run, backfill)
    assert simulate(slots, big, small, 600, max_run, rnd, backfill) < bound


def staggered() -> tuple[SimLane, list[SimLane]]:
    """Three 1-slot lanes that keep one of two slots busy at every tick (runs of 2 ticks,
    staggered), beside a lane needing both."""
    big = sim_lane("big", 2, 1.0, 20.0, 0.0)
    small = [sim_lane(f"s{i}", 1, 1.0, 1.0, -1.0 + i) for i in range(3)]
    return big, small


class _Twos(random.Random):
    def randint(self, a: int, b: int) -> int:
        return 2


def test_without_the_bound_smaller_lanes_starve_the_big_lane() -> None:
    """The bound is what keeps the big lane's wait finite: with backfill unlimited, the
    staggered small lanes keep the pool partly busy for good and its ratio grows with the run."""
    big, small = staggered()
    bound = backfill_bound(big, small, 2, BACKFILL_RATIO)
    starved = simulate(2, big, small, 2000, 2, _Twos(), backfill=1e9)
    assert starved > 5 * bound
    assert starved == pytest.approx(2000 / 20.0)  # never granted at all
    big, small = staggered()
    assert simulate(2, big, small, 2000, 2, _Twos(), backfill=BACKFILL_RATIO) < bound


def test_backfill_fills_free_slots_while_the_big_lane_is_young_then_the_pool_reserves() -> None:
    young = make_view("big", pool="gpu", slots=2, ratio=1.2)
    small = make_view("small", pool="gpu", ratio=1.1)
    result = grant([young, small], POOLS, {"gpu": ["holder"]})
    assert result.lanes == ("small",)
    assert dict(result.waiting) == {"big": "holder"} and not result.reserved
    old = replace(young, ratio=1.5)  # due ratio 1 + 0.5: the pool now reserves
    result = grant([old, small], POOLS, {"gpu": ["holder"]})
    assert result.lanes == ()
    assert dict(result.reserved) == {"gpu": "big"}
    assert dict(result.waiting) == {"big": "holder", "small": "big"}
    # A lane ranked above the reserving one still goes: it is ahead by the ranking.
    ahead = make_view("ahead", pool="gpu", ratio=4.0)
    assert grant([old, small, ahead], POOLS, {"gpu": ["holder"]}).lanes == ("ahead",)
    # A priority-0 lane reserves at once; a never-run lane (ratio inf) too.
    p0 = make_view("p0", pool="gpu", slots=2, ratio=0.5, priority0=True)
    assert grant([p0, small], POOLS, {"gpu": ["holder"]}).reserved == {"gpu": "p0"}
    never = replace(young, ratio=math.inf)
    assert grant([never, small], POOLS, {"gpu": ["holder"]}).reserved == {"gpu": "big"}
    # Once the slots are free the big lane is granted both.
    assert grant([old, small], POOLS, {"gpu": []}).granted[0].slots == 2


def test_what_the_grant_leaves_out() -> None:
    light = make_view("light", kind=LIGHT)
    holding = make_view("holding", pool="gpu")
    unknown = make_view("unknown", pool="tpu")
    too_big = make_view("too-big", pool="gpu", slots=3)
    fine = make_view("fine", pool="gpu")
    result = grant([light, holding, unknown, too_big, fine, fine], POOLS, {"gpu": ["holding"]})
    assert result.lanes == ("fine",)
    assert dict(result.waiting) == {}
    with pytest.raises(ValueError, match="backfill_ratio must be a finite number >= 0"):
        grant([], POOLS, {}, backfill_ratio=-1)
    with pytest.raises(ValueError):
        grant([], POOLS, {}, backfill_ratio=math.inf)


# -- decide, with pools ------------------------------------------------------------------------


@PROPERTY
@given(scenarios())
def test_declaring_pools_no_lane_uses_changes_no_decision(sc: Scenario) -> None:
    assert decide(sc.lanes, sc.states, sc.lease, sc.now, sc.profile, probes=sc.probes,
                  unreadable=sc.unreadable, pools=POOLS, holders={"gpu": [], "db": []}
                  ) == sc.decide()


@st.composite
def pooled_scenarios(draw: st.DrawFn) -> tuple[Scenario, dict[str, list[str]]]:
    """A scenario whose heavy lanes are spread over the default pool, ``gpu`` (2 slots) and
    ``db`` (4 slots), some of them needing several slots, and the slots held now (by lanes of
    the pool, or by a lane beat does not know)."""
    sc = draw(scenarios())
    lanes = []
    for spec in sc.lanes:
        if spec.heavy:
            pool = draw(st.sampled_from(sorted(POOLS)))
            spec = replace(spec, pool=pool, slots=draw(st.integers(1, POOLS[pool].slots)),
                           weight=draw(st.sampled_from((1.0, 2.0, 0.5))))
        lanes.append(spec)
    sc = replace(sc, lanes=lanes)
    holders: dict[str, list[str]] = {}
    for pool in ("gpu", "db"):
        members = [s for s in lanes if s.pool == pool]
        held: list[str] = []
        for spec in draw(st.lists(st.sampled_from(members), unique=True)) if members else []:
            if len(held) + spec.slots <= POOLS[pool].slots:
                held += [spec.name] * spec.slots
        if draw(st.booleans()) and len(held) < POOLS[pool].slots:
            held.append("elsewhere")
        holders[pool] = held
    return sc, holders


PICK_REASONS = ("heavy-maintenance-lease-held", "heavy-maintenance-backpressure")


@PROPERTY
@given(pooled_scenarios())
def test_decide_grants_every_pool_by_the_rule(drawn: tuple[Scenario, dict[str, list[str]]]
                                              ) -> None:
    sc, holders = drawn
    decision = decide(sc.lanes, sc.states, sc.lease, sc.now, sc.profile, probes=sc.probes,
                      unreadable=sc.unreadable, pools=POOLS, holders=holders)
    busy = {**holders, "heavy": [sc.lease.lane] if sc.lease is not None else []}
    views = decision.views
    # A lane holding a slot of its pool is in flight, and never granted nor deferred.
    for pool, held in holders.items():
        for lane in held:
            if lane in views and views[lane].spec.pool == pool:
                assert views[lane].in_flight
    grants = ([] if decision.winner is None else [(decision.winner, "heavy")]) + [
        (g.lane, g.pool) for g in decision.pool_grants]
    assert all(pool != "heavy" for _, pool in grants[1 if decision.winner else 0:])
    deferred = {d.lane: d for d in decision.deferred}
    granted = [lane for lane, _ in grants]
    # Every due, idle lane is dispatched, granted or deferred: exactly once.
    due = {n for n, v in views.items() if v.due and not v.in_flight}
    everything = [*granted, *decision.also_dispatched, *deferred]
    assert sorted(everything) == sorted(due)
    for pool, declared in POOLS.items():
        mine = [lane for lane, p in grants if p == pool]
        assert sum(views[lane].spec.slots for lane in mine) <= declared.slots - len(busy[pool])
        # The pool's grants are the rule's, among the lanes that reached the pick (granted,
        # or deferred behind the pick or a holder rather than by a gate).
        reached = [views[n] for n, v in views.items() if v.spec.heavy and v.spec.pool == pool
                   and (n in mine or (n in deferred and deferred[n].reason in PICK_REASONS))]
        if len(busy[pool]) < declared.slots:
            assert oracle(reached, busy, BACKFILL_RATIO)[pool] == mine
        else:
            assert mine == []
            assert {deferred[v.name].blocker for v in reached} <= {busy[pool][0]}
    for d in decision.deferred:
        if d.reason.value == "heavy-maintenance-backpressure":
            assert d.blocker in granted or d.blocker in decision.reserved.values()


def test_decide_with_a_pool_beside_the_lease() -> None:
    def spec(name: str, pool: str = "heavy", slots: int = 1, order: int = 1000) -> LaneSpec:
        return LaneSpec(name=name, task_name=f"t.{name}", kind=HEAVY, cadence_s=60.0,
                        pool=pool, slots=slots, order=order)
    lanes = [spec("backup"), spec("sync"), spec("train", "gpu", 2, order=1),
             spec("infer", "gpu", order=2), spec("embed", "gpu", order=3)]
    states = {s.name: LaneState(run=RunRecord(last_run_at=1000.0 - 90)) for s in lanes}
    # Nothing held: the lease goes to "backup" (order, then name), the two GPU slots to
    # "train" (first by order), which takes both.
    decision = decide(lanes, states, None, 1000.0, pools=POOLS)
    assert decision.winner == "backup"
    assert [(g.lane, g.slots) for g in decision.pool_grants] == [("train", 2)]
    assert decision.dispatched == ("backup", "train")  # the winner, then pool grants
    behind = {d.lane: (d.reason.value, d.blocker) for d in decision.deferred}
    assert behind == {"sync": ("heavy-maintenance-backpressure", "backup"),
                      "infer": ("heavy-maintenance-backpressure", "train"),
                      "embed": ("heavy-maintenance-backpressure", "train")}
    # The lease held and one GPU slot held by "infer": "train" ranks first (ratio 1.4 against
    # embed's 1.1) but does not fit, and is young (its reserve point is ratio 1.5), so
    # "embed" backfills the free slot.
    lease = LeaseView(lane="backup", token="t", fence=1, granted_at=990.0)
    states = {**states, "train": LaneState(run=RunRecord(last_run_at=1000.0 - 84)),
              "embed": LaneState(run=RunRecord(last_run_at=1000.0 - 66))}
    decision = decide(lanes, states, lease, 1000.0, pools=POOLS, holders={"gpu": ["infer"]})
    assert decision.winner is None and [g.lane for g in decision.pool_grants] == ["embed"]
    assert decision.views["infer"].in_flight and not decision.reserved
    behind = {d.lane: (d.reason.value, d.blocker) for d in decision.deferred}
    assert behind == {"sync": ("heavy-maintenance-lease-held", "backup"),
                      "train": ("heavy-maintenance-lease-held", "infer")}
    # Once "train" reaches its reserve point the free slot waits for it.
    states = {**states, "train": LaneState(run=RunRecord(last_run_at=1000.0 - 90))}
    decision = decide(lanes, states, lease, 1000.0, pools=POOLS, holders={"gpu": ["infer"]})
    assert decision.pool_grants == () and decision.reserved == {"gpu": "train"}
    assert {d.lane: d.blocker for d in decision.deferred}["embed"] == "train"
    # A lane of a pool beat does not serve waits, named nowhere else.
    decision = decide([spec("tpu-job", "tpu")], {}, None, 1000.0)
    assert [(d.lane, d.reason.value, d.blocker) for d in decision.deferred] == [
        ("tpu-job", "heavy-maintenance-lease-held", None)]
