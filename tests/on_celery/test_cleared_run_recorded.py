"""Beat records a heavy run whose lease an operator cleared as ``cleared``, not ``lost``
(issue 19: 1): the finding's beat recorded the run lost and dispatched the lane again."""

from __future__ import annotations

import json
import time

import pytest
import redis

from schedproj.core import lifecycle
from schedproj.on_celery.beat import FairScheduler
from schedproj.on_celery.run_records import swap_run
from schedproj.store.lease import HeavyLease, Holder, OperatorRequest
from schedproj.store.protocol import CounterKind, Keys, counter_field
from tests.on_celery.test_fair_scheduler_tick import build, three_lanes


@pytest.mark.parametrize("action", ["clear", "terminate"])
def test_a_run_cleared_by_an_operator_is_recorded_cleared(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis, action: str) -> None:
    keys = Keys(key_prefix)
    sched = FairScheduler(app=build(key_prefix, three_lanes))
    sched.tick()
    lease = HeavyLease(redis_client, keys)
    granted = lease.read()
    assert granted is not None and granted.task_id
    # The worker starts the run: its lease, then its run record (as LaneTask does).
    now = time.time()
    assert lease.start(granted.token, 30, now, holder=Holder("box", 1, "heavyS@box#b#1"))[0]
    swap_run(sched.rt.store, granted.lane,
             lambda before: lifecycle.started(before, task_id=str(granted.task_id), now=now,
                                              running_until=now + 60, fence=granted.fence),
             tries=3)
    sched.tick()  # beat sees the run started
    request = OperatorRequest(action, str(granted.task_id), granted.lane, granted.fence, now)
    if action == "clear":
        assert lease.clear(granted, started=True, request=request) == "cleared"
    else:  # terminated: the request is left first, then the lease expires with its renewals
        lease.ask(request)
        redis_client.delete(keys.lease)
    sched.tick()
    sched.close()
    record = json.loads(redis_client.hget(keys.lanes, f"{granted.lane}|run"))
    assert record["last_task_id"] == granted.task_id
    assert record["last_reason"].startswith("cleared: by an operator"), record
    events = [json.loads(x) for x in redis_client.lrange(keys.journal, 0, -1)]
    assert [e["ev"] for e in events if e.get("task") == granted.task_id] == ["cleared"]
    assert redis_client.hget(keys.counters, counter_field(CounterKind.LOST, granted.lane)) \
        is None
