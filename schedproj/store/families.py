"""Lane family members in Redis: add, remove, list, sync.

A member is in its family's set and in the due index (``Keys.due``) together, written in one
MULTI with the change mark beat reads; removing a member deletes its state with it.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import redis

from schedproj.core.families import (
    KEY_CHARS,
    KEY_MAX_LEN,
    KEY_PATTERN,
    FamilyError,
    check_key,
    member_lane,
)
from schedproj.core.records import RunRecord, encode
from schedproj.store import scripts
from schedproj.store.protocol import Keys, run_field, sched_field

#: Members written per MULTI (a sync of 100,000 members is a few hundred round trips).
CHUNK = 2000


def generations_key(keys: Keys) -> str:
    """Hash: family -> its members' generation, bumped by every add and remove (in the MULTI
    that changes the set), so beat knows a family it synced is unchanged without reading its
    members (200,000 of them took 1.0-1.6 s a sync). Absent: 0."""
    return f"{keys.prefix}:families:generation"


def check_family_name(family: object) -> str:
    """The family's name, if it is well formed: 1 to 128 characters out of the member keys'
    set (letters, digits and ``. _ - : / @ + =``), so never a Redis glob (``* ? [``), a hash
    tag (``{ }``) or a member bracket. Else a :class:`FamilyError` saying the fix."""
    if isinstance(family, str) and 0 < len(family) <= KEY_MAX_LEN \
            and KEY_PATTERN.fullmatch(family):
        return family
    raise FamilyError(f"family {str(family)[:60]!r}", "not a well-formed family name",
                      f"name the family task (1 to {KEY_MAX_LEN} characters out of "
                      f"{KEY_CHARS}), as declared with lane=LaneFamily(...)")


def _generation(raw: Any) -> int | None:
    """A generation as read (None: absent, 0), or None if it is not one (a hash of the wrong
    type reads as an error)."""
    if raw is None:
        return 0
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


class FamilyStore:
    """Members of the lane families under one key prefix."""

    def __init__(self, client: redis.Redis, keys: Keys,
                 families: Collection[str] | None = None, *,
                 compact_records: bool = False) -> None:
        self.client = client
        self.keys = keys
        #: A new member's first run record in the compact format (SCHEDPROJ_COMPACT_RECORDS).
        self.compact_records = compact_records
        #: The declared families (None: not known here, any name is taken).
        self.families = None if families is None else frozenset(families)
        self._forget_runs = scripts.register(client, "member_run_forget")

    def check_family(self, family: str) -> None:
        """A :class:`FamilyError` with the fix unless ``family`` may be written: a declared
        family (its declaration was checked), or, with none known here, a well-formed name.
        The one check for the Python API and the CLI alike."""
        if self.families is None or family not in self.families:
            check_family_name(family)
        if self.families is not None and family not in self.families:
            known = ", ".join(sorted(self.families)) or "none declared"
            raise FamilyError(f"family {family!r}", "no such lane family",
                              f"name one of the declared families ({known}); a family is a "
                              "task declared with lane=LaneFamily(...)")

    def add(self, family: str, keys: Iterable[str], *, now: float | None = None) -> int:
        """Add members; returns how many were new. A new member is just due (see
        ``RunRecord.since``): it runs soon, in its turn, never ahead of lanes more overdue."""
        self.check_family(family)
        valid = sorted({check_key(family, k) for k in keys})
        born = encode(RunRecord(since=time.time() if now is None else now),
                      compact=self.compact_records)
        added = 0
        for i in range(0, len(valid), CHUNK):
            chunk = valid[i:i + CHUNK]
            lanes = [member_lane(family, k) for k in chunk]
            pipe = self.client.pipeline(transaction=True)
            pipe.sadd(self.keys.families, family)
            pipe.sadd(self.keys.family(family), *chunk)
            for lane in lanes:  # a member's record, if any, is kept (re-added while present)
                pipe.hsetnx(self.keys.lanes, run_field(lane), born)
            pipe.zadd(self.keys.due, dict.fromkeys(lanes, 0.0), nx=True)
            pipe.sadd(self.keys.changed, *lanes)
            added += int(self._execute(pipe, family)[1])
        return added

    def remove(self, family: str, keys: Iterable[str]) -> int:
        """Remove members and their state; returns how many were members. A member's run
        record that names a run in flight is kept until that run ends (``member_run_forget.lua``):
        added back meanwhile, the member is not dispatched again beside its running run."""
        self.check_family(family)
        valid = sorted({check_key(family, k) for k in keys})
        removed = 0
        for i in range(0, len(valid), CHUNK):
            chunk = valid[i:i + CHUNK]
            lanes = [member_lane(family, k) for k in chunk]
            pipe = self.client.pipeline(transaction=True)
            pipe.srem(self.keys.family(family), *chunk)
            pipe.zrem(self.keys.due, *lanes)
            pipe.hdel(self.keys.lanes, *[sched_field(lane) for lane in lanes])
            self._forget_runs(keys=[self.keys.lanes], args=[run_field(lane) for lane in lanes],
                              client=pipe)
            pipe.srem(self.keys.paused, *lanes)
            pipe.srem(self.keys.run_now, *lanes)
            pipe.hdel(self.keys.errors, *lanes)
            pipe.sadd(self.keys.changed, *lanes)
            removed += int(self._execute(pipe, family)[0])
        return removed

    def _execute(self, pipe: redis.client.Pipeline, family: str) -> list[Any]:
        """Run a MULTI that changes ``family``'s members, bumping its generation with it. A
        generations hash of the wrong type fails that bump alone (the change is made; beat
        then reads the members every sync, as it would without the generation)."""
        pipe.hincrby(generations_key(self.keys), family, 1)
        *results, _ = pipe.execute(raise_on_error=False)
        for result in results:
            if isinstance(result, Exception):
                raise result
        return results

    def generation(self, family: str) -> int | None:
        """``family``'s members' generation (0: never bumped), None if unreadable."""
        try:
            return _generation(self.client.hget(generations_key(self.keys), family))
        except redis.ResponseError:
            return None

    def generation_and_count(self, family: str) -> tuple[int | None, int]:
        """:meth:`generation` and :meth:`count` in one round trip."""
        self.check_family(family)
        pipe = self.client.pipeline(transaction=True)
        pipe.hget(generations_key(self.keys), family)
        pipe.scard(self.keys.family(family))
        raw, count = pipe.execute(raise_on_error=False)
        if isinstance(count, Exception):
            raise count
        return _generation(raw), int(count)

    def members(self, family: str) -> list[str]:
        """The member keys, sorted."""
        self.check_family(family)
        return sorted(str(k) for k in self.client.smembers(self.keys.family(family)))

    def count(self, family: str) -> int:
        self.check_family(family)
        return int(self.client.scard(self.keys.family(family)))

    def sync(self, family: str, wanted: Sequence[str]) -> tuple[int, int]:
        """Make the members exactly ``wanted``: (added, removed)."""
        added, removed, _ = self.sync_counted(family, wanted)
        return added, removed

    def sync_counted(self, family: str, wanted: Sequence[str]) -> tuple[int, int, int | None]:
        """:meth:`sync`, and the generation the members are at once it is done, if no other
        writer changed them meanwhile (None: one may have, or it is unreadable)."""
        self.check_family(family)
        want = {check_key(family, k) for k in wanted}
        pipe = self.client.pipeline(transaction=True)
        pipe.hget(generations_key(self.keys), family)
        pipe.smembers(self.keys.family(family))
        before, members = pipe.execute(raise_on_error=False)
        if isinstance(members, Exception):
            raise members
        have = {str(k) for k in members}
        added = self.add(family, want - have)
        removed = self.remove(family, have - want)
        bumps = (len(want - have) + CHUNK - 1) // CHUNK + (len(have - want) + CHUNK - 1) // CHUNK
        start, after = _generation(before), self.generation(family)
        if start is None or after != start + bumps:
            return added, removed, None
        return added, removed, after


__all__ = ["FamilyStore", "check_family_name", "generations_key"]
