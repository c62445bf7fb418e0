"""Lane state on Redis: one round trip to load everything a tick needs, guarded writes.

Beat writes only ``<lane>|sched`` fields and only while it holds the beat lock (Lua guard);
workers write only ``<lane>|run`` fields, atomically with the lease release.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import redis

from schedproj import defaults, scripts
from schedproj.errors import StateError
from schedproj.keys import Keys, run_field, sched_field
from schedproj.lease import parse_lease
from schedproj.state import LaneState, LeaseView, RunRecord, SchedRecord, decode, encode

#: A lease record that cannot be read still means "held": never dispatch heavy work over it.
UNREADABLE_LEASE = LeaseView(lane="?", token="", fence=0, granted_at=0.0)


@dataclass(frozen=True)
class LockStatus:
    held: bool
    fence: int = 0
    event: str = ""  # acquired | renewed | held
    holder: str | None = None


@dataclass(frozen=True)
class Snapshot:
    """Everything one tick reads, from a single Redis round trip."""

    lock: LockStatus
    states: Mapping[str, LaneState]
    lease: LeaseView | None
    errors: Mapping[str, str] = field(default_factory=dict)
    paused: frozenset[str] = frozenset()
    forced: frozenset[str] = frozenset()


def parse_states(raw: Mapping[str, str], hash_key: str,
                 memo: dict[tuple[str, str], Any] | None = None,
                 ) -> tuple[dict[str, LaneState], dict[str, str]]:
    """Decode the lanes hash. A malformed field marks its lane unreadable (reported, skipped).

    ``memo`` maps (field, raw value) to its decoded record across calls: most records do not
    change between two ticks, and decoding thousands of them every tick dominated its cost.
    It is rebuilt to hold exactly this call's fields, so it never grows past the lane count.
    """
    runs: dict[str, RunRecord] = {}
    scheds: dict[str, SchedRecord] = {}
    errors: dict[str, str] = {}
    previous = dict(memo) if memo is not None else {}
    if memo is not None:
        memo.clear()
    for fld, value in raw.items():
        known = previous.get((fld, value))
        if known is not None:
            lane = fld.rpartition("|")[0]
            (runs if isinstance(known, RunRecord) else scheds)[lane] = known
            if memo is not None:
                memo[(fld, value)] = known
            continue
        lane, sep, part = fld.rpartition("|")
        where = f"{hash_key} field {fld!r}"
        if not sep or part not in ("run", "sched"):
            errors[fld] = f"unexpected field {fld!r} in {hash_key}"
            continue
        try:
            record: RunRecord | SchedRecord
            if part == "run":
                record = runs[lane] = decode(RunRecord, value, where)
            else:
                record = scheds[lane] = decode(SchedRecord, value, where)
        except StateError as exc:
            errors[lane] = str(exc)
            continue
        if memo is not None:
            memo[(fld, value)] = record
    states = {
        lane: LaneState(run=runs.get(lane, RunRecord()), sched=scheds.get(lane, SchedRecord()))
        for lane in set(runs) | set(scheds)
        if lane not in errors
    }
    return states, errors


class LaneStore:
    """Reads and writes lane state, the wake list and scheduling errors."""

    def __init__(self, client: redis.Redis, keys: Keys,
                 audit_client: redis.Redis | None = None) -> None:
        self.client = client
        self.keys = keys
        self.audit_client = audit_client or client
        self._decoded: dict[tuple[str, str], Any] = {}
        self._lock = scripts.register(client, "beat_lock")
        self._unlock = scripts.register(client, "beat_unlock")
        self._guarded_hset = scripts.register(client, "guarded_hset")
        self._finish = scripts.register(client, "run_finish")
        self._skipped = scripts.register(client, "run_mark_skipped")

    def snapshot(self, beat_token: str, lock_ttl_s: float) -> Snapshot:
        """Renew (or try to take) the beat lock and read all state: one round trip."""
        try:
            replies = self._snapshot_pipeline(beat_token, lock_ttl_s)
        except redis.exceptions.NoScriptError:
            # First use on this server (or after SCRIPT FLUSH / a restart): load, then retry.
            self.client.script_load(self._lock.script)
            replies = self._snapshot_pipeline(beat_token, lock_ttl_s)
        lock_reply, raw_states, raw_lease, paused, forced = replies
        ok, value, event = lock_reply
        lock = (LockStatus(held=True, fence=int(value), event=str(event)) if int(ok) == 1
                else LockStatus(held=False, holder=str(value), event=str(event)))
        states, errors = parse_states(raw_states, self.keys.lanes, self._decoded)
        try:
            lease = parse_lease(raw_lease, self.keys.lease)
        except StateError as exc:
            errors["<lease>"] = str(exc)
            lease = UNREADABLE_LEASE
        return Snapshot(lock=lock, states=states, lease=lease, errors=errors,
                        paused=frozenset(paused), forced=frozenset(forced))

    def _snapshot_pipeline(self, beat_token: str, lock_ttl_s: float) -> list[Any]:
        # EVALSHA directly: a pipeline holding a registered Script first sends its own
        # SCRIPT EXISTS, which would cost a second round trip on every tick.
        pipe = self.client.pipeline(transaction=False)
        pipe.evalsha(self._lock.sha, 2, self.keys.beat_lock, self.keys.beat_fence,
                     beat_token, int(lock_ttl_s * 1000))
        pipe.hgetall(self.keys.lanes)
        pipe.get(self.keys.lease)
        pipe.smembers(self.keys.paused)
        pipe.smembers(self.keys.run_now)
        return pipe.execute()

    def unlock(self, beat_token: str) -> bool:
        return int(self._unlock(keys=[self.keys.beat_lock], args=[beat_token])) == 1

    def write_sched(self, beat_token: str, records: Mapping[str, SchedRecord]) -> bool:
        """Write beat-owned records; False (nothing written) if this beat lost the lock."""
        if not records:
            return True
        args: list[str] = [beat_token]
        for lane, record in records.items():
            args += [sched_field(lane), encode(record)]
        n = self._guarded_hset(keys=[self.keys.beat_lock, self.keys.lanes], args=args)
        return int(n) >= 0

    def clear_inflight(self, beat_token: str, lane: str) -> None:
        """Forget a dispatch whose message never left, so the lane is due again next tick."""
        raw = self.client.hget(self.keys.lanes, sched_field(lane))
        if raw is None:
            return
        record = decode(SchedRecord, raw, f"{self.keys.lanes} field {sched_field(lane)!r}")
        self.write_sched(beat_token, {lane: replace(record, inflight_task_id=None,
                                                    inflight_deadline=None)})

    def read_run(self, lane: str) -> RunRecord:
        raw = self.client.hget(self.keys.lanes, run_field(lane))
        if raw is None:
            return RunRecord()
        return decode(RunRecord, raw, f"{self.keys.lanes} field {run_field(lane)!r}")

    def write_run(self, lane: str, record: RunRecord) -> None:
        self.client.hset(self.keys.lanes, run_field(lane), encode(record))

    def finish(self, lane: str, record: RunRecord, *, token: str, fence: int,
               wake_message: str, write: bool = True) -> tuple[bool, int]:
        """Record the outcome (unless ``write`` is False: the stored record is unreadable and
        must stay untouched), release the lease (if ``token``), wake beat. Atomic."""
        released, written = self._finish(
            keys=[self.keys.lease, self.keys.lanes, self.keys.wake],
            args=[token, run_field(lane), encode(record), fence, wake_message,
                  "1" if write else "0"],
        )
        return int(released) == 1, int(written)

    def mark_skipped(self, lane: str, reason: str, *, wake_message: str) -> bool:
        """Record a refused message's outcome without touching the rest of the run record."""
        done = self._skipped(keys=[self.keys.lanes, self.keys.wake],
                             args=[run_field(lane), reason, wake_message])
        return int(done) == 1

    def wake(self, message: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.lpush(self.keys.wake, message)
        pipe.ltrim(self.keys.wake, 0, 63)
        pipe.execute()

    def wait_for_wake(self, timeout_s: float) -> bool:
        """Block until a run finishes or ``timeout_s`` passes; True if woken."""
        if timeout_s <= 0:
            return False
        # Never block longer than the client's socket timeout, or an idle wait reads as an
        # outage.
        limit = self.client.connection_pool.connection_kwargs.get("socket_timeout") or 10.0
        woke = self.client.blpop([self.keys.wake], timeout=min(timeout_s, float(limit) - 1.0))
        if woke is not None:
            # Several runs may have finished; one tick handles them all.
            self.client.delete(self.keys.wake)
        return woke is not None

    def record_error(self, lane: str, message: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(self.keys.errors, lane, message)
        pipe.hincrby(self.keys.counters, f"errors|{lane}", 1)
        pipe.execute()

    def log(self, key: str, entry: Mapping[str, Any]) -> None:
        """Append to a bounded audit list (the journal or the dispatch log)."""
        self.log_many(key, [entry])

    def log_many(self, key: str, entries: Sequence[Mapping[str, Any]]) -> None:
        """Append several entries in one round trip."""
        if not entries:
            return
        pipe = self.audit_client.pipeline(transaction=False)
        pipe.rpush(key, *(json.dumps(e, separators=(",", ":")) for e in entries))
        pipe.ltrim(key, -defaults.AUDIT_LOG_LEN, -1)
        pipe.execute()

    def count_many(self, amounts: Mapping[str, int]) -> None:
        """Bump several durable counters in one round trip."""
        if not amounts:
            return
        pipe = self.client.pipeline(transaction=False)
        for name, amount in amounts.items():
            pipe.hincrby(self.keys.counters, name, amount)
        pipe.execute()

    def count(self, name: str, amount: int = 1) -> None:
        """Bump a durable counter (exported by beat's metrics)."""
        self.client.hincrby(self.keys.counters, name, amount)

    def done_forcing(self, lanes: list[str]) -> None:
        if lanes:
            self.client.srem(self.keys.run_now, *lanes)

    def clear_errors(self, lanes: list[str]) -> None:
        if lanes:
            self.client.hdel(self.keys.errors, *lanes)
