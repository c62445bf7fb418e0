"""The worker side of a lane: :class:`LaneTask`, the base class every lane task uses.

A heavy run checks the lease token its message carries before running, renews the lease while
it runs, and releases it by token when it ends (completed, failed or yielded), recording the
outcome and waking beat in the same atomic step. A stale, forged or missing token means the
run is skipped: recorded, and nothing runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any

from billiard.exceptions import WorkerLostError
from celery import Task
from celery.exceptions import TimeLimitExceeded

from schedproj.core import lifecycle
from schedproj.core.dueindex import due_at
from schedproj.core.errors import LeaseLost, StateError
from schedproj.core.families import FamilyError, LaneFamily, check_key, member_lane
from schedproj.core.lanes import Lane, LaneKind
from schedproj.core.picker import Policy
from schedproj.core.pressure import (
    PRESSURE,
    Pressure,
    PressureRule,
    PressureYield,
    encode_yield,
    yield_reason,
    yielded,
)
from schedproj.core.pressure import decode as decode_pressure
from schedproj.core.records import LaneState, LeaseView, Outcome, RunRecord

# Imported for its worker_ready hook: a restarted worker frees its dead predecessor's lease.
from schedproj.on_celery import recovery
from schedproj.on_celery.messages import LEASE_KWARG, Dispatch, pop_dispatch
from schedproj.on_celery.runtime import Runtime, runtime_for
from schedproj.store.lease import Holder
from schedproj.store.protocol import CounterKind, counter_field

logger = logging.getLogger(__name__)



#: The family member the current call runs (None: a lane of its own).
_member: ContextVar[str | None] = ContextVar("schedproj_member", default=None)


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

    def should_yield(self) -> bool:
        """True once the hold cap is reached, the lease is lost, or a waiting heavy lane
        presses (:func:`core.pressure.yield_reason` on the pressure of the last renewal):
        stop at this checkpoint. Once True, it stays True for this run."""
        if self.yield_seen or self.lost.is_set():
            self.yield_seen = True
            return True
        if (self.lease_ttl_s is not None and self.renewed_at is not None
                and time.monotonic() - self.renewed_at >= self.lease_ttl_s * 2 / 3):
            self.lost_reason = self.lost_reason or "lease-unrenewed"
            self.lost.set()
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
        self.pressure_yield = yielded(lane=self.lane, task_id=self.task_id, fence=self.fence,
                                      held_s=now - self.started_at, now=now, pressure=pressure)
        logger.info("lane %s: yielding to pressure from %s (ratio %.2f) after holding %.1fs",
                    self.lane, pressure.lane, self.pressure_yield.ratio,
                    self.pressure_yield.held_s)
        if self.on_pressure_yield is not None:
            try:
                self.on_pressure_yield(self.pressure_yield)
            except Exception:  # a record we could not write never stops the run's yield
                logger.warning("lane %s: could not record the pressure yield", self.lane,
                               exc_info=True)


_current: ContextVar[RunContext | None] = ContextVar("schedproj_run", default=None)


def current_run() -> RunContext | None:
    """The context of the lane run executing in this thread, if any."""
    return _current.get()


class LeaseRenewer(threading.Thread):
    """Renews the heavy lease every third of its TTL; flags the run lost when it cannot. Each
    renewal's reply carries the pressure beat published, which the run's
    :meth:`RunContext.should_yield` weighs (pressure-aware yielding, if on)."""

    def __init__(self, rt: Runtime, token: str, ctx: RunContext) -> None:
        super().__init__(name=f"schedproj-renew-{ctx.lane}", daemon=True)
        self.rt, self.token, self.ctx = rt, token, ctx
        self.stopped = threading.Event()
        self._bad_pressure: str | None = None
        ctx.on_pressure_yield = self.record_pressure_yield

    def run(self) -> None:
        s = self.rt.settings
        self.ctx.lease_ttl_s, self.ctx.renewed_at = s.lease_ttl_s, time.monotonic()
        lease = getattr(self.rt, "renewal", None) or self.rt.lease
        last_ok = time.monotonic()
        while not self.stopped.wait(s.lease_ttl_s / 3):
            sent = time.monotonic()
            try:
                reply = lease.renew(self.token, s.lease_ttl_s, time.time(), s.max_hold_s,
                                    reassert=self.ctx.lease)
                ok, reason = reply
            except Exception:
                # Redis unreachable: the server counts the TTL from the last renewal that
                # landed, so give up a third of a TTL before it can expire there - measured
                # now, after the call, which may have blocked for its socket timeout.
                ok, reason = False, "redis-unreachable"
                logger.warning("lane %s: cannot renew the heavy lease", self.ctx.lane,
                               exc_info=True)
                if time.monotonic() - last_ok < s.lease_ttl_s * 2 / 3:
                    continue
            if ok:
                last_ok = self.ctx.renewed_at = sent
                self.learn(reply.pressure)
                if reason == "reasserted":
                    logger.warning("lane %s: the heavy lease had vanished (Redis lost state); "
                                   "re-asserted it (fence %d)", self.ctx.lane, self.ctx.fence)
                continue
            self.ctx.lost_reason = reason
            self.ctx.lost.set()
            logger.error("lane %s: heavy lease lost (%s); yielding at the next checkpoint",
                         self.ctx.lane, reason)
            return

    def learn(self, raw: str | None) -> None:
        """Hand the run the pressure a renewal returned, and the rule to weigh it by (off
        under the legacy picker, which models the original system). Garbage is reported once
        and read as no pressure: it must never stop the run or its renewals."""
        s = self.rt.settings
        self.ctx.pressure_rule = s.pressure_rule if s.policy is not Policy.REGISTRY else None
        try:
            self.ctx.pressure = decode_pressure(raw, f"{self.rt.keys.pressure} field current")
        except StateError as exc:
            self.ctx.pressure = None
            if raw != self._bad_pressure:
                self._bad_pressure = raw
                logger.warning("lane %s: ignoring the published pressure: %s", self.ctx.lane,
                               exc)

    def record_pressure_yield(self, record: PressureYield) -> None:
        """``last-yield`` and ``yields`` of the pressure hash, in one round trip."""
        pipe = self.rt.store.client.pipeline(transaction=True)
        pipe.hset(self.rt.keys.pressure, "last-yield", encode_yield(record))
        pipe.hincrby(self.rt.keys.pressure, "yields", 1)
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
            except Exception:
                logger.warning("lane %s: cannot refresh the in-flight mark", self.ctx.lane,
                               exc_info=True)
            # Measured after the failed call, which may have blocked for its socket timeout.
            if time.monotonic() - last_ok >= ttl * 2 / 3:
                self._lost("in-flight-mark-unrefreshed")
                return

    def _lost(self, reason: str) -> None:
        self.ctx.lost_reason = self.ctx.lost_reason or reason
        self.ctx.lost.set()
        logger.error("lane %s: in-flight mark lost (%s); stopping at the next checkpoint",
                     self.ctx.lane, reason)

    def refresh(self, ttl: float) -> bool:
        """Push the mark's end one TTL ahead on Redis's clock (compare and set). A mark that
        vanished, or that Redis lost state under (the record names another run while the
        epoch says state may be lost), is re-asserted; False once a newer run owns the record
        or ours was ended. Raises when Redis cannot be reached or the record stays contended."""
        for _ in range(3):
            raw, record = self.rt.store.read_run_raw(self.ctx.lane)
            now = time.time()
            if record.running_task_id == self.ctx.task_id:
                new = replace(record, running_until=now + ttl)
            elif record.last_task_id != self.ctx.task_id and (
                    record.running_task_id is None or self.rt.store.state_uncertain()):
                # Our mark vanished, or Redis lost state (a failover to a replica that lags
                # by a run of this lane names the previous run as running): put it back.
                # Nothing was dispatched since the loss, so that other mark is stale.
                new = lifecycle.started(record, task_id=self.ctx.task_id,
                                        now=self.ctx.started_at, running_until=now + ttl)
                logger.warning("lane %s: the in-flight mark had vanished (Redis lost state); "
                               "re-asserted it", self.ctx.lane)
            else:
                return False
            ok, _ = self.rt.store.cas_run(self.ctx.lane, raw, new, mark_ttl_s=ttl)
            if ok:
                return True
        raise RuntimeError("the run record stayed contended")


class LaneTask(Task):  # type: ignore[misc]
    """Base class for lane tasks: ``@app.task(base=LaneTask, lane=Lane(...))``."""

    abstract = True
    lane: Lane | None = None
    acks_late = True
    reject_on_worker_lost = True
    # The lease grant rides as an extra keyword the lane body never sees (popped in __call__),
    # so Celery's client-side signature check must not reject it.
    typing = False

    # -- what a lane body calls -------------------------------------------------------------
    def should_yield(self) -> bool:
        ctx = _current.get()
        return ctx.should_yield() if ctx is not None else False

    def report_backlog(self, remaining: int) -> None:
        """Say how much work this run left; a lane with backlog stays due."""
        ctx = _current.get()
        if ctx is not None:
            ctx.backlog = max(0, int(remaining))

    @property
    def fence(self) -> int:
        """The fencing number of the lease this run holds (0 for light lanes)."""
        ctx = _current.get()
        return ctx.fence if ctx is not None else 0

    # -- execution --------------------------------------------------------------------------
    @property
    def lane_name(self) -> str:
        """The lane this call runs: the task's lane, or for a family the member named by the
        call's key (its first argument)."""
        assert self.lane is not None
        member = _member.get()
        return member if member is not None else (self.lane.name or str(self.name))

    @property
    def family_name(self) -> str | None:
        return (self.lane.name or str(self.name)) if isinstance(self.lane, LaneFamily) else None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        dispatch = pop_dispatch(kwargs)
        if self.lane is None:
            return super().__call__(*args, **kwargs)
        family = self.family_name
        if family is None:
            return self._call(dispatch, args, kwargs)
        key = args[0] if args else kwargs.get("key")
        try:
            check_key(family, key)
        except FamilyError as exc:
            logger.error("%s; nothing ran", exc)
            return {"outcome": Outcome.SKIPPED.value, "reason": "bad-member-key"}
        reset = _member.set(member_lane(family, str(key)))
        try:
            return self._call(dispatch, args, kwargs)
        finally:
            _member.reset(reset)

    def _call(self, dispatch: Dispatch | None, args: Any, kwargs: Any) -> Any:
        assert self.lane is not None
        rt = runtime_for(self.app)
        task_id = str(getattr(self.request, "id", None) or "")
        if self.lane.kind is LaneKind.HEAVY:
            return self._run_heavy(rt, task_id, dispatch, args, kwargs)
        return self._run_light(rt, task_id, dispatch, args, kwargs)

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any,
                   einfo: Any) -> None:
        """Record runs that died where ``__call__`` could not: the hard time limit kills the
        pool process, and Celery calls this in the worker's main process instead."""
        if self.lane is None or not isinstance(exc, TimeLimitExceeded | WorkerLostError):
            return
        rt = runtime_for(self.app)
        family = self.family_name
        if family is not None and args:
            with contextlib.suppress(FamilyError):
                _member.set(member_lane(family, check_key(family, args[0])))
        try:
            before = rt.store.read_run(self.lane_name)
        except StateError:
            before = None
        if before is not None and before.running_task_id != task_id:
            return  # never started here (or already recorded): nothing to close
        grant = (kwargs or {}).get(LEASE_KWARG)  # the message's own, as Celery passes it
        token = grant.get("token", "") if isinstance(grant, dict) else ""
        ctx = RunContext(lane=self.lane_name, task_id=task_id,
                         started_at=(before.running_since if before else None) or time.time(),
                         hold_cap_s=None, fence=before.fence if before else 0)
        ctx.backlog = before.backlog if before else None
        self._record(rt, ctx, before, Outcome.FAILED, f"{type(exc).__name__}: {exc}",
                     str(token) if isinstance(token, str) else "")

    def _run_heavy(self, rt: Runtime, task_id: str, dispatch: Dispatch | None, args: Any,
                   kwargs: Any) -> Any:
        token = dispatch.lease_token if dispatch is not None else None
        if dispatch is None or token is None:
            return self._skip(rt, task_id, "missing-lease-token")
        if dispatch.beat_fence is None:
            return self._skip(rt, task_id, "missing-beat-fence")
        now = time.time()
        ok, value = rt.lease.start(token, rt.settings.lease_ttl_s, now,
                                   beat_fence=dispatch.beat_fence, holder=self._holder())
        if not ok:
            return self._skip(rt, task_id, f"stale-lease:{value}")
        ctx = RunContext(lane=self.lane_name, task_id=task_id, started_at=now,
                         hold_cap_s=rt.settings.hold_cap_s, fence=int(value),
                         beat_fence=dispatch.beat_fence)
        ctx.lease = LeaseView(lane=ctx.lane, token=token, fence=ctx.fence, granted_at=now,
                              started_at=now, task_id=task_id, host=self._holder().host,
                              pid=os.getpid(), node=self._holder().node)
        return self._run(rt, ctx, self._mark_running(rt, ctx, heavy=True), token, args, kwargs)

    def _run_light(self, rt: Runtime, task_id: str, dispatch: Dispatch | None, args: Any,
                   kwargs: Any) -> Any:
        if dispatch is None or dispatch.beat_fence is None:
            return self._skip(rt, task_id, "missing-dispatch")
        if dispatch.lease_token is not None:
            # Beat sent it as heavy (this worker's code declares the lane light: a rolling
            # deploy, a mis-declared module): running it would run heavy work without a lease.
            return self._skip(rt, task_id, "kind-mismatch")
        ctx = RunContext(lane=self.lane_name, task_id=task_id, started_at=time.time(),
                         hold_cap_s=None, beat_fence=dispatch.beat_fence)
        refused, before = self._start_light(rt, ctx, dispatch.beat_fence)
        if refused:
            return self._skip(rt, task_id, refused)
        return self._run(rt, ctx, before, "", args, kwargs)

    def _start_light(self, rt: Runtime, ctx: RunContext,
                     beat_fence: int) -> tuple[str, RunRecord | None]:
        """Mark a light run started, only if its message is the lane's current dispatch from
        the current beat and was not started before (compare and set). Returns (reason refused
        or '', the record before; None if unreadable: then it runs unrecorded)."""
        for _ in range(5):
            try:
                raw, before = rt.store.read_run_raw(ctx.lane)
            except StateError:
                logger.exception("lane %s: run record unreadable; running without recording",
                                 ctx.lane)
                return "", None
            if ctx.task_id in (before.running_task_id, before.last_task_id):
                return "already-started", before
            record = lifecycle.started(before, task_id=ctx.task_id, now=ctx.started_at,
                                       running_until=ctx.started_at + rt.settings.lease_ttl_s)
            ok, reason = rt.store.cas_run(ctx.lane, raw, record,
                                          dispatch=(ctx.task_id, beat_fence),
                                          mark_ttl_s=rt.settings.lease_ttl_s)
            if ok:
                return "", before
            if reason != "changed":
                return reason, before
        return "run-record-contended", None

    def _holder(self) -> Holder:
        return Holder(host=socket.gethostname(), pid=os.getpid(),
                      node=recovery.node_identity(
                          str(getattr(self.request, "hostname", None) or "")))

    def _skip(self, rt: Runtime, task_id: str, reason: str) -> dict[str, Any]:
        logger.warning("lane %s: skipped task %s (%s); nothing ran", self.lane_name, task_id,
                       reason)
        rt.store.count(counter_field(CounterKind.SKIPS, self.lane_name))
        # Only the outcome fields change, in one Lua step: a run of this lane finishing at the
        # same moment elsewhere must not have its record rolled back.
        rt.store.mark_skipped(self.lane_name, reason, wake_message=f"{self.lane_name}:skipped",
                              task_id=task_id)
        return {"outcome": Outcome.SKIPPED.value, "reason": reason}

    def _run(self, rt: Runtime, ctx: RunContext, before: RunRecord | None, token: str,
             args: Any, kwargs: Any) -> Any:
        self._journal(rt, ctx, "start", beat_fence=ctx.beat_fence)
        renewer: LeaseRenewer | RunHeartbeat | None = None
        if token:
            renewer = LeaseRenewer(rt, token, ctx)
        elif before is not None:
            renewer = RunHeartbeat(rt, ctx)
        if renewer is not None:
            renewer.start()
        reset = _current.set(ctx)
        outcome, reason, result = Outcome.COMPLETED, None, None
        try:
            result = self.run(*args, **kwargs)
        except BaseException as exc:
            outcome, reason = Outcome.FAILED, f"{type(exc).__name__}: {exc}"[:500]
            if isinstance(exc, LeaseLost) and not ctx.lost.is_set():
                # A fenced write was refused: a newer holder exists, whatever the renewer
                # thread has noticed so far.
                ctx.lost_reason = "fenced-write-refused"
                ctx.lost.set()
            raise
        finally:
            _current.reset(reset)
            if renewer is not None:
                renewer.stopped.set()
                # Let a refresh in progress land before the outcome, never after it.
                renewer.join(timeout=rt.settings.lease_ttl_s)
            if outcome is Outcome.COMPLETED and ctx.yield_seen and (ctx.backlog or 0) > 0:
                outcome, reason = Outcome.YIELDED, ctx.lost_reason or "hold-cap"
            self._record(rt, ctx, before, outcome, reason, token)
        return result

    def _due_at(self, record: RunRecord) -> float | None:
        """When the lane falls due next, for the due index (beat refines it when it looks)."""
        lanes = getattr(self.app, "schedproj_lanes", None)
        spec = None
        if lanes is not None and lanes.knows(self.lane_name):
            spec = lanes.spec(self.lane_name)
        if spec is None:
            return None
        return due_at(spec, LaneState(run=record), time.time())

    def _journal(self, rt: Runtime, ctx: RunContext, event: str, **extra: Any) -> None:
        """Starts and ends with their fence, kept in Redis past this process (the audit)."""
        try:
            rt.store.log(rt.keys.journal, {"ev": event, "lane": ctx.lane, "task": ctx.task_id,
                                           "fence": ctx.fence, "t": time.time(),
                                           "pid": os.getpid(), **extra})
        except Exception:
            logger.warning("lane %s: could not journal %s", ctx.lane, event, exc_info=True)

    def _mark_running(self, rt: Runtime, ctx: RunContext, *, heavy: bool) -> RunRecord | None:
        """Record that the run started; None if the stored record is unreadable (then it is
        left untouched, and the outcome is logged instead of recorded)."""
        s = rt.settings
        # A heavy run is in flight while its lease lives; a light run while its heartbeat
        # keeps this mark fresh (RunHeartbeat), so a killed worker frees the lane in one TTL.
        bound = s.lease_ttl_s + s.heavy_time_limit_s if heavy else s.lease_ttl_s
        # Compare and set, never a blind write: a holder paused between its start and this
        # write must not overwrite the mark of a newer run (a higher fence) that started since.
        for _ in range(5):
            try:
                raw, before = rt.store.read_run_raw(ctx.lane)
            except StateError:
                logger.exception("lane %s: run record unreadable; running without recording",
                                 ctx.lane)
                return None
            if before.fence > ctx.fence:
                ctx.lost_reason = ctx.lost_reason or "fenced-out"
                ctx.lost.set()
                logger.error("lane %s: a newer run (fence %d > %d) owns the record; this run "
                             "lost its lease and stops at its first checkpoint", ctx.lane,
                             before.fence, ctx.fence)
                return before
            ok, _ = rt.store.cas_run(ctx.lane, raw, lifecycle.started(
                before, task_id=ctx.task_id, now=ctx.started_at,
                running_until=ctx.started_at + bound, fence=ctx.fence))
            if ok:
                return before
        logger.error("lane %s: run record contended; running without marking it", ctx.lane)
        return before

    def _record(self, rt: Runtime, ctx: RunContext, before: RunRecord | None,
                outcome: Outcome, reason: str | None, token: str) -> None:
        writable = before is not None
        before = before or RunRecord()
        record = lifecycle.finished(before, task_id=ctx.task_id, outcome=outcome, reason=reason,
                                    backlog=ctx.backlog or 0, now=time.time(), fence=ctx.fence)
        fence = record.fence
        self._journal(rt, ctx, "end", outcome=outcome.value,
                      lost=(ctx.lost.is_set() and ctx.lost_reason) or None)
        try:
            released, written = rt.store.finish(ctx.lane, record, token=token, fence=fence,
                                                wake_message=f"{ctx.lane}:{outcome.value}",
                                                write=writable, due_at=self._due_at(record),
                                                member=self.family_name is not None)
        except Exception:
            logger.exception("lane %s: could not record outcome %s; the lease (if any) "
                             "expires on its own", ctx.lane, outcome.value)
            return
        if token and not released:
            logger.error("lane %s: the lease was no longer ours at the end of the run",
                         ctx.lane)
        if written == 0:
            logger.error("lane %s: outcome %s not recorded: a newer run (higher fence) owns the "
                         "record", ctx.lane, outcome.value)
        elif written < 0:
            logger.error("lane %s: outcome %s not recorded: the stored run record is unreadable "
                         "and was left untouched", ctx.lane, outcome.value)
        if outcome is Outcome.YIELDED:
            rt.store.count(counter_field(CounterKind.YIELDS, ctx.lane))
        logger.info("lane %s: %s (backlog %s)", ctx.lane, outcome.value, record.backlog)
