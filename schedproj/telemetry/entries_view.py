"""Read-only view of the schedule entries (the app's beat_schedule and runtime entries), for
status, the status page, metrics and ``schedproj entry list``. Reads Redis only, in one round
trip; a key of the wrong type is named in ``problems`` and read as empty."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis

from schedproj.core.entries import EntryDefinition, EntryState
from schedproj.core.errors import StateError
from schedproj.store.protocol import Keys


@dataclass(frozen=True)
class EntryRow:
    name: str
    task: str
    schedule: str
    source: str
    last_run_at: float | None
    runs: int
    next_due_at: float | None
    paused: bool
    #: Why its state or definition cannot be read, or why beat does not look at it ("" when
    #: nothing is wrong).
    problem: str = ""
    #: Beat runs it but it is missing from the due index, so beat never looks at it until the
    #: index is healed: counted as overdue.
    unindexed: bool = False

    def overdue(self, now: float, after_s: float) -> bool:
        """Not looked at when it should have been: its next look more than ``after_s`` past
        (not paused), or no next look at all (:attr:`unindexed`)."""
        return self.unindexed or (not self.paused and self.next_due_at is not None
                                  and now - self.next_due_at > after_s)


@dataclass(frozen=True)
class EntriesView:
    entries: tuple[EntryRow, ...] = ()
    problems: tuple[str, ...] = field(default_factory=tuple)

    def rows(self) -> list[dict[str, Any]]:
        return [{"name": e.name, "task": e.task, "schedule": e.schedule, "source": e.source,
                 "last_run_at": e.last_run_at, "runs": e.runs, "next_due_at": e.next_due_at,
                 "paused": e.paused, "problem": e.problem} for e in self.entries]


def read_entries(client: redis.Redis, keys: Keys) -> EntriesView:
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.entries_info)
    pipe.hgetall(keys.entries)
    pipe.zrange(keys.entries_due, 0, -1, withscores=True)
    pipe.smembers(keys.entries_paused)
    pipe.hgetall(keys.entry_defs)
    replies = pipe.execute(raise_on_error=False)
    problems: list[str] = []
    names = (keys.entries_info, keys.entries, keys.entries_due, keys.entries_paused,
             keys.entry_defs)
    empty: tuple[Any, ...] = ({}, {}, [], set(), {})
    values = []
    broken: set[str] = set()
    for key, reply, blank in zip(names, replies, empty, strict=True):
        if isinstance(reply, redis.ResponseError):
            problems.append(f"{key} holds a value of the wrong type ({reply}); delete it")
            broken.add(key)
            reply = blank
        values.append(reply)
    info, states, due, paused, defs = values
    scores = {str(n): float(s) for n, s in due}
    rows: list[EntryRow] = []
    for name in sorted(set(info) | set(defs)):
        task, schedule, source, problem = _described(name, info.get(name), defs.get(name), keys)
        last, runs = None, 0
        raw = states.get(name)
        if raw is not None:
            try:
                state = EntryState.decode(raw, f"{keys.entries} field {name!r}")
                last, runs = state.last_run_at, state.total_run_count
            except StateError as exc:
                problem = problem or str(exc)
        # Every entry beat runs has a next look; one without (the index lost, or its member
        # removed) is never looked at until beat heals the index: say so, never "healthy".
        # A runtime entry beat has not read yet is not indexed yet.
        unindexed = (name not in scores and name in info and keys.entries_due not in broken)
        if unindexed and not problem:
            problem = (f"not in {keys.entries_due}: beat does not look at it until it heals "
                       "the index (within its reconcile, 5 minutes)")
        rows.append(EntryRow(name=name, task=task, schedule=schedule, source=source,
                             last_run_at=last, runs=runs, next_due_at=scores.get(name),
                             paused=name in paused, problem=problem, unindexed=unindexed))
    return EntriesView(entries=tuple(rows), problems=tuple(problems))


def _described(name: str, info: str | None, definition: str | None,
               keys: Keys) -> tuple[str, str, str, str]:
    """(task, schedule, source, problem): what beat published, else the runtime definition
    beat has not read yet."""
    if info is not None:
        try:
            data = json.loads(info)
            return (str(data.get("task", "?")), str(data.get("schedule", "?")),
                    str(data.get("source", "?")), "")
        except (ValueError, AttributeError):
            pass
    if definition is not None:
        try:
            d = EntryDefinition.decode(definition, f"{keys.entry_defs} field {name!r}")
        except StateError as exc:
            return "?", "?", "runtime", str(exc)
        return d.task, _timing(d), "runtime (not yet read by beat)", ""
    return "?", "?", "?", f"{keys.entries_info} field {name!r} is not JSON"


def _timing(d: EntryDefinition) -> str:
    """A definition's schedule in the words ``schedproj entry add`` takes: every N s, a cron
    expression (with its own zone and window when it names them) or a one-off instant."""
    if d.every_s is not None:
        return f"every {d.every_s:g}s"
    if d.at is not None:
        when = f"at {datetime.fromtimestamp(d.at, UTC).isoformat()}"
    else:
        when = f"cron {d.cron}" + (f" in {d.timezone}" if d.timezone else "")
    if d.catchup_window_s is not None:
        when += f", catch-up {d.catchup_window_s:g}s"
    return when


__all__ = ["EntriesView", "EntryRow", "read_entries"]
