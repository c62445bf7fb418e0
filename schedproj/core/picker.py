"""The staleness-ratio picker (ADR 0022 "A"), and the legacy policy kept for comparison. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from schedproj.core.views import LaneView


class Policy(StrEnum):
    """How the heavy winner is chosen."""

    #: Priority-0 first, then the largest weighted staleness ratio (``weight x ratio``), then
    #: declared order, then name.
    STALENESS = "staleness"
    #: The old system: the first due lane in declared order. Kept only to show starvation.
    REGISTRY = "registry"


def rank_key(view: LaneView) -> tuple[int, float, int, str]:
    """Sort key: smallest first wins. Priority-0, then the weighted ratio ``weight x ratio``
    (desc; weight 1 by default, so plainly the ratio), then order, then name. A weight scales
    the ranking only: whether a lane is due never depends on it."""
    return (0 if view.spec.priority0 else 1, -(view.spec.weight * view.ratio), view.spec.order,
            view.spec.name)


def pick(candidates: Iterable[LaneView], policy: Policy = Policy.STALENESS) -> LaneView | None:
    """Choose the heavy winner among due, eligible heavy candidates (or None)."""
    pool = list(candidates)
    if not pool:
        return None
    if policy is Policy.REGISTRY:
        return min(pool, key=lambda v: v.spec.sort_key)
    return min(pool, key=rank_key)
