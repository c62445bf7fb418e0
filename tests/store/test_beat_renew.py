"""The beat lock's mid-tick renewal (``lua/beat_renew.lua``, ``LaneStore.renew_held``) only
extends the lock for the beat that holds it: a lock another beat holds keeps its holder and
its TTL, and a vacant one - expired, or vanished with Redis's state - stays vacant with the
beat fence untouched. The renewal went through beat_lock.lua, which took a vacant lock (a new
fence) and gave it back: a standby could see the lapsed beat hold it meanwhile, and the beat
fence moved on for a lock nobody kept; a vanished lock is taken back only by the tick's own
lock step (``lua/tick.lua``), which leaves it to the beat that held it before a state loss."""

from __future__ import annotations

import redis

from schedproj.store.lane_store import LaneStore
from schedproj.store.protocol import Keys

TTL_S = 30.0


def test_the_holder_renews_its_lock(key_prefix: str, redis_client: redis.Redis) -> None:
    keys = Keys(key_prefix)
    store = LaneStore(redis_client, keys)
    assert store.snapshot("mine", 1.0).lock.held
    assert store.renew_held("mine", TTL_S) is None
    assert store.renew("mine", TTL_S)
    assert redis_client.pttl(keys.beat_lock) > 1000


def test_a_lock_another_beat_holds_is_never_extended(key_prefix: str,
                                                     redis_client: redis.Redis) -> None:
    keys = Keys(key_prefix)
    store = LaneStore(redis_client, keys)
    redis_client.set(keys.beat_lock, "theirs", px=2000)
    assert store.renew_held("mine", TTL_S) == "theirs"
    assert not store.renew("mine", TTL_S)
    assert redis_client.get(keys.beat_lock) == "theirs"
    assert 0 < redis_client.pttl(keys.beat_lock) <= 2000


def test_a_vacant_lock_is_never_taken_by_a_renewal(key_prefix: str,
                                                   redis_client: redis.Redis) -> None:
    keys = Keys(key_prefix)
    store = LaneStore(redis_client, keys)
    assert store.snapshot("mine", 1.0).lock.held
    fence = redis_client.get(keys.beat_fence)
    redis_client.delete(keys.beat_lock)  # expired, or lost with Redis's state
    assert store.renew_held("mine", TTL_S) == ""
    assert not store.renew("mine", TTL_S)
    assert not redis_client.exists(keys.beat_lock)
    assert redis_client.get(keys.beat_fence) == fence
