"""Carrying a tick's plan out: grant the heavy lease, record the dispatch with the due index
(only while holding the beat lock), send the messages, publish the pressure on the lease."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, NoReturn

import redis
from celery.beat import ScheduleEntry

from schedproj.core.deferrals import Deferral
from schedproj.core.dueindex import (
    Holds,
    TickMemory,
    full_holds,
    next_look,
    waits_for_lease,
    with_changes,
)
from schedproj.core.errors import BeatLockLost, BeatLockVanished
from schedproj.core.families import split_member
from schedproj.core.lanes import queue_for
from schedproj.core.picker import Policy
from schedproj.core.pipeline import Decision
from schedproj.core.planner import Missed, Plan, Send
from schedproj.core.pools import DEFAULT_POOL, Grant
from schedproj.core.pressure import Pressure, changed, measure, outranks
from schedproj.core.pressure import encode as encode_pressure
from schedproj.core.records import LaneState, LeaseView
from schedproj.on_celery.messages import (
    LEASE_KWARG,
    heavy_kwargs,
    light_kwargs,
    shown_kwargs,
    slots_of,
)
from schedproj.on_celery.runtime import Runtime
from schedproj.on_celery.tick_lanes import TickLanes
from schedproj.store.lane_store import Snapshot
from schedproj.store.lease import Grant as LeaseGrant
from schedproj.store.lease import free_slots
from schedproj.store.protocol import CounterKind, counter_field

logger = logging.getLogger("schedproj.beat")


class LaneEntry(ScheduleEntry):  # type: ignore[misc]
    """A schedule entry that carries the result of its own send: Celery's ``apply_entry``
    logs a failed send and swallows it, so the failure is noted here for the caller."""

    send_error: BaseException | None = None


def _nothing_before_send(plan: Plan) -> None:
    """The default between recording a dispatch and sending it: nothing."""


class Dispatcher:
    """Grant, record (with the due index), send. ``apply_entry`` is Celery's send (the
    scheduler's, so Sentry's Crons wrapper sees it); ``before_send`` is a seam between
    recording and sending, for fault runs that stall a beat there."""

    def __init__(self, rt: Runtime, token: str, memory: TickMemory, lanes: TickLanes,
                 entries: Mapping[str, ScheduleEntry],
                 apply_entry: Callable[[LaneEntry], None],
                 before_send: Callable[[Plan], None] = _nothing_before_send) -> None:
        self.rt, self.settings, self.token = rt, rt.settings, token
        self.memory, self.lanes, self.entries = memory, lanes, entries
        self.apply_entry, self.before_send = apply_entry, before_send
        #: The heavy lease this beat granted in its last dispatch (None: it granted none).
        self.granted: LeaseView | None = None
        #: The slot grants of its last dispatch, per pool (one view per grant, with the
        #: grant's fence: the highest of its slots').
        self.granted_slots: dict[str, list[LeaseView]] = {}
        #: The last refusal said for a heavy grant or a counter write (once per onset).
        self.refused: dict[str, str] = {}

    def dispatch(self, plan: Plan, snap: Snapshot,
                 slots: Mapping[str, Sequence[LeaseView | None]] | None = None,
                 ) -> tuple[Plan, float | None]:
        """Returns the plan carried out and the next look after now. ``slots``: each pool's
        slot leases as read this tick (pools beyond the default). Raises
        :class:`BeatLockLost` if this beat lost its lock on the way (nothing is sent then)."""
        ttl = self.settings.beat_lock_ttl_s
        # A long tick (thousands of lanes newly due at once): renewed before the writes.
        holder = (self.rt.store.renew_held(self.token, ttl) if time.time() - plan.now > ttl / 3
                  else None)
        if holder == "":
            # Redis lost its state (or the lock expired) and no beat took the lock: what this
            # beat remembers is kept for its next tick to put back (FairScheduler).
            raise BeatLockVanished("the beat lock vanished before recording the dispatch")
        if holder is not None:
            self.memory.reset()
            raise BeatLockLost("the tick outlived the beat lock before recording the dispatch")
        self.granted, self.granted_slots = None, {}
        # A plan over more lanes than a page is recorded by pages (``_write_sched``): apart.
        together = (self._grant_and_record(plan, snap, slots)
                    if not plan.pool_sends and len(plan.states) <= self.rt.store.read_page
                    else None)
        settle: Callable[[], object] | None = None  # the together path settled already
        if together is not None:
            grants, looks = together
        else:
            plan, grants, looks, settle = self._grant_and_record_apart(plan, snap, slots)
        # The messages first: the counters are bookkeeping, and every hand-off with lanes
        # waiting defers them, so counting first put a round trip on the hand-off's path.
        # So are the deferral and miss logs (two or three formatted lines a hand-off, ~0.15
        # ms before the send, issue 23: 3): said once the messages left, or failed to.
        try:
            self._send(plan, snap, grants, looks, settle)
        finally:
            _log_deferrals(plan.new_deferrals, plan.decision)
            _log_misses(plan.misses)
        counts = Counter(counter_field(CounterKind.DEFERRALS, d.reason.value)
                         for d in plan.new_deferrals)
        for miss in plan.misses:
            counts[counter_field(CounterKind.MISSED, miss.lane)] += miss.count
        try:
            self.rt.store.count_many(counts)
        except redis.ResponseError as exc:  # counters of the wrong type: dispatch goes on
            self._say_refused("deferral counters", exc, "the deferral counters are not "
                              f"kept; delete {self.rt.keys.counters} (`redis-cli DEL` it)")
        later = [look for look in looks.values() if look > plan.now]
        if snap.next_look is not None:
            later.append(snap.next_look)
        return plan, min(later, default=None)

    def _grant_and_record_apart(
            self, plan: Plan, snap: Snapshot, slots: Mapping[str, Sequence[LeaseView | None]]
            | None) -> tuple[Plan, dict[str, dict[str, Any]], dict[str, float],
                             Callable[[], object]]:
        """The heavy lease and the pools' slots granted, then the plan recorded (but for
        more sends than a page: ``_send``). Returns the plan carried out, the grants, the
        looks and what settles beat's memory (``_record``)."""
        plan, grant_kwargs = self._grant(plan, snap.lock.fence)
        grants = {}
        if grant_kwargs and plan.decision.winner is not None:
            grants[plan.decision.winner] = grant_kwargs
        try:
            plan = self._grant_slots(plan, snap.lock.fence, slots or {}, grants)
        except BeatLockLost:
            self._release_all(grants)
            raise
        looks, settle = self._record(plan, snap, grants, slots)
        return plan, grants, looks, settle

    def _send(self, plan: Plan, snap: Snapshot, grants: dict[str, dict[str, Any]],
              looks: Mapping[str, float], settle: Callable[[], object] | None) -> None:
        """Send the plan's messages, memory settled (``settle``, unless the plan was recorded
        with its grant) once the whole plan is recorded: before the sends, or, with more
        sends than a page, after their pages."""
        if settle is not None and len(plan.sends) > self.rt.store.read_page:
            self._record_and_send_by_pages(plan, snap, grants, looks)
            settle()
            return
        if settle is not None:
            settle()
        self.before_send(plan)
        self._send_all(plan, snap, grants)

    def _record(self, plan: Plan, snap: Snapshot, grants: dict[str, dict[str, Any]],
                slots: Mapping[str, Sequence[LeaseView | None]] | None,
                ) -> tuple[dict[str, float], Callable[[], object]]:
        """Write the plan's record changes and each planned lane's next look, together, only
        while holding the beat lock. Returns the looks, and what settles beat's memory on
        them: called once the whole plan is recorded."""
        states = with_changes(plan.states, plan.changes)
        looks, waiting = self._looks(plan, states, snap)
        winner = grants.get(plan.decision.winner or "")
        token = (winner[LEASE_KWARG]["token"] if winner
                 else snap.lease.token if snap.lease is not None else None)
        # What settle returns (the looks the index does not hold), taken before it: memory is
        # settled only once the plan is recorded. A record refused for a vanished lock leaves
        # beat what it read this tick to put back (settling forgot the lanes planned not due).
        writes = {lane: look for lane, look in looks.items()
                  if self.memory.scores.get(lane) != look}
        if not self._write_sched(plan, writes):
            self._refused(grants)
        return looks, lambda: self.memory.settle(
            looks, plan.now, token, waiting, states,
            holds=None if slots is None else holds_after(slots, grants))

    def _refused(self, grants: Mapping[str, dict[str, Any]]) -> NoReturn:
        """A guarded record write was refused: give back ``grants`` (whose messages will not
        leave) and raise what the lock's state says."""
        self._release_all(grants)
        # Refused for a lock no beat holds: Redis lost its state between two calls (a plan
        # over many lanes is recorded by pages, seconds of calls at a million lanes), as the
        # dispatch's renewal would have found it. What this beat remembers is kept for its
        # next tick to take the lock back and put back (FairScheduler); standing by with its
        # memory reset, it took the lock afresh and put back nothing.
        if self.rt.store.renew_held(self.token, self.settings.beat_lock_ttl_s) == "":
            raise BeatLockVanished("the beat lock vanished while recording the dispatch")
        self.memory.reset()
        raise BeatLockLost("beat lock lost before recording the dispatch")

    def _write_sched(self, plan: Plan, looks: Mapping[str, float]) -> bool:
        """Write the plan's record changes and ``looks`` while holding the beat lock; False
        (the rest unwritten) once it is lost. More lanes than a page (a million family members
        added at once) go a page of lanes a call: one call of every record held Redis for
        seconds (1.5 s at 200,000 lanes), every worker's lease renewal and run end waiting
        behind it. The lanes the plan sends go in the last call (more of them than a page:
        by pages, each just before its messages, ``_record_and_send_by_pages``): a tick cut
        off between calls leaves next looks and deferrals, which the next tick works out
        again, but never an in-flight mark for a message that was not sent."""
        store, page, changes = self.rt.store, self.rt.store.read_page, plan.changes
        if len(changes) + len(looks) <= page:
            return store.write_sched(self.token, changes, looks)
        lanes = [lane for lane in dict.fromkeys([*changes, *looks]) if lane not in plan.sends]
        pages = [lanes[i:i + page] for i in range(0, len(lanes), page)]
        if len(plan.sends) <= page:  # more: each page recorded just before it is sent
            pages.append(list(plan.sends))
        return all(self._write_page(plan, looks, part) for part in pages)

    def _write_page(self, plan: Plan, looks: Mapping[str, float], lanes: Sequence[str]) -> bool:
        """One guarded call: ``lanes``' record changes and next looks."""
        changes = plan.changes
        return self.rt.store.write_sched(
            self.token, {lane: changes[lane] for lane in lanes if lane in changes},
            {lane: looks[lane] for lane in lanes if lane in looks})

    def _record_and_send_by_pages(self, plan: Plan, snap: Snapshot,
                                  grants: Mapping[str, dict[str, Any]],
                                  looks: Mapping[str, float]) -> None:
        """More lanes to send than a page (a light family's members all due at once): each
        page's in-flight marks written, then its messages sent, then the next page. Every
        mark in one call held Redis for 0.66 s at 200,000 light members (seconds at a
        million); written all before any send, a lock lost between two calls would leave
        marks of messages that never left. The granted lanes go in the first page. A page
        refused gives back the grants not yet sent and raises as a refused record does."""
        page = self.rt.store.read_page
        lanes = sorted(plan.sends, key=lambda lane: lane not in grants)
        self.before_send(plan)
        for start in range(0, len(lanes), page):
            part = lanes[start:start + page]
            if not self._write_page(plan, looks, part):
                self._refused({lane: grants[lane] for lane in lanes[start:] if lane in grants})
            self._send_all(plan, snap, grants, part)

    def _grant_and_record(self, plan: Plan, snap: Snapshot,
                          slots: Mapping[str, Sequence[LeaseView | None]] | None,
                          ) -> tuple[dict[str, dict[str, Any]], dict[str, float]] | None:
        """The heavy lease granted to the plan's winner and the plan recorded in one call
        (the hand-off's path: one round trip fewer), the records written only with the grant.
        Returns the grants and the looks; None when the plan has no heavy winner, or the grant
        was refused or failed (nothing recorded: the caller grants and records apart, and
        says why as it always did). Raises :class:`BeatLockLost` if this beat lost its lock."""
        heavy = plan.heavy
        if heavy is None:
            return None
        token = uuid.uuid4().hex
        grants = {heavy.lane: heavy_kwargs(token, 0, snap.lock.fence)}
        states = with_changes(plan.states, plan.changes)
        looks, waiting = self._looks(plan, states, snap)
        # What settle (below, once granted) returns: the looks the index does not hold.
        writes = {lane: look for lane, look in looks.items()
                  if self.memory.scores.get(lane) != look}
        try:
            grant, written = self.rt.lease.acquire_and_write(
                heavy.lane, token, self.settings.start_deadline_s, plan.now,
                task_id=heavy.task_id, beat_token=self.token,
                write=self.rt.store.sched_write(self.token, plan.changes, writes))
        except redis.ResponseError:
            # A bad key on either side; the grant may have been made before the write failed.
            with contextlib.suppress(redis.ResponseError):
                self.rt.lease.release(token)
            return None
        if grant.not_active_beat or written == -1:
            if grant.granted:
                self.rt.lease.release(token)
            self.memory.reset()
            raise BeatLockLost("beat lock lost before granting the heavy lease")
        if not grant.granted:
            return None
        self.refused.pop("heavy grant", None)
        self.granted = LeaseView(lane=heavy.lane, token=token, fence=grant.fence,
                                 granted_at=plan.now, task_id=heavy.task_id)
        grants[heavy.lane] = heavy_kwargs(token, grant.fence, snap.lock.fence)
        self.memory.settle(looks, plan.now, token, waiting, states,
                           holds=None if slots is None else holds_after(slots, grants))
        return grants, looks

    def _release_all(self, grants: Mapping[str, dict[str, Any]]) -> None:
        for kwargs in grants.values():
            self._release(kwargs)

    def _release(self, kwargs: Mapping[str, Any]) -> None:
        """Undo a grant whose message will not leave: the heavy lease or its slot leases."""
        grant = kwargs.get(LEASE_KWARG)
        if not grant:
            return
        pool, slots = slots_of(grant)
        if pool is not None:
            self.rt.slot_group(pool, slots).release(grant["token"])
        else:
            self.rt.lease.release(grant["token"])

    def _looks(self, plan: Plan, states: dict[str, LaneState],
               snap: Snapshot) -> tuple[dict[str, float], dict[str, str]]:
        """Each planned lane's next look once the plan is carried out (``states``), and which
        of them are heavy lanes waiting for their pool, with the pool (skipped while the
        same lease, or every slot of the pool, stays held: ``TickMemory.focus``)."""
        looks: dict[str, float] = {}
        waiting: dict[str, str] = {}
        memory, changes, read = self.memory, plan.changes, snap.states
        for lane, state in states.items():
            if lane not in changes and lane not in read and lane in memory.scores:
                # Due before, unchanged since: its next look is what the index holds.
                looks[lane] = memory.scores[lane]
                if lane in memory.waiting:
                    waiting[lane] = self.lanes.specs[lane].pool
                continue
            spec = self.lanes.specs[lane]
            forced = lane in snap.forced and lane not in plan.sends
            looks[lane] = next_look(spec, state, plan.now, paused=lane in snap.paused,
                                    forced=forced, grace_s=self.settings.lease_ttl_s)
            # Each pool's waiters are skipped only while its own holds stay (a slot of a
            # pool may free with the lease unchanged): ``TickMemory.focus`` compares them.
            if (spec.heavy and waits_for_lease(state) and lane not in plan.sends
                    and spec.family not in self.lanes.gating_families):
                waiting[lane] = spec.pool
        return looks, waiting

    def _grant(self, plan: Plan, beat_fence: int) -> tuple[Plan, dict[str, Any]]:
        """Ask for the heavy lease for the plan's winner. Returns the plan to carry out (the
        winner dropped if the lease is held) and the grant to send with the winner's message;
        raises :class:`BeatLockLost` if this beat lost its lock."""
        heavy = plan.heavy
        if heavy is None:
            return plan, {}
        token = uuid.uuid4().hex
        try:
            grant = self.rt.lease.acquire(heavy.lane, token, self.settings.start_deadline_s,
                                          plan.now, task_id=heavy.task_id,
                                          beat_token=self.token)
        except redis.ResponseError as exc:
            # A heavy-side key of the wrong type or garbage: heavy lanes wait, light ones run.
            with contextlib.suppress(redis.ResponseError):
                self.rt.lease.release(token)  # in case the script failed after granting
            k = self.rt.keys
            self._say_refused("heavy grant", exc, "heavy lanes wait, light lanes run. Fix: "
                              f"inspect {k.lease}, {k.lease_fence}, {k.counters} and {k.epoch} "
                              "(`redis-cli TYPE`, `GET`) and delete the bad one")
            return plan.only(set(plan.sends) - {heavy.lane}), {}
        self.refused.pop("heavy grant", None)
        if grant.not_active_beat:
            raise BeatLockLost("beat lock lost before granting the heavy lease")
        if grant.quarantine_s is not None:
            logger.warning("heavy lease not granted: Redis may have lost state; %s waits %s",
                           heavy.lane, "for the state's epoch" if grant.quarantine_s < 0
                           else f"{grant.quarantine_s:.1f}s more")
            return plan.only(set(plan.sends) - {heavy.lane}), {}
        if not grant.granted:
            logger.info("heavy lease already held by %s; %s waits", grant.holder, heavy.lane)
            return plan.only(set(plan.sends) - {heavy.lane}), {}
        self.granted = LeaseView(lane=heavy.lane, token=token, fence=grant.fence,
                                 granted_at=plan.now, task_id=heavy.task_id)
        return plan, heavy_kwargs(token, grant.fence, beat_fence)

    def _grant_slots(self, plan: Plan, beat_fence: int,
                     slots: Mapping[str, Sequence[LeaseView | None]],
                     grants: dict[str, dict[str, Any]]) -> Plan:
        """Take the slot leases of every grant in a pool beyond the default, on the slots
        read free this tick (lowest first, each slot once); a grant whose slots cannot all be
        taken is dropped from the plan (its lane stays due). Adds each grant's message
        keywords to ``grants``; raises :class:`BeatLockLost` if this beat lost its lock."""
        if not plan.pool_sends:
            return plan
        free = {pool: free_slots(leases) for pool, leases in slots.items()}
        dropped: set[str] = set()
        for grant, send in plan.pool_sends:
            taken = self._take_slots(grant, send, plan.now, free.get(grant.pool, []))
            if taken is None:
                dropped.add(grant.lane)
                continue
            token, fence, indexes = taken
            grants[grant.lane] = heavy_kwargs(token, fence, beat_fence, pool=grant.pool,
                                              slots=indexes)
            self.granted_slots.setdefault(grant.pool, []).append(LeaseView(
                lane=grant.lane, token=token, fence=fence, granted_at=plan.now,
                task_id=send.task_id))
        return plan.only(set(plan.sends) - dropped) if dropped else plan

    def _take_slots(self, grant: Grant, send: Send, now: float,
                    free: list[int]) -> tuple[str, int, tuple[int, ...]] | None:
        """Acquire ``grant.slots`` of the ``free`` slots under one token, all or none:
        (token, the highest fence, the slots) or None. Slots taken (or found held or broken
        after all) leave ``free``; a slot refused is passed over for the next free one, so
        one broken key does not stop a pool that has healthy free slots."""
        if len(free) < grant.slots:
            return None
        token = uuid.uuid4().hex
        taken: list[tuple[int, int]] = []
        broken = False
        for index in list(free):
            if len(taken) == grant.slots:
                break
            answer = self._acquire_slot(grant, send, now, index, token)
            if answer is not None and answer.not_active_beat:
                self.rt.slot_group(grant.pool, [i for i, _ in taken] or [index]).release(token)
                raise BeatLockLost("beat lock lost before granting a slot")
            if answer is None or not answer.granted:
                self._say_slot_refused(grant, index, answer)
                free.remove(index)  # held after all (or broken): not free this tick
                broken = broken or answer is None
                if answer is not None and answer.quarantine_s is not None:
                    break  # the state's epoch is in question, not this slot: none is granted
                continue
            taken.append((index, answer.fence))
        return self._keep_taken(grant, token, taken, free, broken)

    def _keep_taken(self, grant: Grant, token: str, taken: list[tuple[int, int]],
                    free: list[int], broken: bool) -> tuple[str, int, tuple[int, ...]] | None:
        """All or none: the slots ``taken`` (index, fence) when they are all the grant needs,
        else they are released."""
        if len(taken) < grant.slots:
            if taken:
                self.rt.slot_group(grant.pool, [i for i, _ in taken]).release(token)
            return None
        if not broken:  # (a broken slot passed over stays said once, not again every tick)
            self.refused.pop(f"slot grant {grant.pool}", None)
        for index, _ in taken:
            free.remove(index)
        return token, max(f for _, f in taken), tuple(i for i, _ in taken)

    def _acquire_slot(self, grant: Grant, send: Send, now: float, index: int,
                      token: str) -> LeaseGrant | None:
        """Grant slot ``index`` of ``grant.pool`` under ``token``; None when Redis refuses
        the command (a key of the slot holds garbage: said once, naming the keys)."""
        lease = self.rt.slot_group(grant.pool, (index,)).leases[0]
        try:
            return lease.acquire(grant.lane, token, self.settings.start_deadline_s, now,
                                 task_id=send.task_id, beat_token=self.token)
        except redis.ResponseError as exc:
            self._say_refused(f"slot grant {grant.pool}", exc, "lanes of pool "
                              f"{grant.pool!r} wait. Fix: inspect {lease.keys.lease} and "
                              f"{lease.keys.lease_fence} and delete the bad one")
            return None

    @staticmethod
    def _say_slot_refused(grant: Grant, index: int, answer: LeaseGrant | None) -> None:
        if answer is None:
            return
        if answer.quarantine_s is not None:
            logger.warning("slot %d of pool %s not granted: Redis may have lost state; %s "
                           "waits %s", index, grant.pool, grant.lane,
                           "for the state's epoch" if answer.quarantine_s < 0
                           else f"{answer.quarantine_s:.1f}s more")
        else:
            logger.info("slot %d of pool %s already held by %s; %s waits", index, grant.pool,
                        answer.holder, grant.lane)

    def _say_refused(self, what: str, exc: Exception, fix: str) -> None:
        if self.refused.get(what) != str(exc):
            logger.error("Redis refused a command for the %s (%s): %s", what, exc, fix)
        self.refused[what] = str(exc)

    def _send_all(self, plan: Plan, snap: Snapshot, grants: Mapping[str, dict[str, Any]],
                  lanes: Sequence[str] | None = None) -> None:
        """Send the heavy winner, every pool's grants and every light lane (``lanes`` of them
        only, when given); log what left for the audit."""
        sent = []
        for lane in plan.sends if lanes is None else lanes:
            send = plan.sends[lane]
            kwargs = grants.get(lane) or light_kwargs(snap.lock.fence)
            if self.send(lane, send, kwargs):
                grant = kwargs.get(LEASE_KWARG, {})
                entry = {"lane": lane, "task": send.task_id, "t": time.time(),
                         "beat": self.token[:8], "fence": grant.get("fence", 0)}
                if "pool" in grant:
                    entry.update(pool=grant["pool"], slots=grant["slots"])
                sent.append(entry)
        self.audit(sent)
        # A forced lane whose message did not leave keeps its request for the next tick.
        self.rt.store.done_forcing([e["lane"] for e in sent if e["lane"] in snap.forced])

    def audit(self, entries: Sequence[Mapping[str, Any]]) -> None:
        """Append ``entries`` to the dispatch log, an audit list (the chaos audit reads it).
        A log of the wrong type stops nothing else: its refusal, after the messages left,
        stopped the tick there (a run-now request served stayed requested, the entries and
        families steps were skipped) and, on taking the lock, stopped beat before it
        announced itself. The same for an audit Redis of its own (``audit_redis_url``) out
        of reach: beat took its connection error for the state Redis's and stood by, every
        tick. (With the log on the state Redis, that Redis's next call says it is out of
        reach.) Said once per onset."""
        try:
            self.rt.store.log_many(self.rt.keys.dispatch_log, entries)
        except redis.ResponseError as exc:
            key = self.rt.keys.dispatch_log
            if "dispatch log" not in self.refused:
                logger.error("Redis refused a command for the dispatch log (%s): %s (must be a "
                             "list) holds a value of the wrong type; the audit misses entries, "
                             "scheduling goes on. Fix: `redis-cli DEL %s`", exc, key, key)
            self.refused["dispatch log"] = str(exc)
            return
        except redis.RedisError as exc:
            if "dispatch log" not in self.refused:
                logger.error("cannot append to the dispatch log (%s); the audit misses entries "
                             "until its Redis is back, scheduling goes on", exc)
            self.refused["dispatch log"] = str(exc)
            return
        self.refused.pop("dispatch log", None)

    def send(self, lane: str, send: Send, kwargs: dict[str, Any]) -> bool:
        """Send one lane's message; on failure undo its grant. True if it left."""
        spec = self.lanes.specs[lane]
        member = split_member(lane) if spec.family is not None else None
        entry = LaneEntry(
            name=lane, task=spec.task_name, app=self.entries[spec.family or lane].app,
            schedule=self.entries[spec.family or lane].schedule,
            args=(member[1],) if member else (), kwargs=kwargs,
            # No Celery ``expires``: whether given absolute or in seconds, Celery turns it into
            # an absolute time on beat's clock that each worker judges on its own, so a worker
            # whose clock runs ahead would drop every message. A late message is refused by
            # Redis-side checks instead, on one clock: a heavy grant lapses at the start
            # deadline (its TTL on the server), and a light message starts only while it is its
            # lane's current dispatch, so none can run after beat has sent its replacement.
            # The AMQP ``expiration`` (relative; RabbitMQ enforces it on its own clock) still
            # drops a message nobody consumed before its deadline.
            options={"queue": queue_for(spec.kind, spec.pool), "task_id": send.task_id,
                     "expiration": max(0.0, send.deadline - time.time()),
                     "kwargsrepr": shown_kwargs(kwargs)},
        )
        self.apply_entry(entry)
        if entry.send_error is None:
            return True
        # The message never left: undo the grant so nothing waits for it.
        logger.error("lane %s: send failed; lease released and lane left due", lane)
        self._release(kwargs)
        self.rt.store.clear_inflight(self.token, lane)
        return False


def holds_after(slots: Mapping[str, Sequence[LeaseView | None]],
                grants: Mapping[str, Mapping[str, Any]]) -> dict[str, Holds]:
    """Each full pool's holds once this tick's slot grants are in (``full_holds``): the slots
    read free and granted now, under their grant's token, not started yet. What the next
    tick reads if nothing else changes, so its waiters are skipped then."""
    seen = {pool: list(leases) for pool, leases in slots.items()}
    for kwargs in grants.values():
        grant = kwargs.get(LEASE_KWARG)
        if not grant:
            continue
        pool, indexes = slots_of(grant)
        if pool is None or pool not in seen:
            continue
        for index in (i for i in indexes if i < len(seen[pool])):
            seen[pool][index] = LeaseView(lane="", token=grant["token"], fence=0,
                                          granted_at=0.0)
    return full_holds(seen)


def _log_misses(misses: tuple[Missed, ...]) -> None:
    for m in misses:
        logger.warning(
            "lane %s missed %d fire time(s) through %s: not started within its catch-up window "
            "(%ss); it waits for its next fire time", m.lane, m.count,
            datetime.fromtimestamp(m.through, UTC).isoformat(timespec="seconds"), m.window_s)


def _log_deferrals(news: tuple[Deferral, ...], decision: Decision) -> None:
    for d in news:
        logger.info("lane %s deferred: %s (blocker %s)", d.lane, d.reason.value, d.blocker)
    for lane, gate in decision.expired_gates:
        logger.warning("lane %s: gate on %s deferred it for over %ss; letting it run so the "
                       "chain cannot deadlock", lane, gate.blocker, gate.max_defer_s)
    if decision.dispatched:
        logger.info("dispatch: heavy=%s light=%s", decision.winner or "-",
                    ",".join(decision.also_dispatched) or "-")


class PressurePublisher:
    """Publishes the waiting heavy lane pressing on the lease (``core.pressure.measure``) for
    the holder, who reads it in its renewal reply."""

    def __init__(self, rt: Runtime, lanes: TickLanes) -> None:
        self.rt, self.lanes = rt, lanes
        #: Pools beyond the default are declared (``lanes`` None: a lane set not known).
        self.pooled = lanes is not None and len(lanes.lanes.pools) > 1
        #: The pressure this beat last published, if it published.
        self.published: tuple[Pressure | None] | None = None
        self.failing = False

    def publish(self, decision: Decision, snap: Snapshot, now: float, *,
                states: Mapping[str, LaneState], partial: bool,
                granted: LeaseView | None = None) -> None:
        """Written only when it changed: an unchanged tick costs no round trip. A beat that
        just took the lock, or Redis that lost state, writes it again whatever this beat last
        wrote. A ``partial`` tick skipped lanes waiting on the same hold: what it published
        for them stands unless a lane it did see outranks it.

        ``granted`` is the lease this tick granted: the lanes it deferred press on that hold.
        (Measured on the lease as read — free — they pressed on nothing, and the ticks after
        skip them while the same lease is held: the holder never heard of them.)"""
        if self.pooled:  # pools beyond the default are declared: their lanes press
            decision = _default_pool_only(decision)  # on their own pools' holders only
        pressure = measure(decision, states, granted or snap.lease, now,
                           legacy=self.rt.settings.policy is Policy.REGISTRY)
        if partial and self.published is not None and not outranks(
                pressure, self.published[0], now, self.lanes.spec):
            return
        if snap.lock.event != "renewed" or snap.epoch.cause:
            self.published = None
        if self.published is not None and not changed(self.published[0], pressure):
            return
        try:
            self.rt.store.client.hset(self.rt.keys.pressure, "current", encode_pressure(pressure))
        except redis.ResponseError as exc:
            # Garbage at the key (a string, a list): say so once and keep scheduling; the
            # holder's renewal reads no pressure from it meanwhile.
            if not self.failing:
                logger.error("cannot publish the pressure on the lease (%s); delete the key %s",
                             exc, self.rt.keys.pressure)
            self.failing = True
            return
        self.published, self.failing = (pressure,), False


def _default_pool_only(decision: Decision) -> Decision:
    """The decision as the heavy lease's holder sees it: a waiter presses only on the holders
    of its own pool, so the lanes of other pools are left out."""
    return replace(decision, views={name: view for name, view in decision.views.items()
                                    if view.spec.pool == DEFAULT_POOL})


__all__ = ["Dispatcher", "LaneEntry", "PressurePublisher", "holds_after"]
