"""The worker side of a lane: :class:`LaneTask`, the base class every lane task uses.

A heavy run checks the lease token its message carries before running, renews the lease while
it runs, and releases it by token when it ends (completed, failed or yielded), recording the
outcome and waking beat in the same atomic step. A stale, forged or missing token means the
run is skipped: recorded, and nothing runs.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any

from billiard.exceptions import WorkerLostError
from celery import Task
from celery.exceptions import TimeLimitExceeded

from schedproj.errors import LeaseLost, StateError
from schedproj.lanes import Lane, LaneKind
from schedproj.runtime import Runtime, runtime_for
from schedproj.state import Outcome, RunRecord

logger = logging.getLogger(__name__)

#: Keyword argument that carries the lease grant in a heavy lane's message.
LEASE_KWARG = "schedproj_lease"


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
    lost_reason: str = ""
    yield_seen: bool = False

    def should_yield(self) -> bool:
        """True once the hold cap is reached or the lease is lost: stop at this checkpoint."""
        over_cap = (self.hold_cap_s is not None
                    and time.time() - self.started_at >= self.hold_cap_s)
        if over_cap or self.lost.is_set():
            self.yield_seen = True
            return True
        return False


_current: ContextVar[RunContext | None] = ContextVar("schedproj_run", default=None)


def current_run() -> RunContext | None:
    """The context of the lane run executing in this thread, if any."""
    return _current.get()


class LeaseRenewer(threading.Thread):
    """Renews the heavy lease every third of its TTL; flags the run lost when it cannot."""

    def __init__(self, rt: Runtime, token: str, ctx: RunContext) -> None:
        super().__init__(name=f"schedproj-renew-{ctx.lane}", daemon=True)
        self.rt, self.token, self.ctx = rt, token, ctx
        self.stopped = threading.Event()

    def run(self) -> None:
        s = self.rt.settings
        last_ok = time.time()
        while not self.stopped.wait(s.lease_ttl_s / 3):
            now = time.time()
            try:
                ok, reason = self.rt.lease.renew(self.token, s.lease_ttl_s, now, s.max_hold_s)
            except Exception:
                # Redis unreachable: the server counts the TTL from the last renewal that
                # landed, so give up a third of a TTL before it can expire there.
                ok, reason = False, "redis-unreachable"
                logger.warning("lane %s: cannot renew the heavy lease", self.ctx.lane,
                               exc_info=True)
                if now - last_ok < s.lease_ttl_s * 2 / 3:
                    continue
            if ok:
                last_ok = now
                continue
            self.ctx.lost_reason = reason
            self.ctx.lost.set()
            logger.error("lane %s: heavy lease lost (%s); yielding at the next checkpoint",
                         self.ctx.lane, reason)
            return


class RunHeartbeat(threading.Thread):
    """Keeps a light run's in-flight mark alive while it runs, so a worker killed outright
    frees its lane within the lease TTL instead of the whole light time limit."""

    def __init__(self, rt: Runtime, ctx: RunContext) -> None:
        super().__init__(name=f"schedproj-heartbeat-{ctx.lane}", daemon=True)
        self.rt, self.ctx = rt, ctx
        self.stopped = threading.Event()

    def run(self) -> None:
        ttl = self.rt.settings.lease_ttl_s
        while not self.stopped.wait(ttl / 3):
            try:
                record = self.rt.store.read_run(self.ctx.lane)
                if record.running_task_id != self.ctx.task_id:
                    return  # a newer run owns the record
                self.rt.store.write_run(self.ctx.lane,
                                        replace(record, running_until=time.time() + ttl))
            except Exception:  # the mark lapses on its own; the run goes on
                logger.warning("lane %s: cannot refresh the in-flight mark", self.ctx.lane,
                               exc_info=True)


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
        assert self.lane is not None
        return self.lane.name or str(self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        grant = kwargs.pop(LEASE_KWARG, None)
        if self.lane is None:
            return super().__call__(*args, **kwargs)
        rt = runtime_for(self.app)
        task_id = str(getattr(self.request, "id", None) or "")
        if self.lane.kind is LaneKind.HEAVY:
            return self._run_heavy(rt, task_id, grant, args, kwargs)
        return self._run(rt, task_id, "", 0, None, args, kwargs)

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any,
                   einfo: Any) -> None:
        """Record runs that died where ``__call__`` could not: the hard time limit kills the
        pool process, and Celery calls this in the worker's main process instead."""
        if self.lane is None or not isinstance(exc, TimeLimitExceeded | WorkerLostError):
            return
        rt = runtime_for(self.app)
        try:
            before = rt.store.read_run(self.lane_name)
        except StateError:
            before = None
        if before is not None and before.running_task_id != task_id:
            return  # never started here (or already recorded): nothing to close
        grant = (kwargs or {}).get(LEASE_KWARG)
        token = grant.get("token", "") if isinstance(grant, dict) else ""
        ctx = RunContext(lane=self.lane_name, task_id=task_id,
                         started_at=(before.running_since if before else None) or time.time(),
                         hold_cap_s=None, fence=before.fence if before else 0)
        ctx.backlog = before.backlog if before else None
        self._record(rt, ctx, before, Outcome.FAILED, f"{type(exc).__name__}: {exc}",
                     str(token) if isinstance(token, str) else "")

    def _run_heavy(self, rt: Runtime, task_id: str, grant: Any, args: Any, kwargs: Any) -> Any:
        token = grant.get("token") if isinstance(grant, dict) else None
        if not isinstance(token, str) or not token:
            return self._skip(rt, task_id, "missing-lease-token")
        ok, value = rt.lease.start(token, rt.settings.lease_ttl_s, time.time())
        if not ok:
            return self._skip(rt, task_id, f"stale-lease:{value}")
        return self._run(rt, task_id, token, int(value), rt.settings.hold_cap_s, args, kwargs)

    def _skip(self, rt: Runtime, task_id: str, reason: str) -> dict[str, Any]:
        logger.warning("lane %s: skipped task %s (%s); nothing ran", self.lane_name, task_id,
                       reason)
        rt.store.count(f"skips|{self.lane_name}")
        # Only the outcome fields change, in one Lua step: a run of this lane finishing at the
        # same moment elsewhere must not have its record rolled back.
        rt.store.mark_skipped(self.lane_name, reason, wake_message=f"{self.lane_name}:skipped")
        return {"outcome": Outcome.SKIPPED.value, "reason": reason}

    def _run(self, rt: Runtime, task_id: str, token: str, fence: int, hold_cap_s: float | None,
             args: Any, kwargs: Any) -> Any:
        name = self.lane_name
        started = time.time()
        ctx = RunContext(lane=name, task_id=task_id, started_at=started, hold_cap_s=hold_cap_s,
                         fence=fence)
        before = self._mark_running(rt, ctx, heavy=bool(token))
        self._journal(rt, ctx, "start")
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
        try:
            before = rt.store.read_run(ctx.lane)
        except StateError:
            logger.exception("lane %s: run record unreadable; running without recording",
                             ctx.lane)
            return None
        rt.store.write_run(ctx.lane, replace(
            before, running_task_id=ctx.task_id, running_since=ctx.started_at,
            running_until=ctx.started_at + bound, fence=max(before.fence, ctx.fence)))
        return before

    def _record(self, rt: Runtime, ctx: RunContext, before: RunRecord | None,
                outcome: Outcome, reason: str | None, token: str) -> None:
        writable = before is not None
        before = before or RunRecord()
        now = time.time()
        failed = outcome is Outcome.FAILED
        # A light run has no fence of its own: keep the record's, so a lane that was heavy once
        # (a fenced record) can still record its outcomes.
        fence = ctx.fence or before.fence
        record = RunRecord(
            last_run_at=now, last_outcome=outcome, last_reason=reason,
            failing_since=(before.failing_since or now) if failed else None,
            last_task_id=ctx.task_id, backlog=ctx.backlog or 0, runs=before.runs + 1,
            failures=before.failures + (outcome is Outcome.FAILED), fence=fence,
        )
        self._journal(rt, ctx, "end", outcome=outcome.value,
                      lost=(ctx.lost.is_set() and ctx.lost_reason) or None)
        try:
            released, written = rt.store.finish(ctx.lane, record, token=token, fence=fence,
                                                wake_message=f"{ctx.lane}:{outcome.value}",
                                                write=writable)
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
            rt.store.count(f"yields|{ctx.lane}")
        logger.info("lane %s: %s (backlog %s)", ctx.lane, outcome.value, record.backlog)
