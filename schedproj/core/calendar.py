"""When a five-field cron expression fires in an IANA time zone, DST included. Pure.

A schedule is ``minute hour day-of-month month day-of-week``, in the language of Celery's
``crontab``: ``*``, numbers, lists ``a,b``, ranges ``a-b`` (a range whose end is below its start
wraps around: ``fri-mon``, ``22-2``), steps ``*/n`` and ``a-b/n``, month names ``jan``-``dec``
and day names ``sun``-``sat`` (abbreviated or in full, any case); day of week 0-6 with Sunday 0.
As in Celery, a day fires only when it matches the day of month, the month *and* the day of
week (classic cron fires on either day field when both are restricted).

Fire times follow cron's documented DST rules, split on the hour field:

* **Fixed hour** (any hour field that does not name all 24 hours, ``*/2`` included): every
  matching local wall time fires once. A wall time the clock skips (spring forward) fires at
  the first instant after the gap; a wall time the clock shows twice (fall back) fires at its
  first occurrence only. In one formula: wall time ``w`` fires at ``min{t : local(t) >= w}``.
  Several skipped wall times of one gap fire once, at the gap's end.
* **Wildcard hour** (the hour field names all 24 hours: ``*``, ``*/1``, ``0-23``): the schedule
  fires by real elapsed time, at every instant whose local wall time matches; in the repeated
  hour it fires twice, in the skipped hour not at all.

Vixie cron decides by spelling (a minute or hour field starting with ``*`` is a wildcard job);
here the hour field's meaning decides, so ``*``, ``0-23`` and a Celery ``crontab`` built from
``range(24)`` behave alike, and a ``*``-minute with a fixed hour (``* 2 * * *``) is a fixed-hour
schedule: each of its minutes fires once a day, those in a gap together at its end.

Instants are epoch seconds (UTC). The zone's offsets come from ``zoneinfo`` only: each zone's
offset changes in a year are found once (probed a day apart, then bisected to the second) and
kept, so a fire time is a few bisections and integer sums. The probe assumes a zone never
changes its offset twice within a day (no two changes in tzdb since 1970 are closer than
six days).
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, tzinfo
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from schedproj.core.errors import ConfigurationError

_DAY = 86400
_EPOCH = date(1970, 1, 1).toordinal()
#: How far around an instant a past offset change can still matter: the largest offset (about
#: 15 h) and the largest backward jump tzdb records (a day, Alaska 1867) fit inside it.
_WINDOW = 2 * _DAY

_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august",
           "september", "october", "november", "december")
_WEEKDAYS = ("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday")
#: Days a month can have (February 29 counts: a schedule may wait for a leap year).
_LONGEST_MONTH = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


class CalendarError(ConfigurationError, ValueError):
    """A cron expression, time zone or instant that cannot be scheduled."""

    def __init__(self, problem: str, fix: str) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}. Fix: {fix}")


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()   # names[i] is the value low + i

    def value(self, token: str, spec: str) -> int:
        number = int(token) if token.isdigit() else self._named(token, spec)
        return self.within(number, spec)

    def within(self, number: int, spec: str) -> int:
        if not self.low <= number <= self.high:
            raise CalendarError(f"{self.name} field {spec!r}: {number} is outside "
                                f"{self.low}-{self.high}", self._hint())
        return number

    def _named(self, token: str, spec: str) -> int:
        for i, full in enumerate(self.names):
            if token in (full, full[:3]):
                return self.low + i
        raise CalendarError(f"{self.name} field {spec!r}: {token!r} is not a number"
                            + (" or a name" if self.names else ""), self._hint())

    def _hint(self) -> str:
        names = f", or names {self.names[0][:3]}-{self.names[-1][:3]}" if self.names else ""
        sunday = " (Sunday is 0, as in Celery's crontab)" if self.name == "day of week" else ""
        return (f"use numbers {self.low}-{self.high}{sunday}{names}, '*', ranges a-b, steps "
                f"*/n or a-b/n, and commas between them")


_FIELDS = (_Field("minute", 0, 59), _Field("hour", 0, 23), _Field("day of month", 1, 31),
           _Field("month", 1, 12, _MONTHS), _Field("day of week", 0, 6, _WEEKDAYS))
_PART = re.compile(r"(?P<star>\*)(?:/(?P<star_step>[0-9]+))?"
                   r"|(?P<first>[0-9a-z]+)(?:-(?P<last>[0-9a-z]+)(?:/(?P<step>[0-9]+))?)?")

Spec = str | int | Iterable[int]


def _expand_part(f: _Field, part: str, spec: str) -> list[int]:
    m = _PART.fullmatch(part.strip().lower())
    if m is None:
        raise CalendarError(f"{f.name} field {spec!r}: cannot read {part!r}", f._hint())
    if m["star"]:
        values, step = list(range(f.low, f.high + 1)), m["star_step"]
    else:
        first = f.value(m["first"], spec)
        last = first if m["last"] is None else f.value(m["last"], spec)
        if last >= first:
            values = list(range(first, last + 1))
        else:   # a range past the field's end wraps around, as Celery's crontab reads it
            values = [*range(first, f.high + 1), *range(f.low, last + 1)]
        step = m["step"]
    if step is not None and int(step) == 0:
        raise CalendarError(f"{f.name} field {spec!r}: a step of 0", "use a step of 1 or more")
    return values[::int(step or 1)]


def _expand(f: _Field, spec: Spec) -> frozenset[int]:
    if isinstance(spec, str):
        if not spec.strip():
            raise CalendarError(f"{f.name} field is empty", f._hint())
        values: set[int] = set()
        for part in spec.split(","):
            if not part.strip():
                raise CalendarError(f"{f.name} field {spec!r}: an empty list item", f._hint())
            values.update(_expand_part(f, part, spec))
        return frozenset(values)
    numbers = frozenset([spec] if isinstance(spec, int) else spec)
    for number in numbers:
        if isinstance(number, bool) or not isinstance(number, int):
            raise CalendarError(f"{f.name} field: {number!r} is not a whole number", f._hint())
        f.within(number, ",".join(map(str, sorted(numbers))))
    if not numbers:
        raise CalendarError(f"{f.name} field names no value", f._hint())
    return numbers


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """A parsed cron expression: the values each field matches (day of week 0-6, Sunday 0).

    Make one with :func:`parse` or :func:`parse_fields`; equal schedules match the same wall
    times, whatever their spelling (``text`` keeps the spelling for display).
    """

    minutes: frozenset[int]
    hours: frozenset[int]
    days_of_month: frozenset[int]
    months: frozenset[int]
    days_of_week: frozenset[int]
    text: str = field(default="", compare=False)
    #: Minutes of the day (hour * 60 + minute) that match, ascending.
    times: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _days: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _month_list: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _masks: tuple[int, int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # The same checks as parsed text gets.
        list(map(_expand, _FIELDS, (self.minutes, self.hours, self.days_of_month, self.months,
                                    self.days_of_week)))
        if not any(day <= _LONGEST_MONTH[m] for m in self.months for day in self.days_of_month):
            raise CalendarError(f"schedule {self.text or self}: no month it names has a day "
                                "of month it names", "name a day that exists in one of the months")
        setter = object.__setattr__
        setter(self, "times", tuple(sorted(h * 60 + m for h in self.hours for m in self.minutes)))
        setter(self, "_days", tuple(sorted(self.days_of_month)))
        setter(self, "_month_list", tuple(sorted(self.months)))
        setter(self, "_masks", tuple(sum(1 << v for v in values) for values in (
            self.days_of_month, self.months, self.days_of_week)))

    @property
    def by_elapsed_time(self) -> bool:
        """Whether the hour field is a wildcard (names all 24 hours): the schedule then fires by
        real elapsed time, twice in a repeated hour and never in a skipped one; otherwise each
        matching wall time fires once (after a gap, at the first occurrence of a repeat)."""
        return len(self.hours) == 24


@lru_cache(maxsize=4096)
def parse(expression: str) -> CronSchedule:
    """Read ``minute hour day-of-month month day-of-week``; :class:`CalendarError` says what is
    wrong and how to write it instead."""
    fields = expression.split()
    if len(fields) != 5:
        raise CalendarError(f"cron expression {expression!r} has {len(fields)} fields",
                            "write five, separated by spaces: minute hour day-of-month month "
                            "day-of-week, e.g. '30 2 * * *' for 02:30 every day")
    minute, hour, dom, month, dow = fields
    return parse_fields(minute, hour, dom, month, dow, text=" ".join(fields))


def parse_fields(minute: Spec = "*", hour: Spec = "*", day_of_month: Spec = "*",
                 month_of_year: Spec = "*", day_of_week: Spec = "*", *,
                 text: str | None = None) -> CronSchedule:
    """A schedule from its fields, each a text (as in an expression), a number or numbers, as
    Celery's ``crontab`` takes them (its expanded ``.minute``, ``.hour``, ... sets fit too)."""
    specs = (minute, hour, day_of_month, month_of_year, day_of_week)
    values = list(map(_expand, _FIELDS, specs))
    if text is None:
        text = " ".join(map(_spelling, specs, values))
    minutes, hours, days_of_month, months, days_of_week = values
    return CronSchedule(minutes, hours, days_of_month, months, days_of_week, text=text)


def _spelling(spec: Spec, values: frozenset[int]) -> str:
    return spec if isinstance(spec, str) else ",".join(map(str, sorted(values)))


# -- wall times: local seconds since 1970-01-01 00:00 on the zone's own clock ------------------

def _days_in_month(year: int, month: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return _LONGEST_MONTH[month]


# The searches below end: a schedule names a day of month that one of its months has (checked
# when it is made), and each such date falls on every day of the week within 400 years.

def _next_day(s: CronSchedule, day: date) -> date:
    """The first day at or after ``day`` that ``s`` matches: its month, its day of month and
    its day of week (all three, as Celery's crontab requires)."""
    doms, months, dows = s._masks
    while True:
        if not (months >> day.month) & 1:
            i = bisect_right(s._month_list, day.month)
            day = (date(day.year, s._month_list[i], 1) if i < len(s._month_list)
                   else date(day.year + 1, s._month_list[0], 1))
        elif not (doms >> day.day) & 1:
            i = bisect_right(s._days, day.day)
            if i < len(s._days) and s._days[i] <= _days_in_month(day.year, day.month):
                day = day.replace(day=s._days[i])
            else:   # past the month's last named day: on to the next month's first
                day = date(day.year + day.month // 12, day.month % 12 + 1, 1)
        elif not (dows >> day.isoweekday() % 7) & 1:
            day = date.fromordinal(day.toordinal() + 1)
        else:
            return day


def _previous_day(s: CronSchedule, day: date) -> date:
    """The last day at or before ``day`` that ``s`` matches."""
    doms, months, dows = s._masks
    while True:
        if not (months >> day.month) & 1:
            i = bisect_left(s._month_list, day.month) - 1
            year, month = (day.year, s._month_list[i]) if i >= 0 else (
                day.year - 1, s._month_list[-1])
            day = date(year, month, _days_in_month(year, month))
        elif not (doms >> day.day) & 1:
            i = bisect_left(s._days, day.day) - 1
            day = (day.replace(day=s._days[i]) if i >= 0
                   else date.fromordinal(day.replace(day=1).toordinal() - 1))
        elif not (dows >> day.isoweekday() % 7) & 1:
            day = date.fromordinal(day.toordinal() - 1)
        else:
            return day


def _next_wall(s: CronSchedule, wall: int) -> int:
    """The first wall time at or after ``wall`` that ``s`` matches."""
    ordinal, second = divmod(wall, _DAY)
    minute = -(-second // 60)
    day = date.fromordinal(ordinal + _EPOCH)
    while True:
        matching = _next_day(s, day)
        if matching != day:
            day, minute = matching, 0
        i = bisect_left(s.times, minute)
        if i < len(s.times):
            return (day.toordinal() - _EPOCH) * _DAY + s.times[i] * 60
        day, minute = date.fromordinal(day.toordinal() + 1), 0


def _previous_wall(s: CronSchedule, wall: int) -> int:
    """The last wall time at or before ``wall`` that ``s`` matches."""
    ordinal, second = divmod(wall, _DAY)
    minute = second // 60
    day = date.fromordinal(ordinal + _EPOCH)
    while True:
        matching = _previous_day(s, day)
        if matching != day:
            day, minute = matching, 1439
        i = bisect_right(s.times, minute) - 1
        if i >= 0:
            return (day.toordinal() - _EPOCH) * _DAY + s.times[i] * 60
        day, minute = date.fromordinal(day.toordinal() - 1), 1439


# -- the zone's offsets: segments of constant offset, found once per zone and year ------------

@dataclass(frozen=True, slots=True)
class _Year:
    """One UTC year of a zone, in segments of one offset: (start, end, offset) with the end
    exclusive and the offset in seconds east of UTC; the first starts and the last ends at the
    year's edge. ``starts`` are the segments' starts, to search."""

    starts: tuple[int, ...]
    segments: tuple[tuple[int, int, int], ...]


_YEARS: dict[tuple[tzinfo, int], _Year] = {}


def _offset(zone: tzinfo, instant: int) -> int:
    offset = datetime.fromtimestamp(instant, zone).utcoffset()
    assert offset is not None   # fromtimestamp has refused a zone without one
    return offset.days * _DAY + offset.seconds


def _probe_year(zone: tzinfo, year: int) -> _Year:
    start = (date(year, 1, 1).toordinal() - _EPOCH) * _DAY
    end = (date(year + 1, 1, 1).toordinal() - _EPOCH) * _DAY
    starts, offsets = [start], [_offset(zone, start)]
    probe = start
    while probe < end - 1:
        ahead = min(probe + _DAY, end - 1)
        if _offset(zone, ahead) != offsets[-1]:
            low, high = probe, ahead   # the offset changes in (low, high]: find the second
            while high - low > 1:
                middle = (low + high) // 2
                if _offset(zone, middle) == offsets[-1]:
                    low = middle
                else:
                    high = middle
            starts.append(high)
            offsets.append(_offset(zone, high))
        probe = ahead
    ends = [*starts[1:], end]
    return _Year(tuple(starts), tuple((starts[k], ends[k], offsets[k]) for k in range(len(ends))))


def _year(zone: tzinfo, year: int) -> _Year:
    found = _YEARS.get((zone, year))
    if found is None:
        found = _YEARS[(zone, year)] = _probe_year(zone, year)
    return found


def _year_of(instant: int) -> int:
    return date.fromordinal(instant // _DAY + _EPOCH).year


def _segments_from(zone: tzinfo, instant: int) -> Iterator[tuple[int, int, int]]:
    """(start, end, offset) of the segment holding ``instant``, then of each one after it."""
    year = _year_of(instant)
    table = _year(zone, year)
    yield from table.segments[bisect_right(table.starts, instant) - 1:]
    while True:
        year += 1
        yield from _year(zone, year).segments


def _segments_until(zone: tzinfo, instant: int) -> Iterator[tuple[int, int, int]]:
    """(start, end, offset) of the segment holding ``instant``, then of each one before it."""
    year = _year_of(instant)
    table = _year(zone, year)
    yield from reversed(table.segments[:bisect_right(table.starts, instant)])
    while True:
        year -= 1
        yield from reversed(_year(zone, year).segments)


def _local_reach(zone: tzinfo, instant: float) -> tuple[float, float]:
    """The local wall time at ``instant``, and the latest wall time the clock showed before it
    (the end of a repeated stretch the clock is back in; else just the first value)."""
    segments = _segments_until(zone, math.floor(instant))
    offset = next(segments)[2]
    local = reached = instant + offset
    for _, end, earlier in segments:
        if end <= instant - _WINDOW:
            break
        reached = max(reached, end + earlier)
    return local, reached


def _earliest_at_or_after(zone: tzinfo, wall: int) -> int:
    """The first instant whose local wall time is ``wall`` or later: ``wall``'s only instant,
    the first of two when it repeats, the end of the gap when the clock skips it."""
    segments = _segments_from(zone, wall - _WINDOW)
    while True:
        start, end, offset = next(segments)
        instant = max(start, wall - offset)
        if instant < end:
            return instant


# -- fire times ---------------------------------------------------------------------------------

def _fixed_next(s: CronSchedule, zone: tzinfo, after: float) -> int:
    local, reached = _local_reach(zone, after)
    # Every wall time up to where the clock has been has fired already (or was due to).
    low = max(math.floor(local) // 60 * 60 + 60, -(-math.ceil(reached) // 60) * 60)
    return _earliest_at_or_after(zone, _next_wall(s, low))


def _fixed_previous(s: CronSchedule, zone: tzinfo, at: float) -> int:
    local, reached = _local_reach(zone, at)
    # The last wall time the clock has shown; a repeated stretch's end is never shown itself.
    high = max(math.floor(local) // 60 * 60, (math.ceil(reached) - 1) // 60 * 60)
    return _earliest_at_or_after(zone, _previous_wall(s, high))


def _elapsed_next(s: CronSchedule, zone: tzinfo, after: float) -> int:
    segments = _segments_from(zone, math.floor(after))
    start, end, offset = next(segments)
    low = math.floor(after + offset) // 60 * 60 + 60
    while True:
        wall = _next_wall(s, low)
        if wall - offset < end:
            return wall - offset
        start, end, offset = next(segments)
        low = -(-(start + offset) // 60) * 60


def _elapsed_previous(s: CronSchedule, zone: tzinfo, at: float) -> int:
    segments = _segments_until(zone, math.floor(at))
    start, end, offset = next(segments)
    high = math.floor(at + offset) // 60 * 60
    while True:
        wall = _previous_wall(s, high)
        if wall - offset >= start:
            return wall - offset
        start, end, offset = next(segments)
        high = (end + offset - 1) // 60 * 60


def _zone(tz: str | tzinfo) -> tzinfo:
    if not isinstance(tz, str):
        return tz
    try:
        return ZoneInfo(tz)   # kept by ZoneInfo's own cache: the same object for the same name
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:   # OSError: a folder's name
        raise CalendarError(f"unknown time zone {tz!r}", "use an IANA zone name such as "
                            "'Europe/Berlin'; where the system has no zone data, install the "
                            "tzdata package") from exc


def _schedule(schedule: str | CronSchedule) -> CronSchedule:
    return parse(schedule) if isinstance(schedule, str) else schedule


def _instant(name: str, value: float) -> float:
    if not math.isfinite(value):
        raise CalendarError(f"{name} is {value!r}", "pass epoch seconds (a finite number)")
    return value


def next_fire(schedule: str | CronSchedule, tz: str | tzinfo, after: float) -> float:
    """The first fire instant (epoch seconds) strictly after ``after``, by the module's DST
    rules: fixed-hour schedules once per matching wall time (a skipped one at the gap's end, a
    repeated one at its first occurrence), wildcard-hour schedules by real elapsed time."""
    s, zone, after = _schedule(schedule), _zone(tz), _instant("after", after)
    if s.by_elapsed_time:
        return float(_elapsed_next(s, zone, after))
    return float(_fixed_next(s, zone, after))


def previous_fire(schedule: str | CronSchedule, tz: str | tzinfo, at: float) -> float:
    """The last fire instant at or before ``at`` (the same rules as :func:`next_fire`)."""
    s, zone, at = _schedule(schedule), _zone(tz), _instant("at", at)
    if s.by_elapsed_time:
        return float(_elapsed_previous(s, zone, at))
    return float(_fixed_previous(s, zone, at))


def fires_between(schedule: str | CronSchedule, tz: str | tzinfo, start: float,
                  end: float) -> Iterator[float]:
    """Every fire instant ``t`` with ``start < t <= end``, ascending, each once."""
    s, zone = _schedule(schedule), _zone(tz)
    fire = next_fire(s, zone, start)
    while fire <= _instant("end", end):
        yield fire
        fire = next_fire(s, zone, fire)


def period_around(schedule: str | CronSchedule, tz: str | tzinfo,
                  now: float) -> tuple[float, float]:
    """``(previous, next)``: the last fire at or before ``now`` and the first after it. The
    schedule's period at ``now`` is ``next - previous`` (always above 0): the interval between
    the fire times around now, on which a calendar lane's staleness is measured."""
    s, zone = _schedule(schedule), _zone(tz)
    return previous_fire(s, zone, now), next_fire(s, zone, now)
