"""Schedule entries in Redis: their states and due index (written by the active beat only,
compared and set under the beat lock), runtime definitions and the operator's sets."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice

import redis

from schedproj.core.entries import EntryClaim, EntryDefinition
from schedproj.store.protocol import ENTRIES_CHANGED_MEMBER, CounterKind, Keys, counter_field
from schedproj.store.scripts import register

#: Stands for "no value stored" in the compare-and-set (a state is JSON, never this).
NONE = "\x00none"
#: An expected value that matches whatever is stored (deleting a removed entry).
ANY = "\x00any"
#: At most this many entries are read per round trip (one call of ``entry_read.lua``).
READ_LIMIT = 1000
#: Writes are sent in groups of this many entries per script call (each call is atomic;
#: a call with hundreds of thousands would hold Redis for too long).
WRITE_CHUNK = 2000
#: Every entry's state and description is read and written this many at a time: beat never
#: holds the text of all of them at once (100,000 entries' strings were 15 MiB at a time, and
#: the memory they took stayed with the process, fragmented, after they were freed).
SCAN_CHUNK = 1000


def _chunks(pairs: Iterable[tuple[str, str]], size: int) -> Iterator[list[tuple[str, str]]]:
    it = iter(pairs)
    while chunk := list(islice(it, size)):
        yield chunk


@dataclass(frozen=True)
class DueEntries:
    """The entries due for a look, as read."""

    states: Mapping[str, str | None]
    paused: frozenset[str]
    forced: frozenset[str]
    #: The read was cut at :data:`READ_LIMIT`: more may be due.
    more: bool
    #: Those whose next look was 0 (marked by an operator or a tool that wrote their state
    #: outside beat, ``mark_changed``): their stored state is the one to judge from.
    marked: frozenset[str] = frozenset()
    #: The operator sets of the wrong type (read as empty).
    broken: tuple[str, ...] = ()


@dataclass(frozen=True)
class WriteResult:
    """Which writes landed, and the due index's head and size after them."""

    written: Mapping[str, bool]
    head: float | None
    size: int
    #: How many entries the listing (``Keys.entries_info``) holds (-1: not a hash).
    listed: int = -1


class EntryStore:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client, self.keys = client, keys
        self._write = register(client, "entry_write")
        self._read = register(client, "entry_read")
        self._index = register(client, "entry_index")
        self._reindex = register(client, "entry_reindex")

    # -- the active beat ----------------------------------------------------------------------
    def due(self, now: float) -> DueEntries:
        k = self.keys
        names, values, paused, forced, marked, broken = self._read(
            keys=[k.entries_due, k.entries, k.entries_paused, k.entries_run_now],
            args=[repr(now), READ_LIMIT])
        states = {str(n): (str(v) if v is not None else None)
                  for n, v in zip(names, values, strict=True)}
        return DueEntries(states=states, paused=frozenset(map(str, paused)),
                          forced=frozenset(map(str, forced)), more=len(names) >= READ_LIMIT,
                          marked=frozenset(map(str, names[:int(marked)])),
                          broken=tuple(map(str, broken)))

    def states_page(self, cursor: int) -> tuple[int, list[tuple[str, str]]]:
        """One page of every entry's stored state (``HSCAN`` from ``cursor``, about
        :data:`SCAN_CHUNK` of them) and the cursor of the next (0: the scan is complete): a
        beat taking over reads them a page per tick. A state written meanwhile may come twice."""
        cursor, page = self.client.hscan(self.keys.entries, cursor, count=SCAN_CHUNK)
        assert isinstance(page, dict)
        return int(cursor), [(str(name), str(raw)) for name, raw in page.items()]

    def all_states(self) -> Iterator[tuple[str, str]]:
        """Every entry's stored state (a beat taking over reads them all once), read
        :data:`SCAN_CHUNK` at a time (``HSCAN``: a state written meanwhile may come twice)."""
        for name, raw in self.client.hscan_iter(self.keys.entries, count=SCAN_CHUNK):
            yield str(name), str(raw)

    def write(self, token: str, claims: Sequence[EntryClaim], *,
              looks: Mapping[str, float] = {}, removed: Sequence[str] = (),
              run_now: Mapping[str, str] = {}) -> WriteResult | None:
        """Compare and set ``claims`` (state and next look), move ``looks``, delete
        ``removed``; None if this beat no longer holds the lock (nothing written then).
        ``run_now`` says, by claim, what its landing does to the run-now mark: ``"clear"``
        (it answers a ``schedproj run``) or ``"force"`` (it undoes one: asked again)."""
        groups: list[tuple[str, str, str, str, str]] = []
        for c in claims:
            groups.append((c.name, NONE if c.expected is None else c.expected,
                           c.state.encode(), repr(c.next_look), run_now.get(c.name, "")))
        for name, at in looks.items():
            groups.append((name, "", "", repr(at), ""))
        for name in removed:
            groups.append((name, ANY, NONE, "0", ""))
        written: dict[str, bool] = {}
        head: float | None = None
        size = listed = 0
        k = self.keys
        for i in range(0, max(len(groups), 1), WRITE_CHUNK):
            chunk = groups[i:i + WRITE_CHUNK]
            reply = self._write(keys=[k.beat_lock, k.entries, k.entries_due, k.entries_run_now,
                                      k.entries_info],
                                args=[token, NONE, ANY, *(x for g in chunk for x in g)])
            if len(reply) == 1:  # {-1}: not the lock holder
                return None
            *results, head_name, head_score, size, listed = reply
            for (name, _, value, _, _), ok in zip(chunk, results, strict=True):
                if value:
                    written[name] = int(ok) == 1
            head = float(head_score) if head_name not in ("", None) else None
        return WriteResult(written=written, head=head, size=int(size), listed=int(listed))

    def reindex(self, token: str, names: Iterable[str], now: float,
                latest: float) -> tuple[int, float | None] | None:
        """Heal the due index (``entry_reindex.lua``): every one of ``names`` (each defined
        entry) missing from it is added due ``now``, a next look past ``latest`` is moved to
        it, the others are kept; an index of the wrong type is replaced. Returns how many
        were added and the index's head; None if this beat no longer holds the lock."""
        k = self.keys
        it = iter(names)
        added, head, first = 0, None, True
        while (chunk := list(islice(it, WRITE_CHUNK))) or first:
            first = False
            reply = self._reindex(keys=[k.beat_lock, k.entries_due],
                                  args=[token, repr(now), repr(latest), *chunk])
            if len(reply) == 1:
                return None
            n, head_name, head_score, _ = reply
            added += int(n)
            head = float(head_score) if head_name not in ("", None) else None
        return added, head

    def rebuild_index(self, token: str, looks: Mapping[str, float], *,
                      replace: bool = True) -> bool:
        """Replace the due index with ``looks`` (every known entry; without ``replace``, add
        them to it), under the lock; False if this beat no longer holds it."""
        items = list(looks.items())
        for i in range(0, max(len(items), 1), WRITE_CHUNK):
            pairs = [x for name, at in items[i:i + WRITE_CHUNK] for x in (name, repr(at))]
            done = self._index(keys=[self.keys.beat_lock, self.keys.entries_due],
                               args=[token, "1" if replace and i == 0 else "0", *pairs])
            if int(done) != 1:
                return False
        return True

    def publish(self, info: Iterable[tuple[str, str]]) -> None:
        """Replace what operators read of the entries (``Keys.entries_info``): written
        :data:`SCAN_CHUNK` at a time to a key of its own, renamed over the old one once
        complete, so a reader sees the old listing or the new one, never a part."""
        self.publish_begin()
        wrote = False
        for chunk in _chunks(info, SCAN_CHUNK):
            wrote = self.publish_page(chunk) or wrote
        self.publish_end(wrote)

    def publish_begin(self) -> None:
        """Start a listing (:meth:`publish` in steps: a beat with many entries writes it a
        page per tick): the staging key emptied."""
        self.client.delete(self.keys.entries_info_staging)

    def publish_page(self, info: Sequence[tuple[str, str]]) -> bool:
        """Add ``info`` to the listing begun; True if it held any."""
        if info:
            self.client.hset(self.keys.entries_info_staging, mapping=dict(info))
        return bool(info)

    def publish_end(self, wrote: bool) -> None:
        """Make the listing begun the one operators read (``wrote``: a page held an entry;
        else there is none to list). A listing begun again elsewhere meanwhile (another beat)
        may have taken the staging key: then the current listing is left as it is."""
        k = self.keys
        if wrote:
            with contextlib.suppress(redis.ResponseError):   # "no such key": renamed elsewhere
                self.client.rename(k.entries_info_staging, k.entries_info)
        else:
            self.client.delete(k.entries_info)

    def put_back(self, states: Mapping[str, str]) -> int:
        """Write remembered states where Redis holds none (after Redis lost its state);
        returns how many were put back."""
        pipe = self.client.pipeline(transaction=False)
        names = list(states)
        for name in names:
            pipe.hsetnx(self.keys.entries, name, states[name])
        return sum(int(x) for x in pipe.execute())

    def count_missed(self, counts: Mapping[str, int]) -> None:
        """Add calendar entries' missed fire times to the durable counters (``missed|<entry>``,
        exported as ``schedproj_missed_runs_total{lane}``, as a calendar lane's are)."""
        pipe = self.client.pipeline(transaction=False)
        for name, count in counts.items():
            pipe.hincrby(self.keys.counters, counter_field(CounterKind.MISSED, name), count)
        pipe.execute()

    def count_heal(self) -> None:
        """Count a heal of the due index in ``schedproj_derived_state_heals_total{key=
        "entries:due"}``, as the lanes' derived keys' heals are counted."""
        with contextlib.suppress(redis.ResponseError):   # a counters hash of the wrong type
            self.client.hincrby(self.keys.counters,
                                counter_field(CounterKind.HEALS, "entries:due"), 1)

    def done_forcing(self, names: Sequence[str]) -> None:
        """Drop run-now marks of names no entry has (a claim's own mark is dropped by the
        claim's write, ``write(run_now=...)``); a set of the wrong type is left alone (it is
        read as empty, and named)."""
        if names:
            with contextlib.suppress(redis.ResponseError):
                self.client.srem(self.keys.entries_run_now, *names)

    # -- runtime entries and operators ----------------------------------------------------------
    def definitions(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in self.client.hgetall(self.keys.entry_defs).items()}

    def put_definition(self, name: str, definition: EntryDefinition) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(self.keys.entry_defs, name, definition.encode())
        self._mark_changed(pipe, name)
        pipe.execute()

    def remove_definition(self, name: str) -> bool:
        pipe = self.client.pipeline(transaction=True)
        pipe.hdel(self.keys.entry_defs, name)
        self._mark_changed(pipe, name)
        removed, *_ = pipe.execute()
        return bool(removed)

    def pause(self, name: str) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.sadd(self.keys.entries_paused, name)
        self._mark_changed(pipe, name)
        pipe.execute()

    def resume(self, name: str) -> int:
        pipe = self.client.pipeline(transaction=True)
        pipe.srem(self.keys.entries_paused, name)
        self._mark_changed(pipe, name)
        removed, *_ = pipe.execute()
        return int(removed)

    def run_now(self, name: str) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.sadd(self.keys.entries_run_now, name)
        self._mark_changed(pipe, name)
        pipe.execute()

    def mark_changed(self, names: Sequence[str], pipe: redis.client.Pipeline) -> None:
        """Queue on ``pipe`` (a transaction the caller executes, with the states it writes)
        the marks that make the active beat judge ``names`` again from their stored states
        at its next tick: for states written outside beat (``schedproj migrate``)."""
        for name in names:
            self._mark_changed(pipe, name)

    def _mark_changed(self, pipe: redis.client.Pipeline, name: str) -> None:
        """Tell the active beat at its next tick (and wake it if it sleeps): the name is
        looked at now, and the definitions re-read."""
        pipe.zadd(self.keys.entries_due, {name: 0.0}, xx=True)
        pipe.sadd(self.keys.changed, ENTRIES_CHANGED_MEMBER)
        pipe.lpush(self.keys.wake, "entries")
        pipe.ltrim(self.keys.wake, 0, 63)


__all__ = ["ANY", "NONE", "READ_LIMIT", "SCAN_CHUNK", "DueEntries", "EntryStore",
           "WriteResult"]
