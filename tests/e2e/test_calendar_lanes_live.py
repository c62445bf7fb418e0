"""Calendar lanes end to end (issue 21): real ``celery beat -S fair`` and workers, a heavy and
a light lane on ``crontab(minute="*")`` in America/St_Johns (not the host's zone) beside a
cadence lane. They run on the minute, once per minute; a beat stopped for three minutes runs
each once when it comes back (coalesced) or, with ``catchup_window_s=30``, records the
missed fire times and waits for the next one."""

from __future__ import annotations

import json
import math
import signal
import time
from pathlib import Path

import pytest
import redis

from schedproj.store.protocol import Keys
from tests.e2e.test_heavy_and_light_lanes import PREFIX, cluster_factory, make_cluster, r, runs
from tests.procs import Cluster, wait_for
from tests.rabbitmq import Broker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]
__all__ = ["cluster_factory", "r"]   # fixtures shared with the heavy-and-light tests

#: Fire times are beat's business, not the broker's: one broker (Redis) is enough here.
ONE_BROKER = pytest.mark.parametrize("e2e_broker", ["redis"], indirect=True)
HEAVY, LIGHT, CADENCE = "e2e.minutely-heavy", "e2e.minutely-light", "e2e.every-2s"
CALENDAR = (HEAVY, LIGHT)
KEYS = Keys(PREFIX)
#: How late after its fire time a run may start here: beat looks every 0.5 s at most (it
#: sleeps until the fire time), the heavy lane is granted the lease and fetched by its worker.
START_SLACK_S = 3.0


def starts(r: redis.Redis, lane: str) -> list[float]:
    return sorted(x["start"] for x in runs(r) if x["lane"] == lane)


def boundary_after(t: float) -> float:
    return math.floor(t / 60) * 60 + 60


def wait_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


def sched(r: redis.Redis, lane: str) -> dict:
    raw = r.hget(KEYS.lanes, f"{lane}|sched")
    return json.loads(raw) if raw else {}


def start_all(c: Cluster) -> None:
    c.worker("light", "light", concurrency=2)
    c.worker("heavy", "heavy")
    c.beat("beat1")


def first_minute_run(r: redis.Redis) -> float:
    """Wait for a run of both calendar lanes at one fire time; return that fire time."""
    def both_at_a_boundary() -> float | None:
        for fire in sorted({math.floor(s / 60) * 60 for s in starts(r, HEAVY)}):
            if all(any(fire <= s <= fire + START_SLACK_S for s in starts(r, lane))
                   for lane in CALENDAR):
                return fire
        return None
    wait_for(lambda: both_at_a_boundary() is not None, 75, "a run on the minute")
    fire = both_at_a_boundary()
    assert fire is not None
    return fire


@ONE_BROKER
def test_calendar_lanes_run_on_the_minute_once_per_minute(
        r: redis.Redis, e2e_broker: Broker, tmp_path: Path,
        cluster_factory: list[Cluster]) -> None:
    c = make_cluster(tmp_path, "calendar", e2e_broker)
    cluster_factory.append(c)
    start_all(c)
    # Never run: each has missed its previous fire time and runs at once (coalesced).
    wait_for(lambda: all(starts(r, lane) for lane in CALENDAR), 20, "first calendar runs")
    begun = min(starts(r, HEAVY)[0], starts(r, LIGHT)[0])
    fire = boundary_after(begun)
    wait_until(fire + START_SLACK_S + 1)
    for lane in CALENDAR:
        got = starts(r, lane)
        assert len(got) == 2, (lane, got, fire)
        assert fire <= got[1] <= fire + START_SLACK_S, (lane, got[1] - fire)
    # How many cadence runs fit so far depends on where in the minute the test began (at :58
    # the boundary comes 2 s in): wait for five, which a lane every 2 s makes in about 10 s.
    wait_for(lambda: len(starts(r, CADENCE)) >= 5, 20, "the cadence lane kept running beside them")
    sched_heavy = sched(r, HEAVY)
    assert sched_heavy.get("missed") is None   # nothing was missed


def _stopped_three_minutes(r: redis.Redis, c: Cluster, extra_s: float) -> tuple[float, float]:
    """Run to a fire time, stop beat for the next three, start it ``extra_s`` after the third.
    Returns (the last fire time run before the stop, when beat was started again)."""
    fire = first_minute_run(r)
    wait_for(lambda: all(len([s for s in starts(r, lane) if s >= fire]) == 1
                         for lane in CALENDAR), 10, "both ran")
    beat = c.procs[-1]
    beat.signal(signal.SIGTERM)
    beat.popen.wait(timeout=10)
    wait_until(fire + 180 + extra_s)
    back = time.time()
    c.beat("beat2")
    return fire, back


@pytest.mark.slow
@ONE_BROKER
def test_a_beat_down_three_minutes_runs_each_calendar_lane_once_when_back(
        r: redis.Redis, e2e_broker: Broker, tmp_path: Path,
        cluster_factory: list[Cluster]) -> None:
    c = make_cluster(tmp_path, "calendar", e2e_broker)
    cluster_factory.append(c)
    start_all(c)
    fire, back = _stopped_three_minutes(r, c, extra_s=15)
    wait_until(boundary_after(back) + START_SLACK_S + 1)
    for lane in CALENDAR:
        after = [s for s in starts(r, lane) if s > fire + 1]
        # One run for the three fire times missed, at the restart; then the next fire time.
        assert len(after) == 2, (lane, [s - fire for s in after])
        assert back <= after[0] <= back + 15, (lane, after[0] - back)
        assert boundary_after(back) <= after[1] <= boundary_after(back) + START_SLACK_S
        assert sched(r, lane).get("missed") is None


@pytest.mark.slow
@ONE_BROKER
def test_with_a_catchup_window_the_missed_fire_times_are_recorded_not_run(
        r: redis.Redis, e2e_broker: Broker, tmp_path: Path,
        cluster_factory: list[Cluster]) -> None:
    c = make_cluster(tmp_path, "calendar", e2e_broker, E2E_CATCHUP_WINDOW_S="30")
    cluster_factory.append(c)
    start_all(c)
    fire, back = _stopped_three_minutes(r, c, extra_s=40)
    next_fire = boundary_after(back)
    wait_until(next_fire - 2)
    for lane in CALENDAR:
        assert [s for s in starts(r, lane) if s > fire + 1] == [], lane
    wait_until(next_fire + START_SLACK_S + 1)
    beat_log = c.procs[-1].text()
    counters = r.hgetall(KEYS.counters)
    for lane in CALENDAR:
        after = [s for s in starts(r, lane) if s > fire + 1]
        assert len(after) == 1 and next_fire <= after[0] <= next_fire + START_SLACK_S
        record = sched(r, lane)
        assert record["missed"] >= 3 and record["missed_through"] == fire + 180, record
        assert int(counters[f"missed|{lane}"]) == record["missed"]
        assert f"lane {lane} missed 3 fire time(s)" in beat_log
