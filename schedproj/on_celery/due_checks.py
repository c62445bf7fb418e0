"""Beat's scheduling errors, and the lanes' due-check hooks that can raise them.

An error is logged and recorded (``<prefix>:errors``, a counter) once per onset, not on every
tick it persists. A due-check or ``members`` hook that succeeds again clears the error it
recorded, so status, posture and the watchdog recover on their own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import redis

from schedproj.core.lanes import DueAnswer, DueCheck, DueCheckStamp
from schedproj.store.lane_store import LaneStore

logger = logging.getLogger("schedproj.beat")


class ErrorReporter:
    """Reports scheduling errors once per onset and clears them when they go."""

    def __init__(self, store: LaneStore) -> None:
        self.store = store
        #: This tick's errors, and last tick's (one that cleared and returns is reported again).
        self.reported: dict[str, str] = {}
        self.previous: dict[str, str] = {}
        #: Lanes whose error may be in Redis: those this beat recorded, and on taking the lock
        #: those another beat may have left (cleared once, by the next success).
        self.maybe_recorded: set[str] = set()
        #: Redis refused the last write of an error or its clearing (said once per onset).
        self.refusing = False

    def new_tick(self) -> None:
        self.previous, self.reported = self.reported, {}

    def report(self, lane: str, message: str, *, exc_info: bool = False,
               once: bool = True) -> None:
        """Log and record ``message`` for ``lane`` (``once``: unless last tick said the same)."""
        self.reported[lane] = message
        if once and self.previous.get(lane) == message:
            return
        logger.error("scheduling error: %s", message, exc_info=exc_info)
        self.maybe_recorded.add(lane)  # (even half written: the hash may have taken it)
        self._write(lambda: self.store.record_error(lane, message))

    def suspect(self, lanes: list[str]) -> None:
        """Another beat may have recorded errors for ``lanes`` (this one just took the lock)."""
        self.maybe_recorded.update(lanes)

    def resolved(self, lanes: list[str]) -> None:
        """``lanes`` ran their hooks without error: clear what was recorded for them. Costs a
        round trip only when one of them may have an error recorded."""
        cleared = [lane for lane in lanes if lane in self.maybe_recorded]
        if cleared and self._write(lambda: self.store.clear_errors(cleared)):
            self.maybe_recorded.difference_update(cleared)

    def _write(self, write: Callable[[], None]) -> bool:
        """Record or clear errors: bookkeeping for status, made after the tick's read. A key
        of the wrong type there (the errors hash, the counters) must not stop the tick: its
        refusal stopped every tick of a beat whose lanes have due checks (each hook's error
        another beat may have left is cleared on taking the lock), so nothing was
        dispatched. Said once per onset, naming the keys; False when refused."""
        try:
            write()
        except redis.ResponseError as exc:
            if not self.refusing:
                keys = self.store.keys
                logger.error("cannot record or clear scheduling errors: Redis refused (%s); "
                             "scheduling goes on. Fix: `redis-cli TYPE` %s and %s (each must "
                             "be a hash) and delete the one that is not", exc, keys.errors,
                             keys.counters)
            self.refusing = True
            return False
        self.refusing = False
        return True


@dataclass(frozen=True)
class RememberedAnswer:
    """A stamped due check's last answer: the backlog, the stamp read before the call that
    gave it, when that call was made, and the answer's own ``until`` (:class:`DueAnswer`)."""

    backlog: int
    stamp: str | None
    called_at: float
    until: float | None

    def holds(self, stamp: str | None, now: float, max_age_s: float) -> bool:
        """Still the answer the check would give: nothing set the stamp since (a write sets
        a value it never held, so equal means unwritten), the answer's ``until`` has not
        come, and it is younger than ``max_age_s`` (the bound for writes that skip the
        stamp)."""
        return (stamp == self.stamp and now - self.called_at < max_age_s
                and (self.until is None or now < self.until))


class DueChecks:
    """Calls the lanes' due-check hooks each tick; a hook that raises is recorded, the tick
    goes on, and the lane is unreadable until its hook succeeds again.

    A hook declared with a stamp (:class:`DueCheckStamp`) is called only when its answer may
    have changed (:meth:`RememberedAnswer.holds`): the stamps (:attr:`keys`, under the
    deployment's prefix, so in its hash slot) are read before any hook is called - beat reads
    them with the tick's read, in its round trip - so a write landing during a call sets the
    stamp again and the next tick calls the hook."""

    def __init__(self, hooks: list[tuple[str, DueCheck]], reporter: ErrorReporter, *,
                 stamps: Mapping[str, DueCheckStamp] | None = None,
                 client: redis.Redis | None = None, prefix: str = "",
                 clock: Callable[[], float] = time.time) -> None:
        self.hooks = hooks
        self.reporter = reporter
        self.stamps = dict(stamps or {})
        if self.stamps and client is None:
            raise ValueError("stamped due checks need the Redis client their stamps are on")
        self.client = client
        self.stamp_keys = {lane: f"{prefix}:{stamp.key}" for lane, stamp in self.stamps.items()}
        #: Every stamp's key, once (lanes may share a stamp): what a tick's read gets for
        #: :meth:`probe`.
        self.keys = sorted(set(self.stamp_keys.values()))
        self.clock = clock
        self.remembered: dict[str, RememberedAnswer] = {}

    def probe(self, errors: Mapping[str, str], known: Callable[[str], bool], *,
              fresh: bool = False, stamps: Mapping[str, str | None] | None = None,
              ) -> tuple[dict[str, int], set[str]]:
        """Report the tick's unreadable records (``errors``), call the hooks of the readable
        lanes (a stamped one only when its remembered answer no longer holds; every one when
        ``fresh``: a lane record changed in this tick's read). ``stamps``: the value of each
        of :attr:`keys`, read with the tick's read (None: read them now, one MGET). Returns
        the backlog each hook reported, and the lanes beat cannot judge."""
        self.reporter.new_tick()
        unreadable = {lane for lane in errors if known(lane)}
        for lane, message in errors.items():
            self.reporter.report(lane, message)
        stamps = self._stamps_of([name for name in self.stamps if name not in unreadable],
                                 stamps)
        probes: dict[str, int] = {}
        for name, hook in self.hooks:
            if name in unreadable:
                continue
            if not fresh and name in stamps and self._holds(name, stamps[name]):
                probes[name] = self.remembered[name].backlog
                continue
            called_at = self.clock()
            try:
                answer = hook()
                backlog = max(0, int(answer.backlog if isinstance(answer, DueAnswer)
                                     else answer))
            except Exception as exc:
                self.remembered.pop(name, None)
                unreadable.add(name)
                message = f"due_check of lane {name!r} raised {type(exc).__name__}: {exc}"
                self.reporter.report(name, message[:1000], exc_info=True)
                continue
            probes[name] = backlog
            if name in stamps:
                until = answer.until if isinstance(answer, DueAnswer) else None
                self.remembered[name] = RememberedAnswer(backlog, stamps[name], called_at,
                                                         until)
        self.reporter.resolved(list(probes))
        return probes, unreadable

    def _holds(self, name: str, stamp: str | None) -> bool:
        remembered = self.remembered.get(name)
        return remembered is not None and remembered.holds(stamp, self.clock(),
                                                           self.stamps[name].max_age_s)

    def _stamps_of(self, lanes: list[str],
                   read: Mapping[str, str | None] | None) -> dict[str, str | None]:
        """Each stamped lane's stamp: from ``read`` (the tick's read got :attr:`keys`), else
        read now in one MGET."""
        if not lanes or self.client is None:
            return {}
        values: Mapping[str, object] = (
            read if read is not None
            else dict(zip(self.keys, self.client.mget(self.keys), strict=True)))
        return {lane: None if (value := values.get(self.stamp_keys[lane])) is None
                else str(value) for lane in lanes}

    def forget(self) -> None:
        """Drop every remembered answer: Redis may have lost state (a stamp key lost and set
        again could take any value), or another beat was active meanwhile."""
        self.remembered.clear()

    def taking_over(self) -> None:
        """This beat just took the lock: an error another beat recorded for a hook is cleared
        by the hook's next success too, and every hook is called afresh."""
        self.forget()
        self.reporter.suspect([name for name, _ in self.hooks])


__all__ = ["DueChecks", "ErrorReporter", "RememberedAnswer"]
