"""A family member removed and added back while its run is in flight is not run twice at once.

``family remove`` deletes the member's state, its in-flight mark included ("a run in progress
finishes"), and ``family add`` gives it a fresh record, just due. Removed and added back while
a light run of it executes (an operator's undo, a members hook whose tenant list flaps for one
sync), beat saw a due member with nothing in flight and dispatched it again: two runs of one
light lane at once, which the run's own start check could not refuse (its dispatch was the
current one).
"""

from __future__ import annotations

import base64
import json
import threading
from typing import Any

import pytest
import redis
from celery import Celery

from schedproj import LaneKind, LaneTask
from schedproj.core.families import LaneFamily
from schedproj.on_celery.beat import FairScheduler
from schedproj.store.families import FamilyStore
from schedproj.store.protocol import Keys
from tests.conftest import make_app

pytestmark = pytest.mark.timeout(60)

FAMILY = "j.tenant-sync"
inside: list[str] = []
overlaps: list[str] = []
release = threading.Event()
entered = threading.Event()


def declare(app: Celery) -> None:
    @app.task(shared=False, base=LaneTask, name=FAMILY,
              lane=LaneFamily(cadence_s=3600, kind=LaneKind.LIGHT))
    def tenant_sync(key: str) -> None:
        if inside:
            overlaps.append(key)
        inside.append(key)
        entered.set()
        try:
            release.wait(20)
        finally:
            inside.remove(key)


def run_message(app: Celery, message: dict[str, Any]) -> None:
    """The worker's path for one message (start check, body, run end), in-process."""
    args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
    task = app.tasks[message["headers"]["task"]]
    task.push_request(id=message["headers"]["id"], delivery_info={"routing_key": "light"})
    try:
        task(*args, **kwargs)
    finally:
        task.pop_request()


def test_a_member_removed_and_added_back_mid_run_is_not_dispatched_again(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    inside.clear()
    overlaps.clear()
    release.clear()
    entered.clear()
    keys = Keys(key_prefix)
    app = make_app(key_prefix, declare, beat_max_loop_interval_s=0.2, beat_lock_ttl_s=5.0,
                   start_deadline_s=30.0)
    store = FamilyStore(redis_client, keys, [FAMILY])
    store.add(FAMILY, ["acme"])
    sched = FairScheduler(app=app)
    sched.tick()
    (first,) = [json.loads(m) for m in broker.lrange("light", 0, -1)]
    broker.delete("light")
    worker = threading.Thread(target=run_message, args=(app, first), daemon=True)
    worker.start()
    try:
        assert entered.wait(10), "the first run never started"
        store.remove(FAMILY, ["acme"])
        sched.tick()
        store.add(FAMILY, ["acme"])
        for _ in range(3):
            sched.tick()
        again = [json.loads(m) for m in broker.lrange("light", 0, -1)]
        if again:  # what a second light worker does with it while the first still runs
            second = threading.Thread(target=run_message, args=(app, again[0]), daemon=True)
            second.start()
            second.join(2)
        assert overlaps == [], "the member ran twice at once"
        assert again == [], "the member was dispatched again while its run was in flight"
    finally:
        release.set()
        worker.join(10)
        sched.close()


def test_a_member_removed_mid_run_leaves_no_record_once_its_run_ends(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    """The record kept for the run in flight goes with the run's end ("nothing is kept")."""
    inside.clear()
    release.clear()
    entered.clear()
    keys = Keys(key_prefix)
    app = make_app(key_prefix, declare, beat_max_loop_interval_s=0.2, beat_lock_ttl_s=5.0,
                   start_deadline_s=30.0)
    store = FamilyStore(redis_client, keys, [FAMILY])
    store.add(FAMILY, ["acme", "other"])
    sched = FairScheduler(app=app)
    sched.tick()
    message = next(m for m in map(json.loads, broker.lrange("light", 0, -1))
                   if "acme" in m["headers"]["argsrepr"])
    worker = threading.Thread(target=run_message, args=(app, message), daemon=True)
    worker.start()
    try:
        assert entered.wait(10)
        assert store.remove(FAMILY, ["acme", "other"]) == 2
        assert redis_client.hexists(keys.lanes, f"{FAMILY}[acme]|run"), "kept while it runs"
        assert not redis_client.hexists(keys.lanes, f"{FAMILY}[other]|run")
    finally:
        release.set()
        worker.join(10)
        sched.close()
    assert not redis_client.hexists(keys.lanes, f"{FAMILY}[acme]|run")
    assert store.members(FAMILY) == []
