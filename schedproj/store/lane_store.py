"""Lane state on Redis: one round trip to load everything a tick needs, guarded writes.

Beat writes only ``<lane>|sched`` fields and only while it holds the beat lock (Lua guard);
workers write only ``<lane>|run`` fields, atomically with the lease release.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import redis

from schedproj.core import defaults
from schedproj.core.errors import StateError
from schedproj.core.records import (
    COMPACT_FORMAT,
    EMPTY_STATE,
    LONG_FORMAT,
    LaneState,
    LeaseView,
    RunRecord,
    SchedRecord,
    decode,
    encode,
    new_state,
)
from schedproj.store import scripts
from schedproj.store.connection import socket_timeout_of
from schedproj.store.lease import holders_moved, parse_lease
from schedproj.store.protocol import (
    ENTRIES_CHANGED_MEMBER,
    EPOCH_VERSION,
    STAMP_MEMBER,
    WAKE_LIST_MAX,
    CounterKind,
    Keys,
    counter_field,
    run_field,
    sched_field,
)

#: Most sched records remembered as written (an entry is dropped when read back).
WRITTEN_MEMO_MAX = 200_000

#: Most lanes one call of a tick's read returns from the changed set, and most from the due
#: index (``lua/tick_read.lua``, ``lua/tick_page.lua``): a read holds Redis for what a page
#: costs (tens of ms), whatever the lane count; a larger read goes on by pages in the same tick.
READ_PAGE = 5000



@dataclass
class ReconcileCycle:
    """Where beat's periodic reconcile of the due index stands (``LaneStore.reconcile_slice``):
    how many of the declared lanes it did, the families left (the first is under way, at
    ``cursor``, the SSCAN cursor of ``heal_page.lua``). ``done``: every lane was marked."""

    families: list[str]
    declared: int = 0
    cursor: str = "0"
    done: bool = False
    #: How many lanes each call of the last slice marked.
    pages: list[int] = field(default_factory=list)


#: A lease record that cannot be read still means "held": never dispatch heavy work over it.
UNREADABLE_LEASE = LeaseView(lane="?", token="", fence=0, granted_at=0.0)


@dataclass(frozen=True)
class LockStatus:
    held: bool
    fence: int = 0
    event: str = ""  # acquired | renewed | held | replaced-garbage | bad-fence
    #                  | deferred-after-loss (not held: left to the beat seen holding it)
    #                  | vanished (held at a read's first call, no beat's at a later page)
    holder: str | None = None


@dataclass(frozen=True)
class EpochStatus:
    """What ``lua/epoch.lua`` said this tick: the state's epoch, the server's clock, and until
    when no heavy lease may be granted because state may have been lost."""

    id: str
    server_now_ms: int
    quarantine_until_ms: int
    #: Non-empty when this very call detected the loss: ``state-empty`` | ``state-missing`` |
    #: ``server-changed`` (what each means: ``lua/epoch.lua``; the quarantine is the same).
    cause: str = ""
    #: The epoch id this store read on its tick before ("" on its first): a beat that read an
    #: epoch before knows Redis held state, so an empty Redis is a loss to it, not a first start.
    known_id: str = ""

    @property
    def quarantine_left_s(self) -> float:
        return max(0.0, (self.quarantine_until_ms - self.server_now_ms) / 1000)


#: Before the first snapshot: no quarantine known.
NO_EPOCH = EpochStatus(id="", server_now_ms=0, quarantine_until_ms=0)


@dataclass(frozen=True)
class Snapshot:
    """Everything one tick reads, from a single Redis round trip."""

    lock: LockStatus
    states: Mapping[str, LaneState]
    lease: LeaseView | None
    errors: Mapping[str, str] = field(default_factory=dict)
    paused: frozenset[str] = frozenset()
    forced: frozenset[str] = frozenset()
    epoch: EpochStatus = NO_EPOCH
    #: The lanes hash as read (field -> raw value), for compare-and-set writes.
    raw: Mapping[str, str] = field(default_factory=dict)
    #: An incremental read (:meth:`LaneStore.tick_snapshot`): the lanes read, in order (those
    #: that changed first), which of them changed, their due-index scores (None: not in the
    #: index, a removed member), and the index's next look after now (None: none).
    looked: tuple[str, ...] = ()
    changed: frozenset[str] = frozenset()
    scores: Mapping[str, float | None] = field(default_factory=dict)
    next_look: float | None = None
    #: Keys the read found broken: key -> ``stale`` (a derived key whose stamp disagrees:
    #: deleted, emptied or restored from an older copy) or ``wrong-type`` (read as empty).
    broken: Mapping[str, str] = field(default_factory=dict)
    #: The schedule entries changed (``ENTRIES_CHANGED_MEMBER`` was in the changed set).
    entries_changed: bool = False
    #: The string keys the caller asked to read with the tick (``tick_snapshot``'s
    #: ``also_get``), each key's value (None: no such string).
    got: Mapping[str, str | None] = field(default_factory=dict)
    #: The heavy lease changed hands while the read went by pages (a run ended, or was
    #: granted, between its first call and its last): records read by earlier pages may say
    #: in flight a run the lease, read by the last page, no longer names. No single read shows
    #: that; beat grants nothing on such a read (the lanes that changed are read next tick).
    holds_moved: bool = False
    #: ``tick_snapshot``'s ``watch`` keys (the pool slots' leases) as read just before the
    #: read, in its round trip: key -> text (None: no such key).
    watched: Mapping[str, str | None] = field(default_factory=dict)


def lock_status(reply: list[Any]) -> LockStatus:
    """``lua/beat_lock.lua``'s reply: {1, fence, event} held, or {0, holder, event}."""
    ok, value, event = reply
    return (LockStatus(held=True, fence=int(value), event=str(event)) if int(ok) == 1
            else LockStatus(held=False, holder=str(value), event=str(event)))


def lost_mid_read(lock: LockStatus, read: list[Any]) -> LockStatus:
    """The lock as a read that did not complete leaves it (``read``: ``{0}``, or a page's
    ``{0, holder}``). A lock gone by a later page with no holder vanished (Redis lost its
    state): no other beat took over, and this beat still holds what it remembers."""
    if not lock.held:
        return lock
    if len(read) < 2:
        return replace(lock, held=False)
    holder = str(read[1])
    return (LockStatus(held=False, event="vanished") if not holder
            else LockStatus(held=False, holder=holder, event="held"))


def unparsed(lock: LockStatus, epoch: EpochStatus, read: list[Any],
             watched: Mapping[str, str | None]) -> Snapshot:
    """A tick read's lock, epoch and broken keys, its records not decoded (``states`` empty,
    no lease). For a beat new to the lock, which reads every lane afresh next: at start-up
    with 1,000,000 members marked changed, decoding their records only to drop them was most
    of the first tick and of its peak memory."""
    broken = read[9]
    return Snapshot(lock=lock, states={}, lease=None, epoch=epoch, watched=watched,
                    broken=dict(zip(broken[::2], broken[1::2], strict=True)))


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
    # The empty records shared (they are frozen) and the state built without ``__init__``:
    # a lane with one record built the other and its state through ``__init__``, 3 µs a
    # lane on the tick that reads a bulk add's members.
    no_run, no_sched = EMPTY_STATE.run, EMPTY_STATE.sched
    states = {
        lane: new_state(runs.get(lane, no_run), scheds.get(lane, no_sched))
        for lane in set(runs) | set(scheds)
        if lane not in errors
    }
    return states, errors


def audit_entry(entry: Mapping[str, Any]) -> str:
    """An entry of an audit list (the journal, the dispatch log) as stored."""
    return json.dumps(entry, separators=(",", ":"))


class LaneStore:
    """Reads and writes lane state, the wake list and scheduling errors."""

    def __init__(self, client: redis.Redis, keys: Keys,
                 audit_client: redis.Redis | None = None, *, read_page: int = READ_PAGE,
                 compact_records: bool = False) -> None:
        self.client = client
        self.keys = keys
        self.audit_client = audit_client or client
        self.read_page = read_page
        #: Write run and sched records in the compact format (``SCHEDPROJ_COMPACT_RECORDS``;
        #: core/records.py). Records of either format are read whatever it says.
        self.compact_records = compact_records
        #: How many lanes each call of the last tick read returned (its first call's, then
        #: each page's): what bounds how long one call holds Redis.
        self.read_pages: tuple[int, ...] = ()
        #: How many lanes each call of the last heal put back (the declared ones, then a page
        #: of family members a call).
        self.heal_pages: list[int] = []
        self._decoded: dict[tuple[str, str], Any] = {}
        #: The last tick read's decoded records of the lanes it reads every tick.
        self._always_decoded: dict[tuple[str, str], Any] = {}
        #: What this store last wrote to each sched field (raw, record), so reading it back
        #: unchanged costs no decoding (bounded by :data:`WRITTEN_MEMO_MAX`).
        self._written: dict[str, tuple[str, SchedRecord]] = {}
        self._lock = scripts.register(client, "beat_lock")
        self._unlock = scripts.register(client, "beat_unlock")
        self._renew = scripts.register(client, "beat_renew")
        self._guarded_hset = scripts.register(client, "guarded_hset")
        self._finish = scripts.register(client, "run_finish")
        self._skipped = scripts.register(client, "run_mark_skipped")
        self._epoch = scripts.register(client, "epoch")
        self._epoch_fresh = scripts.register(client, "epoch_fresh")
        self._cas = scripts.register(client, "run_cas")
        self._mark_lost = scripts.register(client, "run_mark_lost")
        self._tick = scripts.register(client, "tick")
        self._tick_page = scripts.register(client, "tick_page")
        self._heal = scripts.register(client, "tick_heal")
        self._heal_page = scripts.register(client, "heal_page")
        self._reconcile_page = scripts.register(client, "reconcile_page")
        self._epoch_check = scripts.register(client, "epoch_check")
        self._lua_gc = scripts.register(client, "lua_gc")
        #: The epoch id the last read returned (``EpochStatus.known_id`` of the next).
        self._epoch_id = ""
        #: A wait was woken: the next tick's read empties the wake list first (same round trip).
        self._wake_pending = False
        #: The last idle read (``lua/tick.lua``: the lock renewed, no loss, no lane read): its
        #: digest and what it parsed to, for a read whose reply says it is the same.
        self._idle: tuple[str, Snapshot] | None = None
        #: What ``tick.lua``'s keys and steady arguments were encoded for, and them encoded.
        self._tick_encoded: tuple[tuple[Any, ...], list[bytes], list[bytes]] | None = None

    def _pipelined(self, script: Any, keys: Sequence[str | bytes], args: Sequence[Any], *,
                   before: Sequence[tuple[Any, ...]] = (),
                   after: Sequence[tuple[Any, ...]] = (),
                   client: redis.Redis | None = None) -> list[Any]:
        """``before``'s commands, ``script`` (EVALSHA) and ``after``'s, in one round trip;
        every reply, the script's after ``before``'s. A script the server does not know yet
        (first use, a restart) is loaded and run again alone: the other commands ran once
        already and are not repeated. An error of any command is raised."""
        client = client or self.client
        pipe = client.pipeline(transaction=False)
        for command in before:
            pipe.execute_command(*command)  # type: ignore[no-untyped-call]
        # EVALSHA as a plain command: a pipeline holding a registered Script first sends its
        # own SCRIPT EXISTS (a second round trip), and redis-py's cluster pipeline blocks its
        # evalsha method, not the command.
        pipe.execute_command(  # type: ignore[no-untyped-call]
            "EVALSHA", script.sha, len(keys), *keys, *args)
        for command in after:
            pipe.execute_command(*command)  # type: ignore[no-untyped-call]
        replies = pipe.execute(raise_on_error=False)
        at = len(before)
        if isinstance(replies[at], redis.exceptions.NoScriptError):
            replies[at] = script(keys=list(keys), args=list(args), client=client)
        if isinstance(replies[at], Exception):
            raise replies[at]
        return list(replies)

    @staticmethod
    def _appended(replies: Sequence[Any], key: str,
                  failed: Callable[[BaseException], None] | None) -> None:
        """The audit list's replies of a pipeline: a refusal goes to ``failed`` (the caller
        says it), else is raised - never instead of the script's answer, which stands."""
        for reply in replies:
            if isinstance(reply, Exception):
                if failed is None:
                    raise reply
                failed(reply)
                return

    def snapshot(self, beat_token: str, lock_ttl_s: float,
                 quarantine_s: float = 0.0) -> Snapshot:
        """Renew (or try to take) the beat lock, check the state's epoch (starting a
        quarantine of ``quarantine_s`` if Redis lost state) and read all state: one round
        trip."""
        try:
            replies = self._snapshot_pipeline(beat_token, lock_ttl_s, quarantine_s)
        except redis.exceptions.NoScriptError:
            # First use on this server (or after SCRIPT FLUSH / a restart): load, then retry.
            self.client.script_load(self._lock.script)
            self.client.script_load(self._epoch.script)
            replies = self._snapshot_pipeline(beat_token, lock_ttl_s, quarantine_s)
        lock_reply, epoch_reply, raw_states, raw_lease, paused, forced = replies
        epoch = self._epoch_status(epoch_reply)
        lock = lock_status(lock_reply)
        states, errors = parse_states(raw_states, self.keys.lanes, self._decoded)
        try:
            lease = parse_lease(raw_lease, self.keys.lease)
        except StateError as exc:
            errors["<lease>"] = str(exc)
            lease = UNREADABLE_LEASE
        return Snapshot(lock=lock, states=states, lease=lease, errors=errors,
                        paused=frozenset(paused), forced=frozenset(forced), epoch=epoch,
                        raw=raw_states)

    def _snapshot_pipeline(self, beat_token: str, lock_ttl_s: float,
                           quarantine_s: float) -> list[Any]:
        # EVALSHA directly: a pipeline holding a registered Script first sends its own
        # SCRIPT EXISTS, which would cost a second round trip on every tick. Sent as a plain
        # command: redis-py's cluster pipeline blocks its evalsha method, not the command.
        pipe = self.client.pipeline(transaction=False)
        pipe.execute_command(  # type: ignore[no-untyped-call]
            "EVALSHA", self._lock.sha, 2, self.keys.beat_lock, self.keys.beat_fence,
            beat_token, int(lock_ttl_s * 1000))
        pipe.execute_command(  # type: ignore[no-untyped-call]
            "EVALSHA", self._epoch.sha, 2, self.keys.epoch,
            self.keys.beat_fence, int(quarantine_s * 1000), uuid.uuid4().hex, EPOCH_VERSION)
        pipe.hgetall(self.keys.lanes)
        pipe.get(self.keys.lease)
        pipe.smembers(self.keys.paused)
        pipe.smembers(self.keys.run_now)
        return pipe.execute()

    def tick_snapshot(self, beat_token: str, lock_ttl_s: float, quarantine_s: float, *,
                      cursor: float | None, now: float, always: Sequence[str] = (),
                      holder_seen_ms: int = 0, also_get: Sequence[str] = (),
                      watch: Sequence[str] = (), records: bool = True,
                      on_read: Callable[[int], None] | None = None) -> Snapshot:
        """Renew the beat lock, check the epoch and read what changed: the lanes marked
        changed since the last call and those whose next look in the due index lies in
        (``cursor``, ``now``] (every due lane when ``cursor`` is None), plus ``always``. One
        round trip, costing what changed: O(log N) when nothing did. More than
        :attr:`read_page` lanes changed or due: read on by pages (:meth:`_read_pages`), each
        call bounded, before this returns - the tick plans on the whole read, never on part.
        ``holder_seen_ms``: ARGV[10] of ``lua/tick.lua`` (a vacant lock left after a loss).
        ``watch``: lease keys (the pool slots') read just before the script, in its round trip
        (``Snapshot.watched``): a caller that reads them again after the read knows whether a
        run ended in between (its record may say in flight, its slot free).

        ``also_get``: string keys (the due checks' stamps) read by the script, after its read
        (``Snapshot.got``; an MGET after the script was a pipeline for the client to pack and
        parse on every idle tick); with a read by pages, read again once the last page is in,
        so never older than any record read. Keys under this store's prefix: on a cluster, in
        the script's hash slot. ``records`` False: only the lock, the epoch and the broken
        keys are parsed (a beat new to the lock reads every lane afresh next: :func:`unparsed`).
        ``on_read``: called with how many lanes the read brought once it is complete, before
        they are decoded (beat's lock keeper: decoding a million records outlasts the lock).
        """
        k = self.keys
        keys, (token, ttl_ms, quarantine_ms, version, stamp, page) = self._tick_constants(
            beat_token, lock_ttl_s, quarantine_s, tuple(also_get))
        # One script call: tick.lua renews the lock, checks the epoch, reads, and reads the
        # keys asked for after its read (redis-py's Script loads it on a NoScriptError and
        # retries). A beat new to the lock (not ``records``) never gets the idle reply.
        reply, watched = self._tick_call(keys, [
            token, ttl_ms, quarantine_ms, uuid.uuid4().hex, version,
            "-inf" if cursor is None else repr(cursor), repr(now), stamp, page, holder_seen_ms,
            self._idle[0] if self._idle is not None and records else "", *always], watch)
        if isinstance(reply, int):
            return self._idle_again(reply, watched)
        self._idle = None
        lock_reply, epoch_reply, read = reply[:3]
        got: list[Any] = [reply[3]] if also_get and len(reply) > 3 else []
        epoch = self._epoch_status(epoch_reply)
        lock = lock_status(lock_reply)
        if lock.event == "bad-fence":
            return Snapshot(lock=lock, states={}, lease=None, epoch=epoch,
                            broken={k.beat_fence: "not-an-integer"})
        read, moved, got = self._read_on(beat_token, lock_ttl_s, now, read, also_get, got)
        if on_read is not None and int(read[0]) == 1:
            on_read(len(read[1]))
        if int(read[0]) != 1:
            return Snapshot(lock=lost_mid_read(lock, read), states={}, lease=None, epoch=epoch)
        if not records:
            return unparsed(lock, epoch, read, watched)
        snap = self._parse_tick(lock, epoch, read,
                                dict(zip(also_get, got[0], strict=True)) if got else {}, always)
        if len(reply) > 4 and reply[4]:
            self._idle = (str(reply[4]), snap)  # an idle read: the next may say "the same"
        return replace(snap, holds_moved=moved, watched=watched) if moved or watch else snap

    def _read_on(self, beat_token: str, lock_ttl_s: float, now: float, read: list[Any],
                 also_get: Sequence[str], got: list[Any]) -> tuple[list[Any], bool, list[Any]]:
        """The tick's read (``read``: the first call's) once complete: read on by pages when
        it said there is more (:meth:`_read_pages`), with whether the lease changed hands in
        between and ``also_get``'s values read again after the last page."""
        moved = False
        if int(read[0]) == 1:
            self.read_pages = (len(read[1]),)
            if read[10]:
                first_lease = read[6] or None  # the first call reads the lease too
                read = self._read_pages(beat_token, lock_ttl_s, now, read)
                lease_key = self.keys.lease
                moved = int(read[0]) == 1 and holders_moved({lease_key: first_lease},
                                                            {lease_key: read[6] or None})
                if also_get and int(read[0]) == 1:
                    # After the last page: the first call's values are older than the pages.
                    got = [self.client.mget(also_get)]
        return read, moved, got

    def _idle_again(self, server_now_ms: int, watched: dict[str, str | None]) -> Snapshot:
        """The read ``lua/tick.lua`` found the same as the last idle read this store parsed
        (its digest): that read's snapshot, at the server time of this one. On an idle tick
        parsing the full reply again was most of the client's part of the tick. (A snapshot's
        mappings are read-only to every reader: this one is handed out again.)"""
        assert self._idle is not None, "tick.lua answered an idle digest never sent"
        snap = self._idle[1]
        self.read_pages = (0,)
        epoch = snap.epoch
        snap = replace(snap, epoch=EpochStatus(
            id=epoch.id, server_now_ms=server_now_ms,
            quarantine_until_ms=epoch.quarantine_until_ms, known_id=self._epoch_id))
        return replace(snap, watched=watched) if watched else snap

    def _tick_constants(self, beat_token: str, lock_ttl_s: float, quarantine_s: float,
                        also_get: tuple[str, ...]) -> tuple[list[bytes], list[bytes]]:
        """``lua/tick.lua``'s keys and the arguments that stay the same from tick to tick,
        encoded once for as long as they do: redis-py encodes each str argument of every
        call, and the idle tick's 27 arguments cost the client more to pack than its short
        reply costs to parse."""
        asked = (beat_token, lock_ttl_s, quarantine_s, also_get, self.read_page)
        if self._tick_encoded is None or self._tick_encoded[0] != asked:
            k = self.keys
            keys = [k.beat_lock, k.beat_fence, k.epoch, k.due, k.changed, k.lanes, k.lease,
                    k.paused, k.run_now, k.due_stamp, k.changed_stamp, k.changed_reading,
                    *also_get]
            args = [beat_token, int(lock_ttl_s * 1000), int(quarantine_s * 1000),
                    EPOCH_VERSION, STAMP_MEMBER, self.read_page]
            self._tick_encoded = (asked, [key.encode() for key in keys],
                                  [str(arg).encode() for arg in args])
        return self._tick_encoded[1], self._tick_encoded[2]

    def _tick_call(self, keys: Sequence[str | bytes], args: Sequence[Any], watch: Sequence[str],
                   ) -> tuple[list[Any] | int, dict[str, str | None]]:
        """``tick.lua``'s reply and ``watch``'s values read just before it, in one round
        trip (the script alone when there is nothing before it: no pipeline to pack and
        parse). After a wake, the wake list is emptied in the same round trip, before the
        read: a run that ends after the DEL wakes the next wait, and one that ended before it
        is in this read."""
        before: list[tuple[Any, ...]] = [("MGET", *watch)] if watch else []
        if self._wake_pending:
            self._wake_pending = False
            before.append(("DEL", self.keys.wake))
        if not before:
            return self._tick(keys=keys, args=args), {}
        replies = self._pipelined(self._tick, keys, args, before=before)
        for reply in replies[:len(before)]:
            if isinstance(reply, Exception):
                raise reply  # a wake list of the wrong type: beat says which key
        watched = dict(zip(watch, replies[0], strict=True)) if watch else {}
        return replies[len(before)], watched

    def _read_pages(self, beat_token: str, lock_ttl_s: float, now: float,
                    first: list[Any]) -> list[Any]:
        """The rest of a read too large for one call (``first``: ``tick_read.lua``'s reply,
        with its continuation): ``tick_page.lua`` a page a call until the read is complete,
        merged into one reply of ``tick_read.lua``'s shape ({0, holder} if the lock was
        lost: ``lost_mid_read``).

        Why pages read one after another plan as one read: every writer other than beat
        (a run's end, a lost-run mark, an operator's pause or run-now, ``touch``) marks the
        lane changed in the same atomic step as its record and index score. The first call
        put the changed set aside and started a fresh one, so whatever changes between two
        pages is in the fresh set, which the next tick reads: a lane read before its change
        is planned on its record as it was (as if that write had come just after a single
        read, which beat's guarded writes already allow for), and a lane whose score moved
        to a place this read had passed is read then. A lane read twice keeps its later
        record. The lease and the operator sets are read by the last page, after every
        record: a heavy run that ended meanwhile reads as in flight with its lease free - a
        state no single read shows, in which its lane looks due and not running. So the
        caller compares the lease the first call read with the last page's
        (``Snapshot.holds_moved``) and beat grants nothing on a read they differ in."""
        records: dict[str, tuple[Any, Any, Any]] = {}
        changed: dict[str, None] = {}

        def take(names: list[Any], n_changed: Any, values: list[Any], scores: list[Any]) -> None:
            for i, name in enumerate(names):
                records[name] = (values[2 * i], values[2 * i + 1], scores[i])
                if i < int(n_changed):
                    changed[name] = None

        _, names, n_changed, values, scores, nxt, lease, paused, forced, broken, more = first
        take(names, n_changed, values, scores)
        broken = list(broken)
        counts = [len(names)]
        k = self.keys
        keys = [k.beat_lock, k.due, k.changed_reading, k.lanes, k.lease, k.paused, k.run_now]
        while more:
            page = self._tick_page(keys=keys, args=[
                beat_token, int(lock_ttl_s * 1000), repr(now), STAMP_MEMBER, self.read_page,
                *more])
            if int(page[0]) != 1:
                self.read_pages = tuple(counts)
                return list(page)  # {0, holder}
            _, names, n_changed, values, scores, more, page_broken, *tail = page
            take(names, n_changed, values, scores)
            broken += page_broken
            counts.append(len(names))
            if not more and tail:
                nxt, lease, paused, forced = tail
        self.read_pages = tuple(counts)
        order = [*changed, *(name for name in records if name not in changed)]
        merged_values = [v for name in order for v in records[name][:2]]
        return [1, order, len(changed), merged_values, [records[n][2] for n in order], nxt,
                lease, paused, forced, broken, []]

    def _epoch_status(self, reply: list[Any]) -> EpochStatus:
        """``lua/epoch.lua``'s reply, with the epoch id this store read before."""
        epoch = EpochStatus(id=str(reply[0]), server_now_ms=int(reply[1]),
                            quarantine_until_ms=int(reply[2]), cause=str(reply[3]),
                            known_id=self._epoch_id)
        self._epoch_id = epoch.id or self._epoch_id
        return epoch

    def _parse_tick(self, lock: LockStatus, epoch: EpochStatus, read: list[Any],
                    got: Mapping[str, str | None], always: Sequence[str] = ()) -> Snapshot:
        _, names, n_changed, values, scores, nxt, raw_lease, paused, forced, broken, _ = read
        entries_changed = ENTRIES_CHANGED_MEMBER in names[:int(n_changed)]
        if entries_changed:  # the marker is no lane: read it as the flag it is
            at = names.index(ENTRIES_CHANGED_MEMBER)
            names, scores = names[:at] + names[at + 1:], scores[:at] + scores[at + 1:]
            values, n_changed = values[:2 * at] + values[2 * at + 2:], int(n_changed) - 1
        raw: dict[str, str] = {}
        for i, lane in enumerate(names):
            for part, value in (("run", values[2 * i]), ("sched", values[2 * i + 1])):
                if value is not None:
                    raw[f"{lane}|{part}"] = value
        # Records this beat wrote and reads back unchanged need no decoding, nor those of the
        # lanes read every tick (``always``) read back as the last read had them: on an idle
        # tick with the REM chain, decoding its records again was a third of the tick.
        written = self._written
        memo: dict[tuple[str, str], Any] = self._always_decoded
        for fld, value in raw.items():
            hit = written.pop(fld, None)
            if hit is not None and hit[0] == value:
                memo[(fld, value)] = hit[1]
        states, errors = parse_states(raw, self.keys.lanes, memo)
        # Kept for the next read: this read's records of those lanes (a handful), no more.
        self._always_decoded = {
            key: memo[key] for lane in always for part in ("run", "sched")
            if (value := raw.get(fld := f"{lane}|{part}")) is not None
            and (key := (fld, value)) in memo}
        looked = tuple(str(n) for n in names)
        empty = LaneState()
        full = {lane: states.get(lane, empty) for lane in looked if lane not in errors}
        try:
            lease = parse_lease(raw_lease or None, self.keys.lease)
        except StateError as exc:
            errors["<lease>"] = str(exc)
            lease = UNREADABLE_LEASE
        return Snapshot(lock=lock, states=full, lease=lease, errors=errors,
                        paused=frozenset(paused), forced=frozenset(forced), epoch=epoch,
                        raw=raw, looked=looked, changed=frozenset(looked[:int(n_changed)]),
                        scores={lane: (float(sc) if sc not in ("", None) else None)
                                for lane, sc in zip(looked, scores, strict=True)},
                        next_look=float(nxt) if nxt not in ("", None) else None,
                        entries_changed=entries_changed,
                        broken=dict(zip(broken[::2], broken[1::2], strict=True)), got=got)

    def heal_derived(self, beat_token: str, lanes: Sequence[str], *, rescore: bool) -> bool:
        """Rebuild the due index and the changed set and stamp both afresh (``tick_heal.lua``):
        ``lanes`` (the declared lanes) and every family member are put in the index due for a
        look now; with ``rescore`` every lane is (the index is rebuilt from nothing), else
        only those missing. The members a page a call (``heal_page.lua``: each page read and
        indexed atomically), so no call costs more than a page however large a family is.
        False if this beat no longer holds the lock.

        The index is stamped by the first call, before the members are back: nothing reads
        it in between (this beat's tick waits for this), and a beat that stops halfway leaves
        members missing only until the next heal - the next beat's first (every taking over
        heals), or this one's next tick (its heal did not complete, so it heals again)."""
        k = self.keys
        done = self._heal(keys=[k.beat_lock, k.due, k.changed, k.due_stamp, k.changed_stamp],
                          args=[beat_token, STAMP_MEMBER, "1" if rescore else "0", *lanes])
        if int(done) != 1:
            return False
        self.heal_pages = [len(lanes)]
        for family in self.family_names():
            cursor = "0"
            while True:
                page = self._heal_page(keys=[k.beat_lock, k.due, k.family(family)],
                                       args=[beat_token, family, cursor, self.read_page,
                                             "1" if rescore else "0"])
                if int(page[0]) != 1:
                    return False
                cursor = str(page[1])
                self.heal_pages.append(int(page[2]))
                if cursor == "0":
                    break
        return True

    def reconcile_cycle(self) -> ReconcileCycle:
        """A reconcile cycle from its start: the declared lanes, then each family's members
        (the families of now: one added later was indexed by its adding)."""
        return ReconcileCycle(families=self.family_names())

    def reconcile_slice(self, beat_token: str, lanes: Sequence[str], cycle: ReconcileCycle,
                        budget: int) -> bool:
        """The next ``budget`` lanes of ``cycle`` (``lanes``: the declared lanes, then each
        family's members a page a call) put back in the due index where missing and marked
        changed (``reconcile_page.lua``): the next tick reads each and writes its next look
        afresh, whatever its score was. A cycle of slices re-checks every lane; each slice
        costs the next read about ``budget`` lanes more, however many lanes there are (an
        SSCAN page may hold a few more than asked, and a set small enough for Redis to keep
        compact - 128 members, 512 integers by default - comes whole), in at most 16 calls.
        Moves ``cycle`` on (``done`` once every lane was marked). False if this beat no
        longer holds the lock."""
        k = self.keys
        cycle.pages = []
        left = budget
        while left > 0 and not cycle.done:
            if cycle.declared < len(lanes):
                page = lanes[cycle.declared:cycle.declared + left]
                reply = self._reconcile_page(keys=[k.beat_lock, k.due, k.changed],
                                             args=[beat_token, "", "0", left, *page])
                cycle.declared += len(page)
            elif cycle.families:
                family = cycle.families[0]
                reply = self._reconcile_page(
                    keys=[k.beat_lock, k.due, k.changed, k.family(family)],
                    args=[beat_token, family, cycle.cursor, left])
                cycle.cursor = "0" if int(reply[0]) != 1 else str(reply[1])
                if cycle.cursor == "0":
                    cycle.families.pop(0)
            else:
                cycle.done = True
                break
            if int(reply[0]) != 1:
                return False
            cycle.pages.append(int(reply[2]))
            # A call costs a round trip however few members its page held: each takes at
            # least a sixteenth of the budget, so a slice makes at most 16 calls (many small
            # families are done over more slices, never in one tick's hundreds of calls).
            left -= max(int(reply[2]), budget // 16, 1)
        if cycle.declared >= len(lanes) and not cycle.families:
            cycle.done = True
        return True

    def collect_script_garbage(self) -> tuple[float, float] | None:
        """Have Redis collect its Lua heap's garbage now (``lua_gc.lua``): after a full read,
        whose garbage would otherwise slow every script call until collected step by step.
        (KiB before, KiB after), or None where the server refuses (a Lua sandbox without
        ``collectgarbage``): then the garbage goes the slow way, nothing else changes."""
        try:
            before, after = self._lua_gc(keys=[self.keys.beat_lock])
        except redis.ResponseError:
            return None
        return float(before), float(after)

    def family_names(self) -> list[str]:
        """The families with members (a set of the wrong type reads as none: their members
        are not indexed until it is fixed)."""
        try:
            return sorted(str(f) for f in self.client.smembers(self.keys.families))
        except redis.ResponseError:
            return []

    def ensure_indexed(self, lanes: Sequence[str]) -> None:
        """Put lanes missing from the due index in it, due for a look now (a beat's first
        tick: lanes declared since, or a deployment from before the index)."""
        for i in range(0, len(lanes), 1000):
            chunk = lanes[i:i + 1000]
            if chunk:
                self.client.zadd(self.keys.due, dict.fromkeys(chunk, 0.0), nx=True)

    def touch(self, lanes: Sequence[str], *, look_now: bool = False) -> None:
        """Mark lanes changed for beat (and, with ``look_now``, due for a look now): for
        anything that writes lane state outside schedproj's own scripts."""
        if not lanes:
            return
        pipe = self.client.pipeline(transaction=True)
        pipe.sadd(self.keys.changed, *lanes)
        if look_now:
            pipe.zadd(self.keys.due, dict.fromkeys(lanes, 0.0), xx=True)
        pipe.execute()

    def pause(self, lane: str) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.sadd(self.keys.paused, lane)
        pipe.sadd(self.keys.changed, lane)
        pipe.execute()

    def resume(self, lane: str) -> int:
        """Resume a paused lane (it is looked at again at once); 1 if it was paused."""
        pipe = self.client.pipeline(transaction=True)
        pipe.srem(self.keys.paused, lane)
        pipe.sadd(self.keys.changed, lane)
        pipe.zadd(self.keys.due, {lane: 0.0}, xx=True)
        return int(pipe.execute()[0])

    def run_now(self, lane: str) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.sadd(self.keys.run_now, lane)
        pipe.sadd(self.keys.changed, lane)
        pipe.zadd(self.keys.due, {lane: 0.0}, xx=True)
        pipe.execute()

    def renew(self, beat_token: str, lock_ttl_s: float) -> bool:
        """Extend the beat lock this beat holds (mid-tick, when a tick runs long). False if
        it is no longer held by this beat (expired, vanished or taken: the tick must stop)."""
        return self.renew_held(beat_token, lock_ttl_s) is None

    def renew_held(self, beat_token: str, lock_ttl_s: float) -> str | None:
        """Extend the beat lock if this beat holds it (``lua/beat_renew.lua``: a vacant lock
        is never taken here, a vanished one is left to the next tick's lock step). None when
        renewed, else who holds it: '' when no beat does."""
        reply = self._renew(keys=[self.keys.beat_lock], args=[beat_token, int(lock_ttl_s * 1000)])
        return None if int(reply[0]) == 1 else str(reply[1])

    def unlock(self, beat_token: str) -> bool:
        return int(self._unlock(keys=[self.keys.beat_lock], args=[beat_token])) == 1

    def write_sched(self, beat_token: str, records: Mapping[str, SchedRecord],
                    looks: Mapping[str, float] | None = None) -> bool:
        """Write beat-owned records and due-index scores (``looks``: lane -> next look)
        together; False (nothing written) if this beat lost the lock."""
        if not records and not looks:
            return True
        keys, args = self.sched_write(beat_token, records, looks)
        return int(self._guarded_hset(keys=keys, args=args)) >= 0

    def sched_write(self, beat_token: str, records: Mapping[str, SchedRecord],
                    looks: Mapping[str, float] | None = None) -> tuple[list[str], list[str]]:
        """:meth:`write_sched`'s call (``lua/guarded_hset.lua``'s keys and arguments), for a
        script that runs it with another (``HeavyLease.acquire_and_write``)."""
        args: list[str] = [beat_token, STAMP_MEMBER, str(len(records))]
        if len(self._written) > WRITTEN_MEMO_MAX:
            self._written.clear()
        for lane, record in records.items():
            fld, raw = sched_field(lane), self.encode_record(record)
            args += [fld, raw]
            # Remembered before it is known written: a read back is compared with it, so an
            # entry never written only costs that read its decoding.
            self._written[fld] = (raw, record)
        for lane, look in (looks or {}).items():
            args += [lane, repr(float(look))]
        return [self.keys.beat_lock, self.keys.lanes, self.keys.due, self.keys.due_stamp], args

    def encode_record(self, record: RunRecord | SchedRecord) -> str:
        """A run or sched record as this store writes it (its format by
        :attr:`compact_records`)."""
        return encode(record, compact=self.compact_records)

    @property
    def record_format(self) -> int:
        """The format version of the records this store writes."""
        return COMPACT_FORMAT if self.compact_records else LONG_FORMAT

    def clear_inflight(self, beat_token: str, lane: str) -> None:
        """Forget a dispatch whose message never left, so the lane is due again next tick."""
        raw = self.client.hget(self.keys.lanes, sched_field(lane))
        if raw is None:
            return
        record = decode(SchedRecord, raw, f"{self.keys.lanes} field {sched_field(lane)!r}")
        self.write_sched(beat_token, {lane: replace(record, inflight_task_id=None,
                                                    inflight_deadline=None)})

    def declare_fresh(self) -> bool:
        """Declare this state new (nothing ever ran on it), so no quarantine is needed before
        the first grant. Refused (False) once any lane state, a lease or an epoch (a beat
        ran: after an empty restart it holds the quarantine) exists."""
        done = self._epoch_fresh(keys=[self.keys.epoch, self.keys.lanes, self.keys.lease],
                                 args=[uuid.uuid4().hex, EPOCH_VERSION])
        return int(done) == 1

    def state_uncertain(self) -> bool:
        """May Redis have lost state a moment ago? True while the epoch record is missing or
        unreadable, names another server process, or is in its quarantine (the checks of
        ``lua/lease_acquire.lua``): what a record says then may predate the loss."""
        # Asked of the script (the rule lua/epoch_refusal.lua writes once), which runs on the
        # server holding the epoch: on a Redis Cluster, INFO sent beside a GET would go to
        # some other node, whose run_id never matches.
        return bool(self._epoch_check(keys=[self.keys.epoch]))

    def read_run_raw(self, lane: str) -> tuple[str | None, RunRecord]:
        """The run record as stored (for a compare-and-set) and decoded."""
        raw = self.client.hget(self.keys.lanes, run_field(lane))
        if raw is None:
            return None, RunRecord()
        text = raw if isinstance(raw, str) else raw.decode()
        return text, self.parse_run(lane, text)

    def parse_run(self, lane: str, raw: str | None) -> RunRecord:
        """``lane``'s run record as read from the lanes hash (None: absent, a new record);
        a :class:`StateError` naming the field when unreadable."""
        if raw is None:
            return RunRecord()
        return decode(RunRecord, raw, f"{self.keys.lanes} field {run_field(lane)!r}")

    def cas_run(self, lane: str, expected: str | None, record: RunRecord, *,
                dispatch: tuple[str, int] | None = None,
                mark_ttl_s: float | None = None,
                journal: tuple[str, Mapping[str, Any]] | None = None,
                journal_failed: Callable[[BaseException], None] | None = None,
                ) -> tuple[bool, str]:
        """Write ``record`` if the stored one is still ``expected`` (None: absent). With
        ``dispatch`` (task id, beat fence) also only if that message is its lane's current
        dispatch from the current beat. With ``mark_ttl_s`` the record's ``running_until``
        is set to Redis's clock plus that TTL. With ``journal`` (key, entry) the entry is
        appended after the write, whatever its answer (one round trip when the audit lists
        live on this Redis); its failure goes to ``journal_failed`` (else raised). Returns
        (written, reason refused)."""
        task_id, beat_fence = dispatch if dispatch is not None else ("", None)
        keys = [self.keys.lanes, self.keys.beat_fence, self.keys.changed, self.keys.epoch]
        args = [run_field(lane), expected or "", self.encode_record(record),
                sched_field(lane) if dispatch is not None else "", task_id,
                "" if beat_fence is None else str(beat_fence), lane,
                "" if mark_ttl_s is None else str(int(mark_ttl_s * 1000))]
        if journal is not None and self.audit_client is self.client:
            # The entry after the write, as when journaled apart, in the same round trip.
            (code, reason), *appended = self._pipelined(self._cas, keys, args,
                                                        after=self._log_commands(*journal))
            self._appended(appended, journal[0], journal_failed)
        else:
            code, reason = self._cas(keys=keys, args=args)
            if journal is not None:
                self._log_apart(journal, journal_failed)
        return int(code) == 1, str(reason)

    def _log_apart(self, journal: tuple[str, Mapping[str, Any]],
                   failed: Callable[[BaseException], None] | None) -> None:
        try:
            self.log(*journal)
        except Exception as exc:
            if failed is None:
                raise
            failed(exc)

    def mark_lost(self, lane: str, expected: str, record: RunRecord, *, task_id: str,
                  heavy: bool, leases: Sequence[str] = ()) -> bool:
        """Record a run lost (compare and set on ``expected``; for a heavy run only while no
        lease names it: the heavy lease, or the slot leases ``leases`` of a run of a pool
        beyond the default, every slot of its pool). True if recorded."""
        first, *others = leases or [self.keys.lease]
        done = self._mark_lost(keys=[self.keys.lanes, first, self.keys.changed,
                                     self.keys.due, self.keys.epoch, *others],
                               args=[run_field(lane), expected, self.encode_record(record), task_id,
                                     "1" if heavy else "0", lane])
        return int(done) == 1

    def read_run(self, lane: str) -> RunRecord:
        raw = self.client.hget(self.keys.lanes, run_field(lane))
        if raw is None:
            return RunRecord()
        return decode(RunRecord, raw, f"{self.keys.lanes} field {run_field(lane)!r}")

    def put_back_runs(self, records: Mapping[str, RunRecord]) -> int:
        """Write run records where none exists (after Redis lost state: a run that re-asserted
        its record first keeps it), put the lanes in the due index for a look now and mark them
        changed. Returns how many were written."""
        written = 0
        items = list(records.items())
        for i in range(0, len(items), 1000):
            chunk = items[i:i + 1000]
            pipe = self.client.pipeline(transaction=False)
            for lane, record in chunk:
                pipe.hsetnx(self.keys.lanes, run_field(lane), self.encode_record(record))
            pipe.zadd(self.keys.due, {lane: 0.0 for lane, _ in chunk}, nx=True)
            pipe.sadd(self.keys.changed, *(lane for lane, _ in chunk))
            written += sum(int(x) for x in pipe.execute()[:len(chunk)])
        return written

    def write_run(self, lane: str, record: RunRecord) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(self.keys.lanes, run_field(lane), self.encode_record(record))
        pipe.sadd(self.keys.changed, lane)
        pipe.execute()

    def finish(self, lane: str, record: RunRecord, *, token: str, fence: int,
               wake_message: str, write: bool = True, due_at: float | None = None,
               member: bool = False, encoded: str | None = None,
               journal: tuple[str, Mapping[str, Any]] | None = None,
               journal_failed: Callable[[BaseException], None] | None = None,
               ) -> tuple[bool, int]:
        """Record the outcome (unless ``write`` is False: the stored record is unreadable and
        must stay untouched), move the lane's due time in the due index to ``due_at``,
        release the lease (if ``token``), mark the lane changed and wake beat. Atomic.
        ``encoded``: the record already encoded. With ``journal`` (key, entry) the entry is
        appended first: in the same round trip when the audit lists live on this Redis; its
        failure goes to ``journal_failed`` (else raised), the outcome recorded all the same."""
        keys = [self.keys.lease, self.keys.lanes, self.keys.wake, self.keys.due,
                self.keys.changed, self.keys.due_stamp]
        args = [token, run_field(lane),
                encoded if encoded is not None else self.encode_record(record),
                fence, wake_message, "1" if write else "0", self.record_format, WAKE_LIST_MAX,
                "" if due_at is None else repr(float(due_at)), lane,
                "1" if member else "0", STAMP_MEMBER]
        if journal is not None and self.audit_client is self.client:
            # Journaled before the release, as when journaled apart: the audit never sees the
            # next holder's start before this run's end.
            commands = self._log_commands(*journal)
            replies = self._pipelined(self._finish, keys, args, before=commands)
            released, written = replies[len(commands)]
            self._appended(replies[:len(commands)], journal[0], journal_failed)
        else:
            if journal is not None:
                self._log_apart(journal, journal_failed)
            released, written = self._finish(keys=keys, args=args)
        return int(released) == 1, int(written)

    def mark_skipped(self, lane: str, reason: str, *, wake_message: str,
                     task_id: str = "") -> bool:
        """Record a refused message's outcome without touching the rest of the run record;
        with ``task_id``, that message's dispatch ends (it no longer holds its lane)."""
        done = self._skipped(keys=[self.keys.lanes, self.keys.wake, self.keys.changed],
                             args=[run_field(lane), reason, wake_message, self.record_format,
                                   WAKE_LIST_MAX, lane, task_id])
        return int(done) == 1

    def wake(self, message: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.lpush(self.keys.wake, message)
        pipe.ltrim(self.keys.wake, 0, WAKE_LIST_MAX - 1)
        pipe.execute()

    def wait_for_wake(self, timeout_s: float) -> bool:
        """Block until a run finishes or ``timeout_s`` passes; True if woken."""
        if timeout_s <= 0:
            return False
        # Never block longer than the client's socket timeout, or an idle wait reads as an
        # outage.
        limit = socket_timeout_of(self.client) or 10.0
        woke = self.client.blpop([self.keys.wake], timeout=min(timeout_s, float(limit) - 1.0))
        if woke is not None:
            # Several runs may have finished; one tick handles them all: the next tick's read
            # empties the list in its own round trip (``tick_snapshot``), not one of its own
            # here, on the hand-off's path.
            self._wake_pending = True
        return woke is not None

    def record_error(self, lane: str, message: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(self.keys.errors, lane, message)
        pipe.hincrby(self.keys.counters, counter_field(CounterKind.ERRORS, lane), 1)
        pipe.execute()

    def log(self, key: str, entry: Mapping[str, Any]) -> None:
        """Append to a bounded audit list (the journal or the dispatch log)."""
        self.log_many(key, [entry])

    def log_many(self, key: str, entries: Sequence[Mapping[str, Any]]) -> None:
        """Append several entries in one round trip."""
        if not entries:
            return
        pipe = self.audit_client.pipeline(transaction=False)
        for command in self._log_commands(key, *entries):
            pipe.execute_command(*command)  # type: ignore[no-untyped-call]
        pipe.execute()

    @staticmethod
    def _log_commands(key: str, *entries: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """The commands that append ``entries`` to the bounded audit list ``key``."""
        return [("RPUSH", key, *(audit_entry(e) for e in entries)),
                ("LTRIM", key, -defaults.AUDIT_LOG_LEN, -1)]

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
