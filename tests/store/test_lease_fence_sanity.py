"""A fence counter that is not a sane integer refuses the grant, naming the key: a fence of
1e300 once came back to the worker as -9223372036854775808, and its body ran."""

from __future__ import annotations

import time

import pytest
import redis

from schedproj.core.errors import StateError
from schedproj.store.lease import HeavyLease
from schedproj.store.protocol import Keys

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("garbage", ["1e300", "abc", "-5", "12.5", "9" * 30, "nan", " 7"])
def test_a_fence_counter_that_is_no_sane_integer_refuses_the_grant(
        client: redis.Redis, keys: Keys, garbage: str) -> None:
    lease = HeavyLease(client, keys)
    client.set(keys.lease_fence, garbage)
    with pytest.raises(redis.ResponseError) as refused:
        lease.acquire("summary", "tok", 30, time.time())
    assert keys.lease_fence in str(refused.value) and "Fix:" in str(refused.value)
    assert client.get(keys.lease) is None, "granted on a garbage fence"
    assert client.get(keys.lease_fence) == garbage, "the evidence was overwritten"


def test_a_sane_counter_still_grants_above_it(client: redis.Redis, keys: Keys) -> None:
    lease = HeavyLease(client, keys)
    client.set(keys.lease_fence, str(2 ** 52))
    grant = lease.acquire("summary", "tok", 30, time.time())
    assert grant.granted and grant.fence == 2 ** 52 + 1


def test_current_fence_names_the_key_when_it_holds_garbage(client: redis.Redis,
                                                           keys: Keys) -> None:
    client.set(keys.lease_fence, "1e300")
    with pytest.raises(StateError) as bad:
        HeavyLease(client, keys).current_fence()
    assert keys.lease_fence in str(bad.value)
