"""What a running lane can ask and report: the run context, and the rule for when it yields.

``LaneTask`` makes one :class:`RunContext` per run and sets it as the current run; the lane body
reaches it through the task (``self.should_yield()``, ``self.report_backlog(n)``) or through
:func:`current_run`. The keep-alive threads (:mod:`.keepalive`) flag it lost and hand it the
pressure beat published.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from schedproj.core.pressure import PRESSURE, Pressure, PressureRule, PressureYield, yield_reason
from schedproj.core.pressure import yielded as pressure_yielded
from schedproj.core.records import LeaseView
from schedproj.on_celery.expected import log_failure

if TYPE_CHECKING:
    from schedproj.store.lease import SlotGroup

logger = logging.getLogger("schedproj.on_celery.task")


@dataclass
class RunContext:
    """What a running lane can ask: should I yield? And what it reports: backlog left."""

    lane: str
    task_id: str
    started_at: float
    hold_cap_s: float | None
    fence: int = 0
    backlog: int | None = None
    lost: threading.Event = field(default_factory=threading.Event)
    #: Why the run stops early, when not at the hold cap: the lease's loss (``lost``,
    #: ``max-hold``, …) or ``pressure:<waiting lane>``; it becomes a yielded run's reason.
    lost_reason: str = ""
    yield_seen: bool = False
    #: The lease this run holds (heavy), as it re-asserts it if Redis loses it.
    lease: LeaseView | None = None
    #: The fence of the beat lock its message was sent under (journaled for the audit).
    beat_fence: int = 0
    #: Pressure-aware yielding (None: off). The :class:`LeaseRenewer` sets the rule, keeps
    #: ``pressure`` at what beat published as of the last renewal, and records a pressure
    #: yield through ``on_pressure_yield``.
    pressure_rule: PressureRule | None = None
    pressure: Pressure | None = None
    on_pressure_yield: Callable[[PressureYield], None] | None = None
    pressure_yield: PressureYield | None = None
    #: A heavy run's lease TTL and when (``time.monotonic()``) its last renewal that landed
    #: was sent: ``should_yield`` stops the run once two thirds of a TTL passed since, even
    #: while the renewer thread is still blocked in a call.
    lease_ttl_s: float | None = None
    renewed_at: float | None = None
    #: An operator asked this run to stop (``schedproj clear-lease --stop``): it yields at its
    #: next checkpoint, reports its backlog and releases the lease as a normal yield.
    stop_asked: bool = False
    #: The slot leases of a run in a pool beyond the default (None: the heavy lease, or a
    #: light run).
    slots: SlotGroup | None = None

    def ask_to_stop(self, reason: str) -> None:
        """Yield at the next checkpoint for ``reason`` (the yield's reason); the lease is not
        lost, so it is released normally when the run ends."""
        self.lost_reason = self.lost_reason or reason
        self.stop_asked = True

    def flag_lost(self, reason: str) -> None:
        """The run lost its lease or its mark: it stops at its next checkpoint. The first
        reason given stands."""
        self.lost_reason = self.lost_reason or reason
        self.lost.set()

    def should_yield(self) -> bool:
        """True once the hold cap is reached, the lease is lost, an operator asked the run to
        stop, or a waiting heavy lane presses (:func:`core.pressure.yield_reason` on the
        pressure of the last renewal): stop at this checkpoint. Once True, it stays True for
        this run."""
        if self.yield_seen or self.lost.is_set() or self.stop_asked:
            self.yield_seen = True
            return True
        if (self.lease_ttl_s is not None and self.renewed_at is not None
                and time.monotonic() - self.renewed_at >= self.lease_ttl_s * 2 / 3):
            self.flag_lost("lease-unrenewed")
            self.yield_seen = True
            logger.error("lane %s: no lease renewal landed for %.1fs; yielding", self.lane,
                         time.monotonic() - self.renewed_at)
            return True
        now = time.time()
        reason = yield_reason(held_s=now - self.started_at, hold_cap_s=self.hold_cap_s,
                              pressure=self.pressure, rule=self.pressure_rule, now=now,
                              fence=self.fence)
        if reason is None:
            return False
        self.yield_seen = True
        if reason == PRESSURE and self.pressure is not None:
            self._yield_to(self.pressure, now)
        return True

    def _yield_to(self, pressure: Pressure, now: float) -> None:
        """Name the pressing lane as the yield's reason and record the pressure yield."""
        self.lost_reason = self.lost_reason or f"{PRESSURE}:{pressure.lane}"
        self.pressure_yield = pressure_yielded(lane=self.lane, task_id=self.task_id,
                                               fence=self.fence, held_s=now - self.started_at,
                                               now=now, pressure=pressure)
        logger.info("lane %s: yielding to pressure from %s (ratio %.2f) after holding %.1fs",
                    self.lane, pressure.lane, self.pressure_yield.ratio,
                    self.pressure_yield.held_s)
        if self.on_pressure_yield is not None:
            try:
                self.on_pressure_yield(self.pressure_yield)
            except Exception as exc:  # a record we could not write never stops the yield
                log_failure(logger, exc, "lane %s: could not record the pressure yield",
                            self.lane)


#: The run executing in this thread, and the family member the current call runs (None: a
#: lane of its own).
current: ContextVar[RunContext | None] = ContextVar("schedproj_run", default=None)
member: ContextVar[str | None] = ContextVar("schedproj_member", default=None)


def current_run() -> RunContext | None:
    """The context of the lane run executing in this thread, if any."""
    return current.get()


__all__ = ["RunContext", "current_run"]
