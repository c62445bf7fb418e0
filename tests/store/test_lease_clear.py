"""An operator's clear of the heavy lease (``lua/lease_clear.lua``): only the grant it judged,
only in the state it judged it in; a start racing the clear wins or loses cleanly."""

from __future__ import annotations

import time

import pytest
import redis

from schedproj.store.lease import HeavyLease, OperatorRequest
from schedproj.store.protocol import Keys

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def lease(client: redis.Redis, keys: Keys) -> HeavyLease:
    return HeavyLease(client, keys)


def granted(lease: HeavyLease, token: str = "tok") -> None:
    assert lease.acquire("summary", token, 30, time.time(), task_id="t1").granted


def test_an_unstarted_grant_is_cleared_and_its_message_then_refused(lease: HeavyLease) -> None:
    granted(lease)
    view = lease.read()
    assert view is not None
    assert lease.clear(view, started=False) == "cleared"
    assert lease.read() is None
    assert lease.start("tok", 30, time.time()) == (False, "gone")


def test_a_start_that_lands_first_wins_and_the_clear_refuses(lease: HeavyLease) -> None:
    granted(lease)
    judged = lease.read()  # the operator read it unstarted ...
    assert judged is not None and judged.started_at is None
    assert lease.start("tok", 30, time.time())[0]  # ... and the holder started meanwhile
    assert lease.clear(judged, started=False) == "started"
    held = lease.read()
    assert held is not None and held.started_at is not None


def test_a_started_lease_is_cleared_only_as_started_and_leaves_the_request(
        lease: HeavyLease, client: redis.Redis, keys: Keys) -> None:
    granted(lease)
    view = lease.read()
    assert view is not None
    assert lease.clear(view, started=True) == "unstarted", "judged started, found unstarted"
    assert lease.start("tok", 30, time.time())[0]
    request = OperatorRequest("clear", "t1", "summary", view.fence, time.time())
    assert lease.clear(view, started=True, request=request) == "cleared"
    assert lease.read() is None
    assert lease.request() == request
    assert client.pttl(keys.lease_request) > 0


def test_another_grant_or_none_is_never_cleared(lease: HeavyLease) -> None:
    granted(lease, "old")
    old = lease.read()
    assert old is not None
    assert lease.release("old")
    assert lease.clear(old, started=False) == "gone"
    granted(lease, "new")
    assert lease.clear(old, started=False) == "taken"
    assert lease.read() is not None


@pytest.mark.parametrize("raw", ["{", "[1]", '{"action": "stop"}', '{"action": "stop", '
                                 '"task_id": "t", "lane": "l", "fence": "x", "at": 1}'])
def test_a_garbage_request_is_no_request(lease: HeavyLease, client: redis.Redis, keys: Keys,
                                         raw: str) -> None:
    client.set(keys.lease_request, raw)
    assert lease.request() is None
