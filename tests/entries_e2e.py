"""A Celery app of the kind a team adopting schedproj already has, for the end-to-end test of
its ``beat_schedule`` under ``celery beat -S fair`` (tests/e2e/test_beat_schedule_entries.py).

Its own app, configured in code: a time zone that is not UTC, ordinary tasks (no LaneTask) on
its default queue, and a ``beat_schedule`` with every kind of schedule; beside them one heavy
and one light lane. Every entry run appends a journal record (entry, task id, when the worker
received it, the app time zone's wall clock) to a Redis list that outlives the processes; the
lanes append theirs to another.

``E2E_CRON_HOURS`` (set by the test at its start) is the hour field of the ``this-hour``
crontab: hours in the app's zone, so it fires only if the schedule is judged in that zone.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from datetime import datetime, timedelta

import redis
from celery import Celery, Task
from celery.exceptions import ImproperlyConfigured
from celery.schedules import crontab, solar

import schedproj
from schedproj import Lane, LaneKind, LaneTask

TIMEZONE = "America/New_York"
PREFIX = os.environ.get("SCHEDPROJ_KEY_PREFIX", "schedproj")
#: Redis lists of the runs: entries' and lanes'.
ENTRY_RUNS = f"{PREFIX}:e2e:entry-runs"
LANE_RUNS = f"{PREFIX}:e2e:lane-runs"
#: Interval entries: a number of seconds and a timedelta.
NUMBER_S = 2.0
DELTA_S = 3.0
#: Where and what the solar entry waits for (it may or may not fall inside a test's minutes).
SOLAR = ("sunset", 40.7, -74.0)

# Not the current app: the test imports this module for its names, and later apps of that
# process must not inherit it.
app = Celery("entries-e2e", set_as_current=False)
app.conf.update(timezone=TIMEZONE, enable_utc=True)

beat_schedule: dict[str, dict[str, object]] = {
    "number": {"task": "shop.journal", "schedule": NUMBER_S, "args": ("number",)},
    "delta": {"task": "shop.journal", "schedule": timedelta(seconds=DELTA_S),
              "args": ("delta",)},
    "every-minute": {"task": "shop.journal", "schedule": crontab(minute="*"),
                     "args": ("every-minute",)},
    "this-hour": {"task": "shop.journal",
                  "schedule": crontab(minute="*", hour=os.environ.get("E2E_CRON_HOURS", "*")),
                  "args": ("this-hour",)},
}
# Celery's solar needs the ephem package: without it, no solar entry.
with contextlib.suppress(ImproperlyConfigured):
    beat_schedule["solar"] = {"task": "shop.journal", "schedule": solar(*SOLAR),
                              "args": ("solar",)}
app.conf.beat_schedule = beat_schedule

_client: redis.Redis | None = None


def client() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["SCHEDPROJ_REDIS_URL"], decode_responses=True)
    return _client


@app.task(name="shop.journal", bind=True, shared=False)
def journal(self: Task, entry: str) -> None:
    """An ordinary task: says when it ran, on the worker's clock and in the app's zone."""
    now = time.time()
    client().rpush(ENTRY_RUNS, json.dumps({
        "entry": entry, "task": self.request.id, "t": now,
        "wall": datetime.fromtimestamp(now, app.timezone).isoformat()}))


def _lane_ran(lane: str, start: float, fence: int) -> None:
    client().rpush(LANE_RUNS, json.dumps({"lane": lane, "start": start, "end": time.time(),
                                          "fence": fence}))


@app.task(base=LaneTask, bind=True, shared=False, name="shop.heavy",
          lane=Lane(cadence_s=2, kind=LaneKind.HEAVY))
def heavy(self: LaneTask) -> None:
    start = time.time()
    time.sleep(0.3)
    _lane_ran("shop.heavy", start, self.fence)


@app.task(base=LaneTask, bind=True, shared=False, name="shop.light",
          lane=Lane(cadence_s=1, kind=LaneKind.LIGHT))
def light(self: LaneTask) -> None:
    start = time.time()
    time.sleep(0.05)
    _lane_ran("shop.light", start, self.fence)


schedproj.configure_app(app)
