"""Pressure-aware yielding per pool: beat publishes, for each pool beyond the default, the
waiting lane of that pool pressing on the pool's longest holder (``core.pressure.measure`` on
the pool's lanes alone), in the pool's pressure hash (``Keys.slot(pool, i).pressure``). The
holders read it in their slot renewals, as the heavy lease's holder reads the lease's; only
the holder whose fence it names yields. A waiter presses only on the holders of its own pool.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

import redis

from schedproj.core.picker import Policy
from schedproj.core.pipeline import Decision
from schedproj.core.pressure import Pressure, changed, measure, outranks
from schedproj.core.pressure import encode as encode_pressure
from schedproj.core.records import LaneState, LeaseView
from schedproj.core.views import LaneView
from schedproj.on_celery.runtime import Runtime
from schedproj.on_celery.tick_lanes import TickLanes

logger = logging.getLogger("schedproj.beat")


def longest_holder(leases: Sequence[LeaseView | None]) -> LeaseView | None:
    """The pool's hold that began first (granted, or started, earliest), as its run knows it:
    with the highest fence among the slots its lane holds (a lane taking k slots runs under
    the highest of their fences). None when no slot is held by a known lane."""
    held = [lease for lease in leases if lease is not None and lease.lane]
    if not held:
        return None
    first = min(held, key=lambda lease: (lease.started_at or lease.granted_at, lease.fence))
    fence = max(lease.fence for lease in held if lease.lane == first.lane)
    return replace(first, fence=fence)


class PoolPressure:
    """Publishes each pool's pressure when it changed (a tick that changes nothing costs no
    write); a beat that just took the lock, or Redis that lost state, writes it again."""

    def __init__(self, rt: Runtime, lanes: TickLanes) -> None:
        self.rt, self.lanes = rt, lanes
        #: What this beat last published per pool.
        self.published: dict[str, Pressure | None] = {}
        self.failing: set[str] = set()

    def publish(self, decision: Decision, slots: Mapping[str, Sequence[LeaseView | None]],
                granted: Mapping[str, Sequence[LeaseView]], states: Mapping[str, LaneState],
                now: float, *, fresh: bool, partial: Collection[str] = ()) -> None:
        """``slots``: each pool's slot leases as read this tick; ``granted``: the slot
        leases this tick granted (the lanes it deferred press on those holds too);
        ``partial``: the pools whose waiters this tick skipped (their holds unchanged,
        ``TickMemory.focus``): what was published for such a pool stands unless a lane the
        tick did see outranks it — measured without its skipped waiters it would read as
        nobody pressing, and the holder would never hear of them."""
        if fresh:
            self.published.clear()
        legacy = self.rt.settings.policy is Policy.REGISTRY
        # Each pool's heavy views, in one pass over the views (a tick may view 10,000 due
        # lanes; a pass per pool cost a third of the ranking tick's extra time over the lease).
        by_pool: dict[str, dict[str, LaneView]] = {pool: {} for pool in slots}
        # A lane granted a slot this tick holds it: its view (taken before the grant) does
        # not say so, and it presses on nobody.
        holding = {lease.lane for leases in granted.values() for lease in leases}
        for name, view in decision.views.items():
            mine = by_pool.get(view.spec.pool)
            if mine is not None and view.spec.heavy and name not in holding:
                mine[name] = view
        for pool, leases in slots.items():
            views = by_pool[pool]
            holder = longest_holder([*leases, *granted.get(pool, ())])
            pressure = measure(replace(decision, views=views), states, holder, now,
                               legacy=legacy)
            if pool in self.published and (
                    not changed(self.published[pool], pressure) or (pool in partial and not
                    outranks(pressure, self.published[pool], now, self.lanes.spec))):
                continue
            self._write(pool, pressure)

    def pressing(self) -> dict[str, str]:
        """The lane each pool's published pressure names, with the pool (lane -> pool)."""
        return {p.lane: pool for pool, p in self.published.items() if p is not None}

    def _write(self, pool: str, pressure: Pressure | None) -> None:
        key = self.rt.keys.slot(pool, 0).pressure
        try:
            self.rt.store.client.hset(key, "current", encode_pressure(pressure))
        except redis.ResponseError as exc:
            if pool not in self.failing:
                logger.error("cannot publish the pressure on pool %s (%s); delete the key %s",
                             pool, exc, key)
            self.failing.add(pool)
            return
        self.failing.discard(pool)
        self.published[pool] = pressure


__all__ = ["PoolPressure", "longest_holder"]
