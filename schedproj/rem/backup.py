"""Snapshots of the REM store to JSON files, and restores from them.

A snapshot reads every REM key in one MULTI/EXEC, so it is a point-in-time view (no summary
without its session, no edge without its node). The file is written to a temporary name in
the target directory, fsynced, and renamed over the final name with ``os.replace``: a crash
leaves either the previous set of backups or the new complete one, never a half file under a
``backup-*.json`` name.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from schedproj.core.errors import SchedprojError, StateError
from schedproj.rem.store import MemoryStore

logger = logging.getLogger(__name__)

#: Format version of the snapshot document; :func:`restore` refuses any other.
BACKUP_VERSION = 1
#: Snapshots kept in the directory (the newest ones).
DEFAULT_KEEP = 7
#: Final file names: ``backup-<UTC timestamp>.json``; the timestamp sorts in time order.
FILE_PREFIX, FILE_SUFFIX = "backup-", ".json"
#: A snapshot retries this often when sessions are added between listing and reading.
_ATTEMPTS = 5
_TYPES = ("string", "hash", "list", "set", "zset")


class BackupError(StateError):
    """A snapshot file is unreadable or of an unknown format version."""

    def __init__(self, path: Path, problem: str) -> None:
        self.key = str(path)
        self.problem = problem
        SchedprojError.__init__(
            self, f"REM backup {str(path)!r}: {problem}. Nothing was restored; restore a "
                  f"snapshot written by a matching schedproj version")


def snapshot(store: MemoryStore, directory: Path, *, fence: int,
             keep: int = DEFAULT_KEEP) -> Path:
    """Write a point-in-time snapshot of ``store`` to ``directory`` and prune old ones.

    ``fence`` (the backup run's lease fence, 0 = unfenced) is checked in the same transaction:
    a run whose lease was taken over gets :class:`~schedproj.core.errors.LeaseLost` and writes no
    file."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    keys = read_all(store, fence=fence)
    directory.mkdir(parents=True, exist_ok=True)
    taken = datetime.now(UTC)
    doc = {"version": BACKUP_VERSION, "prefix": store.prefix, "fence": fence,
           "taken_at": taken.timestamp(), "keys": keys}
    final = directory / f"{FILE_PREFIX}{taken.strftime('%Y%m%dT%H%M%S.%fZ')}{FILE_SUFFIX}"
    _write_atomically(final, doc)
    prune(directory, keep)
    return final


def read_all(store: MemoryStore, *, fence: int = 0) -> dict[str, dict[str, Any]]:
    """Every REM key of ``store`` (name relative to the prefix -> {"type", "value"}), read in
    one MULTI/EXEC. Empty keys do not exist in Redis and are absent here."""
    for _ in range(_ATTEMPTS):
        got = _read_once(store, fence)
        if got is not None:
            return got
    raise SchedprojError(
        f"REM store {store.prefix!r}: sessions kept arriving while a snapshot was being "
        f"taken ({_ATTEMPTS} attempts); retry when ingest is quieter")


def _read_once(store: MemoryStore, fence: int) -> dict[str, dict[str, Any]] | None:
    k = store.keys
    # Key names: the fixed ones, each known session's, and anything else found under the
    # namespace (e.g. a lane's own bookkeeping key), typed by one pipelined TYPE round trip.
    # The write stamp is no memory: a snapshot leaves it out, a restore sets a fresh one.
    known_sessions = {str(s) for s in store.client.hkeys(k.sessions)}
    names = (set(k.fixed()) - {k.write_stamp}) | {n for sid in known_sessions
                                                  for n in k.session_keys(sid)}
    extras = sorted(set(store.scan_keys()) - names - {k.write_stamp})
    types = {n: k.redis_type(n) for n in names}
    if extras:
        pipe = store.client.pipeline(transaction=False)
        for name in extras:
            pipe.type(name)
        types.update(zip(extras, pipe.execute(), strict=True))
    ordered = sorted(n for n, t in types.items() if t in _TYPES)
    pipe = store.client.pipeline(transaction=True)
    # The fence check rides in the same transaction as the reads.
    store.queue_fence_check(pipe, fence)
    pipe.hkeys(k.sessions)
    for name in ordered:
        _queue_read(pipe, name, str(types[name]))
    replies = pipe.execute()
    store.raise_if_refused(replies[0], fence, "snapshot")
    if not {str(s) for s in replies[1]} <= known_sessions:
        return None  # a session arrived after listing: its keys were not read; go again
    out: dict[str, dict[str, Any]] = {}
    for name, value in zip(ordered, replies[2:], strict=True):
        encoded = _encode_value(str(types[name]), value)
        if encoded is not None:
            out[_relative(store, name)] = {"type": types[name], "value": encoded}
    return out


def _queue_read(pipe: Any, name: str, kind: str) -> None:
    if kind == "string":
        pipe.get(name)
    elif kind == "hash":
        pipe.hgetall(name)
    elif kind == "list":
        pipe.lrange(name, 0, -1)
    elif kind == "set":
        pipe.smembers(name)
    else:
        pipe.zrange(name, 0, -1, withscores=True)


def _encode_value(kind: str, value: Any) -> Any:
    """JSON form of a value; None when the key does not exist (empty)."""
    if value is None or (kind != "string" and not value):
        return None
    if kind == "hash":
        return dict(sorted(value.items()))
    if kind == "set":
        return sorted(value)
    if kind == "zset":
        return [[member, score] for member, score in value]
    return value  # string or list


def _relative(store: MemoryStore, name: str) -> str:
    return name[len(store.prefix) + 1:]


def _write_atomically(final: Path, doc: Mapping[str, Any]) -> None:
    fd, tmp_name = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(final.parent)


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable; not every platform lets a directory be opened.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def backups(directory: Path) -> list[Path]:
    """Snapshot files in ``directory``, oldest first."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir()
                  if p.name.startswith(FILE_PREFIX) and p.name.endswith(FILE_SUFFIX))


def prune(directory: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` snapshots; returns what was deleted."""
    old = backups(directory)[:-keep]
    for path in old:
        path.unlink(missing_ok=True)
    if old:
        logger.info("REM backup: pruned %d old snapshot(s) in %s", len(old), directory)
    return old


def load(path: Path) -> dict[str, Any]:
    """Read and check a snapshot document."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BackupError(path, f"cannot be read as JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise BackupError(path, f"expected a JSON object, found {type(doc).__name__}")
    if doc.get("version") != BACKUP_VERSION:
        raise BackupError(path, f"format version {doc.get('version')!r}, this schedproj "
                                f"reads version {BACKUP_VERSION}")
    entries = doc.get("keys")
    if not isinstance(entries, dict):
        raise BackupError(path, "has no 'keys' object")
    for name, entry in entries.items():
        if (not isinstance(name, str) or not name.startswith("rem:")
                or not isinstance(entry, dict) or entry.get("type") not in _TYPES
                or "value" not in entry):
            raise BackupError(path, f"malformed entry {name!r}")
    return doc


def restore(store: MemoryStore, path: Path) -> int:
    """Replace ``store``'s REM keys with the snapshot at ``path`` (its prefix may differ from
    the snapshot's), in one MULTI/EXEC. Returns the number of keys written.

    The REM fence never goes down: the restored fence is the larger of the snapshot's and the
    store's, so a run fenced out before the restore stays fenced out after it."""
    doc = load(path)
    entries: dict[str, dict[str, Any]] = doc["keys"]
    fence_rel = _relative(store, store.keys.fence)
    current = store.current_fence()
    existing = store.scan_keys()
    pipe = store.client.pipeline(transaction=True)
    for start in range(0, len(existing), 500):
        pipe.delete(*existing[start:start + 500])
    for rel, entry in sorted(entries.items()):
        name = f"{store.prefix}:{rel}"
        value = entry["value"]
        if rel == fence_rel:
            try:
                value = str(max(int(value), current))
            except (TypeError, ValueError):
                raise BackupError(path, f"bad fence value {value!r}") from None
        _queue_write(pipe, name, entry["type"], value, path)
    if fence_rel not in entries and current:
        pipe.set(store.keys.fence, current)
    # A fresh write stamp, whatever the snapshot held: beat's REM due checks see the restore
    # on its next tick (a snapshot's stamp may be one beat remembers).
    pipe.set(store.keys.write_stamp, store.fresh_stamp())
    pipe.execute()
    logger.info("REM restore: %d keys from %s into prefix %r", len(entries), path,
                store.prefix)
    return len(entries)


def _queue_write(pipe: Any, name: str, kind: str, value: Any, path: Path) -> None:
    if kind != "string" and not value:
        return  # Redis has no empty containers
    try:
        if kind == "string":
            pipe.set(name, str(value))
        elif kind == "hash":
            pipe.hset(name, mapping={str(f): str(v) for f, v in value.items()})
        elif kind == "list":
            pipe.rpush(name, *[str(v) for v in value])
        elif kind == "set":
            pipe.sadd(name, *[str(v) for v in value])
        else:
            pipe.zadd(name, {str(m): float(s) for m, s in value})
    except (AttributeError, TypeError, ValueError) as exc:
        raise BackupError(path, f"bad value for {name!r} ({exc})") from None
