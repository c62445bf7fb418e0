"""Schedule entries: the app's own periodic tasks (its ``beat_schedule`` and entries added at
runtime), run by the FairScheduler with Celery's semantics, at most once per due time. Pure.

An entry is not a lane: it is sent as an ordinary task, never takes the heavy lease and has no
staleness ratio. What it shares with the lanes is the durable bookkeeping. Its state (when it
was last sent, how often) lives in Redis; the active beat claims a due time by a compare-and-set
on that state under the beat lock before it sends, so two beats, a restarted beat or a beat
that lost its lock can never send one due time twice, and a beat that takes over measures from
the same state and never skips one. When an entry is due is the schedule's own answer
(Celery's ``is_due``), given the last run; this module decides what a tick does with it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from schedproj.core import codec
from schedproj.core.errors import StateError

#: Format version of an entry's state (a field of ``<prefix>:entries``).
ENTRY_STATE_VERSION = 1
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

    def encode(self) -> str:
        return codec.dumps({"last_run_at": self.last_run_at,
                            "total_run_count": self.total_run_count,
                            "schedule_key": self.schedule_key}, ENTRY_STATE_VERSION)

    @classmethod
    def decode(cls, raw: str, where: str) -> EntryState:
        data = codec.loads(raw, where, ENTRY_STATE_VERSION)
        last, count, key = (data.get("last_run_at"), data.get("total_run_count", 0),
                            data.get("schedule_key", ""))
        if not isinstance(last, (int, float)) or isinstance(last, bool) or last < 0:
            raise StateError(where, f"last_run_at must be a time in epoch seconds, not {last!r}")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise StateError(where, f"total_run_count must be a count, not {count!r}")
        if not isinstance(key, str):
            raise StateError(where, f"schedule_key must be a string, not {key!r}")
        return cls(last_run_at=float(last), total_run_count=count, schedule_key=key)


class Timing(Protocol):
    """An entry's schedule, asked at the tick's time: is it due, given its last run, and in how
    many seconds should beat look again (after a run, if due)."""

    def check(self, last_run_at: float) -> tuple[bool, float]: ...


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


def plan_entries(looked: Iterable[str], raw_states: Mapping[str, str | None],
                 timings: Mapping[str, Timing], schedule_keys: Mapping[str, str], now: float,
                 *, paused: frozenset[str] = frozenset(), forced: frozenset[str] = frozenset(),
                 max_look_s: float = RECHECK_S, where: str = "entries") -> EntryPlan:
    """Decide, for each entry looked at, whether it is sent now and when it is looked at next.

    ``raw_states`` holds each entry's stored state as read (None: none stored); the claims
    carry it back for the compare-and-set. An entry with no usable state, or one measured
    from another schedule, starts from ``now`` (sent only if due at once, or forced). A paused
    entry is never sent. Next looks are capped at ``max_look_s`` from now (see
    :data:`RECHECK_S`).
    """
    plan = _PlanBuilder(now, max_look_s)
    for name in dict.fromkeys(looked):
        raw = raw_states.get(name)
        timing = timings.get(name)
        if timing is None:
            if raw is not None:
                plan.removed.append(name)
            continue
        key = schedule_keys.get(name, "")
        state = _usable_state(name, raw, key, where, plan.errors)
        fresh = state is None
        if state is not None:
            plan.judged[name] = state
        judged = state or EntryState(last_run_at=now, schedule_key=key)
        if name in paused:
            plan.wait(name, raw, judged, fresh, PAUSED_LOOK_S)
            continue
        try:
            due, next_s = timing.check(judged.last_run_at)
            next_s = float(next_s) if math.isfinite(float(next_s)) else max_look_s
        except Exception as exc:  # a user's schedule: whatever it raises is its error
            plan.errors[name] = f"schedule of entry {name!r} raised {type(exc).__name__}: {exc}"
            plan.wait(name, raw, judged, fresh, BROKEN_LOOK_S)
            continue
        if due or name in forced:
            sent = EntryState(last_run_at=now, total_run_count=judged.total_run_count + 1,
                              schedule_key=key)
            if not due:
                next_s = _after_forced_run(timing, now, next_s)
            # Compared against what Redis holds (``raw``), whether or not it was usable.
            plan.claims.append(EntryClaim(name, raw, sent, plan.look_in(next_s),
                                          forced=not due))
        else:
            plan.wait(name, raw, judged, fresh, next_s)
    return EntryPlan(claims=tuple(plan.claims), looks=plan.looks, starts=tuple(plan.starts),
                     removed=tuple(plan.removed), errors=plan.errors, judged=plan.judged)


class _PlanBuilder:
    def __init__(self, now: float, max_look_s: float) -> None:
        self.now, self.max_look_s = now, max_look_s
        self.claims: list[EntryClaim] = []
        self.starts: list[EntryClaim] = []
        self.looks: dict[str, float] = {}
        self.removed: list[str] = []
        self.errors: dict[str, str] = {}
        self.judged: dict[str, EntryState] = {}

    def look_in(self, seconds: float) -> float:
        return self.now + min(max(seconds, MIN_LOOK_S), self.max_look_s)

    def wait(self, name: str, raw: str | None, state: EntryState, fresh: bool,
             seconds: float) -> None:
        """Not sent now: a fresh state is written (compared and set) with its next look; a
        stored one only has its next look moved."""
        if fresh:
            self.starts.append(EntryClaim(name, raw, state, self.look_in(seconds)))
        else:
            self.looks[name] = self.look_in(seconds)


def _usable_state(name: str, raw: str | None, key: str, where: str,
                  errors: dict[str, str]) -> EntryState | None:
    """The stored state if it can be judged from: readable and measured from this schedule."""
    if raw is None:
        return None
    try:
        state = EntryState.decode(raw, f"{where} field {name!r}")
    except StateError as exc:
        # Unlike a lane's record, an entry's state is replaced: counting from now never
        # sends a due time twice, and the entry keeps running.
        errors[name] = (f"state of entry {name!r} at {exc.key} was unreadable "
                        f"({exc.problem}); replaced by a state counting from now")
        return None
    return state if state.schedule_key == key else None


def _after_forced_run(timing: Timing, now: float, fallback: float) -> float:
    """A forced run counts as a run (Celery's ``last_run_at`` moves): look again when the
    schedule says, measured from it."""
    try:
        _, next_s = timing.check(now)
        return float(next_s) if math.isfinite(float(next_s)) else fallback
    except Exception:
        return fallback


@dataclass(frozen=True)
class EntryDefinition:
    """A runtime entry as stored (``<prefix>:entries:defs``): a task sent every ``every_s``
    seconds or on a five-field ``cron`` expression, with its arguments and message options."""

    task: str
    every_s: float | None = None
    cron: str | None = None
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)

    def encode(self) -> str:
        return codec.dumps({"task": self.task, "every_s": self.every_s, "cron": self.cron,
                            "args": list(self.args), "kwargs": dict(self.kwargs),
                            "options": dict(self.options)}, ENTRY_DEF_VERSION, sort_keys=True)

    @classmethod
    def decode(cls, raw: str, where: str) -> EntryDefinition:
        data = codec.loads(raw, where, ENTRY_DEF_VERSION)
        try:
            return cls.build(task=data.get("task"), every_s=data.get("every_s"),
                             cron=data.get("cron"), args=data.get("args", []),
                             kwargs=data.get("kwargs", {}), options=data.get("options", {}))
        except ValueError as exc:
            raise StateError(where, str(exc)) from None

    @classmethod
    def build(cls, *, task: Any, every_s: Any = None, cron: Any = None, args: Any = (),
              kwargs: Any = None, options: Any = None) -> EntryDefinition:
        """A checked definition; ValueError saying what is wrong and what to write instead."""
        if not isinstance(task, str) or not task.strip():
            raise ValueError("the task must be a task name, e.g. 'shop.tasks.cleanup'")
        if (every_s is None) == (cron is None):
            raise ValueError("give exactly one schedule: every=SECONDS or cron='M H DoM Mon DoW'")
        if every_s is not None:
            if isinstance(every_s, bool) or not isinstance(every_s, (int, float)) \
                    or not math.isfinite(every_s) or every_s <= 0:
                raise ValueError(f"every must be a positive number of seconds, not {every_s!r}")
            every_s = float(every_s)
        if cron is not None:
            if not isinstance(cron, str) or len(cron.split()) != 5:
                raise ValueError(f"cron must have five fields 'minute hour day-of-month month "
                                 f"day-of-week', e.g. '0 3 * * *', not {cron!r}")
            cron = " ".join(cron.split())
        return cls(task=task.strip(), every_s=every_s, cron=cron,
                   **_checked_payload(args, kwargs, options))


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
    "MIN_LOOK_S",
    "PAUSED_LOOK_S",
    "RECHECK_S",
    "RUNTIME_OPTIONS",
    "EntryClaim",
    "EntryDefinition",
    "EntryPlan",
    "EntryState",
    "Timing",
    "check_entry_name",
    "plan_entries",
]
