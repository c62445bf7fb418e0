"""End to end with real processes: an app's own ``beat_schedule`` under ``celery beat -S fair``
while the active beat is SIGKILLed (issue 20, Proof).

The app (:mod:`tests.entries_e2e`) has a number, a ``timedelta``, two ``crontab`` and a
``solar`` entry, all ordinary tasks that journal when they ran, and a heavy and a light lane.
A heavy worker, a light worker (also on the app's default queue) and two beats run it; the
active beat is SIGKILLed and the standby takes over. From the journal of runs:

* no due time runs twice: distinct task ids; interval runs at least one interval apart;
  one crontab run per minute; the count beat stored equals the runs the workers journaled;
* no due time is missed beyond the failover: interval gaps at most one interval plus a tick,
  the gap around a kill at most that plus the measured takeover (itself within the beat lock
  TTL); a run at every minute boundary, within seconds of :00, or just after the takeover
  when the boundary fell while no beat was active;
* crontab runs on the minute in the app's time zone (America/New_York): ``this-hour`` fires
  only in the hour the test started (or the next) there, which in UTC or the machine's zone is
  another hour;
* the lanes keep running beside the entries.

The solar entry's due computation is tested in tests/on_celery/test_schedule_entries.py; here
it only has to load and keep its count honest.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import redis

from schedproj.core.entries import EntryState
from schedproj.on_celery.beat import STANDBY_POLL_S
from schedproj.store.protocol import Keys
from tests import entries_e2e as shop
from tests import rabbitmq
from tests.conftest import E2E_REDIS_URL
from tests.procs import FAST_SETTINGS, ROOT, Cluster, Proc, wait_for

pytestmark = [pytest.mark.e2e]

PREFIX = "schedproj"
KEYS = Keys(PREFIX)
ZONE = ZoneInfo(shop.TIMEZONE)
LOCK_TTL_S = float(FAST_SETTINGS["SCHEDPROJ_BEAT_LOCK_TTL_S"])
LOOP_S = float(FAST_SETTINGS["SCHEDPROJ_BEAT_MAX_LOOP_INTERVAL_S"])
#: A standby takes over once the lock expires, at its next poll.
TAKEOVER_BOUND_S = LOCK_TTL_S + min(STANDBY_POLL_S, LOOP_S) + 1.0
#: From due to journaled: beat's next look (at most a loop interval), the broker, the worker,
#: on a loaded two-core machine.
SLACK_S = 1.5
#: How much earlier than its due time a run may be journaled (received-time jitter: the run
#: before it reached its worker late). A duplicate shows as a gap far shorter than this allows.
JITTER_S = 0.4
INTERVALS = {"number": shop.NUMBER_S, "delta": shop.DELTA_S}
CRONTABS = ("every-minute", "this-hour")


@dataclass(frozen=True)
class Span:
    """How a run goes: the first minute boundary it plans around comes at least ``settle_s``
    after the first beat is active. ``kill_after_boundary``: SIGKILL the active beat right
    after that boundary's crontab runs (a takeover must not send them again), and the next
    beat again just before the following boundary; without it, only the latter kill. The run
    ends ``tail_s`` after the last boundary it plans for."""

    settle_s: float
    kill_after_boundary: bool
    tail_s: float


#: Two kills (a takeover just after a crontab run, one just before a minute boundary) and a
#: normal minute after them: about three minutes.
FULL = Span(settle_s=10.0, kill_after_boundary=True, tail_s=65.0)
#: One kill just before a minute boundary, ended once its delayed run is in: about a minute.
SHORT = Span(settle_s=10.0, kill_after_boundary=False, tail_s=8.0)


@dataclass(frozen=True)
class Kill:
    at: float
    taken_over_at: float


def entry_runs(r: redis.Redis) -> list[dict]:
    return [json.loads(x) for x in r.lrange(shop.ENTRY_RUNS, 0, -1)]


def lane_runs(r: redis.Redis, lane: str) -> list[dict]:
    return sorted((x for x in map(json.loads, r.lrange(shop.LANE_RUNS, 0, -1))
                   if x["lane"] == lane), key=lambda x: x["start"])


def active_pid(r: redis.Redis) -> int:
    return int(r.hget(KEYS.beat_info, "pid") or 0)


def next_boundary(t: float) -> float:
    """The first minute boundary after ``t`` (the app zone's minutes are UTC's: its offset is
    whole hours)."""
    return (int(t) // 60 + 1) * 60.0


def kill_active(r: redis.Redis, beats: list[Proc]) -> Kill:
    pid = active_pid(r)
    (victim,) = [b for b in beats if b.popen.pid == pid and b.alive()]
    victim.signal(signal.SIGKILL)
    killed_at = time.time()
    wait_for(lambda: active_pid(r) not in (0, pid), TAKEOVER_BOUND_S + 5, "a standby took over")
    kill = Kill(killed_at, time.time())
    assert kill.taken_over_at - kill.at <= TAKEOVER_BOUND_S, kill
    return kill


def sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


def failover_excess(a: float, b: float, kills: list[Kill]) -> float:
    """How much longer than usual the gap (a, b) may be: the takeover of a kill inside it."""
    return sum(k.taken_over_at - k.at for k in kills if a <= k.at <= b)


def check_intervals(runs: list[dict], start: float, end: float, kills: list[Kill]) -> None:
    for name, every in INTERVALS.items():
        times = sorted(x["t"] for x in runs if x["entry"] == name)
        for a, b in itertools.pairwise(times):
            assert b - a >= every - JITTER_S, f"{name}: two runs for one due time: {a}, {b}"
        for a, b in itertools.pairwise([start, *times, end]):
            bound = every + SLACK_S + failover_excess(a, b, kills)
            assert b - a <= bound, f"{name}: a due time missed between {a} and {b} " \
                                   f"({b - a:.2f}s > {bound:.2f}s; kills {kills})"


def check_crontabs(runs: list[dict], start: float, end: float, kills: list[Kill],
                   hours: set[int]) -> None:
    # Every boundary after the beats settled must have run; one within a second of the first
    # beat's start may not (Celery's rule: a new entry counts from when beat first saw it).
    boundaries = [b for b in range(int(next_boundary(start + 1)), int(end) + 1, 60)]
    assert boundaries, (start, end)
    for name in CRONTABS:
        mine = sorted((x for x in runs if x["entry"] == name), key=lambda x: x["t"])
        minutes = [datetime.fromisoformat(x["wall"]) for x in mine]
        assert all(w.utcoffset() == datetime.fromtimestamp(x["t"], ZONE).utcoffset()
                   for w, x in zip(minutes, mine, strict=True)), "not the app's zone"
        ran_at = [w.replace(second=0, microsecond=0).timestamp() for w in minutes]
        assert len(set(ran_at)) == len(ran_at), f"{name}: two runs in one minute: {mine}"
        assert [b for b in ran_at if b >= start + 1] == boundaries, \
            f"{name}: boundaries {boundaries}, runs {mine}"
        for boundary, run, wall in zip(ran_at, mine, minutes, strict=True):
            late = run["t"] - boundary
            # A boundary that fell while no beat was active runs when the next one takes over.
            excess = max((k.taken_over_at - boundary for k in kills
                          if k.at <= boundary <= k.taken_over_at), default=0.0)
            assert 0 <= late <= SLACK_S + excess, f"{name}: {late:.2f}s after :00: {run}"
            assert wall.hour in hours or name != "this-hour", (wall, hours)


def check_lanes(r: redis.Redis, start: float, end: float, kills: list[Kill]) -> None:
    for lane, cadence, run_s in (("shop.light", 1.0, 0.05), ("shop.heavy", 2.0, 0.3)):
        starts = [x["start"] for x in lane_runs(r, lane)]
        last_takeover = max(k.taken_over_at for k in kills)
        assert any(s > last_takeover for s in starts), f"{lane} stopped after the failover"
        for a, b in itertools.pairwise([start, *(s for s in starts if s >= start), end]):
            bound = cadence + run_s + SLACK_S + failover_excess(a, b, kills)
            assert b - a <= bound, f"{lane}: no run between {a} and {b} ({b - a:.2f}s)"
    heavy = lane_runs(r, "shop.heavy")
    for before, after in itertools.pairwise(heavy):
        assert after["start"] >= before["end"] and after["fence"] > before["fence"], \
            (before, after)


def check_counts(r: redis.Redis) -> None:
    """What beat stored (one count per claimed due time) against what the workers journaled:
    a due time claimed and never sent, or sent twice, tells here. Waited for, since the last
    messages may still be on their way."""
    def stored() -> dict[str, int]:
        return {str(name): EntryState.decode(str(raw), str(name)).total_run_count
                for name, raw in r.hgetall(KEYS.entries).items()}

    def journaled() -> dict[str, int]:
        return {name: n for name, n in Counter(x["entry"] for x in entry_runs(r)).items()}

    def agree() -> bool:
        return {n: c for n, c in stored().items() if c} == journaled()

    try:
        wait_for(agree, 10, "the journal to match beat's counts")
    except TimeoutError:
        pytest.fail(f"beat's counts {stored()} != runs journaled {journaled()}")
    assert set(stored()) == set(shop.app.conf.beat_schedule), stored()


@pytest.mark.timeout(330)
@pytest.mark.parametrize(("e2e_broker", "span"), [
    # The default run: one kill before a minute on Redis (under a minute). The long form (a
    # kill right after a minute's runs, then one before the next) and RabbitMQ's short form
    # (about a minute: it kept the default run near its 20-minute budget) are slow; the
    # RabbitMQ path of lanes stays in the default run (tests/e2e/test_heavy_and_light_lanes.py).
    pytest.param("redis", SHORT, id="redis-short"),
    pytest.param("redis", FULL, id="redis", marks=pytest.mark.slow),
    pytest.param("amqp", SHORT, id="amqp-short", marks=pytest.mark.slow),
    pytest.param("amqp", FULL, id="amqp", marks=pytest.mark.slow),
], indirect=["e2e_broker"])
def test_each_due_time_runs_once_across_a_killed_beat(
        e2e_redis: redis.Redis, e2e_broker: rabbitmq.Broker, span: Span,
        tmp_path: Path) -> None:
    r = e2e_redis
    if e2e_broker.kind == "amqp":
        rabbitmq.empty_queues(e2e_broker.url, ("celery",))
    # The hour the test starts in, in the app's zone, and the next (the run may cross it).
    hour = datetime.now(ZONE).hour
    hours = {hour, (hour + 1) % 24}
    env = {**os.environ, **FAST_SETTINGS, **e2e_broker.env,
           "SCHEDPROJ_REDIS_URL": E2E_REDIS_URL, "SCHEDPROJ_KEY_PREFIX": PREFIX,
           "E2E_CRON_HOURS": ",".join(map(str, sorted(hours))), "PYTHONPATH": str(ROOT)}
    c = Cluster(env=env, logdir=tmp_path, app="tests.entries_e2e")
    kills: list[Kill] = []
    try:
        c.worker("heavy1", "heavy")
        c.worker("light1", "light,celery", concurrency=3)
        beats = [c.beat("beat1"), c.beat("beat2", wait_active=False)]
        start = time.time()
        boundary = next_boundary(start + span.settle_s)
        if span.kill_after_boundary:
            sleep_until(boundary)
            wait_for(lambda: {x["entry"] for x in entry_runs(r) if x["t"] >= boundary}
                     >= set(CRONTABS), SLACK_S + 1, "the crontab runs of the boundary")
            kills.append(kill_active(r, beats))
            beats.append(c.beat("beat3", wait_active=False))
            boundary += 60
        # Just before a boundary: it falls while no beat is active.
        sleep_until(boundary - 1.5)
        kills.append(kill_active(r, beats))
        sleep_until(boundary + span.tail_s)
        (survivor,) = [b for b in beats if b.alive()]
        survivor.signal(signal.SIGTERM)
        end = time.time()
        survivor.popen.wait(timeout=10)
        check_counts(r)
        runs = entry_runs(r)
        ids = Counter(x["task"] for x in runs)
        assert not [t for t, n in ids.items() if n > 1], "a message ran twice"
        check_intervals(runs, start, end, kills)
        check_crontabs(runs, start, end, kills, hours)
        check_lanes(r, start, end, kills)
        assert "Traceback" not in "".join(b.text() for b in beats)
    finally:
        c.stop_all()
