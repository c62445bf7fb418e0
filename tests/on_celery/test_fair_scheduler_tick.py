"""FairScheduler in-process against real Redis: what one tick reads, writes and sends.

Beat's sends go to a real Redis broker (database 13); the tests read the queued messages back
from the ``heavy`` and ``light`` lists instead of running workers.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable

import pytest
import redis
from celery import Celery

from schedproj import Lane, LaneKind, LaneTask
from schedproj.on_celery.beat import FairScheduler
from schedproj.store.protocol import Keys
from tests.conftest import make_app, sent


def build(key_prefix: str, declare: Callable[[Celery], None], **overrides: object) -> Celery:
    return make_app(key_prefix, declare, **{"beat_max_loop_interval_s": 0.2,
                                            "beat_lock_ttl_s": 1.0, "start_deadline_s": 5.0,
                                            **overrides})


def three_lanes(app: Celery) -> None:
    @app.task(shared=False, base=LaneTask, name="t.heavy-a", lane=Lane(cadence_s=60, order=1))
    def heavy_a() -> None: ...

    @app.task(shared=False, base=LaneTask, name="t.heavy-b", lane=Lane(cadence_s=60, order=2))
    def heavy_b() -> None: ...

    @app.task(shared=False, base=LaneTask, name="t.light",
              lane=Lane(cadence_s=60, kind=LaneKind.LIGHT))
    def light() -> None: ...


def test_one_tick_sends_heavy_winner_and_light_lanes(key_prefix: str, broker: redis.Redis,
                                                    redis_client: redis.Redis) -> None:
    sched = FairScheduler(app=build(key_prefix, three_lanes))
    sched.tick()
    assert [m["task"] for m in sent(broker, "heavy")] == ["t.heavy-a"]
    assert [m["task"] for m in sent(broker, "light")] == ["t.light"]
    keys = Keys(key_prefix)
    lease = json.loads(redis_client.get(keys.lease))
    assert lease["lane"] == "t.heavy-a" and lease["task_id"] == sent(broker, "heavy")[0]["id"]
    # The loser's deferral is recorded durably with reason and blocker.
    b = json.loads(redis_client.hget(keys.lanes, "t.heavy-b|sched"))
    assert b["deferral"]["reason"] == "heavy-maintenance-backpressure"
    assert b["deferral"]["blocker"] == "t.heavy-a"
    since = b["deferral"]["since"]

    sched.tick()  # lease held, light in flight: nothing more is sent
    assert len(sent(broker, "heavy")) == 1 and len(sent(broker, "light")) == 1
    b = json.loads(redis_client.hget(keys.lanes, "t.heavy-b|sched"))
    # Lost the pick to heavy-a, now waiting for heavy-a's lease: one wait, not rewritten.
    assert b["deferral"]["reason"] == "heavy-maintenance-backpressure"
    assert b["deferral"]["blocker"] == "t.heavy-a"
    assert b["deferral"]["since"] == since, "the deferral streak start slid"
    sched.close()


def test_standby_beat_sends_nothing(key_prefix: str, broker: redis.Redis) -> None:
    active = FairScheduler(app=build(key_prefix, three_lanes))
    standby = FairScheduler(app=build(key_prefix, three_lanes))
    active.tick()
    before = len(sent(broker, "heavy")) + len(sent(broker, "light"))
    for _ in range(3):
        standby.tick()
    assert not standby.active
    assert len(sent(broker, "heavy")) + len(sent(broker, "light")) == before
    active.close()


def test_beat_that_loses_its_lock_stops_at_once(key_prefix: str, broker: redis.Redis,
                                                redis_client: redis.Redis,
                                                caplog: pytest.LogCaptureFixture) -> None:
    sched = FairScheduler(app=build(key_prefix, three_lanes))
    sched.tick()
    assert sched.active
    redis_client.delete("heavy")
    broker.delete("heavy", "light")
    keys = Keys(key_prefix)
    # Another beat took over (e.g. this one was paused past its lock TTL); state moved on.
    redis_client.set(keys.beat_lock, "someone-else", px=60_000)
    redis_client.delete(keys.lease)
    redis_client.hdel(keys.lanes, "t.light|sched")
    with caplog.at_level("CRITICAL", logger="schedproj.beat"):
        sched.tick()
    assert not sched.active
    assert "STOPPED DISPATCHING" in caplog.text
    assert sent(broker, "heavy") == [] and sent(broker, "light") == []
    assert not redis_client.exists(keys.lease)


def test_lock_lost_between_read_and_grant_grants_nothing(key_prefix: str, broker: redis.Redis,
                                                         redis_client: redis.Redis) -> None:
    """The lease grant itself checks the beat lock, so a beat that lost it cannot dispatch
    even if it read the state a moment earlier."""
    sched = FairScheduler(app=build(key_prefix, three_lanes))
    keys = Keys(key_prefix)
    original = sched.rt.store.tick_snapshot
    reads = []

    def snapshot_then_lose_lock(token: str, ttl: float, *rest, **kw):  # type: ignore[no-untyped-def]
        snap = original(token, ttl, *rest, **kw)
        reads.append(kw)
        if kw["cursor"] is None:  # the read a beat new to the lock plans from
            redis_client.set(keys.beat_lock, "thief", px=60_000)
        return snap

    sched.rt.store.tick_snapshot = snapshot_then_lose_lock  # type: ignore[method-assign]
    sched.tick()
    assert sent(broker, "heavy") == [] and sent(broker, "light") == []
    assert not redis_client.exists(keys.lease)
    assert redis_client.hget(keys.lanes, "t.light|sched") is None


def test_due_check_that_raises_is_recorded_and_tick_goes_on(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    def broken() -> int:
        raise RuntimeError("backlog store down")

    def declare(app: Celery) -> None:
        @app.task(shared=False, base=LaneTask, name="t.probed",
                  lane=Lane(cadence_s=60, backlog_driven=True, due_check=broken))
        def probed() -> None: ...

        @app.task(shared=False, base=LaneTask, name="t.other", lane=Lane(cadence_s=60))
        def other() -> None: ...

    sched = FairScheduler(app=build(key_prefix, declare))
    sched.tick()
    assert [m["task"] for m in sent(broker, "heavy")] == ["t.other"]
    error = redis_client.hget(Keys(key_prefix).errors, "t.probed")
    assert error and "RuntimeError" in error and "backlog store down" in error
    sched.close()


@pytest.mark.parametrize("garbage", ["not json", '{"v": 99}', '{"v": 1, "runs": "many"}'])
def test_garbage_state_is_reported_not_overwritten(key_prefix: str, broker: redis.Redis,
                                                   redis_client: redis.Redis,
                                                   garbage: str) -> None:
    keys = Keys(key_prefix)
    redis_client.hset(keys.lanes, "t.heavy-a|run", garbage)
    sched = FairScheduler(app=build(key_prefix, three_lanes))
    for _ in range(3):
        sched.tick()  # no crash loop
    assert redis_client.hget(keys.lanes, "t.heavy-a|run") == garbage
    error = redis_client.hget(keys.errors, "t.heavy-a")
    assert error is not None and "t.heavy-a|run" in error and "left untouched" in error
    assert "t.heavy-a" not in [m["task"] for m in sent(broker, "heavy")]
    assert [m["task"] for m in sent(broker, "heavy")] == ["t.heavy-b"]
    # The operator deletes the bad value by hand (nothing marks the lane changed): beat
    # re-reads an unreadable lane every tick, so it is scheduled again.
    redis_client.hdel(keys.lanes, "t.heavy-a|run")
    redis_client.delete(keys.lease)
    sched.tick()
    assert "t.heavy-a" in [m["task"] for m in sent(broker, "heavy")]
    sched.close()


def test_finishing_run_wakes_beat_before_its_interval(key_prefix: str, broker: redis.Redis,
                                                      redis_client: redis.Redis) -> None:
    sched = FairScheduler(app=build(key_prefix, three_lanes, beat_max_loop_interval_s=5.0,
                                    beat_lock_ttl_s=15.0))
    sched.tick()  # dispatches; the next tick would sleep up to 5 s
    threading.Timer(0.3, lambda: sched.rt.store.wake("t.heavy-a:completed")).start()
    started = time.monotonic()
    sched.tick()
    assert time.monotonic() - started < 2.0
    sched.close()


def test_send_failure_releases_the_lease(key_prefix: str, broker: redis.Redis,
                                         redis_client: redis.Redis) -> None:
    sched = FairScheduler(app=build(key_prefix, three_lanes))

    def failing_apply_async(*args: object, **kwargs: object) -> None:
        raise ConnectionError("broker down")

    sched.app.tasks["t.heavy-a"].apply_async = failing_apply_async
    sched.tick()
    keys = Keys(key_prefix)
    assert not redis_client.exists(keys.lease), "a lease was left for a message never sent"
    record = json.loads(redis_client.hget(keys.lanes, "t.heavy-a|sched"))
    # (A field at its default is left out of the stored record: absent reads as None.)
    assert record.get("inflight_task_id") is None
    sched.close()


def test_killed_run_is_recorded_lost_by_the_next_tick(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    """A heavy run whose worker was killed leaves a record saying "running" and no lease: the
    next tick records it lost (journal, record) while it goes on dispatching."""
    keys = Keys(key_prefix)
    now = time.time()
    redis_client.hset(keys.lanes, "t.heavy-a|run", json.dumps({
        "v": 1, "last_run_at": now - 3600, "last_task_id": "done-0",
        "running_task_id": "killed-1", "running_since": now - 5, "fence": 1}))
    sched = FairScheduler(app=build(key_prefix, three_lanes))
    sched.tick()
    journal = [json.loads(e) for e in redis_client.lrange(keys.journal, 0, -1)]
    assert any(e.get("ev") == "lost" and e.get("task") == "killed-1" for e in journal), journal
    run = json.loads(redis_client.hget(keys.lanes, "t.heavy-a|run") or "{}")
    assert run.get("running_task_id") != "killed-1" or run.get("last_task_id") == "killed-1"
    # The lost run counts as a (failed) run now, so the lane that never ran goes first.
    assert [m["task"] for m in sent(broker, "heavy")] == ["t.heavy-b"]


def two_light_lanes(app: Celery) -> None:
    @app.task(shared=False, base=LaneTask, name="t.light-a",
              lane=Lane(cadence_s=60, kind=LaneKind.LIGHT))
    def light_a() -> None: ...

    @app.task(shared=False, base=LaneTask, name="t.light-b",
              lane=Lane(cadence_s=60, kind=LaneKind.LIGHT))
    def light_b() -> None: ...


def test_an_idle_tick_plans_nothing_and_the_next_change_is_planned(
        key_prefix: str, broker: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tick that reads nothing due or changed skips the planner (an empty plan would decide,
    write and send nothing) yet moves on as one: the lane resumed next is read and sent at the
    next tick."""
    import schedproj.on_celery.beat as beat_module

    planned: list[list[str]] = []
    real_plan_tick = beat_module.plan_tick

    def counted(lanes, *args, **kwargs):  # type: ignore[no-untyped-def]
        planned.append(sorted(spec.name for spec in lanes))
        return real_plan_tick(lanes, *args, **kwargs)

    monkeypatch.setattr(beat_module, "plan_tick", counted)
    sched = FairScheduler(app=build(key_prefix, two_light_lanes))
    sched.rt.store.pause("t.light-b")
    sched.tick()
    assert [m["task"] for m in sent(broker, "light")] == ["t.light-a"]
    before = len(planned)
    for _ in range(3):
        began = time.time()
        sched.tick()
        assert sched.memory.cursor is not None and sched.memory.cursor >= began
    assert len(planned) == before, f"idle ticks planned {planned[before:]}"
    sched.rt.store.resume("t.light-b")
    sched.tick()
    assert planned[-1] == ["t.light-b"]
    assert sorted(m["task"] for m in sent(broker, "light")) == ["t.light-a", "t.light-b"]
    sched.close()


def test_the_lanes_deferred_by_a_grant_press_on_that_hold_at_once(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    """The tick that grants the lease publishes the pressure of the heavy lanes it deferred,
    on the new hold: the ticks after it skip those lanes while the same lease is held, so a
    pressure measured on the lease as read (free: nobody pressed) stood for the whole hold and
    the holder never yielded to them (found by a review: pressure appeared only once another
    beat took over)."""
    sched = FairScheduler(app=build(key_prefix, three_lanes))
    keys = Keys(key_prefix)
    for _ in range(3):
        sched.tick()
        lease = json.loads(redis_client.get(keys.lease))
        pressure = json.loads(redis_client.hget(keys.pressure, "current"))
        assert lease["lane"] == "t.heavy-a"
        assert pressure["lane"] == "t.heavy-b", pressure
        assert pressure["fence"] == lease["fence"], "published for another hold"
    sched.close()


def test_a_beat_new_to_the_lock_leaves_no_garbage_in_redis_lua_heap(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    """Its full read's garbage would slow every later script call until Lua collected it a
    step at a time (docs/performance.md, calendar lanes at scale): beat collects it at once."""
    redis_client.eval("local t = {} for i = 1, 200000 do t[i] = {i, tostring(i)} end "
                      "return #t", 0)  # the garbage of a full read of many lanes
    assert redis_client.info("memory")["used_memory_lua"] > 10 * 2**20
    sched = FairScheduler(app=build(key_prefix, three_lanes))
    sched.tick()
    assert sched.active
    assert redis_client.info("memory")["used_memory_lua"] < 5 * 2**20
    sched.close()


def test_a_tick_runs_without_the_cyclic_collector_and_gives_it_back(
        key_prefix: str, broker: redis.Redis) -> None:
    """Inside a tick the cyclic collector is off (a ranking tick's short-lived objects set off
    collections that walked the due lanes' kept states for nothing: core.collector); after it
    — a tick that fails included — it is on again, and a cycle made in the tick is collected."""
    import gc
    import weakref

    seen: list[bool] = []
    made: list[weakref.ref[object]] = []

    class Node:
        other: object = None

    def probe() -> int:
        seen.append(gc.isenabled())
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle only the collector frees
        made.append(weakref.ref(a))
        return 1

    def declare(app: Celery) -> None:
        @app.task(shared=False, base=LaneTask, name="t.probed",
                  lane=Lane(cadence_s=60, backlog_driven=True, due_check=probe))
        def probed() -> None: ...

    assert gc.isenabled()
    sched = FairScheduler(app=build(key_prefix, declare))
    sched.tick()
    assert seen == [False], "the due check ran with the cyclic collector on (or never ran)"
    assert gc.isenabled(), "the tick left the cyclic collector off"
    gc.collect()
    assert made[0]() is None, "the cycle made in the tick was never collected"

    def failing() -> float:
        raise RuntimeError("a tick that fails")

    sched._tick = failing  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        sched.tick()
    assert gc.isenabled(), "a failing tick left the cyclic collector off"
    sched.close()


def test_a_heavy_message_shows_its_grant_without_the_lease_token(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    """Flower, the task events and the worker's log show a message's ``kwargsrepr``: the
    grant's fences are there, its token (which acts as the run's holder) is not; the message's
    own kwargs still carry it for the worker."""
    sched = FairScheduler(app=build(key_prefix, three_lanes))
    sched.tick()
    token = json.loads(redis_client.get(Keys(key_prefix).lease))["token"]
    by_queue = {q: [json.loads(m) for m in broker.lrange(q, 0, -1)] for q in ("heavy", "light")}
    (heavy,), (light,) = by_queue["heavy"], by_queue["light"]
    _, kwargs, _ = json.loads(base64.b64decode(heavy["body"]))
    assert kwargs["schedproj_lease"]["token"] == token
    shown = heavy["headers"]["kwargsrepr"]
    assert token not in shown and "'token': '<hidden>'" in shown
    assert f"'fence': {kwargs['schedproj_lease']['fence']}" in shown
    _, light_kw, _ = json.loads(base64.b64decode(light["body"]))
    assert light["headers"]["kwargsrepr"] == repr(light_kw)
