"""Beat's scheduling errors, and the lanes' due-check hooks that can raise them.

An error is logged and recorded (``<prefix>:errors``, a counter) once per onset, not on every
tick it persists. A due-check or ``members`` hook that succeeds again clears the error it
recorded, so status, posture and the watchdog recover on their own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

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

    def new_tick(self) -> None:
        self.previous, self.reported = self.reported, {}

    def report(self, lane: str, message: str, *, exc_info: bool = False,
               once: bool = True) -> None:
        """Log and record ``message`` for ``lane`` (``once``: unless last tick said the same)."""
        self.reported[lane] = message
        if once and self.previous.get(lane) == message:
            return
        logger.error("scheduling error: %s", message, exc_info=exc_info)
        self.store.record_error(lane, message)
        self.maybe_recorded.add(lane)

    def suspect(self, lanes: list[str]) -> None:
        """Another beat may have recorded errors for ``lanes`` (this one just took the lock)."""
        self.maybe_recorded.update(lanes)

    def resolved(self, lanes: list[str]) -> None:
        """``lanes`` ran their hooks without error: clear what was recorded for them. Costs a
        round trip only when one of them may have an error recorded."""
        cleared = [lane for lane in lanes if lane in self.maybe_recorded]
        if cleared:
            self.store.clear_errors(cleared)
            self.maybe_recorded.difference_update(cleared)


class DueChecks:
    """Calls the lanes' due-check hooks each tick; a hook that raises is recorded, the tick
    goes on, and the lane is unreadable until its hook succeeds again."""

    def __init__(self, hooks: list[tuple[str, Callable[[], int]]],
                 reporter: ErrorReporter) -> None:
        self.hooks = hooks
        self.reporter = reporter

    def probe(self, errors: Mapping[str, str],
              known: Callable[[str], bool]) -> tuple[dict[str, int], set[str]]:
        """Report the tick's unreadable records (``errors``), call the hooks of the readable
        lanes. Returns the backlog each hook reported, and the lanes beat cannot judge."""
        self.reporter.new_tick()
        unreadable = {lane for lane in errors if known(lane)}
        for lane, message in errors.items():
            self.reporter.report(lane, message)
        probes: dict[str, int] = {}
        for name, hook in self.hooks:
            if name in unreadable:
                continue
            try:
                probes[name] = max(0, int(hook()))
            except Exception as exc:
                unreadable.add(name)
                message = f"due_check of lane {name!r} raised {type(exc).__name__}: {exc}"
                self.reporter.report(name, message[:1000], exc_info=True)
        self.reporter.resolved(list(probes))
        return probes, unreadable

    def taking_over(self) -> None:
        """This beat just took the lock: an error another beat recorded for a hook is cleared
        by the hook's next success too."""
        self.reporter.suspect([name for name, _ in self.hooks])


__all__ = ["DueChecks", "ErrorReporter"]
