"""What beat publishes of its entries (``<prefix>:entries:info``), against real Redis."""

from __future__ import annotations

import redis

from schedproj.store.entry_store import SCAN_CHUNK, EntryStore
from schedproj.store.protocol import Keys


def test_the_listing_is_replaced_whole_in_parts(key_prefix: str,
                                                redis_client: redis.Redis) -> None:
    keys = Keys(key_prefix)
    store = EntryStore(redis_client, keys)
    redis_client.hset(keys.entries_info, mapping={"old": "{}"})
    many = [(f"e{i:05d}", f'{{"i":{i}}}') for i in range(2 * SCAN_CHUNK + 7)]
    store.publish(iter(many))
    assert redis_client.hgetall(keys.entries_info) == dict(many)
    assert not redis_client.exists(keys.entries_info_staging)
    store.publish(iter(()))
    assert not redis_client.exists(keys.entries_info)


def test_every_state_is_read_once_in_parts(key_prefix: str, redis_client: redis.Redis) -> None:
    keys = Keys(key_prefix)
    states = {f"e{i:05d}": f"s{i}" for i in range(3 * SCAN_CHUNK + 1)}
    redis_client.hset(keys.entries, mapping=states)
    assert dict(EntryStore(redis_client, keys).all_states()) == states
