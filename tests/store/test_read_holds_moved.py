"""A tick's read tells its caller when the heavy lease changed hands while it went by pages
(``Snapshot.holds_moved``): a run that ended between the page that read its record and the
last page (which reads the lease) reads as in flight with its lease free, a state no single
read shows - beat must not grant on it. And the keys beat watches (the pool slots' leases) are
read just before the read, in its round trip (``Snapshot.watched``).

Real Redis (DB 14, a prefix per test); the page is set small so a few hundred lanes page.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import redis

from schedproj.core.records import LeaseView, encode
from schedproj.store.lane_store import LaneStore
from schedproj.store.protocol import Keys
from tests.conftest import token
from tests.store.test_paged_read import PAGE, TTL, interleaved, lay_out

pytestmark = pytest.mark.timeout(60)

LEASE = LeaseView(lane="lane-0007", token="t", fence=3, granted_at=1.0)


@pytest.mark.parametrize(("between_pages", "moved"), [
    ("released", True),            # the run ended: its lane reads due, not running
    ("started", False),            # the worker started it: same holder, text rewritten
    ("untouched", False),
])
def test_a_lease_changing_hands_between_pages_is_told(
        client: redis.Redis, keys: Keys, between_pages: str, moved: bool) -> None:
    now = time.time()
    lay_out(client, keys, now)
    client.set(keys.lease, encode(LEASE))
    store = LaneStore(client, keys, read_page=PAGE)

    def run_ends_or_starts(n: int, due: bool) -> None:
        if n == 2 and between_pages == "released":
            client.delete(keys.lease)
        if n == 2 and between_pages == "started":
            client.set(keys.lease, encode(replace(LEASE, started_at=2.0)))

    calls = interleaved(store, run_ends_or_starts)
    snap = store.tick_snapshot(token(), TTL, 0.0, cursor=None, now=now)
    assert len(calls) >= 3 and snap.lock.held
    assert snap.holds_moved is moved
    assert snap.lease == (None if between_pages == "released" else
                          replace(LEASE, started_at=2.0 if between_pages == "started" else None))


def test_a_read_in_one_call_never_says_the_lease_moved(client: redis.Redis,
                                                         keys: Keys) -> None:
    now = time.time()
    lay_out(client, keys, now)
    client.set(keys.lease, encode(LEASE))
    store = LaneStore(client, keys, read_page=10_000)
    snap = store.tick_snapshot(token(), TTL, 0.0, cursor=None, now=now)
    assert store.read_pages and len(store.read_pages) == 1
    assert not snap.holds_moved and snap.lease is not None


def test_the_watched_keys_are_read_before_the_read_in_its_round_trip(
        client: redis.Redis, keys: Keys) -> None:
    now = time.time()
    lay_out(client, keys, now)
    slot, free = keys.slot("gpu", 0).lease, keys.slot("gpu", 1).lease
    held = encode(replace(LEASE, lane="g", token="s0"))
    client.set(slot, held)
    store = LaneStore(client, keys, read_page=PAGE)

    def slot_freed(n: int, due: bool) -> None:
        if n == 1:
            client.delete(slot)  # after the read's first call: the watched value is before it

    interleaved(store, slot_freed)
    snap = store.tick_snapshot(token(), TTL, 0.0, cursor=None, now=now, watch=[slot, free])
    assert snap.watched == {slot: held, free: None}
    assert client.get(slot) is None
