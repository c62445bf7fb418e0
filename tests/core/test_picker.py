"""The heavy pick (core/picker.py), DESIGN §3 promise 4: priority-0 wins whenever due;
otherwise the largest staleness ratio; ties by declared order, then name — never by the order
the candidates come in. The registry policy (kept to show starvation) takes declared order."""

from __future__ import annotations

import itertools
import math

import pytest

from schedproj.core.lanes import LaneKind, LaneSpec
from schedproj.core.picker import Policy, pick, rank_key
from schedproj.core.views import LaneView


def view(name: str, ratio: float, order: int = 100, priority0: bool = False) -> LaneView:
    spec = LaneSpec(name=name, task_name=f"t.{name}", kind=LaneKind.HEAVY, cadence_s=60,
                    order=order, priority0=priority0)
    return LaneView(spec=spec, ratio=ratio, backlog=0, due=True, in_flight=False,
                    never_run=math.isinf(ratio))


def winner(views: list[LaneView], policy: Policy = Policy.STALENESS) -> str | None:
    """The pick, checked to be the same for every order the candidates may come in."""
    names = {p.name if (p := pick(list(perm), policy)) else None
             for perm in itertools.permutations(views)}
    assert len(names) == 1, names
    return names.pop()


def test_no_candidates_no_winner() -> None:
    assert pick([]) is None
    assert pick(iter(()), Policy.REGISTRY) is None


def test_priority0_wins_over_any_ratio() -> None:
    assert winner([view("stale", math.inf), view("p0", 0.1, order=999, priority0=True)]) == "p0"


def test_the_largest_ratio_wins_otherwise() -> None:
    assert winner([view("a", 1.5, order=1), view("b", 2.5, order=9), view("c", 2.0)]) == "b"


def test_ties_go_by_declared_order_then_name() -> None:
    assert winner([view("b", 2.0, order=1), view("a", 2.0, order=2)]) == "b"
    assert winner([view("b", 2.0, order=1), view("a", 2.0, order=1)]) == "a"
    assert winner([view("z", 1.0, priority0=True, order=5),
                   view("y", 1.0, priority0=True, order=5)]) == "y"


def test_among_priority0_lanes_the_stalest_wins() -> None:
    assert winner([view("a", 1.0, priority0=True), view("b", 3.0, priority0=True)]) == "b"


def test_the_registry_policy_takes_declared_order_whatever_the_ratio() -> None:
    views = [view("stale", 50.0, order=2), view("first", 1.0, order=1),
             view("p0", 9.0, order=3, priority0=True)]
    assert winner(views, Policy.REGISTRY) == "first"
    assert winner([view("b", 1.0, order=1), view("a", 9.0, order=1)], Policy.REGISTRY) == "a"


@pytest.mark.parametrize(("a", "b"), [
    (view("x", 1.0, priority0=True), view("y", 9.0)),
    (view("x", 2.0), view("y", 1.0)),
    (view("x", 1.0, order=1), view("y", 1.0, order=2)),
    (view("x", 1.0), view("y", 1.0))])
def test_the_rank_key_orders_the_better_lane_first(a: LaneView, b: LaneView) -> None:
    assert rank_key(a) < rank_key(b)
    assert rank_key(a) == (0 if a.spec.priority0 else 1, -a.ratio, a.spec.order, "x")
