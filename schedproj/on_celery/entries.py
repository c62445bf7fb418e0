"""The app's schedule entries under the FairScheduler: its ``beat_schedule`` and the runtime
entries (``schedproj entry add``), sent as ordinary tasks in the same tick as the light lanes,
at most once per due time (:mod:`schedproj.core.entries` decides; this module reads, claims
under the beat lock, sends through Celery's ``apply_entry``, and keeps the due index).

Every schedule type Celery accepts works: a number of seconds, a ``timedelta``, ``schedule``
(``relative`` included), ``solar`` and any ``BaseSchedule`` subclass, through its own
``is_due``, in the app's time zone, as Celery's beat evaluates it. A ``crontab`` (the class
itself; a subclass keeps its own ``is_due``) and a runtime entry's one-off instant
(:class:`OneOffSchedule`) are judged instead by the calendar rules calendar lanes follow
(:class:`schedproj.core.entries.CalendarTiming`): cron's DST rules, in the entry's time zone
(the app's ``timezone``/``enable_utc``, or ``options={"schedproj": {"timezone": ...}}``),
missed fire times coalesced into one run, and a catch-up window (the entry's
``catchup_window_s``, else Celery's ``beat_cron_starting_deadline`` for a crontab) past which a
fire time is skipped and recorded as missed. Fire times are computed only for the entries a
tick looks at (those the due index says are due), never for every entry per tick.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from array import array
from bisect import bisect_left
from collections import ChainMap
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableSequence
from datetime import UTC, datetime, timedelta
from itertools import chain, islice
from types import MappingProxyType
from typing import Any

import redis
from celery.beat import ScheduleEntry
from celery.schedules import BaseSchedule, crontab, maybe_schedule, schedule

from schedproj.core.calendar import CalendarError, CronSchedule
from schedproj.core.entries import (
    KEY_SETTINGS,
    CalendarTiming,
    EntryClaim,
    EntryDefinition,
    EntryPlan,
    EntryState,
    check_entry_name,
    plan_entries,
)
from schedproj.core.errors import BeatLockLost, ConfigurationError, StateError
from schedproj.core.schedules import CronFireTimes, fire_times
from schedproj.on_celery.calendars import app_timezone
from schedproj.store.entry_store import EntryStore, WriteResult
from schedproj.store.protocol import Keys
from schedproj.telemetry.sentry import ZonedCrontab

logger = logging.getLogger("schedproj.beat")

#: The entry (and task) Celery's beat installs to expire stored results.
BACKEND_CLEANUP = "celery.backend_cleanup"
#: One tick spends at most about this long on entries (seconds); the rest wait a tick.
TICK_BUDGET_S = 0.5
#: A send that failed is tried again this soon (seconds): its due time stays due.
RESEND_AFTER_S = 1.0
#: After Redis refused an entries command (a key of the wrong type, out of memory), the
#: entries step is tried again this soon (seconds), until the cause is fixed; lanes go on.
REFUSED_RETRY_S = 1.0
#: The due index or the listing found short of the entries beat runs (lost, or a member
#: removed) is healed at once, and again at most this often (seconds): each heal writes every
#: entry, so a mismatch that persisted (it should not) never costs that every tick.
REPAIR_EVERY_S = 60.0
#: Work that touches every entry (a take-over's index, states and listing; the reconcile's heal
#: of the index) is done this many entries a step ...
PASS_PAGE = 1000
#: ... at most this many steps a tick (and no more once the tick's budget is spent): at
#: 1,000,000 entries a take-over done in one tick held beat 15 s, past the beat lock's TTL.
#: Ticks come back at once while a pass lasts; the lock is renewed between them.
PASS_STEPS_PER_TICK = 16
#: At most this many reads of the due index (each up to ``READ_LIMIT`` entries) are judged a
#: tick (and none more once the tick's budget is spent): the rest wait a tick.
JUDGE_READS_PER_TICK = 8
#: The key of a ``beat_schedule`` entry's ``options`` that holds what schedproj reads of it
#: (``timezone``, ``catchup_window_s``); it is not sent with the message.
OWN_OPTIONS = "schedproj"
#: The settings :data:`OWN_OPTIONS` may hold.
OWN_OPTION_NAMES = frozenset({"timezone", "catchup_window_s"})
#: Cron fire times kept per (crontab, zone): entries share a few schedules, and a tick that
#: judges thousands of midnight entries parses each schedule once. Bounded: cleared when full.
_CRON_CACHE_MAX = 4096
_cron_cache: dict[tuple[str, str], CronFireTimes] = {}


class OneOffSchedule(BaseSchedule):  # type: ignore[misc]
    """A runtime entry's one-off instant (``schedproj entry add --at``), as a Celery schedule:
    due once its instant has passed, never again after a run at or after it (like
    django-celery-beat's clocked schedule). Beat judges it by its calendar
    (:class:`schedproj.core.schedules.OneOffFireTimes`); ``is_due`` answers the same for
    whoever asks Celery's way."""

    def __init__(self, at: float, app: Any = None) -> None:
        super().__init__(app=app)
        self.at = float(at)

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        return timedelta(seconds=self.at - time.time())

    def is_due(self, last_run_at: datetime) -> tuple[bool, float]:
        if last_run_at.timestamp() >= self.at:   # spent: never due again
            return False, 3600.0
        left = self.at - time.time()
        return (False, left) if left > 0 else (True, 3600.0)

    def __repr__(self) -> str:
        return f"<at {datetime.fromtimestamp(self.at, UTC).isoformat()}>"

    def __reduce__(self) -> tuple[Any, ...]:
        return self.__class__, (self.at,)


def cron_fire_times(sched: crontab, key: str, zone: str) -> CronFireTimes:
    """A crontab's fire times in ``zone`` (its fields read by :mod:`schedproj.core.calendar`;
    ``key`` is its :func:`schedule_key`), from the cache when another entry had them."""
    found = _cron_cache.get((key, zone))
    if found is None:
        times = fire_times(sched, zone)
        assert isinstance(times, CronFireTimes)
        if len(_cron_cache) >= _CRON_CACHE_MAX:
            _cron_cache.clear()
            _field_values.clear()
        found = _cron_cache[(key, zone)] = CronFireTimes(_shared_fields(times.schedule), zone)
    return found


#: Each distinct set of field values, once: most crontabs share their day, month and weekday
#: fields ("*"), which are most of a parsed schedule's size (1,320 distinct crontabs held
#: 4.8 MiB parsed one by one, 1.1 MiB sharing them).
_field_values: dict[frozenset[int], frozenset[int]] = {}


def _shared_fields(s: CronSchedule) -> CronSchedule:
    def shared(values: frozenset[int]) -> frozenset[int]:
        return _field_values.setdefault(values, values)

    return CronSchedule(shared(s.minutes), shared(s.hours), shared(s.days_of_month),
                        shared(s.months), shared(s.days_of_week), text=s.text)


class EntrySend(ScheduleEntry):  # type: ignore[misc]
    """One entry's message, sent through the scheduler's ``apply_entry`` (so Sentry's Crons
    wrapper sees it) and carrying the result of its own send, which ``apply_entry`` swallows."""

    send_error: BaseException | None = None


class CeleryTiming:
    """An entry's Celery schedule, asked as Celery's beat asks it: ``is_due(last_run_at)``
    with ``last_run_at`` in the app's time zone (crontab reads its hour and day fields from
    it), answering with the seconds until the next look."""

    __slots__ = ("schedule", "tz")

    def __init__(self, sched: BaseSchedule, tz: Any) -> None:
        self.schedule, self.tz = sched, tz

    def check(self, last_run_at: float) -> tuple[bool, float]:
        due, next_s = self.schedule.is_due(datetime.fromtimestamp(last_run_at, tz=self.tz))
        return bool(due), float(next_s)


#: The empty ``kwargs``/``options`` every entry without them shares (read-only): two fresh
#: empty dicts per entry were a quarter of beat's memory at 100,000 entries.
_EMPTY: Mapping[str, Any] = MappingProxyType({})


class LoadedEntry:
    """One entry as a tick uses it: its definition (shared with the app's ``beat_schedule``,
    never copied) and where it came from. It is its own :class:`Timing` (``check``), as
    :class:`CeleryTiming` is, without a second object per entry. A runtime entry's is kept
    while beat runs; a ``beat_schedule`` entry's is made when a tick needs it
    (:class:`CodeEntries`)."""

    __slots__ = ("_base", "_calendar", "_key", "args", "clock", "copy_for", "deadline", "kwargs",
                 "last_run_at", "name", "options", "own", "raw", "runs", "schedule", "source",
                 "task", "tz", "zone")

    def __init__(self, name: str, task: str, sched: BaseSchedule, *, args: Any = (),
                 kwargs: Any = None, options: Any = None, source: str, tz: Any,
                 raw: str = "", app: Any = None, zone: str = "UTC",
                 deadline: float | None = None, own: Any = None,
                 calendar: CalendarTiming | None = None) -> None:
        self.name, self.task, self.schedule, self.source = name, task, sched, source
        #: The zone its crontab fires in by default (the app's), and Celery's
        #: ``beat_cron_starting_deadline`` (seconds, or None).
        self.zone, self.deadline = zone, deadline
        #: What the entry's ``options`` hold under :data:`OWN_OPTIONS` (None: nothing).
        self.own = own
        self._calendar = calendar
        #: Set (the app) when ``sched`` is the app's own object: ``is_due`` is asked of an
        #: equal one made for the check (:func:`judged_copy`).
        self.copy_for = app
        self.args, self.kwargs, self.options = args, kwargs or _EMPTY, options or _EMPTY
        self._key: str | None = None
        self._base: str | None = None
        self.tz = tz
        #: A runtime entry's stored definition (to see it change); "" for the code's.
        self.raw = raw
        #: The state this beat last read or wrote (None: none yet), put back should Redis
        #: lose it while this beat runs.
        self.last_run_at: float | None = None
        self.runs = 0
        #: While a read is judged: Celery's ``now`` for its ``is_due`` (the read's instant in
        #: the app's zone, :func:`fixed_clock`), so it is asked of the same instant the plan
        #: records a run at; None: the clock's.
        self.clock: Callable[[], datetime] | None = None

    @property
    def calendar(self) -> CalendarTiming | None:
        """The calendar it is judged by (:class:`CalendarTiming`): a ``crontab`` in its zone
        with its catch-up window, a one-off instant; None for every other schedule, asked
        ``is_due``. CalendarError when its own options name a zone or window wrongly."""
        if self._calendar is None and type(self.schedule) is crontab:
            zone, window = self.zone, self.deadline
            if self.own is not None:
                zone, own_window = own_settings(self.own, zone)
                window = own_window if own_window is not None else window
            self._calendar = CalendarTiming(
                cron_fire_times(self.schedule, self.base_key, zone), window)
        return self._calendar

    @property
    def base_key(self) -> str:
        """:func:`schedule_key` of its schedule alone, made when first asked (a ``repr``):
        what operators are shown."""
        if self._base is None:
            self._base = schedule_key(self.schedule)
        return self._base

    @property
    def schedule_key(self) -> str:
        """What its state measures from (:func:`entry_key`): its schedule, and the zone and
        catch-up window a crontab names itself."""
        if self._key is None:
            self._key = entry_key(self.base_key, self.schedule, self.own)
        return self._key

    def check(self, last_run_at: float) -> tuple[bool, float]:
        calendar = self.calendar
        if calendar is not None:   # beat judges it at the tick's time (plan_entries); here, now
            return calendar.check(last_run_at, time.time())
        sched, clock = self.schedule, self.clock
        if self.copy_for is not None or (clock is not None and type(sched) is schedule):
            # An equal copy is asked: the app's own object (:func:`judged_copy`), or one
            # asked at a read's instant (its own ``nowfun`` is left alone). The app's clock
            # read per entry was a third of Celery's ``is_due`` (cProfile, 10,000 entries).
            sched = judged_copy(sched, self.copy_for)
            if clock is not None and sched.nowfun is None:
                sched.nowfun = clock
        due, next_s = sched.is_due(datetime.fromtimestamp(last_run_at, tz=self.tz))
        return bool(due), float(next_s)

    def sent_schedule(self) -> Any:
        """The schedule its message carries (sentry-sdk builds a Crons monitor from it): a
        crontab in a zone of its own names that zone (:class:`ZonedCrontab`), so Sentry
        expects it at the times it fires; any other is its own schedule."""
        calendar = self._calendar
        times = None if calendar is None else calendar.times
        if isinstance(times, CronFireTimes) and times.zone != self.zone:
            with contextlib.suppress(ValueError):
                return ZonedCrontab(times)
        return self.schedule

    @property
    def timing(self) -> LoadedEntry:
        return self

    def remember(self, state: EntryState, force: bool = False) -> None:
        """Remember ``state`` if it measures from this schedule and is not older than what is
        remembered (a state read from Redis restored from an older copy must not make beat
        forget the newer one it wrote), or ``force`` (beat wrote it, or an operator did)."""
        if state.schedule_key == self.schedule_key and (
                force or self.last_run_at is None or state.last_run_at >= self.last_run_at):
            self.last_run_at, self.runs = state.last_run_at, state.total_run_count

    def info(self) -> str:
        return entry_info(self.task, self.shown_schedule(), self.source)

    def shown_schedule(self) -> str:
        """Its schedule as operators see it (:func:`shown_schedule`)."""
        return shown_schedule(self.base_key, self.own, self.zone)


#: The listing's JSON, compact (``json.dumps`` with separators built an encoder per call).
_INFO_ENCODER = json.JSONEncoder(separators=(",", ":"))


def entry_info(task: Any, shown: str, source: str) -> str:
    """What the listing operators read holds of an entry (``Keys.entries_info``)."""
    return _INFO_ENCODER.encode({"task": task, "schedule": shown, "source": source})


def shown_schedule(base_key: str, own: Any, zone: str) -> str:
    """An entry's schedule as operators see it: its :func:`schedule_key` (``base_key``), and
    the zone and catch-up window it names itself in ``own`` (its :data:`OWN_OPTIONS`; not the
    app's ``zone``), e.g. ``<crontab: 30 2 * * * (m/h/dM/MY/d)> in Europe/Berlin, catch-up
    3600s``. Read without parsing its schedule."""
    found: Any = own if isinstance(own, Mapping) else {}
    tz, window = found.get("timezone"), found.get("catchup_window_s")
    words = [f"in {tz}"] if isinstance(tz, str) and tz != zone else []
    if isinstance(window, (int, float)) and not isinstance(window, bool):
        words.append(f"catch-up {window:g}s")
    return " ".join([base_key, ", ".join(words)]) if words else base_key


def own_settings(own: Any, zone: str) -> tuple[str, float | None]:
    """The zone and catch-up window an entry's ``options={"schedproj": {...}}`` sets (``zone``
    and None where it sets none); CalendarError naming the fix for anything else."""
    fix = ('write options={"schedproj": {"timezone": "Europe/Berlin", "catchup_window_s": 600}}'
           " (either key may be left out)")
    if not isinstance(own, Mapping) or not set(own) <= OWN_OPTION_NAMES:
        raise CalendarError(f"options[{OWN_OPTIONS!r}] = {own!r} is not what schedproj reads",
                            fix)
    zone, window = own.get("timezone", zone), own.get("catchup_window_s")
    if not isinstance(zone, str):
        raise CalendarError(f"timezone {zone!r} is not an IANA zone name", fix)
    if window is not None and (isinstance(window, bool) or not isinstance(window, (int, float))
                               or not window > 0):
        raise CalendarError(f"catchup_window_s {window!r} is not a positive number of seconds",
                            fix)
    return zone, None if window is None else float(window)


def schedule_key(sched: BaseSchedule) -> str:
    """What identifies a schedule across beat starts: its repr (Celery's schedules spell out
    their fields), or its class when the repr is the default one naming a memory address."""
    if type(sched) is schedule:  # its repr rounds: 0.2 s and 0.3 s both read "<freq: now>"
        return f"schedule(run_every={sched.seconds!r}s, relative={sched.relative!r})"
    text = repr(sched)
    if " object at 0x" in text:
        return f"{type(sched).__module__}.{type(sched).__qualname__}"
    return text


def entry_key(base: str, sched: BaseSchedule, own: Any) -> str:
    """An entry's schedule key: ``base`` (its :func:`schedule_key`), and for a ``crontab``
    the zone and catch-up window it names itself (``options={"schedproj": ...}``, a runtime
    entry's ``--timezone``/``--catchup-window``), e.g. ``<crontab: 30 2 * * * (m/h/dM/MY/d)>
    | zone=Europe/Berlin``: moving it to another zone is a schedule change (it counts from
    now, never sending a fire time that only "passed" in the new zone). A crontab that names
    neither keeps the key it always had; the app's own zone is not in the key. A state stored
    before keys named zones still measures from its schedule (``EntryState.measures_from``):
    the upgrade makes no entry count from now."""
    if type(sched) is not crontab or not isinstance(own, Mapping):
        return base
    zone, window = own.get("timezone"), own.get("catchup_window_s")
    words = [] if zone is None else [f"zone={zone}"]
    if window is not None:
        with contextlib.suppress(TypeError, ValueError):
            window = float(window)   # 3600 and 3600.0 are one window
        words.append(f"catch-up={window!r}")
    return f"{base}{KEY_SETTINGS}{', '.join(words)}" if words else base


def judged_copy(sched: Any, app: Any = None) -> Any:
    """A schedule equal to ``sched`` to ask ``is_due`` of, when it is one of the app's own
    ``schedule`` or ``crontab`` objects: Celery's first ``is_due`` on an object caches its time
    zone in the object's ``__dict__``, which makes Python give every such object a dict of its
    own (64 bytes each: 6 MiB at 100,000 entries, kept for as long as the app lives). The copy
    (every attribute a new object of its class has, read one by one: reading ``__dict__``
    would make the dict too) is judged and dropped instead. Any other schedule (``solar``, a
    subclass, the user's own) is asked itself: its state is its own."""
    fields = _COPIED.get(type(sched))
    if fields is None:
        return sched
    copy = object.__new__(type(sched))
    for name in fields:
        setattr(copy, name, getattr(sched, name))
    if app is not None:   # else it keeps its own
        copy.app = app
    return copy


def fixed_clock(at: datetime) -> Callable[[], datetime]:
    """A Celery ``nowfun`` that answers ``at`` (:attr:`LoadedEntry.clock`)."""
    return lambda: at


#: The attributes a new ``schedule`` and ``crontab`` has (this Celery's, read from a probe).
_COPIED: dict[type, tuple[str, ...]] = {
    kind: tuple(vars(probe)) for kind, probe in ((schedule, schedule(60.0)),
                                                 (crontab, crontab()))}


#: "Nothing remembered" in :class:`CodeEntries`' ``last_run_at`` column (a stored state's
#: ``last_run_at`` is never negative).
_NOTHING = -1.0


class CodeEntries(Mapping[str, LoadedEntry]):
    """The app's ``beat_schedule`` as beat holds it between ticks: about 20 bytes an entry.

    The definitions stay where the app keeps them (its ``beat_schedule`` dict and the spec
    dicts in it, held, never copied; beat reads them at start as Celery's beat does); an
    entry's schedule, key and message fields are read from its spec when a tick needs the
    entry (``self[name]``, a :class:`LoadedEntry` made for that tick). What beat remembers of
    each entry's state, to put back should Redis lose it, is in two arrays indexed by the
    entry's position among the sorted names. Per-entry Python objects kept between ticks
    were most of beat's memory at 100,000 entries (53 MiB against celery-redbeat's 7)."""

    def __init__(self, app: Any, specs: Mapping[str, Mapping[str, Any]],
                 names: Iterable[str]) -> None:
        self.app, self.tz = app, app.timezone
        #: The zone crontab entries fire in unless they name their own, and Celery's catch-up
        #: window for them.
        self.zone, self.deadline = app_timezone(app.conf), cron_deadline(app.conf)
        self._specs = specs
        #: The names, sorted (the strings are the app's own keys): a name's position is its
        #: entry's number, found by bisection (a dict of numbers would cost 50 bytes each).
        self._names = sorted(names)
        n = len(self._names)
        self._last_run_at = array("d", [_NOTHING]) * n
        #: Run counts in 4 bytes each; a plain list should one ever pass 2**32 - 1.
        self._runs: MutableSequence[int] = array("I", [0]) * n

    def __len__(self) -> int:
        return len(self._names)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._index(name) >= 0

    def __getitem__(self, name: str) -> LoadedEntry:
        i = self._index(name)
        if i < 0:
            raise KeyError(name)
        spec: Any = self._specs[name]
        # Celery's own rule for the schedule field (ScheduleEntry's): numbers and timedelta
        # become ``schedule``, ``relative`` honoured; a schedule object is used as it is.
        raw = spec.get("schedule")
        sched = maybe_schedule(raw, spec.get("relative", False), app=self.app)
        options, own = spec.get("options"), None
        if options and OWN_OPTIONS in options:   # schedproj's own, not the message's
            own = options[OWN_OPTIONS]
            options = {k: v for k, v in options.items() if k != OWN_OPTIONS}
        entry = LoadedEntry(name, spec.get("task"), sched, args=spec.get("args", ()),
                            kwargs=spec.get("kwargs"), options=options, source="code",
                            tz=self.tz, zone=self.zone, deadline=self.deadline, own=own,
                            # One made from a number here is this tick's already.
                            app=self.app if sched is raw else None)
        if self._last_run_at[i] != _NOTHING:
            entry.last_run_at, entry.runs = self._last_run_at[i], self._runs[i]
        return entry

    def schedules(self) -> Iterator[tuple[str, BaseSchedule]]:
        """Each entry's name and schedule, read as :meth:`__getitem__` reads it, without
        making the entries (beat's start asked every entry this way: 5.0 s of a 5.1 s
        construction at 100,000 entries under cProfile)."""
        for name in self._names:
            spec: Any = self._specs[name]
            yield name, maybe_schedule(spec.get("schedule"), spec.get("relative", False),
                                       app=self.app)

    def get(self, name: str, default: Any = None) -> Any:
        """``self[name]``, or ``default``: one bisection (``name in self`` and then
        ``self[name]`` were two, for every entry a tick reads)."""
        try:
            return self[name]
        except KeyError:
            return default

    def info(self, name: str) -> str | None:
        """:meth:`LoadedEntry.info` of the entry (None: none is named so), read from its spec
        without making the entry: the listing a take-over publishes asks it of every one."""
        if self._index(name) < 0:
            return None
        spec: Any = self._specs[name]
        sched = maybe_schedule(spec.get("schedule"), spec.get("relative", False), app=self.app)
        options = spec.get("options")
        own = options.get(OWN_OPTIONS) if options else None
        return entry_info(spec.get("task"), shown_schedule(schedule_key(sched), own, self.zone),
                          "code")

    def remembers(self, name: str) -> bool:
        """Whether a state of the entry is remembered (this beat read or wrote one)."""
        i = self._index(name)
        return i >= 0 and self._last_run_at[i] != _NOTHING

    def _index(self, name: str) -> int:
        i = bisect_left(self._names, name)
        return i if i < len(self._names) and self._names[i] == name else -1

    def without(self, names: Iterable[str]) -> CodeEntries:
        """The same entries but ``names`` (before anything is remembered)."""
        left_out = set(names)
        return CodeEntries(self.app, self._specs, (n for n in self._names if n not in left_out))

    def remember(self, name: str, state: EntryState, key: str | None = None,
                 force: bool = False) -> None:
        """Remember ``state`` if it measures from the entry's schedule (``key``, when the
        caller has it at hand) and is not older than what is remembered, or ``force``
        (:meth:`LoadedEntry.remember`)."""
        i = self._index(name)
        if i < 0:
            return
        if state.schedule_key != (key if key is not None else self._key(name)):
            return
        if not force and state.last_run_at < self._last_run_at[i]:
            return
        self._last_run_at[i] = state.last_run_at
        try:
            self._runs[i] = state.total_run_count
        except OverflowError:
            self._runs = list(self._runs)
            self._runs[i] = state.total_run_count

    def forget(self) -> None:
        """Remember nothing (:meth:`BeatEntries.take_over` of a beat new to the lock)."""
        n = len(self._names)
        self._last_run_at = array("d", [_NOTHING]) * n
        self._runs = array("I", [0]) * n

    def remembered(self) -> Iterator[tuple[str, EntryState]]:
        """Every state remembered, as it would be stored."""
        for i, last in enumerate(self._last_run_at):
            if last != _NOTHING:
                name = self._names[i]
                yield name, EntryState(last, self._runs[i], self._key(name))

    def _key(self, name: str) -> str:
        spec: Any = self._specs[name]
        sched = maybe_schedule(spec.get("schedule"), spec.get("relative", False), app=self.app)
        options = spec.get("options")
        own = options.get(OWN_OPTIONS) if options else None
        return entry_key(schedule_key(sched), sched, own)


def cron_deadline(conf: Any) -> float | None:
    """Celery's ``beat_cron_starting_deadline`` (seconds; None when unset): the catch-up window
    of the app's crontab entries. ConfigurationError when it is not a number of seconds."""
    value = conf.get("beat_cron_starting_deadline") if hasattr(conf, "get") else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigurationError(f"beat_cron_starting_deadline = {value!r}: set it to a number "
                                 "of seconds (or None for no deadline)")
    return float(value)


def beat_schedule_table(app: Any) -> CodeEntries:
    """The app's ``beat_schedule`` as beat holds it (:class:`CodeEntries`), plus the
    result-cleanup entry Celery's beat adds itself (``Scheduler.install_default_entries``) —
    here only for an app that names a result backend: an app without one has nothing to clean
    up."""
    specs: Mapping[str, Mapping[str, Any]] = app.conf.beat_schedule or {}
    if (app.conf.result_backend and app.conf.result_expires
            and not app.backend.supports_autoexpire and BACKEND_CLEANUP not in specs):
        cleanup = {"task": BACKEND_CLEANUP, "schedule": crontab("0", "4", "*"),
                   "options": {"expires": 12 * 3600}}
        specs = ChainMap({BACKEND_CLEANUP: cleanup}, specs)  # type: ignore[arg-type]
    return CodeEntries(app, specs, specs)


def code_entries(app: Any) -> dict[str, LoadedEntry]:
    """Each entry of the app's ``beat_schedule`` (and Celery's cleanup entry, as
    :func:`beat_schedule_table` adds it) as a :class:`LoadedEntry`, for the tools that
    read them once (``schedproj migrate``, ``schedproj entry list``)."""
    return dict(beat_schedule_table(app).items())


def entry_crons_exclusions(schedules: Iterable[tuple[str, BaseSchedule]]) -> list[str]:
    """Sentry Crons patterns for the entries it cannot monitor (intervals that are not whole
    minutes), as :func:`schedproj.telemetry.sentry.crons_exclusions` does for lanes; given
    each entry's name and schedule (:meth:`CodeEntries.schedules`)."""
    return [f"^{re.escape(name)}$" for name, sched in schedules
            if type(sched) is schedule and (sched.seconds < 60 or sched.seconds % 60)]


def schedule_of(definition: EntryDefinition, app: Any) -> BaseSchedule:
    """The Celery schedule of a runtime definition; ValueError naming the fix when Celery
    refuses the cron expression."""
    if definition.cron is not None:
        try:
            return crontab.from_string(definition.cron)
        except Exception as exc:  # celery's crontab parser raises several types
            raise ValueError(f"cron {definition.cron!r} is not a valid crontab ({exc}); "
                             "fields are minute hour day-of-month month day-of-week, "
                             "e.g. '0 3 * * *'") from None
    if definition.at is not None:
        return OneOffSchedule(definition.at, app=app)
    assert definition.every_s is not None
    return schedule(definition.every_s, app=app)


def runtime_entry(name: str, raw: str, app: Any, where: str) -> LoadedEntry:
    """A runtime entry from its stored definition; StateError naming the key when unusable."""
    definition = EntryDefinition.decode(raw, where)
    try:
        check_entry_name(name)
        sched = schedule_of(definition, app)
        zone = app_timezone(app.conf)
        calendar = definition.calendar(zone)
        if calendar is not None and definition.cron is not None \
                and definition.catchup_window_s is None:
            calendar = CalendarTiming(calendar.times, cron_deadline(app.conf))
    except (ValueError, ConfigurationError) as exc:
        raise StateError(where, str(exc)) from None
    sched.app = app  # crontab.from_string builds an app-less schedule: use the app's clock
    own = {key: value for key, value in (("timezone", definition.timezone),
                                         ("catchup_window_s", definition.catchup_window_s))
           if value is not None}
    return LoadedEntry(name, definition.task, sched, args=definition.args,
                       kwargs=definition.kwargs, options=definition.options, source="runtime",
                       tz=app.timezone, raw=raw, zone=zone, calendar=calendar, own=own or None)


class EntriesPass:
    """Work that touches every entry, done :data:`PASS_PAGE` entries a step across ticks, so
    that no tick's entries step grows with their number (:meth:`BeatEntries.take_over`, the
    reconcile, a listing published afresh). Its phases, in order:

    * ``put-back``: the states this beat remembers written back where Redis holds none;
    * ``look``: every entry looked at no later than now (one missing from the due index
      added); those the index holds as due already keep their place ahead of them, so a
      take-over judges the due entries first;
    * ``heal``: every entry missing from the due index added due now, a next look past the
      latest one beat writes brought back to it (the reconcile's);
    * ``listing``: the listing operators read, written afresh;
    * ``states``: every stored state read (remembered, unless remembered already; those of
      entries no longer defined deleted).

    A step Redis refused is tried again at the next tick, from where it was."""

    def __init__(self, phases: Iterable[str] = (),
                 put_back: Iterator[tuple[str, str]] | None = None, *,
                 take_over: bool = False) -> None:
        self.phases = list(phases)
        #: The names the phase under way goes through: the entries defined when it began.
        self.names: list[str] = []
        self.put_back = put_back
        self.take_over = take_over
        #: Where the phase under way is: in ``names``, or the states scan's cursor.
        self.position = self.cursor = 0
        #: The put-back page read but not written yet (tried again after a refusal).
        self.held: list[tuple[str, str]] = []
        self.put_back_count = self.remembered_count = self.added = 0
        #: The listing's pages held an entry.
        self.wrote = False
        self.done: list[str] = []

    @property
    def phase(self) -> str | None:
        return self.phases[0] if self.phases else None

    def next_phase(self) -> None:
        self.done.append(self.phases.pop(0))
        self.position = self.cursor = 0

    def want(self, phase: str, *, again: bool = False) -> None:
        """Have ``phase`` done (``again``: from its start, if it is under way)."""
        if phase not in self.phases:
            self.phases.append(phase)
        elif again and self.phase == phase:
            self.position = self.cursor = 0


class BeatEntries:
    """The entries step of the active beat's tick."""

    def __init__(self, app: Any, store: EntryStore, keys: Keys, token: str,
                 apply_entry: Callable[[EntrySend], None], code: CodeEntries, *,
                 max_look_s: float, reserved: Iterable[str] = ()) -> None:
        self.app, self.store, self.keys, self.token = app, store, keys, token
        self.apply_entry, self.max_look_s = apply_entry, max_look_s
        #: Names taken by lanes: an entry may not share one (verbs and metrics name both).
        self.reserved = frozenset(reserved)
        clash = sorted(name for name in self.reserved if name in code)
        for name in clash:
            logger.error("beat_schedule entry %r has the name of a lane: it is not run; rename "
                         "the entry in beat_schedule", name)
        #: The entries the code defines (compact: see :class:`CodeEntries`).
        self.code = code.without(clash) if clash else code
        #: The runtime entries that run (none shadowed by the code or named like a lane).
        self.runtime: dict[str, LoadedEntry] = {}
        #: The earliest next look in the due index (None: nothing to look at, or unknown).
        self.head: float | None = None
        #: Errors already said (entry -> message), so each is said once per onset.
        self._said: dict[str, str] = {}
        self._refused = ""
        #: A take-over Redis refused, to finish first (None: none pending; else put_back).
        self._take_over_pending: bool | None = None
        #: The periodic reconcile asked for (:meth:`reconcile`).
        self._reconcile = False
        #: The last write found the due index (or the listing) short of the entries defined.
        self._index_short = self._info_short = False
        #: When the index (or the listing) was last healed for being found short.
        self._index_healed_at = self._info_healed_at = float("-inf")
        #: The pass over every entry under way (None: none), a page a step.
        self._pass: EntriesPass | None = None
        #: The last tick left entries work for the next (a pass under way, due entries not
        #: judged yet): beat comes back without its idle floor (:meth:`tick`).
        self.work_left = False

    @property
    def names(self) -> list[str]:
        return sorted([*self.code, *self.runtime])

    @property
    def passing(self) -> bool:
        """A pass over every entry (:class:`EntriesPass`) is under way."""
        return self._pass is not None

    def __len__(self) -> int:
        return len(self.code) + len(self.runtime)

    def defines(self, name: str) -> bool:
        return name in self.runtime or name in self.code

    def entry(self, name: str) -> LoadedEntry | None:
        """The entry named ``name`` (a code entry's made now), None if none is."""
        found = self.runtime.get(name)
        return found if found is not None else self.code.get(name)

    def _info_of(self, name: str) -> str | None:
        """The listing's text of the entry named ``name`` (None if none is)."""
        found = self.runtime.get(name)
        return found.info() if found is not None else self.code.info(name)

    def _info(self) -> Iterator[tuple[str, str]]:
        for name, entry in self.code.items():
            yield name, entry.info()
        for name, entry in self.runtime.items():
            yield name, entry.info()

    # -- taking over ----------------------------------------------------------------------------
    def reconcile(self) -> None:
        """At the next tick, rebuild what is derived from the entries as the lanes' derived
        keys are rebuilt (beat's periodic reconcile, or a derived key found lost): re-read the
        runtime definitions (a changed mark lost with the changed set), add every entry
        missing from the due index due now, and publish the listing afresh."""
        self._reconcile = True

    def take_over(self, now: float, *, put_back: bool = False, current: bool = False) -> None:
        """This beat just became active (or Redis lost state): load the runtime entries, and
        begin the take-over pass (:class:`EntriesPass`, a bounded page of it per tick): with
        ``put_back`` (Redis lost state while this beat ran, and what it remembers is current)
        the states it remembers are written back where Redis holds none; every entry is looked
        at now (those the due index already holds as due keep their place ahead: judged
        first), every stored state read (those of entries no longer defined deleted) and the
        listing published afresh. Without ``current`` (this beat was not the active one a
        moment ago: it stood by, or was frozen past its lock), what it remembers is forgotten
        first, before anything is judged: another beat may have sent due times since."""
        self._take_over_pending = put_back
        try:
            if not current:
                # Another beat may have sent due times since this one last wrote: what it
                # remembers is a past no longer true; judged from, it would send them again.
                self._forget()
            remembered = self._remembered() if put_back else None
            # Before anything is judged: an indexed runtime entry not loaded yet would read
            # as no longer defined, its state deleted.
            self._load_runtime()
            self._pass = EntriesPass(
                # The states last: by then the judging reads (beside the pass) remembered
                # most entries, whose states the states page need not decode again.
                [*(["put-back"] if put_back else []), "look", "listing", "states"],
                remembered, take_over=True)
            self.head = now if len(self) else None
            self._take_over_pending = None
            self._reconcile = self._index_short = self._info_short = False
            if len(self):
                logger.info("beat %s: %d schedule entries (%d from beat_schedule, %d added at "
                            "runtime)", self.token[:8], len(self), len(self.code),
                            len(self.runtime))
        except redis.ResponseError as exc:
            self._say_refused(exc, now)

    def _all_names(self) -> list[str]:
        """Every entry's name, the runtime ones first (few, and a one-off whose instant passed
        while no beat ran is due at once), then the code's in their order."""
        return [*self.runtime, *self.code]

    def _remembered(self) -> Iterator[tuple[str, str]]:
        """The states this beat remembers, encoded: the runtime entries' read now (a reload
        may drop them), the code's as the put-back pages ask for them."""
        runtime = [(name, EntryState(e.last_run_at, e.runs, e.schedule_key).encode())
                   for name, e in self.runtime.items() if e.last_run_at is not None]
        return chain(runtime, ((name, state.encode()) for name, state in self.code.remembered()))

    def _forget(self) -> None:
        """Drop every state remembered (the stored states are read afresh)."""
        self.code.forget()
        for entry in self.runtime.values():
            entry.last_run_at, entry.runs = None, 0

    def _runtime_raws(self) -> dict[str, str]:
        return {name: e.raw for name, e in self.runtime.items()}

    def _remember(self, name: str, state: EntryState, key: str | None = None,
                  force: bool = False) -> None:
        entry = self.runtime.get(name)
        if entry is not None:
            entry.remember(state, force)
        else:
            self.code.remember(name, state, key, force)

    def _remembers(self, name: str) -> bool:
        entry = self.runtime.get(name)
        return entry.last_run_at is not None if entry is not None else self.code.remembers(name)

    def _remember_decoded(self, name: str, raw: str, key: str | None = None) -> None:
        with contextlib.suppress(StateError):
            self._remember(name, EntryState.decode(raw, self.keys.entries), key)

    def _load_runtime(self) -> list[str]:
        """Read the runtime definitions; returns the names that were removed or changed."""
        defs = self.store.definitions()
        gone: list[str] = []
        for name, entry in list(self.runtime.items()):
            if defs.get(name) != entry.raw:
                del self.runtime[name]
                gone.append(name)
        for name, raw in defs.items():
            if name in self.code:
                if self._said.get(name) != "shadowed":
                    self._said[name] = "shadowed"
                    logger.warning("runtime entry %r is also in beat_schedule: the code's "
                                   "definition runs; remove one (`schedproj entry remove %s`)",
                                   name, name)
                continue
            if name in self.runtime or name in self.reserved:
                continue
            try:
                self.runtime[name] = runtime_entry(name, raw, self.app,
                                                   f"{self.keys.entry_defs} field {name!r}")
            except StateError as exc:
                self._say(name, str(exc))
        return gone

    # -- one tick -------------------------------------------------------------------------------
    def tick(self, now: float, changed: bool) -> float | None:
        """Send the entries due now; returns the next look (None: none known).

        ``now`` is the tick's start; the entries are judged on the clock of the moment
        instead, as their schedules' ``is_due`` is: a tick that stalled before this step (a
        slow due-check, Redis frozen) would otherwise record a run seconds before the moment
        its schedule judged it due, and the next tick would find it due again at once.

        A tick does a bounded amount of work whatever the number of entries: at most
        :data:`PASS_STEPS_PER_TICK` pages of a pass over every entry (a take-over, the
        reconcile), then at most :data:`JUDGE_READS_PER_TICK` reads of due entries, each cut
        short once the tick spent :data:`TICK_BUDGET_S`; the rest in the next ticks, so the
        lanes' tick and the beat lock's renewal come between. Work left returns the tick's
        own start (``now`` as given) and sets :attr:`work_left`: beat comes straight back, not
        after sleeping as long as this tick took, nor its idle floor (each such tick moves a
        page of the pass or a read of due entries on: it cannot spin on nothing)."""
        started_at, now = now, max(now, time.time())
        self.work_left = False
        if self._take_over_pending is not None:   # refused before: finish it first
            # (What had to be forgotten was, before anything that Redis could refuse.)
            self.take_over(now, put_back=self._take_over_pending, current=True)
            if self._take_over_pending is not None:
                return self.head
        try:
            if changed or self._reconcile:
                self._reload(now)
            self._repair(now)
            started = time.monotonic()
            self._advance(now, started)
            reads = 0
            while self.head is not None and self.head <= now:
                now = max(now, time.time())
                more = self._tick_once(now)
                reads += 1
                self._repair(now)
                if not more:
                    break
                if reads >= JUDGE_READS_PER_TICK or time.monotonic() - started > TICK_BUDGET_S:
                    # Thousands due at once (a start, a midnight crontab): the rest in the
                    # next ticks.
                    self.work_left = True
                    return started_at
            self._refused = ""
            self.work_left = self._pass is not None
            return started_at if self.work_left else self.head
        except redis.ResponseError as exc:
            self._say_refused(exc, now)
            return self.head

    def _reload(self, now: float) -> None:
        """The definitions changed (or the reconcile asks): re-read the runtime ones."""
        before = self._runtime_raws()
        gone = self._load_runtime()
        if self._runtime_raws() != before:
            self._publish_afresh()
        removed = [n for n in gone if not self.defines(n)]
        if removed:
            self._written(self.store.write(self.token, (), removed=removed))
        # New or changed definitions: in the index, looked at now.
        fresh = {n: now for n, raw in self._runtime_raws().items() if before.get(n) != raw}
        if fresh and not self.store.rebuild_index(self.token, fresh, replace=False):
            raise BeatLockLost("the beat lock was lost while indexing runtime entries")
        self.head = now

    def _repair(self, now: float) -> None:
        """Heal what is derived from the entries: on the reconcile, and when the last write
        found the due index holding fewer entries than beat runs (deleted, or a member
        removed: such an entry would never be looked at again) or the listing not holding
        them all (status and the verbs would not see them). Each is a pass over every entry
        (:class:`EntriesPass`, a page per step): only then, and a found mismatch at most every
        :data:`REPAIR_EVERY_S`. A take-over's pass under way heals both already."""
        reconcile, self._reconcile = self._reconcile, False
        if self._pass is not None and self._pass.take_over:
            return
        phases: list[str] = []
        if reconcile or (self._index_short and now - self._index_healed_at >= REPAIR_EVERY_S):
            self._index_short = False
            if not reconcile:
                self._index_healed_at = now
            phases.append("heal")
        if reconcile or (self._info_short and now - self._info_healed_at >= REPAIR_EVERY_S):
            self._info_short = False
            if not reconcile:
                self._info_healed_at = now
                logger.warning("schedule entries: the listing %s did not hold every entry "
                               "(lost or changed outside beat): published afresh",
                               self.keys.entries_info)
            phases.append("listing")
        for phase in phases:
            if self._pass is None:
                self._pass = EntriesPass()
            self._pass.want(phase)

    def _publish_afresh(self) -> None:
        """Publish the listing again, in the pass under way or in one of its own (one begun
        already starts over: it was written before the change)."""
        if self._pass is None:
            self._pass = EntriesPass()
        self._pass.want("listing", again=True)

    # -- a pass over every entry, a page a step ------------------------------------------------
    def _advance(self, now: float, started: float) -> None:
        """Take the pass under way a few steps on: at least one, at most
        :data:`PASS_STEPS_PER_TICK`, and none more once half the tick's budget is spent (the
        due entries are judged after)."""
        steps = 0
        while self._pass is not None and steps < PASS_STEPS_PER_TICK and (
                steps == 0 or time.monotonic() - started <= TICK_BUDGET_S / 2):
            work = self._pass
            phase = work.phase
            if phase == "put-back":
                self._put_back_page(work)
            elif phase in ("look", "heal"):
                self._index_page(work, now)
            elif phase == "states":
                self._states_page(work)
            elif phase == "listing":
                self._listing_page(work)
            if work.phase is None and self._pass is work:
                self._pass = None
                self._pass_done(work)
            steps += 1

    def _put_back_page(self, work: EntriesPass) -> None:
        """Write back a page of the states remembered, where Redis holds none."""
        page = work.held or list(islice(work.put_back or (), PASS_PAGE))
        work.held = page
        if page:
            work.put_back_count += self.store.put_back(dict(page))
            work.remembered_count += len(page)
            work.held = []
            return
        if work.remembered_count:
            logger.warning("schedule entries: Redis lost their state; put back %d of the %d "
                           "this beat remembers (no due time is sent twice or skipped for "
                           "them)", work.put_back_count, work.remembered_count)
        work.next_phase()

    def _index_page(self, work: EntriesPass, now: float) -> None:
        """A page of entries in the due index: each missing added due now; a next look past
        now (a take-over's "look") or past the latest beat writes (the "heal") brought to it;
        the others, the due among them, keep their place."""
        if work.position == 0:   # the entries defined when it begins
            work.names = self._all_names()
        page = work.names[work.position:work.position + PASS_PAGE]
        latest = now if work.phase == "look" else now + self.max_look_s
        done = self.store.reindex(self.token, page, now, latest)
        if done is None:
            raise BeatLockLost("the beat lock was lost while indexing the schedule entries")
        added, self.head = done
        work.added += added
        work.position += len(page)
        if work.position >= len(work.names):
            work.next_phase()

    def _states_page(self, work: EntriesPass) -> None:
        """A page of the stored states: remembered (a state read counts as remembered: the
        one to put back after a loss), those of entries no longer defined deleted."""
        cursor, page = self.store.states_page(work.cursor)
        gone: list[str] = []
        for name, raw in page:
            if not self.defines(name):
                gone.append(name)
            elif not self._remembers(name):
                # One judged already (the take-over's reads go beside its pass) is remembered
                # from that read or its write, as new as this one or newer (a state written
                # outside beat since is marked and judged again): not decoded a second time.
                self._remember_decoded(name, raw)
        if gone:
            gone.sort()
            logger.info("schedule entries %s are no longer defined: their state is deleted",
                        gone[:20] if len(gone) > 20 else gone)
            self._written(self.store.write(self.token, (), removed=gone))
        work.cursor = cursor
        if cursor == 0:
            work.next_phase()

    def _listing_page(self, work: EntriesPass) -> None:
        """A page of the listing operators read, written to its staging key; the last one
        makes it the listing."""
        if work.position == 0:   # the entries defined when it begins
            work.names = self._all_names()
            work.wrote = False
            self.store.publish_begin()
        page = work.names[work.position:work.position + PASS_PAGE]
        info = [(name, text) for name in page if (text := self._info_of(name)) is not None]
        work.wrote = self.store.publish_page(info) or work.wrote
        work.position += len(page)
        if work.position >= len(work.names):
            self.store.publish_end(work.wrote)
            work.next_phase()

    def _pass_done(self, work: EntriesPass) -> None:
        if work.take_over:
            # The index and the listing now hold every entry: what a write found short while
            # they were built is not a loss.
            self._index_short = self._info_short = False
        elif work.added and "heal" in work.done:
            logger.warning("schedule entries: %d were missing from %s (deleted, or members "
                           "removed): put back, looked at now", work.added,
                           self.keys.entries_due)
            self.store.count_heal()

    def _tick_once(self, now: float) -> bool:
        due = self.store.due(now)
        self._say_broken(due.broken)
        unknown = sorted(name for name in due.forced if not self.defines(name))
        if unknown:
            self.store.done_forcing(unknown)
        # The entries read, made for this pass (a code entry is its spec until a tick needs it).
        looked = {name: entry for name in due.states if (entry := self.entry(name)) is not None}
        keys = {name: entry.schedule_key for name, entry in looked.items()}
        # Celery's is_due asked at ``now``, the instant a run is recorded at, in the app's zone
        # (as its ``app.now()`` reads it), read once for the whole read.
        clock = fixed_clock(datetime.fromtimestamp(now, tz=self.app.timezone))
        for entry in looked.values():
            entry.clock = clock
        # What this beat last read or wrote of each, unless an operator or a tool wrote its
        # state since (marked): a stored state older than that (Redis restored from an older
        # copy) or gone is judged from the memory, never re-sending a due time.
        remembered = {name: (e.last_run_at, e.runs) for name, e in looked.items()
                      if e.last_run_at is not None and name not in due.marked}
        plan = plan_entries(due.states, due.states, looked, keys, now,
                            paused=due.paused, forced=due.forced & looked.keys(),
                            max_look_s=self.max_look_s, where=self.keys.entries,
                            remembered=remembered)
        for entry in looked.values():   # a runtime entry outlives the read
            entry.clock = None
        for name, problem in plan.errors.items():
            self._say(name, problem)
        # Indexed but no longer defined (removed while no beat ran, or a runtime definition
        # that cannot be read): out of the index and the states.
        removed = sorted({*plan.removed, *(n for n in due.states if n not in looked)})
        writes = (*plan.starts, *plan.records, *plan.claims)
        # A claim answers its `schedproj run` in its own write: sent once, even if beat dies
        # right after the send; a claim that does not land leaves it asked.
        result = self._written(self.store.write(
            self.token, writes, looks=plan.looks, removed=removed,
            run_now={c.name: "clear" for c in plan.claims if c.name in due.forced}))
        # Every entry beat runs is in the index and the listing: one missing is healed.
        self._index_short = self._index_short or result.size < len(self)
        self._info_short = self._info_short or result.listed != len(self)
        changed = {c.name for c in writes}
        for change in writes:
            if result.written.get(change.name):
                self._remember(change.name, change.state, keys[change.name], force=True)
        self._record_misses(plan, result, looked)
        # What was read counts as remembered too (a state an operator or `schedproj migrate`
        # wrote since this beat took over is the one to put back after a loss).
        for name, state in plan.judged.items():
            if name not in changed:
                self._remember(name, state, keys[name], force=name in due.marked)
        self._send(plan, result, now, looked, due.forced)
        return due.more

    def _record_misses(self, plan: EntryPlan, result: WriteResult,
                       looked: Mapping[str, LoadedEntry]) -> None:
        """Fire times skipped for their catch-up window, once their state is written (so each
        is counted once): a log line and ``schedproj_missed_runs_total{lane=<entry>}``."""
        counts: dict[str, int] = {}
        for name, (through, count) in plan.missed.items():
            if not result.written.get(name):
                continue
            counts[name] = count
            calendar = looked[name].calendar
            logger.warning(
                "schedule entry %s missed %d fire time(s) through %s: not started within its "
                "catch-up window (%ss); it waits for its next fire time", name, count,
                datetime.fromtimestamp(through, UTC).isoformat(timespec="seconds"),
                None if calendar is None else calendar.catchup_window_s)
        if counts:
            try:
                self.store.count_missed(counts)
            except redis.ResponseError as exc:   # a counters hash of the wrong type
                logger.error("schedule entries: the missed-runs counter is not kept (%s); "
                             "delete %s", exc, self.keys.counters)

    def _send(self, plan: EntryPlan, result: WriteResult, now: float,
              looked: Mapping[str, LoadedEntry], forced: frozenset[str]) -> None:
        lost = [c.name for c in plan.claims if not result.written.get(c.name)]
        if lost:
            logger.info("schedule entries %s changed since read (another beat or an operator): "
                        "not sent this tick", lost)
        for claim in plan.claims:
            if not result.written.get(claim.name):
                continue
            entry = looked[claim.name]
            message = EntrySend(name=entry.name, task=entry.task,
                                schedule=entry.sent_schedule(),
                                args=entry.args, kwargs=entry.kwargs, options=entry.options,
                                last_run_at=datetime.fromtimestamp(claim.state.last_run_at,
                                                                   tz=self.app.timezone),
                                total_run_count=claim.state.total_run_count, app=self.app)
            self.apply_entry(message)
            if message.send_error is not None:
                self._undo(claim, message.send_error, now, entry.schedule_key,
                           asked=claim.name in forced)

    def _undo(self, claim: EntryClaim, error: BaseException, now: float, key: str, *,
              asked: bool) -> None:
        """The send failed after the claim: put back the state it was judged from (a one-off
        seen for the first time stays before its instant), so the due time stays due and the
        next tick tries again (never skipped); a `schedproj run` it answered is asked again."""
        before = claim.before if claim.before is not None else EntryState(
            claim.state.last_run_at, max(claim.state.total_run_count - 1, 0),
            claim.state.schedule_key)
        back = EntryClaim(claim.name, claim.state.encode(), before, now + RESEND_AFTER_S)
        result = self.store.write(self.token, (back,),
                                  run_now={claim.name: "force"} if asked else {})
        self._written(result)
        if result is not None and result.written.get(claim.name):
            self._remember(claim.name, back.state, key, force=True)
        logger.warning("schedule entry %r was not sent (%s: %s); it stays due and is tried "
                       "again in %gs", claim.name, type(error).__name__, error, RESEND_AFTER_S)

    def _written(self, result: WriteResult | None) -> WriteResult:
        if result is None:
            raise BeatLockLost("the beat lock was lost while writing schedule entries")
        self.head = result.head
        return result

    def _say(self, name: str, problem: str) -> None:
        if self._said.get(name) != problem:
            self._said[name] = problem
            logger.error("schedule entry %r: %s", name, problem)

    def _say_broken(self, broken: tuple[str, ...]) -> None:
        """Name the operator sets of the wrong type (read as empty) once per onset."""
        said = " ".join(broken)
        if said and said != self._said.get("\x00broken"):
            logger.error("schedule entries: %s hold(s) a value of the wrong type, read as empty "
                         "(paused entries may run, `schedproj run` waits); delete it: "
                         "`redis-cli DEL %s`", ", ".join(broken), said)
        self._said["\x00broken"] = said

    def _say_refused(self, exc: redis.ResponseError, now: float) -> None:
        """Redis refused an entries command: say so once per onset, and try again in
        :data:`REFUSED_RETRY_S` (healing the due index first, should it be the one of the
        wrong type), so the entries come back once the cause is fixed."""
        if str(exc) != self._refused:
            self._refused = str(exc)
            logger.error("schedule entries: Redis refused a command (%s); one of %s, %s, %s, "
                         "%s, %s holds a value of the wrong type — delete it (or Redis is out "
                         "of memory); tried again every %gs; lanes keep running", exc,
                         self.keys.entries, self.keys.entries_due, self.keys.entry_defs,
                         self.keys.entries_paused, self.keys.entries_run_now, REFUSED_RETRY_S)
        self._index_short = True
        self.head = now + REFUSED_RETRY_S


def entry_summaries(entries: Mapping[str, LoadedEntry]) -> list[dict[str, Any]]:
    """What ``schedproj status`` and ``schedproj lanes`` show of each entry's definition."""
    return [{"name": e.name, "task": e.task, "schedule": e.base_key, "source": e.source}
            for e in sorted(entries.values(), key=lambda e: e.name)]


__all__ = ["BeatEntries", "CeleryTiming", "CodeEntries", "EntrySend", "LoadedEntry",
           "beat_schedule_table", "code_entries", "entry_key", "entry_summaries", "runtime_entry",
           "schedule_key", "schedule_of"]
