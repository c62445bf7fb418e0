"""Beat's full read leaves its tables as garbage in Redis's Lua heap, which Lua would collect a
step at a time at the cost of every later script call (the idle tick's included: 1.2-1.6x
celery-redbeat's right after start-up at 100,000 lanes, docs/performance.md). The store
collects it once, right after."""

from __future__ import annotations

import redis

from schedproj.store.lane_store import LaneStore
from schedproj.store.protocol import Keys

#: A script that leaves about 30 MiB of tables behind it, as a full read of many lanes does.
LITTER = "local t = {} for i = 1, 200000 do t[i] = {i, tostring(i)} end return #t"


def lua_heap_kib(client: redis.Redis) -> float:
    return float(client.info("memory")["used_memory_lua"]) / 1024


def test_collect_script_garbage_empties_the_lua_heap(redis_client: redis.Redis,
                                                     key_prefix: str) -> None:
    store = LaneStore(redis_client, Keys(key_prefix))
    redis_client.eval(LITTER, 0)
    assert lua_heap_kib(redis_client) > 10_000, "the litter should have left garbage"
    collected = store.collect_script_garbage()
    assert collected is not None
    before, after = collected
    assert before > 10_000 and after < 5_000, collected
    assert lua_heap_kib(redis_client) < 5_000
