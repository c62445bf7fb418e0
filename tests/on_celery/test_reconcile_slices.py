"""Beat's periodic reconcile of the due index goes a slice a tick (``FairScheduler._reconcile``,
``LaneStore.reconcile_slice``): damage the index's stamps cannot see - a score moved far ahead
by hand, a lane removed from the index - is put right within one cycle, and no tick reads more
than a slice more than it needed anyway, however many lanes there are.

In-process beat, real Redis; a short reconcile period and a small slice keep it fast.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
import redis
from celery import Celery

from schedproj import Lane, LaneKind, LaneTask
from schedproj.core.families import LaneFamily, member_lane
from schedproj.core.records import Outcome, RunRecord, encode
from schedproj.on_celery.beat import FairScheduler
from schedproj.store.families import FamilyStore
from schedproj.store.lane_store import LaneStore
from schedproj.store.protocol import STAMP_MEMBER, Keys, run_field
from tests.conftest import make_app

pytestmark = pytest.mark.timeout(60)

FAMILY = "r.sync"
PLAIN = "r.plain"
#: Past 128 members: Redis 7.2+ keeps a smaller set as a listpack, whose SSCAN returns it whole.
SLICE = 50
CADENCE_S = 3600.0
PERIOD_S = 0.2


def declare(app: Celery) -> None:
    @app.task(shared=False, base=LaneTask, name=FAMILY,
              lane=LaneFamily(cadence_s=CADENCE_S, kind=LaneKind.LIGHT))
    def sync(key: str) -> None: ...

    @app.task(shared=False, base=LaneTask, name=PLAIN,
              lane=Lane(cadence_s=CADENCE_S, kind=LaneKind.LIGHT))
    def plain() -> None: ...


def ran(at: float) -> str:
    return encode(RunRecord(last_run_at=at, last_outcome=Outcome.COMPLETED, runs=1))


def beat_over(key_prefix: str, redis_client: redis.Redis, members: list[str],
              period_s: float) -> FairScheduler:
    """A beat over a family of ``members`` and one plain lane, each run half a cadence ago
    (none due), after its first tick (the take-over: every lane indexed at its next look)."""
    keys = Keys(key_prefix)
    app = make_app(key_prefix, declare, beat_max_loop_interval_s=0.05, beat_lock_ttl_s=5.0,
                   derived_reconcile_s=period_s, reconcile_slice=SLICE, wake_on_release=False)
    FamilyStore(redis_client, keys, [FAMILY]).add(FAMILY, members)
    half = time.time() - CADENCE_S / 2
    redis_client.hset(keys.lanes, mapping={
        run_field(lane): ran(half)
        for lane in [PLAIN, *(member_lane(FAMILY, m) for m in members)]})
    sched = FairScheduler(app=app)
    sched.tick()
    return sched


def dispatched(broker: redis.Redis) -> list[str]:
    return [f"{m['headers']['task']}{m['headers']['argsrepr']}"
            for m in (json.loads(raw) for raw in broker.lrange("light", 0, -1))]


def test_a_score_moved_ahead_and_a_lane_removed_from_the_index_are_dispatched_within_a_cycle(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    keys = Keys(key_prefix)
    members = [f"m{i:03d}" for i in range(3 * SLICE)]
    sched = beat_over(key_prefix, redis_client, members, PERIOD_S)
    assert dispatched(broker) == []
    moved, removed = member_lane(FAMILY, members[7]), member_lane(FAMILY, members[-3])
    # Both fall due by records written past the index (no changed mark, no score moved), and
    # the index is damaged where its stamps cannot see: one score a day ahead, one gone.
    long_ago = time.time() - 2 * CADENCE_S
    redis_client.hset(keys.lanes, mapping={run_field(moved): ran(long_ago),
                                           run_field(removed): ran(long_ago),
                                           run_field(PLAIN): ran(long_ago)})
    redis_client.zadd(keys.due, {moved: time.time() + 86400, PLAIN: time.time() + 86400})
    redis_client.zrem(keys.due, removed)
    sched.tick()
    assert dispatched(broker) == [], "nothing reads them before the reconcile"
    # One cycle: 151 lanes at 50 a tick is 4 slices, each read by the tick after it.
    begun = time.time()
    while time.time() - begun < PERIOD_S + 0.1:
        time.sleep(0.02)
    for _ in range(6):
        sched.tick()
    assert sorted(dispatched(broker)) == sorted([
        f"{FAMILY}['{members[7]}']", f"{FAMILY}['{members[-3]}']", f"{PLAIN}()"])
    # Each has its next look in the index again, a cadence ahead.
    for lane in (moved, removed, PLAIN):
        score = redis_client.zscore(keys.due, lane)
        assert score is not None and time.time() < score < time.time() + 2 * CADENCE_S
    sched.close()


def test_no_tick_of_a_reconcile_reads_more_than_a_slice_beyond_what_it_needed(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    members = [f"m{i:03d}" for i in range(3 * SLICE)]
    sched = beat_over(key_prefix, redis_client, members, PERIOD_S)
    store = sched.rt.store
    idle = []
    for _ in range(3):  # what an idle tick reads with no reconcile due (the lanes read always)
        sched.tick()
        idle.append(sum(store.read_pages))
    time.sleep(PERIOD_S + 0.05)
    reads, marked = [], []
    for _ in range(6):
        sched.tick()
        reads.append(sum(store.read_pages))
        cycle = sched._cycle
        marked.append(sum(cycle.pages) if cycle is not None else 0)
    need = max(idle)
    # Every lane (151) was re-checked, a slice a tick, each tick reading at most the slice the
    # tick before marked (an SSCAN page may hold a few more: at most a quarter here).
    assert sum(reads) - need * len(reads) >= 3 * SLICE + 1, (reads, idle)
    assert max(reads) <= need + SLICE + SLICE // 4, (reads, idle)
    assert dispatched(broker) == []
    sched.close()


def test_the_full_reconcile_read_every_lane_in_one_tick_which_slices_no_longer_do(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    """The figure the slices bound: with the period passed, the largest read of any tick."""
    members = [f"m{i:03d}" for i in range(5 * SLICE)]
    sched = beat_over(key_prefix, redis_client, members, PERIOD_S)
    time.sleep(PERIOD_S + 0.05)
    largest = 0
    for _ in range(8):
        sched.tick()
        largest = max(largest, sum(sched.rt.store.read_pages))
    assert largest <= SLICE + SLICE // 4 + 2, largest
    sched.close()


def test_a_slice_drops_no_mark_of_a_paged_read_left_unfinished(
        client: redis.Redis, keys: Keys) -> None:
    """Marks a beat left aside mid-read (``changed:reading``) and the slice's marks are all
    read, the aside ones first: the slice writes only the changed set."""
    store, token = LaneStore(client, keys, read_page=5), uuid.uuid4().hex
    assert store.tick_snapshot(token, 5.0, 0.0, cursor=None, now=time.time()).lock.held
    lanes = [f"lane{i}" for i in range(4)]
    assert store.heal_derived(token, lanes, rescore=False)
    store.tick_snapshot(token, 5.0, 0.0, cursor=None, now=time.time())
    client.zadd(keys.due, {lane: time.time() + 3600 for lane in lanes})
    client.sadd(keys.changed_reading, "aside1", "aside2")
    cycle = store.reconcile_cycle()
    assert store.reconcile_slice(token, lanes, cycle, 10) and cycle.done
    assert client.smembers(keys.changed_reading) == {"aside1", "aside2"}
    read: set[str] = set()
    for _ in range(3):
        snap = store.tick_snapshot(token, 5.0, 0.0, cursor=time.time(), now=time.time())
        read |= set(snap.changed)
    assert {"aside1", "aside2", *lanes} <= read, read
    assert not any(m.startswith(STAMP_MEMBER) for m in read)


def test_a_cycle_marks_every_declared_lane_and_member_of_every_family_a_bounded_slice_a_call(
        client: redis.Redis, keys: Keys) -> None:
    """The cycle's position carries over declared lanes and families of every size: its
    slices together mark each lane, none holds more than the budget (plus what an SSCAN page
    may add), and a slice makes at most 16 calls even over many small families."""
    store, token = LaneStore(client, keys), uuid.uuid4().hex
    assert store.tick_snapshot(token, 5.0, 0.0, cursor=None, now=time.time()).lock.held
    declared = [f"lane{i}" for i in range(70)]
    sizes = {"big": 400, "mid": 130, **{f"tiny{i:02d}": 1 for i in range(40)}}
    families = FamilyStore(client, keys, list(sizes))
    for family, n in sizes.items():
        families.add(family, [f"k{i:03d}" for i in range(n)])
    every = {*declared, *(member_lane(f, f"k{i:03d}") for f, n in sizes.items()
                          for i in range(n))}
    client.delete(keys.changed)
    cycle, marked, budget = store.reconcile_cycle(), set(), 64
    slices = 0
    while not cycle.done:
        assert store.reconcile_slice(token, declared, cycle, budget)
        slices += 1
        assert sum(cycle.pages) <= budget + budget // 2 and len(cycle.pages) <= 17, cycle.pages
        marked |= client.smembers(keys.changed)
        client.delete(keys.changed)
        assert slices < 100
    assert marked == every
    assert slices >= len(every) // budget
