"""A tick's read larger than a page (``lua/tick_read.lua`` + ``lua/tick_page.lua``): no call
returns more than a page of lanes, the pages together read what one call reads, and nothing
changed between pages or left by a beat that stopped mid-read is lost.

Real Redis (DB 14, a prefix per test); the page is set small so a few hundred lanes page.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from schedproj.core.families import member_lane
from schedproj.core.records import RunRecord, SchedRecord, encode
from schedproj.store.families import FamilyStore
from schedproj.store.lane_store import LaneStore, Snapshot
from schedproj.store.protocol import (
    ENTRIES_CHANGED_MEMBER,
    STAMP_MEMBER,
    Keys,
    run_field,
    sched_field,
)
from tests.conftest import declare_fresh, token

pytestmark = pytest.mark.timeout(60)

PAGE = 20
TTL = 30.0


def at_most_a_page(counts: tuple[int, ...] | list[int]) -> bool:
    """No call returned more than a page. (A page of a set is SSCAN's COUNT, a number of hash
    buckets: Redis may hand back a bucket's few other members with the last.)"""
    return max(counts) <= PAGE + PAGE // 4


@pytest.fixture
def twin(client: redis.Redis) -> Iterator[Keys]:
    """A second fresh prefix: the same state laid out twice, read paged and unpaged."""
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    declare_fresh(client, prefix)
    yield Keys(prefix)
    found = list(client.scan_iter(f"{prefix}:*"))
    if found:
        client.delete(*found)


def lay_out(client: redis.Redis, keys: Keys, now: float) -> None:
    """3 pages of due lanes at one score (as a heal leaves them), a page more at scores spread,
    3 pages and a bit of changed lanes (some of those due too, the rest not due), lanes not
    due, a lease, the operator sets and the entries' changed mark."""
    store = LaneStore(client, keys)
    beat = token()
    store.tick_snapshot(beat, TTL, 0.0, cursor=None, now=now)  # stamps the derived keys
    store.unlock(beat)
    lanes = [f"lane-{i:04d}" for i in range(8 * PAGE)]
    client.hset(keys.lanes, mapping={
        **{run_field(lane): encode(RunRecord(runs=i + 1, last_run_at=now - i))
           for i, lane in enumerate(lanes)},
        **{sched_field(lane): encode(SchedRecord(dispatches=i))
           for i, lane in enumerate(lanes) if i % 3 == 0}})
    client.zadd(keys.due, {lane: 0.0 for lane in lanes[:3 * PAGE]})
    client.zadd(keys.due, {lane: now - 1000 + i for i, lane in enumerate(lanes[3 * PAGE:4 * PAGE])})
    client.zadd(keys.due, {lane: now + 10 + i for i, lane in enumerate(lanes[4 * PAGE:])})
    client.sadd(keys.changed, *lanes[3 * PAGE + 10:6 * PAGE + 13], *lanes[-5:],
                ENTRIES_CHANGED_MEMBER)
    client.sadd(keys.paused, lanes[3])
    client.sadd(keys.run_now, lanes[5])
    client.set(keys.lease, '{"lane": "lane-0007", "token": "t", "fence": 3, "granted_at": 1.0}')


def comparable(snap: Snapshot, keys: Keys) -> dict[str, Any]:
    def unprefixed(text: str) -> str:
        return text.replace(keys.prefix, "<prefix>")

    return {"held": snap.lock.held, "states": dict(snap.states), "scores": dict(snap.scores),
            "looked": set(snap.looked), "changed": snap.changed, "next": snap.next_look,
            "lease": snap.lease, "paused": snap.paused, "forced": snap.forced,
            "broken": {unprefixed(k): v for k, v in snap.broken.items()},
            "errors": {k: unprefixed(v) for k, v in snap.errors.items()},
            "entries": snap.entries_changed,
            "changed first": set(snap.looked[:len(snap.changed)]) == snap.changed}


@pytest.mark.parametrize("cursor", [None, -1.0])
def test_pages_read_what_one_call_reads_and_no_call_returns_more_than_a_page(
        client: redis.Redis, keys: Keys, twin: Keys, cursor: float | None) -> None:
    now = time.time()
    at = None if cursor is None else now - 5000
    lay_out(client, keys, now)
    lay_out(client, twin, now)
    whole = LaneStore(client, keys, read_page=10_000)
    one = whole.tick_snapshot(token(), TTL, 0.0, cursor=at, now=now)
    assert whole.read_pages == (len(one.looked) + int(one.entries_changed),)
    paged = LaneStore(client, twin, read_page=PAGE)
    by_pages = paged.tick_snapshot(token(), TTL, 0.0, cursor=at, now=now)
    assert len(paged.read_pages) >= 4, paged.read_pages
    assert at_most_a_page(paged.read_pages), f"lanes per call: {paged.read_pages}"
    assert comparable(by_pages, twin) == comparable(one, keys)
    assert len(one.looked) > 3 * PAGE and one.entries_changed and one.paused and one.forced
    # Both leave the same derived keys: a changed set holding only its fresh stamp, nothing
    # kept aside.
    assert client.exists(twin.changed_reading) == 0
    for k in (keys, twin):
        assert [m.startswith(STAMP_MEMBER) for m in client.smembers(k.changed)] == [True]


def interleaved(store: LaneStore, between: Callable[[int, bool], None]) -> list[int]:
    """``between(n, due)`` runs before the store's n-th page call (real writes, not stand-ins);
    ``due``: that call goes on with the due lanes (the changed ones are read)."""
    calls: list[int] = []
    page = store._tick_page

    def paging(**kwargs: Any) -> Any:
        calls.append(len(calls))
        between(len(calls), kwargs["args"][5] in ("", "end"))
        return page(**kwargs)

    store._tick_page = paging
    return calls


def test_a_lane_changed_between_pages_is_read_by_this_read_or_the_next(
        client: redis.Redis, keys: Keys) -> None:
    now = time.time()
    lay_out(client, keys, now)
    store = LaneStore(client, keys, read_page=PAGE)
    beat = token()
    first_page = set(client.zrangebyscore(keys.due, "-inf", now)[:PAGE])
    moved_away: list[str] = []

    def writers(n: int, due: bool) -> None:
        if n == 1:
            # A run of a lane the first page read ends: its record and score move, marked
            # changed (as run_finish.lua does, atomically).
            pipe = client.pipeline(transaction=True)
            pipe.hset(keys.lanes, run_field("lane-0001"),
                      encode(RunRecord(runs=99, last_run_at=now)))
            pipe.zadd(keys.due, {"lane-0001": now + 3600})
            pipe.sadd(keys.changed, "lane-0001")
            pipe.execute()
            # An operator asks a lane not due to run now: its score moves before the place
            # the read has reached.
            store.run_now("lane-0150")
        if due and not moved_away:
            # Every lane the due read ended its last page on moves on (the place it continues
            # from is gone), and some it had not read yet: no due lane after them may be skipped.
            read_so_far = client.zrangebyscore(keys.due, "-inf", now)
            for lane in read_so_far[:PAGE + 4]:
                pipe = client.pipeline(transaction=True)
                pipe.zadd(keys.due, {lane: now + 7200})
                pipe.sadd(keys.changed, lane)
                pipe.execute()
                moved_away.append(lane)

    calls = interleaved(store, writers)
    snap = store.tick_snapshot(beat, TTL, 0.0, cursor=None, now=now)
    assert len(calls) >= 5
    assert "lane-0001" in first_page and snap.states["lane-0001"].run.runs == 2, \
        "read before its change: planned on the record as it was"
    due_then = {f"lane-{i:04d}" for i in range(4 * PAGE)} - {"lane-0001"}
    assert moved_away and due_then - set(moved_away) <= set(snap.looked), \
        "a due lane was skipped"
    after = store.tick_snapshot(beat, TTL, 0.0, cursor=now, now=now + 1)
    assert {"lane-0001", "lane-0150", *moved_away} <= after.changed
    assert after.states["lane-0001"].run.runs == 99 and after.scores["lane-0001"] == now + 3600
    assert "lane-0150" in after.forced and after.scores["lane-0150"] == 0.0


def test_the_keys_asked_for_are_read_with_the_read_and_after_its_last_page(
        client: redis.Redis, keys: Keys) -> None:
    """``also_get`` (beat's due-check stamps): read in the read's round trip; by pages, once
    the last page is in, so no value is older than a record read (a stamp written while the
    pages went is the one the tick sees, not the one before)."""
    now, beat = time.time(), token()
    lay_out(client, keys, now)
    stamp, absent = f"{keys.prefix}:app:stamp", f"{keys.prefix}:app:never-written"
    client.set(stamp, "before")
    one = LaneStore(client, keys, read_page=10_000).tick_snapshot(
        beat, TTL, 0.0, cursor=None, now=now, also_get=[stamp, absent])
    assert one.got == {stamp: "before", absent: None}
    paged = LaneStore(client, keys, read_page=PAGE)
    written: list[str] = []

    def write_stamp(n: int, due: bool) -> None:
        written.append(f"written before page {n}")
        client.set(stamp, written[-1])

    interleaved(paged, write_stamp)
    snap = paged.tick_snapshot(beat, TTL, 0.0, cursor=None, now=now, also_get=[stamp])
    assert len(written) >= 3 and snap.got == {stamp: written[-1]}
    assert paged.tick_snapshot(beat, TTL, 0.0, cursor=None, now=now).got == {}


def test_a_beat_that_stops_mid_read_loses_no_changed_mark(client: redis.Redis,
                                                          keys: Keys) -> None:
    now = time.time()
    lay_out(client, keys, now)
    marked = {str(m) for m in client.smembers(keys.changed)} - {ENTRIES_CHANGED_MEMBER}
    marked = {m for m in marked if not m.startswith(STAMP_MEMBER)}
    stopping = LaneStore(client, keys, read_page=PAGE)

    class Stopped(Exception):
        pass

    meanwhile = [f"lane-{i:04d}" for i in range(3 * PAGE)]

    def stop(n: int, due: bool) -> None:
        if n == 2:
            # Marks made while it read, more than a page: in the fresh changed set.
            LaneStore(client, keys).touch(meanwhile)
            raise Stopped

    interleaved(stopping, stop)
    beat = token()
    with pytest.raises(Stopped):
        stopping.tick_snapshot(beat, TTL, 0.0, cursor=None, now=now)
    assert client.exists(keys.changed_reading) == 1, "what it read is kept until the read ends"
    # The next read (the same beat after a restart, or another) reads every mark.
    again = LaneStore(client, keys, read_page=PAGE)
    snap = again.tick_snapshot(beat, TTL, 0.0, cursor=None, now=now)
    assert marked <= snap.changed and snap.entries_changed
    assert at_most_a_page(again.read_pages), again.read_pages
    assert client.exists(keys.changed_reading) == 0
    # The marks made meanwhile (a set too large for one call, left while the set kept aside
    # was read): the read after.
    later = again.tick_snapshot(beat, TTL, 0.0, cursor=now, now=now + 1)
    assert set(meanwhile) <= snap.changed | later.changed
    assert at_most_a_page(again.read_pages) and client.exists(keys.changed_reading) == 0
    assert [m.startswith(STAMP_MEMBER) for m in client.smembers(keys.changed)] == [True]
    assert "changed" not in str(later.broken)


@pytest.mark.parametrize("taken_by", ["", "another-beat"])
def test_a_lock_gone_mid_read_says_whether_it_vanished_or_another_beat_took_it(
        client: redis.Redis, keys: Keys, taken_by: str) -> None:
    """A later page finds the lock no longer this beat's: vanished (no holder: Redis lost its
    state, beat keeps its memory and takes the lock back) is told from taken (another beat's
    token: beat stands by), which the read said alike before."""
    now = time.time()
    lay_out(client, keys, now)
    store = LaneStore(client, keys, read_page=PAGE)

    def lock_goes(n: int, due: bool) -> None:
        if n == 2:
            client.delete(keys.beat_lock)
            if taken_by:
                client.set(keys.beat_lock, taken_by, px=int(TTL * 1000))

    calls = interleaved(store, lock_goes)
    snap = store.tick_snapshot(token(), TTL, 0.0, cursor=None, now=now)
    assert len(calls) == 2 and not snap.lock.held and not snap.states
    if taken_by:
        assert (snap.lock.event, snap.lock.holder) == ("held", taken_by)
    else:
        assert (snap.lock.event, snap.lock.holder) == ("vanished", None)


@pytest.mark.parametrize("rescore", [True, False])
def test_a_heal_puts_a_family_back_a_page_a_call_and_never_a_member_removed_meanwhile(
        client: redis.Redis, keys: Keys, rescore: bool) -> None:
    family = FamilyStore(client, keys)
    members = [f"m{i:04d}" for i in range(10 * PAGE)]
    family.add("fam", members)
    client.zadd(keys.due, {member_lane("fam", m): 500.0 for m in members})
    client.zrem(keys.due, *[member_lane("fam", m) for m in members[::7]])  # lost from the index
    store = LaneStore(client, keys, read_page=PAGE)
    beat = token()
    assert store.tick_snapshot(beat, TTL, 0.0, cursor=None, now=time.time()).lock.held
    removed: list[str] = []

    def meanwhile(n: int) -> None:
        if n == 3:
            gone = [m for m in members if client.zscore(keys.due, member_lane("fam", m))
                    is not None][-5:]
            family.remove("fam", gone)
            removed.extend(gone)
            family.add("fam", ["late"])

    page = store._heal_page

    def paging(**kwargs: Any) -> Any:
        meanwhile(len(store.heal_pages))
        return page(**kwargs)

    store._heal_page = paging
    assert store.heal_derived(beat, ["declared"], rescore=rescore)
    assert len(store.heal_pages) >= 8 and at_most_a_page(store.heal_pages[1:]), \
        store.heal_pages
    index = dict(client.zrange(keys.due, 0, -1, withscores=True))
    kept = {member_lane("fam", m) for m in members if m not in removed}
    assert kept | {member_lane("fam", "late"), "declared"} <= index.keys()
    assert not {member_lane("fam", m) for m in removed} & index.keys()
    expected = {lane: (0.0 if rescore or i % 7 == 0 else 500.0)
                for i, lane in enumerate(member_lane("fam", m) for m in members)
                if lane in kept}
    assert {lane: index[lane] for lane in expected} == expected
    # The stamps agree: the next read finds nothing broken.
    assert store.tick_snapshot(beat, TTL, 0.0, cursor=None, now=time.time()).broken == {}
