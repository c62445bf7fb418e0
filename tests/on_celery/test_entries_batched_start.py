"""Beat's start with many schedule entries is done a bounded page per tick (issue 23: at
1,000,000 entries the take-over held one tick 15 s, past the beat lock's TTL), against real
Redis: no tick's entries step grows with the number of entries, the entries the due index holds
as due are still sent in the first tick, and a beat that loses the lock mid-pass leaves the
next one to finish it, sending no due time twice.

The page sizes are made small (the same code paths at a few thousand entries as at a million).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis

from schedproj.core.entries import EntryState
from schedproj.on_celery import entries as entries_module
from schedproj.on_celery.beat import FairScheduler
from schedproj.store import entry_store
from schedproj.store.protocol import Keys
from tests.on_celery.test_schedule_entries import app_with, messages, queues  # noqa: F401

PAGE = 100
STEPS = 2
READS = 1


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Small pages, and the number of entries each judging pass looked at (the plan's own
    count, read by wrapping the pure planner: nothing of Redis or Celery is replaced)."""
    monkeypatch.setattr(entries_module, "PASS_PAGE", PAGE, raising=False)
    monkeypatch.setattr(entries_module, "PASS_STEPS_PER_TICK", STEPS, raising=False)
    monkeypatch.setattr(entries_module, "JUDGE_READS_PER_TICK", READS, raising=False)
    monkeypatch.setattr(entry_store, "READ_LIMIT", PAGE)
    monkeypatch.setattr(entry_store, "SCAN_CHUNK", PAGE)
    judged: list[int] = []
    plan = entries_module.plan_entries

    def counted(*args: Any, **kwargs: Any) -> Any:
        judged.append(len(args[2]))
        return plan(*args, **kwargs)

    monkeypatch.setattr(entries_module, "plan_entries", counted)
    yield judged


def hourly(n: int, *extra: str) -> dict[str, Any]:
    names = [f"e{i:05d}" for i in range(n)] + list(extra)
    return {name: {"task": "shop.report", "schedule": timedelta(hours=1), "args": (name,)}
            for name in names}


def sent_names(broker: redis.Redis) -> list[str]:
    """The entries whose messages wait in the default queue (each carries its name)."""
    return sorted(m["args"].strip("[](),'") for m in messages(broker, "celery"))


def passing(sched: FairScheduler) -> bool:
    """A pass over every entry is under way (a beat without passes: never)."""
    return bool(getattr(sched.engine.entries, "passing", False))


def commands(client: redis.Redis) -> int:
    """Every command Redis ran so far (those scripts ran included)."""
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


def start(sched: FairScheduler, judged: list[int], client: redis.Redis,
          limit: int = 500) -> list[tuple[int, int]]:
    """Tick until the take-over's pass is done; each tick's (Redis commands, entries judged)."""
    ticks: list[tuple[int, int]] = []
    while True:
        before, looked = commands(client), len(judged)
        sched.tick()
        ticks.append((commands(client) - before - 1, sum(judged[looked:])))
        if sched.active and not passing(sched):
            return ticks
        assert len(ticks) < limit, "the take-over's pass did not end"


def test_no_start_tick_does_more_work_with_more_entries(
        key_prefix: str, queues: redis.Redis, redis_client: redis.Redis,  # noqa: F811
        small_pages: list[int]) -> None:
    most: dict[int, int] = {}
    for n in (300, 3000):
        prefix = f"{key_prefix}-{n}"
        sched = FairScheduler(app=app_with(prefix, hourly(n)))
        ticks = start(sched, small_pages, redis_client)
        assert len(ticks) > 1, "a pass over every entry was done in one tick"
        most[n] = max(c for c, _ in ticks)
        assert max(j for _, j in ticks) <= READS * PAGE
        # Every entry judged once in the ticks after the pass, a bounded number a tick.
        while redis_client.hlen(Keys(prefix).entries) < n:
            looked = len(small_pages)
            sched.tick()
            assert sum(small_pages[looked:]) <= READS * PAGE
        # The reconcile (every DERIVED_RECONCILE_S) heals the index a page at a time too.
        sched.engine.entries.reconcile()
        while True:
            before = commands(redis_client)
            sched.tick()
            most[n] = max(most[n], commands(redis_client) - before - 1)
            if not passing(sched):
                break
        assert redis_client.zcard(Keys(prefix).entries_due) == n
        assert redis_client.hlen(Keys(prefix).entries_info) == n
        sched.close()
        for key in redis_client.scan_iter(f"{prefix}:*"):
            redis_client.delete(key)
    # Ten times the entries, the same most work a tick (the count is the server's: slack for
    # the lanes' commands and any other client's; done in one tick, it was ten times).
    assert most[3000] < 2 * most[300], most


def make_due(client: redis.Redis, prefix: str, names: list[str]) -> None:
    """As a previous beat would leave them: their last run two hours back, their next look
    passed a second ago."""
    keys = Keys(prefix)
    for name in names:
        state = EntryState.decode(client.hget(keys.entries, name), "t")
        client.hset(keys.entries, name, EntryState(time.time() - 7200, state.total_run_count,
                                                   state.schedule_key).encode())
        client.zadd(keys.entries_due, {name: time.time() - 1})


def judged_once(sched: FairScheduler, client: redis.Redis, prefix: str, n: int) -> None:
    """Tick until every entry has a stored state (each was judged once)."""
    for _ in range(500):
        if sched.active and not passing(sched) \
                and client.hlen(Keys(prefix).entries) >= n:
            return
        sched.tick()
    raise AssertionError("the entries were not all judged")


def test_entries_due_at_a_take_over_are_sent_in_its_first_tick(
        key_prefix: str, queues: redis.Redis, redis_client: redis.Redis,  # noqa: F811
        small_pages: list[int]) -> None:
    due = [f"zz{i}" for i in range(5)]   # last by name: behind every other one but for the order
    spec = hourly(2000, *due)
    first = FairScheduler(app=app_with(key_prefix, spec))
    judged_once(first, redis_client, key_prefix, len(spec))
    first.close()
    queues.delete("celery")
    make_due(redis_client, key_prefix, due)
    second = FairScheduler(app=app_with(key_prefix, spec))
    second.tick()
    assert second.active and passing(second), "the pass was not spread over ticks"
    assert sent_names(queues) == due
    judged_once(second, redis_client, key_prefix, len(spec))
    time.sleep(0.3)
    second.tick()
    assert sent_names(queues) == due, "a due time was sent twice"
    second.close()


def test_a_beat_that_loses_the_lock_mid_pass_leaves_the_next_to_finish_it(
        key_prefix: str, queues: redis.Redis, redis_client: redis.Redis,  # noqa: F811
        small_pages: list[int]) -> None:
    due = [f"zz{i}" for i in range(3)]
    spec = hourly(1500, *due)
    keys = Keys(key_prefix)
    setup = FairScheduler(app=app_with(key_prefix, spec))
    judged_once(setup, redis_client, key_prefix, len(spec))
    setup.close()
    queues.delete("celery")
    make_due(redis_client, key_prefix, due)
    # A stale name in the index and the states: the pass deletes it, whoever finishes.
    redis_client.hset(keys.entries, "gone", EntryState(1.0, 1, "x").encode())
    redis_client.zadd(keys.entries_due, {"gone": time.time() + 60})
    a = FairScheduler(app=app_with(key_prefix, spec))
    a.tick()
    assert a.active and passing(a)
    # A freezes past its lock; B takes over while A's pass is half done.
    redis_client.delete(keys.beat_lock)
    b = FairScheduler(app=app_with(key_prefix, spec))
    b.tick()
    assert b.active
    for _ in range(300):
        a.tick()   # finds the lock held by B: stands by, writes nothing
        assert not a.active
        if not passing(b):
            break
        b.tick()
    assert not passing(b)
    assert redis_client.zcard(keys.entries_due) == len(spec)
    assert redis_client.hlen(keys.entries_info) == len(spec)
    assert not redis_client.hexists(keys.entries, "gone")
    judged_once(b, redis_client, key_prefix, len(spec))
    b.close()
    # A comes back once B is gone: it forgot what it remembered, and sends nothing again.
    for _ in range(300):
        a.tick()
        if a.active and not passing(a):
            break
    a.tick()
    sent = sent_names(queues)
    assert sent == due, "a due time was sent twice (or not at all)"
    a.close()


def test_a_tick_with_pass_work_left_asks_to_come_back_at_once(
        key_prefix: str, queues: redis.Redis, redis_client: redis.Redis,  # noqa: F811
        small_pages: list[int]) -> None:
    sched = FairScheduler(app=app_with(key_prefix, hourly(1000)))
    sched.tick()
    assert passing(sched)
    # A tick that began a while ago (its lanes' part was slow): the next look is its start,
    # not the moment the entries' step ended (beat would sleep as long as this tick took).
    began = time.time() - 5.0
    assert sched.engine.entries.tick(began, False) == began
    sched.close()


def test_beat_skips_its_idle_floor_only_while_entries_work_is_left(
        key_prefix: str, queues: redis.Redis, redis_client: redis.Redis,  # noqa: F811
        small_pages: list[int]) -> None:
    # Polling (no wake list): the sleep beat asks of Celery's loop is the one it returns.
    sched = FairScheduler(app=app_with(key_prefix, hourly(1000), wake_on_release=False))
    intervals = []
    while len(intervals) < 500:
        intervals.append(sched.tick())
        if not passing(sched) and not sched.engine.entries.work_left:
            break
    # Every tick with a page of the pass or due entries left came back at once (the 0.1 s
    # idle floor was a sixth of each such tick at 1,000,000 entries) ...
    assert len(intervals) > 2 and all(i == 0.0 for i in intervals[:-1])
    # ... and once the work is done, a tick that sent nothing sleeps again (floor or more).
    assert sched.tick() >= 0.1
    sched.close()
