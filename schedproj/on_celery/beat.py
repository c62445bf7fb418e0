"""FairScheduler: a Celery Beat scheduler that ranks heavy lanes by staleness ratio.

``celery -A schedproj.app beat -S fair``. Each tick: take/renew the beat lock and read what
changed (one Redis round trip) -> put back what a state loss took, record lost runs
(:mod:`.loss_recovery`) -> call the due-check hooks (:mod:`.due_checks`) -> plan the tick (the
pure planner, :mod:`schedproj.core.planner`) -> grant, record and send (:mod:`.dispatch`) ->
publish the pressure on the lease -> sync lane families (:mod:`.family_sync`) -> block on the
wake list until a run finishes or the next lane falls due. This module only composes those
steps; every decision is the core's.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import redis
from celery.beat import ScheduleEntry, Scheduler
from celery.schedules import schedule as every

from schedproj.core import defaults
from schedproj.core.collector import cyclic_gc_paused
from schedproj.core.dueindex import NEVER, TickMemory, full_holds, gated_back
from schedproj.core.entries import RECHECK_S
from schedproj.core.errors import BeatLockLost, BeatLockVanished
from schedproj.core.lanes import queue_for
from schedproj.core.laneset import LaneSet, registry_json
from schedproj.core.planner import Plan, TickInput, plan_tick
from schedproj.core.pools import DEFAULT_POOL
from schedproj.core.records import LaneState, LeaseView
from schedproj.on_celery.config import no_lanes_message, validate_or_exit, wait_for_redis
from schedproj.on_celery.dispatch import Dispatcher, LaneEntry, PressurePublisher
from schedproj.on_celery.due_checks import DueChecks, ErrorReporter
from schedproj.on_celery.entries import (
    BeatEntries,
    CodeEntries,
    EntrySend,
    beat_schedule_table,
    entry_crons_exclusions,
)
from schedproj.on_celery.family_sync import FamilySync
from schedproj.on_celery.key_health import KeyHealth, wrong_typed
from schedproj.on_celery.lock_keeper import LockKeeper
from schedproj.on_celery.loss_recovery import LossRecovery, say_state_loss
from schedproj.on_celery.pool_pressure import PoolPressure
from schedproj.on_celery.runtime import Runtime, settings_for
from schedproj.on_celery.tick_lanes import TickLanes
from schedproj.settings import Settings
from schedproj.store.entry_store import EntryStore
from schedproj.store.families import FamilyStore
from schedproj.store.lane_store import ReconcileCycle, Snapshot
from schedproj.store.lease import PoolSlots, holders, holders_moved
from schedproj.telemetry import metrics
from schedproj.telemetry.sentry import crons_exclusions, crons_schedule, init_sentry

logger = logging.getLogger("schedproj.beat")

#: How often a standby beat retries the lock (seconds); failover takes about the lock TTL.
STANDBY_POLL_S = 1.0
#: Pause after Redis could not be reached before the next attempt (seconds).
REDIS_RETRY_S = 1.0


@dataclass
class BeatEngine:
    """Everything a tick uses, made once in ``setup_schedule``."""

    rt: Runtime
    lanes: TickLanes
    memory: TickMemory
    checks: DueChecks
    recovery: LossRecovery
    families: FamilySync
    dispatcher: Dispatcher
    pressure: PressurePublisher
    health: KeyHealth
    entries: BeatEntries
    #: The slot leases of the pools beyond the default (empty: none declared).
    slots: PoolSlots
    pool_pressure: PoolPressure

    @classmethod
    def build(cls, rt: Runtime, lanes: LaneSet, scheduler: FairScheduler,
              code_entries: CodeEntries) -> BeatEngine:
        tick_lanes, memory = TickLanes(lanes), TickMemory()
        reporter = ErrorReporter(rt.store)
        slots = PoolSlots(rt.store.client, rt.keys, lanes.pools)
        return cls(
            rt=rt, lanes=tick_lanes, memory=memory,
            checks=DueChecks(tick_lanes.hooks, reporter, stamps=tick_lanes.stamps,
                             client=rt.store.client, prefix=rt.keys.prefix),
            recovery=LossRecovery(rt.store, rt.keys, tick_lanes, rt.settings.lease_ttl_s,
                                  slots),
            families=FamilySync(tick_lanes.synced_families,
                                FamilyStore(rt.store.client, rt.keys,
                                            compact_records=rt.store.compact_records),
                                reporter, earn=scheduler.keeper.earn),
            dispatcher=Dispatcher(rt, scheduler.token, memory, tick_lanes, scheduler.data,
                                  scheduler.send_entry,
                                  **scheduler.dispatch_seams(rt.settings)),
            pressure=PressurePublisher(rt, tick_lanes),
            health=KeyHealth(rt.store, rt.keys),
            entries=BeatEntries(scheduler.app, EntryStore(rt.store.client, rt.keys),
                                rt.keys, scheduler.token, scheduler.send_entry,
                                code_entries, max_look_s=RECHECK_S,
                                reserved=lanes.names),
            slots=slots,
            pool_pressure=PoolPressure(rt, tick_lanes))


def stall_before_send(seconds: float) -> Callable[[Plan], None]:
    """The chaos run's beat-freeze fault (``schedproj.chaos.scheduler``): stall between
    recording a dispatch and sending it, as a SIGSTOP or a long GC pause would."""
    def stall(plan: Plan) -> None:
        if plan.sends:
            time.sleep(seconds)
    return stall


class FairScheduler(Scheduler):  # type: ignore[misc]
    """Staleness-ratio fair scheduler with one heavy lease and same-tick light dispatch."""

    #: celery-redbeat, when merely installed, connects a global beat_init handler that reads
    #: ``scheduler.lock_key`` of whatever scheduler runs and logs an AttributeError when it is
    #: missing. None tells it there is nothing of its own to lock; our lock is in the tick.
    lock_key = None
    #: The reason this beat last said it stands by (said once per reason).
    _standby_said: str = ""
    #: The last Redis refusal logged (said once per onset, not every tick).
    _refusal_said: str = ""
    #: When this beat last rebuilt the derived keys (due index, changed set), or began a
    #: reconcile cycle of the due index.
    _reconciled_at: float = 0.0
    #: When this beat last took the lock (its record's ``since``, kept when published again).
    _active_since: float = 0.0
    #: The reconcile cycle under way (None: none; the next begins ``derived_reconcile_s``
    #: after the last began).
    _cycle: ReconcileCycle | None = None
    #: Made in ``setup_schedule`` (absent only on a lazy scheduler, which never ticks).
    engine: BeatEngine
    settings: Settings
    #: Keeps the lock through a step longer than its TTL, as far as the tick earned it.
    keeper: LockKeeper

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.token = uuid.uuid4().hex
        self.active = False
        #: The lanes read every tick this tick left out as quiet, each with when it falls due
        #: on what it was last planned on (``TickMemory.quiet_now``).
        self._quiet: dict[str, float] = {}
        #: When this beat last knew it held the lock: its last read holding it, or a later
        #: renewal in the same tick (a step between, or the lock keeper through one long
        #: step). No other beat can have run lanes since unless a lock TTL has passed, so what
        #: this beat remembers is still true (``_reread_all``).
        self._last_read_at = 0.0
        #: When this beat last saw another beat hold the lock, by its own clock and by the
        #: server's, and that beat's token (None: since it held the lock itself, or never).
        self._holder_seen: tuple[float, int, str] | None = None
        #: This beat stood by only because Redis was out of its reach, since it last read
        #: Redis holding the lock: no other beat took the lock meanwhile unless it vanished.
        self._cut_off = False
        kwargs.pop("schedule_filename", None)
        super().__init__(*args, **kwargs)

    @property
    def rt(self) -> Runtime:
        return self.engine.rt

    @property
    def memory(self) -> TickMemory:
        return self.engine.memory

    # -- Celery Scheduler interface ---------------------------------------------------------
    def setup_schedule(self) -> None:
        self.settings = s = settings_for(self.app)
        lanes = validate_or_exit(self.app, "beat")
        rt = Runtime.build(s)
        wait_for_redis(self.app, s, "beat")
        # Sentry Crons only monitors whole-minute intervals: other lanes are left out of it.
        code = beat_schedule_table(self.app)
        init_sentry(s, "beat", exclude_beat_tasks=[*crons_exclusions(lanes.specs),
                                                   *entry_crons_exclusions(code.schedules())])
        metrics.serve(rt.store.client, rt.keys, s, lanes.specs,
                      json.loads(registry_json(lanes, s))["families"])
        self.max_interval = s.beat_max_loop_interval_s
        self.keeper = LockKeeper(lambda: rt.store.renew_held(self.token, s.beat_lock_ttl_s),
                                 s.beat_lock_ttl_s)
        self.data = {
            spec.name: ScheduleEntry(
                name=spec.name, task=spec.task_name, app=self.app,
                # A cron calendar lane's own crontab and zone, so Sentry Crons expects its
                # check-ins at its fire times (a skipped one shows as missed there).
                schedule=crons_schedule(spec) or every(timedelta(seconds=spec.cadence_s)),
                options={"queue": queue_for(spec.kind, spec.pool)},
            )
            for spec in (*lanes.specs, *lanes.families.values())
        }
        self.engine = BeatEngine.build(rt, lanes, self, code)
        self._declare_queues()
        entries = self.engine.entries.names
        if not lanes.specs and not lanes.families and not entries:
            logger.warning("%s", no_lanes_message(self.app))
        logger.info("FairScheduler %s: %d lanes, %d schedule entries, policy %s, profile %s",
                    self.token[:8], len(lanes.specs), len(entries), s.policy.value,
                    s.profile.value)

    def dispatch_seams(self, settings: Settings) -> dict[str, Callable[[Plan], None]]:
        """Seams the dispatch path leaves open (tests and fault runs override this)."""
        return {}

    def send_entry(self, entry: LaneEntry | EntrySend) -> None:
        # Through apply_entry, not apply_async: sentry-sdk's beat monitoring wraps
        # Scheduler.apply_entry to attach its Crons check-in headers.
        self.apply_entry(entry, producer=self.producer)

    def _declare_queues(self) -> None:
        """Declare the lane queues (heavy, light, one per pool) before the first send: beat's
        producer does not auto-declare, and on Redis a message sent to a queue nobody
        declared yet is silently dropped."""
        pools = sorted(set(self.engine.slots.pools) - {defaults.HEAVY_QUEUE})
        with self.app.connection_for_write() as conn:
            channel = conn.default_channel
            for name in (defaults.HEAVY_QUEUE, defaults.LIGHT_QUEUE, *pools):
                queue = self.app.amqp.queues[name]
                queue.bind(channel).declare()

    def tick(self, *args: Any, **kwargs: Any) -> float:
        # No cyclic collection inside a tick: one that ranks 10,000 due lanes makes a few
        # hundred thousand short-lived objects, and the collections they set off walked the
        # due lanes' kept states over and over for nothing (core.collector).
        with cyclic_gc_paused():
            return self._tick_or_standby()

    def _tick_or_standby(self) -> float:
        # The read renews the lock after this; the keeper keeps it no further until the tick
        # earned it (``_snapshot``), and nothing after the tick.
        self.keeper.begin(time.time())
        try:
            return self._tick()
        except BeatLockVanished as exc:
            # As for a lock vanished between two pages of the read (_vanished_mid_read).
            # Held until the last renewal of this tick (the keeper's, inside a long step):
            # what this beat remembers is put back if it takes the lock within a TTL of it.
            self._held(self.keeper.kept_at())
            logger.warning("beat %s: %s; taking it back at the next tick", self.token[:8], exc)
            return min(STANDBY_POLL_S, self.settings.beat_max_loop_interval_s)
        except BeatLockLost as exc:
            # Lost between reading and writing (another beat took over): stop at once; the
            # next tick finds the lock held elsewhere and stands by.
            self._go_standby(str(exc))
            return 0.0
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if self.active:  # held until this tick's last renewal, as above
                self._held(self.keeper.kept_at())
            self._go_standby(f"Redis unreachable ({exc})", cut_off=True)
            return REDIS_RETRY_S
        except redis.ResponseError as exc:
            # A write refused (a key of the wrong type or garbage where a number belongs; the
            # reads name the key themselves): say so once per onset and keep running (no crash
            # loop); the operator fixes or deletes the key. The tick's read may have
            # consumed change marks of resting lanes before the refusal: they are read again.
            self.engine.memory.wake_resting()
            self._say_refused(exc)
            return REDIS_RETRY_S
        finally:
            self.keeper.end()

    def _say_refused(self, exc: redis.ResponseError) -> None:
        """Name the key Redis's error does not: those holding the wrong type, with the fix;
        once per onset (the same bad keys, or the same error when none is found)."""
        try:
            bad = wrong_typed(self.rt.store.client, self.rt.keys)
        except redis.RedisError:
            bad = {}
        onset = repr(sorted(bad)) if bad else str(exc)
        if onset == self._refusal_said:
            return
        self._refusal_said = onset
        named = ", ".join(f"{key} (must be a {kind})" for key, kind in sorted(bad.items()))
        fix = (f"delete it: `redis-cli DEL {' '.join(sorted(bad))}`" if bad else
               "inspect the keys with `schedproj status` and delete the bad one")
        logger.error("scheduling error: Redis refused a command (%s); %s under prefix %r holds "
                     "a value of the wrong type — %s", exc, named or "a schedproj key",
                     self.settings.key_prefix, fix)

    def apply_async(self, entry: ScheduleEntry, producer: Any = None, advance: bool = False,
                    **kwargs: Any) -> Any:
        try:
            return super().apply_async(entry, producer=producer, advance=False, **kwargs)
        except Exception as exc:
            if isinstance(entry, (LaneEntry, EntrySend)):
                entry.send_error = exc
            raise

    def sync(self) -> None:
        """State is written to Redis as it changes; nothing to flush."""

    def close(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None and self.active:
            try:
                engine.rt.store.unlock(self.token)
                logger.info("beat %s: released the beat lock", self.token[:8])
            except redis.RedisError:
                logger.warning("beat %s: could not release the beat lock; it expires on its "
                               "own", self.token[:8])
        self.active = False

    @property
    def info(self) -> str:
        engine = getattr(self, "engine", None)
        if engine is None:
            return ""
        return (f"    . lanes -> {', '.join(engine.lanes.lanes.names) or '(none)'}\n"
                f"    . schedule entries -> {len(engine.entries.names)}")

    # -- one tick -----------------------------------------------------------------------------
    def _tick(self) -> float:
        e, s = self.engine, self.settings
        now = time.time()
        snap = self._read(now)
        if snap is None:
            return min(STANDBY_POLL_S, s.beat_max_loop_interval_s)
        # The read renewed the lock (each page does) after ``now``; a long tick renews it
        # again at each step below that began more than a third of the TTL after the last.
        held = self._keep_lock(now)
        snap = self._heal(snap, now)
        held = self._keep_lock(held)
        # Every hook is called when a lane record changed (a run started or ended: its writes
        # are seen then even by a writer that does not set a stamp); on an idle tick a stamped
        # hook is called only when its stamp moved (DueChecks).
        probes, unreadable = e.checks.probe(snap.errors, e.lanes.lanes.knows,
                                            fresh=bool(snap.changed), stamps=snap.got)
        self._learn(snap, unreadable, now)
        held = self._keep_lock(held)
        states, slots = self._focus(snap, probes, unreadable, now)
        # The lanes planned, not only those read: a million due members held in memory are
        # planned again when the lease changes hands, in a tick that read a few lanes.
        self.keeper.earn(len(states))
        held = self._keep_lock(held)
        if snap.epoch.quarantine_left_s == 0:  # records lost in a state loss can't be judged
            # Before dispatching: a new run of the lane, started within milliseconds of its
            # message, would replace the dead run's mark before this could record it.
            e.recovery.record_lapsed_runs(snap, states, now, slots)
        plan: Plan | None = None
        if self._nothing_to_plan(snap, states, now):
            # The idle tick: what planning would leave, without planning. The cursor and the
            # lease seen move on as after an empty plan (nothing to write, nothing to send).
            e.memory.settle({}, now, snap.lease.token if snap.lease is not None else None,
                            (), {}, holds=full_holds(slots))
            next_look = snap.next_look
        else:
            slots = slots if states or e.memory.waits_in_pools else self._read_slots(True)
            plan, next_look = self._plan(snap, states, slots, probes, unreadable, now)
            # (The dispatch renewed the lock, if it was due, before its guarded writes.)
            held = self._keep_lock(held)
        # A lane left out as quiet is looked at when it falls due on what it was planned on.
        next_look = min((t for t in (next_look, *self._quiet.values())
                         if t is not None and t < NEVER), default=None)
        # The app's schedule entries, in the same tick as the light lanes: never behind heavy.
        entries_look = e.entries.tick(now, snap.entries_changed)
        if entries_look is not None:
            next_look = entries_look if next_look is None else min(next_look, entries_look)
        if plan is not None:
            self._publish_pressure(plan, snap, slots, now=now)
        e.families.sync(now)
        e.lanes.keep_only(e.memory.states)
        # Left to lapse before the next tick, the lock would be taken afresh there (every
        # lane read again) or by a standby beat.
        self._keep_lock(held)
        interval = self._wait(plan, next_look, now, come_back=e.entries.work_left)
        self._refusal_said = ""
        return interval

    def _learn(self, snap: Snapshot, unreadable: set[str], now: float) -> None:
        """What the read tells beat's memory: the lanes unreadable this tick, the records and
        scores read, the estimates a run has replaced, a heavy run whose lease vanished."""
        e = self.engine
        # Re-read every tick until readable: an operator who deletes or fixes the bad value
        # with redis-cli marks nothing changed.
        e.lanes.broken = unreadable
        for lane in e.memory.learn(snap.states, snap.scores, snap.errors):
            e.lanes.specs.pop(lane, None)
        if e.recovery.estimated:
            e.recovery.forget_estimates(snap.states)
        if snap.epoch.quarantine_left_s == 0:  # a run lost in a state loss may re-assert
            # Before this tick dispatches: a new run of the lane must not end first.
            e.recovery.record_vanished_run(snap, now)

    def _plan(self, snap: Snapshot, states: dict[str, LaneState],
              slots: dict[str, list[LeaseView | None]], probes: dict[str, int],
              unreadable: set[str], now: float) -> tuple[Plan, float | None]:
        """Plan the lanes in ``states`` and carry the plan out; remember which lanes read
        every tick it left with nothing to do (``TickMemory.hush``). Returns the plan carried
        out and the next look after now."""
        e, s = self.engine, self.settings
        plan = plan_tick(
            [e.lanes.specs[lane] for lane in states],
            TickInput(states=states, lease=snap.lease, paused=snap.paused,
                      forced=snap.forced, unreadable=unreadable, probes=probes,
                      quarantined=snap.epoch.quarantine_left_s > 0,
                      holds_moved=snap.holds_moved or self._slots_moved(snap, slots),
                      inflight_grace_s=s.lease_ttl_s,
                      pools=e.lanes.lanes.pools if e.slots else None,
                      holders=holders(slots)),
            now, profile=s.profile, policy=s.policy, start_deadline_s=s.start_deadline_s,
            task_id=lambda lane: str(uuid.uuid4()))
        plan, next_look = e.dispatcher.dispatch(plan, snap, slots)
        e.memory.hush(plan, e.lanes.always, probes, snap.lease, s.lease_ttl_s)
        return plan, next_look

    def _focus(self, snap: Snapshot, probes: dict[str, int], unreadable: set[str],
               now: float) -> tuple[dict[str, LaneState], dict[str, list[LeaseView | None]]]:
        """The lanes to plan (``TickMemory.focus``) with their states, and the slot leases.
        The slots are read first when a lane waits for a pool's slots: whether its waiters
        are skipped depends on them. The lanes read every tick are left out while quiet
        (``TickMemory.quiet_now``: the REM chain's due-check lanes on an idle tick), unless
        a gate of a lane planned names them."""
        e = self.engine
        first = e.memory.waits_in_pools
        slots = self._read_slots(needed=first)
        pressing = e.pool_pressure.pressing()
        quiet = e.memory.quiet_now(e.lanes.always, snap.states, probes, snap.lease, now,
                                   planned=(snap.changed, snap.paused, snap.forced, unreadable))
        # The lanes read every tick are in ``looked`` too: left out there as well.
        focus, _ = e.memory.focus((lane for lane in snap.looked
                                   if lane in snap.states and lane not in quiet),
                                  snap.lease, [lane for lane in e.lanes.always
                                               if lane not in quiet],
                                  slots if first else None,
                                  replan={pressing[lane] for lane in snap.looked
                                          if lane in pressing})
        # (One focus takes in anyway, due in memory or holding the lease, is planned.)
        self._quiet = {lane: until for lane, until in quiet.items() if lane not in focus}
        gated_back(focus, self._quiet, e.lanes.spec)
        for lane in self._quiet:
            if lane not in e.memory.due:  # as planning it would leave it: not due, forgotten
                e.memory.forget(lane)
        states = {lane: st for lane in focus
                  if (st := e.memory.states.get(lane)) is not None and e.lanes.spec(lane)}
        if not first:
            slots = self._read_slots(needed=bool(states))
        return states, slots

    def _read_slots(self, needed: bool) -> dict[str, list[LeaseView | None]]:
        """Each pool's slot leases (none when no pool beyond the default is declared, or not
        ``needed``), read after the lane records: a run ending in between reads as running on
        a free slot, and its record changed, so nothing is marked lost - and nothing granted
        (:meth:`_slots_moved`). A tick with no lane in focus needs them only if it plans (no
        lapsed slot run to judge otherwise): the idle tick stays one round trip with pools
        declared."""
        return self.engine.slots.read() if needed and self.engine.slots else {}

    def _slots_moved(self, snap: Snapshot,
                     slots: dict[str, list[LeaseView | None]]) -> bool:
        """Did a pool's slot change hands between the tick's read and the read of the slots
        (``slots``, this tick's)? A run that ended in between reads as in flight (its record)
        on a free slot: its lane looks due and not running. The read got the slots just
        before it, in its round trip (``Snapshot.watched``)."""
        return bool(slots) and holders_moved(snap.watched, self.engine.slots.last_read)

    def _publish_pressure(self, plan: Plan, snap: Snapshot,
                          slots: dict[str, list[LeaseView | None]], *, now: float) -> None:
        """The pressure on the heavy lease, and on each pool's longest holder; each measured
        knowing whether this tick skipped its waiters (``TickMemory.skipped``)."""
        e = self.engine
        skipped = e.memory.skipped
        e.pressure.publish(plan.decision, snap, now, states=plan.states,
                           partial=DEFAULT_POOL in skipped, granted=e.dispatcher.granted)
        if slots:
            e.pool_pressure.publish(plan.decision, slots, e.dispatcher.granted_slots,
                                    plan.states, now, fresh=snap.lock.event != "renewed"
                                    or bool(snap.epoch.cause), partial=skipped.keys())

    def _nothing_to_plan(self, snap: Snapshot, states: dict[str, Any], now: float) -> bool:
        """Would planning this tick decide, write, send and publish nothing? True when the
        planner would see no lane (none due, read as changed, forced or held in memory: an
        empty plan, whatever else was read), the dispatch would not renew the lock first (a
        tick younger than a third of its TTL), and the pressure would not be written (the
        last one published says none waits, the lock was renewed, no state was lost). The
        idle tick is then the read alone: planning an empty tick was a third of its cost."""
        return (not states and snap.lock.event == "renewed" and not snap.epoch.cause
                and self.engine.pressure.published == (None,)
                and time.time() - now <= self.settings.beat_lock_ttl_s / 3)

    def _read(self, now: float) -> Snapshot | None:
        """Read what changed (a beat that just took the lock builds its memory from Redis
        first); None when this beat stands by."""
        # A beat new to the lock reads every lane afresh below (``_reread_all``): what this
        # read holds is not decoded, only the lock, the epoch and the broken keys it tells.
        snap = self._snapshot(now, cursor=self.memory.cursor, records=self.active)
        say_state_loss(snap)
        if snap.lock.event == "held":
            self._holder_seen = (now, snap.epoch.server_now_ms, str(snap.lock.holder))
        elif snap.lock.held:
            self._holder_seen = None  # its own lock: never left to another
        if snap.lock.event == "bad-fence":
            self.memory.reset()
            self.engine.health.report(snap.broken)
            self._go_standby(f"the beat fence {self.rt.keys.beat_fence} is not a sane integer "
                             "(see the error above)")
            return None
        if snap.lock.event == "vanished":
            self._vanished_mid_read()
            return None
        if not snap.lock.held:
            self.memory.reset()
            self._go_standby(self._standby_reason(snap))
            return None
        if snap.lock.event == "replaced-garbage":
            logger.warning("beat %s: the beat lock key held a value without a TTL (not written "
                           "by a beat); replaced it", self.token[:8])
        if not self.active or snap.lock.event != "renewed" or snap.epoch.cause:
            snap = self._reread_all(snap, now)
            if not snap.lock.held:
                return None
        self._last_read_at = now
        if not self.active:
            self._activate(snap, now)
        return snap

    def _keep_lock(self, renewed_at: float) -> float:
        """Renew the beat lock when it was last renewed (at ``renewed_at`` or later) more
        than a third of its TTL ago; returns when it was last renewed. A tick that reads and
        plans tens of thousands of lanes at once (a family's members added together, the
        derived keys rebuilt) outlasts the TTL: the lock lapsed in it, its guarded writes
        were refused, and the next tick - or a standby beat - took the lock afresh and read
        and planned every lane again, never sure to finish. A single step longer than the
        TTL is kept by the lock keeper (:mod:`.lock_keeper`), whose renewals and losses count
        here. A renewal never takes a vacant lock (``lua/beat_renew.lua``). Raises
        :class:`BeatLockLost` when another beat holds it (this one stands by),
        :class:`BeatLockVanished` when no beat does (as for a lock vanished mid-read, this
        beat keeps what it remembers and its next tick's lock step takes it back)."""
        ttl = self.settings.beat_lock_ttl_s
        asked = time.time()
        # The keeper renewed it during the last step, or found it lost there.
        holder = self.keeper.lost()
        renewed_at = max(renewed_at, self.keeper.renewed_at())
        if holder is None:
            if asked - renewed_at <= ttl / 3:
                return self._held(renewed_at)
            holder = self.rt.store.renew_held(self.token, ttl)
        if holder is None:
            self.keeper.renewed(asked)
            return self._held(asked)
        if holder:
            self.memory.reset()
            raise BeatLockLost(f"beat lock taken by another beat ({holder[:8]}) during a long "
                               "tick")
        raise BeatLockVanished(f"the beat lock vanished during a long tick "
                               f"({asked - renewed_at:.1f}s since it was renewed; Redis lost "
                               "its state, or it expired)")

    def _held(self, at: float) -> float:
        """This beat held its lock at ``at`` (returned). A tick that kept its lock for
        longer than a TTL (a million members planned) ended more than a TTL after its read:
        judged by the read alone, a state loss found just after it - or by the keeper inside
        it - counted this beat as away past its lock, and what it remembers was not put back
        (every lane's run record lost, each read as never run)."""
        self._last_read_at = max(self._last_read_at, at)
        return at

    def _vanished_mid_read(self) -> None:
        """The lock vanished between two pages of this beat's read: Redis lost its state
        (a restart, a failover), and no other beat had taken the lock. No lock taken by
        another, so this beat does not stand by: it keeps what it remembers and stays the
        beat that was active, so its next tick takes the vacant lock as current and puts back
        what Redis lost (``_reread_all``), as a loss seen by one call is. Standbys that saw it
        hold the lock leave the vacant lock to it meanwhile (``lua/tick.lua``). Nothing is
        planned on the part read."""
        logger.warning("beat %s: the beat lock vanished during the tick's read (Redis lost "
                       "its state?); taking it back at the next tick", self.token[:8])

    def _snapshot(self, now: float, cursor: float | None, records: bool = True) -> Snapshot:
        """The tick's read. The lanes read every tick are left out while they rest
        (``TickMemory.resting``: quiet, on the record they were planned on), and that record
        stands for the one they would read: every writer but a hand edit marks a record it
        changes changed, and the read brings the lanes marked. A hand edit of a resting
        lane's record (redis-cli) is seen when the periodic reconcile marks the lane
        changed, as any other lane's is; re-reading the four REM lanes every tick was a
        third of the idle tick. A full read (``cursor`` None: the lock taken, state lost)
        reads them all."""
        s, e = self.settings, self.engine
        resting = e.memory.resting(now) if cursor is not None else {}
        always = [lane for lane in e.lanes.reread()
                  if lane not in resting or lane in e.lanes.broken]
        # The due checks' stamps ride with the read: the idle tick is one round trip.
        snap = e.rt.store.tick_snapshot(self.token, s.beat_lock_ttl_s, s.quarantine_s,
                                        cursor=cursor, now=now, always=always,
                                        holder_seen_ms=self._holder_seen_ms(now),
                                        also_get=e.checks.keys,
                                        watch=e.slots.lease_keys if e.slots else (),
                                        records=records, on_read=self.keeper.earn)
        kept = {lane: state for lane, state in resting.items()
                if lane not in snap.states and lane not in snap.errors}
        return replace(snap, states={**kept, **snap.states}) if kept and snap.lock.held else snap

    def _holder_seen_ms(self, now: float) -> int:
        """The server time this beat last saw another beat hold the lock, while that is less
        than a lock TTL ago by this beat's clock; else 0. A vacant lock found after a state
        loss since then vanished with the state, and is left to that beat (``lua/tick.lua``):
        it remembers what Redis lost and puts it back (``_reread_all``) on its next tick. The
        TTL bounds the wait when it does not come back; a beat that never saw a holder (a new
        deployment, every beat restarted) takes a vacant lock at once."""
        seen = self._holder_seen
        if seen is None or now - seen[0] >= self.settings.beat_lock_ttl_s:
            return 0
        return seen[1]

    def _standby_reason(self, snap: Snapshot) -> str:
        if snap.lock.event != "deferred-after-loss" or self._holder_seen is None:
            return f"beat lock held by another beat ({str(snap.lock.holder)[:8]})"
        return (f"Redis lost its state and the beat lock with it; the lock is left to beat "
                f"{self._holder_seen[2][:8]}, which held it and remembers what Redis lost, "
                f"until one lock TTL after this beat last saw it hold the lock (then this beat "
                f"takes it, and what Redis lost counts from now)")

    def _reread_all(self, snap: Snapshot, now: float) -> Snapshot:
        """New to the lock, or Redis lost state: what this beat remembers may be stale. Index
        the declared lanes (a deployment from before the index, lanes declared since, an index
        lost with the state) and read every due lane. Put back only what this beat knew a
        moment ago: a beat frozen past its lock (another may have run lanes since) remembers a
        past that is no longer true."""
        e = self.engine
        fresh = now - self._last_read_at <= self.settings.beat_lock_ttl_s
        # No other beat can have been active since: this one held the lock a moment ago (or
        # stood by only while Redis was out of its reach, as a restart does to every client).
        current = (self.active or self._cut_off) and fresh
        lost = current and (snap.epoch.cause != "" or (
            snap.lock.event != "renewed" and snap.epoch.quarantine_left_s > 0))
        remembered = {lane: st.run for lane, st in e.memory.states.items()}
        e.checks.forget()  # a state loss may have taken a stamp; another beat may have run
        e.health.healed({key: problem for key, problem in snap.broken.items()
                         if problem == "wrong-type"})
        # Index the declared lanes and stamp the derived keys (a new deployment, lanes declared
        # since, an index lost or damaged while no beat ran); scores already there are kept.
        e.rt.store.heal_derived(self.token, e.lanes.lanes.names, rescore=False)
        self._reconciled_at = now
        if lost:
            e.recovery.put_back(remembered, now)
        e.entries.take_over(now, put_back=lost, current=current)
        snap = self._snapshot(now, cursor=None)
        if snap.lock.event == "vanished":
            # Redis lost its state again during this read (by pages: the longest a beat
            # makes): what this beat remembers is kept for its next take-over to put back.
            self._vanished_mid_read()
            return snap
        e.memory.reset()  # rebuilt from the full read
        # The full read left its tables as garbage in Redis's Lua heap; collected now, once,
        # rather than a step at a time on every later script call (the idle tick's included).
        collected = e.rt.store.collect_script_garbage()
        if collected is not None:
            logger.debug("beat %s: Redis's Lua heap %.0f KiB -> %.0f KiB after the full read",
                         self.token[:8], *collected)
        return snap

    def _heal(self, snap: Snapshot, now: float) -> Snapshot:
        """Rebuild the derived keys when this tick found one broken, and read every lane
        afresh; else go on with the reconcile cycle (:meth:`_reconcile`); report broken
        operator keys."""
        e = self.engine
        derived = e.health.derived(snap.broken)
        if derived:
            e.health.healed(snap.broken)
            e.memory.reset()
            e.rt.store.heal_derived(self.token, e.lanes.lanes.names, rescore=True)
            # The entries' derived keys too (their index, listing, and a changed mark the
            # heal of the changed set dropped), at the entries' step of this tick.
            e.entries.reconcile()
            # Every lane was rescored: a cycle under way has nothing left to find.
            self._reconciled_at, self._cycle = now, None
            healed = self._snapshot(now, cursor=None)
            e.health.report({**healed.broken, **{k: snap.broken[k] for k in derived}})
            return healed
        self._reconcile(now)
        e.health.report(snap.broken)
        return snap

    def _reconcile(self, now: float) -> None:
        """Re-check every lane's place in the due index, a slice a tick: a cycle begins at
        least ``derived_reconcile_s`` after the last began, once it has ended; each tick of it
        marks the next ``reconcile_slice`` lanes changed (missing ones put back in the index),
        so the next tick reads them and writes their next look afresh. Rescoring every lane
        at once made each reconcile a start-up-sized tick (every lane read and planned)."""
        e, s = self.engine, self.settings
        if self._cycle is None:
            if now - self._reconciled_at < s.derived_reconcile_s:
                return
            self._reconciled_at = now
            self._cycle = e.rt.store.reconcile_cycle()
            # The entries' derived keys on the same period (their pass goes a page a tick).
            e.entries.reconcile()
            self._announce_again()
        if not e.rt.store.reconcile_slice(self.token, e.lanes.lanes.names, self._cycle,
                                          s.reconcile_slice):
            raise BeatLockLost("the beat lock was lost during the reconcile")
        if self._cycle.done:
            self._cycle = None

    def _activate(self, snap: Snapshot, now: float) -> None:
        self.active, self._cut_off = True, False
        self.engine.checks.taking_over()
        logger.info("beat %s: active (beat lock %s, fence %d)", self.token[:8],
                    snap.lock.event, snap.lock.fence)
        # For the audit: from now on, messages under an older beat fence must run nothing.
        self.engine.dispatcher.audit([{
            "ev": "lock", "beat": self.token[:8], "fence": snap.lock.fence, "t": time.time()}])
        self._announce(now)

    def _wait(self, plan: Plan | None, next_look: float | None, now: float, *,
              come_back: bool = False) -> float:
        """Sleep until the next lane needs a look (or a run finishes and wakes beat); ``plan``
        None is the idle tick's (no lane falls due by time, nothing sent). ``come_back``: the
        entries left work for the next tick (a take-over's pass, due entries past the tick's
        budget), which comes at once: the idle floor was 0.1 s of every such tick's 0.6 s."""
        s = self.settings
        interval = (plan.sleep_s(s.beat_max_loop_interval_s) if plan is not None
                    else s.beat_max_loop_interval_s)
        if next_look is not None:
            interval = min(interval, max(0.0, next_look - now))
        if (plan is None or not plan.sends) and not come_back:
            # A tick that sent nothing never comes straight back (garbage that reads as "due
            # now" would spin beat): a floor, capped by the loop interval.
            interval = max(interval, min(defaults.BEAT_IDLE_SLEEP_FLOOR_S,
                                         s.beat_max_loop_interval_s))
        if not s.wake_on_release:
            return interval  # Celery's loop sleeps; only the next poll sees a finished run
        self.rt.store.wait_for_wake(interval)
        return 0.0

    def _announce_again(self) -> None:
        """Publish the lane registry and the active beat's record again if either is gone
        (deleted by hand; written only on taking the lock): without the registry status and
        the watchdog know no lanes, so the posture reads unknown, an alarm firing is cleared
        and no stall can fire one, while beat dispatches on; without the record status names
        no active beat. Checked once a reconcile cycle, with the time this beat took over."""
        rt = self.rt
        pipe = rt.store.client.pipeline(transaction=False)
        pipe.exists(rt.keys.published_lanes)
        pipe.exists(rt.keys.beat_info)
        gone = [key for key, there in zip((rt.keys.published_lanes, rt.keys.beat_info),
                                          pipe.execute(), strict=True) if not there]
        if gone:
            logger.warning("beat %s: %s gone (deleted?): published again, so status and the "
                           "watchdog see the lanes and the active beat", self.token[:8],
                           " and ".join(gone))
            self._announce(self._active_since)

    def _announce(self, now: float) -> None:
        """Say who the active beat is and which lanes it schedules, for `schedproj status`."""
        self._active_since = now
        rt = self.rt
        pipe = rt.store.client.pipeline(transaction=False)
        pipe.delete(rt.keys.beat_info)
        pipe.hset(rt.keys.beat_info, mapping={
            "token": self.token, "host": socket.gethostname(), "pid": str(os.getpid()),
            "since": repr(now)})
        pipe.set(rt.keys.published_lanes, registry_json(self.engine.lanes.lanes, self.settings))
        pipe.execute()

    def _go_standby(self, why: str, *, cut_off: bool = False) -> None:
        if self.active:
            logger.critical("beat %s: STOPPED DISPATCHING: %s", self.token[:8], why)
        elif self._standby_said != why:
            # Once per reason, so a standby beat says what it waits for without a line a tick.
            logger.info("beat %s: standing by: %s; takes over within %gs (the beat lock TTL) "
                        "once the active beat stops", self.token[:8], why,
                        self.settings.beat_lock_ttl_s)
        self._standby_said = why
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.recovery.stand_by()  # another beat judges runs and keeps records now
        self._cut_off = cut_off and (self.active or self._cut_off)
        self.active = False


__all__ = ["BeatEngine", "FairScheduler"]
