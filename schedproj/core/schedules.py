"""A calendar lane's schedule: its fire times, when it is due, and its staleness ratio. Pure.

A lane runs on a cadence (``cadence_s``) or on a calendar (``schedule=``): a cron expression or
Celery ``crontab`` in an IANA time zone (fire times by :mod:`schedproj.core.calendar`, DST by
cron's rules), or any other Celery schedule (fire times from its own ``remaining_estimate``,
adapted at the edge by :mod:`schedproj.on_celery.calendars`). The pure core sees a
:class:`FireTimes`: the first fire after an instant and the last one at or before it.

The rules, each written once here and used by beat, the due index and the simulator alike:

* **Due**: once a fire time has passed since the lane's last run (:func:`first_missed`), or
  while it reports backlog, or when a retry falls due. A lane that never ran has missed its
  previous fire time: it runs at once — unless its catch-up window has passed.
* **Coalesce**: however many fire times passed while nothing ran (beat stopped, Redis lost
  state, a long wait for the heavy lease), they are one run.
* **Catch-up window** (``catchup_window_s``): a fire time may start at most that long after it;
  past it the fire is *missed* — skipped, counted (:func:`missed_fires`), and the lane waits
  for its next fire. Of several passed fire times, the latest still inside its window runs.
* **Staleness ratio** (:func:`calendar_ratio`): measured on the lane's own period.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from schedproj.core import calendar
from schedproj.core.calendar import CalendarError, CronSchedule

#: How many fire times :func:`missed_fires` counts one by one before it stops (a minutely
#: schedule down for a week would otherwise count 10,080 in one tick); past it the count is
#: this figure and says "at least".
MISSED_COUNT_CAP = 1000
#: The instant a schedule's nominal period is measured from (2025-01-01T00:00Z): a fixed one,
#: so every host derives the same figure.
_NOMINAL_FROM = 1735689600.0
#: Fire times measured for the nominal period.
_NOMINAL_FIRES = 8


@runtime_checkable
class FireTimes(Protocol):
    """A schedule's fire instants, in epoch seconds."""

    #: How the schedule is shown and stored, e.g. ``crontab 30 2 * * * Europe/Berlin``.
    text: str

    def next_fire(self, after: float) -> float:
        """The first fire strictly after ``after`` (``inf`` if it never fires again)."""

    def previous_fire(self, at: float) -> float:
        """The last fire at or before ``at`` (``-inf`` if none)."""


class CronFireTimes:
    """A cron schedule in an IANA time zone (:mod:`schedproj.core.calendar`'s DST rules)."""

    __slots__ = ("schedule", "text", "zone")

    def __init__(self, schedule: CronSchedule | str, zone: str) -> None:
        self.schedule = calendar.parse(schedule) if isinstance(schedule, str) else schedule
        calendar.next_fire(self.schedule, zone, _NOMINAL_FROM)   # an unknown zone fails here
        self.zone = zone
        self.text = f"crontab {self.schedule.text} {zone}"

    def next_fire(self, after: float) -> float:
        return calendar.next_fire(self.schedule, self.zone, after)

    def previous_fire(self, at: float) -> float:
        return calendar.previous_fire(self.schedule, self.zone, at)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, CronFireTimes) and other.schedule == self.schedule
                and other.zone == self.zone)

    def __hash__(self) -> int:
        return hash((self.schedule, self.zone))

    def __repr__(self) -> str:
        return f"CronFireTimes({self.text!r})"


class OneOffFireTimes:
    """One instant (a clocked schedule): fires once, then never again."""

    __slots__ = ("at", "text")

    def __init__(self, at: float) -> None:
        if not math.isfinite(at):
            raise CalendarError(f"one-off instant {at!r}", "pass epoch seconds or a datetime")
        self.at = float(at)
        self.text = f"at {self.at!r}"

    def next_fire(self, after: float) -> float:
        return self.at if after < self.at else math.inf

    def previous_fire(self, at: float) -> float:
        return self.at if at >= self.at else -math.inf

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OneOffFireTimes) and other.at == self.at

    def __hash__(self) -> int:
        return hash(self.at)

    def __repr__(self) -> str:
        return f"OneOffFireTimes({self.at!r})"


class OpaqueFireTimes:
    """A schedule only its code can compute (a custom Celery schedule), as tools without that
    code read it from the lane registry: shown by its text, its fire times unknown here."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def next_fire(self, after: float) -> float:
        return math.inf

    def previous_fire(self, at: float) -> float:
        return -math.inf

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OpaqueFireTimes) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


class ShiftedFireTimes:
    """Fire times on a clock whose zero is the epoch instant ``origin`` (the simulator's
    virtual time: a trace's ``start``), so the due code runs unchanged in seconds after it."""

    __slots__ = ("inner", "origin", "text")

    def __init__(self, inner: FireTimes, origin: float) -> None:
        self.inner, self.origin, self.text = inner, float(origin), inner.text

    def next_fire(self, after: float) -> float:
        return self.inner.next_fire(after + self.origin) - self.origin

    def previous_fire(self, at: float) -> float:
        return self.inner.previous_fire(at + self.origin) - self.origin

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, ShiftedFireTimes) and other.inner == self.inner
                and other.origin == self.origin)

    def __hash__(self) -> int:
        return hash((self.inner, self.origin))


def from_text(text: str) -> FireTimes:
    """The schedule :attr:`FireTimes.text` describes (what the lane registry stores)."""
    words = text.split()
    try:
        if len(words) == 7 and words[0] == "crontab":
            return CronFireTimes(" ".join(words[1:6]), words[6])
        if len(words) == 2 and words[0] == "at":
            return OneOffFireTimes(float(words[1]))
    except (CalendarError, ValueError):
        # Written by a beat that could read it (a zone this host's tzdata lacks, say): the
        # lane is shown by its text rather than making the whole registry unreadable.
        pass
    return OpaqueFireTimes(text)


def fire_times(schedule: Any, zone: str) -> FireTimes:
    """The pure core's view of a lane's ``schedule=``: a :class:`FireTimes` as it is, a cron
    expression (``"30 2 * * *"``) or a parsed :class:`CronSchedule`, or anything with Celery
    ``crontab``'s fields, in ``zone``. Other Celery schedules are adapted at the edge."""
    if isinstance(schedule, FireTimes):
        return schedule
    if isinstance(schedule, str | CronSchedule):
        return CronFireTimes(schedule, zone)
    fields = ("_orig_minute", "_orig_hour", "_orig_day_of_month", "_orig_month_of_year",
              "_orig_day_of_week")
    if all(hasattr(schedule, name) for name in fields):
        # Celery's crontab: its fields as the user spelled them, read by our parser (Celery's
        # own next-fire arithmetic has the DST defects this module exists to avoid).
        minute, hour, dom, month, dow = (getattr(schedule, name) for name in fields)
        return CronFireTimes(calendar.parse_fields(minute, hour, dom, month, dow), zone)
    raise CalendarError(
        f"schedule {schedule!r} is not a schedule schedproj can read",
        "pass a cron expression ('30 2 * * *'), a celery.schedules.crontab, or another "
        "Celery schedule (celery.schedules.solar, a custom schedule class)")


def nominal_period(times: FireTimes) -> float:
    """A calendar lane's usual period: the shortest interval between its first fire times after
    a fixed instant. Stands in for ``cadence_s`` where a rule needs one figure (the clock-skew
    bound, lost-run grace, pressure, displays); ranking and due-ness use the period around now."""
    while isinstance(times, ShiftedFireTimes):   # the schedule's own period, not the clock's
        times = times.inner
    fire = times.next_fire(_NOMINAL_FROM)
    shortest = math.inf
    for _ in range(_NOMINAL_FIRES):
        following = times.next_fire(fire)
        if not math.isfinite(following):
            break
        shortest = min(shortest, following - fire)
        fire = following
    return shortest if math.isfinite(shortest) and shortest > 0 else 86400.0


def first_missed(times: FireTimes, last_run_at: float | None, now: float) -> float:
    """The first fire time the lane has not run for: the first after its last run, or for a
    lane that never ran its previous fire time at or before ``now`` (else its next one)."""
    if last_run_at is None:
        previous = times.previous_fire(now)
        return previous if math.isfinite(previous) else times.next_fire(now)
    return times.next_fire(last_run_at)


def calendar_ratio(times: FireTimes, last_run_at: float | None, now: float) -> float:
    """A calendar lane's staleness ratio, measured on its own period::

        ratio = 1 + (now - f) / (n - p)

    where ``f`` is the first fire time since the last run (:func:`first_missed`), and ``p``
    and ``n`` are the fire times around ``now`` (the last at or before it and the first after
    it), so ``n - p`` is the lane's period at ``now``. A lane whose fire time just passed has a
    ratio of about 1, one that has waited a whole period about 2, whatever the schedule;
    before its fire time it is below 1 (0 just after a run at a fire time). A schedule that
    fires no more, or whose period here is unknown, is ranked by ``nominal``."""
    f = first_missed(times, last_run_at, now)
    p, n = times.previous_fire(now), times.next_fire(now)
    period = n - p if math.isfinite(n) and math.isfinite(p) else nominal_period(times)
    if not math.isfinite(f):
        return 0.0
    return max(0.0, 1.0 + (now - f) / period)


def calendar_due_at(times: FireTimes, last_run_at: float | None, now: float,
                    catchup_window_s: float | None = None, delay_fraction: float = 0.0) -> float:
    """When a calendar lane falls due, by time alone, as it stands at ``now``.

    Due at its first fire time since the last run (:func:`first_missed`), plus
    ``delay_fraction`` of the period that follows it (a family member's jitter: members of
    one calendar family spread over at most ``jitter`` of a period after each fire time,
    never before it). Fire times passed while nothing ran coalesce: the time returned stays
    the same from tick to tick while the lane waits. With a catch-up window, a fire time is
    runnable only until ``window`` after it: then the latest fire time still within its
    window is the due time, and if none is, the next fire time (the passed ones are missed,
    see :func:`missed_fires`). ``inf`` when it never fires again."""
    f = _delayed(times, first_missed(times, last_run_at, now), delay_fraction)
    if f > now or catchup_window_s is None:
        return f
    latest = _delayed(times, times.previous_fire(now), delay_fraction)
    if latest > now:   # the latest fire's delay has not run out: the one before it counts
        latest = _delayed(times, times.previous_fire(times.previous_fire(now) - 1e-6),
                          delay_fraction)
    if latest >= f and now - latest <= catchup_window_s:
        return latest
    return _delayed(times, times.next_fire(now), delay_fraction)


def missed_fires(times: FireTimes, last_run_at: float | None, missed_through: float | None,
                 now: float, catchup_window_s: float | None,
                 delay_fraction: float = 0.0) -> tuple[float, int] | None:
    """The fire times past their catch-up window that no run served and no earlier call
    counted: ``(the latest of them, how many)`` — at most :data:`MISSED_COUNT_CAP` counted —
    or None. Fire times after ``last_run_at`` and ``missed_through`` count; the one the lane
    is due for now (still within its window) does not. A lane that never ran counts only its
    previous fire time (it was not there for the earlier ones)."""
    if catchup_window_s is None:
        return None
    start = first_missed(times, last_run_at, now)
    if missed_through is not None and missed_through >= start:
        start = times.next_fire(missed_through)
    count, latest, fire = 0, None, start
    while (math.isfinite(fire) and now - _delayed(times, fire, delay_fraction)
           > catchup_window_s and count < MISSED_COUNT_CAP):
        count, latest = count + 1, fire
        fire = times.next_fire(fire)
    if latest is None:
        return None
    if count == MISSED_COUNT_CAP:
        # Counted enough: the rest are missed as well (recorded through the latest expired).
        latest = max(latest, _latest_expired(times, now, catchup_window_s, delay_fraction))
    return latest, count


def _latest_expired(times: FireTimes, now: float, window: float, delay_fraction: float) -> float:
    fire = times.previous_fire(now)
    while math.isfinite(fire) and now - _delayed(times, fire, delay_fraction) <= window:
        fire = times.previous_fire(fire - 1e-6)
    return fire


def _delayed(times: FireTimes, fire: float, fraction: float) -> float:
    if fraction <= 0.0 or not math.isfinite(fire):
        return fire
    following = times.next_fire(fire)
    return fire + fraction * (following - fire) if math.isfinite(following) else fire


#: Turns a lane's ``schedule=`` into fire times in a zone (the edge passes one that also
#: adapts Celery's other schedules).
Converter = Callable[[Any, str], FireTimes]

__all__ = ["MISSED_COUNT_CAP", "Converter", "CronFireTimes", "FireTimes", "OneOffFireTimes",
           "OpaqueFireTimes", "ShiftedFireTimes", "calendar_due_at", "calendar_ratio",
           "fire_times", "first_missed", "from_text", "missed_fires", "nominal_period"]
