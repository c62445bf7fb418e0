"""End to end with real processes (issue 21): calendar entries under ``celery beat -S fair``.

A worker and a beat run :mod:`tests.calendar_entries_e2e`. Before beat starts, both crontab
entries are given a state whose last run was three minutes ago (a beat stopped that long):

* ``kolkata`` (its own zone and catch-up window) runs once for the fire times it missed
  (coalesced), then once at each minute boundary the test spans, on the minute;
* ``late`` (the app's ``beat_cron_starting_deadline`` of 5 s) does not run for them: each is
  counted missed (``missed|late``) — each fire time is run or missed, once;
* a runtime one-off (``schedproj entry add --at now+5s``) runs once at its instant, not again
  after beat restarts, and ``entry list`` shows it spent.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import redis

from schedproj.core.entries import EntryState
from schedproj.on_celery.entries import entry_key, schedule_key
from schedproj.store.protocol import CounterKind, Keys, counter_field
from tests import calendar_entries_e2e as cal
from tests.conftest import E2E_REDIS_URL
from tests.ops.test_cli import run
from tests.procs import FAST_SETTINGS, ROOT, Cluster, wait_for

pytestmark = [pytest.mark.e2e]

PREFIX = "schedproj"
KEYS = Keys(PREFIX)
#: From a fire time (or the one-off's instant) to the journal: beat's next look, the broker,
#: the worker, on a loaded two-core machine.
SLACK_S = 2.0


def runs(r: redis.Redis, entry: str) -> list[float]:
    return sorted(x["t"] for x in map(json.loads, r.lrange(cal.RUNS, 0, -1))
                  if x["entry"] == entry)


def boundaries(start: float, end: float) -> list[float]:
    return [float(b) for b in range(int(start // 60 + 1) * 60, int(end) + 1, 60)]


@pytest.mark.timeout(120)
def test_crontab_entries_coalesce_or_miss_and_a_one_off_runs_once(
        e2e_redis: redis.Redis, tmp_path: Path) -> None:
    r = e2e_redis
    hour = datetime.now(ZoneInfo(cal.OWN_ZONE)).hour
    hours = f"{hour},{(hour + 1) % 24}"
    settings = {k: v for k, v in FAST_SETTINGS.items() if k != "SCHEDPROJ_LANE_MODULES"}
    env = {**os.environ, **settings, "CELERY_BROKER_URL": E2E_REDIS_URL,
           "SCHEDPROJ_REDIS_URL": E2E_REDIS_URL, "SCHEDPROJ_KEY_PREFIX": PREFIX,
           "E2E_KOLKATA_HOURS": hours, "PYTHONPATH": str(ROOT)}
    c = Cluster(env=env, logdir=tmp_path, app="tests.calendar_entries_e2e")
    try:
        c.worker("worker1", "celery", concurrency=2)
        # Not within the late entry's deadline of a boundary, before it or after it (beat's
        # first look comes a few seconds after its start): its three are surely missed. A
        # boundary a second or two before beat's first look is still within the deadline,
        # so that fire time runs late instead (Celery's rule): two missed, not three.
        phase = time.time() % 60
        if phase > 60 - cal.DEADLINE_S - 5 or phase < cal.DEADLINE_S + 5:
            time.sleep((cal.DEADLINE_S + 6 - phase) % 60)
        seeded = time.time() - 180
        for name, sched in cal.schedules(hours).items():
            # The key beat writes: a crontab naming its own zone and window has them in it.
            own = cal.app.conf.beat_schedule[name].get("options", {}).get("schedproj")
            key = entry_key(schedule_key(sched), sched, own)
            r.hset(KEYS.entries, name, EntryState(seeded, 5, key).encode())
        beat = c.beat("beat1")
        started = time.time()
        at = datetime.now(UTC) + timedelta(seconds=5)
        out = run("entry", "add", "once", "cal.journal", "--at", at.isoformat(),
                  "--args", '["once"]', env=env)
        assert out.returncode == 0, out.stderr
        wait_for(lambda: runs(r, "once"), 5 + SLACK_S + 3, "the one-off ran")
        (ran,) = runs(r, "once")
        assert at.timestamp() <= ran <= at.timestamp() + SLACK_S
        # No minute boundary while no beat runs (it would be late by the restart, not by
        # beat): restart after it instead.
        if 60 - time.time() % 60 < 10:
            time.sleep(60 - time.time() % 60 + SLACK_S + 1)
        beat.signal(signal.SIGTERM)
        beat.popen.wait(timeout=10)
        restarted = c.beat("beat2")
        time.sleep(3)
        restarted.signal(signal.SIGTERM)
        restarted.popen.wait(timeout=10)
        end = time.time()
        assert len(runs(r, "once")) == 1, "the one-off ran again after a beat restart"
        listed = {row["name"]: row for row in json.loads(
            run("entry", "list", "--json", env=env).stdout)}
        assert listed["once"]["spent"] and listed["once"]["runs"] == 1

        kolkata, late = runs(r, "kolkata"), runs(r, "late")
        minutes = boundaries(started, end)
        # One coalesced run at start for the missed fire times, then one per boundary.
        assert kolkata and kolkata[0] <= started + SLACK_S + 3, kolkata
        assert len(kolkata) == 1 + len(minutes), (kolkata, minutes)
        for run_at, boundary in zip(kolkata[1:], minutes, strict=True):
            assert 0 <= run_at - boundary <= SLACK_S, (run_at, boundary)
        missed = int(r.hget(KEYS.counters, counter_field(CounterKind.MISSED, "late")) or 0)
        fires = boundaries(seeded, end)
        assert missed == len(fires) - len(minutes) >= 2, (missed, fires, minutes)
        assert len(late) == len(minutes), (late, minutes)
        assert all(0 <= t - b <= SLACK_S for t, b in zip(late, minutes, strict=True))
        ids = Counter(x["task"] for x in map(json.loads, r.lrange(cal.RUNS, 0, -1)))
        assert max(ids.values()) == 1, "a message ran twice"
        assert "missed" in beat.text() and "Traceback" not in beat.text() + restarted.text()
    finally:
        c.stop_all()
