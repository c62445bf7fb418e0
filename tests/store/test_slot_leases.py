"""The slot leases of pools against a real Redis: every slot is a lease like the heavy lease
(``lua/lease_*.lua`` on the slot's keys). Two grants never share a slot, a stale token can
neither start, renew nor release one, fences increase per slot, a run taking k slots holds all
or none, and the default pool's one slot is the heavy lease under its old keys.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedproj.core import lifecycle
from schedproj.core.pools import Pool
from schedproj.core.records import RunRecord
from schedproj.store.lane_store import LaneStore
from schedproj.store.lease import HeavyLease, PoolSlots, SlotGroup, free_slots, holders
from schedproj.store.protocol import Keys, pool_acquisitions
from tests.conftest import token

pytestmark = pytest.mark.timeout(60)

LONG_TTL = 30.0
POOL = "gpu"


def slot(client: redis.Redis, keys: Keys, index: int, pool: str = POOL) -> HeavyLease:
    return HeavyLease(client, keys.slot(pool, index))


def test_the_default_pool_slot_is_the_heavy_lease_under_its_old_keys(keys: Keys) -> None:
    assert keys.slot("heavy", 0) is keys
    gpu = keys.slot(POOL, 1)
    assert (gpu.lease, gpu.lease_fence, gpu.lease_request, gpu.pressure) == (
        f"{keys.prefix}:pool:gpu:slot:1", f"{keys.prefix}:pool:gpu:slot:1:fence",
        f"{keys.prefix}:pool:gpu:slot:1:request", f"{keys.prefix}:pool:gpu:pressure")
    # Everything else is the deployment's: a run's end under a slot writes the same records.
    assert (gpu.lanes, gpu.wake, gpu.epoch, gpu.beat_lock) == (
        keys.lanes, keys.wake, keys.epoch, keys.beat_lock)


def test_racing_grants_never_share_a_slot(client: redis.Redis, keys: Keys,
                                          redis_url: str) -> None:
    """Twelve contenders race for a pool of three slots, each taking the first slot that
    grants: exactly three win, one per slot, and the rest find every slot held."""
    slots, racers = 3, 12
    barrier = threading.Barrier(racers)
    won: list[tuple[int, str, int]] = []
    lock = threading.Lock()

    def race(lane: str) -> None:
        c = redis.Redis.from_url(redis_url, decode_responses=True)
        leases = [slot(c, keys, i) for i in range(slots)]
        barrier.wait(timeout=30)
        tok = token()
        for i, lease in enumerate(leases):
            grant = lease.acquire(lane, tok, LONG_TTL, time.time())
            if grant.granted:
                with lock:
                    won.append((i, lane, grant.fence))
                break
        c.close()

    threads = [threading.Thread(target=race, args=(f"lane{n}",)) for n in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(i for i, _, _ in won) == [0, 1, 2]
    read = PoolSlots(client, keys, {POOL: Pool(POOL, slots)}).read()
    assert {lease.lane for lease in read[POOL] if lease} == {lane for _, lane, _ in won}
    assert free_slots(read[POOL]) == []
    assert int(client.hget(keys.counters, pool_acquisitions(POOL))) == slots


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["grant", "release", "start", "renew"]),
                          st.integers(0, 1), st.integers(0, 3)), min_size=1, max_size=25))
def test_slots_follow_the_one_lease_model(client: redis.Redis, keys: Keys,
                                          ops: list[tuple[str, int, int]]) -> None:
    """Random grants, releases, starts and renewals by four holders on two slots, checked
    against a model: a slot has at most one grant; only the current token starts (once),
    renews or releases it; each slot's fences only increase."""
    prefix = Keys(f"{keys.prefix}-{token()[:8]}")
    client.set(prefix.epoch, client.get(keys.epoch) or "")  # the same known-intact epoch
    leases = [slot(client, prefix, i) for i in range(2)]
    holder: dict[int, tuple[str, bool] | None] = {0: None, 1: None}  # token, started
    tokens = [token() for _ in range(4)]
    fences: dict[int, int] = {0: 0, 1: 0}
    for op, i, who in ops:
        tok, lease, current = tokens[who], leases[i], holder[i]
        ours = current is not None and current[0] == tok
        if op == "grant":
            grant = lease.acquire(f"lane{who}", tok, LONG_TTL, time.time())
            assert grant.granted == (current is None)
            if grant.granted:
                assert grant.fence > fences[i]
                fences[i], holder[i] = grant.fence, (tok, False)
        elif op == "release":
            assert lease.release(tok) == ours
            if ours:
                holder[i] = None
        elif op == "start":
            ok, _ = lease.start(tok, LONG_TTL, time.time())
            assert ok == (ours and current is not None and not current[1])
            if ok:
                holder[i] = (tok, True)
        else:
            assert lease.renew(tok, LONG_TTL, time.time(), 3600.0).ok == ours
    read = PoolSlots(client, prefix, {POOL: Pool(POOL, 2)}).read()[POOL]
    assert [None if lease is None else lease.token for lease in read] == [
        None if h is None else h[0] for h in holder.values()]
    client.delete(*client.keys(f"{prefix.prefix}:*"))


def test_a_stale_token_cannot_start_renew_or_release_a_slot(client: redis.Redis,
                                                            keys: Keys) -> None:
    gpu0, gpu1 = slot(client, keys, 0), slot(client, keys, 1)
    old, new = token(), token()
    first = gpu0.acquire("embed", old, LONG_TTL, time.time(), task_id="t1")
    assert first.granted
    assert gpu0.release(old)
    second = gpu0.acquire("train", new, LONG_TTL, time.time(), task_id="t2")
    assert second.granted and second.fence > first.fence
    assert gpu0.start(old, LONG_TTL, time.time()) == (False, "taken")
    assert tuple(gpu0.renew(old, LONG_TTL, time.time(), 3600.0)) == (False, "lost")
    assert not gpu0.release(old)
    # A token of one slot means nothing on another.
    assert gpu1.start(new, LONG_TTL, time.time()) == (False, "gone")
    assert not gpu1.release(new)
    lease = gpu0.read()
    assert lease is not None and lease.token == new and lease.started_at is None
    # Its own token starts it once.
    assert gpu0.start(new, LONG_TTL, time.time(), lane="train", task_id="t2") == (
        True, second.fence)
    assert gpu0.start(new, LONG_TTL, time.time()) == (False, "already-started")
    assert tuple(gpu0.renew(new, LONG_TTL, time.time(), 3600.0)) == (True, "")


def test_fences_increase_per_slot_and_across_a_pool(client: redis.Redis, keys: Keys) -> None:
    """Each slot has its own counter, and each fence is at least Redis's clock in ms at its
    grant and above the last fence of the pool: fences strictly increase across the pool's
    slots too (grants in the same millisecond included), so a fence names one hold."""
    seen: list[int] = []
    per_slot: dict[int, list[int]] = {0: [], 1: []}
    for round_ in range(3):
        for i in (0, 1):
            tok = token()
            lease = slot(client, keys, i)
            grant = lease.acquire(f"lane{round_}", tok, LONG_TTL, time.time())
            assert grant.granted
            assert not seen or grant.fence > seen[-1]
            assert not per_slot[i] or grant.fence > per_slot[i][-1]
            seen.append(grant.fence)
            per_slot[i].append(grant.fence)
            assert int(client.get(keys.slot(POOL, i).lease_fence)) == grant.fence
            assert int(client.get(keys.slot(POOL, i).pool_fence)) == grant.fence
            assert lease.release(tok)
    redis_ms = int(client.time()[0]) * 1000
    assert redis_ms - 5000 <= seen[0] <= redis_ms + 1000
    # Garbage where the pool's last fence belongs counts as none: grants go on.
    client.set(keys.slot(POOL, 0).pool_fence, "garbage")
    tok = token()
    grant = slot(client, keys, 0).acquire("after", tok, LONG_TTL, time.time())
    assert grant.granted and grant.fence > per_slot[0][-1]
    # The heavy lease's counter is untouched by slot grants.
    assert client.get(keys.lease_fence) is None


def test_a_run_taking_two_slots_holds_both_or_none(client: redis.Redis, keys: Keys) -> None:
    tok, other = token(), token()
    assert slot(client, keys, 0).acquire("train", tok, LONG_TTL, time.time()).granted
    assert slot(client, keys, 1).acquire("embed", other, LONG_TTL, time.time()).granted
    group = SlotGroup(client, keys, POOL, (0, 1))
    assert group.start(tok, LONG_TTL, time.time()) == (False, "taken")
    # The slot it did start is released: a run never holds part of its slots.
    assert slot(client, keys, 0).read() is None
    assert slot(client, keys, 1).release(other)

    tok = token()
    fences = [slot(client, keys, i).acquire("train", tok, LONG_TTL, time.time()).fence
              for i in (0, 1)]
    ok, fence = group.start(tok, LONG_TTL, time.time(), lane="train")
    assert ok and fence == max(fences)
    assert tuple(group.renew(tok, LONG_TTL, time.time(), 3600.0)) == (True, "")
    read = PoolSlots(client, keys, {POOL: Pool(POOL, 2)}).read()
    assert holders(read) == {POOL: ["train", "train"]}
    group.release_extra(tok)
    assert slot(client, keys, 1).read() is None and slot(client, keys, 0).read() is not None


def test_a_run_end_under_its_slot_releases_that_slot_and_wakes_beat(client: redis.Redis,
                                                                    keys: Keys) -> None:
    tok = token()
    gpu1 = slot(client, keys, 1)
    assert gpu1.acquire("embed", tok, LONG_TTL, time.time(), task_id="t1").granted
    assert gpu1.start(tok, LONG_TTL, time.time(), lane="embed", task_id="t1")[0]
    heavy = HeavyLease(client, keys)
    assert heavy.acquire("summary", token(), LONG_TTL, time.time()).granted
    store = LaneStore(client, keys.slot(POOL, 1))
    released, written = store.finish("embed", RunRecord(runs=1, last_run_at=time.time()),
                                     token=tok, fence=1, wake_message="embed:completed")
    assert (released, written) == (True, 1)
    assert gpu1.read() is None
    assert heavy.read() is not None  # the heavy lease is another slot, of another pool
    assert client.lrange(keys.wake, 0, -1) == ["embed:completed"]


def test_a_pool_run_is_not_marked_lost_while_any_slot_of_its_pool_names_it(
        client: redis.Redis, keys: Keys) -> None:
    """The compare and set that records a pool run lost reads the run's own slots, not the
    heavy lease: a run of two slots whose end released slot 0 and still holds slot 1 (its end
    releases them one by one) is alive; once no slot names it, it is recorded lost."""
    store = LaneStore(client, keys)
    store.snapshot(token(), 5.0, 0.0)  # the epoch is known: a loss may be recorded
    client.zadd(keys.due, {"train": 0})
    running = RunRecord(running_task_id="t2", running_since=time.time(), fence=1)
    store.put_back_runs({"train": running})
    raw = str(client.hget(keys.lanes, "train|run"))
    tok = token()
    assert slot(client, keys, 1).acquire("train", tok, LONG_TTL, time.time(),
                                         task_id="t2").granted
    assert slot(client, keys, 1).start(tok, LONG_TTL, time.time(), lane="train",
                                       task_id="t2")[0]
    lost = lifecycle.lost(running, now=time.time(), why="test")
    slot_keys = [keys.slot(POOL, i).lease for i in (0, 1)]
    assert not store.mark_lost("train", raw, lost, task_id="t2", heavy=True, leases=slot_keys)
    assert client.hget(keys.lanes, "train|run") == raw
    # The heavy lease names another run: no matter, the pool's slots judge a pool run.
    assert slot(client, keys, 1).release(tok)
    assert HeavyLease(client, keys).acquire("summary", token(), LONG_TTL, time.time()).granted
    assert store.mark_lost("train", raw, lost, task_id="t2", heavy=True, leases=slot_keys)
    assert "lost: test" in str(client.hget(keys.lanes, "train|run"))
