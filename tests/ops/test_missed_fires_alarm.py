"""A heavy calendar lane that keeps missing its catch-up window is a starvation signal (issue
21, item 4): beat records the misses, and what the watchdog reads from Redis alone — the lane
registry beat published, the lane's record — turns the posture degraded with the reason
``missed-fires:<lane>``; status names the lane, and ``/metrics`` counts the misses and shows the
next fire. Beat in-process, real Redis, the real clock."""

from __future__ import annotations

import time

import redis
from celery import Celery
from prometheus_client import CollectorRegistry, generate_latest

from schedproj import Lane, LaneKind, LaneTask
from schedproj.core.health import Posture
from schedproj.core.records import Outcome, RunRecord, encode
from schedproj.core.schedules import CronFireTimes
from schedproj.on_celery.beat import FairScheduler
from schedproj.ops.watchdog import load_latch, step
from schedproj.store.protocol import Keys
from schedproj.telemetry.metrics import SchedprojCollector
from schedproj.telemetry.observe import observe
from schedproj.telemetry.status import as_json
from tests.conftest import make_app, sent

LANE = "m.minutely"
#: Every minute in Kolkata (UTC+5:30: its minutes are UTC's, its hours are not).
MINUTELY = CronFireTimes("* * * * *", "Asia/Kolkata")


def minutely_heavy_lane(app: Celery) -> None:
    @app.task(shared=False, base=LaneTask, name=LANE,
              lane=Lane(kind=LaneKind.HEAVY, schedule="* * * * *", timezone="Asia/Kolkata",
                        catchup_window_s=1))
    def minutely() -> None: ...


def away_from_the_minute() -> float:
    """Now, at least 2 s past a whole minute and 10 s before the next: the latest fire time is
    past its 1-second window, and the next does not come during the test."""
    while not 2.0 <= time.time() % 60 <= 50.0:
        time.sleep(0.2)
    return time.time()


def test_a_heavy_calendar_lane_missing_its_window_raises_the_alarm(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    keys = Keys(key_prefix)
    now = away_from_the_minute()
    # It last ran five minutes ago; the four or five fire times since are all past their
    # one-second window.
    last = now - 300
    redis_client.hset(keys.lanes, f"{LANE}|run", encode(RunRecord(
        last_run_at=last, runs=1, last_outcome=Outcome.COMPLETED)))
    sched = FairScheduler(app=make_app(key_prefix, minutely_heavy_lane,
                                       beat_max_loop_interval_s=0.2, beat_lock_ttl_s=5.0))
    try:
        sched.tick()
        sched.tick()   # counted once, not at every tick
        assert sent(broker, "heavy") == [], "a fire time past its window was run"
        latest = MINUTELY.previous_fire(now)
        expected = 0
        fire = MINUTELY.next_fire(last)
        while fire <= latest:
            expected, fire = expected + 1, MINUTELY.next_fire(fire)
        assert expected >= 4

        # What the watchdog reads: Redis alone (the registry beat published).
        obs = observe(redis_client, keys)
        health = obs.health()
        latch, event = step(load_latch(obs.watchdog), health)
        assert event == "fired" and latch.reasons == (f"missed-fires:{LANE}",)
        assert health.posture is Posture.DEGRADED and health.missing == (LANE,)
        status = as_json(obs, health)
        (row,) = [lane for lane in status["lanes"] if lane["name"] == LANE]
        assert row["schedule"] == "crontab * * * * * Asia/Kolkata"
        assert (row["missed"], row["missed_through"], row["missed_in_a_row"]) == (
            expected, latest, 2)
        assert row["next_fire_at"] == MINUTELY.next_fire(obs.now)
        assert row["next_fire_local"].endswith("+05:30")
        assert status["missing"] == [LANE]

        registry = CollectorRegistry()
        registry.register(SchedprojCollector(redis_client, keys, sched.settings,
                                             tuple(sched.engine.lanes.lanes.specs)))
        exported = generate_latest(registry).decode()
        assert f'schedproj_missed_runs_total{{lane="{LANE}"}} {float(expected)}' in exported
        assert f'schedproj_lane_next_fire_timestamp_seconds{{lane="{LANE}"}}' in exported
        assert 'schedproj_posture{posture="degraded"} 1.0' in exported
    finally:
        sched.close()
