"""Beat's side of losses: Redis losing state, and runs lost with no end recorded.

After a state loss seen by the active beat, the run records of declared lanes are put back
(:func:`lifecycle.rebuilt`). Each tick, runs whose keep-alive lapsed are recorded lost; which
ones, and what to record, is :mod:`schedproj.core.lostruns`' judgement: this module reads,
asks it, and writes by compare and set. (Not :mod:`.recovery`: that one is the worker's, freeing
the lease of a dead predecessor on the same node.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import redis

from schedproj.core import lifecycle, lostruns
from schedproj.core.errors import StateError
from schedproj.core.lostruns import LostRun
from schedproj.core.pools import DEFAULT_POOL
from schedproj.core.records import LaneState, LeaseView, RunRecord
from schedproj.on_celery.tick_lanes import TickLanes
from schedproj.store.lane_store import LaneStore, Snapshot
from schedproj.store.lease import OperatorRequest, PoolSlots
from schedproj.store.protocol import CounterKind, Keys, counter_field, run_field

logger = logging.getLogger("schedproj.beat")


#: What each cause of a quarantine says Redis lost (``lua/epoch.lua``), when it is a loss.
LOSSES = {
    "state-empty": "Redis holds no schedproj state any more, though this beat read some before "
                   "(a restart without persistence, a failover, a flush)",
    "state-missing": "Redis lost schedproj's epoch record but holds other schedproj state "
                     "(keys evicted or deleted, a garbled record)",
    "server-changed": "Redis is another server process than before (a restart or a failover)",
}


def say_state_loss(snap: Snapshot) -> None:
    """Say once, when this tick's epoch check started a quarantine, what Redis lost and what
    beat does about it. A beat that starts on a Redis holding no schedproj state at all may be
    on a new deployment as well as on a Redis that lost everything, and nothing in Redis tells
    the two apart: the quarantine is the same, but that is said at WARNING, with the command
    that skips it on a new deployment. Every other cause is a loss, said at ERROR."""
    epoch = snap.epoch
    if not epoch.cause:
        return
    if epoch.cause == "state-empty" and not epoch.known_id:
        logger.warning(
            "first start or state loss: Redis holds no schedproj state (a new deployment, or "
            "a Redis that lost all of it: beat cannot tell which), so no lane is dispatched "
            "for %.1fs in case a heavy run from before a loss still holds a lease Redis "
            "forgot. On a new deployment, `schedproj init` run before beat's first start "
            "skips this wait (with beat's SCHEDPROJ_REDIS_URL or CELERY_BROKER_URL and "
            "SCHEDPROJ_KEY_PREFIX)",
            epoch.quarantine_left_s)
        return
    what = LOSSES.get(epoch.cause, f"Redis lost state ({epoch.cause})")
    logger.error("state loss: %s; no lane is dispatched for %.1fs while earlier runs "
                 "re-assert their lease or in-flight mark", what, epoch.quarantine_left_s)


class LossRecovery:
    """Puts back lost run records and records lost runs, for the active beat."""

    def __init__(self, store: LaneStore, keys: Keys, lanes: TickLanes, grace_s: float,
                 pool_slots: PoolSlots | None = None) -> None:
        self.store, self.keys, self.lanes = store, keys, lanes
        #: Every slot a run may hold (this beat's pools', and those of earlier declarations).
        self.pool_slots = pool_slots
        #: A light run's in-flight mark counts this long past its end (clock skew).
        self.grace_s = grace_s
        #: The started heavy lease seen last tick (``lostruns.follow_lease``).
        self.started_lease: LeaseView | None = None
        #: The same for each slot of the pools beyond the default, by (pool, slot).
        self.started_slots: dict[tuple[str, int], LeaseView] = {}
        #: Last runs this beat estimated after a state loss, kept until the lane's record says
        #: it ran: a second loss before then keeps the earlier estimate, so losses that come
        #: faster than a cadence never push a lane's turn back for ever.
        self.estimated: dict[str, float] = {}
        #: The counters or journal refused the last loss's bookkeeping (said once per onset).
        self.bookkeeping_failed = False
        #: When this beat last put back records after a state loss (a run that started before
        #: then and is recorded lost may have ended unrecorded: its end was lost with Redis).
        self.put_back_at: float | None = None

    def stand_by(self) -> None:
        """Another beat judges runs and keeps the lanes' records now."""
        self.started_lease = None
        self.started_slots = {}
        self.estimated = {}

    def put_back(self, remembered: dict[str, RunRecord], now: float) -> None:
        """Redis lost state under this active beat: put back the run records it lost (what
        this beat remembers of its due lanes; an estimate within one due interval for the
        rest, see :func:`lifecycle.rebuilt`), so the lanes go on in their order instead of all
        being "never ran" at once, in declared order. A beat that starts into a loss remembers
        nothing and cannot tell it from a first start: every lane is then due at once. Family
        members are left to the family's ``members`` hook (their set was lost too; putting a
        member back without it would leave a lane nobody lists)."""
        records = {}
        for lane in {*self.lanes.lanes.names, *remembered}:
            spec = self.lanes.spec(lane)
            if spec is None or spec.family is not None:
                continue
            record = lifecycle.rebuilt(remembered.get(lane), lane=lane, cadence_s=spec.cadence_s,
                                       due_ratio=spec.due_ratio, lost_at=now,
                                       calendar=spec.calendar)
            if lane not in remembered and record.last_run_at is not None:
                estimate = min(self.estimated.get(lane, record.last_run_at), record.last_run_at)
                record = replace(record, last_run_at=estimate)
                self.estimated[lane] = estimate
            records[lane] = record
        written = self.store.put_back_runs(records)
        self.put_back_at = now
        logger.warning("state loss: put back %d lanes' run records (%d as this beat "
                       "remembered them, the rest estimated: due within one due interval)",
                       written, len(remembered.keys() & records.keys()))

    def forget_estimates(self, states: Mapping[str, LaneState]) -> None:
        """A lane whose record no longer carries the estimate ran since: forget it."""
        for lane, state in states.items():
            if state.run.last_reason != lifecycle.ESTIMATED_AFTER_LOSS:
                self.estimated.pop(lane, None)

    def record_lapsed_runs(self, snap: Snapshot, states: Mapping[str, LaneState],
                           now: float,
                           slots: Mapping[str, Sequence[LeaseView | None]] | None = None,
                           ) -> None:
        """Record as lost every run that started and whose lease (heavy: the heavy lease, or
        for a lane of a pool beyond the default its slot leases in ``slots``, each pool's
        slots as read this tick) or in-flight mark (light) lapsed with no end recorded
        (:func:`lostruns.has_lapsed`); then the pool runs whose slot lease went before their
        start was recorded (:meth:`record_vanished_slot_runs`)."""
        # Each slot lease by the run it names: a lane is looked up, not its pool's slots
        # scanned (a tick may judge thousands of a pool's lanes).
        by_task = lostruns.slot_leases_by_task(slots or {})
        specs = self.lanes.specs
        for lane, state in states.items():
            run = state.run
            if run.running_task_id is None:
                # No run named, none to lose (has_lapsed's first test, without the lookups
                # and the call: a tick with 10,000 due lanes asks it of each).
                continue
            spec = specs.get(lane)
            if spec is None:
                continue
            lease = _lease_naming(run.running_task_id, spec.pool, snap.lease, by_task)
            if not lostruns.has_lapsed(run, heavy=spec.heavy, lease=lease, now=now,
                                       grace_s=self.grace_s):
                continue
            raw = snap.raw.get(run_field(lane))
            if raw is None:  # remembered from an earlier tick: judge what is stored now
                try:
                    raw, stored = self.store.read_run_raw(lane)
                except StateError:
                    continue
                if not lostruns.same_run(run, stored):
                    continue
                run = stored
            if raw is not None:
                self._write(lostruns.lapsed_run(lane, run, heavy=spec.heavy, now=now,
                                                put_back_at=self.put_back_at), raw)
        if slots:
            self.record_vanished_slot_runs(snap, slots, now)

    def record_vanished_slot_runs(self, snap: Snapshot,
                                  slots: Mapping[str, Sequence[LeaseView | None]],
                                  now: float) -> None:
        """:meth:`record_vanished_run` for each slot of the pools beyond the default: a pool
        run whose slot lease, seen started on an earlier read, is gone while its record
        neither says it ended nor that it runs. A run holding k slots is judged once, and
        only when none of its slots names it any more."""
        alive = {lease.task_id for leases in slots.values() for lease in leases
                 if lease is not None and lease.task_id}
        judged: set[str] = set()
        for pool, leases in slots.items():
            for index, lease in enumerate(leases):
                seen = self.started_slots.get((pool, index))
                remember, gone = lostruns.follow_lease(seen, lease)
                if remember is None:
                    self.started_slots.pop((pool, index), None)
                else:
                    self.started_slots[(pool, index)] = remember
                if gone is None or not gone.task_id or gone.task_id in alive | judged:
                    continue
                judged.add(gone.task_id)
                self._judge_vanished(snap, gone, now)

    def record_vanished_run(self, snap: Snapshot, now: float) -> None:
        """Record as lost a heavy run whose lease, seen started on an earlier tick, is gone
        while its record neither says it ended nor that it is running
        (:func:`lostruns.vanished_run`)."""
        self.started_lease, gone = lostruns.follow_lease(self.started_lease, snap.lease)
        if gone is not None:
            self._judge_vanished(snap, gone, now)

    def _judge_vanished(self, snap: Snapshot, gone: LeaseView, now: float) -> None:
        raw = snap.raw.get(run_field(gone.lane))
        read = snap.states.get(gone.lane)
        if raw is not None and read is not None:
            # The run's end changed its record, so this tick read it already (a normal
            # hand-off costs no extra round trip); mark_lost compares and sets on this raw.
            record = read.run
        else:
            try:
                raw, record = self.store.read_run_raw(gone.lane)
            except StateError:
                return  # unreadable: reported by the tick, never overwritten
        lost = lostruns.vanished_run(gone, record, now=now, put_back_at=self.put_back_at)
        if lost is not None:
            self._write(lost, raw or "")

    def _cleared(self, lost: LostRun) -> LostRun:
        """``lost`` as an operator's clear of its lease explains it, if one does
        (:func:`lostruns.cleared`); read only when a heavy run is judged lost (rare). A pool
        run's lease is its slots: ``clear-lease --pool P --slot I`` leaves its request on the
        slot's request key; a request naming the run on any lease it may have held counts."""
        if not lost.heavy:
            return lost
        try:
            raws = self.store.client.mget(
                [self.keys.lease_request, *(k.lease_request for k in self._slots())])
        except redis.ResponseError:  # a wrong type there is no request: judged as lost
            return lost
        for raw in raws:
            request = OperatorRequest.decode(None if raw is None else str(raw))
            if request is not None and request.task_id == lost.task_id:
                return lostruns.cleared(lost, action=request.action, task_id=request.task_id)
        return lost

    def _slots(self) -> list[Keys]:
        """The keys of every slot of the pools beyond the default, this beat's declaration's
        and those past it (none for a deployment without pools)."""
        slots = self.pool_slots
        return [*slots.slot_keys, *slots.retired_keys] if slots is not None else []

    def _lease_keys(self) -> list[str]:
        """Every lease a heavy run may hold (it is alive while any names it): the heavy
        lease and every slot, whatever the pool its lane is declared in now."""
        return [self.keys.lease, *(k.lease for k in self._slots())]

    def _write(self, lost: LostRun, raw: str) -> None:
        """Record the loss (compare and set on ``raw``); said, counted and journaled. A run an
        operator cleared is recorded, said and journaled as ``cleared``, not counted lost."""
        lost = self._cleared(lost)
        if not self.store.mark_lost(lost.lane, raw, lost.record, task_id=lost.task_id,
                                    heavy=lost.heavy, leases=self._lease_keys()):
            return
        # Journaled and counted before it is said: whoever reads the log line (an operator,
        # Sentry, a test) and then stops beat finds the loss in the journal and the counter.
        if lost.cleared:
            self._book(lambda: self.store.log(self.keys.journal, {
                "ev": lifecycle.CLEARED, "lane": lost.lane, "task": lost.task_id,
                "fence": lost.fence, "t": time.time()}))
            logger.warning("lane %s: run %s cleared %s", lost.lane, lost.task_id, lost.why)
            return
        self._book(lambda: self.store.count(counter_field(CounterKind.LOST, lost.lane)))
        self._book(lambda: self.store.log(self.keys.journal, {
            "ev": "lost", "lane": lost.lane, "task": lost.task_id, "fence": lost.fence,
            "t": time.time()}))
        logger.error("lane %s: run %s lost (%s, no end recorded; its worker died?)",
                     lost.lane, lost.task_id, lost.why)

    def _book(self, write: Callable[[], None]) -> None:
        """Count or journal a loss already recorded: bookkeeping. The counters of the wrong
        type, or the journal's own Redis (``audit_redis_url``) out of reach, stopped the tick
        after the record was written - the loss never said, the tick's dispatch skipped - and
        the latter sent beat to stand by as if the state Redis were gone. Said once per
        onset; a state Redis out of reach fails beat's next call anyway."""
        try:
            write()
        except redis.RedisError as exc:
            if not self.bookkeeping_failed:
                logger.error("cannot count or journal a lost run (%s); it is recorded in its "
                             "lane's record, scheduling goes on. Fix: `redis-cli TYPE` %s (a "
                             "hash) and %s (a list), or bring the audit Redis back", exc,
                             self.keys.counters, self.keys.journal)
            self.bookkeeping_failed = True
            return
        self.bookkeeping_failed = False


__all__ = ["LossRecovery", "say_state_loss"]


def _lease_naming(task: str, pool: str, lease: LeaseView | None,
                  by_task: Mapping[str, LeaseView]) -> LeaseView | None:
    """The lease that names the run ``task``, wherever it is (a deploy may have moved the
    lane to another pool while it runs, or shrunk its pool under it): a slot lease naming
    it, else the heavy lease for a lane of the default pool or when it names the run."""
    found = by_task.get(task)
    if found is None and (pool == DEFAULT_POOL or (lease is not None and lease.task_id == task)):
        return lease
    return found
