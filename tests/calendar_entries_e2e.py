"""A Celery app for the end-to-end test of calendar entries under ``celery beat -S fair``
(tests/e2e/test_calendar_entries_live.py): its zone is New York, and Celery's
``beat_cron_starting_deadline`` is set.

* ``late``: ``crontab(minute="*")`` under that deadline: a fire time beat reaches more than
  :data:`DEADLINE_S` late is skipped and counted missed.
* ``kolkata``: ``crontab(minute="*", hour=E2E_KOLKATA_HOURS)`` in its own zone (Asia/Kolkata,
  through ``options={"schedproj": ...}``) with its own catch-up window of an hour: the hours
  are Kolkata's, so judged in New York's zone it would never fire.

Every run appends a journal record (entry, task id, when it ran) to a Redis list.
"""

from __future__ import annotations

import json
import os
import time

import redis
from celery import Celery, Task
from celery.schedules import crontab

import schedproj

PREFIX = os.environ.get("SCHEDPROJ_KEY_PREFIX", "schedproj")
RUNS = f"{PREFIX}:e2e:calendar-entry-runs"
DEADLINE_S = 5
OWN_ZONE = "Asia/Kolkata"


def schedules(kolkata_hours: str) -> dict[str, crontab]:
    """The entries' crontabs (the test builds the same to seed their states)."""
    return {"late": crontab(minute="*"), "kolkata": crontab(minute="*", hour=kolkata_hours)}


app = Celery("calendar-entries-e2e", set_as_current=False)
_crontabs = schedules(os.environ.get("E2E_KOLKATA_HOURS", "*"))
app.conf.update(timezone="America/New_York", enable_utc=True,
                beat_cron_starting_deadline=DEADLINE_S, beat_schedule={
                    "late": {"task": "cal.journal", "schedule": _crontabs["late"],
                             "args": ("late",)},
                    "kolkata": {"task": "cal.journal", "schedule": _crontabs["kolkata"],
                                "args": ("kolkata",),
                                "options": {"schedproj": {"timezone": OWN_ZONE,
                                                          "catchup_window_s": 3600}}},
                })

_client: redis.Redis | None = None


def client() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["SCHEDPROJ_REDIS_URL"], decode_responses=True)
    return _client


@app.task(name="cal.journal", bind=True, shared=False)
def journal(self: Task, entry: str) -> None:
    client().rpush(RUNS, json.dumps({"entry": entry, "task": self.request.id,
                                     "t": time.time()}))


schedproj.configure_app(app)
