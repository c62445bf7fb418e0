"""Beat in-process against hostile keys: derived keys heal, a broken key stops at most what
depends on it, and each is named once per onset (issue 19, items 2, 3 and 5, beat's side)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest
import redis
from celery import Celery
from prometheus_client import CollectorRegistry, generate_latest

from schedproj import Lane, LaneKind, LaneTask
from schedproj.core.families import LaneFamily
from schedproj.core.records import Outcome, RunRecord
from schedproj.on_celery.beat import FairScheduler
from schedproj.store.families import FamilyStore
from schedproj.store.protocol import STAMP_MEMBER, Keys
from schedproj.telemetry.metrics import SchedprojCollector
from tests.conftest import make_app, sent

LIGHT, HEAVY = "k.light", "k.heavy"


def two_lanes(app: Celery) -> None:
    @app.task(shared=False, base=LaneTask, name=LIGHT,
              lane=Lane(cadence_s=3600, kind=LaneKind.LIGHT))
    def light() -> None: ...

    @app.task(shared=False, base=LaneTask, name=HEAVY, lane=Lane(cadence_s=3600))
    def heavy() -> None: ...


def scheduler(key_prefix: str) -> FairScheduler:
    return FairScheduler(app=make_app(key_prefix, two_lanes, beat_max_loop_interval_s=0.2,
                                      beat_lock_ttl_s=5.0, start_deadline_s=5.0,
                                      wake_on_release=False))


def finish_light(sched: FairScheduler, task_id: str) -> None:
    """The light run ends as a worker ends it (``run_finish.lua``), next due in an hour."""
    now = time.time()
    sched.rt.store.finish(LIGHT, RunRecord(last_run_at=now, runs=1, last_task_id=task_id,
                                           last_outcome=Outcome.COMPLETED),
                          token="", fence=0, wake_message="done", due_at=now + 3600)


def heals(client: redis.Redis, keys: Keys, name: str) -> int:
    return int(client.hget(keys.counters, f"derived_heals|{name}") or 0)


def settled(key_prefix: str, broker: redis.Redis) -> FairScheduler:
    """A beat that dispatched both lanes once and saw the light run end."""
    sched = scheduler(key_prefix)
    sched.tick()
    finish_light(sched, sent(broker, "light")[0]["id"])
    sched.tick()
    assert len(sent(broker, "light")) == 1
    return sched


def test_run_now_after_the_due_index_was_deleted_dispatches_and_the_heal_is_said(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    keys = Keys(key_prefix)
    sched = settled(key_prefix, broker)
    redis_client.delete(keys.due)
    sched.rt.store.run_now(LIGHT)
    with caplog.at_level(logging.WARNING, logger="schedproj.beat"):
        sched.tick()
        sched.tick()
    assert len(sent(broker, "light")) == 2, "schedproj run dispatched nothing"
    assert heals(redis_client, keys, "due") == 1
    said = [r.getMessage() for r in caplog.records if keys.due in r.getMessage()]
    assert len(said) == 1 and "rebuilt" in said[0], said
    assert redis_client.zscore(keys.due, LIGHT) is not None
    registry = CollectorRegistry()
    registry.register(SchedprojCollector(redis_client, keys, sched.settings,
                                         tuple(sched.engine.lanes.lanes.specs)))
    exported = generate_latest(registry).decode()
    assert 'schedproj_derived_state_heals_total{key="due"} 1.0' in exported
    sched.close()


@pytest.mark.parametrize("damage", ["delete", "garbage", "emptied"])
def test_a_damaged_due_index_is_rebuilt_from_the_records(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis, damage: str) -> None:
    keys = Keys(key_prefix)
    sched = settled(key_prefix, broker)
    if damage == "delete":
        redis_client.delete(keys.due)
    elif damage == "garbage":
        redis_client.set(keys.due, "garbage")
    else:
        redis_client.zremrangebyrank(keys.due, 0, -1)
    assert isinstance(sched.tick(), float)
    assert heals(redis_client, keys, "due") == 1
    # The light lane's look is back where its record puts it (an hour on), not lost.
    look = redis_client.zscore(keys.due, LIGHT)
    assert look is not None and look > time.time() + 3000
    sched.tick()
    assert heals(redis_client, keys, "due") == 1, "healed once, then the stamps agree"
    sched.close()


def test_an_index_restored_from_an_older_copy_is_rebuilt(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    keys = Keys(key_prefix)
    sched = scheduler(key_prefix)
    sched.tick()
    old = redis_client.dump(keys.due)
    finish_light(sched, sent(broker, "light")[0]["id"])
    sched.tick()
    assert old is not None
    redis_client.restore(keys.due, 0, old, replace=True)
    sched.tick()
    assert heals(redis_client, keys, "due") == 1
    look = redis_client.zscore(keys.due, LIGHT)
    assert look is not None and look > time.time() + 3000
    sched.close()


def test_lost_change_marks_are_healed(key_prefix: str, broker: redis.Redis,
                                      redis_client: redis.Redis) -> None:
    """A run ends, then the changed set is deleted before beat reads it: without a heal beat
    never looks at the lane again until its stale in-flight look."""
    keys = Keys(key_prefix)
    sched = scheduler(key_prefix)
    sched.tick()
    sched.tick()
    finish_light(sched, sent(broker, "light")[0]["id"])
    redis_client.delete(keys.changed)
    sched.rt.store.run_now(LIGHT)  # its mark lands in a set without the stamp member
    sched.tick()
    assert heals(redis_client, keys, "changed") == 1
    assert len(sent(broker, "light")) == 2
    assert STAMP_MEMBER + ":" in "".join(redis_client.smembers(keys.changed))
    sched.close()


def test_the_stamp_costs_the_idle_tick_no_write(key_prefix: str, broker: redis.Redis,
                                                redis_client: redis.Redis) -> None:
    keys = Keys(key_prefix)
    sched = settled(key_prefix, broker)
    sched.tick()
    stamps = redis_client.get(keys.due_stamp), redis_client.get(keys.changed_stamp)
    sched.tick()
    assert (redis_client.get(keys.due_stamp), redis_client.get(keys.changed_stamp)) == stamps
    sched.close()


#: Every key beat reads or writes, by its name under the prefix, and its Redis type.
BEAT_KEYS = {
    "lanes": "hash", "lease": "string", "epoch": "string", "due": "zset", "changed": "set",
    "paused": "set", "run-now": "set", "beat:lock": "string", "beat:fence": "string",
    "due:stamp": "string", "changed:stamp": "string", "wake": "list", "pressure": "hash",
    "counters": "hash", "dispatch-log": "list", "journal": "list", "errors": "hash",
    "registry": "string", "beat:info": "hash", "families": "set", "lease:fence": "string",
}
#: Keys every dispatch depends on: broken, nothing may be dispatched (but beat keeps running).
#: A broken epoch record reads as a state loss: the quarantine holds every lane a while.
EVERYTHING_DEPENDS_ON = {"lanes", "beat:fence", "epoch"}
#: Keys the tick's read names when broken.
NAMED_BY_THE_READ = {"lanes", "lease", "due", "changed", "paused", "run-now", "beat:fence"}


def spoil(client: redis.Redis, key: str, kind: str, how: str) -> None:
    client.delete(key)
    if how == "garbage" and kind == "string":
        client.set(key, "1e300 garbage {")
    elif kind == "string":
        client.rpush(key, "a", "b")
    elif how == "garbage":
        client.set(key, "garbage")
    else:
        client.hset(key, "a", "b") if kind != "hash" else client.rpush(key, "x")


@pytest.mark.parametrize("how", ["wrong-type", "garbage"])
@pytest.mark.parametrize("name", sorted(BEAT_KEYS))
def test_a_broken_key_stops_at_most_what_depends_on_it(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis, name: str, how: str,
        caplog: pytest.LogCaptureFixture) -> None:
    key = f"{key_prefix}:{name}"
    sched = scheduler(key_prefix)
    spoil(redis_client, key, BEAT_KEYS[name], how)
    with caplog.at_level(logging.INFO, logger="schedproj"):
        for _ in range(3):
            assert isinstance(sched.tick(), float)
    lights = len(sent(broker, "light"))
    if name in EVERYTHING_DEPENDS_ON:
        assert lights == 0
    else:
        assert lights == 1, f"a broken {name} stopped light dispatch"
    if (name in NAMED_BY_THE_READ and how == "wrong-type") or name == "beat:fence":
        said = [r.getMessage() for r in caplog.records if key in r.getMessage()]
        assert said, f"{key} was never named"
        assert len([s for s in said if "Fix" in s or "rebuilt" in s]) <= 1, "said more than once"
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == len(set(errors)), f"an error said every tick: {errors}"
    sched.close()


def test_family_members_are_indexed_again_and_removed_ones_are_not(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    def declare(app: Celery) -> None:
        two_lanes(app)

        @app.task(shared=False, base=LaneTask, name="k.fam",
                  lane=LaneFamily(cadence_s=3600, kind=LaneKind.LIGHT))
        def fam(key: str) -> None: ...

    keys = Keys(key_prefix)
    sched = FairScheduler(app=make_app(key_prefix, declare, beat_max_loop_interval_s=0.2,
                                       wake_on_release=False))
    family = FamilyStore(redis_client, keys)
    family.add("k.fam", ["a", "b"])
    sched.tick()
    family.remove("k.fam", ["b"])
    redis_client.delete(keys.due)
    sched.tick()
    assert heals(redis_client, keys, "due") == 1
    assert redis_client.zscore(keys.due, "k.fam[a]") is not None
    assert redis_client.zscore(keys.due, "k.fam[b]") is None
    sched.close()


@pytest.mark.parametrize("name", ["dispatch-log", "wake"])
def test_a_refused_write_names_the_key_once(key_prefix: str, broker: redis.Redis,
                                            redis_client: redis.Redis, name: str,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """Redis's WRONGTYPE error names no key: beat finds and names it, once per onset."""
    key = f"{key_prefix}:{name}"
    sched = FairScheduler(app=make_app(key_prefix, two_lanes, beat_max_loop_interval_s=0.2,
                                       wake_on_release=True))
    redis_client.set(key, "garbage")
    with caplog.at_level(logging.ERROR, logger="schedproj.beat"):
        for _ in range(3):
            assert isinstance(sched.tick(), float)
    said = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(said) == 1, said
    assert f"{key} (must be a list)" in said[0] and f"redis-cli DEL {key}" in said[0]
    assert len(sent(broker, "light")) == 1
    sched.close()


@pytest.mark.parametrize("value", ["abc", "1e300", "-5", "0", "12.5"])
def test_a_running_beat_whose_fence_turns_to_garbage_reports_it_and_sends_nothing(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis, value: str,
        caplog: pytest.LogCaptureFixture) -> None:
    keys = Keys(key_prefix)
    sched = settled(key_prefix, broker)
    redis_client.set(keys.beat_fence, value)
    sched.rt.store.run_now(LIGHT)
    with caplog.at_level(logging.ERROR, logger="schedproj.beat"):
        for _ in range(3):
            assert isinstance(sched.tick(), float)
    assert len(sent(broker, "light")) == 1, "a message went out under a garbage fence"
    said = [r.getMessage() for r in caplog.records if keys.beat_fence in r.getMessage()]
    assert any("not a sane integer" in s for s in said), said
    redis_client.delete(keys.beat_fence)  # the fix the message names
    sched.tick()
    sched.tick()
    assert len(sent(broker, "light")) == 2
    sched.close()


def lanes_with_a_due_check(fails: list[bool]) -> Callable[[Celery], None]:
    """The two lanes, and a light lane with a due check (as the REM chain's lanes have) that
    raises while ``fails`` holds True."""
    def check() -> int:
        if fails and fails[0]:
            raise RuntimeError("the store the check reads is down")
        return 0

    def declare(app: Celery) -> None:
        two_lanes(app)

        @app.task(shared=False, base=LaneTask, name="k.checked",
                  lane=Lane(cadence_s=3600, kind=LaneKind.LIGHT, due_check=check))
        def checked() -> None: ...

    return declare


@pytest.mark.parametrize(("name", "how", "check_fails"), [
    ("errors", "wrong-type", False), ("errors", "garbage", False),
    ("errors", "garbage", True), ("counters", "garbage", True)])
def test_a_broken_errors_or_counters_key_does_not_stop_a_tick_with_due_checks(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis, name: str, how: str,
        check_fails: bool, caplog: pytest.LogCaptureFixture) -> None:
    """Recording a due check's error (``<prefix>:errors`` and an error counter) and clearing
    it (on taking the lock every check's error may be another beat's, cleared by its next
    success) are bookkeeping: with either key broken, the tick's HDEL or HINCRBY was refused
    after its read, the whole tick stopped, and with the errors hash broken every tick did,
    so no lane at all - light ones included - was ever dispatched while any lane had a due
    check (the REM chain's all have)."""
    key = f"{key_prefix}:{name}"
    spoil(redis_client, key, BEAT_KEYS[name], how)
    sched = FairScheduler(app=make_app(key_prefix, lanes_with_a_due_check([check_fails]),
                                       beat_max_loop_interval_s=0.2, beat_lock_ttl_s=5.0,
                                       start_deadline_s=5.0, wake_on_release=False))
    with caplog.at_level(logging.INFO, logger="schedproj"):
        sched.tick()
        assert [m["task"] for m in sent(broker, "light")] == [LIGHT] + (
            [] if check_fails else ["k.checked"]), f"a broken {name} stopped the tick"
        for _ in range(2):
            sched.tick()
    said = [r.getMessage() for r in caplog.records if key in r.getMessage()]
    assert said and len(said) == len(set(said)), f"{key} not named once: {said}"
    sched.close()


def test_a_broken_dispatch_log_stops_no_other_step_of_the_tick(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    """The dispatch log is an audit list. With it broken, the append of a beat's take-over
    was refused before the beat announced itself (``beat:info``, the published lanes), so
    status named no active beat while it dispatched; and the append of a tick's sends was
    refused after the messages left, stopping the tick there: a run-now request served
    stayed requested, and the tick's later steps (the schedule entries, the families'
    sync, the pressure) were skipped on every tick that sent a lane."""
    keys = Keys(key_prefix)
    spoil(redis_client, keys.dispatch_log, "list", "garbage")
    sched = scheduler(key_prefix)
    with caplog.at_level(logging.INFO, logger="schedproj"):
        sched.tick()
        assert redis_client.hget(keys.beat_info, "token") == sched.token, "beat never announced"
        assert redis_client.get(keys.published_lanes), "the lanes were never published"
        finish_light(sched, sent(broker, "light")[0]["id"])
        sched.tick()
        sched.rt.store.run_now(LIGHT)  # what `schedproj run` does
        sched.tick()
        assert len(sent(broker, "light")) == 2
        assert not redis_client.sismember(keys.run_now, LIGHT), "the request stayed"
        for _ in range(2):
            sched.tick()
    said = [r.getMessage() for r in caplog.records if keys.dispatch_log in r.getMessage()]
    assert said and len(said) == len(set(said)), f"not named once: {said}"
    sched.close()


def test_an_unreachable_audit_redis_stops_no_dispatch(
        key_prefix: str, broker: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    """``SCHEDPROJ_AUDIT_REDIS_URL`` puts the dispatch log on a Redis of its own, to keep the
    audit when the state Redis loses everything. With that Redis down, appending to the log
    raised a connection error that beat took for the state Redis being unreachable: on
    every tick it took the lock, failed its take-over's append and stood by ("STOPPED
    DISPATCHING"), so nothing was ever dispatched again."""
    sched = FairScheduler(app=make_app(key_prefix, two_lanes, beat_max_loop_interval_s=0.2,
                                       beat_lock_ttl_s=5.0, start_deadline_s=5.0,
                                       wake_on_release=False,
                                       audit_redis_url="redis://127.0.0.1:1/0"))
    with caplog.at_level(logging.INFO, logger="schedproj"):
        for _ in range(3):
            sched.tick()
    assert sched.active, "beat stood by"
    assert len(sent(broker, "light")) == 1
    said = [r.getMessage() for r in caplog.records if "dispatch log" in r.getMessage()]
    assert len(said) == 1, said
    sched.close()


@pytest.mark.parametrize("broken", ["audit-redis-down", "counters"])
def test_recording_a_lost_run_stops_no_dispatch(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis, broken: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """A lost run is recorded (compare and set), then counted and journaled. With the
    counters of the wrong type, or the journal's own Redis out of reach, the count or the
    append stopped the tick after the record was written - the loss never said - and an
    unreachable audit Redis sent beat to stand by as if the state Redis were gone."""
    audit = {"audit_redis_url": "redis://127.0.0.1:1/0"} if broken == "audit-redis-down" else {}
    sched = FairScheduler(app=make_app(key_prefix, two_lanes, beat_max_loop_interval_s=0.2,
                                       beat_lock_ttl_s=5.0, start_deadline_s=5.0,
                                       lease_ttl_s=1.0, wake_on_release=False, **audit))
    sched.tick()
    [message] = sent(broker, "light")
    now = time.time()
    # Its worker started it and died: the in-flight mark lapsed past its grace long ago.
    sched.rt.store.write_run(LIGHT, RunRecord(running_task_id=message["id"],
                                              running_since=now - 30, running_until=now - 20))
    if broken == "counters":
        redis_client.delete(f"{key_prefix}:counters")
        redis_client.set(f"{key_prefix}:counters", "garbage")
    with caplog.at_level(logging.INFO, logger="schedproj"):
        for _ in range(3):
            sched.tick()
    assert sched.active, "beat stood by"
    said = [r.getMessage() for r in caplog.records if f"run {message['id']} lost" in
            r.getMessage()]
    assert len(said) == 1, "the loss was not said"
    assert len(sent(broker, "light")) == 2, "the lane was not dispatched again"
    sched.close()


@pytest.mark.parametrize("derived", ["due", "changed"])
def test_a_derived_key_heals_with_the_counters_broken(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis, derived: str) -> None:
    """Each heal of a derived key is counted before the key is rebuilt. With the counters
    of the wrong type too, that count was refused, the heal never happened, and every tick
    stopped there: nothing at all was dispatched (a run-now request waited for ever)."""
    sched = settled(key_prefix, broker)
    sched.rt.store.run_now(LIGHT)  # what `schedproj run` does
    spoil(redis_client, f"{key_prefix}:counters", "hash", "garbage")
    spoil(redis_client, f"{key_prefix}:{derived}", BEAT_KEYS[derived], "garbage")
    for _ in range(3):
        sched.tick()
    assert redis_client.type(f"{key_prefix}:{derived}") != "string", "never healed"
    assert len(sent(broker, "light")) == 2, "the run-now request was never served"
    sched.close()
