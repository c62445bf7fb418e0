"""Runtime schedule entries: add, change, remove and list entries without a deploy, from Python
(``schedproj.add_entry``) or the command line (``schedproj entry``). Stored in Redis; the active
beat picks a change up at its next tick.

A definition is checked before it is stored: a bad schedule or option is refused with the fix;
a task name the app does not know is stored with a warning (the task may live only in the
workers' code).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis

from schedproj.core.entries import EntryDefinition, check_entry_name
from schedproj.core.errors import ConfigurationError, StateError
from schedproj.core.laneset import specs_from_registry
from schedproj.on_celery.calendars import app_timezone
from schedproj.on_celery.entries import schedule_of
from schedproj.on_celery.runtime import runtime_for
from schedproj.store.entry_store import EntryStore
from schedproj.store.protocol import Keys

logger = logging.getLogger("schedproj.entries")


@dataclass(frozen=True)
class Added:
    """What :func:`add_entry` stored, and what it warns about."""

    name: str
    definition: EntryDefinition
    replaced: bool
    warnings: tuple[str, ...] = ()


def define(client: redis.Redis, keys: Keys, name: str, task: str, *,
           every: float | None = None, cron: str | None = None,
           at: datetime | float | None = None, timezone: str | None = None,
           catchup_window_s: float | None = None, args: Sequence[Any] = (),
           kwargs: Mapping[str, Any] | None = None, queue: str | None = None,
           options: Mapping[str, Any] | None = None, app: Any = None) -> Added:
    """Check and store a runtime entry (a new one, or a changed definition of one added at
    runtime before). ConfigurationError naming the problem and the fix when refused.

    ``at`` (an aware datetime or epoch seconds) makes a one-off entry: sent once at that
    instant, then spent (kept, shown as spent, never sent again); it must not have passed."""
    try:
        check_entry_name(name)
        opts = dict(options or {})
        if queue is not None:
            opts["queue"] = queue
        definition = EntryDefinition.build(
            task=task, every_s=every, cron=cron, at=_epoch(at), timezone=timezone,
            catchup_window_s=catchup_window_s, args=args, kwargs=kwargs, options=opts)
        if definition.at is not None and definition.at < time.time():
            raise ValueError(f"the instant {_shown(definition.at)} has passed; give one to come")
        schedule_of(definition, app)
        if app is not None:
            definition.calendar(app_timezone(app.conf))   # the app's zone, if it is used
    except ValueError as exc:
        raise ConfigurationError(f"entry {name!r}: {exc}") from None
    _refuse_taken(client, keys, name)
    warnings: list[str] = []
    if app is not None and definition.task not in app.tasks:
        warnings.append(f"task {definition.task!r} is not registered in app {app.main!r}; "
                        "stored anyway (workers may know it): check the name")
    store = EntryStore(client, keys)
    replaced = client.hexists(keys.entry_defs, name)
    store.put_definition(name, definition)
    for warning in warnings:
        logger.warning("%s", warning)
    return Added(name=name, definition=definition, replaced=bool(replaced),
                 warnings=tuple(warnings))


def _epoch(at: datetime | float | None) -> float | None:
    if isinstance(at, datetime):
        if at.tzinfo is None or at.utcoffset() is None:
            raise ValueError(f"the instant {at.isoformat()} has no time zone; give an offset "
                             "(2027-03-28T02:30:00+01:00) or Z for UTC")
        return at.timestamp()
    return at


def _shown(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")


def _refuse_taken(client: redis.Redis, keys: Keys, name: str) -> None:
    """An entry may not take a lane's name, nor one the code's beat_schedule defines."""
    info = client.hget(keys.entries_info, name)
    if info is not None:
        try:
            source = json.loads(info).get("source")
        except (ValueError, AttributeError):
            source = None
        if source == "code":
            raise ConfigurationError(
                f"entry {name!r} is defined in the app's beat_schedule; change it in the code "
                "(a runtime entry of the same name would never run)")
    raw = client.get(keys.published_lanes)
    if raw is not None:
        try:
            specs, _ = specs_from_registry(str(raw), keys.published_lanes)
        except StateError:
            return
        if name in {s.name for s in specs}:
            raise ConfigurationError(f"{name!r} is a lane; give the entry another name")


def undefine(client: redis.Redis, keys: Keys, name: str) -> bool:
    """Remove a runtime entry; beat deletes its state at its next tick. False if there was
    no runtime entry of that name."""
    return EntryStore(client, keys).remove_definition(name)


def definitions(client: redis.Redis, keys: Keys) -> dict[str, EntryDefinition | str]:
    """Every runtime entry: its definition, or why it cannot be read."""
    found: dict[str, EntryDefinition | str] = {}
    for name, raw in sorted(EntryStore(client, keys).definitions().items()):
        try:
            found[name] = EntryDefinition.decode(raw, f"{keys.entry_defs} field {name!r}")
        except StateError as exc:
            found[name] = str(exc)
    return found


def add_entry(app: Any, name: str, task: str, *, every: float | None = None,
              cron: str | None = None, at: datetime | float | None = None,
              timezone: str | None = None, catchup_window_s: float | None = None,
              args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
              queue: str | None = None, options: Mapping[str, Any] | None = None) -> Added:
    """Add (or change) a runtime schedule entry of ``app``: ``task`` sent every ``every``
    seconds, on the five-field ``cron`` expression (in ``timezone``, default the app's time
    zone), or once at the instant ``at``, with ``args``, ``kwargs`` and message ``options``.
    A cron or one-off entry may set ``catchup_window_s``. Picked up by the active beat at its
    next tick."""
    rt = runtime_for(app)
    return define(rt.store.client, rt.keys, name, task, every=every, cron=cron, at=at,
                  timezone=timezone, catchup_window_s=catchup_window_s, args=args,
                  kwargs=kwargs, queue=queue, options=options, app=app)


def remove_entry(app: Any, name: str) -> bool:
    """Remove a runtime schedule entry of ``app``; False if it had none of that name."""
    rt = runtime_for(app)
    return undefine(rt.store.client, rt.keys, name)


def list_entries(app: Any) -> dict[str, EntryDefinition | str]:
    """The runtime schedule entries of ``app`` (the code's are in ``app.conf.beat_schedule``)."""
    rt = runtime_for(app)
    return definitions(rt.store.client, rt.keys)


__all__ = ["Added", "add_entry", "define", "definitions", "list_entries", "remove_entry",
           "undefine"]
