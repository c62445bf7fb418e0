"""After Redis lost state, the active beat puts the lanes' run records back: what it remembered
as it was, the rest estimated within one cadence, so lanes go on in their order instead of all
being "never ran" at once. In-process FairScheduler against real Redis."""

from __future__ import annotations

import json
import time

import pytest
import redis
from celery import Celery

from schedproj import Lane, LaneKind, LaneTask
from schedproj.core import lifecycle
from schedproj.core.lanes import fixed_unit
from schedproj.core.records import Outcome, RunRecord, encode
from schedproj.on_celery.beat import FairScheduler
from schedproj.store.protocol import Keys, run_field
from tests.conftest import sent
from tests.on_celery.test_fair_scheduler_tick import build


def test_rebuilt_keeps_what_was_remembered_and_estimates_the_rest_within_a_cadence() -> None:
    remembered = RunRecord(last_run_at=100.0, last_outcome=Outcome.FAILED, runs=7,
                           running_task_id="t1", running_since=150.0)
    assert lifecycle.rebuilt(remembered, lane="a", cadence_s=60, lost_at=200) == remembered
    estimates = {lane: lifecycle.rebuilt(None, lane=lane, cadence_s=60, lost_at=200)
                 for lane in ("a", "b", "c", "d")}
    for lane, rec in estimates.items():
        assert rec.last_run_at is not None and 140 < rec.last_run_at <= 200
        assert rec.last_run_at == pytest.approx(200 - 60 * fixed_unit(lane))
        assert rec.last_reason == lifecycle.ESTIMATED_AFTER_LOSS
        assert rec.last_outcome is None and not lifecycle.is_running(rec)
    # Spread over the cadence, not all due at the same moment.
    assert len({r.last_run_at for r in estimates.values()}) == 4


def lanes(app: Celery) -> None:
    @app.task(shared=False, base=LaneTask, name="r.overdue", lane=Lane(cadence_s=60, order=2))
    def overdue() -> None: ...

    @app.task(shared=False, base=LaneTask, name="r.fresh", lane=Lane(cadence_s=60, order=1))
    def fresh() -> None: ...

    @app.task(shared=False, base=LaneTask, name="r.light",
              lane=Lane(cadence_s=600, kind=LaneKind.LIGHT))
    def light() -> None: ...


def test_active_beat_puts_back_the_run_records_redis_lost(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    keys = Keys(key_prefix)
    now = time.time()
    overdue = RunRecord(last_run_at=now - 600, last_outcome=Outcome.COMPLETED, runs=3)
    redis_client.hset(keys.lanes, run_field("r.overdue"), encode(overdue))
    redis_client.hset(keys.lanes, run_field("r.fresh"),
                      encode(RunRecord(last_run_at=now - 5, runs=9)))
    redis_client.hset(keys.lanes, run_field("r.light"),
                      encode(RunRecord(last_run_at=now - 5, runs=2)))
    sched = FairScheduler(app=build(key_prefix, lanes))
    sched.tick()
    assert [m["task"] for m in sent(broker, "heavy")] == ["r.overdue"]
    broker.delete("heavy", "light")

    # Redis restarts empty: every key of the deployment is gone, the epoch included.
    redis_client.delete(*redis_client.scan_iter(f"{key_prefix}:*"))
    with caplog.at_level("WARNING", logger="schedproj.beat"):
        sched.tick()
    assert "put back 3 lanes' run records" in caplog.text
    lost_at = time.time()

    def run(lane: str) -> dict:
        return json.loads(redis_client.hget(keys.lanes, run_field(lane)))

    # Remembered (it was due): as it was. The heavy run dispatched before the loss never
    # started, so nothing names it running.
    assert run("r.overdue")["last_run_at"] == pytest.approx(now - 600)
    assert run("r.overdue")["runs"] == 3
    # Not due when beat last looked: estimated within one cadence before the loss.
    for lane, cadence in (("r.fresh", 60), ("r.light", 600)):
        rec = run(lane)
        assert lost_at - cadence < rec["last_run_at"] <= lost_at
        assert rec["last_reason"] == lifecycle.ESTIMATED_AFTER_LOSS
    # Quarantine: nothing is dispatched while earlier runs may re-assert themselves.
    assert sent(broker, "heavy") == [] and sent(broker, "light") == []
    sched.close()


def test_a_record_rewritten_before_the_put_back_is_kept(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    """A run that re-asserted its record after the loss wins over what beat remembered."""
    keys = Keys(key_prefix)
    sched = FairScheduler(app=build(key_prefix, lanes))
    sched.tick()
    redis_client.delete(*redis_client.scan_iter(f"{key_prefix}:*"))
    mine = RunRecord(running_task_id="alive", running_since=time.time(), runs=1)
    redis_client.hset(keys.lanes, run_field("r.light"), encode(mine))
    sched.tick()
    assert json.loads(redis_client.hget(keys.lanes, run_field("r.light")))[
        "running_task_id"] == "alive"
    sched.close()


def heavy_only(app: Celery) -> None:
    @app.task(shared=False, base=LaneTask, name="v.heavy", lane=Lane(cadence_s=600))
    def heavy() -> None: ...


def start_granted_run(redis_client: redis.Redis, keys: Keys) -> dict:
    """What a worker's lease start leaves (lease_start.lua): the lease says started; the run's
    own start mark (a second write) never landed."""
    lease = json.loads(redis_client.get(keys.lease))
    lease.update(started_at=time.time(), host="h", pid=1, node="n")
    redis_client.set(keys.lease, json.dumps(lease), px=60_000)
    return lease


def test_a_started_run_whose_lease_vanished_unmarked_is_recorded_lost(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    """Killed after the lease said started and before its start mark landed (a failover held
    that write back): the record never said running, yet the run is recorded lost."""
    keys = Keys(key_prefix)
    sched = FairScheduler(app=build(key_prefix, heavy_only))
    sched.tick()
    lease = start_granted_run(redis_client, keys)
    sched.tick()  # beat sees the started lease
    redis_client.delete(keys.lease)  # the worker died; its lease lapsed
    broker.delete("heavy")
    with caplog.at_level("ERROR", logger="schedproj.beat"):
        sched.tick()
    run = json.loads(redis_client.hget(keys.lanes, run_field("v.heavy")))
    assert run["last_outcome"] == "lost" and run["last_task_id"] == lease["task_id"]
    assert "before its start was recorded" in run["last_reason"]
    assert redis_client.hget(keys.counters, "lost|v.heavy") == "1"
    assert f"run {lease['task_id']} lost" in caplog.text
    assert any(json.loads(e)["task"] == lease["task_id"] and json.loads(e)["ev"] == "lost"
               for e in redis_client.lrange(keys.journal, 0, -1))
    sched.close()


def test_a_run_that_ended_or_was_followed_is_never_recorded_lost(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    keys = Keys(key_prefix)
    sched = FairScheduler(app=build(key_prefix, heavy_only))
    sched.tick()
    lease = start_granted_run(redis_client, keys)
    sched.tick()
    # It ended: its end is recorded (as run_finish.lua does, with the lease released).
    ended = RunRecord(last_run_at=time.time(), last_outcome=Outcome.COMPLETED,
                      last_task_id=lease["task_id"], runs=1)
    redis_client.hset(keys.lanes, run_field("v.heavy"), encode(ended))
    redis_client.delete(keys.lease)
    sched.tick()
    run = json.loads(redis_client.hget(keys.lanes, run_field("v.heavy")))
    assert run["last_outcome"] == "completed"
    assert redis_client.hget(keys.counters, "lost|v.heavy") is None
    sched.close()


def test_a_normal_hand_off_is_judged_on_the_record_the_tick_read(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that ended marked its lane changed (as run_finish.lua does), so the tick that
    finds its lease gone already read its record: no second read, and nothing lost."""
    keys = Keys(key_prefix)
    sched = FairScheduler(app=build(key_prefix, heavy_only))
    sched.tick()
    lease = start_granted_run(redis_client, keys)
    sched.tick()
    ended = RunRecord(last_run_at=time.time(), last_outcome=Outcome.COMPLETED,
                      last_task_id=lease["task_id"], runs=1)
    redis_client.hset(keys.lanes, run_field("v.heavy"), encode(ended))
    redis_client.sadd(keys.changed, "v.heavy")
    redis_client.delete(keys.lease)
    assert sched.rt is not None
    reads: list[str] = []
    read_run_raw = sched.rt.store.read_run_raw
    monkeypatch.setattr(sched.rt.store, "read_run_raw",
                        lambda lane: (reads.append(lane), read_run_raw(lane))[1])
    sched.tick()
    assert reads == []
    run = json.loads(redis_client.hget(keys.lanes, run_field("v.heavy")))
    assert run["last_outcome"] == "completed"
    assert redis_client.hget(keys.counters, "lost|v.heavy") is None
    sched.close()


def lose_state(redis_client: redis.Redis, prefix: str) -> None:
    redis_client.delete(*redis_client.scan_iter(f"{prefix}:*"))


def test_losses_faster_than_a_cadence_never_push_a_lane_back(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    """A crash-looping Redis: each loss would estimate the lane's last run anew, later each
    time; the beat keeps its first estimate until the lane's record says it ran."""
    keys = Keys(key_prefix)
    redis_client.hset(keys.lanes, run_field("r.fresh"),
                      encode(RunRecord(last_run_at=time.time() - 5, runs=9)))
    sched = FairScheduler(app=build(key_prefix, lanes))
    sched.tick()
    lose_state(redis_client, key_prefix)
    sched.tick()
    first = json.loads(redis_client.hget(keys.lanes, run_field("r.fresh")))["last_run_at"]
    time.sleep(0.3)
    lose_state(redis_client, key_prefix)
    sched.tick()
    again = json.loads(redis_client.hget(keys.lanes, run_field("r.fresh")))["last_run_at"]
    assert again == pytest.approx(first)
    sched.close()


def test_a_beat_whose_memory_is_older_than_its_lock_puts_nothing_back(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    """Frozen past its lock (another beat may have run lanes meanwhile), a beat's memory is
    no longer true: it puts nothing back, as a beat that starts into a loss."""
    sched = FairScheduler(app=build(key_prefix, lanes))
    sched.tick()
    sched._last_read_at -= 10  # the beat lock TTL is 1 s here
    lose_state(redis_client, key_prefix)
    with caplog.at_level("WARNING", logger="schedproj.beat"):
        sched.tick()
    assert "put back" not in caplog.text
    assert redis_client.hget(Keys(key_prefix).lanes, run_field("r.fresh")) is None
    sched.close()


def test_a_run_recorded_lost_after_a_loss_says_its_end_may_have_been_lost(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    keys = Keys(key_prefix)
    sched = FairScheduler(app=build(key_prefix, heavy_only, state_loss_quarantine_s=0.3))
    sched.tick()
    lease = start_granted_run(redis_client, keys)
    sched.tick()
    lose_state(redis_client, key_prefix)  # the run's lease goes with it; it never re-asserts
    broker.delete("heavy")
    sched.tick()  # the loss: put back, quarantine
    time.sleep(0.5)
    sched.tick()
    run = json.loads(redis_client.hget(keys.lanes, run_field("v.heavy")))
    assert run["last_outcome"] == "lost" and run["last_task_id"] == lease["task_id"]
    assert "its end may have been lost too" in run["last_reason"]
    sched.close()


def test_a_lost_run_is_written_over_an_absent_record_only_for_a_lane_still_indexed(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    """A family member removed while it ran has no record and no index entry: it stays gone.
    While Redis may have lost state, nothing is recorded at all."""
    keys = Keys(key_prefix)
    sched = FairScheduler(app=build(key_prefix, heavy_only))
    sched.tick()  # the epoch is known
    store = sched.rt.store
    lost = lifecycle.lost(RunRecord(running_task_id="x"), now=time.time(), why="test")
    assert not store.mark_lost("gone[k]", "", lost, task_id="x", heavy=False)
    assert redis_client.hget(keys.lanes, run_field("gone[k]")) is None
    redis_client.zadd(keys.due, {"gone[k]": 0})
    assert store.mark_lost("gone[k]", "", lost, task_id="x", heavy=False)
    redis_client.delete(keys.epoch)  # Redis may have lost state since the caller read
    redis_client.hdel(keys.lanes, run_field("gone[k]"))
    assert not store.mark_lost("gone[k]", "", lost, task_id="x", heavy=False)
    sched.close()


def test_a_killed_run_is_recorded_lost_even_when_its_lane_starts_again_at_once(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The tick that finds the dead run's lease gone dispatches its lane again, and a worker
    starts the new run within milliseconds (its start mark replaces the dead run's): beat
    records the loss before it dispatches. (CI's chaos run lost this race: the record was
    made after the send, by compare-and-set on a record the new run had already changed.)"""
    keys = Keys(key_prefix)
    sched = FairScheduler(app=build(key_prefix, heavy_only))
    store = sched.rt.store
    sched.tick()
    lease = start_granted_run(redis_client, keys)
    raw, before = store.read_run_raw("v.heavy")
    assert store.cas_run("v.heavy", raw, lifecycle.started(
        before, task_id=lease["task_id"], now=time.time(), running_until=time.time() + 600,
        fence=lease["fence"]))[0]
    sched.tick()
    redis_client.delete(keys.lease)  # its worker was SIGKILLed; the lease lapsed
    broker.delete("heavy")
    send = sched.engine.dispatcher.send

    def send_and_start_at_once(lane: str, message: object, kwargs: dict) -> bool:
        sent_ok = send(lane, message, kwargs)  # type: ignore[arg-type]
        new = json.loads(redis_client.get(keys.lease))
        raw, rec = store.read_run_raw(lane)
        store.cas_run(lane, raw, lifecycle.started(rec, task_id=new["task_id"],
                                                   now=time.time(),
                                                   running_until=time.time() + 600,
                                                   fence=new["fence"]))
        return sent_ok

    monkeypatch.setattr(sched.engine.dispatcher, "send", send_and_start_at_once)
    store.touch(["v.heavy"])  # read this tick (as when anything else wrote the lane)
    sched.tick()
    assert [m["task"] for m in sent(broker, "heavy")] == ["v.heavy"]  # dispatched again
    new_task = sent(broker, "heavy")[0]["id"]
    record = store.read_run("v.heavy")
    # The dead run is recorded lost and the new run's start mark stands.
    assert record.last_task_id == lease["task_id"] and record.last_outcome == Outcome.LOST
    assert record.running_task_id == new_task
    lost = [json.loads(e) for e in redis_client.lrange(keys.journal, 0, -1)]
    assert [e["task"] for e in lost if e["ev"] == "lost"] == [lease["task_id"]]
    assert redis_client.hget(keys.counters, "lost|v.heavy") == "1"
    sched.close()
