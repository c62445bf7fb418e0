"""``pressure.outranks``: would the picker choose the newly measured pressing lane over the one
beat published? (A partial tick republishes only then.) It ranks by the picker's own key."""

from __future__ import annotations

import pytest

from schedproj.core.lanes import LaneKind, LaneSpec
from schedproj.core.picker import pick
from schedproj.core.pressure import Pressure, outranks
from schedproj.core.views import LaneView

NOW = 1_000_000.0
SPECS = {
    "a": LaneSpec(name="a", task_name="a", kind=LaneKind.HEAVY, cadence_s=60, order=1),
    "b": LaneSpec(name="b", task_name="b", kind=LaneKind.HEAVY, cadence_s=600, order=2),
    "p0": LaneSpec(name="p0", task_name="p0", kind=LaneKind.HEAVY, cadence_s=86400,
                   priority0=True, order=3),
}


def pressing(lane: str, last_run_ago: float | None) -> Pressure:
    spec = SPECS[lane]
    return Pressure(lane=lane, cadence_s=spec.cadence_s,
                    last_run_at=None if last_run_ago is None else NOW - last_run_ago,
                    priority0=spec.priority0, fence=7, at=NOW - 5)


def test_the_staler_lane_outranks() -> None:
    assert outranks(pressing("a", 180), pressing("b", 1200), NOW, SPECS.get)  # 3 > 2
    assert not outranks(pressing("b", 1200), pressing("a", 180), NOW, SPECS.get)


def test_priority0_outranks_any_ratio_and_never_run_outranks_a_ratio() -> None:
    assert outranks(pressing("p0", 0), pressing("a", 1e6), NOW, SPECS.get)
    assert outranks(pressing("a", None), pressing("b", 1e6), NOW, SPECS.get)


def test_equal_ratios_go_by_declared_order_as_the_picker_does() -> None:
    a, b = pressing("a", 120), pressing("b", 1200)  # both ratio 2
    assert outranks(a, b, NOW, SPECS.get) and not outranks(b, a, NOW, SPECS.get)
    assert not outranks(a, a, NOW, SPECS.get)


def test_nothing_never_outranks_and_anything_outranks_nothing_or_a_lane_gone() -> None:
    assert not outranks(None, pressing("a", 60), NOW, SPECS.get)
    assert outranks(pressing("a", 60), None, NOW, SPECS.get)
    gone = Pressure(lane="gone", cadence_s=1, last_run_at=None, priority0=True, fence=7, at=NOW)
    assert outranks(pressing("a", 60), gone, NOW, SPECS.get)
    assert not outranks(gone, pressing("a", 60), NOW, SPECS.get)


@pytest.mark.parametrize("new,old", [("a", "b"), ("b", "a"), ("a", "p0"), ("p0", "b")])
@pytest.mark.parametrize("ago", [(30.0, 30.0), (600.0, 60.0), (60.0, 6000.0), (None, 10.0)])
def test_outranks_agrees_with_the_picker(new: str, old: str,
                                         ago: tuple[float | None, float | None]) -> None:
    n, o = pressing(new, ago[0]), pressing(old, ago[1])
    views = [LaneView(spec=SPECS[p.lane], ratio=p.ratio(NOW), backlog=0, due=True,
                      in_flight=False, never_run=p.last_run_at is None) for p in (o, n)]
    winner = pick(views)
    assert winner is not None
    assert outranks(n, o, NOW, SPECS.get) == (winner.name == new)
