"""Stamped due checks (``Lane(due_check_stamp=...)``): beat calls them only when the stamp
their data's writers set has moved, and reads the stamps with the tick's read, so the idle
tick with the REM chain makes one Redis round trip, not one per due-check read; and a write
through the REM store is still seen by the next tick.

Round trips are counted at the socket (each request a redis-py connection writes: one
command or one whole pipeline), against a real Redis; nothing is timed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery, _state

from schedproj import DueAnswer, DueCheckStamp
from schedproj.core.records import Outcome, RunRecord, SchedRecord, encode
from schedproj.ops.apps import configure_app
from schedproj.rem.store import GoldenPath, MemoryStore, Summary
from schedproj.settings import Settings
from schedproj.store.lane_store import LaneStore
from schedproj.store.protocol import Keys
from tests.conftest import BROKER_URL, FORGOTTEN_REM_REGISTRATIONS, REDIS_URL, sent

pytestmark = pytest.mark.timeout(60)


class Wire:
    """Every request written to a Redis socket in this process: one round trip each."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent: list[str] = []
        cls = redis.connection.AbstractConnection
        original = cls.send_packed_command

        def send(conn: Any, command: Any, check_health: bool = True) -> Any:
            chunks = command if isinstance(command, list) else [command]
            packed = b"".join(c if isinstance(c, bytes) else bytes(c) for c in chunks)
            parts = packed.split(b"\r\n")  # *N, $len, VERB: a pipeline shows its first
            self.sent.append(parts[2].decode().upper() if len(parts) > 2 else "?")
            return original(conn, command, check_health)

        monkeypatch.setattr(cls, "send_packed_command", send)

    def during(self, fn: Any) -> list[str]:
        start = len(self.sent)
        fn()
        return self.sent[start:]


# -- the REM chain under a real FairScheduler ---------------------------------------------------

REM_LANES = ("backup", "memory-summary-backfill", "summary", "dream", "golden-path",
             "swarm-heartbeat")


@pytest.fixture
def rem_app(key_prefix: str, broker: redis.Redis) -> Iterator[Celery]:
    """An app with the REM chain's lanes, current (the REM due checks read the current app's
    store, as in a beat process), every lane having just run (nothing due by time)."""
    import schedproj.rem.lanes  # noqa: F401  (registers the shared tasks on first import)

    for callback in FORGOTTEN_REM_REGISTRATIONS:  # taken away after an earlier test
        _state.connect_on_app_finalize(callback)
    previous = _state.get_current_app()
    app = Celery(f"t-{uuid.uuid4().hex[:6]}", set_as_current=True)
    configure_app(app, Settings.load(broker_url=BROKER_URL, redis_url=REDIS_URL,
                                     key_prefix=key_prefix, wake_on_release=False,
                                     beat_max_loop_interval_s=0.2, beat_lock_ttl_s=5.0))
    app.finalize()
    assert {n for n in app.tasks if n.startswith("schedproj.rem.")}, "REM lanes missing"
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    keys, now = Keys(key_prefix), time.time()
    records: dict[str, str] = {}
    for lane in REM_LANES:
        task_id = str(uuid.uuid4())
        records[f"{lane}|run"] = encode(RunRecord(
            last_run_at=now, last_outcome=Outcome.COMPLETED, last_task_id=task_id, runs=1))
        records[f"{lane}|sched"] = encode(SchedRecord(
            inflight_task_id=task_id, inflight_deadline=now + 60, last_dispatch_at=now - 1,
            dispatches=1))
    client.hset(keys.lanes, mapping=records)
    yield app
    app.close()
    previous.set_current()


def idle_beat(app: Celery) -> Any:
    from schedproj.on_celery.beat import FairScheduler

    sched = FairScheduler(app=app)
    for _ in range(3):  # takes the lock, reads every lane, settles
        sched.tick()
    return sched


def test_an_idle_tick_with_the_rem_chain_is_one_round_trip(
        rem_app: Celery, broker: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    sched = idle_beat(rem_app)
    wire = Wire(monkeypatch)
    for _ in range(5):
        # Before the stamps: EVALSHA then a GET, a pipeline, an SCARD, HGETALL... (7 in all);
        # then EVALSHA and an MGET of the stamps (2). Now the MGET is in the read's pipeline.
        assert wire.during(sched.tick) == ["EVALSHA"]
    assert sent(broker, "heavy") == [] and sent(broker, "light") == []
    sched.close()


class Planner:
    """Counts the planner's calls in beat (``plan_tick``), and the lanes each planned."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from schedproj.on_celery import beat

        self.planned: list[list[str]] = []
        original = beat.plan_tick

        def counting(lanes: Any, *args: Any, **kwargs: Any) -> Any:
            self.planned.append(sorted(spec.name for spec in lanes))
            return original(lanes, *args, **kwargs)

        monkeypatch.setattr(beat, "plan_tick", counting)


def test_an_idle_tick_with_the_rem_chain_plans_nothing(
        rem_app: Celery, broker: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """The REM chain's due-check lanes and gate blockers are read every tick; while nothing
    they were planned on moved (record, stamp, answer, lease) and none is due, the idle tick
    does not plan them (before: the four were planned every tick, about 0.27 ms of 0.61)."""
    sched = idle_beat(rem_app)
    planner = Planner(monkeypatch)
    for _ in range(5):
        sched.tick()
    assert planner.planned == []
    assert sent(broker, "heavy") == [] and sent(broker, "light") == []
    sched.close()


def summary_written(store: MemoryStore) -> None:
    """A summary run's write, as a worker makes it (fenced): one summary awaits the dream."""
    store.put_summaries({"s1": Summary("A summary.", 1.0, False)}, fence=1)


def session_ingested(store: MemoryStore) -> None:
    """Ingest (not a lane: unfenced): a session awaits its summary."""
    store.add_session("s1", ["A short turn."])


@pytest.mark.parametrize(("write", "lane"), [(summary_written, "schedproj.rem.dream"),
                                             (session_ingested, "schedproj.rem.summary")])
def test_a_store_write_flips_the_due_check_on_the_next_tick(
        rem_app: Celery, key_prefix: str, broker: redis.Redis, monkeypatch: pytest.MonkeyPatch,
        write: Any, lane: str) -> None:
    sched = idle_beat(rem_app)
    wire, planner = Wire(monkeypatch), Planner(monkeypatch)
    assert wire.during(sched.tick) == ["EVALSHA"]  # answered from the stamp
    assert planner.planned == [], "planned: the write is not seen from a quiet lane"
    write(MemoryStore(redis.Redis.from_url(REDIS_URL, decode_responses=True), key_prefix))
    sched.tick()
    assert [m["task"] for m in sent(broker, "heavy")] == [lane]
    sched.close()


def test_a_gated_consumer_of_a_quiet_blocker_still_sees_it(
        rem_app: Celery, key_prefix: str, broker: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """golden-path defers while dream is due or running. After idle ticks that planned
    neither, one write makes both due through the stamp: dream (heavy) is sent, golden-path
    is deferred on it - and stays deferred on the ticks after, dream in flight, whether
    dream is quiet or not."""
    sched = idle_beat(rem_app)
    planner = Planner(monkeypatch)
    sched.tick()
    assert planner.planned == []
    store = MemoryStore(redis.Redis.from_url(REDIS_URL, decode_responses=True), key_prefix)
    summary_written(store)  # dream has a summary to digest
    store.put_golden_path(GoldenPath(graph_version=7, computed_at=time.time(), ranking=()))
    for _ in range(3):
        sched.tick()
    assert [m["task"] for m in sent(broker, "heavy")] == ["schedproj.rem.dream"]
    assert sent(broker, "light") == [], "golden-path was sent with dream due and running"
    lanes = LaneStore(store.client, Keys(key_prefix)).snapshot("reader", 1.0).states
    deferral = lanes["golden-path"].sched.deferral
    assert deferral is not None and deferral.blocker == "dream"
    sched.close()


def test_a_hand_edit_that_skips_the_stamp_is_seen_within_max_age(
        rem_app: Celery, key_prefix: str, broker: redis.Redis) -> None:
    """The stated bound: a write that does not set the stamp (redis-cli, a worker of the
    release before it) is seen once the remembered answer is ``max_age_s`` old, or at the
    first tick that reads a changed lane record, whichever comes first."""
    sched = idle_beat(rem_app)
    store = MemoryStore(redis.Redis.from_url(REDIS_URL, decode_responses=True), key_prefix)
    store.client.sadd(store.keys.undigested, "s1")  # behind the store's back
    sched.tick()
    assert sent(broker, "heavy") == [], "seen without a stamp: the test proves nothing"
    for answer in sched.engine.checks.remembered.values():  # age them past max_age_s
        object.__setattr__(answer, "called_at", answer.called_at - 61.0)
    sched.tick()
    assert [m["task"] for m in sent(broker, "heavy")] == ["schedproj.rem.dream"]
    sched.close()


def test_a_resting_lane_is_left_out_of_the_read_and_a_hand_edit_is_seen_at_the_reconcile(
        rem_app: Celery, key_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The REM lanes read every tick are not read while quiet: the idle read carries none of
    them. A hand edit of such a record (redis-cli: nothing marked changed) is so not seen by
    the next tick, but once the periodic reconcile marked the lanes changed."""
    sched = idle_beat(rem_app)
    store = sched.engine.rt.store
    asked: list[list[str]] = []
    real = store.tick_snapshot

    def spy(*args: Any, **kwargs: Any) -> Any:
        asked.append(list(kwargs["always"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "tick_snapshot", spy)
    sched.tick()
    resting = sched.engine.memory.resting(time.time())
    assert {"dream", "summary"} <= resting.keys() and asked == [[]]
    run = resting["dream"].run
    edited = RunRecord(last_run_at=run.last_run_at, last_outcome=run.last_outcome,
                       last_task_id=run.last_task_id, runs=run.runs + 41)
    store.client.hset(Keys(key_prefix).lanes, "dream|run", encode(edited))  # by hand
    sched.tick()
    assert sched.engine.memory.resting(time.time())["dream"].run.runs == run.runs
    sched._reconciled_at = 0.0  # the reconcile's period has passed
    for _ in range(2):  # the reconcile marks the lanes changed; the next tick reads them
        sched.tick()
    seen = sched.engine.memory.resting(time.time()).get("dream") or \
        sched.engine.memory.states["dream"]
    assert seen.run.runs == run.runs + 41
    sched.close()


def test_the_rem_due_checks_read_the_current_apps_store(redis_client: redis.Redis) -> None:
    """Each app's own store, whichever app was current before: the checks' runtime was keyed
    by ``current_app`` (one proxy for every app), so a later app read the first one's."""
    from schedproj.rem.lanes import dream_pending

    previous = _state.get_current_app()
    prefixes = [f"t-{uuid.uuid4().hex[:12]}" for _ in range(2)]
    try:
        for n, prefix in enumerate(prefixes):
            app = Celery(f"t-{uuid.uuid4().hex[:6]}", set_as_current=True)
            configure_app(app, Settings.load(broker_url=BROKER_URL, redis_url=REDIS_URL,
                                             key_prefix=prefix))
            store = MemoryStore(redis_client, prefix)
            store.put_summaries({f"s{i}": Summary("x.", 1.0, False) for i in range(n + 1)},
                                fence=1)
            assert dream_pending() == n + 1, f"app {n} read another app's store"
    finally:
        previous.set_current()
        for prefix in prefixes:
            keys = list(redis_client.scan_iter(f"{prefix}:*"))
            if keys:
                redis_client.delete(*keys)


# -- DueChecks on its own: when a stamped hook is called ---------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def checks_with(hooks: dict[str, Any], stamps: dict[str, DueCheckStamp],
                client: redis.Redis, prefix: str, clock: Clock) -> Any:
    from schedproj.on_celery.due_checks import DueChecks, ErrorReporter

    return DueChecks(list(hooks.items()), ErrorReporter(LaneStore(client, Keys(prefix))),
                     stamps=stamps, client=client, prefix=prefix, clock=clock)


def counting(answers: list[Any]) -> tuple[Any, list[int]]:
    calls: list[int] = []

    def hook() -> Any:
        calls.append(1)
        answer = answers[min(len(calls), len(answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer
    return hook, calls


def test_a_stamped_hook_is_called_again_only_when_its_answer_may_have_changed(
        redis_client: redis.Redis, key_prefix: str) -> None:
    clock = Clock()
    stamped, stamped_calls = counting([3])
    plain, plain_calls = counting([1])
    stamp_key = f"{key_prefix}:app:stamp"
    checks = checks_with({"stamped": stamped, "plain": plain},
                         {"stamped": DueCheckStamp("app:stamp", max_age_s=30)},
                         redis_client, key_prefix, clock)

    def probe(fresh: bool = False) -> dict[str, int]:
        return checks.probe({}, lambda lane: True, fresh=fresh)[0]

    assert probe() == {"stamped": 3, "plain": 1}
    assert probe() == {"stamped": 3, "plain": 1}
    assert (len(stamped_calls), len(plain_calls)) == (1, 2), "unstamped: called every tick"
    redis_client.set(stamp_key, "written")  # a write: the stamp moved
    probe()
    assert len(stamped_calls) == 2
    probe(fresh=True)  # a lane record changed in the tick's read
    assert len(stamped_calls) == 3
    clock.now += 29.0
    probe()
    assert len(stamped_calls) == 3
    clock.now += 1.0  # max_age_s
    probe()
    assert len(stamped_calls) == 4
    redis_client.delete(stamp_key)  # a lost stamp reads as moved too
    probe()
    assert len(stamped_calls) == 5


def test_an_answer_with_until_is_called_again_when_it_comes(
        redis_client: redis.Redis, key_prefix: str) -> None:
    clock = Clock()
    hook, calls = counting([DueAnswer(0, until=clock.now + 5.0), DueAnswer(7)])
    checks = checks_with({"lane": hook}, {"lane": DueCheckStamp("s")}, redis_client,
                         key_prefix, clock)
    assert checks.probe({}, lambda lane: True)[0] == {"lane": 0}
    clock.now += 4.9
    assert checks.probe({}, lambda lane: True)[0] == {"lane": 0} and len(calls) == 1
    clock.now += 0.1  # the backoff ends: no write needed
    assert checks.probe({}, lambda lane: True)[0] == {"lane": 7} and len(calls) == 2


def test_a_stamped_hook_that_raised_is_called_every_tick_until_it_answers(
        redis_client: redis.Redis, key_prefix: str) -> None:
    clock = Clock()
    hook, calls = counting([RuntimeError("store down"), RuntimeError("store down"), 2])
    checks = checks_with({"lane": hook}, {"lane": DueCheckStamp("s")}, redis_client,
                         key_prefix, clock)
    for expected_calls in (1, 2):
        probes, unreadable = checks.probe({}, lambda lane: True)
        assert probes == {} and unreadable == {"lane"} and len(calls) == expected_calls
    assert checks.probe({}, lambda lane: True)[0] == {"lane": 2}
    assert checks.probe({}, lambda lane: True)[0] == {"lane": 2} and len(calls) == 3


def test_taking_over_the_lock_forgets_every_answer(redis_client: redis.Redis,
                                                   key_prefix: str) -> None:
    clock = Clock()
    hook, calls = counting([1])
    checks = checks_with({"lane": hook}, {"lane": DueCheckStamp("s")}, redis_client,
                         key_prefix, clock)
    checks.probe({}, lambda lane: True)
    checks.taking_over()
    checks.probe({}, lambda lane: True)
    assert len(calls) == 2
