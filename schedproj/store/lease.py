"""The heavy lease and the slot leases of pools, on Redis.

Granted with ``SET NX PX`` and a fencing number that only ever increases; started, renewed and
released by compare-and-set on the owner token (Lua), never blindly. The TTL is short and
renewed while a run holds the lease, so a killed holder frees it in seconds; renewal stops at
the maximum hold, the backstop for a run that never yields.

Every slot of a pool is such a lease (:class:`HeavyLease` on the slot's keys,
``Keys.slot(pool, i)``); the default pool's one slot is the heavy lease itself. A run that
takes ``k`` slots holds ``k`` slot leases under one token (:class:`SlotGroup`).
:class:`PoolSlots` reads every slot of the pools beyond the default in one round trip.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import redis

from schedproj.core.errors import StateError
from schedproj.core.pools import DEFAULT_POOL, Pool
from schedproj.core.records import LeaseView, decode, encode
from schedproj.store import scripts
from schedproj.store.protocol import STATE_VERSION, Keys, SlotKeys, pool_acquisitions


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


@dataclass(frozen=True)
class Holder:
    """Who runs under a lease: enough for a worker restarted on the same node to prove its
    predecessor dead (same host and node name, that process gone)."""

    host: str
    pid: int
    node: str


#: No holder identity (tests and operator tools).
NO_HOLDER = Holder(host="", pid=0, node="")


@dataclass(frozen=True)
class Grant:
    """The answer to an acquisition: ``fence`` when granted, else who holds it."""

    granted: bool
    fence: int = 0
    holder: str | None = None
    not_active_beat: bool = False
    #: Refused because Redis may have lost state (see ``lua/epoch.lua``): seconds the
    #: quarantine still lasts, or -1.0 when the epoch is not established yet.
    quarantine_s: float | None = None


class Renewal(tuple[bool, str]):
    """A renewal's answer: the pair (renewed, reason) it always was — so ``ok, reason =
    lease.renew(...)`` and comparisons with ``(True, '')`` keep working — plus ``pressure``,
    the raw ``current`` field of the pressure hash (``core.pressure.decode`` reads it), None
    when beat published none or the renewal failed."""

    pressure: str | None

    def __new__(cls, ok: bool, reason: str, pressure: str | None = None) -> Renewal:
        self = super().__new__(cls, (ok, reason))
        self.pressure = pressure
        return self

    @property
    def ok(self) -> bool:
        return self[0]

    @property
    def reason(self) -> str:
        return self[1]


@dataclass(frozen=True)
class OperatorRequest:
    """What an operator asked of the run holding the lease (``schedproj clear-lease``):
    ``stop`` (yield at the next checkpoint), ``terminate`` (its process is being killed) or
    ``clear`` (its lease was cleared once its node said it no longer runs it)."""

    action: str
    task_id: str
    lane: str
    fence: int
    at: float

    def encode(self) -> str:
        return json.dumps({"action": self.action, "task_id": self.task_id, "lane": self.lane,
                           "fence": self.fence, "at": self.at})

    @classmethod
    def decode(cls, raw: str | None) -> OperatorRequest | None:
        """The request, or None when there is none or it is not one (garbage is no request:
        it must never stop a run)."""
        try:
            data = json.loads(raw) if raw else None
            request = cls(action=str(data["action"]), task_id=str(data["task_id"]),
                          lane=str(data["lane"]), fence=int(data["fence"]),
                          at=float(data["at"])) if isinstance(data, dict) else None
        except (ValueError, TypeError, KeyError, OverflowError):
            return None
        return request


@dataclass(frozen=True)
class RunMark:
    """The run record a heavy run's start writes with the lease start
    (:meth:`HeavyLease.start_marked`): ``record`` (encoded, marked running with ``fence``)
    replaces ``expected`` (None: absent) at ``field`` of the lanes hash ``lanes``, the lane
    marked in ``changed``; ``entry`` is appended to the audit list ``journal`` ('': not
    here). ``record`` '' only reads what is stored."""

    lanes: str
    changed: str
    field: str
    expected: str | None
    record: str
    lane: str
    fence: int
    journal: str = ""
    entry: str = ""
    journal_len: int = 0


@dataclass(frozen=True)
class StartReply:
    """:meth:`HeavyLease.start_marked`'s answer: ``ok`` and the fence (or the reason
    refused) as :meth:`HeavyLease.start` gives them; ``marked`` when the run record was
    written (and, ``journaled``, the entry appended), else ``stored``, the record as stored
    (None: absent)."""

    ok: bool
    value: int | str
    marked: bool = False
    stored: str | None = None
    #: The journal's entry was appended with the mark.
    journaled: bool = False


#: How long an operator's request is kept: well past any run's hold and any tick.
REQUEST_TTL_S = 86_400.0


class HeavyLease:
    """Operations on the heavy lease for one key prefix."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        #: The counters-hash field this lease's grants bump (a slot's: its pool's).
        self.grants_field = pool_acquisitions(keys.pool if isinstance(keys, SlotKeys)
                                              else DEFAULT_POOL)
        self._acquire = scripts.register(client, "lease_acquire")
        self._grant_record = scripts.register(client, "lease_grant_record")
        self._start = scripts.register(client, "lease_start")
        self._renew = scripts.register(client, "lease_renew")
        self._release = scripts.register(client, "lease_release")
        self._clear = scripts.register(client, "lease_clear")

    def acquire(self, lane: str, token: str, ttl_s: float, now: float, *, task_id: str = "",
                beat_token: str = "") -> Grant:
        """Grant the lease to ``lane`` unless held; with ``beat_token`` only for the active
        beat."""
        keys, args = self._acquire_call(lane, token, ttl_s, now, task_id, beat_token)
        return self._grant_of(self._acquire(keys=keys, args=args))

    def acquire_and_write(self, lane: str, token: str, ttl_s: float, now: float, *,
                          task_id: str, beat_token: str,
                          write: tuple[list[str], list[str]]) -> tuple[Grant, int]:
        """:meth:`acquire` (for the active beat ``beat_token``) and, only if granted, the
        guarded write ``write`` (``LaneStore.sched_write``'s keys and arguments) in the same
        call (``lua/lease_grant_record.lua``): the grant and the dispatch it is for recorded
        in one round trip. Returns the grant and the write's answer (fields written, -1 not
        the lock's holder, -2 not run: the grant refused)."""
        keys, args = self._acquire_call(lane, token, ttl_s, now, task_id, beat_token)
        grant, written = self._grant_record(
            keys=[*keys, *write[0]], args=[len(keys), len(args), *args, *write[1]])
        return self._grant_of(grant), int(written)

    def _acquire_call(self, lane: str, token: str, ttl_s: float, now: float, task_id: str,
                      beat_token: str) -> tuple[list[str], list[Any]]:
        """``lua/lease_acquire.lua``'s keys and arguments."""
        # A slot of a pool also bumps the pool's last fence (see lua/lease_acquire.lua).
        pool_fence = [self.keys.pool_fence] if isinstance(self.keys, SlotKeys) else []
        return ([self.keys.lease, self.keys.lease_fence, self.keys.beat_lock,
                 self.keys.counters, self.keys.epoch, *pool_fence],
                [token, lane, _ms(ttl_s), repr(now), task_id, beat_token, int(now * 1000),
                 STATE_VERSION, self.grants_field])

    @staticmethod
    def _grant_of(reply: Any) -> Grant:
        """``lua/lease_acquire.lua``'s answer as a :class:`Grant`."""
        code, value = reply
        if int(code) == 1:
            return Grant(granted=True, fence=int(value))
        if int(code) == -1:
            return Grant(granted=False, not_active_beat=True)
        if int(code) == -2:
            left = float(value)
            return Grant(granted=False, quarantine_s=left / 1000 if left >= 0 else -1.0)
        return Grant(granted=False, holder=str(value))

    def start(self, token: str, ttl_s: float, now: float, *, beat_fence: int | None = None,
              holder: Holder = NO_HOLDER, lane: str = "",
              task_id: str = "") -> tuple[bool, int | str]:
        """Mark the run started under ``token``: (True, fence) or (False, reason). Refused
        (reason ``stale-beat``, and the lease freed) when ``beat_fence`` is not the current
        beat's: the message comes from a beat that has lost its lock. Workers always pass
        the fence their message carries; None (no check) is for tests and operator tools.
        Also refused, the lease left alone, while Redis may have lost state (``epoch-unknown``,
        ``server-changed``, ``quarantine``) and for a grant from before a loss
        (``stale-epoch``): see ``lua/lease_start.lua``. With ``lane`` and ``task_id`` (workers
        pass their message's) a grant made for another lane (``wrong-lane``) or another
        message of its lane (``wrong-task``) is refused and left to its own message."""
        code, value = self._start(
            keys=[self.keys.lease, self.keys.beat_fence, self.keys.epoch],
            args=[token, _ms(ttl_s), repr(now), "" if beat_fence is None else str(beat_fence),
                  holder.host, holder.pid, holder.node, lane, task_id])
        return (True, int(value)) if int(code) == 1 else (False, str(value))

    def start_marked(self, token: str, ttl_s: float, now: float, *, beat_fence: int,
                     holder: Holder, lane: str, task_id: str, mark: RunMark) -> StartReply:
        """:meth:`start`, and in the same call (``lua/lease_start.lua``) the run record
        marked running by compare and set (``mark``): a worker's start in one round trip
        when the record is the one it expected, else what is stored, for its own compare and
        set."""
        journal = [mark.journal] if mark.journal else []  # no empty key: a cluster hashes it
        reply = self._start(
            keys=[self.keys.lease, self.keys.beat_fence, self.keys.epoch, mark.lanes,
                  mark.changed, *journal],
            args=[token, _ms(ttl_s), repr(now), str(beat_fence), holder.host, holder.pid,
                  holder.node, lane, task_id, mark.field, mark.expected or "",
                  mark.record, mark.lane, mark.fence, mark.entry, mark.journal_len])
        if int(reply[0]) != 1:
            return StartReply(False, str(reply[1]))
        marked = len(reply) > 2 and str(reply[2]).startswith("marked")
        journaled = marked and str(reply[2]) == "marked" and bool(mark.journal)
        stored = reply[3] if len(reply) > 3 else None
        if isinstance(stored, bytes):
            stored = stored.decode()
        return StartReply(True, int(reply[1]), marked=marked, journaled=journaled,
                          stored=None if stored is None else str(stored))

    def renew(self, token: str, ttl_s: float, now: float, max_hold_s: float, *,
              reassert: LeaseView | None = None) -> Renewal:
        """Extend the lease by ``ttl_s``: (True, ''), or with ``reassert`` (the
        holder's own lease) put it back if it vanished and no newer lease was granted since:
        (True, 'reasserted') - also over a lease another holder with a lower fence
        re-asserted first while state may be lost; else (False, 'lost' | 'max-hold'). The
        reply also carries the pressure beat last published (:attr:`Renewal.pressure`), read
        in the same call."""
        # Marked re-asserted: a newer holder may take a re-asserted lease back (see the script).
        record = encode(replace(reassert, reasserted=True)) if reassert is not None else ""
        fence = reassert.fence if reassert is not None else 0
        started = (reassert.started_at or reassert.granted_at) if reassert is not None else 0.0
        # A slot's holder records its slot in the pools hash (at least index + 1 slots): lost
        # with Redis's state or deleted, the hash would no longer name a slot past a shrunk
        # pool, and beat, not reading that slot, would judge the run lost and send its lane
        # again beside it.
        slot = ([self.keys.pool, self.keys.index + 1] if isinstance(self.keys, SlotKeys)
                else ["", 0])
        reply = self._renew(
            keys=[self.keys.lease, self.keys.lease_fence, self.keys.pressure, self.keys.epoch,
                  self.keys.pools],
            args=[token, _ms(ttl_s), repr(now), repr(max_hold_s), record, fence, repr(started),
                  *slot],
        )
        pressure = reply[2] if len(reply) > 2 else None
        return Renewal(int(reply[0]) == 1, str(reply[1]),
                       None if pressure is None else str(pressure))

    def release(self, token: str) -> bool:
        return int(self._release(keys=[self.keys.lease], args=[token])) == 1

    def clear(self, lease: LeaseView, *, started: bool, request: OperatorRequest | None = None
              ) -> str:
        """Release ``lease`` for an operator, only if it is still that grant and still
        (un)started as ``started`` says (``lua/lease_clear.lua``), leaving ``request`` for beat.
        Returns ``cleared`` or why not: gone | taken | started | unstarted."""
        return str(self._clear(
            keys=[self.keys.lease, self.keys.lease_request],
            args=[lease.token, "started" if started else "unstarted",
                  request.encode() if request is not None else "", _ms(REQUEST_TTL_S)]))

    def ask(self, request: OperatorRequest) -> None:
        """Leave an operator's request for the holder (its renewals read it) and for beat."""
        self.client.set(self.keys.lease_request, request.encode(), px=_ms(REQUEST_TTL_S))

    def request(self, task_id: str | None = None) -> OperatorRequest | None:
        """The operator's last request, if any (garbage reads as none); with ``task_id``, only
        a request naming that run."""
        raw = self.client.get(self.keys.lease_request)
        request = OperatorRequest.decode(None if raw is None else str(raw))
        if request is None or (task_id is not None and request.task_id != task_id):
            return None
        return request

    def read(self) -> LeaseView | None:
        raw = self.client.get(self.keys.lease)
        return parse_lease(raw if raw is None else str(raw), self.keys.lease)

    def current_fence(self) -> int:
        """The last fence granted (0: none yet); garbage there is a :class:`StateError`."""
        raw = str(self.client.get(self.keys.lease_fence) or "0")
        if not (raw.isascii() and raw.isdigit() and int(raw) < 2 ** 53):
            raise StateError(self.keys.lease_fence, f"the lease fence counter holds {raw[:40]!r}"
                             ", not an integer below 2^53")
        return int(raw)


class SlotGroup:
    """The slot leases one run holds under one token: ``slots`` of ``pool`` (one for most
    lanes, ``k`` for a lane declared ``slots=k``). It answers as one :class:`HeavyLease` does:
    started only if every slot starts (else the slots it started are released and the run
    refused), renewed only while every slot renews, released slot by slot. The run's fence is
    the highest of its slots' (each is at least Redis's clock in ms at its grant, so a later
    grant of a lane in the pool always has a higher one)."""

    def __init__(self, client: redis.Redis, keys: Keys, pool: str,
                 slots: Sequence[int]) -> None:
        if not slots:
            raise ValueError("a slot group needs at least one slot")
        self.pool = pool
        self.slots = tuple(slots)
        self.leases = [HeavyLease(client, keys.slot(pool, i)) for i in self.slots]
        #: Each slot's fence, learnt at start (a re-assertion puts back each slot's own).
        self.fences: dict[int, int] = {}

    @property
    def keys(self) -> Keys:
        """The first slot's keys (its store records the run's end and releases that slot)."""
        return self.leases[0].keys

    def start(self, token: str, ttl_s: float, now: float, *, beat_fence: int | None = None,
              holder: Holder = NO_HOLDER, lane: str = "",
              task_id: str = "") -> tuple[bool, int | str]:
        started: list[HeavyLease] = []
        for index, lease in zip(self.slots, self.leases, strict=True):
            ok, value = lease.start(token, ttl_s, now, beat_fence=beat_fence, holder=holder,
                                    lane=lane, task_id=task_id)
            if not ok:
                for done in started:  # all or none: a run never holds part of its slots
                    done.release(token)
                return False, value
            started.append(lease)
            self.fences[index] = int(value)
        return True, max(self.fences.values())

    def renew(self, token: str, ttl_s: float, now: float, max_hold_s: float, *,
              reassert: LeaseView | None = None) -> Renewal:
        """Renew every slot (each re-asserted with its own fence); the first refusal is the
        answer, and the pressure is the pool's (the first slot's reply)."""
        first: Renewal | None = None
        reasserted = False
        for index, lease in zip(self.slots, self.leases, strict=True):
            mine = (replace(reassert, fence=self.fences.get(index, reassert.fence))
                    if reassert is not None else None)
            reply = lease.renew(token, ttl_s, now, max_hold_s, reassert=mine)
            if not reply.ok:
                return reply
            reasserted = reasserted or reply.reason == "reasserted"
            first = first or reply
        assert first is not None
        return Renewal(True, "reasserted" if reasserted else "", first.pressure)

    def release(self, token: str) -> bool:
        return all([lease.release(token) for lease in self.leases])

    def release_extra(self, token: str) -> None:
        """Release every slot but the first (the run's end releases that one with its
        record, atomically, and wakes beat)."""
        for lease in self.leases[1:]:
            lease.release(token)

    def request(self, task_id: str | None = None) -> OperatorRequest | None:
        """An operator's request to the holder of any of the slots; with ``task_id``, one
        naming that run. Every slot is asked: a request left for an earlier run on one slot
        (they last a day) must not hide a request for this run on another."""
        for lease in self.leases:
            request = lease.request(task_id)
            if request is not None:
                return request
        return None


class PoolSlots:
    """Reads every slot of the pools beyond the default: one round trip (an MGET, with the
    pools hash in the same pipeline).

    The slots a deploy took away are read too. Redeployed with ``gpu=3`` -> ``gpu=2``, or with
    ``gpu`` gone, a run may still hold slot 2 (or any ``gpu`` slot) for the rest of its hold:
    it takes a place in the pool (beat grants only what the new count leaves free) and it is
    alive (not judged lost, its lane not sent again). Which slots may exist comes from the
    pools hash (:attr:`Keys.pools`): each beat records its declaration there, at the most
    slots any beat declared a pool with, before it grants any slot."""

    def __init__(self, client: redis.Redis, keys: Keys, pools: Mapping[str, Pool]) -> None:
        self.client, self.keys = client, keys
        self.pools = {name: pool for name, pool in sorted(pools.items())
                      if name != DEFAULT_POOL}
        self.slot_keys = [keys.slot(name, i) for name, pool in self.pools.items()
                          for i in range(pool.slots)]
        #: The most slots each pool was ever declared with (the pools hash), once read.
        self.declared_ever: dict[str, int] | None = None
        #: The slots past this beat's declaration that runs may still hold.
        self.retired_keys: list[Keys] = []
        #: Each slot's lease text as the last :meth:`read` found it (lease key -> text).
        self.last_read: dict[str, str | None] = {}
        self._declare = scripts.register(client, "pools_declare")

    def __bool__(self) -> bool:
        if self.declared_ever is None:
            # (Unreadable now: asked again at the next look; this beat's own slots are known.)
            with contextlib.suppress(redis.RedisError):
                self._learn(self._declare(keys=[self.keys.pools], args=self._declaration()))
        return bool(self.slot_keys or self.retired_keys)

    def _declaration(self) -> list[str | int]:
        """This beat's pools, each at the most slots it knows any beat declared: declared
        again after the pools hash was lost, the slots past a shrunk pool that this beat has
        read stay known (a run on one of them would otherwise be judged lost, and its lane
        sent again beside it)."""
        counts = {name: pool.slots for name, pool in self.pools.items()}
        for name, count in (self.declared_ever or {}).items():
            if name != DEFAULT_POOL:
                counts[name] = max(counts.get(name, 0), count)
        return [x for name, count in sorted(counts.items()) for x in (name, count)]

    def _learn(self, flat: Sequence[object]) -> None:
        """Take the pools hash (HGETALL's flat reply): the slots past this beat's
        declaration that earlier declarations had."""
        ever: dict[str, int] = {}
        for name, raw in zip(flat[::2], flat[1::2], strict=True):
            text = _text(raw)
            if text.isascii() and text.isdigit():
                ever[_text(name)] = int(text)
        self.declared_ever = ever
        self.retired_keys = [
            self.keys.slot(name, i) for name, count in sorted(ever.items())
            if name != DEFAULT_POOL
            for i in range(self.pools[name].slots if name in self.pools else 0, count)]

    @property
    def lease_keys(self) -> list[str]:
        """Every slot's lease key :meth:`read` reads (known once the pool is declared)."""
        return [k.lease for k in self.slot_keys + self.retired_keys]

    def read(self) -> dict[str, list[LeaseView | None]]:
        """Per pool, each slot's lease (None: free), then the leases of the slots past its
        declaration that runs still hold (a pool no longer declared: those alone). A slot
        holding garbage is busy with an unknown holder (:data:`UNREADABLE_SLOT`): nothing is
        granted over it."""
        if not self:
            return {}
        every = self.slot_keys + self.retired_keys
        pipe = self.client.pipeline(transaction=False)
        pipe.mget([k.lease for k in every])
        pipe.hgetall(self.keys.pools)
        raws, stored = pipe.execute()
        self.last_read = {k.lease: None if raw is None else _text(raw)
                          for k, raw in zip(every, raws, strict=True)}
        ever = {_text(k): _text(v) for k, v in stored.items()}
        known = self.declared_ever or {}
        if ever != {k: str(v) for k, v in known.items()} or (
                any(known.get(name, 0) < pool.slots for name, pool in self.pools.items())):
            # Another beat declared more slots (its runs may hold them), or the hash was
            # lost: declare again, and read the slots now known.
            self._learn(self._declare(keys=[self.keys.pools], args=self._declaration()))
            if self.slot_keys + self.retired_keys != every:
                return self.read()
        out: dict[str, list[LeaseView | None]] = {name: [] for name in self.pools}
        for index, (keys, raw) in enumerate(zip(every, raws, strict=True)):
            assert isinstance(keys, SlotKeys)
            try:
                lease = parse_lease(None if raw is None else str(raw), keys.lease)
            except StateError:
                lease = UNREADABLE_SLOT
            if index >= len(self.slot_keys) and lease is None:
                continue  # a retired slot nobody holds: not a slot to grant
            out.setdefault(keys.pool, []).append(lease)
        return out


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


#: What a slot whose record cannot be read counts as: held, by nobody known.
UNREADABLE_SLOT = LeaseView(lane="", token="", fence=0, granted_at=0.0)


def holders(slots: Mapping[str, Sequence[LeaseView | None]]) -> dict[str, list[str]]:
    """Per pool, the lane holding each busy slot (``""``: unknown), as
    ``core.pools.grant`` takes them."""
    return {pool: [lease.lane for lease in leases if lease is not None]
            for pool, leases in slots.items()}


def free_slots(leases: Sequence[LeaseView | None]) -> list[int]:
    """The indexes of a pool's free slots, lowest first."""
    return [i for i, lease in enumerate(leases) if lease is None]


def holder_of(raw: str | None, key: str) -> str | None:
    """Who holds a lease or a slot, by its stored text: the grant's token (None: free). A
    run's start or re-assert rewrites the text, never the token, and no token is granted twice,
    so two reads naming the same holder saw no run end and no grant in between. Text that is
    no lease stands for itself."""
    try:
        lease = parse_lease(raw, key)
    except StateError:
        return raw
    return None if lease is None else lease.token


def holders_moved(before: Mapping[str, str | None], after: Mapping[str, str | None]) -> bool:
    """Did any lease or slot in ``after`` (key -> stored text) change hands since ``before``
    read it? A key ``before`` did not read counts as changed: nothing says it did not."""
    return any(key not in before or holder_of(before[key], key) != holder_of(raw, key)
               for key, raw in after.items())


def parse_lease(raw: str | None, key: str) -> LeaseView | None:
    """Decode the lease record (written by Lua, so numbers may come back as floats)."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        if isinstance(data, dict) and isinstance(data.get("fence"), float):
            data["fence"] = int(data["fence"])
        raw = json.dumps(data)
    except ValueError:
        pass
    return decode(LeaseView, raw, key)


__all__ = ["UNREADABLE_SLOT", "Grant", "HeavyLease", "Holder", "OperatorRequest", "PoolSlots",
           "Renewal", "RunMark", "SlotGroup", "StartReply", "free_slots", "holder_of",
           "holders", "holders_moved", "parse_lease"]
