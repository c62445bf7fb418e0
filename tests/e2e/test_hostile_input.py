"""Hostile and broken input: foreign messages, garbage state, random declarations, bad lanes."""

from __future__ import annotations

import json
import math
import time
import uuid
from pathlib import Path

import pytest
import redis
from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kombu import Connection, Exchange, Producer

from schedproj import Lane, LaneKind, LaneTask, Settings
from schedproj.core.errors import ConfigurationError, SchedprojError
from schedproj.core.lanes import Gate
from schedproj.core.laneset import build_lane_set
from schedproj.core.records import SchedRecord, encode
from schedproj.on_celery.beat import FairScheduler
from schedproj.on_celery.messages import heavy_kwargs, light_kwargs
from schedproj.rem.settings import RemSettings
from schedproj.store.connection import connect
from schedproj.store.lease import HeavyLease
from schedproj.store.protocol import Keys
from tests.conftest import E2E_REDIS_URL, REDIS_URL, make_app
from tests.procs import FAST_SETTINGS, Cluster, wait_for

ROOT = Path(__file__).resolve().parents[2]


# -- random declarations and settings: a valid start or a clear error ------------------------

class FakeTask:
    def __init__(self, lane: object) -> None:
        self.lane = lane
        self.queue = None


values = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True),
                   st.text(max_size=5), st.lists(st.integers(), max_size=2))
lane_kwargs = st.fixed_dictionaries({}, optional={
    "cadence_s": values, "kind": st.one_of(values, st.sampled_from(["heavy", "light"])),
    "priority0": values, "deployment": values, "order": values, "backlog_driven": values,
    "retry_after_failure_s": values, "retry_window_s": values,
    "gates": st.one_of(values, st.lists(st.builds(Gate, st.sampled_from(["a", "b", "zz"])),
                                        max_size=2)),
})


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["a", "b", "c"]), lane_kwargs, min_size=1))
def test_random_declarations_start_or_fail_clearly(decls: dict[str, dict]) -> None:
    try:
        tasks = {name: FakeTask(Lane(**kw)) for name, kw in decls.items()}
        build_lane_set(tasks)
    except SchedprojError as exc:
        assert "Fix:" in str(exc) or "lane" in str(exc)
    except TypeError as exc:  # only Python's own keyword check, before any schedproj code
        assert "argument" in str(exc)


setting_values = st.one_of(st.text(max_size=8), st.sampled_from(
    ["0", "-1", "nan", "inf", "1e9", "true", "cloud", "registry", "redis://x:1/0"]))


@settings(max_examples=200)
@given(st.dictionaries(st.sampled_from(
    ["lease_ttl_s", "hold_cap_s", "beat_lock_ttl_s", "beat_max_loop_interval_s", "profile",
     "policy", "heavy_time_limit_s", "metrics_port", "cadence_scale", "start_deadline_s"]),
    setting_values, max_size=4))
def test_random_settings_load_or_fail_clearly(values: dict[str, str]) -> None:
    try:
        loaded = Settings.load(**values)
    except ConfigurationError as exc:
        assert "SCHEDPROJ_" in str(exc)
        return
    assert math.isfinite(loaded.lease_ttl_s) or loaded.lease_ttl_s > 0


@settings(max_examples=100)
@given(st.dictionaries(st.sampled_from(["batch", "window_words", "backup_keep",
                                        "summarizer_latency_s"]), setting_values, max_size=3))
def test_random_rem_settings_load_or_fail_clearly(values: dict[str, str]) -> None:
    # The REM lanes' settings moved out of the scheduler's; their errors stay as clear.
    try:
        loaded = RemSettings.load(**values)
    except ConfigurationError as exc:
        assert "SCHEDPROJ_REM_" in str(exc)
        return
    assert loaded.batch > 0 and loaded.window_words > 0


# -- lanes that raise, time out or return nonsense: lease released, outcome recorded ---------

def heavy_app(prefix: str) -> Celery:
    app = make_app(prefix, beat_max_loop_interval_s=0.2, beat_lock_ttl_s=1.0)

    @app.task(shared=False, base=LaneTask, name="x.raises", lane=Lane(cadence_s=60))
    def raises() -> None:
        raise RuntimeError("boom")

    @app.task(shared=False, base=LaneTask, name="x.soft-limit", lane=Lane(cadence_s=60))
    def soft_limit() -> None:
        raise SoftTimeLimitExceeded()

    @app.task(shared=False, base=LaneTask, name="x.nonsense", lane=Lane(cadence_s=60))
    def nonsense() -> object:
        return object()  # not JSON: results are ignored, so this must not matter

    return app


@pytest.mark.parametrize(("task", "outcome"), [("x.raises", "failed"),
                                                ("x.soft-limit", "failed"),
                                                ("x.nonsense", "completed")])
def test_bad_lane_bodies_release_lease_and_record(key_prefix: str, task: str,
                                                  outcome: str) -> None:
    app = heavy_app(key_prefix)
    keys = Keys(key_prefix)
    client = connect(REDIS_URL)
    lease = HeavyLease(client, keys)
    grant = lease.acquire(task, "tok", 30, time.time(), task_id="t1")
    lane_task = app.tasks[task]
    lane_task.push_request(id="t1")
    try:
        # The message as the current beat sends it: the grant and the beat's lock fence.
        client.set(keys.beat_fence, 7)
        lane_task(**heavy_kwargs("tok", grant.fence, beat_fence=7))
    except (RuntimeError, SoftTimeLimitExceeded):
        pass
    finally:
        lane_task.pop_request()
    assert lease.read() is None, "the lease was left held"
    record = json.loads(client.hget(keys.lanes, f"{task}|run"))
    assert record["last_outcome"] == outcome and record["runs"] == 1


# -- garbage in every state key: reported, no crash loop -------------------------------------

#: key suffix -> (type, value, what beat logs about it, what status reports about it)
GARBAGE = {
    "lease": ("string", "not json", "scheduling error", "<lease>"),
    "lease:fence": ("string", "many", "Redis refused a command", None),
    "beat:lock": ("string", "stuck-without-ttl", "without a TTL", None),
    "paused": ("string", "not a set", "Redis refused a command", None),
    "run-now": ("hash", {"a": "b"}, "Redis refused a command", None),
    "counters": ("hash", {"yields|x": "lots"}, None, None),
    "watchdog": ("string", "{", None, "watchdog"),
}


@pytest.mark.parametrize("suffix", sorted(GARBAGE))
def test_garbage_in_each_key_is_reported_not_a_crash(key_prefix: str, suffix: str,
                                                     redis_client: redis.Redis,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    from schedproj.telemetry.observe import observe

    kind, value, logged, reported = GARBAGE[suffix]
    key = f"{key_prefix}:{suffix}"
    if kind == "hash":
        redis_client.hset(key, mapping=value)
    else:
        redis_client.set(key, value)
    sched = FairScheduler(app=heavy_app(key_prefix))
    with caplog.at_level("INFO"):
        for _ in range(3):
            sched.tick()  # returns every time: no crash loop
    sched.close()
    if logged:
        assert logged in caplog.text
    if suffix in ("paused", "run-now"):
        return  # the wrong type also stops status, with Redis's own message (tested in CLI)
    obs = observe(redis_client, Keys(key_prefix))
    if reported:
        assert reported in " ".join([*obs.errors, *obs.problems])
    if suffix == "counters":
        assert "yields|x" not in obs.counters


# -- foreign messages on the queues ----------------------------------------------------------

@pytest.mark.e2e
@pytest.mark.timeout(90)
def test_foreign_messages_run_nothing_and_leave_the_lease(e2e_redis: redis.Redis,
                                                          tmp_path: Path) -> None:
    import os

    env = dict(os.environ)
    env.update(FAST_SETTINGS)
    env.update({"CELERY_BROKER_URL": E2E_REDIS_URL, "SCHEDPROJ_REDIS_URL": E2E_REDIS_URL,
                "SCHEDPROJ_KEY_PREFIX": "schedproj", "E2E_SCENARIO": "deadline",
                "PYTHONPATH": str(ROOT)})
    cluster = Cluster(env=env, logdir=tmp_path)
    try:
        heavy = cluster.worker("heavy1", "heavy")
        light = cluster.worker("light1", "light")
        keys = Keys("schedproj")
        lease = HeavyLease(connect(E2E_REDIS_URL), keys)
        grant = lease.acquire("someone", "real", 60, time.time())
        with Connection(E2E_REDIS_URL) as conn:
            producer = Producer(conn.default_channel, exchange=Exchange("", type="direct"))
            for queue in ("heavy", "light"):
                producer.publish({"evil": True}, routing_key=queue, serializer="pickle",
                                 headers={"task": "e2e.quick", "id": str(uuid.uuid4())})
                producer.publish("garbage", routing_key=queue, serializer="json",
                                 headers={"task": "no.such.task", "id": str(uuid.uuid4())})
        sender = Celery("s", broker=E2E_REDIS_URL, set_as_current=False)
        sender.send_task("e2e.quick", args=[1, 2, 3], queue="heavy")
        sender.send_task("e2e.slowlight", args=[1, 2, 3], queue="light")
        wait_for(lambda: "ContentDisallowed" in heavy.text() + light.text()
                 or "disallowed" in (heavy.text() + light.text()).lower(), 20,
                 "the pickle payload refused")
        wait_for(lambda: "no.such.task" in heavy.text() and "no.such.task" in light.text(), 20,
                 "the unknown task refused")
        wait_for(lambda: "missing-lease-token" in heavy.text(), 20,
                 "the token-less heavy message refused")
        wait_for(lambda: e2e_redis.hget(keys.lanes, "e2e.slowlight|run") is not None, 20,
                 "the hand-sent light message recorded")
        # Not its lane's dispatch from the current beat: refused before its arguments matter.
        record = json.loads(e2e_redis.hget(keys.lanes, "e2e.slowlight|run"))
        assert record["last_outcome"] == "skipped"
        assert record["last_reason"] == "missing-dispatch"
        current = lease.read()
        assert current is not None and current.token == "real" and current.fence == grant.fence
        assert not [x for x in e2e_redis.lrange(keys.journal, 0, -1)
                    if json.loads(x)["fence"] > 0], "a heavy lane started"
        assert heavy.alive() and light.alive()
    finally:
        cluster.stop_all()


def test_light_run_in_flight_mark_is_kept_fresh_and_lapses_after_a_kill(
        key_prefix: str) -> None:
    """A light run's in-flight mark lives one lease TTL and is refreshed while it runs; if the
    worker is killed outright the lane is free again within that TTL, not the time limit."""
    import threading

    from schedproj.core.records import LaneState, RunRecord
    from schedproj.core.views import is_in_flight

    app = make_app(key_prefix, lease_ttl_s=0.9)
    release = threading.Event()

    @app.task(shared=False, base=LaneTask, name="x.light",
              lane=Lane(cadence_s=60, kind=LaneKind.LIGHT))
    def slow_light() -> None:
        release.wait(10)

    client = connect(REDIS_URL)
    keys = Keys(key_prefix)
    task = app.tasks["x.light"]
    # Dispatched by the current beat: its lock fence, and the sched record naming light-1.
    client.set(keys.beat_fence, 7)
    client.hset(keys.lanes, "x.light|sched", encode(SchedRecord(inflight_task_id="light-1")))

    def run() -> None:
        task.push_request(id="light-1")
        try:
            task(**light_kwargs(beat_fence=7))
        finally:
            task.pop_request()

    runner = threading.Thread(target=run)
    runner.start()
    sched = SchedRecord(inflight_task_id="light-1", inflight_deadline=time.time() + 0.1)

    def state() -> LaneState:
        raw = client.hget(keys.lanes, "x.light|run")
        run_rec = RunRecord(**{k: v for k, v in json.loads(raw).items() if k != "v"}) \
            if raw else RunRecord()
        return LaneState(run=run_rec, sched=sched)

    wait_for(lambda: state().run.running_task_id == "light-1", 5, "the run to start")
    time.sleep(2.0)  # more than two TTLs: only the heartbeat keeps it in flight
    assert is_in_flight(state(), time.time()), "a running light lane looked finished"
    release.set()
    runner.join(5)
    assert not is_in_flight(state(), time.time())
    assert state().run.last_outcome == "completed" and state().run.runs == 1
    # A killed worker: the mark is left behind with no heartbeat; it lapses within a TTL.
    client.hset(keys.lanes, "x.light|run", json.dumps(
        {"v": 1, "running_task_id": "light-2", "running_since": time.time(),
         "running_until": time.time() + 0.9}))
    sched = SchedRecord(inflight_task_id="light-2", inflight_deadline=time.time() - 1)
    assert is_in_flight(state(), time.time())
    wait_for(lambda: not is_in_flight(state(), time.time()), 2, "the orphaned mark to lapse")
