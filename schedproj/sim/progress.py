"""How far a long simulation got and about how long it has left, said on stderr.

The estimate assumes the virtual time still to simulate costs what the virtual time done so
far did, per second: a simulation's cost follows the work in it (the lanes that fall due and
run), which a steady scenario spreads evenly, so it firms up after the first few percent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

#: On a terminal the line is redrawn at most this often (seconds of wall time).
REDRAW_S = 0.25
#: Elsewhere (``--progress`` into a file or a pipe) a line is written at most this often.
LINE_EVERY_S = 5.0


def duration(seconds: float) -> str:
    """Wall-clock seconds as a person reads them: 8 s, 2 min 05 s, 1 h 02 min."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Progress:
    """Reports ``runs`` simulations done one after another (the variants of a comparison, or
    one run). ``live``: redraw one line in place (a terminal); else write a line now and then."""

    def __init__(self, stream: TextIO, runs: int = 1, *, live: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream, self.runs, self.live, self.clock = stream, max(1, runs), live, clock
        self.finished = -1
        self.label = ""
        self.started: float | None = None
        self.said_at: float | None = None
        self.width = 0

    def start(self, label: str = "") -> Callable[[float, float], None]:
        """The next run begins: returns the callback to give ``simulate`` as ``progress``."""
        self.finished += 1
        self.label = label
        if self.started is None:
            self.started = self.clock()
        return self.update

    def update(self, done_s: float, horizon_s: float) -> None:
        """``done_s`` of ``horizon_s`` virtual seconds of the current run are simulated."""
        now = self.clock()
        if self.said_at is not None and now - self.said_at < (
                REDRAW_S if self.live else LINE_EVERY_S):
            return
        self.said_at = now
        self._say(self.line(done_s, horizon_s, now))

    def line(self, done_s: float, horizon_s: float, now: float) -> str:
        """What is said: where the run is in virtual time, the wall time spent, the estimate."""
        assert self.started is not None
        part = min(1.0, done_s / horizon_s) if horizon_s > 0 else 1.0
        whole = (self.finished + part) / self.runs
        spent = now - self.started
        left = (f"about {duration(spent * (1 - whole) / whole)} left" if whole > 0.01
                else "estimating the time left")
        run = (f"run {self.finished + 1} of {self.runs}"
               + (f" ({self.label})" if self.label else "") + ": ") if self.runs > 1 else ""
        return (f"{run}simulated {done_s / 3600:.1f} of {horizon_s / 3600:g} virtual hours "
                f"({100 * whole:.0f} %) in {duration(spent)}, {left}")

    def done(self) -> None:
        """Every run finished: say so (a terminal's line ends here)."""
        if self.started is None:
            return
        self._say(f"simulated {self.runs} run{'s' if self.runs > 1 else ''} in "
                  f"{duration(self.clock() - self.started)}")
        if self.live:
            self.stream.write("\n")
            self.stream.flush()

    def _say(self, text: str) -> None:
        if self.live:
            # Pad over the longer line before it; \r goes back to the line's start.
            self.stream.write("\r" + text.ljust(self.width))
            self.width = max(self.width, len(text))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


__all__ = ["Progress", "duration"]
