"""Schedule entries: the app's own periodic tasks (its ``beat_schedule`` and entries added at
runtime), run by the FairScheduler with Celery's semantics, at most once per due time. Pure.

An entry is not a lane: it is sent as an ordinary task, never takes the heavy lease and has no
staleness ratio. What it shares with the lanes is the durable bookkeeping. Its state (when it
was last sent, how often) lives in Redis; the active beat claims a due time by a compare-and-set
on that state under the beat lock before it sends, so two beats, a restarted beat or a beat
that lost its lock can never send one due time twice, and a beat that takes over measures from
the same state and never skips one. When an entry is due is the schedule's own answer
(Celery's ``is_due``), given the last run — except for an entry on a calendar (a ``crontab``, a
one-off instant): that one is judged by :mod:`schedproj.core.schedules`' rules, as a calendar
lane is (DST by cron's rules, missed fire times coalesced into one run, a catch-up window past
which a fire time is recorded as missed and skipped; :class:`CalendarTiming`). This module
decides what a tick does with it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeGuard

from schedproj.core import codec
from schedproj.core.calendar import CalendarError
from schedproj.core.errors import StateError
from schedproj.core.schedules import (
    CronFireTimes,
    FireTimes,
    OneOffFireTimes,
    calendar_due_at,
    missed_fires,
)

#: Format version of an entry's state (a field of ``<prefix>:entries``).
ENTRY_STATE_VERSION = 1
#: What separates, in a schedule key, the schedule from the settings that change when it fires
#: (a crontab's own zone and catch-up window: ``on_celery.entries.entry_key``).
KEY_SETTINGS = " | "
#: The schedule-key format a state is written with: 2 since keys name a crontab's own zone
#: and window. A state of format 1 (written before, ``"key_format"`` absent) whose key is the
#: schedule alone still measures from that schedule with whatever settings it has now: an
#: upgrade does not make such entries count from now (their state is rewritten as format 2
#: at their first look).
KEY_FORMAT = 2
#: Format version of a runtime entry's definition (a field of ``<prefix>:entries:defs``).
ENTRY_DEF_VERSION = 1
#: A paused entry is looked at again this often (seconds): a resume marks it for a look at
#: once; this only bounds how long a lost mark could delay it.
PAUSED_LOOK_S = 60.0
#: After a schedule raised, the entry is looked at again this often (seconds).
BROKEN_LOOK_S = 60.0
#: Every entry is looked at again at least this often (seconds), whatever its schedule says:
#: a custom schedule's estimate may be early or late, the wall clock may jump. Celery's beat
#: re-checks every entry each loop; here a look costs a read, so once an hour bounds the
#: error while a daily entry costs 24 reads a day.
RECHECK_S = 3600.0
#: A schedule that says "not due, look again in 0 s" is looked at no sooner than this: a
#: custom schedule must not spin beat.
MIN_LOOK_S = 0.1
#: The ``options`` a runtime entry may carry: those of ``Task.apply_async`` that route or
#: shape one message. Anything else is refused with this list.
RUNTIME_OPTIONS = frozenset({"queue", "routing_key", "exchange", "priority", "expires",
                             "headers", "time_limit", "soft_time_limit", "ignore_result"})
#: A name an operator can type and Redis, Prometheus labels and logs carry unquoted.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@/-]{0,199}$")


@dataclass(frozen=True)
class EntryState:
    """What Redis keeps of one entry. ``last_run_at`` is when it was last sent, or, before its
    first run, when beat first saw this schedule (Celery's rule: a new entry counts from
    now, so it is never sent at once just for being new)."""

    last_run_at: float
    total_run_count: int = 0
    #: Which schedule the state measures from: a changed schedule starts afresh.
    schedule_key: str = ""
    #: A calendar entry's latest fire time skipped for its catch-up window (None: none), so
    #: each missed fire time is counted once.
    missed_through: float | None = None
    #: How many fire times it skipped so, in all.
    missed: int = 0
    #: Its ``schedule_key``'s format (:data:`KEY_FORMAT`; 1: written before keys named zones).
    key_format: int = KEY_FORMAT

    def encode(self) -> str:
        payload: dict[str, Any] = {"last_run_at": self.last_run_at,
                                   "total_run_count": self.total_run_count,
                                   "schedule_key": self.schedule_key}
        if self.missed_through is not None:   # only calendar entries that missed carry these
            payload.update(missed_through=self.missed_through, missed=self.missed)
        # Always the current format: an older beat reading it ignores the field.
        payload["key_format"] = KEY_FORMAT
        return codec.dumps(payload, ENTRY_STATE_VERSION)

    @classmethod
    def decode(cls, raw: str, where: str) -> EntryState:
        data = codec.loads(raw, where, ENTRY_STATE_VERSION)
        last, count, key = (data.get("last_run_at"), data.get("total_run_count", 0),
                            data.get("schedule_key", ""))
        through, missed = data.get("missed_through"), data.get("missed", 0)
        key_format = data.get("key_format", 1)
        if not _is_time(last):
            raise StateError(where, f"last_run_at must be a time in epoch seconds, not {last!r}")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise StateError(where, f"total_run_count must be a count, not {count!r}")
        if not isinstance(key, str):
            raise StateError(where, f"schedule_key must be a string, not {key!r}")
        if through is not None and not _is_time(through):
            raise StateError(where, f"missed_through must be a time or null, not {through!r}")
        if not isinstance(missed, int) or isinstance(missed, bool) or missed < 0:
            raise StateError(where, f"missed must be a count, not {missed!r}")
        if not isinstance(key_format, int) or isinstance(key_format, bool):
            raise StateError(where, f"key_format must be an integer, not {key_format!r}")
        return cls(last_run_at=float(last), total_run_count=count, schedule_key=key,
                   missed_through=None if through is None else float(through), missed=missed,
                   key_format=key_format)

    def measures_from(self, key: str) -> bool:
        """Whether this state measures from the schedule whose key is ``key``: the same key,
        or a format-1 key naming the same schedule (:data:`KEY_FORMAT`)."""
        return self.schedule_key == key or (
            self.key_format < 2 and key.startswith(self.schedule_key + KEY_SETTINGS)
            and KEY_SETTINGS not in self.schedule_key)


def _is_time(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class Verdict:
    """A calendar entry judged at an instant: sent now or not, when to look again (seconds),
    and the fire times it newly missed (``(latest, how many)``, or None)."""

    due: bool
    next_s: float
    missed: tuple[float, int] | None = None


@dataclass(frozen=True)
class CalendarTiming:
    """An entry on a calendar — a Celery ``crontab`` in its time zone, or a one-off instant —
    judged by the rules calendar lanes follow (:mod:`schedproj.core.schedules`), at the tick's
    ``now``: due once a fire time has passed since its last run; however many passed while
    nothing ran, one run (coalesced); with ``catchup_window_s`` (Celery's
    ``beat_cron_starting_deadline`` for a crontab entry, or the entry's own), a fire time not
    started within that many seconds is skipped and counted as missed, and the entry waits
    for its next fire time."""

    times: FireTimes
    catchup_window_s: float | None = None

    def counts_from(self, now: float) -> float:
        """Where a new entry's state starts. Celery's rule, a new entry counts from now (it is
        not sent for being new), holds for a crontab; a one-off instant was asked for before
        it came, so it counts from just before its instant and runs even if beat first reads
        it late (within its catch-up window, if it has one)."""
        if isinstance(self.times, OneOffFireTimes):
            return min(now, math.nextafter(self.times.at, -math.inf))
        return now

    def judge(self, state: EntryState, now: float) -> Verdict:
        window = self.catchup_window_s
        missed = missed_fires(self.times, state.last_run_at, state.missed_through, now, window)
        due_at = calendar_due_at(self.times, state.last_run_at, now, window)
        if due_at <= now:
            # After a run now, the next look is the first fire time after now.
            return Verdict(True, self.times.next_fire(now) - now, missed)
        return Verdict(False, due_at - now, missed)

    def check(self, last_run_at: float, now: float) -> tuple[bool, float]:
        """:class:`Timing`'s answer, at ``now``."""
        verdict = self.judge(EntryState(last_run_at), now)
        return verdict.due, verdict.next_s


class Timing(Protocol):
    """An entry's schedule, asked at the tick's time: is it due, given its last run, and in how
    many seconds should beat look again (after a run, if due). A timing on a calendar also has
    a ``calendar`` attribute (a :class:`CalendarTiming`, or None): :func:`plan_entries` then
    judges it by the calendar rules at the tick's ``now`` instead of asking ``check``."""

    def check(self, last_run_at: float) -> tuple[bool, float]: ...


def calendar_of(timing: Timing) -> CalendarTiming | None:
    """The timing's calendar, if it is on one (see :class:`Timing`)."""
    found = getattr(timing, "calendar", None)
    return found if isinstance(found, CalendarTiming) else None


@dataclass(frozen=True)
class EntryClaim:
    """One due time claimed: the state read (compared and set, so only one beat sends it) and
    the state written."""

    name: str
    expected: str | None
    state: EntryState
    next_look: float
    #: Sent because an operator asked (``schedproj run``), not because it was due.
    forced: bool = False
    #: The state it was judged from (None: a start or record, not a claim): what an undone
    #: claim puts back, so the due time stays due.
    before: EntryState | None = None


@dataclass(frozen=True)
class EntryPlan:
    """What one tick does with the entries it looked at."""

    claims: tuple[EntryClaim, ...] = ()
    #: Entries not sent: when to look again (epoch seconds).
    looks: Mapping[str, float] = field(default_factory=dict)
    #: Entries seen for the first time or whose schedule changed: the state they start from,
    #: compared and set like a claim (``expected``, ``state``), sent nothing.
    starts: tuple[EntryClaim, ...] = ()
    #: Entries in Redis that no longer exist (removed from the code or at runtime).
    removed: tuple[str, ...] = ()
    #: Entry -> why it could not be judged (unreadable state, a schedule that raised).
    errors: Mapping[str, str] = field(default_factory=dict)
    #: The stored states judged from, decoded (those readable and measured from the entry's
    #: schedule): what beat remembers of the entries it did not change, without a second
    #: decoding.
    judged: Mapping[str, EntryState] = field(default_factory=dict)
    #: Calendar entries not sent whose state records newly missed fire times: compared and set
    #: like a claim, sent nothing.
    records: tuple[EntryClaim, ...] = ()
    #: Entry -> the fire times it newly missed in this plan, ``(latest, how many)`` (in its
    #: claim's or record's state): counted and logged once the write lands.
    missed: Mapping[str, tuple[float, int]] = field(default_factory=dict)


def plan_entries(looked: Iterable[str], raw_states: Mapping[str, str | None],
                 timings: Mapping[str, Timing], schedule_keys: Mapping[str, str], now: float,
                 *, paused: frozenset[str] = frozenset(), forced: frozenset[str] = frozenset(),
                 max_look_s: float = RECHECK_S, where: str = "entries",
                 remembered: Mapping[str, tuple[float, int]] = {}) -> EntryPlan:
    """Decide, for each entry looked at, whether it is sent now and when it is looked at next.

    ``raw_states`` holds each entry's stored state as read (None: none stored); the claims
    carry it back for the compare-and-set. An entry with no state stored, or one measured
    from another schedule, starts from ``now`` (sent only if due at once, or forced; a one-off
    instant starts from just before its instant, :meth:`CalendarTiming.counts_from`); one whose
    state is unreadable starts from ``now`` whatever its schedule (it ran before: a spent
    one-off stays spent). ``remembered`` holds, by entry, the last run and run count the
    caller last read or wrote under this schedule (the beat's memory): where the stored state
    is missing, unreadable or older (Redis restored from an older copy), the entry is judged
    from what is remembered and that is written back, so no due time is sent twice. A paused
    entry is never sent. A calendar entry's newly missed fire times are recorded in its state.
    Next looks are capped at ``max_look_s`` from now (see :data:`RECHECK_S`).
    """
    plan = _PlanBuilder(now, max_look_s)
    for name in dict.fromkeys(looked):
        raw = raw_states.get(name)
        timing = timings.get(name)
        if timing is None:
            if raw is not None:
                plan.removed.append(name)
            continue
        _plan_one(plan, name, raw, timing, schedule_keys.get(name, ""), where,
                  paused=name in paused, forced=name in forced, memory=remembered.get(name))
    return EntryPlan(claims=tuple(plan.claims), looks=plan.looks, starts=tuple(plan.starts),
                     removed=tuple(plan.removed), errors=plan.errors, judged=plan.judged,
                     records=tuple(plan.records), missed=plan.missed)


def _plan_one(plan: _PlanBuilder, name: str, raw: str | None, timing: Timing, key: str,
              where: str, *, paused: bool, forced: bool,
              memory: tuple[float, int] | None = None) -> None:
    now = plan.now
    state, unreadable = _usable_state(name, raw, key, where, plan.errors)
    fresh = state is None
    # Written back even if not sent: the stored state is behind what was remembered, or its
    # key is of the earlier format (rewritten in the current one).
    behind = False
    if state is not None:
        plan.judged[name] = state
        if state.schedule_key != key or state.key_format < KEY_FORMAT:
            state, behind = replace(state, schedule_key=key, key_format=KEY_FORMAT), True
    if memory is not None and ((state is None and (raw is None or unreadable)) or (
            state is not None and memory[0] > state.last_run_at)):
        last, runs = memory
        state = (EntryState(last, runs, key) if state is None else
                 replace(state, last_run_at=last, total_run_count=max(runs,
                                                                      state.total_run_count)))
        behind = behind or not fresh
        if unreadable:
            plan.errors[name] = plan.errors[name].replace(
                "a state counting from now", "the state this beat remembers")
    judged = state or EntryState(now, schedule_key=key)
    try:
        calendar = calendar_of(timing)   # a calendar the entry names wrongly raises here
        if calendar is not None and state is None and not unreadable:
            judged = replace(judged, last_run_at=calendar.counts_from(now))
        if paused:
            plan.wait(name, raw, judged, fresh, PAUSED_LOOK_S, changed=behind)
            return
        verdict = _judge(timing, calendar, judged, now, plan.max_look_s)
    except Exception as exc:  # a user's schedule: whatever it raises is its error
        plan.errors[name] = f"schedule of entry {name!r} raised {type(exc).__name__}: {exc}"
        plan.wait(name, raw, judged, fresh, BROKEN_LOOK_S, changed=behind)
        return
    if verdict.missed is not None:
        through, count = verdict.missed
        judged = replace(judged, missed_through=through, missed=judged.missed + count)
        plan.missed[name] = verdict.missed
    if verdict.due or forced:
        sent = replace(judged, last_run_at=now, total_run_count=judged.total_run_count + 1)
        next_s = verdict.next_s if verdict.due else _after_forced_run(
            timing, calendar, now, verdict.next_s)
        # Compared against what Redis holds (``raw``), whether or not it was usable.
        plan.claims.append(EntryClaim(name, raw, sent, plan.look_in(next_s),
                                      forced=not verdict.due, before=judged))
    else:
        plan.wait(name, raw, judged, fresh, verdict.next_s,
                  changed=behind or verdict.missed is not None)


def _judge(timing: Timing, calendar: CalendarTiming | None, state: EntryState, now: float,
           max_look_s: float) -> Verdict:
    if calendar is not None:
        verdict = calendar.judge(state, now)
    else:
        due, next_s = timing.check(state.last_run_at)
        verdict = Verdict(bool(due), float(next_s))
    return verdict if math.isfinite(verdict.next_s) else replace(verdict, next_s=max_look_s)


class _PlanBuilder:
    def __init__(self, now: float, max_look_s: float) -> None:
        self.now, self.max_look_s = now, max_look_s
        self.claims: list[EntryClaim] = []
        self.starts: list[EntryClaim] = []
        self.records: list[EntryClaim] = []
        self.looks: dict[str, float] = {}
        self.removed: list[str] = []
        self.errors: dict[str, str] = {}
        self.judged: dict[str, EntryState] = {}
        self.missed: dict[str, tuple[float, int]] = {}

    def look_in(self, seconds: float) -> float:
        return self.now + min(max(seconds, MIN_LOOK_S), self.max_look_s)

    def wait(self, name: str, raw: str | None, state: EntryState, fresh: bool,
             seconds: float, *, changed: bool = False) -> None:
        """Not sent now: a fresh state is written (compared and set) with its next look, as is
        a ``changed`` one (missed fire times recorded); a stored one only has its next look
        moved."""
        if fresh:
            self.starts.append(EntryClaim(name, raw, state, self.look_in(seconds)))
        elif changed:
            self.records.append(EntryClaim(name, raw, state, self.look_in(seconds)))
        else:
            self.looks[name] = self.look_in(seconds)


def _usable_state(name: str, raw: str | None, key: str, where: str,
                  errors: dict[str, str]) -> tuple[EntryState | None, bool]:
    """The stored state if it can be judged from (readable and measured from this schedule),
    and whether it was unreadable."""
    if raw is None:
        return None, False
    try:
        state = EntryState.decode(raw, f"{where} field {name!r}")
    except StateError as exc:
        # Unlike a lane's record, an entry's state is replaced: counting from now never
        # sends a due time twice, and the entry keeps running.
        errors[name] = (f"state of entry {name!r} at {exc.key} was unreadable "
                        f"({exc.problem}); replaced by a state counting from now")
        return None, True
    return (state if state.measures_from(key) else None), False


def _after_forced_run(timing: Timing, calendar: CalendarTiming | None, now: float,
                      fallback: float) -> float:
    """A forced run counts as a run (Celery's ``last_run_at`` moves): look again when the
    schedule says, measured from it."""
    try:
        if calendar is not None:
            next_s = calendar.judge(EntryState(now), now).next_s
        else:
            _, next_s = timing.check(now)
        return float(next_s) if math.isfinite(float(next_s)) else fallback
    except Exception:
        return fallback


@dataclass(frozen=True)
class EntryDefinition:
    """A runtime entry as stored (``<prefix>:entries:defs``): a task sent every ``every_s``
    seconds, on a five-field ``cron`` expression (in ``timezone``, default the app's), or once
    at the instant ``at`` (epoch seconds), with its arguments and message options. A cron or
    one-off entry may have a ``catchup_window_s`` (:class:`CalendarTiming`)."""

    task: str
    every_s: float | None = None
    cron: str | None = None
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    at: float | None = None
    timezone: str | None = None
    catchup_window_s: float | None = None

    def encode(self) -> str:
        payload: dict[str, Any] = {"task": self.task, "every_s": self.every_s,
                                   "cron": self.cron, "args": list(self.args),
                                   "kwargs": dict(self.kwargs), "options": dict(self.options)}
        # The calendar fields only when set: a definition without them reads as before.
        for name in ("at", "timezone", "catchup_window_s"):
            if getattr(self, name) is not None:
                payload[name] = getattr(self, name)
        return codec.dumps(payload, ENTRY_DEF_VERSION, sort_keys=True)

    @classmethod
    def decode(cls, raw: str, where: str) -> EntryDefinition:
        data = codec.loads(raw, where, ENTRY_DEF_VERSION)
        try:
            return cls.build(task=data.get("task"), every_s=data.get("every_s"),
                             cron=data.get("cron"), at=data.get("at"),
                             timezone=data.get("timezone"),
                             catchup_window_s=data.get("catchup_window_s"),
                             args=data.get("args", []), kwargs=data.get("kwargs", {}),
                             options=data.get("options", {}))
        except ValueError as exc:
            raise StateError(where, str(exc)) from None

    @classmethod
    def build(cls, *, task: Any, every_s: Any = None, cron: Any = None, at: Any = None,
              timezone: Any = None, catchup_window_s: Any = None, args: Any = (),
              kwargs: Any = None, options: Any = None) -> EntryDefinition:
        """A checked definition; ValueError saying what is wrong and what to write instead."""
        if not isinstance(task, str) or not task.strip():
            raise ValueError("the task must be a task name, e.g. 'shop.tasks.cleanup'")
        if sum(x is not None for x in (every_s, cron, at)) != 1:
            raise ValueError("give exactly one schedule: every=SECONDS, cron='M H DoM Mon DoW' "
                             "or at=INSTANT")
        if every_s is not None:
            every_s = _positive_seconds("every", every_s)
            if timezone is not None or catchup_window_s is not None:
                raise ValueError("timezone and catchup_window_s apply to a cron or one-off "
                                 "entry, not to every=SECONDS")
        if cron is not None:
            cron = _checked_cron(cron, timezone)
        elif timezone is not None:
            raise ValueError("timezone applies to a cron entry (a one-off instant carries its "
                             "own offset)")
        if at is not None:
            at = _instant(at)
        if catchup_window_s is not None:
            catchup_window_s = _positive_seconds("catchup_window_s", catchup_window_s)
        return cls(task=task.strip(), every_s=every_s, cron=cron, at=at, timezone=timezone,
                   catchup_window_s=catchup_window_s, **_checked_payload(args, kwargs, options))

    def calendar(self, default_zone: str) -> CalendarTiming | None:
        """The calendar a cron or one-off definition runs on (None for ``every``)."""
        if self.cron is not None:
            return CalendarTiming(CronFireTimes(self.cron, self.timezone or default_zone),
                                  self.catchup_window_s)
        if self.at is not None:
            return CalendarTiming(OneOffFireTimes(self.at), self.catchup_window_s)
        return None


def _positive_seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
    return float(value)


def _instant(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise ValueError(f"at must be an instant in epoch seconds, not {value!r}")
    return float(value)


def _checked_cron(cron: Any, timezone: Any) -> str:
    if not isinstance(cron, str) or len(cron.split()) != 5:
        raise ValueError(f"cron must have five fields 'minute hour day-of-month month "
                         f"day-of-week', e.g. '0 3 * * *', not {cron!r}")
    spelled = " ".join(cron.split())
    if timezone is not None:
        if not isinstance(timezone, str):
            raise ValueError(f"timezone must be an IANA zone name, not {timezone!r}")
        try:
            CronFireTimes(spelled, timezone)
        except CalendarError as exc:
            raise ValueError(str(exc)) from None
    return spelled


def _checked_payload(args: Any, kwargs: Any, options: Any) -> dict[str, Any]:
    """A runtime entry's arguments and message options, checked."""
    if not isinstance(args, (list, tuple)):
        raise ValueError(f"args must be a JSON list, not {type(args).__name__}")
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ValueError("kwargs must be a JSON object with string keys")
    options = {} if options is None else options
    if not isinstance(options, dict):
        raise ValueError("options must be a JSON object")
    unknown = sorted(set(options) - RUNTIME_OPTIONS)
    if unknown:
        raise ValueError(f"unknown message option(s) {unknown}; a runtime entry may set "
                         f"{sorted(RUNTIME_OPTIONS)}")
    return {"args": tuple(args), "kwargs": dict(kwargs), "options": dict(options)}


def check_entry_name(name: str) -> str:
    """An entry name operators can type; ValueError naming the rule otherwise."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"entry name {name!r}: use letters, digits and _ . : @ / - (starting "
                         "with a letter or digit, at most 200 characters)")
    return name


__all__ = [
    "BROKEN_LOOK_S",
    "ENTRY_DEF_VERSION",
    "ENTRY_STATE_VERSION",
    "KEY_FORMAT",
    "KEY_SETTINGS",
    "MIN_LOOK_S",
    "PAUSED_LOOK_S",
    "RECHECK_S",
    "RUNTIME_OPTIONS",
    "CalendarTiming",
    "EntryClaim",
    "EntryDefinition",
    "EntryPlan",
    "EntryState",
    "Timing",
    "Verdict",
    "calendar_of",
    "check_entry_name",
    "plan_entries",
]
