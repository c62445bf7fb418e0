"""The worker side of a lane: :class:`LaneTask`, the base class every lane task uses.

A heavy run checks the lease token its message carries before running, renews the lease while
it runs, and releases it by token when it ends (completed, failed or yielded), recording the
outcome and waking beat in the same atomic step. A stale, forged or missing token means the
run is skipped: recorded, and nothing runs. The run's context and yield rule live in
:mod:`.run_context`, the threads that keep its claim alive in :mod:`.keepalive`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from billiard.exceptions import WorkerLostError
from celery import Task
from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded

from schedproj.core import defaults, lifecycle
from schedproj.core.dueindex import due_at
from schedproj.core.errors import LeaseLost, StateError
from schedproj.core.families import FamilyError, LaneFamily, check_key, member_lane
from schedproj.core.lanes import Lane, LaneKind
from schedproj.core.pools import DEFAULT_POOL
from schedproj.core.records import LaneState, LeaseView, Outcome, RunRecord

# Imported for its worker_ready hook: a restarted worker frees its dead predecessor's lease.
from schedproj.on_celery import recovery
from schedproj.on_celery.expected import EXPECTED_REDIS_FAILURES, log_failure
from schedproj.on_celery.keepalive import LeaseRenewer, RunHeartbeat
from schedproj.on_celery.messages import LEASE_KWARG, Dispatch, pop_dispatch, slots_of
from schedproj.on_celery.run_context import RunContext, current, current_run, member
from schedproj.on_celery.run_records import CONTENDED, swap_run
from schedproj.on_celery.runtime import Runtime, runtime_for
from schedproj.store.lane_store import audit_entry
from schedproj.store.lease import Holder, RunMark, SlotGroup, StartReply
from schedproj.store.protocol import CounterKind, counter_field, run_field

logger = logging.getLogger(__name__)


class LaneTask(Task):  # type: ignore[misc]
    """Base class for lane tasks: ``@app.task(base=LaneTask, lane=Lane(...))``."""

    abstract = True
    lane: Lane | None = None
    # Per lane task, so an adopted app's own tasks keep the app's settings (docs/adoption.md):
    # a worker killed mid-run leaves the message to be redelivered (its stale lease refuses
    # it), JSON only on the wire, and no result (the outcome is recorded in the lane's state).
    acks_late = True
    reject_on_worker_lost = True
    serializer = "json"
    ignore_result = True
    # The lease grant rides as an extra keyword the lane body never sees (popped in __call__),
    # so Celery's client-side signature check must not reject it.
    typing = False
    # A fenced write refused (LeaseLost) means a newer holder exists: the run is recorded
    # failed with that reason, and Celery logs it as expected (one INFO line, no traceback;
    # Sentry's Celery integration skips it too) instead of "raised unexpected".
    throws = (LeaseLost,)

    # -- what a lane body calls -------------------------------------------------------------
    def should_yield(self) -> bool:
        ctx = current.get()
        return ctx.should_yield() if ctx is not None else False

    def report_backlog(self, remaining: int) -> None:
        """Say how much work this run left; a lane with backlog stays due."""
        ctx = current.get()
        if ctx is not None:
            ctx.backlog = max(0, int(remaining))

    @property
    def fence(self) -> int:
        """The fencing number of the lease this run holds (0 for light lanes)."""
        ctx = current.get()
        return ctx.fence if ctx is not None else 0

    # -- execution --------------------------------------------------------------------------
    @property
    def lane_name(self) -> str:
        """The lane this call runs: the task's lane, or for a family the member named by the
        call's key (its first argument)."""
        assert self.lane is not None
        name = member.get()
        return name if name is not None else (self.lane.name or str(self.name))

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
        if not self._is_member(family, str(key)):
            # Recording the refusal would create the very lane it refuses (a run record and
            # a counter that status would count as a due member): nothing is written.
            logger.error("lane family %s: %r is not a member; nothing ran, nothing recorded",
                         family, key)
            return {"outcome": Outcome.SKIPPED.value, "reason": "not-a-member"}
        reset = member.set(member_lane(family, str(key)))
        try:
            return self._call(dispatch, args, kwargs)
        finally:
            member.reset(reset)

    def _is_member(self, family: str, key: str) -> bool:
        rt = runtime_for(self.app)
        return bool(rt.store.client.sismember(rt.keys.family(family), key))

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
                member.set(member_lane(family, check_key(family, args[0])))
        try:
            before = rt.store.read_run(self.lane_name)
        except StateError:
            before = None
        if before is not None and before.running_task_id != task_id:
            return  # never started here (or already recorded): nothing to close
        grant = (kwargs or {}).get(LEASE_KWARG)  # the message's own, as Celery passes it
        token = grant.get("token", "") if isinstance(grant, dict) else ""
        pool, slots = slots_of(grant) if isinstance(grant, dict) else (None, ())
        ctx = RunContext(lane=self.lane_name, task_id=task_id,
                         started_at=(before.running_since if before else None) or time.time(),
                         hold_cap_s=None, fence=before.fence if before else 0,
                         slots=rt.slot_group(pool, slots) if pool and slots else None)
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
        if dispatch.pool is not None and not dispatch.slots:
            return self._skip(rt, task_id, "stale-lease:no-slots")
        if self._pool_mismatch(dispatch):
            # The grant is for another pool, or fewer slots, than this worker's code declares
            # the lane to need (a rolling deploy moved it, a mis-declared module): running it
            # would break the bound of the pool the lane's work really uses. Refused as a
            # light worker refuses a heavy message; the grant lapses at its start deadline.
            return self._skip(rt, task_id, "pool-mismatch")
        slots = (rt.slot_group(dispatch.pool, dispatch.slots) if dispatch.pool is not None
                 else None)
        lane, holder = self.lane_name, self._holder()
        if slots is not None:
            ok, value = slots.start(token, rt.settings.lease_ttl_s, now,
                                    beat_fence=dispatch.beat_fence, holder=holder, lane=lane,
                                    task_id=task_id)
            started = StartReply(ok, value)
            expected: tuple[str, RunRecord] | None = None
        else:
            # The lease started and the run record marked running in one round trip: by
            # compare and set on the record this process last wrote (its previous run's end),
            # else the record as stored comes back for the compare and set below.
            mark, expected = self._start_mark(rt, lane, task_id, now, dispatch)
            started = rt.lease.start_marked(token, rt.settings.lease_ttl_s, now,
                                            beat_fence=dispatch.beat_fence, holder=holder,
                                            lane=lane, task_id=task_id, mark=mark)
        if not started.ok:
            return self._skip(rt, task_id, f"stale-lease:{started.value}")
        ctx = RunContext(lane=lane, task_id=task_id, started_at=now,
                         hold_cap_s=rt.settings.hold_cap_s, fence=int(started.value),
                         beat_fence=dispatch.beat_fence, slots=slots)
        ctx.lease = LeaseView(lane=ctx.lane, token=token, fence=ctx.fence, granted_at=now,
                              started_at=now, task_id=task_id, host=holder.host,
                              pid=os.getpid(), node=holder.node)
        if started.marked and expected is not None:
            return self._run(rt, ctx, expected[1], token, args, kwargs,
                             journaled=started.journaled)
        _written_runs.pop((rt.keys.lanes, lane), None)
        before, journaled = self._mark_running(
            rt, ctx, first=None if slots is not None else (started.stored,))
        return self._run(rt, ctx, before, token, args, kwargs, journaled=journaled)

    def _start_mark(self, rt: Runtime, lane: str, task_id: str, now: float,
                    dispatch: Dispatch) -> tuple[RunMark, tuple[str, RunRecord] | None]:
        """What the lease start writes of the run record (``HeavyLease.start_marked``): the
        record marked running, computed from the one this process last wrote for the lane
        (and the journal's 'start' entry, when the journal lives on the same Redis), or, when
        it knows none, a read of the stored one. Also that expected record (raw, decoded)."""
        keys, store = rt.keys, rt.store
        known = _written_runs.get((keys.lanes, lane))
        record, entry = "", ""
        if known is not None:
            fence = dispatch.lease_fence
            new = _heavy_started(known[1], task_id=task_id, now=now, fence=fence,
                                 until=_running_until(rt, now))
            if isinstance(new, str):
                known = None  # fenced out: said by the compare and set's path
            else:
                record = store.encode_record(new)
                if store.audit_client is store.client:
                    entry = audit_entry(_journal_entry(lane, task_id, fence, "start",
                                                       beat_fence=dispatch.beat_fence))
        return RunMark(lanes=keys.lanes, changed=keys.changed, field=run_field(lane),
                       expected=known[0] if known is not None else None, record=record,
                       lane=lane, fence=dispatch.lease_fence,
                       journal=keys.journal if entry else "", entry=entry,
                       journal_len=defaults.AUDIT_LOG_LEN), known

    def _pool_mismatch(self, dispatch: Dispatch) -> bool:
        """Whether ``dispatch``'s grant differs from the pool and slot count this worker's
        declaration of the lane gives (the heavy lease is the default pool's one slot)."""
        assert self.lane is not None
        pool = None if self.lane.pool in (None, DEFAULT_POOL) else self.lane.pool
        if dispatch.pool != pool:
            return True
        return pool is not None and len(dispatch.slots) != self.lane.slots

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
        try:
            refused, before = self._start_light(rt, ctx, dispatch.beat_fence)
        except StateError as exc:
            # Without a readable record there is no dispatch to check the message against:
            # run nothing, and write nothing over the record (it is reported as it is).
            _say_unreadable_once(ctx.lane, exc)
            return {"outcome": Outcome.SKIPPED.value, "reason": "run-record-unreadable"}
        _unreadable_said.discard(ctx.lane)
        if refused:
            return self._skip(rt, task_id, refused)
        return self._run(rt, ctx, before, "", args, kwargs)

    def _start_light(self, rt: Runtime, ctx: RunContext,
                     beat_fence: int) -> tuple[str, RunRecord | None]:
        """Mark a light run started, only if its message is the lane's current dispatch from
        the current beat and was not started before (compare and set). Returns (reason refused
        or '', the record before); raises :class:`StateError` when the record is unreadable."""
        def start(before: RunRecord) -> RunRecord | str:
            if ctx.task_id in (before.running_task_id, before.last_task_id):
                return "already-started"
            return lifecycle.started(before, task_id=ctx.task_id, now=ctx.started_at,
                                     running_until=ctx.started_at + rt.settings.lease_ttl_s)
        swap = swap_run(rt.store, ctx.lane, start, tries=5, dispatch=(ctx.task_id, beat_fence),
                        mark_ttl_s=rt.settings.lease_ttl_s)
        if swap.reason == CONTENDED:
            return "run-record-contended", None
        return swap.reason, swap.before

    def _holder(self) -> Holder:
        return Holder(host=socket.gethostname(), pid=os.getpid(),
                      node=recovery.node_identity(
                          str(getattr(self.request, "hostname", None) or "")))

    def _skip(self, rt: Runtime, task_id: str, reason: str) -> dict[str, Any]:
        logger.warning("lane %s: skipped task %s (%s); nothing ran", self.lane_name, task_id,
                       reason)
        try:
            rt.store.count(counter_field(CounterKind.SKIPS, self.lane_name))
            # Only the outcome fields change, in one Lua step: a run of this lane finishing at
            # the same moment elsewhere must not have its record rolled back.
            rt.store.mark_skipped(self.lane_name, reason,
                                  wake_message=f"{self.lane_name}:skipped", task_id=task_id)
        except SoftTimeLimitExceeded:
            # The writes outlasted the task's soft time limit (Redis failing over or paused):
            # nothing ran, so there is nothing to clean up; beat sees the dispatch over when
            # its start deadline passes.
            logger.warning("lane %s: the skip of task %s was not recorded: Redis took no "
                           "write within the task's soft time limit", self.lane_name, task_id)
        except EXPECTED_REDIS_FAILURES as exc:
            log_failure(logger, exc, "lane %s: the skip of task %s was not recorded",
                        self.lane_name, task_id)
        return {"outcome": Outcome.SKIPPED.value, "reason": reason}

    def _run(self, rt: Runtime, ctx: RunContext, before: RunRecord | None, token: str,
             args: Any, kwargs: Any, *, journaled: bool = False) -> Any:
        if not journaled:  # (a heavy run's start journals with its record's write)
            self._journal(rt, ctx, "start", **self._start_extra(ctx))
        renewer: LeaseRenewer | RunHeartbeat | None = None
        if token:
            renewer = LeaseRenewer(rt, token, ctx, lease=None if ctx.slots is None else
                                   rt.slot_group(ctx.slots.pool, ctx.slots.slots,
                                                 renewal=True))
        elif before is not None:
            renewer = RunHeartbeat(rt, ctx)
        if renewer is not None:
            renewer.start()
        reset = current.set(ctx)
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
            current.reset(reset)
            if renewer is not None:
                renewer.finish(rt.settings.lease_ttl_s)
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
            rt.store.log(rt.keys.journal, _journal_entry(ctx.lane, ctx.task_id, ctx.fence,
                                                         event, **extra))
        except Exception as exc:
            log_failure(logger, exc, "lane %s: could not journal %s", ctx.lane, event)

    @staticmethod
    def _start_extra(ctx: RunContext) -> dict[str, Any]:
        """The journal's 'start' entry beyond the common fields: the beat fence, and a pool
        run's pool and slots (the status page draws it on their rows)."""
        where = {} if ctx.slots is None else {"pool": ctx.slots.pool,
                                              "slots": list(ctx.slots.slots)}
        return {"beat_fence": ctx.beat_fence, **where}

    def _mark_running(self, rt: Runtime, ctx: RunContext,
                      first: tuple[str | None] | None = None) -> tuple[RunRecord | None, bool]:
        """Record that the heavy run started, journaling its start with the first compare
        and set; ``first``: the record as stored, read with the lease start. Returns the
        record before (None if the stored record is unreadable: then it is left untouched,
        and the outcome is logged instead of recorded) and whether the start was journaled."""
        until = _running_until(rt, ctx.started_at)

        def start(before: RunRecord) -> RunRecord | str:
            return _heavy_started(before, task_id=ctx.task_id, now=ctx.started_at,
                                  until=until, fence=ctx.fence)
        journal = (rt.keys.journal, _journal_entry(ctx.lane, ctx.task_id, ctx.fence, "start",
                                                   **self._start_extra(ctx)))
        try:
            swap = swap_run(rt.store, ctx.lane, start, tries=5, first=first, journal=journal,
                            journal_failed=_journal_failed(ctx.lane, "start"))
        except StateError:
            logger.exception("lane %s: run record unreadable; running without recording",
                             ctx.lane)
            return None, False
        if swap.reason == "fenced-out":
            ctx.flag_lost("fenced-out")
            logger.error("lane %s: a newer run (fence %d > %d) owns the record; this run "
                         "lost its lease and stops at its first checkpoint", ctx.lane,
                         swap.before.fence, ctx.fence)
        elif not swap.written:
            logger.error("lane %s: run record contended; running without marking it", ctx.lane)
        return swap.before, swap.journaled

    def _record(self, rt: Runtime, ctx: RunContext, before: RunRecord | None,
                outcome: Outcome, reason: str | None, token: str) -> None:
        writable = before is not None
        before = before or RunRecord()
        record = lifecycle.finished(before, task_id=ctx.task_id, outcome=outcome, reason=reason,
                                    backlog=ctx.backlog or 0, now=time.time(), fence=ctx.fence)
        fence = record.fence
        end = {"outcome": outcome.value, "lost": (ctx.lost.is_set() and ctx.lost_reason) or None}
        # A run in a pool beyond the default ends under its first slot's store: that slot is
        # released with the record (atomically, waking beat), the others just before - after
        # its end is journaled. A run of the heavy lease journals its end with the release,
        # just before it, in one round trip.
        store, journal = rt.store, None
        if ctx.slots is not None:
            self._journal(rt, ctx, "end", **end)
            store = rt.slot_store(ctx.slots.keys)
            if token:
                _release_extra(ctx.slots, token, ctx.lane)
        else:
            journal = (rt.keys.journal, _journal_entry(ctx.lane, ctx.task_id, ctx.fence, "end",
                                                       **end))
        raw = store.encode_record(record)
        remembered = (rt.keys.lanes, ctx.lane)
        _written_runs.pop(remembered, None)
        try:
            released, written = store.finish(ctx.lane, record, token=token, fence=fence,
                                                wake_message=f"{ctx.lane}:{outcome.value}",
                                                write=writable, due_at=self._due_at(record),
                                                member=self.family_name is not None,
                                                encoded=raw, journal=journal,
                                                journal_failed=_journal_failed(ctx.lane, "end"))
        except Exception as exc:
            log_failure(logger, exc, "lane %s: could not record outcome %s; the lease (if "
                        "any) expires on its own", ctx.lane, outcome.value, level=logging.ERROR)
            return
        if written == 1 and token and ctx.slots is None:
            # Written as given (a heavy run's record is never merged): the next start of the
            # lane in this process expects it.
            if len(_written_runs) >= WRITTEN_RUNS_MAX:
                _written_runs.clear()
            _written_runs[remembered] = (raw, record)
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


#: The run record this process last wrote at the end of a heavy run, per (lanes hash, lane):
#: the record its next start of the lane expects to find (a compare and set, so a record
#: written by anyone else since only costs that start a second round trip).
_written_runs: dict[tuple[str, str], tuple[str, RunRecord]] = {}

#: Most records remembered (all forgotten past it: a worker serving a large family).
WRITTEN_RUNS_MAX = 4096


def _running_until(rt: Runtime, started_at: float) -> float:
    """Until when a heavy run started at ``started_at`` counts as running: while its lease
    lives (and its time limit runs)."""
    s = rt.settings
    return started_at + s.lease_ttl_s + s.heavy_time_limit_s


def _heavy_started(before: RunRecord, *, task_id: str, now: float, until: float,
                   fence: int) -> RunRecord | str:
    """The record once heavy run ``task_id`` under ``fence`` started, or ``fenced-out``.
    Written by compare and set, never blindly: a holder paused between its start and this
    write must not overwrite the mark of a newer run (a higher fence) that started since."""
    if before.fence > fence:
        return "fenced-out"
    return lifecycle.started(before, task_id=task_id, now=now, running_until=until,
                             fence=fence)


def _journal_failed(lane: str, event: str) -> Callable[[BaseException], None]:
    """What a journal entry that could not be appended does: say so (the run goes on)."""
    def failed(exc: BaseException) -> None:
        log_failure(logger, exc, "lane %s: could not journal %s", lane, event)
    return failed


def _journal_entry(lane: str, task_id: str, fence: int, event: str,
                   **extra: Any) -> dict[str, Any]:
    """A journal entry: a run's start or end with its fence, for the audit."""
    return {"ev": event, "lane": lane, "task": task_id, "fence": fence, "t": time.time(),
            "pid": os.getpid(), **extra}


def _release_extra(slots: SlotGroup, token: str, lane: str) -> None:
    try:
        slots.release_extra(token)
    except Exception as exc:
        log_failure(logger, exc, "lane %s: could not release its extra slots of pool %s; they "
                    "expire on their own", lane, slots.pool, level=logging.ERROR)


#: Light lanes whose unreadable run record this process has reported (once per onset: each
#: refused message would otherwise log it again).
_unreadable_said: set[str] = set()


def _say_unreadable_once(lane: str, exc: StateError) -> None:
    if lane in _unreadable_said:
        logger.debug("lane %s: run record still unreadable; nothing ran", lane)
        return
    _unreadable_said.add(lane)
    logger.error("lane %s: run record unreadable (%s); its messages run nothing until it is "
                 "fixed, and nothing is recorded over it", lane, exc)


__all__ = ["LaneTask", "LeaseRenewer", "RunContext", "RunHeartbeat", "current_run"]
