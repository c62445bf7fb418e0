"""Regression tests for the correctness review's findings."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import pytest
import redis

from schedproj import Lane, LaneKind, LaneTask, Settings
from schedproj.core.deferrals import Deferral
from schedproj.core.errors import ConfigurationError
from schedproj.core.lanes import DeferralReason, Gate, GateCondition, LaneSpec
from schedproj.core.pipeline import decide
from schedproj.core.records import LaneState, LeaseView, RunRecord, SchedRecord, encode
from schedproj.devtools.processes import wait_until
from schedproj.on_celery.messages import light_kwargs
from schedproj.on_celery.task import LeaseRenewer, RunContext
from schedproj.store.connection import connect
from schedproj.store.lane_store import LaneStore
from schedproj.store.protocol import Keys
from tests.conftest import REDIS_URL, make_app


def test_renewer_flags_lost_lease_while_redis_is_unreachable() -> None:
    """Failed renewals must not move the grace window: after 2/3 of a TTL without a renewal
    landing, the run is told to stop (the server may expire the lease at one TTL)."""
    class Unreachable:
        def renew(self, *args: object) -> tuple[bool, str]:
            raise redis.ConnectionError("cut off")

    rt = SimpleNamespace(settings=SimpleNamespace(lease_ttl_s=0.3, max_hold_s=60),
                         lease=Unreachable())
    ctx = RunContext(lane="summary", task_id="t", started_at=time.time(), hold_cap_s=None)
    renewer = LeaseRenewer(rt, "tok", ctx)  # type: ignore[arg-type]
    renewer.start()
    try:
        assert wait_until(ctx.lost.is_set, 1.0), "a cut-off holder never learned it lost"
        assert ctx.lost_reason == "redis-unreachable"
    finally:
        renewer.stopped.set()


def heavy(name: str, order: int, gates: tuple[Gate, ...] = ()) -> LaneSpec:
    return LaneSpec(name=name, task_name=name, kind=LaneKind.HEAVY, cadence_s=60.0,
                    order=order, gates=gates)


def test_gate_clock_survives_lease_waits() -> None:
    """L is gated on P (max 100 s); Q keeps taking the lease in between. The wait for Q's
    lease must not restart the gate's clock, so after 100 s behind P the gate lets L go."""
    now = 10_000.0
    gate = Gate("P", GateCondition.DUE_AND_BEHIND, DeferralReason.DEPENDENCY, max_defer_s=100)
    lanes = [heavy("P", 1), heavy("Q", 2), heavy("L", 3, (gate,))]
    behind = LaneState(run=RunRecord(last_run_at=now - 120, backlog=5))
    states = {"P": behind, "Q": LaneState(run=RunRecord(last_run_at=now - 120)),
              "L": LaneState(run=RunRecord(last_run_at=now - 120))}
    t = now
    for step in range(8):  # alternate: P defers L by the gate, then Q holds the lease
        lease = LeaseView(lane="Q", token="x", fence=1, granted_at=t) if step % 2 else None
        decision = decide(lanes, states, lease, t)
        deferral = {d.lane: d for d in decision.deferred}.get("L")
        if deferral is not None:
            states["L"] = LaneState(run=states["L"].run, sched=SchedRecord(deferral=deferral))
        if t - now >= 100 and lease is None:
            assert ("L", gate) in decision.expired_gates, "the gate never ran out"
            return
        t += 30
    pytest.fail("the scenario did not reach the gate bound")


def test_light_lane_with_fenced_record_still_records(key_prefix: str) -> None:
    app = make_app(key_prefix)

    @app.task(shared=False, base=LaneTask, name="x.was-heavy",
              lane=Lane(cadence_s=60, kind=LaneKind.LIGHT))
    def was_heavy() -> None: ...

    client = connect(REDIS_URL)
    keys = Keys(key_prefix)
    client.hset(keys.lanes, "x.was-heavy|run",
                json.dumps({"v": 1, "fence": 1712345678901, "runs": 3, "last_run_at": 1.0}))
    # Dispatched by the current beat: its lock fence, and the sched record naming r1.
    client.set(keys.beat_fence, 7)
    client.hset(keys.lanes, "x.was-heavy|sched", encode(SchedRecord(inflight_task_id="r1")))
    task = app.tasks["x.was-heavy"]
    task.push_request(id="r1")
    try:
        task(**light_kwargs(beat_fence=7))
    finally:
        task.pop_request()
    record = json.loads(client.hget(keys.lanes, "x.was-heavy|run"))
    assert record["runs"] == 4 and record["last_run_at"] > 1.0


def test_skip_sets_only_the_outcome(key_prefix: str, redis_client: redis.Redis) -> None:
    keys = Keys(key_prefix)
    store = LaneStore(connect(REDIS_URL), keys)
    redis_client.hset(keys.lanes, "x|run", json.dumps(
        {"v": 1, "runs": 7, "last_run_at": 1796214944.4994, "fence": 1796214944499}))
    assert store.mark_skipped("x", "stale-lease:taken", wake_message="x:skipped")
    record = json.loads(redis_client.hget(keys.lanes, "x|run"))
    assert record["runs"] == 7 and record["fence"] == 1796214944499
    assert record["last_run_at"] == pytest.approx(1796214944.4994, abs=1e-3)
    assert (record["last_outcome"], record["last_reason"]) == ("skipped", "stale-lease:taken")


def test_time_limit_must_stay_below_the_maximum_hold() -> None:
    with pytest.raises(ConfigurationError, match="SCHEDPROJ_HEAVY_TIME_LIMIT_S"):
        Settings.load(max_hold_s=3600, heavy_time_limit_s=7200, hold_cap_s=600)


def test_idle_wait_never_outlasts_the_socket_timeout(key_prefix: str) -> None:
    store = LaneStore(connect(REDIS_URL, socket_timeout_s=1.5),
                      Keys(key_prefix))
    started = time.monotonic()
    assert store.wait_for_wake(5.0) is False  # capped at 0.5 s, no TimeoutError
    assert time.monotonic() - started < 2.0
    threading.Timer(0.1, lambda: store.wake("x")).start()
    assert store.wait_for_wake(5.0) is True


def test_lease_wait_keeps_the_gate_owner() -> None:
    gated = Deferral("L", DeferralReason.DEPENDENCY, "P", 100.0)
    assert gated.gate_clock("P") == 100.0
    waiting = Deferral("L", DeferralReason.LEASE_HELD, "Q", 100.0, 130.0, gate_blocker="P")
    assert waiting.gate_clock("P") == 130.0 and waiting.gate_clock("Q") is None
