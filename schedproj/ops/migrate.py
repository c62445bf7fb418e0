"""Switching an app's beat_schedule to ``-S fair`` without a re-run or a gap
(``schedproj migrate``): read when each entry last ran under the old scheduler — Celery's
``PersistentScheduler`` (its ``celerybeat-schedule`` shelve file) or celery-redbeat (its keys
in Redis) — and write it as the entry's state, so the first FairScheduler judges each entry
from the same last run the old beat would have.

Reading the old schedule and deciding what to import are kept apart from writing: the readers
return plain values (``OldSchedule``), :func:`plan_migration` decides (pure), and
:func:`write_migration` writes the plan in one transaction, refused while a FairScheduler beat
holds the beat lock (beat owns the entries' state while it runs).
"""

from __future__ import annotations

import dbm
import json
import shelve
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import redis

from schedproj.core.entries import EntryState
from schedproj.core.errors import SchedprojError, StateError
from schedproj.on_celery.entries import (
    BACKEND_CLEANUP,
    LoadedEntry,
    code_entries,
    runtime_entry,
)
from schedproj.store.entry_store import EntryStore
from schedproj.store.protocol import Keys

#: The key prefix celery-redbeat uses unless ``redbeat_key_prefix`` says otherwise.
REDBEAT_PREFIX = "redbeat:"
#: Suffixes a dbm module adds to the name it is given (Celery's PersistentScheduler knows the
#: same list): an operator may name the file with one.
DBM_SUFFIXES = (".db", ".dat", ".dir", ".bak")
#: Hashes read per round trip from redbeat.
REDBEAT_BATCH = 500


class MigrationError(SchedprojError):
    """The old schedule cannot be read, or the import cannot be written; says the fix."""


class BeatActive(MigrationError):
    """A FairScheduler beat holds the beat lock: it owns the entries' state."""


class StateMoved(MigrationError):
    """schedproj's state of an entry changed between the read and the write."""


@dataclass(frozen=True)
class OldRun:
    """What the old scheduler recorded of one entry."""

    #: When it last ran (epoch seconds); None when the old scheduler has no last run for it
    #: and would send it at once (redbeat without a ``last_run_at``).
    last_run_at: float | None
    total_run_count: int = 0
    #: Something the operator should know about this entry ("" when nothing).
    note: str = ""
    #: The old scheduler does not send it (redbeat's ``enabled: false``).
    disabled: bool = False


@dataclass(frozen=True)
class OldSchedule:
    """An old scheduler's record of its entries, as read."""

    #: Where it was read from, for messages ("celerybeat-schedule file X", "redbeat keys ...").
    source: str
    runs: Mapping[str, OldRun]
    #: Entry -> why its record cannot be read.
    unreadable: Mapping[str, str] = field(default_factory=dict)
    #: What the file says it was written under (PersistentScheduler only): time zone and
    #: ``enable_utc``; None when not recorded.
    timezone: str | None = None
    utc_enabled: bool | None = None


@dataclass(frozen=True)
class Imported:
    """One entry's state to write, and the state it replaces (compared and set)."""

    name: str
    state: EntryState
    expected: str | None
    note: str = ""
    #: Paused in schedproj too: the old scheduler had it disabled.
    pause: bool = False


@dataclass(frozen=True)
class Skipped:
    name: str
    why: str


@dataclass(frozen=True)
class MigrationPlan:
    imports: tuple[Imported, ...] = ()
    skipped: tuple[Skipped, ...] = ()


# -- reading a celerybeat-schedule file ------------------------------------------------------
def epoch_of(when: datetime) -> float:
    """Epoch seconds of a stored ``last_run_at``. A naive one is UTC: Celery's schedules read
    it so (``maybe_make_aware``), which is what its beat would have judged by."""
    if when.tzinfo is None or when.utcoffset() is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def read_beat_file(path: str) -> OldSchedule:
    """The entries of a PersistentScheduler file (``celerybeat-schedule``), opened read-only.
    Unpickling it imports the classes it names (schedules, entries), as Celery's beat does:
    run it where the old beat's code imports."""
    name = _dbm_name(path)
    try:
        with shelve.open(name, flag="r") as shelf:
            found = "entries" in shelf
            raw_entries = shelf["entries"] if found else None
            tz, utc = shelf.get("tz"), shelf.get("utc_enabled")
    except dbm.error as exc:
        raise MigrationError(f"cannot open {path} ({exc}). Fix: run migrate with a Python "
                             "that has the dbm module the old beat wrote the file with "
                             "(Debian: python3-gdbm), e.g. the old beat's own") from None
    except Exception as exc:  # unpickling: whatever the stored classes raise
        raise MigrationError(f"cannot read the entries of {path} ({type(exc).__name__}: "
                             f"{exc}). Fix: run migrate with -A naming the old beat's app, "
                             "in its environment, so the classes the file names import") \
            from None
    if not found:
        raise MigrationError(f"{path} holds no 'entries': not a celerybeat-schedule file, or "
                             "one the old beat never wrote to. Fix: name the file `celery "
                             "beat` ran with (its -s/--schedule option)")
    if not isinstance(raw_entries, Mapping):
        raise MigrationError(f"{path}: 'entries' is a {type(raw_entries).__name__}, not the "
                             "mapping Celery's PersistentScheduler writes")
    runs: dict[str, OldRun] = {}
    unreadable: dict[str, str] = {}
    for entry_name, entry in raw_entries.items():
        try:
            runs[str(entry_name)] = _file_run(entry)
        except ValueError as exc:
            unreadable[str(entry_name)] = str(exc)
    return OldSchedule(source=f"celerybeat-schedule file {path}", runs=runs,
                       unreadable=unreadable, timezone=tz if isinstance(tz, str) else None,
                       utc_enabled=utc if isinstance(utc, bool) else None)


def _dbm_name(path: str) -> str:
    """The name to open: the path as given, or without the suffix its dbm module added."""
    kind = dbm.whichdb(path)
    if kind is None:
        for suffix in DBM_SUFFIXES:
            if path.endswith(suffix) and dbm.whichdb(path[:-len(suffix)]) is not None:
                return path[:-len(suffix)]
        raise MigrationError(f"no celerybeat-schedule file at {path}. Fix: name the file "
                             "`celery beat` ran with (-s/--schedule; by default "
                             "celerybeat-schedule in the directory it started in)")
    if kind == "":
        raise MigrationError(f"{path} is not a dbm file: not a celerybeat-schedule file")
    return path


def _file_run(entry: Any) -> OldRun:
    last = getattr(entry, "last_run_at", None)
    count = getattr(entry, "total_run_count", 0) or 0
    if not isinstance(last, datetime):
        raise ValueError(f"its last_run_at is {last!r}, not a time")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ValueError(f"its total_run_count is {count!r}, not a count")
    return OldRun(epoch_of(last), count)


def file_notes(old: OldSchedule, app: Any) -> list[str]:
    """What the operator should know about a file before trusting it."""
    notes = []
    conf_tz, conf_utc = app.conf.timezone, app.conf.enable_utc
    if old.timezone != conf_tz or (old.utc_enabled is not None
                                   and old.utc_enabled != conf_utc):
        notes.append(f"the file was written with timezone={old.timezone!r}, enable_utc="
                     f"{old.utc_enabled!r}; the app now has timezone={conf_tz!r}, enable_utc="
                     f"{conf_utc!r}. Celery's beat would reset these times; migrate imports "
                     "them as the instants they are, and -S fair reads crontab fields in the "
                     "app's time zone")
    return notes


# -- reading celery-redbeat's keys -----------------------------------------------------------
def read_redbeat(client: redis.Redis, prefix: str, names: Iterable[str]) -> OldSchedule:
    """The entries redbeat keeps under ``prefix`` (each a hash ``<prefix><name>`` with
    ``definition`` and ``meta``): those its schedule (``<prefix>:schedule``) and static set
    (``<prefix>:statics``) list, and ``names`` (the app's entries) wherever they are."""
    wanted = set(names)
    for key in client.zrange(f"{prefix}:schedule", 0, -1):
        if str(key).startswith(prefix):
            wanted.add(str(key)[len(prefix):])
    wanted.update(map(str, client.smembers(f"{prefix}:statics")))
    ordered = sorted(wanted)
    runs: dict[str, OldRun] = {}
    unreadable: dict[str, str] = {}
    for i in range(0, len(ordered), REDBEAT_BATCH):
        batch = ordered[i:i + REDBEAT_BATCH]
        pipe = client.pipeline(transaction=False)
        for name in batch:
            pipe.hmget(f"{prefix}{name}", ["definition", "meta"])
        for name, reply in zip(batch, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(reply, redis.ResponseError):
                unreadable[name] = f"{prefix}{name} is not a hash ({reply})"
                continue
            definition, meta = reply
            if definition is None and meta is None:
                continue  # not in redbeat
            try:
                runs[name] = _redbeat_run(meta, definition)
            except ValueError as exc:
                unreadable[name] = f"{prefix}{name}: {exc}"
    return OldSchedule(source=f"redbeat keys {prefix}*", runs=runs, unreadable=unreadable)


def _redbeat_run(meta: str | None, definition: str | None) -> OldRun:
    disabled = definition is not None and _disabled(definition)
    notes = ["disabled in redbeat: paused (`schedproj resume NAME` lets it run)"] \
        if disabled else []
    data = _json_object(meta, "meta") if meta is not None else {}
    count = data.get("total_run_count", 0) or 0
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ValueError(f"meta's total_run_count is {count!r}, not a count")
    last = data.get("last_run_at")
    if last is None:
        # redbeat judges an entry without a last run as last run in year 1: due at once.
        notes.append("no last run in redbeat: due at once, as redbeat would send it")
        return OldRun(None, count, "; ".join(notes), disabled)
    return OldRun(redbeat_time(last).timestamp(), count, "; ".join(notes), disabled)


def _disabled(definition: str) -> bool:
    try:
        return json.loads(definition).get("enabled", True) is False
    except (ValueError, AttributeError):
        return False  # the definition is redbeat's business; the meta is what we import


def _json_object(raw: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{what} is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what} is {type(data).__name__}, not a JSON object")
    return data


def redbeat_time(value: Any) -> datetime:
    """A datetime as redbeat's JSON encoder writes it: its wall-clock fields and a
    ``timezone`` that is a zone name, an offset in seconds, or absent (UTC)."""
    if not isinstance(value, dict) or value.get("__type__") != "datetime":
        raise ValueError(f"last_run_at is {value!r}, not redbeat's datetime")
    zone = value.get("timezone", "UTC")
    try:
        if isinstance(zone, str):
            tz: Any = ZoneInfo(zone)
        elif isinstance(zone, (int, float)) and not isinstance(zone, bool):
            tz = timezone(timedelta(seconds=zone))
        else:
            raise ValueError(f"timezone {zone!r}")
        fields = {k: value.get(k, 0) for k in ("hour", "minute", "second", "microsecond")}
        return datetime(value["year"], value["month"], value["day"], **fields, tzinfo=tz)
    except (KeyError, TypeError, ValueError) as exc:  # ZoneInfoNotFoundError is a KeyError
        raise ValueError(f"last_run_at {value!r} is not a time ({type(exc).__name__}: "
                         f"{exc})") from None


# -- deciding ----------------------------------------------------------------------------------
def target_entries(app: Any, client: redis.Redis, keys: Keys,
                   reserved: Iterable[str] = ()) -> dict[str, LoadedEntry]:
    """The entries a FairScheduler for ``app`` runs and judges by its stored state: the
    app's beat_schedule (and the cleanup entry Celery adds), then runtime entries stored in
    Redis (``schedproj entry add``) not shadowed by it; never one named like a lane."""
    found = code_entries(app)
    defs = {str(k): str(v) for k, v in client.hgetall(keys.entry_defs).items()}
    for name, raw in defs.items():
        if name not in found:
            try:
                found[name] = runtime_entry(name, raw, app, f"{keys.entry_defs} field {name!r}")
            except StateError:
                continue  # beat refuses it too; it is reported by status
    for name in reserved:
        found.pop(name, None)
    return found


def plan_migration(old: OldSchedule, schedule_keys: Mapping[str, str],
                   stored: Mapping[str, str | None], *, force: bool = False,
                   reserved: Iterable[str] = (), where: str = "entries") -> MigrationPlan:
    """What to import: each entry of ``old`` that the app runs (``schedule_keys``: entry ->
    its schedule's key), unless schedproj already holds a usable state for it (``stored``)
    and ``force`` is not given. Every other entry of either side is listed as skipped, with
    why."""
    lanes = frozenset(reserved)
    imports: list[Imported] = []
    skipped: list[Skipped] = []
    for name in sorted({*old.runs, *old.unreadable, *schedule_keys}):
        if name in old.unreadable:
            skipped.append(Skipped(name, f"unreadable in the old schedule: "
                                         f"{old.unreadable[name]}"))
        elif name not in old.runs:
            skipped.append(Skipped(name, f"not in the {old.source}: it counts from the first "
                                         "-S fair beat, as Celery counts a new entry"))
        elif name in lanes:
            skipped.append(Skipped(name, "has the name of a lane: -S fair does not run it "
                                         "(rename it in beat_schedule)"))
        elif name not in schedule_keys:
            skipped.append(Skipped(name, _not_run_why(name)))
        else:
            decision = _import_or_skip(name, old.runs[name], schedule_keys[name],
                                       stored.get(name), force, where)
            if isinstance(decision, Imported):
                imports.append(decision)
            else:
                skipped.append(decision)
    return MigrationPlan(imports=tuple(imports), skipped=tuple(skipped))


def _not_run_why(name: str) -> str:
    if name == BACKEND_CLEANUP:
        return ("Celery's own result cleanup: -S fair adds it only for an app that sets "
                "result_backend")
    return "not in the app's beat_schedule (nor a runtime entry): -S fair would not run it"


def _import_or_skip(name: str, run: OldRun, key: str, raw: str | None, force: bool,
                    where: str) -> Imported | Skipped:
    # Before 1970 (redbeat's "never": year 1) and 1970 both mean "long ago": due at once.
    last = 0.0 if run.last_run_at is None else max(run.last_run_at, 0.0)
    state = EntryState(last_run_at=last, total_run_count=run.total_run_count,
                       schedule_key=key)
    notes = [run.note] if run.note else []
    if raw is not None:
        try:
            held: EntryState | None = EntryState.decode(raw, f"{where} field {name!r}")
        except StateError:
            held = None
            notes.append("replaces an unreadable state")
        if held is not None and held.schedule_key != key:
            notes.append("replaces a state of an earlier schedule")
        elif held is not None and not force:
            return Skipped(name, f"already has state in schedproj ({held.total_run_count} "
                                 "runs): --force replaces it")
        elif held is not None:
            notes.append(f"replaces schedproj's state ({held.total_run_count} runs)")
    return Imported(name, state, raw, "; ".join(notes), pause=run.disabled)


# -- writing -----------------------------------------------------------------------------------
def stored_states(client: redis.Redis, keys: Keys, names: Iterable[str]) -> dict[str, str | None]:
    wanted = sorted(set(names))
    if not wanted:
        return {}
    values = client.hmget(keys.entries, wanted)
    return {n: (None if v is None else str(v)) for n, v in zip(wanted, values, strict=True)}


def beat_lock_ttl(client: redis.Redis, keys: Keys) -> float | None:
    """Seconds the beat lock has left; None when no FairScheduler beat holds it."""
    ms = int(client.pttl(keys.beat_lock))
    if ms == -2:
        return None
    return max(ms, 0) / 1000 if ms >= 0 else float("inf")


def write_migration(client: redis.Redis, keys: Keys, plan: MigrationPlan, *,
                    force: bool = False) -> int:
    """Write the plan's states (and pause the entries the old scheduler had disabled), each
    only if schedproj still holds what the plan read, and mark them changed (a running beat
    judges them again at its next tick), in one transaction. BeatActive while a FairScheduler
    beat holds the lock (unless ``force``); StateMoved when a state changed since it was read
    (read and plan again). Returns how many states were written."""
    names = [i.name for i in plan.imports]
    with client.pipeline(transaction=True) as pipe:
        try:
            # With --force beat may hold the lock (its renewals must not fail the write);
            # the states compared below are what must not have moved.
            watched = [keys.entries] if force else [keys.beat_lock, keys.entries]
            pipe.watch(*watched)  # type: ignore[no-untyped-call]
            if not force and pipe.exists(keys.beat_lock):
                raise BeatActive(_beat_active_message(keys, beat_lock_ttl(client, keys)))
            if not names:
                return 0
            now_held = pipe.hmget(keys.entries, names)
            moved = [i.name for i, raw in zip(plan.imports, now_held, strict=True)
                     if raw != i.expected]
            if moved:
                raise StateMoved(f"schedproj's state of {moved} changed since it was read")
            pipe.multi()
            pipe.hset(keys.entries, mapping={i.name: i.state.encode() for i in plan.imports})
            paused = [i.name for i in plan.imports if i.pause]
            if paused:
                pipe.sadd(keys.entries_paused, *paused)
            EntryStore(client, keys).mark_changed(names, pipe)
            pipe.execute()
        except redis.WatchError:
            raise StateMoved("a beat took the lock or wrote entry states while migrate "
                             "wrote") from None
    return len(names)


def _beat_active_message(keys: Keys, ttl_s: float | None) -> str:
    lapse = "" if ttl_s is None or ttl_s == float("inf") else \
        f" (a beat that was killed lets it lapse within {ttl_s:.0f} s)"
    return (f"a FairScheduler beat holds the beat lock {keys.beat_lock!r}: while it runs, beat "
            "owns the entries' state. Fix: stop every `celery beat -S fair` of this app"
            f"{lapse} and run migrate again; or pass --force to write into the running beat "
            "(it judges the imported entries again at its next tick)")


__all__ = [
    "REDBEAT_PREFIX",
    "BeatActive",
    "Imported",
    "MigrationError",
    "MigrationPlan",
    "OldRun",
    "OldSchedule",
    "Skipped",
    "StateMoved",
    "beat_lock_ttl",
    "epoch_of",
    "file_notes",
    "plan_migration",
    "read_beat_file",
    "read_redbeat",
    "redbeat_time",
    "stored_states",
    "target_entries",
    "write_migration",
]
