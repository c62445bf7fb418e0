"""A heavy run heeds an operator's ``clear-lease --stop`` at its next checkpoint, through the
request its lease renewal reads; another run's request, or garbage, changes nothing."""

from __future__ import annotations

import time
from types import SimpleNamespace

import redis

from schedproj.on_celery.keepalive import OPERATOR_STOP, LeaseRenewer
from schedproj.on_celery.run_context import RunContext
from schedproj.store.lease import HeavyLease, OperatorRequest
from schedproj.store.protocol import Keys


def context() -> RunContext:
    return RunContext(lane="big", task_id="run-1", started_at=time.time(), hold_cap_s=3600)


def test_a_stop_for_this_run_makes_it_yield_and_not_lose_its_lease(client: redis.Redis,
                                                                    keys: Keys) -> None:
    lease = HeavyLease(client, keys)
    ctx = context()
    renewer = LeaseRenewer(SimpleNamespace(), "tok", ctx)  # type: ignore[arg-type]
    renewer.heed_operator(lease)
    assert not ctx.should_yield()
    lease.ask(OperatorRequest("stop", "other-run", "big", 1, time.time()))
    renewer.heed_operator(lease)
    assert not ctx.should_yield(), "another run's request"
    lease.ask(OperatorRequest("stop", "run-1", "big", 1, time.time()))
    renewer.heed_operator(lease)
    assert ctx.should_yield() and ctx.lost_reason == OPERATOR_STOP
    assert not ctx.lost.is_set(), "a stop is a normal yield, not a lost lease"


def test_a_garbage_request_never_stops_a_run(client: redis.Redis, keys: Keys) -> None:
    client.set(keys.lease_request, '{"action": "stop", "task_id": "run-1"')
    ctx = context()
    LeaseRenewer(SimpleNamespace(), "tok", ctx).heed_operator(  # type: ignore[arg-type]
        HeavyLease(client, keys))
    assert not ctx.should_yield()
