"""Lane state as stored in Redis: frozen records with a format version.

Each lane has two records in one Redis hash, one per writer, so beat and workers never
overwrite each other's fields:

* :class:`RunRecord` (field ``<lane>|run``) is written by the worker that runs the lane;
* :class:`SchedRecord` (field ``<lane>|sched``) is written by the active beat.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields, replace
from enum import StrEnum
from typing import Any, TypeVar

from schedproj.core import codec
from schedproj.core.defaults import STATE_VERSION
from schedproj.core.deferrals import Deferral
from schedproj.core.errors import StateError
from schedproj.core.frozen import is_plain
from schedproj.core.lanes import DeferralReason


class Outcome(StrEnum):
    """How a run ended."""

    #: Finished its work.
    COMPLETED = "completed"
    #: Raised (or hit its time limit).
    FAILED = "failed"
    #: Stopped at a checkpoint because it reached the hold cap or lost the lease; backlog left.
    YIELDED = "yielded"
    #: Refused to run (stale or missing lease token); nothing was done.
    SKIPPED = "skipped"
    #: Started, then its lease or in-flight mark lapsed with no end recorded (its worker was
    #: killed, say). Counts as a failure.
    LOST = "lost"


@dataclass(frozen=True)
class RunRecord:
    """What the workers know about a lane: its runs and their outcomes."""

    last_run_at: float | None = None
    last_outcome: Outcome | None = None
    last_reason: str | None = None
    last_task_id: str | None = None
    backlog: int = 0
    runs: int = 0
    failures: int = 0
    running_task_id: str | None = None
    running_since: float | None = None
    running_until: float | None = None
    fence: int = 0
    failing_since: float | None = None
    #: The last message refused without running (recorded skipped): its dispatch is over.
    skipped_task_id: str | None = None
    #: When a family member was added (written once, with the member): a member that never
    #: ran counts as just due from then (staleness ratio 1, growing), not maximally stale, so
    #: a thousand members added at once never all outrank every lane that is overdue.
    since: float | None = None


@dataclass(frozen=True)
class SchedRecord:
    """What the active beat knows about a lane: dispatches, in-flight message, deferral."""

    inflight_task_id: str | None = None
    inflight_deadline: float | None = None
    last_dispatch_at: float | None = None
    dispatches: int = 0
    deferral: Deferral | None = None
    paused: bool = False
    #: A calendar lane's latest fire time skipped for its catch-up window (each counted once).
    missed_through: float | None = None
    #: How many fire times of a calendar lane were skipped for its catch-up window, in all.
    missed: int | None = None


@dataclass(frozen=True)
class LaneState:
    run: RunRecord = field(default_factory=RunRecord)
    sched: SchedRecord = field(default_factory=SchedRecord)


#: The state of a lane with no records yet. One shared instance (the records are frozen): a tick
#: reads it for every lane missing from its states, and building a ``LaneState`` builds both of
#: its records, which cost a tick of a few lanes (the simulator's) a fifth of its time.
EMPTY_STATE = LaneState()


@dataclass(frozen=True)
class LeaseView:
    """The heavy lease as read from Redis."""

    lane: str
    #: Kept out of repr: a traceback's frame variables reach logs and Sentry.
    token: str = field(repr=False)
    fence: int
    granted_at: float
    started_at: float | None = None
    task_id: str | None = None
    #: Who runs under it (set when the run starts): host, process id and worker node name.
    host: str | None = None
    pid: int | None = None
    node: str | None = None
    #: The epoch generation the lease was granted in (see ``lua/epoch.lua``): it starts only
    #: in that generation, so a grant from before Redis lost state never starts after it.
    epoch: int | None = None
    #: Put back by its holder after Redis lost state (see ``lua/lease_renew.lua``): a holder
    #: with a higher fence may take it over while state may still be lost.
    reasserted: bool = False


R = TypeVar("R", RunRecord, SchedRecord, LeaseView)


#: Fields added after the format was first released, left out while unset: a record that does
#: not use them reads the same to a beat or worker of the earlier release (a rolling deploy, a
#: rollback), which refuses fields it does not know.
_OMITTED_WHEN_NONE = ("since", "missed_through", "missed")

#: The run and sched records leave out every field that holds its default (None, 0, false),
#: so a lane that ran costs Redis about half the bytes (a million lanes keep two records
#: each). Every reader of every release fills a missing field with its default (``decode``
#: builds the dataclass; the Lua scripts read ``rec.x or 0``), so an earlier release reads the
#: short records and this one reads the full ones. The in-flight marks were kept while null
#: up to 2a75607, because ``run_finish.lua`` and ``run_cas.lua`` rewrote them in place in the
#: record's text; they now add a mark the text lacks (``lua/record_field.lua``). A worker of
#: that earlier release sends its own encoding (marks written) to its own scripts, so it never
#: meets a record without them where it rewrites one (tests/store/test_run_marks.py).
_DEFAULTS: dict[type, tuple[tuple[str, Any], ...]] = {
    cls: tuple((f.name, f.default) for f in fields(cls)) for cls in (RunRecord, SchedRecord)}

#: A run or sched record's times are written to the microsecond: ``time.time()`` tells no
#: instant finer worth keeping (a double near 1.8e9 resolves about a quarter of one), and the
#: 17 significant digits ``repr`` gives three times in four put a sched record's two times a
#: byte over the 160-byte allocation class (32 bytes a lane). Every release reads them as
#: before (a JSON number). Beat's memo of the records it wrote (``LaneStore._written``) and a
#: worker's (``task._written_runs``) keep the times they encoded, less than half a microsecond
#: from the stored ones; nothing compares one exactly with a stored time. Not rounded:
#: ``missed_through``, a calendar fire time compared exactly with the schedule's own (the next
#: fire strictly after it counts next: rounded down, that fire would be counted again).
TIME_DECIMALS = 6
_NOT_ROUNDED = frozenset({"missed_through"})
_ROUNDED: dict[type, frozenset[str]] = {
    cls: frozenset(f.name for f in fields(cls)
                   if str(f.type).startswith("float") and f.name not in _NOT_ROUNDED)
    for cls in (RunRecord, SchedRecord, Deferral)}


#: The run and sched records' two formats. The long one (version 1, ``STATE_VERSION``) names
#: every field in full; the compact one (version 2) names each by the short key of
#: :data:`SHORT_NAMES`, which costs a lane of a million about 96 bytes less of Redis (each
#: record falls from the 160-byte allocation class to the 112-byte one: docs/performance.md,
#: "Where the bytes go"). A release before the compact format reads version 1 only and refuses
#: a version 2 record with a version error naming its key, never misreads it; this release
#: reads both everywhere (``decode`` and every Lua script that reads or edits a record, through
#: ``lua/record_format.lua``, whose table must equal this one: tests/core/test_records.py).
#: Writers write the compact format only with ``SCHEDPROJ_COMPACT_RECORDS`` on (passed to
#: ``encode`` as ``compact``). The lease and every other stored value keep version 1.
LONG_FORMAT = STATE_VERSION
COMPACT_FORMAT = 2
RECORD_FORMATS = (LONG_FORMAT, COMPACT_FORMAT)

#: The compact format's key of each field: fixed, never reused for another field (a key once
#: released names its field in every later release). Times keep the microsecond, every field
#: that holds its default is still left out, values are written as in the long format (an
#: outcome as its name) and a deferral keeps its own field names inside ``df``.
SHORT_NAMES: dict[type, dict[str, str]] = {
    RunRecord: {
        "last_run_at": "t", "last_outcome": "o", "last_reason": "r", "last_task_id": "i",
        "backlog": "b", "runs": "n", "failures": "f", "running_task_id": "ri",
        "running_since": "rs", "running_until": "ru", "fence": "fe", "failing_since": "fs",
        "skipped_task_id": "si", "since": "s",
    },
    SchedRecord: {
        "inflight_task_id": "i", "inflight_deadline": "d", "last_dispatch_at": "t",
        "dispatches": "n", "deferral": "df", "paused": "p", "missed_through": "mt",
        "missed": "m",
    },
}
_LONG_NAMES: dict[type, dict[str, str]] = {
    cls: {short: name for name, short in table.items()} for cls, table in SHORT_NAMES.items()}


def encode(record: RunRecord | SchedRecord | LeaseView, *, compact: bool = False) -> str:
    """Serialize a record to versioned JSON: the fields ``asdict`` would give, in their order,
    built shallowly (beat encodes thousands of records in a tick that dispatches thousands);
    a run or sched record without the fields that hold their default, in the compact format
    (:data:`SHORT_NAMES`) when ``compact`` (``SCHEDPROJ_COMPACT_RECORDS``; a lease ignores
    it)."""
    data = dict(record.__dict__)
    defaults = _DEFAULTS.get(type(record))
    if defaults is None:
        for name in _OMITTED_WHEN_NONE:
            if name in data and data[name] is None:
                del data[name]
    else:
        rounded = _ROUNDED[type(record)]
        for name, default in defaults:
            value = data[name]
            # ``is``/type checks: 0.0 and False equal 0 but are stored as written (a float
            # field set to 0.0 stays readable as a float; a bool stays a bool).
            if value is default or (value == default and type(value) is type(default)):
                del data[name]
            elif type(value) is float and name in rounded:
                data[name] = round(value, TIME_DECIMALS)
    deferral = data.get("deferral")
    if deferral is not None:
        data["deferral"] = {name: round(value, TIME_DECIMALS)
                            if type(value) is float and name in _ROUNDED[Deferral] else value
                            for name, value in deferral.__dict__.items()}
    short = SHORT_NAMES.get(type(record)) if compact else None
    if short is not None:
        return codec.dumps({short[name]: value for name, value in data.items()}, COMPACT_FORMAT)
    return codec.dumps(data, STATE_VERSION)


def decode(cls: type[R], raw: str | bytes, key: str) -> R:
    """Parse a record, raising :class:`StateError` naming ``key`` on anything unexpected. A run
    or sched record is read in either format (:data:`RECORD_FORMATS`)."""
    return decode_with_format(cls, raw, key)[1]


def decode_with_format(cls: type[R], raw: str | bytes, key: str) -> tuple[int, R]:
    """:func:`decode`, and the format version the record was stored in."""
    long_names = _LONG_NAMES.get(cls)
    version = STATE_VERSION
    if long_names is None:
        data = codec.loads(raw, key, STATE_VERSION)
    else:
        version, data = codec.loads_versioned(raw, key, RECORD_FORMATS)
        if version == COMPACT_FORMAT:
            if not long_names.keys() >= data.keys():
                unknown = set(data).difference(long_names)
                raise StateError(key, f"unknown fields {sorted(unknown)} (compact format)")
            data = {long_names[short]: value for short, value in data.items()}
    # The field names kept as a set: rebuilding it from the field list for every record was
    # a tenth of a decode (every member's record on the tick after a bulk add).
    names = _FIELD_NAMES.get(cls) or _field_names(cls)
    if not names >= data.keys():
        unknown = set(data).difference(names)
        raise StateError(key, f"unknown fields {sorted(unknown)}")
    try:
        return version, _build(cls, data)
    except (TypeError, ValueError) as exc:
        raise StateError(key, f"bad field value ({exc})") from None


def _build(cls: type[R], data: dict[str, Any]) -> R:
    if cls is RunRecord and data.get("last_outcome") is not None:
        data["last_outcome"] = Outcome(data["last_outcome"])
    if cls is SchedRecord and data.get("deferral") is not None:
        data["deferral"] = _build_deferral(data["deferral"])
    blank = _BLANK.get(cls)
    if blank is None:  # a lease: its required fields missing are its ``__init__``'s error
        record = cls(**data)
        _check_types(record)
        return record
    # A run or sched record: every field has a default, which passes the checks, so only the
    # fields stored are checked, and the record is its defaults' ``__dict__`` updated with
    # them (field order kept: ``encode`` writes it as it is). ``__init__`` and a check of all
    # (up to 14) fields cost 3 µs of a 6 µs decode, on every record of a tick after a bulk add.
    annotations = _ANNOTATIONS[cls]
    for name, value in data.items():
        if value is not None and _fault(name, annotations[name], value) is not None:
            _check_types(cls(**data))  # raises the first wrong field in declared order
    record = _new(cls)
    d = record.__dict__
    d.update(blank)
    d.update(data)
    return record


def _build_deferral(raw: Any) -> Deferral:
    if not isinstance(raw, dict):
        raise TypeError(f"deferral must be an object, got {raw!r}")
    missing = {"lane", "reason", "since"} - set(raw)
    if missing:
        raise ValueError(f"deferral lacks {sorted(missing)}")
    d = dict(raw)
    d["reason"] = DeferralReason(d["reason"])
    deferral = Deferral(**d)
    _check_types(deferral)
    return deferral


_NUMERIC = (int, float)
_new = object.__new__


_FIELD_TYPES: dict[type, tuple[tuple[str, str], ...]] = {}


def _field_types(cls: type) -> tuple[tuple[str, str], ...]:
    """(name, annotation) of a record class's fields, computed once per class."""
    known = _FIELD_TYPES.get(cls)
    if known is None:
        known = _FIELD_TYPES[cls] = tuple((f.name, str(f.type)) for f in fields(cls))
    return known


_FIELD_NAMES: dict[type, frozenset[str]] = {}


def _field_names(cls: type) -> frozenset[str]:
    """The names of a record class's fields, worked out once per class."""
    known = _FIELD_NAMES[cls] = frozenset(name for name, _ in _field_types(cls))
    return known


def _check_types(record: RunRecord | SchedRecord | LeaseView | Deferral) -> None:
    """Reject values of the wrong JSON type so garbage never reaches the picker."""
    for name, annotation in _field_types(type(record)):
        fault = _fault(name, annotation, getattr(record, name))
        if fault is not None:
            raise fault


def _fault(name: str, annotation: str, value: Any) -> TypeError | ValueError | None:
    """What is wrong with a field's value, for a field of type ``annotation`` (None: fine)."""
    if value is None:
        return None
    if annotation.startswith(("float", "int")) and (
        isinstance(value, bool) or not isinstance(value, _NUMERIC)
    ):
        return TypeError(f"{name} must be a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        # NaN never compares due and inf never ends: either would wedge or spin the lane.
        return ValueError(f"{name} must be a finite number, got {value!r}")
    if annotation.startswith("str") and not isinstance(value, str):
        return TypeError(f"{name} must be a string, got {value!r}")
    if annotation == "bool" and not isinstance(value, bool):
        return TypeError(f"{name} must be true or false, got {value!r}")
    return None


#: The defaults of the run and sched records, by field in declared order: what ``_build``
#: starts a decoded record from. Only for a plain record whose every field has a plain default
#: (a ``default_factory`` would be shared by every record: such a class takes ``__init__``).
_BLANK: dict[type, dict[str, Any]] = {
    cls: dict(defaults) for cls, defaults in _DEFAULTS.items()
    if is_plain(cls) and all(default is not MISSING for _, default in defaults)}
#: Each field's annotation, by name, of the records ``_build`` builds from their defaults.
_ANNOTATIONS: dict[type, dict[str, str]] = {cls: dict(_field_types(cls)) for cls in _BLANK}


def new_state(run: RunRecord, sched: SchedRecord) -> LaneState:
    """``LaneState(run=run, sched=sched)`` without the frozen dataclass ``__init__`` (reading
    the lanes hash builds one per lane: see ``core.frozen``)."""
    state = _new(LaneState)
    d = state.__dict__
    d["run"] = run
    d["sched"] = sched
    return state


__all__ = [
    "COMPACT_FORMAT",
    "EMPTY_STATE",
    "LONG_FORMAT",
    "RECORD_FORMATS",
    "SHORT_NAMES",
    "LaneState",
    "LeaseView",
    "Outcome",
    "RunRecord",
    "SchedRecord",
    "decode",
    "decode_with_format",
    "encode",
    "new_state",
    "replace",
]
