"""FairScheduler: a Celery Beat scheduler that ranks heavy lanes by staleness ratio.

``celery -A schedproj.app beat -S fair``. Each tick: take/renew the beat lock and load all
state (one Redis round trip) -> plan the tick (the pure planner, :mod:`schedproj.core.planner`)
-> grant the heavy lease to the winner -> record in-flight/deferral state (guarded by the beat
lock) -> send the heavy winner to queue ``heavy`` and every due light lane to ``light`` through
Celery's ``apply_entry`` -> block on the wake list until a run finishes or the next lane falls
due. This module only carries the plan out; every decision is the planner's.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any

import redis
from celery.beat import ScheduleEntry, Scheduler
from celery.schedules import schedule as every

from schedproj.core import defaults, lifecycle
from schedproj.core.deferrals import Deferral
from schedproj.core.dueindex import TickMemory, next_look, waits_for_lease, with_changes
from schedproj.core.errors import BeatLockLost, StateError
from schedproj.core.families import LaneFamily, split_member
from schedproj.core.lanes import LaneSpec, queue_for
from schedproj.core.laneset import LaneSet, registry_json
from schedproj.core.picker import Policy
from schedproj.core.pipeline import Decision
from schedproj.core.planner import Plan, Send, TickInput, plan_tick
from schedproj.core.pressure import Pressure, changed, measure
from schedproj.core.pressure import encode as encode_pressure
from schedproj.core.records import LaneState, LeaseView, Outcome, RunRecord
from schedproj.on_celery.config import no_lanes_message, validate_or_exit, wait_for_redis
from schedproj.on_celery.messages import LEASE_KWARG, heavy_kwargs, light_kwargs
from schedproj.on_celery.runtime import Runtime, settings_for
from schedproj.store.families import FamilyStore
from schedproj.store.lane_store import Snapshot
from schedproj.store.protocol import CounterKind, counter_field, run_field
from schedproj.telemetry import metrics
from schedproj.telemetry.sentry import crons_exclusions, init_sentry

logger = logging.getLogger("schedproj.beat")

#: How often a standby beat retries the lock (seconds); failover takes about the lock TTL.
STANDBY_POLL_S = 1.0
#: Pause after Redis could not be reached before the next attempt (seconds).
REDIS_RETRY_S = 1.0


def outranks(new: Pressure | None, old: Pressure | None, now: float) -> bool:
    """Would the picker choose ``new``'s lane over ``old``'s at ``now``?"""
    if new is None:
        return False
    if old is None:
        return True

    def rank(p: Pressure) -> tuple[int, float]:
        ratio = (math.inf if p.last_run_at is None
                 else max(0.0, now - p.last_run_at) / p.cadence_s)
        return (0 if p.priority0 else 1, -ratio)

    return rank(new) < rank(old)


class LaneEntry(ScheduleEntry):  # type: ignore[misc]
    """A schedule entry that carries the result of its own send: Celery's ``apply_entry``
    logs a failed send and swallows it, so the failure is noted here for the caller."""

    send_error: BaseException | None = None


class FairScheduler(Scheduler):  # type: ignore[misc]
    """Staleness-ratio fair scheduler with one heavy lease and same-tick light dispatch."""

    #: celery-redbeat, when merely installed, connects a global beat_init handler that reads
    #: ``scheduler.lock_key`` of whatever scheduler runs and logs an AttributeError when it is
    #: missing. None tells it there is nothing of its own to lock; our lock is in the tick.
    lock_key = None
    #: The reason this beat last said it stands by (said once per reason).
    _standby_said: str = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.lanes: LaneSet | None = None
        self.rt: Runtime | None = None
        self.token = uuid.uuid4().hex
        self.active = False
        self._reported: dict[str, str] = {}
        #: The pressure this beat last published (``_publish_pressure``), if it published.
        self._pressure: tuple[Pressure | None] | None = None
        self._pressure_failing = False
        #: The due lanes and the index position between ticks (rebuilt from Redis).
        self.memory = TickMemory()
        #: The started heavy lease seen last tick: if it goes with no end recorded and its run
        #: was never marked running, the run is lost (``_record_vanished_run``).
        self._started_lease: LeaseView | None = None
        #: When this beat last read Redis holding the lock (its memory is that old).
        self._last_read_at = 0.0
        #: Last runs this beat estimated after a state loss, kept until the lane's record says
        #: it ran: a second loss before then keeps the earlier estimate, so losses that come
        #: faster than a cadence never push a lane's turn back for ever.
        self._estimated: dict[str, float] = {}
        #: When this beat last put back records after a state loss (a run that started before
        #: then and is recorded lost may have ended unrecorded: its end was lost with Redis).
        self._put_back_at: float | None = None
        kwargs.pop("schedule_filename", None)
        super().__init__(*args, **kwargs)

    # -- Celery Scheduler interface ---------------------------------------------------------
    def setup_schedule(self) -> None:
        self.settings = settings_for(self.app)
        self.lanes = validate_or_exit(self.app, "beat")
        self.rt = Runtime.build(self.settings)
        wait_for_redis(self.app, self.settings, "beat")
        # Sentry Crons only monitors whole-minute intervals: other lanes are left out of it.
        init_sentry(self.settings, "beat", exclude_beat_tasks=crons_exclusions(self.lanes.specs))
        metrics.serve(self.rt.store.client, self.rt.keys, self.settings, self.lanes.specs,
                      json.loads(registry_json(self.lanes, self.settings))["families"])
        self.max_interval = self.settings.beat_max_loop_interval_s
        self.data = {
            spec.name: ScheduleEntry(
                name=spec.name, task=spec.task_name, app=self.app,
                schedule=every(timedelta(seconds=spec.cadence_s)),
                options={"queue": queue_for(spec.kind)},
            )
            for spec in (*self.lanes.specs, *self.lanes.families.values())
        }
        self._plan_setup()
        self._declare_queues()
        if self.app.conf.beat_schedule:
            logger.warning("beat_schedule entries %s are not run by FairScheduler; declare "
                           "them as lanes (lane=Lane(...)) instead",
                           sorted(self.app.conf.beat_schedule))
        if not self.lanes.specs and not self.lanes.families:
            logger.warning("%s", no_lanes_message(self.app))
        logger.info("FairScheduler %s: %d lanes, policy %s, profile %s", self.token[:8],
                    len(self.lanes.specs), self.settings.policy.value,
                    self.settings.profile.value)

    def _plan_setup(self) -> None:
        """What every tick needs from the lane set, computed once: the lanes read every tick
        (gate blockers, lanes with a due-check hook), the hooks, the family syncs."""
        assert self.lanes is not None
        lanes = self.lanes
        blockers = {g.blocker for spec in (*lanes.specs, *lanes.families.values())
                    for g in spec.gates}
        self._hooks = [(spec.name, lanes.options[spec.name].due_check) for spec in lanes.specs
                       if lanes.options[spec.name].due_check is not None]
        self._always = sorted({b for b in blockers if b not in lanes.families}
                              | {name for name, _ in self._hooks})
        #: Members of families a gate names are never skipped (the gate needs their views).
        self._gating_families = frozenset(b for b in blockers if b in lanes.families)
        self._syncs = {name: 0.0 for name, opt in lanes.options.items()
                       if isinstance(opt, LaneFamily) and opt.members is not None}
        self._specs: dict[str, LaneSpec] = {}
        self._broken: set[str] = set()

    def _reread(self) -> list[str]:
        """The lanes read every tick: gate blockers, due-check lanes, unreadable ones."""
        return [*self._always, *sorted(self._broken - set(self._always))]

    def _spec(self, lane: str) -> LaneSpec | None:
        """The lane's spec (members resolved once and kept while they are due)."""
        assert self.lanes is not None
        spec = self._specs.get(lane)
        if spec is None and self.lanes.knows(lane):
            spec = self._specs[lane] = self.lanes.spec(lane)
        return spec

    def _declare_queues(self) -> None:
        """Declare both queues before the first send: beat's producer does not auto-declare,
        and on Redis a message sent to a queue nobody declared yet is silently dropped."""
        with self.app.connection_for_write() as conn:
            channel = conn.default_channel
            for name in (defaults.HEAVY_QUEUE, defaults.LIGHT_QUEUE):
                queue = self.app.amqp.queues[name]
                queue.bind(channel).declare()

    def tick(self, *args: Any, **kwargs: Any) -> float:
        try:
            return self._tick()
        except BeatLockLost as exc:
            # Lost between reading and writing (another beat took over): stop at once; the
            # next tick finds the lock held elsewhere and stands by.
            self._go_standby(str(exc))
            return 0.0
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._go_standby(f"Redis unreachable ({exc})")
            return REDIS_RETRY_S
        except redis.ResponseError as exc:
            # A key of the wrong type or garbage where a number belongs: say so every tick
            # and keep running (no crash loop); the operator fixes or deletes the key.
            logger.error("scheduling error: Redis refused a command (%s); a schedproj key "
                         "under prefix %r holds a value of the wrong type — inspect it with "
                         "`schedproj status` and delete the bad key", exc,
                         self.settings.key_prefix)
            return REDIS_RETRY_S

    def apply_async(self, entry: ScheduleEntry, producer: Any = None, advance: bool = False,
                    **kwargs: Any) -> Any:
        try:
            return super().apply_async(entry, producer=producer, advance=False, **kwargs)
        except Exception as exc:
            if isinstance(entry, LaneEntry):
                entry.send_error = exc
            raise

    def sync(self) -> None:
        """State is written to Redis as it changes; nothing to flush."""

    def close(self) -> None:
        if self.rt is not None and self.active:
            try:
                self.rt.store.unlock(self.token)
                logger.info("beat %s: released the beat lock", self.token[:8])
            except redis.RedisError:
                logger.warning("beat %s: could not release the beat lock; it expires on its "
                               "own", self.token[:8])
        self.active = False

    @property
    def info(self) -> str:
        if self.lanes is None:
            return ""
        return f"    . lanes -> {', '.join(self.lanes.names) or '(none)'}"

    # -- one tick -----------------------------------------------------------------------------
    def _tick(self) -> float:
        assert self.rt is not None and self.lanes is not None
        s = self.settings
        now = time.time()
        snap = self._read(now)
        if snap is None:
            return min(STANDBY_POLL_S, s.beat_max_loop_interval_s)
        probes, unreadable = self._probe(snap)
        for lane in self.memory.learn(snap.states, snap.scores, snap.errors):
            self._specs.pop(lane, None)
        if self._estimated:
            for lane, read_state in snap.states.items():
                if read_state.run.last_reason != lifecycle.ESTIMATED_AFTER_LOSS:
                    self._estimated.pop(lane, None)
        if snap.epoch.quarantine_left_s == 0:  # a run lost in a state loss may re-assert
            # Before this tick dispatches: a new run of the lane must not end first.
            self._record_vanished_run(snap, now)
        focus, skipped = self.memory.focus(
            (lane for lane in snap.looked if lane in snap.states), snap.lease, self._always)
        states = {lane: st for lane in focus
                  if (st := self.memory.states.get(lane)) is not None and self._spec(lane)}
        if snap.epoch.quarantine_left_s == 0:  # records lost in a state loss can't be judged
            # Before dispatching: a new run of the lane, started within milliseconds of its
            # message, would replace the dead run's mark before this could record it.
            self._record_lost_runs(snap, states, now)
        plan = plan_tick(
            [self._specs[lane] for lane in states],
            TickInput(states=states, lease=snap.lease, paused=snap.paused,
                      forced=snap.forced, unreadable=unreadable, probes=probes,
                      quarantined=snap.epoch.quarantine_left_s > 0,
                      inflight_grace_s=s.lease_ttl_s),
            now, profile=s.profile, policy=s.policy, start_deadline_s=s.start_deadline_s,
            task_id=lambda lane: str(uuid.uuid4()))
        plan, next_look = self._dispatch(plan, snap)
        self._publish_pressure(plan.decision, snap, now, states=plan.states,
                               partial=skipped > 0)
        self._sync_families(now)
        if len(self._specs) > 2 * len(self.memory.states) + 1000:
            # Member specs are kept while their lanes are due; drop those that no longer are.
            self._specs = {lane: self._specs[lane] for lane in self.memory.states
                           if lane in self._specs}
        return self._wait(plan, next_look, now)

    def _read(self, now: float) -> Snapshot | None:
        """Read what changed (a beat that just took the lock builds its memory from Redis
        first); None when this beat stands by."""
        assert self.rt is not None and self.lanes is not None
        s = self.settings
        read = self.rt.store.tick_snapshot
        snap = read(self.token, s.beat_lock_ttl_s, s.quarantine_s, cursor=self.memory.cursor,
                    now=now, always=self._reread())
        self._notice_state_loss(snap)
        if not snap.lock.held:
            self.memory.reset()
            self._go_standby(f"beat lock held by another beat ({str(snap.lock.holder)[:8]})")
            return None
        if snap.lock.event == "replaced-garbage":
            logger.warning("beat %s: the beat lock key held a value without a TTL (not written "
                           "by a beat); replaced it", self.token[:8])
        if not self.active or snap.lock.event != "renewed" or snap.epoch.cause:
            # New to the lock, or Redis lost state: what this beat remembers may be stale.
            # Index the declared lanes (a deployment from before the index, lanes declared
            # since, an index lost with the state) and read every due lane.
            # Put back only what this beat knew a moment ago: a beat frozen past its lock
            # (another may have run lanes since) remembers a past that is no longer true.
            fresh = now - self._last_read_at <= s.beat_lock_ttl_s
            lost = self.active and fresh and (snap.epoch.cause != "" or (
                snap.lock.event != "renewed" and snap.epoch.quarantine_left_s > 0))
            remembered = {lane: st.run for lane, st in self.memory.states.items()}
            self.memory.reset()
            self.rt.store.ensure_indexed(self.lanes.names)
            if lost:
                self._put_back_runs(remembered, now)
            snap = read(self.token, s.beat_lock_ttl_s, s.quarantine_s, cursor=None, now=now,
                        always=self._reread())
            if not snap.lock.held:
                return None
        self._last_read_at = now
        if not self.active:
            self.active = True
            logger.info("beat %s: active (beat lock %s, fence %d)", self.token[:8],
                        snap.lock.event, snap.lock.fence)
            # For the audit: from now on, messages under an older beat fence must run nothing.
            self.rt.store.log(self.rt.keys.dispatch_log, {
                "ev": "lock", "beat": self.token[:8], "fence": snap.lock.fence,
                "t": time.time()})
            self._announce(now)
        return snap

    def _wait(self, plan: Plan, next_look: float | None, now: float) -> float:
        """Sleep until the next lane needs a look (or a run finishes and wakes beat)."""
        assert self.rt is not None
        s = self.settings
        interval = plan.sleep_s(s.beat_max_loop_interval_s)
        if next_look is not None:
            interval = min(interval, max(0.0, next_look - now))
        if not plan.sends:
            # A tick that sent nothing never comes straight back (garbage that reads as "due
            # now" would spin beat): a floor, capped by the loop interval.
            interval = max(interval, min(defaults.BEAT_IDLE_SLEEP_FLOOR_S,
                                         s.beat_max_loop_interval_s))
        if not s.wake_on_release:
            return interval  # Celery's loop sleeps; only the next poll sees a finished run
        self.rt.store.wait_for_wake(interval)
        return 0.0

    def _notice_state_loss(self, snap: Snapshot) -> None:
        """Say loudly, once, that Redis lost state and what beat does about it."""
        if not snap.epoch.cause:
            return
        if snap.epoch.cause == "state-missing":
            what = ("Redis holds no schedproj state (a restart without persistence, a "
                    "failover, or a first start)")
        else:
            what = "Redis is another server process than before (a restart or a failover)"
        logger.error("state loss: %s; no lane is dispatched for %.1fs while earlier runs "
                     "re-assert their lease or in-flight mark", what,
                     snap.epoch.quarantine_left_s)

    def _put_back_runs(self, remembered: dict[str, RunRecord], now: float) -> None:
        """Redis lost state under this active beat: put back the run records it lost (what
        this beat remembers of its due lanes; an estimate within one due interval for the
        rest, see :func:`lifecycle.rebuilt`), so the lanes go on in their order instead of all
        being "never ran" at once, in declared order. A beat that starts into a loss remembers
        nothing and cannot tell it from a first start: every lane is then due at once. Family
        members are left to the family's ``members`` hook (their set was lost too; putting a
        member back without it would leave a lane nobody lists)."""
        assert self.rt is not None and self.lanes is not None
        records = {}
        for lane in {*self.lanes.names, *remembered}:
            spec = self._spec(lane)
            if spec is None or spec.family is not None:
                continue
            record = lifecycle.rebuilt(remembered.get(lane), lane=lane, cadence_s=spec.cadence_s,
                                       due_ratio=spec.due_ratio, lost_at=now)
            estimate = record.last_run_at
            if lane not in remembered and estimate is not None:
                estimate = min(self._estimated.get(lane, estimate), estimate)
                record = replace(record, last_run_at=estimate)
                self._estimated[lane] = estimate
            records[lane] = record
        written = self.rt.store.put_back_runs(records)
        self._put_back_at = now
        logger.warning("state loss: put back %d lanes' run records (%d as this beat "
                       "remembered them, the rest estimated: due within one due interval)",
                       written, len(remembered.keys() & records.keys()))

    def _record_vanished_run(self, snap: Snapshot, now: float) -> None:
        """Record as lost a heavy run whose lease, seen started on an earlier tick, is gone (or
        names another run) while its run record neither says it ended nor that it is running:
        its worker died after the lease said it started and before the start mark landed (a
        failover can hold that write back for a second). ``_record_lost_runs`` covers a run
        whose mark landed."""
        assert self.rt is not None
        seen, lease = self._started_lease, snap.lease
        if lease is not None and lease.started_at is not None and lease.task_id:
            self._started_lease = lease
        elif lease is None or seen is None or lease.task_id != seen.task_id:
            self._started_lease = None
        if seen is None or not seen.task_id or (lease is not None
                                                 and lease.task_id == seen.task_id):
            return
        raw = snap.raw.get(run_field(seen.lane))
        read = snap.states.get(seen.lane)
        if raw is not None and read is not None:
            # The run's end changed its record, so this tick read it already (a normal
            # hand-off costs no extra round trip); mark_lost compares and sets on this raw.
            record = read.run
        else:
            try:
                raw, record = self.rt.store.read_run_raw(seen.lane)
            except StateError:
                return  # unreadable: reported by the tick, never overwritten
        if seen.task_id in (record.last_task_id, record.skipped_task_id):
            return  # ended (or refused): nothing lost
        if record.fence > seen.fence:
            return  # a newer run wrote the record since: never overwrite its outcome
        if lifecycle.is_running(record):
            return  # a run's mark (its own, or one killed earlier): _record_lost_runs judges
        why = self._why("its lease lapsed before its start was recorded", seen.started_at)
        lost = lifecycle.finished(record, task_id=seen.task_id, outcome=Outcome.LOST,
                                  reason=f"lost: {why}", backlog=record.backlog, now=now)
        if self.rt.store.mark_lost(seen.lane, raw or "", lost, task_id=seen.task_id,
                                   heavy=True):
            self._lost(seen.lane, seen.task_id, seen.fence, why)

    def _why(self, why: str, started: float | None) -> str:
        if self._put_back_at is not None and started is not None and started < self._put_back_at:
            # Beat cannot tell a run killed around the loss from one whose end was lost.
            return f"{why}; Redis lost state while it ran, so its end may have been lost too"
        return why

    def _lost(self, lane: str, task_id: str, fence: int, why: str) -> None:
        assert self.rt is not None
        logger.error("lane %s: run %s lost (%s, no end recorded; its worker died?)",
                     lane, task_id, why)
        self.rt.store.count(counter_field(CounterKind.LOST, lane))
        self.rt.store.log(self.rt.keys.journal, {
            "ev": "lost", "lane": lane, "task": task_id, "fence": fence, "t": time.time()})

    def _record_lost_runs(self, snap: Snapshot, states: dict[str, LaneState],
                          now: float) -> None:
        """Record as lost every run that started and whose lease (heavy) or in-flight mark
        (light, with one TTL of grace for clock skew) lapsed with no end recorded."""
        assert self.rt is not None and self.lanes is not None
        grace = self.settings.lease_ttl_s
        for lane, state in states.items():
            run = state.run
            spec = self._specs.get(lane)
            if not lifecycle.is_running(run) or spec is None:
                continue
            heavy = spec.heavy
            if heavy:
                if snap.lease is not None and snap.lease.task_id == run.running_task_id:
                    continue
            elif run.running_until is None or now < run.running_until + grace:
                continue
            raw = snap.raw.get(run_field(lane))
            if raw is None:  # remembered from an earlier tick: judge what is stored now
                try:
                    raw, stored = self.rt.store.read_run_raw(lane)
                except StateError:
                    continue
                if stored.running_task_id != run.running_task_id \
                        or not lifecycle.is_running(stored):
                    continue  # it changed since (ended, or a newer run's mark): not this run
                run = stored
            why = self._why("its lease lapsed" if heavy else "its in-flight mark lapsed",
                            run.running_since)
            if raw is not None and self.rt.store.mark_lost(
                    lane, raw, lifecycle.lost(run, now=now, why=why),
                    task_id=str(run.running_task_id), heavy=heavy):
                self._lost(lane, str(run.running_task_id), run.fence if heavy else 0, why)

    def _sync_families(self, now: float) -> None:
        """Call the families' ``members`` hooks, each at most every ``members_sync_s``, and
        make the stored members what the hook returned. A hook that raises is recorded."""
        assert self.rt is not None and self.lanes is not None
        for family, last in self._syncs.items():
            option = self.lanes.options[family]
            assert isinstance(option, LaneFamily) and option.members is not None
            if now - last < option.members_sync_s:
                continue
            self._syncs[family] = now
            try:
                wanted = list(option.members())
                added, removed = FamilyStore(self.rt.store.client, self.rt.keys).sync(
                    family, wanted)
            except Exception as exc:
                message = f"members hook of family {family!r} raised {type(exc).__name__}: {exc}"
                self._report(family, message[:1000], {}, exc_info=True)
                continue
            if added or removed:
                logger.info("family %s: %d members added, %d removed (members hook)",
                            family, added, removed)

    def _announce(self, now: float) -> None:
        """Say who the active beat is and which lanes it schedules, for `schedproj status`."""
        assert self.rt is not None and self.lanes is not None
        pipe = self.rt.store.client.pipeline(transaction=False)
        pipe.delete(self.rt.keys.beat_info)
        pipe.hset(self.rt.keys.beat_info, mapping={
            "token": self.token, "host": socket.gethostname(), "pid": str(os.getpid()),
            "since": repr(now)})
        pipe.set(self.rt.keys.published_lanes, registry_json(self.lanes, self.settings))
        pipe.execute()

    def _probe(self, snap: Snapshot) -> tuple[dict[str, int], set[str]]:
        """Call the lanes' due-check hooks; a hook that raises is recorded, the tick goes on."""
        assert self.rt is not None and self.lanes is not None
        unreadable = {lane for lane in snap.errors if self.lanes.knows(lane)}
        # Re-read every tick until readable: an operator who deletes or fixes the bad value
        # with redis-cli marks nothing changed.
        self._broken = unreadable
        previous, self._reported = self._reported, {}
        for lane, message in snap.errors.items():
            self._report(lane, message, previous)
        probes: dict[str, int] = {}
        for name, hook in self._hooks:
            if hook is None or name in unreadable:
                continue
            try:
                probes[name] = max(0, int(hook()))
            except Exception as exc:
                unreadable.add(name)
                message = f"due_check of lane {name!r} raised {type(exc).__name__}: {exc}"
                self._report(name, message[:1000], previous, exc_info=True)
        return probes, unreadable

    def _report(self, lane: str, message: str, previous: dict[str, str],
                exc_info: bool = False) -> None:
        """Log and record a scheduling error once per onset, not on every tick it persists
        (``previous``: last tick's errors; one that cleared and returns is reported again)."""
        assert self.rt is not None
        self._reported[lane] = message
        if previous.get(lane) == message:
            return
        logger.error("scheduling error: %s", message, exc_info=exc_info)
        self.rt.store.record_error(lane, message)

    def _dispatch(self, plan: Plan, snap: Snapshot) -> tuple[Plan, float | None]:
        """Grant, record (with the due index), send. Returns the plan carried out and the
        next look after now. Raises :class:`BeatLockLost` if this beat lost its lock on the
        way (nothing is sent then)."""
        assert self.rt is not None
        ttl = self.settings.beat_lock_ttl_s
        if time.time() - plan.now > ttl / 3 and not self.rt.store.renew(self.token, ttl):
            # A long tick (thousands of lanes newly due at once) outlived the lock.
            self.memory.reset()
            raise BeatLockLost("the tick outlived the beat lock before recording the dispatch")
        plan, grant_kwargs = self._grant(plan, snap.lock.fence)
        states = with_changes(plan.states, plan.changes)
        looks, waiting = self._looks(plan, states, snap)
        token = (grant_kwargs[LEASE_KWARG]["token"] if grant_kwargs
                 else snap.lease.token if snap.lease is not None else None)
        writes = self.memory.settle(looks, plan.now, token, waiting, states)
        if not self.rt.store.write_sched(self.token, plan.changes, writes):
            if grant_kwargs:
                self.rt.lease.release(grant_kwargs[LEASE_KWARG]["token"])
            self.memory.reset()
            raise BeatLockLost("beat lock lost before recording the dispatch")
        if self.settings.test_freeze_before_send_s and plan.sends:
            # Test hook (the chaos run's beat-freeze fault): stall between recording the
            # dispatch and publishing it, as a SIGSTOP or a long GC pause would.
            time.sleep(self.settings.test_freeze_before_send_s)
        self._log_deferrals(plan.new_deferrals, plan.decision)
        self.rt.store.count_many(Counter(counter_field(CounterKind.DEFERRALS, d.reason.value)
                                         for d in plan.new_deferrals))
        sent = []
        for lane, send in plan.sends.items():
            kwargs = (grant_kwargs if lane == plan.decision.winner
                      else light_kwargs(snap.lock.fence))
            if self._send(lane, send, kwargs):
                sent.append({"lane": lane, "task": send.task_id, "t": time.time(),
                             "beat": self.token[:8],
                             "fence": kwargs.get(LEASE_KWARG, {}).get("fence", 0)})
        self.rt.store.log_many(self.rt.keys.dispatch_log, sent)
        # A forced lane whose message did not leave keeps its request for the next tick.
        self.rt.store.done_forcing([e["lane"] for e in sent if e["lane"] in snap.forced])
        later = [look for look in looks.values() if look > plan.now]
        if snap.next_look is not None:
            later.append(snap.next_look)
        return plan, min(later, default=None)

    def _looks(self, plan: Plan, states: dict[str, LaneState],
               snap: Snapshot) -> tuple[dict[str, float], set[str]]:
        """Each planned lane's next look once the plan is carried out (``states``), and which
        of them are heavy lanes waiting for the lease (skipped while the same lease is
        held)."""
        looks: dict[str, float] = {}
        waiting: set[str] = set()
        memory, changed, read = self.memory, plan.changes, snap.states
        for lane, state in states.items():
            if lane not in changed and lane not in read and lane in memory.scores:
                # Due before, unchanged since: its next look is what the index holds.
                looks[lane] = memory.scores[lane]
                if lane in memory.waiting:
                    waiting.add(lane)
                continue
            spec = self._specs[lane]
            forced = lane in snap.forced and lane not in plan.sends
            looks[lane] = next_look(spec, state, plan.now, paused=lane in snap.paused,
                                    forced=forced, grace_s=self.settings.lease_ttl_s)
            if (spec.heavy and waits_for_lease(state) and lane not in plan.sends
                    and spec.family not in self._gating_families):
                waiting.add(lane)
        return looks, waiting

    def _publish_pressure(self, decision: Decision, snap: Snapshot, now: float, *,
                          states: Mapping[str, LaneState] | None = None,
                          partial: bool = False) -> None:
        """Publish the waiting heavy lane pressing on the lease (``core.pressure.measure``)
        for the holder, who reads it in its renewal reply. Written only when it changed: an
        unchanged tick costs no round trip. A beat that just took the lock, or Redis that lost
        state, writes it again whatever this beat last wrote. A ``partial`` tick skipped lanes
        waiting on the same hold: what it published for them stands unless a lane it did see
        outranks it."""
        assert self.rt is not None
        pressure = measure(decision, snap.states if states is None else states, snap.lease,
                           now,
                           legacy=self.settings.policy is Policy.REGISTRY)
        if partial and self._pressure is not None and not outranks(pressure,
                                                                    self._pressure[0], now):
            return
        if snap.lock.event != "renewed" or snap.epoch.cause:
            self._pressure = None
        if self._pressure is not None and not changed(self._pressure[0], pressure):
            return
        try:
            self.rt.store.client.hset(self.rt.keys.pressure, "current", encode_pressure(pressure))
        except redis.ResponseError as exc:
            # Garbage at the key (a string, a list): say so once and keep scheduling; the
            # holder's renewal reads no pressure from it meanwhile.
            if not self._pressure_failing:
                logger.error("cannot publish the pressure on the lease (%s); delete the key %s",
                             exc, self.rt.keys.pressure)
            self._pressure_failing = True
            return
        self._pressure, self._pressure_failing = (pressure,), False

    def _grant(self, plan: Plan, beat_fence: int) -> tuple[Plan, dict[str, Any]]:
        """Ask for the heavy lease for the plan's winner. Returns the plan to carry out (the
        winner dropped if the lease is held) and the grant to send with the winner's message;
        raises :class:`BeatLockLost` if this beat lost its lock."""
        assert self.rt is not None
        heavy = plan.heavy
        if heavy is None:
            return plan, {}
        token = uuid.uuid4().hex
        grant = self.rt.lease.acquire(heavy.lane, token, self.settings.start_deadline_s,
                                      plan.now, task_id=heavy.task_id, beat_token=self.token)
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
        return plan, heavy_kwargs(token, grant.fence, beat_fence)

    def _send(self, lane: str, send: Send, kwargs: dict[str, Any]) -> bool:
        """Send one lane's message; on failure undo its grant. True if it left."""
        assert self.rt is not None and self.lanes is not None
        spec = self._spec(lane)
        assert spec is not None
        member = split_member(lane) if spec.family is not None else None
        entry = LaneEntry(
            name=lane, task=spec.task_name, app=self.app,
            schedule=self.data[spec.family or lane].schedule,
            args=(member[1],) if member else (), kwargs=kwargs,
            # No Celery ``expires``: whether given absolute or in seconds, Celery turns it into
            # an absolute time on beat's clock that each worker judges on its own, so a worker
            # whose clock runs ahead would drop every message. A late message is refused by
            # Redis-side checks instead, on one clock: a heavy grant lapses at the start
            # deadline (its TTL on the server), and a light message starts only while it is its
            # lane's current dispatch, so none can run after beat has sent its replacement.
            # The AMQP ``expiration`` (relative; RabbitMQ enforces it on its own clock) still
            # drops a message nobody consumed before its deadline.
            options={"queue": queue_for(spec.kind), "task_id": send.task_id,
                     "expiration": max(0.0, send.deadline - time.time())},
        )
        # Through apply_entry, not apply_async: sentry-sdk's beat monitoring wraps
        # Scheduler.apply_entry to attach its Crons check-in headers.
        self.apply_entry(entry, producer=self.producer)
        if entry.send_error is None:
            return True
        # The message never left: undo the grant so nothing waits for it.
        logger.error("lane %s: send failed; lease released and lane left due", lane)
        grant = kwargs.get(LEASE_KWARG)
        if grant:
            self.rt.lease.release(grant["token"])
        self.rt.store.clear_inflight(self.token, lane)
        return False

    def _log_deferrals(self, news: tuple[Deferral, ...], decision: Decision) -> None:
        for d in news:
            logger.info("lane %s deferred: %s (blocker %s)", d.lane, d.reason.value, d.blocker)
        for lane, gate in decision.expired_gates:
            logger.warning("lane %s: gate on %s deferred it for over %ss; letting it run so the "
                           "chain cannot deadlock", lane, gate.blocker, gate.max_defer_s)
        if decision.dispatched:
            logger.info("dispatch: heavy=%s light=%s", decision.winner or "-",
                        ",".join(decision.also_dispatched) or "-")

    def _go_standby(self, why: str) -> None:
        if self.active:
            logger.critical("beat %s: STOPPED DISPATCHING: %s", self.token[:8], why)
        elif self._standby_said != why:
            # Once per reason, so a standby beat says what it waits for without a line a tick.
            logger.info("beat %s: standing by: %s; takes over within %gs (the beat lock TTL) "
                        "once the active beat stops", self.token[:8], why,
                        self.settings.beat_lock_ttl_s)
        self._standby_said = why
        self._started_lease = None  # another beat judges that run now
        self._estimated = {}  # and keeps the lanes' records
        self.active = False


__all__ = ["FairScheduler"]
