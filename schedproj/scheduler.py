"""FairScheduler: a Celery Beat scheduler that ranks heavy lanes by staleness ratio.

``celery -A schedproj.app beat -S fair``. Each tick: take/renew the beat lock and load all
state (one Redis round trip) -> run the pure pipeline -> grant the heavy lease to the winner ->
record in-flight/deferral state (guarded by the beat lock) -> send the heavy winner to queue
``heavy`` and every due light lane to ``light`` through Celery's ``apply_entry`` -> block on
the wake list until a run finishes or the next lane falls due.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from celery.beat import ScheduleEntry, Scheduler
from celery.schedules import schedule as every

from schedproj import defaults, metrics
from schedproj.config import validate_or_exit
from schedproj.dispatch import Send, sched_changes
from schedproj.pipeline import Decision, decide, seconds_until_next_due
from schedproj.registry import LaneSet, queue_for, registry_json
from schedproj.runtime import Runtime, settings_for
from schedproj.sentry_setup import crons_exclusions, init_sentry
from schedproj.state import Deferral
from schedproj.store import Snapshot
from schedproj.task import LEASE_KWARG

logger = logging.getLogger("schedproj.beat")

#: How often a standby beat retries the lock (seconds); failover takes about the lock TTL.
STANDBY_POLL_S = 1.0
#: Pause after Redis could not be reached before the next attempt (seconds).
REDIS_RETRY_S = 1.0


class FairScheduler(Scheduler):  # type: ignore[misc]
    """Staleness-ratio fair scheduler with one heavy lease and same-tick light dispatch."""

    #: celery-redbeat, when merely installed, connects a global beat_init handler that reads
    #: ``scheduler.lock_key`` of whatever scheduler runs and logs an AttributeError when it is
    #: missing. None tells it there is nothing of its own to lock; our lock is in the tick.
    lock_key = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.lanes: LaneSet | None = None
        self.rt: Runtime | None = None
        self.token = uuid.uuid4().hex
        self.active = False
        self._send_failures: set[str] = set()
        self._reported: dict[str, str] = {}
        kwargs.pop("schedule_filename", None)
        super().__init__(*args, **kwargs)

    # -- Celery Scheduler interface ---------------------------------------------------------
    def setup_schedule(self) -> None:
        self.settings = settings_for(self.app)
        self.lanes = validate_or_exit(self.app, "beat")
        self.rt = Runtime.build(self.settings)
        # Sentry Crons only monitors whole-minute intervals: other lanes are left out of it.
        init_sentry(self.settings, "beat", exclude_beat_tasks=crons_exclusions(self.lanes.specs))
        metrics.serve(self.rt.store.client, self.rt.keys, self.settings, self.lanes.specs)
        self.max_interval = self.settings.beat_max_loop_interval_s
        self.data = {
            spec.name: ScheduleEntry(
                name=spec.name, task=spec.task_name, app=self.app,
                schedule=every(timedelta(seconds=spec.cadence_s)),
                options={"queue": queue_for(spec.kind)},
            )
            for spec in self.lanes.specs
        }
        self._declare_queues()
        if self.app.conf.beat_schedule:
            logger.warning("beat_schedule entries %s are not run by FairScheduler; declare "
                           "them as lanes (lane=Lane(...)) instead",
                           sorted(self.app.conf.beat_schedule))
        if not self.lanes.specs:
            logger.warning("no lanes declared: set SCHEDPROJ_LANE_MODULES to the modules that "
                           "declare them")
        logger.info("FairScheduler %s: %d lanes, policy %s, profile %s", self.token[:8],
                    len(self.lanes.specs), self.settings.policy.value,
                    self.settings.profile.value)

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
        except Exception:
            self._send_failures.add(entry.name)
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
        snap = self.rt.store.snapshot(self.token, s.beat_lock_ttl_s)
        if not snap.lock.held:
            self._go_standby(f"beat lock held by another beat ({str(snap.lock.holder)[:8]})")
            return min(STANDBY_POLL_S, s.beat_max_loop_interval_s)
        if snap.lock.event == "replaced-garbage":
            logger.warning("beat %s: the beat lock key held a value without a TTL (not written "
                           "by a beat); replaced it", self.token[:8])
        if not self.active:
            self.active = True
            logger.info("beat %s: active (beat lock %s, fence %d)", self.token[:8],
                        snap.lock.event, snap.lock.fence)
            self._announce(now)
        probes, unreadable = self._probe(snap)
        decision = decide(self.lanes.specs, snap.states, snap.lease, now, s.profile,
                          probes=probes, unreadable=unreadable, paused=snap.paused,
                          forced=snap.forced, policy=s.policy)
        if not self._dispatch(decision, snap, now):
            return 0.0
        wait = seconds_until_next_due(decision.views, snap.states, now)
        # Sleep until the next lane falls due by time, at most one loop interval (due-check
        # hooks and backlog are re-polled then); a finishing run wakes us earlier.
        interval = s.beat_max_loop_interval_s if wait is None else min(
            s.beat_max_loop_interval_s, wait)
        if not s.wake_on_release:
            return interval  # Celery's loop sleeps; only the next poll sees a finished run
        self.rt.store.wait_for_wake(interval)
        return 0.0

    def _announce(self, now: float) -> None:
        """Say who the active beat is and which lanes it schedules, for `schedproj status`."""
        assert self.rt is not None and self.lanes is not None
        pipe = self.rt.store.client.pipeline(transaction=False)
        pipe.delete(self.rt.keys.beat_info)
        pipe.hset(self.rt.keys.beat_info, mapping={
            "token": self.token, "host": socket.gethostname(), "pid": str(os.getpid()),
            "since": repr(now)})
        pipe.set(self.rt.keys.registry, registry_json(self.lanes, self.settings))
        pipe.execute()

    def _probe(self, snap: Snapshot) -> tuple[dict[str, int], set[str]]:
        """Call the lanes' due-check hooks; a hook that raises is recorded, the tick goes on."""
        assert self.rt is not None and self.lanes is not None
        unreadable = {lane for lane in snap.errors if lane in self.lanes.options}
        previous, self._reported = self._reported, {}
        for lane, message in snap.errors.items():
            self._report(lane, message, previous)
        probes: dict[str, int] = {}
        for spec in self.lanes.specs:
            hook = self.lanes.options[spec.name].due_check
            if hook is None or spec.name in unreadable:
                continue
            try:
                probes[spec.name] = max(0, int(hook()))
            except Exception as exc:
                unreadable.add(spec.name)
                message = f"due_check of lane {spec.name!r} raised {type(exc).__name__}: {exc}"
                self._report(spec.name, message[:1000], previous, exc_info=True)
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

    def _dispatch(self, decision: Decision, snap: Snapshot, now: float) -> bool:
        """Grant, record, send. False if this beat lost its lock on the way (stop at once)."""
        assert self.rt is not None and self.lanes is not None
        s = self.settings
        deadline = now + s.start_deadline_s
        sends = {lane: Send(lane, str(uuid.uuid4()), deadline) for lane in decision.dispatched}
        grant_kwargs: dict[str, Any] = {}
        lease_token = ""
        if decision.winner is not None:
            lease_token = uuid.uuid4().hex
            grant = self.rt.lease.acquire(decision.winner, lease_token, s.start_deadline_s, now,
                                          task_id=sends[decision.winner].task_id,
                                          beat_token=self.token)
            if grant.not_active_beat:
                self._go_standby("beat lock lost before granting the heavy lease")
                return False
            if not grant.granted:
                logger.info("heavy lease already held by %s; %s waits", grant.holder,
                            decision.winner)
                del sends[decision.winner]
                lease_token = ""
            else:
                grant_kwargs = {LEASE_KWARG: {"token": lease_token, "fence": grant.fence}}
        changes, news = sched_changes(decision, snap.states, sends, now)
        if not self.rt.store.write_sched(self.token, changes):
            if lease_token:
                self.rt.lease.release(lease_token)
            self._go_standby("beat lock lost before recording the dispatch")
            return False
        self._log_deferrals(news, decision)
        self.rt.store.count_many(Counter(f"deferrals|{d.reason.value}" for d in news))
        sent = []
        for lane, send in sends.items():
            kwargs = grant_kwargs if lane == decision.winner else {}
            if self._send(lane, send, kwargs, lease_token if lane == decision.winner else ""):
                sent.append({"lane": lane, "task": send.task_id, "t": time.time(),
                             "beat": self.token[:8],
                             "fence": kwargs.get(LEASE_KWARG, {}).get("fence", 0)})
        self.rt.store.log_many(self.rt.keys.dispatch_log, sent)
        # A forced lane whose message did not leave keeps its request for the next tick.
        self.rt.store.done_forcing([e["lane"] for e in sent if e["lane"] in snap.forced])
        return True

    def _send(self, lane: str, send: Send, kwargs: dict[str, Any], lease_token: str) -> bool:
        """Send one lane's message; on failure undo its grant. True if it left."""
        assert self.rt is not None and self.lanes is not None
        spec = self.lanes.spec(lane)
        entry = ScheduleEntry(
            name=lane, task=spec.task_name, app=self.app,
            schedule=self.data[lane].schedule, args=(), kwargs=kwargs,
            # Absolute, and the same instant beat stops counting the message as in flight: a
            # message can never run after beat has sent its replacement.
            options={"queue": queue_for(spec.kind), "task_id": send.task_id,
                     "expires": datetime.fromtimestamp(send.deadline, tz=UTC)},
        )
        self._send_failures.discard(lane)
        self.apply_entry(entry, producer=self.producer)
        if lane not in self._send_failures:
            return True
        # The message never left: undo the grant so nothing waits for it.
        logger.error("lane %s: send failed; lease released and lane left due", lane)
        if lease_token:
            self.rt.lease.release(lease_token)
        self.rt.store.clear_inflight(self.token, lane)
        return False

    def _log_deferrals(self, news: list[Deferral], decision: Decision) -> None:
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
        self.active = False


__all__ = ["FairScheduler"]
