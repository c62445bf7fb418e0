"""The threads that keep a running lane's claim alive: :class:`LeaseRenewer` renews a heavy
run's lease, :class:`RunHeartbeat` refreshes a light run's in-flight mark. Either flags the run
lost (it stops at its next checkpoint) once it can no longer be sure its claim still holds."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from schedproj.core import lifecycle
from schedproj.core.errors import StateError
from schedproj.core.picker import Policy
from schedproj.core.pressure import PressureYield, encode_yield
from schedproj.core.pressure import decode as decode_pressure
from schedproj.core.records import RunRecord
from schedproj.on_celery.expected import log_failure
from schedproj.on_celery.run_context import RunContext
from schedproj.on_celery.run_records import CONTENDED, swap_run
from schedproj.on_celery.runtime import Runtime
from schedproj.store.lease import HeavyLease, SlotGroup

#: The reason a run that stopped for an operator yielded with.
OPERATOR_STOP = "operator-stop"

logger = logging.getLogger("schedproj.on_celery.task")


#: The name of a kept keep-alive thread between loops (in a loop: the loop's own name).
IDLE_NAME = "schedproj-keepalive"


class _Runner(threading.Thread):
    """One kept thread: runs one keep-alive loop at a time, then waits for the next."""

    def __init__(self, runners: _Runners) -> None:
        super().__init__(name=IDLE_NAME, daemon=True)
        self.runners = runners
        self.handed = threading.Event()
        self.job: tuple[Callable[[], None], str, Callable[[], None]] | None = None

    def hand(self, target: Callable[[], None], name: str, done: Callable[[], None]) -> None:
        self.job = (target, name, done)
        self.handed.set()

    def run(self) -> None:
        while True:
            self.handed.wait()
            self.handed.clear()
            job, self.job = self.job, None
            if job is None:
                continue
            target, self.name, done = job
            try:
                target()
            except BaseException:  # what a thread of its own would have printed
                logger.exception("keep-alive loop %s failed", self.name)
            finally:
                # Idle before it says done: whoever waited for the loop's end finds the
                # thread free for the next one.
                self.name = IDLE_NAME
                self.runners.idle(self)
                done()


class _Runners:
    """The threads that run keep-alive loops, kept between runs. A new thread's start waits
    for the OS to schedule it (``Thread.start`` blocks until it runs): about 1 ms at the
    median on the hand-off's path, between the lease's start and the body, 4 at p90 on a busy
    machine. A kept idle thread is handed the loop and the run goes on at once. Each loop has
    a thread to itself (a new one when none is idle), so no renewal ever waits behind
    another run's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Runner] = []

    def run(self, target: Callable[[], None], name: str, done: Callable[[], None]) -> None:
        """Run ``target`` on a thread of its own (a kept idle one if any); ``done`` after."""
        with self._lock:
            runner = self._idle.pop() if self._idle else None
        if runner is None:
            runner = _Runner(self)
            runner.start()
        runner.hand(target, name, done)

    def idle(self, runner: _Runner) -> None:
        with self._lock:
            self._idle.append(runner)

    def forget(self) -> None:
        """After a fork: the parent's threads do not exist in the child (and its lock may
        have been held by one of them)."""
        self._lock, self._idle = threading.Lock(), []


_runners = _Runners()
os.register_at_fork(after_in_child=_runners.forget)


class LeaseRenewer:
    """Renews the heavy lease every third of its TTL; flags the run lost when it cannot. Each
    renewal's reply carries the pressure beat published, which the run's
    :meth:`RunContext.should_yield` weighs (pressure-aware yielding, if on). Its loop runs on
    a kept thread (:class:`_Runners`), started with :meth:`start` as a thread's would be."""

    def __init__(self, rt: Runtime, token: str, ctx: RunContext,
                 lease: HeavyLease | SlotGroup | None = None) -> None:
        self.name = f"schedproj-renew-{ctx.lane}"
        self.rt, self.token, self.ctx = rt, token, ctx
        #: What it renews: the run's slot leases, or (None) the heavy lease.
        self.lease = lease
        self.stopped = threading.Event()
        #: Held for each renewal and what follows from its answer: the run's end takes it
        #: after setting ``stopped``, so it waits for a renewal in progress (its answer lands
        #: before the outcome, never after it) and not for the thread to wake and exit.
        self.busy = threading.Lock()
        self._bad_pressure: str | None = None
        self._last_ok = 0.0
        self._started = False
        #: Set once the loop has returned (what a thread's join waits for).
        self.ended = threading.Event()
        ctx.on_pressure_yield = self.record_pressure_yield

    def start(self) -> None:
        """Start renewing on a kept thread; returns at once."""
        if self._started:
            raise RuntimeError("a lease renewer can only be started once")
        self._started = True
        # Set here, not by the loop: the body may check its lease before the kept thread
        # gets to run.
        self.ctx.lease_ttl_s, self.ctx.renewed_at = self.rt.settings.lease_ttl_s, time.monotonic()
        _runners.run(self.run, self.name, self.ended.set)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the loop to return (after :meth:`finish` or a lost lease)."""
        self.ended.wait(timeout)

    def is_alive(self) -> bool:
        return self._started and not self.ended.is_set()

    def finish(self, timeout_s: float) -> None:
        """Stop renewing: no renewal starts after this returns, and one in progress has
        landed (or ``timeout_s`` passed, as a join's would)."""
        self.stopped.set()
        if self.busy.acquire(timeout=timeout_s):
            self.busy.release()

    def run(self) -> None:
        s = self.rt.settings
        lease = self.lease or getattr(self.rt, "renewal", None) or self.rt.lease
        self._last_ok = time.monotonic()
        while not self.stopped.wait(s.lease_ttl_s / 3):
            with self.busy:
                if self.stopped.is_set() or not self._renew_once(lease):
                    return

    def _renew_once(self, lease: HeavyLease | SlotGroup) -> bool:
        """One renewal and what follows from its answer; False once the lease is lost (the
        thread ends)."""
        s = self.rt.settings
        sent = time.monotonic()
        try:
            reply = lease.renew(self.token, s.lease_ttl_s, time.time(), s.max_hold_s,
                                reassert=self.ctx.lease)
            ok, reason = reply
        except Exception as exc:
            # Redis unreachable: the server counts the TTL from the last renewal that
            # landed, so give up a third of a TTL before it can expire there - measured
            # now, after the call, which may have blocked for its socket timeout. An
            # outcome the design expects: one line, no traceback.
            ok, reason = False, "redis-unreachable"
            log_failure(logger, exc, "lane %s: cannot renew the heavy lease", self.ctx.lane)
            if time.monotonic() - self._last_ok < s.lease_ttl_s * 2 / 3:
                return True
        if ok:
            self._last_ok = self.ctx.renewed_at = sent
            self.learn(reply.pressure)
            self.heed_operator(lease)
            if reason == "reasserted":
                logger.warning("lane %s: the heavy lease had vanished (Redis lost state); "
                               "re-asserted it (fence %d)", self.ctx.lane, self.ctx.fence)
            return True
        # The lease's own word on why it is gone outranks any reason noted before.
        self.ctx.lost_reason = reason
        self.ctx.lost.set()
        logger.error("lane %s: heavy lease lost (%s); yielding at the next checkpoint",
                     self.ctx.lane, reason)
        return False

    def heed_operator(self, lease: HeavyLease | SlotGroup) -> None:
        """Yield at the next checkpoint when an operator asked this run to stop
        (``schedproj clear-lease --stop``). A request that cannot be read is no request."""
        if self.ctx.stop_asked:
            return
        try:
            request = lease.request(self.ctx.task_id)
        except Exception as exc:
            log_failure(logger, exc, "lane %s: cannot read the operator's requests",
                        self.ctx.lane)
            return
        if request is not None and request.action == "stop":
            self.ctx.ask_to_stop(OPERATOR_STOP)
            logger.warning("lane %s: an operator asked this run to stop (schedproj clear-lease "
                           "--stop); yielding at the next checkpoint", self.ctx.lane)

    def learn(self, raw: str | None) -> None:
        """Hand the run the pressure a renewal returned, and the rule to weigh it by (off
        under the legacy picker, which models the original system). Garbage is reported once
        and read as no pressure: it must never stop the run or its renewals."""
        s = self.rt.settings
        self.ctx.pressure_rule = s.pressure_rule if s.policy is not Policy.REGISTRY else None
        try:
            key = (self.ctx.slots.keys if self.ctx.slots is not None else self.rt.keys).pressure
            self.ctx.pressure = decode_pressure(raw, f"{key} field current")
        except StateError as exc:
            self.ctx.pressure = None
            if raw != self._bad_pressure:
                self._bad_pressure = raw
                logger.warning("lane %s: ignoring the published pressure: %s", self.ctx.lane,
                               exc)

    def record_pressure_yield(self, record: PressureYield) -> None:
        """``last-yield`` and ``yields`` of the pressure hash (a pool run's: its pool's), in
        one round trip."""
        key = (self.ctx.slots.keys if self.ctx.slots is not None else self.rt.keys).pressure
        pipe = self.rt.store.client.pipeline(transaction=True)
        pipe.hset(key, "last-yield", encode_yield(record))
        pipe.hincrby(key, "yields", 1)
        pipe.execute()


class RunHeartbeat(threading.Thread):
    """Keeps a light run's in-flight mark alive while it runs, so a worker killed outright
    frees its lane within the lease TTL instead of the whole light time limit.

    Beat counts the run in flight until one TTL past its mark, then records it lost and may
    dispatch the lane again; so the run is flagged lost (``should_yield`` turns True: it stops
    at its next checkpoint) once no refresh has landed for two thirds of a TTL, or at once when
    the record no longer names it."""

    def __init__(self, rt: Runtime, ctx: RunContext) -> None:
        super().__init__(name=f"schedproj-heartbeat-{ctx.lane}", daemon=True)
        self.rt, self.ctx = rt, ctx
        self.stopped = threading.Event()

    def finish(self, timeout_s: float) -> None:
        """Stop refreshing; a refresh in progress lands first (a light run's end is not on
        the heavy hand-off's path: joined)."""
        self.stopped.set()
        self.join(timeout=timeout_s)

    def run(self) -> None:
        ttl = self.rt.settings.lease_ttl_s
        last_ok = time.monotonic()
        while not self.stopped.wait(ttl / 3):
            try:
                if self.refresh(ttl):
                    last_ok = time.monotonic()
                    continue
                self._lost("in-flight-mark-lost")
                return
            except Exception as exc:
                log_failure(logger, exc, "lane %s: cannot refresh the in-flight mark",
                            self.ctx.lane)
            # Measured after the failed call, which may have blocked for its socket timeout.
            if time.monotonic() - last_ok >= ttl * 2 / 3:
                self._lost("in-flight-mark-unrefreshed")
                return

    def _lost(self, reason: str) -> None:
        self.ctx.flag_lost(reason)
        logger.error("lane %s: in-flight mark lost (%s); stopping at the next checkpoint",
                     self.ctx.lane, reason)

    def refresh(self, ttl: float) -> bool:
        """Push the mark's end one TTL ahead on Redis's clock (compare and set). A mark that
        vanished, or that Redis lost state under (the record names another run while the
        epoch says state may be lost), is re-asserted; False once a newer run owns the record
        or ours was ended. Raises when Redis cannot be reached or the record stays contended."""
        swap = swap_run(self.rt.store, self.ctx.lane, lambda record: self._refreshed(record, ttl),
                        tries=3, mark_ttl_s=ttl)
        if swap.reason == CONTENDED:
            raise RuntimeError("the run record stayed contended")
        return swap.written

    def _refreshed(self, record: RunRecord, ttl: float) -> RunRecord | str:
        """The record with our mark pushed ahead (or put back); a reason when it is not ours."""
        now = time.time()
        if record.running_task_id == self.ctx.task_id:
            return replace(record, running_until=now + ttl)
        if record.last_task_id != self.ctx.task_id and (
                record.running_task_id is None or self.rt.store.state_uncertain()):
            # Our mark vanished, or Redis lost state (a failover to a replica that lags by a
            # run of this lane names the previous run as running): put it back. Nothing was
            # dispatched since the loss, so that other mark is stale.
            logger.warning("lane %s: the in-flight mark had vanished (Redis lost state); "
                           "re-asserted it", self.ctx.lane)
            return lifecycle.started(record, task_id=self.ctx.task_id,
                                     now=self.ctx.started_at, running_until=now + ttl)
        return "not-ours"


__all__ = ["OPERATOR_STOP", "LeaseRenewer", "RunHeartbeat"]
