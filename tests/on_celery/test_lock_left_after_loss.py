"""Redis restarts empty while beats run (docs/entries.md, "Redis restarts empty while a beat
runs"): the beat lock vanishes with the state, and the active beat, which remembers the states
Redis lost, puts them back when it takes the lock again. A standby that saw it hold the lock
leaves the vacant lock to it for one lock TTL (``lua/tick.lua``, ``FairScheduler._read``):
before, whichever beat ticked first took the lock, and a standby that did remembered nothing,
so every entry and lane counted from now (40 of 57 empty restarts in the chaos runs). A holder
that dies with no loss is replaced as fast as ever, and a beat that never saw a holder takes a
vacant lock at once. In-process FairSchedulers against real Redis; deleting every key of the
deployment stands for Redis restarting empty (the test database is shared by prefix).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from schedproj import Lane, LaneTask
from schedproj.core import lifecycle
from schedproj.core.entries import EntryState
from schedproj.core.records import RunRecord, encode
from schedproj.devtools.redis_server import RedisServer
from schedproj.on_celery.beat import FairScheduler
from schedproj.store.lane_store import LaneStore
from schedproj.store.protocol import Keys, run_field
from tests.conftest import make_app
from tests.on_celery.test_schedule_entries import app_with, queues  # noqa: F401

#: app_with's beat lock TTL (seconds).
TTL = 1.0
ENTRIES = {"e": {"task": "shop.report", "schedule": 2.0, "args": ("e",)}}


def entry_and_lanes(key_prefix: str, **settings: Any) -> Celery:
    """The entry e, and two heavy lanes: while one holds the lease the other waits, due, in
    the active beat's memory (what it puts back as it was)."""
    def declare(app: Celery) -> None:
        @app.task(shared=False, name="shop.report")
        def report(*args: Any) -> None: ...

        @app.task(shared=False, base=LaneTask, name="h.first", lane=Lane(cadence_s=60, order=1))
        def first() -> None: ...

        @app.task(shared=False, base=LaneTask, name="h.waits", lane=Lane(cadence_s=60, order=2))
        def waits() -> None: ...

        app.conf.beat_schedule = ENTRIES

    return make_app(key_prefix, declare, **{"beat_max_loop_interval_s": 0.2,
                                            "beat_lock_ttl_s": TTL, **settings})


def seed_waiting_lane(client: redis.Redis, prefix: str) -> float:
    """h.waits last ran 10 minutes ago: due, it waits behind h.first's lease (remembered)."""
    seeded = time.time() - 600
    client.hset(Keys(prefix).lanes, run_field("h.waits"),
                encode(RunRecord(last_run_at=seeded, runs=3)))
    return seeded


def assert_put_back(client: redis.Redis, prefix: str, before: EntryState, sent_at: float,
                    seeded: float) -> None:
    """The entry's state and the waiting lane's run record are as the active beat remembered
    them: neither counts from now, nor is estimated."""
    after = entry_state(client, prefix)
    assert after is not None and after.total_run_count >= 1, "the entry counts from now"
    assert after.last_run_at == pytest.approx(before.last_run_at, abs=0.01)
    assert after.last_run_at < sent_at
    raw = client.hget(Keys(prefix).lanes, run_field("h.waits"))
    assert raw is not None, "the waiting lane's run record was not put back"
    record = json.loads(raw)
    assert record["runs"] == 3 and record["last_run_at"] == pytest.approx(seeded)
    assert record.get("last_reason") != lifecycle.ESTIMATED_AFTER_LOSS


def lose_everything(client: redis.Redis, prefix: str) -> None:
    """Redis restarts empty: every key of the deployment is gone, the lock and epoch too."""
    keys = list(client.scan_iter(f"{prefix}:*"))
    if keys:
        client.delete(*keys)


def entry_state(client: redis.Redis, prefix: str) -> EntryState | None:
    raw = client.hget(Keys(prefix).entries, "e")
    return None if raw is None else EntryState.decode(raw, "e")


def server_s(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return seconds + micros / 1e6


def quarantine_running(client: redis.Redis, prefix: str) -> bool:
    record = json.loads(client.get(Keys(prefix).epoch))
    return bool(record["quarantine_until"] / 1000 > server_s(client))


def test_a_standby_leaves_the_lock_to_the_active_beat_that_puts_back_what_redis_lost(
        key_prefix: str, queues: redis.Redis, redis_client: redis.Redis,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    keys = Keys(key_prefix)
    seeded = seed_waiting_lane(redis_client, key_prefix)
    a = FairScheduler(app=entry_and_lanes(key_prefix))
    b = FairScheduler(app=entry_and_lanes(key_prefix))
    a.tick()  # e's first look counts from now
    b.tick()
    time.sleep(2.05)
    a.tick()
    sent_at = time.time()
    b.tick()
    assert a.active and not b.active
    before = entry_state(redis_client, key_prefix)
    assert before is not None and before.total_run_count == 1

    lose_everything(redis_client, key_prefix)
    with caplog.at_level("INFO", logger="schedproj.beat"):
        b.tick()  # the standby's tick comes first
        b.tick()
    assert not b.active, "the standby took the lock that vanished with the state"
    assert redis_client.get(keys.beat_lock) is None
    said = [r for r in caplog.records if "lost its state and the beat lock with it" in r.message]
    assert len(said) == 1 and said[0].levelname == "INFO", "said once, at INFO, with why"
    assert a.token[:8] in said[0].message

    for _ in range(3):
        a.tick()
        time.sleep(0.05)
    b.tick()
    assert a.active and not b.active
    assert_put_back(redis_client, key_prefix, before, sent_at, seeded)
    a.close()
    b.close()


def test_the_active_beat_the_restart_cut_off_still_puts_back_what_redis_lost(
        tmp_path: Path, queues: redis.Redis) -> None:  # noqa: F811
    """A real restart: the active beat waits on the wake list (BLPOP) when Redis goes down,
    gets a connection error and stands by ("Redis unreachable"), like every client. It read
    Redis holding the lock a moment before, so no other beat can have taken the lock since
    (only the loss took it): it is still current, takes the lock back and puts back. Before,
    it counted as a standby that remembers nothing (every real restart, by the beats' logs)."""
    state = RedisServer(tmp_path, "state")
    state.start()
    try:
        prefix = "lg"
        client = state.client()
        assert LaneStore(client, Keys(prefix)).declare_fresh()
        seeded = seed_waiting_lane(client, prefix)
        a, b = (FairScheduler(app=entry_and_lanes(prefix, redis_url=state.url,
                                                  beat_max_loop_interval_s=0.5,
                                                  beat_lock_ttl_s=1.5)) for _ in "ab")
        a.tick()  # e's first look counts from now
        b.tick()
        time.sleep(2.05)
        a.tick()
        sent_at = time.time()
        b.tick()
        before = entry_state(client, prefix)
        assert before is not None and before.total_run_count == 1
        waiting = threading.Thread(target=a.tick)  # reads, then waits on the wake list
        waiting.start()
        deadline = time.time() + 5
        while time.time() < deadline and not any(c.get("cmd") == "blpop"
                                                  for c in client.client_list()):
            time.sleep(0.005)
        state.kill()  # Redis restarts empty while the active beat waits on it
        state.start()
        waiting.join()
        assert not a.active, "the restart did not cut the active beat off (test premise)"
        b.tick()
        assert not b.active
        for _ in range(3):
            a.tick()
        b.tick()
        assert a.active and not b.active
        assert_put_back(state.client(), prefix, before, sent_at, seeded)
        a.close()
        b.close()
    finally:
        state.kill()


@pytest.mark.parametrize("history", ["no-loss-ever", "a-loss-the-holder-saw-through"])
def test_a_holder_that_dies_without_a_loss_is_replaced_as_soon_as_its_lock_expires(
        history: str, key_prefix: str, queues: redis.Redis,  # noqa: F811
        redis_client: redis.Redis) -> None:
    """No added delay: the standby takes the lock on its first tick after the lock expired,
    also while a quarantine runs from a loss detected before it saw the holder (the loss took
    nothing the dead beat could put back now: it had the lock after it)."""
    keys = Keys(key_prefix)
    a = FairScheduler(app=app_with(key_prefix, ENTRIES))
    b = FairScheduler(app=app_with(key_prefix, ENTRIES))
    a.tick()
    if history == "a-loss-the-holder-saw-through":
        lose_everything(redis_client, key_prefix)
        a.tick()  # takes the lock again, puts back; the quarantine runs on
        assert a.active
    b.tick()
    b.tick()
    assert not b.active
    # ``a`` is killed here: never ticks again, never releases its lock.
    while redis_client.pttl(keys.beat_lock) > 100:  # (a tick's own time: not past expiry)
        b.tick()
        assert not b.active
        time.sleep(0.02)
    while redis_client.pttl(keys.beat_lock) != -2:  # until Redis expired it
        time.sleep(0.005)
    b.tick()
    assert b.active, "the standby did not take the expired lock at once"
    if history == "a-loss-the-holder-saw-through":
        assert quarantine_running(redis_client, key_prefix)
    b.close()


def test_a_standby_takes_the_lock_within_one_ttl_when_the_active_beat_does_not_come_back(
        key_prefix: str, queues: redis.Redis, redis_client: redis.Redis) -> None:  # noqa: F811
    keys = Keys(key_prefix)
    a = FairScheduler(app=app_with(key_prefix, ENTRIES))
    b = FairScheduler(app=app_with(key_prefix, ENTRIES))
    a.tick()
    saw_holder = time.time()  # b's next tick reads the lock held: it counts from its start
    b.tick()
    # ``a`` is killed and Redis restarts empty.
    lose_everything(redis_client, key_prefix)
    b.tick()
    assert not b.active, "the standby took the lock that vanished with the state"
    took = None
    while took is None and time.time() < saw_holder + 3 * TTL:
        time.sleep(0.05)
        tick_began = time.time()
        b.tick()
        took = tick_began if b.active else None
    assert took is not None and redis_client.get(keys.beat_lock) == b.token
    # At its first tick past one TTL (a poll of 0.05 s here, and a tick's own time).
    assert TTL <= took - saw_holder <= TTL + 0.3, f"took it {took - saw_holder:.2f}s after"
    b.close()


@pytest.mark.parametrize("start", ["new-deployment", "every-beat-restarted-after-a-loss"])
def test_a_beat_that_never_saw_a_holder_takes_a_vacant_lock_on_its_first_tick(
        start: str, key_prefix: str, queues: redis.Redis,  # noqa: F811
        redis_client: redis.Redis) -> None:
    if start == "every-beat-restarted-after-a-loss":
        a = FairScheduler(app=app_with(key_prefix, ENTRIES))
        b = FairScheduler(app=app_with(key_prefix, ENTRIES))
        a.tick()
        b.tick()
        lose_everything(redis_client, key_prefix)  # and both beats restart
    c = FairScheduler(app=app_with(key_prefix, ENTRIES))
    c.tick()
    assert c.active
    c.close()
