"""The beat lock kept through one long step of a tick, from a side thread, for as long as the
tick's work warrants.

Beat renews its lock between a tick's steps (``FairScheduler._keep_lock``) and at each page of
its read; a step is never split. One step over hundreds of thousands of lanes (decoding the
records of a million family members added at once, planning them, writing their records) runs
longer than the lock TTL: the lock lapsed inside it, the tick's guarded writes were refused,
and the next tick took the lock afresh and did it all again - a lone beat never finished, and
with a standby the beats took turns. The keeper renews the lock while a tick runs, but only
within an allowance the tick earned by the lanes it read or plans (:data:`PER_LANE_S` each):
a tick hung in a due-check hook or a user's ``members`` hook, having read a few lanes, keeps
nothing, so a standby takes over a lock TTL after it as before; a tick over a million lanes
keeps the lock for at most :data:`PER_LANE_S` x 1,000,000 = 250 s however long it hangs.

The renewal is ``lua/beat_renew.lua`` (the main thread's too): a token-guarded PEXPIRE that never
takes a vacant lock. A renewal that finds the lock gone or held by another stops the keeper;
the main thread learns it at its next step (:meth:`LockKeeper.lost`) and stands by or takes the
lock back as it would have found it itself. A frozen process (SIGSTOP, a long GC pause) freezes
this thread too: the lock lapses as it always did.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

logger = logging.getLogger("schedproj.beat")

#: The lock time a tick earns for each lane it read (seconds): about four times what a tick
#: of a million members added at once took a lane here (67 us), so a slow or shared machine
#: still finishes, while a hung tick lets go within this many seconds per lane read.
PER_LANE_S = 250e-6


class LockKeeper:
    """Renews the beat lock from a daemon thread while a tick that earned it runs.

    ``renew`` renews the lock and returns None, or who holds it ('' when no beat does). The
    main thread calls :meth:`begin` as a tick starts, :meth:`earn` once its read told how many
    lanes it brought, :meth:`end` when the tick ends (whatever way), and :meth:`renewed_at` /
    :meth:`lost` at its steps."""

    def __init__(self, renew: Callable[[], str | None], ttl_s: float) -> None:
        self._renew = renew
        self._ttl_s = ttl_s
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        # The keeper schedules on the monotonic clock: a wall clock stepped back during a long
        # step (an NTP step) would hold its renewals back by as much and let the lock lapse.
        # What it tells the main thread (renewed_at, kept_at) is on the wall clock, as beat's.
        #: The tick under way (a new number each tick; None: no tick), when it began and until
        #: when it may be kept (monotonic).
        self._tick: int | None = None
        self._ticks = 0
        self._began = 0.0
        self._until = 0.0
        #: The last renewal in this tick (monotonic), for the next one's time.
        self._renewed = 0.0
        self._renewed_at = 0.0
        #: The last renewal made in the tick (the keeper's or the main thread's; 0: none yet).
        self._kept_at = 0.0
        self._lost: str | None = None
        #: Not before this (monotonic; a renewal failed).
        self._retry_at = 0.0
        #: Renewals made (tests and the bench read it).
        self.renewals = 0

    def begin(self, renewed_at: float) -> None:
        """A tick begins; its read renews the lock at ``renewed_at`` (wall clock). Nothing is
        kept until the tick earns it."""
        with self._cond:
            self._ticks += 1
            self._tick = self._ticks
            self._began = self._until = self._renewed = _monotonic_of(renewed_at)
            self._renewed_at, self._lost, self._retry_at = renewed_at, None, 0.0
            self._kept_at = 0.0

    def earn(self, lanes: int) -> None:
        """The tick read, plans, or was handed by a ``members`` hook ``lanes`` lanes: keep its
        lock up to :data:`PER_LANE_S` a lane after it began (the most any of them earned).
        Starts the thread the first time (not before: a process that forks after making the
        scheduler keeps no thread that did not survive the fork)."""
        with self._cond:
            if self._tick is None:
                return
            self._until = max(self._until, self._began + PER_LANE_S * lanes)
            if self._until - self._began <= self._ttl_s / 3:
                return  # a renewal between the tick's steps comes sooner than this one
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="schedproj-lock-keeper",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def end(self) -> None:
        """The tick ended: nothing more is renewed for it."""
        with self._cond:
            self._tick = None
            self._cond.notify_all()

    def renewed_at(self) -> float:
        """When the lock was last renewed in this tick (by the keeper or by :meth:`begin`'s
        read), on the wall clock."""
        with self._cond:
            return self._renewed_at

    def kept_at(self) -> float:
        """When a renewal made in this tick (by the keeper or told by :meth:`renewed`) last
        renewed the lock; 0 when none did. Unlike :meth:`renewed_at`, never the tick's start,
        which is no renewal when the tick's read failed."""
        with self._cond:
            return self._kept_at

    def lost(self) -> str | None:
        """None while the keeper kept the lock (or had no need to); else who held it when a
        renewal failed: '' when no beat did."""
        with self._cond:
            return self._lost

    def renewed(self, at: float) -> None:
        """The main thread renewed the lock itself at ``at`` (wall clock)."""
        with self._cond:
            self._renewed_at = max(self._renewed_at, at)
            self._kept_at = max(self._kept_at, at)
            self._renewed = max(self._renewed, _monotonic_of(at))

    def _run(self) -> None:
        while True:
            with self._cond:
                due = self._next_renewal()
                while due is None or due > time.monotonic():
                    self._cond.wait(None if due is None else due - time.monotonic())
                    due = self._next_renewal()
                tick = self._tick
            # The lock is kept from when the renewal was asked (its PEXPIRE runs after this):
            # the time of the reply would count it held a round trip longer than it is.
            asked, asked_at = time.monotonic(), time.time()
            try:
                holder = self._renew()
            except Exception as exc:  # any exception let out ends the thread
                # The main thread meets the same Redis at its next call and says so: nothing
                # is decided here; the renewal is tried again shortly. Not only RedisError:
                # redis-py's cluster client says an unreachable cluster with
                # RedisClusterException, and any exception let out ended this thread silently,
                # leaving the step it kept to lose the lock.
                if isinstance(exc, redis.RedisError):
                    logger.debug("lock keeper: renewal failed (%s)", exc)
                else:
                    logger.warning("lock keeper: renewal failed (%r); tried again shortly", exc)
                with self._cond:
                    self._retry_at = time.monotonic() + self._ttl_s / 10
                continue
            with self._cond:
                if self._tick != tick:
                    continue  # the tick ended (or another began) while renewing
                if holder is None:
                    self._renewed = max(self._renewed, asked)
                    self._renewed_at = max(self._renewed_at, asked_at)
                    self._kept_at = max(self._kept_at, asked_at)
                    self.renewals += 1
                else:
                    self._lost, self._tick = holder, None

    def _next_renewal(self) -> float | None:
        """When the next renewal is due on the monotonic clock (a third of the TTL after the
        last, or shortly after a failed one), or None when there is none to make: no tick, the
        lock lost, or past what the tick earned."""
        if self._tick is None or self._lost is not None:
            return None
        due = max(self._renewed + self._ttl_s / 3, self._retry_at)
        return due if due <= self._until else None


def _monotonic_of(wall: float) -> float:
    """The monotonic time of a wall-clock time just past (``wall``, at most now)."""
    return time.monotonic() - max(0.0, time.time() - wall)


__all__ = ["PER_LANE_S", "LockKeeper"]
