"""Stall gauges, the watchdog latch, status, operator verbs and metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import redis
from celery import Celery

from schedproj import Lane, LaneKind, LaneTask, Settings
from schedproj.core.deferrals import Deferral
from schedproj.core.health import Posture, assess, deferral_chain
from schedproj.core.lanes import DeferralReason, LaneSpec, Profile
from schedproj.core.records import LaneState, LeaseView, RunRecord, SchedRecord
from schedproj.devtools.redis_server import free_port
from schedproj.on_celery.beat import FairScheduler
from schedproj.ops.watchdog import Latch, step
from schedproj.store.protocol import Keys
from tests.conftest import BROKER_URL, REDIS_URL, make_app

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_000_000.0
HOUR = 3600.0


def heavy(name: str, order: int = 1) -> LaneSpec:
    return LaneSpec(name=name, task_name=name, kind=LaneKind.HEAVY, cadence_s=HOUR,
                    order=order)


def deferred(lane: str, blocker: str, since_ago: float,
             reason: DeferralReason = DeferralReason.LEASE_HELD) -> LaneState:
    return LaneState(run=RunRecord(last_run_at=NOW - 2 * HOUR),
                     sched=SchedRecord(deferral=Deferral(lane, reason, blocker, NOW - since_ago)))


def test_deferral_chain_is_the_longest_path() -> None:
    chain = deferral_chain({"golden-path": "dream", "dream": "summary",
                            "summary": "memory-summary-backfill", "kb-sync": "summary"})
    assert chain == ("golden-path", "dream", "summary", "memory-summary-backfill")
    assert deferral_chain({"a": "b", "b": "a"}) in (("a", "b"), ("b", "a"))  # cut, not looped
    assert deferral_chain({}) == ()


def test_assess_reports_depth_starvation_and_lease_over_cap() -> None:
    specs = [heavy("summary", 1), heavy("dream", 2), heavy("kb-sync", 3)]
    states = {"dream": deferred("dream", "summary", 2 * HOUR),
              "kb-sync": deferred("kb-sync", "summary", 60)}
    lease = LeaseView(lane="summary", token="t", fence=7, granted_at=NOW - 3 * HOUR,
                      started_at=NOW - 3 * HOUR)
    health = assess(specs, states, lease, NOW, Profile.LOCAL, starvation_threshold_s=HOUR,
                    hold_cap_s=1800)
    assert health.chain_depth == 1 and health.chain[0] in ("dream", "kb-sync")
    assert health.starving == ("dream",)
    assert health.lease_over_cap and health.lease is not None
    assert health.lease.held_s == pytest.approx(3 * HOUR) and health.lease.fence == 7
    assert health.posture is Posture.DEGRADED
    calm = assess(specs, {}, None, NOW, Profile.LOCAL, starvation_threshold_s=HOUR,
                  hold_cap_s=1800)
    assert calm.posture is Posture.HEALTHY and calm.chain_depth == 0
    assert assess(specs, {}, None, NOW, Profile.LOCAL, starvation_threshold_s=HOUR,
                  hold_cap_s=1800, unreadable=["dream"]).posture is Posture.UNKNOWN


def test_watchdog_latch_fires_once_and_clears() -> None:
    specs = [heavy("summary"), heavy("dream", 2)]
    stalled = assess(specs, {"dream": deferred("dream", "summary", 2 * HOUR)}, None, NOW,
                     Profile.LOCAL, starvation_threshold_s=HOUR, hold_cap_s=1800)
    fine = assess(specs, {}, None, NOW + 60, Profile.LOCAL, starvation_threshold_s=HOUR,
                  hold_cap_s=1800)
    latch, event = step(None, stalled)
    assert event == "fired" and latch.stall_since == NOW and latch.alarms == 1
    assert latch.reasons == ("starving:dream",)
    again, event = step(latch, stalled)
    assert event is None and again.stall_since == NOW and again.alarms == 1
    cleared, event = step(again, fine)
    assert event == "cleared" and cleared.cleared_at == NOW + 60 and not cleared.stalled
    assert cleared.posture == "healthy" and cleared.alarm_fired_at == NOW
    quiet, event = step(cleared, fine)
    assert event is None and isinstance(quiet, Latch)


# -- against Redis ---------------------------------------------------------------------------


def build(prefix: str, **overrides: object) -> Celery:
    app = make_app(prefix, **{"beat_max_loop_interval_s": 0.2, "beat_lock_ttl_s": 1.0,
                              **overrides})

    @app.task(shared=False, base=LaneTask, name="o.heavy-a", lane=Lane(cadence_s=60, order=1))
    def heavy_a() -> None: ...

    @app.task(shared=False, base=LaneTask, name="o.heavy-b", lane=Lane(cadence_s=60, order=2))
    def heavy_b() -> None: ...

    @app.task(shared=False, base=LaneTask, name="o.light",
              lane=Lane(cadence_s=60, kind=LaneKind.LIGHT))
    def light() -> None: ...

    return app


def cli(prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDPROJ_")}
    env.update({"SCHEDPROJ_REDIS_URL": REDIS_URL,
                "CELERY_BROKER_URL": BROKER_URL, "SCHEDPROJ_KEY_PREFIX": prefix,
                "PYTHONPATH": str(ROOT)})
    return subprocess.run([sys.executable, "-m", "schedproj.ops.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_status_reads_redis_only(key_prefix: str, broker: redis.Redis) -> None:
    sched = FairScheduler(app=build(key_prefix))
    sched.tick()
    sched.close()
    out = cli(key_prefix, "status", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    lanes = {lane["name"]: lane for lane in data["lanes"]}
    assert set(lanes) == {"o.heavy-a", "o.heavy-b", "o.light"}
    assert lanes["o.heavy-a"]["state"] == "running"
    assert lanes["o.heavy-b"]["deferral_reason"] == "heavy-maintenance-backpressure"
    assert data["lease"]["holder"] == "o.heavy-a" and data["lease"]["fence"] > 0
    assert data["chain_depth"] == 1 and data["beat"]["host"]
    table = cli(key_prefix, "status")
    assert table.returncode == 0 and "o.heavy-b" in table.stdout
    assert "lease: held by o.heavy-a" in table.stdout


def test_pause_resume_and_run_now(key_prefix: str, broker: redis.Redis,
                                  redis_client: redis.Redis) -> None:
    app = build(key_prefix)
    sched = FairScheduler(app=app)
    assert cli(key_prefix, "pause", "o.light").returncode == 0
    sched.tick()  # publishes the registry too
    assert broker.llen("light") == 0, "a paused lane was dispatched"
    assert cli(key_prefix, "pause", "no-such-lane").returncode != 0
    assert cli(key_prefix, "resume", "o.light").returncode == 0
    sched.tick()
    assert broker.llen("light") == 1
    # The light run finishes; the lane is not due again for 60 s -- unless asked to run now.
    keys = Keys(key_prefix)
    sched_rec = json.loads(redis_client.hget(keys.lanes, "o.light|sched"))
    redis_client.hset(keys.lanes, "o.light|run", json.dumps(
        {"v": 1, "last_run_at": NOW * 2000, "last_task_id": sched_rec["inflight_task_id"],
         "runs": 1}))
    sched.tick()
    assert broker.llen("light") == 1
    assert cli(key_prefix, "run", "o.light").returncode == 0
    sched.tick()
    assert broker.llen("light") == 2
    assert not redis_client.smembers(keys.run_now), "the run-now request was not consumed"
    sched.close()


def test_metrics_endpoint_exports_durable_figures(key_prefix: str,
                                                  broker: redis.Redis) -> None:
    port = free_port()
    sched = FairScheduler(app=build(key_prefix, metrics_port=port))
    sched.tick()
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'schedproj_lease_held_seconds{lane="o.heavy-a"}' in body
    assert 'schedproj_dispatches_total{lane="o.heavy-a",queue="heavy"} 1.0' in body
    assert 'schedproj_deferrals_total{reason="heavy-maintenance-backpressure"} 1.0' in body
    assert "schedproj_lease_acquisitions_total 1.0" in body
    assert "schedproj_deferral_chain_depth 1.0" in body
    assert 'schedproj_posture{posture="healthy"} 1.0' in body
    sched.close()


def test_metrics_bind_to_loopback_by_default() -> None:
    assert Settings.load().metrics_host == "127.0.0.1"
