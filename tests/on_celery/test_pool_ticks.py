"""Pools on beat's side, in-process against real Redis: how pools are declared (code, the
environment, the errors), and what a tick grants and sends for a pool of two slots beside the
default pool. Beat's sends go to a real Redis broker; the tests read the queued messages back
from the queue lists instead of running workers (tests/e2e/test_pools_live.py runs them)."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import redis
from celery import Celery

from schedproj import Lane, LaneKind, LaneTask, Pool, PoolError, configure_app
from schedproj.core.errors import ConfigurationError, LaneDeclarationError
from schedproj.core.pools import DEFAULT_POOL
from schedproj.core.pressure import PressureRule, yield_reason
from schedproj.core.pressure import decode as decode_pressure
from schedproj.core.records import RunRecord
from schedproj.on_celery import recovery
from schedproj.on_celery.beat import FairScheduler
from schedproj.on_celery.config import app_pools, lane_set_for
from schedproj.settings import Settings
from schedproj.store.lane_store import LaneStore
from schedproj.store.lease import HeavyLease, Holder, SlotGroup
from schedproj.store.protocol import Keys
from tests.conftest import BROKER_URL, REDIS_URL, make_app, sent


@pytest.fixture
def gpu_queue(broker: redis.Redis) -> Iterator[redis.Redis]:
    broker.delete("gpu")
    yield broker
    broker.delete("gpu")


def nothing() -> None:
    """A lane body: these tests only look at what beat sends."""


def pool_lanes(app: Celery) -> None:
    for n in range(3):
        app.task(shared=False, base=LaneTask, name=f"t.gpu-{n}",
                 lane=Lane(cadence_s=60, pool="gpu", order=n))(nothing)
    app.task(shared=False, base=LaneTask, name="t.heavy",
             lane=Lane(cadence_s=60))(nothing)
    app.task(shared=False, base=LaneTask, name="t.light",
             lane=Lane(cadence_s=60, kind=LaneKind.LIGHT))(nothing)


def build(key_prefix: str, **overrides: object) -> Celery:
    return make_app(key_prefix, pool_lanes, **{
        "beat_max_loop_interval_s": 0.2, "beat_lock_ttl_s": 1.0, "start_deadline_s": 5.0,
        "pools": "gpu=2", **overrides})


def grant(message: dict) -> dict:
    return dict(message["kwargs"]["schedproj_lease"])


def queued(broker: redis.Redis, queue: str) -> list[dict]:
    """The messages waiting in ``queue``, in the order they were sent (kombu pushes each to
    the head of the list, and workers take from its tail)."""
    out = []
    for raw in reversed(broker.lrange(queue, 0, -1)):
        message = json.loads(raw)
        _, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        out.append({"task": message["headers"]["task"], "id": message["headers"]["id"],
                    "kwargs": kwargs})
    return out


def test_a_tick_fills_the_free_slots_of_a_pool_beside_the_lease(
        key_prefix: str, gpu_queue: redis.Redis, redis_client: redis.Redis) -> None:
    keys = Keys(key_prefix)
    sched = FairScheduler(app=build(key_prefix))
    sched.tick()
    gpu = queued(gpu_queue, "gpu")
    assert [m["task"] for m in gpu] == ["t.gpu-0", "t.gpu-1"]
    assert [m["task"] for m in sent(gpu_queue, "heavy")] == ["t.heavy"]
    assert [m["task"] for m in sent(gpu_queue, "light")] == ["t.light"]
    # Each gpu message carries its own slot of the pool; the heavy one is the lease's, as
    # before pools (no pool, no slots in it).
    assert [(grant(m)["pool"], grant(m)["slots"]) for m in gpu] == [("gpu", [0]), ("gpu", [1])]
    assert set(grant(queued(gpu_queue, "heavy")[0])) == {"token", "fence", "beat_fence"}
    for index, message in enumerate(gpu):
        lease = HeavyLease(redis_client, keys.slot("gpu", index)).read()
        assert lease is not None and lease.task_id == message["id"]
        assert lease.lane == message["task"] and lease.token == grant(message)["token"]
    third = json.loads(redis_client.hget(keys.lanes, "t.gpu-2|sched"))["deferral"]
    assert (third["reason"], third["blocker"]) == ("heavy-maintenance-backpressure", "t.gpu-0")

    sched.tick()  # both slots held: nothing more for the pool
    assert len(queued(gpu_queue, "gpu")) == 2
    # Lost the pick, now waiting for the pool's holders: one wait, not rewritten (as a lane
    # waiting for the heavy lease).
    again = json.loads(redis_client.hget(keys.lanes, "t.gpu-2|sched"))["deferral"]
    assert again == third

    # Slot 1's run ends (recorded under its slot, as a worker does): the slot frees and
    # beat is woken; the next tick hands the slot to the waiting lane, and slot 0 stays
    # with its holder.
    done = RunRecord(runs=1, last_run_at=time.time(), last_task_id=gpu[1]["id"],
                     fence=grant(gpu[1])["fence"])
    assert LaneStore(redis_client, keys.slot("gpu", 1)).finish(
        "t.gpu-1", done, token=grant(gpu[1])["token"], fence=done.fence,
        wake_message="t.gpu-1:completed") == (True, 1)
    assert redis_client.lrange(keys.wake, 0, -1) == ["t.gpu-1:completed"]
    sched.tick()
    after = queued(gpu_queue, "gpu")
    assert [m["task"] for m in after] == ["t.gpu-0", "t.gpu-1", "t.gpu-2"]
    assert grant(after[2])["slots"] == [1]
    assert grant(after[2])["fence"] > grant(gpu[1])["fence"]
    sched.close()


def test_a_running_pool_run_is_not_lost_until_its_slot_lease_is_gone(
        key_prefix: str, gpu_queue: redis.Redis, redis_client: redis.Redis) -> None:
    """Beat judges a pool lane's run by the slot lease naming it, not by the heavy lease."""
    keys = Keys(key_prefix)
    now = time.time()
    for lane, task in (("t.gpu-0", "running-1"), ("t.gpu-1", "killed-2")):
        redis_client.hset(keys.lanes, f"{lane}|run", json.dumps({
            "v": 1, "last_run_at": now - 30, "last_task_id": "done-0",
            "running_task_id": task, "running_since": now - 5, "fence": 1}))
    slot0 = HeavyLease(redis_client, keys.slot("gpu", 0))
    assert slot0.acquire("t.gpu-0", "tok", 30.0, now, task_id="running-1").granted
    assert slot0.start("tok", 30.0, now)[0]
    sched = FairScheduler(app=build(key_prefix))
    sched.tick()
    journal = [json.loads(e) for e in redis_client.lrange(keys.journal, 0, -1)]
    lost = {e["task"] for e in journal if e.get("ev") == "lost"}
    assert lost == {"killed-2"}, journal
    # The running lane keeps slot 0 (and is not sent again); the free slot goes to the lane
    # that never ran.
    assert [(m["task"], grant(m)["slots"]) for m in queued(gpu_queue, "gpu")] == [
        ("t.gpu-2", [1])]
    run = json.loads(redis_client.hget(keys.lanes, "t.gpu-0|run"))
    assert run["running_task_id"] == "running-1" and run["last_task_id"] == "done-0"
    sched.close()


def test_a_pool_run_whose_slot_went_before_its_start_was_recorded_is_lost(
        key_prefix: str, gpu_queue: redis.Redis, redis_client: redis.Redis) -> None:
    """A worker that started its run's slot lease and died before the run's record said so:
    beat saw the slot started, then gone, and records the run lost (as for the heavy lease);
    a run still holding its slot is left alone."""
    keys = Keys(key_prefix)
    now = time.time()
    for lane in ("t.gpu-0", "t.gpu-1"):
        redis_client.hset(keys.lanes, f"{lane}|run", json.dumps({
            "v": 1, "last_run_at": now - 30, "last_task_id": "done-0", "fence": 1}))
    for index, (lane, task) in enumerate((("t.gpu-0", "died-1"), ("t.gpu-1", "alive-2"))):
        lease = HeavyLease(redis_client, keys.slot("gpu", index))
        assert lease.acquire(lane, f"tok{index}", 30.0, now, task_id=task).granted
        assert lease.start(f"tok{index}", 30.0, now, lane=lane, task_id=task)[0]
    sched = FairScheduler(app=build(key_prefix))
    sched.tick()  # both slots seen started
    redis_client.delete(keys.slot("gpu", 0).lease)  # its lease lapsed: the worker is gone
    redis_client.sadd(keys.changed, "t.gpu-2")  # a lane to look at: the tick reads the slots
    sched.tick()
    journal = [json.loads(e) for e in redis_client.lrange(keys.journal, 0, -1)]
    assert [e["task"] for e in journal if e.get("ev") == "lost"] == ["died-1"], journal
    run = json.loads(redis_client.hget(keys.lanes, "t.gpu-0|run"))
    assert (run["last_task_id"], run["last_outcome"]) == ("died-1", "lost")
    alive = json.loads(redis_client.hget(keys.lanes, "t.gpu-1|run"))
    assert alive["last_task_id"] == "done-0"
    sched.close()


def test_a_run_of_two_slots_is_judged_on_both(key_prefix: str, gpu_queue: redis.Redis,
                                              redis_client: redis.Redis) -> None:
    """A run holding two slots is alive while either names it (its end releases them one by
    one); with neither, it is lost, once, and both slots are free for the next grant."""
    keys = Keys(key_prefix)

    def lanes(app: Celery) -> None:
        app.task(shared=False, base=LaneTask, name="t.train",
                 lane=Lane(cadence_s=60, pool="gpu", slots=2))(nothing)

    app = make_app(key_prefix, lanes, beat_max_loop_interval_s=0.2, beat_lock_ttl_s=1.0,
                   start_deadline_s=5.0, pools="gpu=2")
    now = time.time()
    redis_client.hset(keys.lanes, "t.train|run", json.dumps({
        "v": 1, "last_run_at": now - 30, "last_task_id": "done-0", "running_task_id": "big-1",
        "running_since": now - 5, "fence": 1}))
    second = HeavyLease(redis_client, keys.slot("gpu", 1))
    assert second.acquire("t.train", "tok", 30.0, now, task_id="big-1").granted
    assert second.start("tok", 30.0, now, lane="t.train", task_id="big-1")[0]
    sched = FairScheduler(app=app)
    sched.tick()  # slot 0 is free, slot 1 still names the run: alive, and not sent again
    assert json.loads(redis_client.hget(keys.lanes, "t.train|run"))["running_task_id"] == (
        "big-1")
    assert queued(gpu_queue, "gpu") == []
    assert second.release("tok")
    redis_client.sadd(keys.changed, "t.train")
    sched.tick()
    journal = [json.loads(e) for e in redis_client.lrange(keys.journal, 0, -1)]
    assert [e["task"] for e in journal if e.get("ev") == "lost"] == ["big-1"], journal
    sched.tick()  # judged once: the lost record is the lane's now
    journal = [json.loads(e) for e in redis_client.lrange(keys.journal, 0, -1)]
    assert [e["task"] for e in journal if e.get("ev") == "lost"] == ["big-1"], journal
    run = json.loads(redis_client.hget(keys.lanes, "t.train|run"))
    assert (run["last_task_id"], run["last_outcome"]) == ("big-1", "lost")
    sched.close()


def test_a_quarantine_grants_nothing_in_any_pool(key_prefix: str, gpu_queue: redis.Redis,
                                                 redis_client: redis.Redis) -> None:
    keys = Keys(key_prefix)
    redis_client.delete(keys.epoch)  # Redis lost state: every grant waits the quarantine
    sched = FairScheduler(app=build(key_prefix, state_loss_quarantine_s=30.0))
    sched.tick()
    sched.tick()
    assert queued(gpu_queue, "gpu") == [] and sent(gpu_queue, "heavy") == []
    assert [m["task"] for m in sent(gpu_queue, "light")] == []
    assert redis_client.keys(f"{key_prefix}:pool:*:slot:*") == []  # no slot granted
    deferral = json.loads(redis_client.hget(keys.lanes, "t.gpu-0|sched"))["deferral"]
    assert deferral["reason"] == "state-loss-quarantine"
    sched.close()


# -- declaring pools --------------------------------------------------------------------------


def settings(key_prefix: str = "t-pools", **values: object) -> Settings:
    return Settings.load(broker_url=BROKER_URL, redis_url=REDIS_URL, key_prefix=key_prefix,
                         **values)


def test_pools_from_code_and_the_environment_which_wins() -> None:
    app = Celery("t-pools-code", set_as_current=False)
    configure_app(app, settings(pools="db=3,gpu=4"), pools=[Pool("gpu", slots=2),
                                                           Pool("api", slots=1)])
    assert {name: p.slots for name, p in app_pools(app).items()} == {
        DEFAULT_POOL: 1, "gpu": 4, "api": 1, "db": 3}


def test_a_lane_naming_an_undeclared_pool_names_the_lane_and_the_fix() -> None:
    app = Celery("t-pools-undeclared", set_as_current=False)
    configure_app(app, settings(), pools=[Pool("gpu", slots=2)])
    app.task(shared=False, base=LaneTask, name="t.train",
             lane=Lane(cadence_s=60, pool="tpu"))(nothing)
    with pytest.raises(LaneDeclarationError) as caught:
        lane_set_for(app)
    assert caught.value.lane == "t.train"
    assert "tpu" in str(caught.value) and "SCHEDPROJ_POOLS='tpu=2'" in caught.value.fix


@pytest.mark.parametrize("value", ["gpu=0", "gpu=two", "light=2", "heavy=2", "gpu"])
def test_a_bad_pools_setting_names_the_setting(value: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        settings(pools=value)
    assert "SCHEDPROJ_POOLS" in str(caught.value) and "Fix:" in str(caught.value)


def test_a_pool_may_not_take_the_name_of_a_queue_of_the_app() -> None:
    app = Celery("t-pools-queue", set_as_current=False)
    app.conf.task_default_queue = "batch"
    with pytest.raises(PoolError) as caught:
        configure_app(app, settings(), pools=[Pool("batch", slots=2)])
    assert caught.value.pool == "batch" and "Pool('gpu', slots=2)" in caught.value.fix
    routed = Celery("t-pools-routes", set_as_current=False)
    routed.conf.task_routes = {"reports.*": {"queue": "reports"}}
    with pytest.raises(PoolError):
        configure_app(routed, settings(pools="reports=2"))
    with pytest.raises(PoolError):
        Pool("light", slots=2)


def test_a_pool_lane_is_routed_to_its_pools_queue(key_prefix: str,
                                                  gpu_queue: redis.Redis) -> None:
    app = build(key_prefix)
    app.tasks["t.gpu-0"].apply_async()
    app.tasks["t.heavy"].apply_async()
    assert [m["task"] for m in sent(gpu_queue, "gpu")] == ["t.gpu-0"]
    assert [m["task"] for m in sent(gpu_queue, "heavy")] == ["t.heavy"]


def test_a_pools_waiter_presses_on_the_pools_longest_holder_only(
        key_prefix: str, gpu_queue: redis.Redis, redis_client: redis.Redis) -> None:
    """Pressure per pool: the waiting gpu lane is published in the pool's pressure hash, on
    the hold of the pool's longest holder, whose slot renewal reads it and which yields by
    the rule; the heavy lease's holder hears of no gpu waiter."""
    keys = Keys(key_prefix)
    now = time.time()
    holds = {}
    for index, (lane, since) in enumerate((("t.gpu-1", now - 20), ("t.gpu-0", now - 5))):
        redis_client.hset(keys.lanes, f"{lane}|run", json.dumps({
            "v": 1, "last_run_at": now - 30, "last_task_id": "done-0",
            "running_task_id": f"run-{lane}", "running_since": since, "fence": 1}))
        slot = HeavyLease(redis_client, keys.slot("gpu", index))
        tok = f"tok-{index}"
        granted = slot.acquire(lane, tok, 30.0, since, task_id=f"run-{lane}")
        assert granted.granted and slot.start(tok, 30.0, since)[0]
        holds[lane] = (slot, tok, granted.fence)
    sched = FairScheduler(app=build(key_prefix, pressure_yield=True))
    sched.tick()
    assert queued(gpu_queue, "gpu") == []  # both slots held
    raw = redis_client.hget(keys.slot("gpu", 0).pressure, "current")
    published = decode_pressure(raw, "pool pressure")
    assert published is not None and published.lane == "t.gpu-2"
    assert published.fence == holds["t.gpu-1"][2]  # the hold that began first
    # The heavy lease's holder (t.heavy, granted this tick) hears of no gpu waiter.
    assert decode_pressure(redis_client.hget(keys.pressure, "current"), "lease") is None
    # The longest holder's renewal carries it, and by the rule it yields now.
    slot, tok, fence = holds["t.gpu-1"]
    renewal = SlotGroup(redis_client, keys, "gpu", (0,)).renew(tok, 30.0, time.time(), 3600.0)
    assert renewal.ok and renewal.pressure == raw
    rule = PressureRule(target_ratio=1.0, min_hold_s=0.0)
    assert yield_reason(held_s=20.0, hold_cap_s=None, pressure=published, rule=rule,
                        now=time.time(), fence=fence) == "pressure"
    assert yield_reason(held_s=5.0, hold_cap_s=None, pressure=published, rule=rule,
                        now=time.time(), fence=holds["t.gpu-0"][2]) is None
    sched.close()


def test_a_restarted_worker_frees_its_dead_predecessors_slot(
        key_prefix: str, redis_client: redis.Redis) -> None:
    """As for the heavy lease: a worker starting on the node whose previous process died
    holding a slot frees that slot at once (not one lease TTL later); other slots stay."""
    app = build(key_prefix)
    keys = Keys(key_prefix)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    node = recovery.node_identity("gpu1@host")
    for index, (pid, name) in enumerate(((gone.pid, node), (os.getpid(), node))):
        slot = HeavyLease(redis_client, keys.slot("gpu", index))
        assert slot.acquire(f"t.gpu-{index}", f"tok-{index}", 30.0, time.time()).granted
        assert slot.start(f"tok-{index}", 30.0, time.time(),
                          holder=Holder(host=socket.gethostname(), pid=pid, node=name))[0]
    recovery.free_dead_predecessors_lease(sender=SimpleNamespace(app=app,
                                                                 hostname="gpu1@host"))
    assert HeavyLease(redis_client, keys.slot("gpu", 0)).read() is None
    assert HeavyLease(redis_client, keys.slot("gpu", 1)).read() is not None
