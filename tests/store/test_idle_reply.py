"""The idle tick's short reply (``lua/tick.lua``): a read the client holds already is answered
by the server time alone, and anything the full reply would have said otherwise - a lane
changed or due, the lease, the operator sets, a stamp, the next look, the fence, a state loss,
a broken key - is answered in full at the very next tick."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import redis

from schedproj.core.records import RunRecord, encode
from schedproj.store.lane_store import LaneStore, Snapshot
from schedproj.store.protocol import Keys, run_field
from tests.conftest import token

pytestmark = pytest.mark.timeout(60)

LONG_TTL = 30.0


class Replies:
    """The raw replies of the store's tick script (a short one is an int)."""

    def __init__(self, store: LaneStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.got: list[Any] = []
        orig = store._tick_call

        def call(*args: Any, **kwargs: Any) -> Any:
            reply = orig(*args, **kwargs)
            self.got.append(reply[0])
            return reply

        monkeypatch.setattr(store, "_tick_call", call)

    def last_was_short(self) -> bool:
        return isinstance(self.got[-1], int)


class Idle:
    """A beat's ticks on a store whose lanes are all idle (one record, its next look ahead)."""

    def __init__(self, client: redis.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch):
        self.client, self.keys = client, keys
        self.store = LaneStore(client, keys)
        self.replies = Replies(self.store, monkeypatch)
        self.beat = token()
        self.stamp = f"{keys.prefix}:stamp:one"
        self.now = time.time()
        client.hset(keys.lanes, run_field("a"), encode(RunRecord(runs=1, last_run_at=self.now)))
        client.zadd(keys.due, {"a": self.now + 3600})
        client.set(self.stamp, "1")
        self.cursor: float | None = None

    def tick(self, records: bool = True) -> Snapshot:
        now = time.time()
        snap = self.store.tick_snapshot(self.beat, LONG_TTL, 20.0, cursor=self.cursor, now=now,
                                        also_get=[self.stamp], records=records)
        self.cursor = now
        return snap


@pytest.fixture
def idle(client: redis.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch) -> Idle:
    return Idle(client, keys, monkeypatch)


def settled(idle: Idle) -> Snapshot:
    """Ticks until the read is idle and held: the lock taken (a full read), the derived keys
    stamped and the new deployment's quarantine over, then a short reply."""
    idle.client.delete(idle.keys.epoch)
    idle.tick()
    assert idle.store.heal_derived(idle.beat, ["a"], rescore=False)  # the derived keys stamped
    epoch = json.loads(str(idle.client.get(idle.keys.epoch)))
    epoch["quarantine_until"] = 0  # the new deployment's quarantine is not what is tested
    idle.client.set(idle.keys.epoch, json.dumps(epoch))
    full = idle.tick()
    assert not idle.replies.last_was_short() and full.lock.event == "renewed"
    again = idle.tick()
    assert idle.replies.last_was_short(), "an idle read held already came back in full"
    return again


def test_an_idle_read_held_already_is_the_same_snapshot_at_the_new_server_time(
        idle: Idle) -> None:
    held = settled(idle)
    full = LaneStore(idle.client, idle.keys)  # holds no idle reply: parses the full one
    fresh = full.tick_snapshot(idle.beat, LONG_TTL, 20.0, cursor=idle.cursor, now=time.time(),
                               also_get=[idle.stamp])
    assert fresh.looked == () and fresh.got == {idle.stamp: "1"}
    assert fresh.epoch.server_now_ms >= held.epoch.server_now_ms
    assert replace(held, epoch=fresh.epoch) == fresh
    assert held.epoch.known_id == held.epoch.id == fresh.epoch.id
    assert idle.store.read_pages == (0,)


def test_a_beat_new_to_the_lock_never_gets_the_short_reply(idle: Idle) -> None:
    settled(idle)
    idle.tick(records=False)
    assert not idle.replies.last_was_short()
    idle.tick()  # the idle reply held was dropped by the full one: parsed in full again
    assert not idle.replies.last_was_short()
    idle.tick()
    assert idle.replies.last_was_short()


def lease_taken(i: Idle) -> None:
    i.client.set(i.keys.lease, json.dumps({"lane": "a"}), px=60_000)  # read, if unreadable


def server_changed(i: Idle) -> None:
    epoch = json.loads(str(i.client.get(i.keys.epoch)))
    i.client.set(i.keys.epoch, json.dumps({**epoch, "run_id": "0" * 40}))


#: What the idle reply stands for, changed: the change, and how the next read shows it.
CHANGES: dict[str, tuple[Callable[[Idle], Any], Callable[[Idle, Snapshot], bool]]] = {
    "a lane marked changed": (lambda i: i.client.sadd(i.keys.changed, "a"),
                              lambda i, s: s.changed == {"a"}),
    "a lane fell due": (lambda i: i.client.zadd(i.keys.due, {"a": time.time()}),
                        lambda i, s: s.looked == ("a",)),
    "the next look moved": (lambda i: i.client.zadd(i.keys.due, {"b": i.now + 60}),
                            lambda i, s: s.next_look == i.now + 60),
    "the lease taken": (lease_taken, lambda i, s: s.lease is not None),
    "a lane paused": (lambda i: i.client.sadd(i.keys.paused, "a"),
                      lambda i, s: s.paused == {"a"}),
    "a lane forced": (lambda i: i.client.sadd(i.keys.run_now, "a"),
                      lambda i, s: s.forced == {"a"}),
    "a stamp moved": (lambda i: i.client.set(i.stamp, "2"),
                      lambda i, s: s.got == {i.stamp: "2"}),
    "the beat fence moved": (lambda i: i.client.incr(i.keys.beat_fence),
                             lambda i, s: s.lock.held),
    "the epoch record lost": (lambda i: i.client.delete(i.keys.epoch),
                              lambda i, s: s.epoch.cause == "state-missing"),
    "another Redis server (run id)": (server_changed,
                                      lambda i, s: s.epoch.cause == "server-changed"),
    "the due index's stamp lost": (lambda i: i.client.delete(i.keys.due_stamp),
                                   lambda i, s: s.broken.get(i.keys.due) == "stale"),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_what_the_idle_reply_stands_for_changed_is_read_in_full_at_the_next_tick(
        idle: Idle, change: str) -> None:
    make, seen = CHANGES[change]
    before = settled(idle)
    make(idle)
    after = idle.tick()
    assert not idle.replies.last_was_short(), f"{change}: answered as nothing changed"
    assert seen(idle, after), f"{change}: not in the read: {after}"
    if change == "the beat fence moved":
        assert after.lock.fence == before.lock.fence + 1
