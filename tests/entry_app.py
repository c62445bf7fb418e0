"""An adopted app with one lane and a beat_schedule, for command-line tests (``-A``)."""

from __future__ import annotations

import os

from celery import Celery
from celery.schedules import crontab

from schedproj import Lane, LaneKind, LaneTask, configure_app

app = Celery("entry-app", broker=os.environ.get("SCHEDPROJ_REDIS_URL",
                                                "redis://127.0.0.1:6379/14"))
app.conf.timezone = "Europe/Berlin"
app.conf.beat_schedule = {
    "morning-report": {"task": "entry_app.report", "schedule": crontab(hour=9, minute=0)},
    "ping": {"task": "entry_app.report", "schedule": 30.0},
}
configure_app(app)


@app.task(name="entry_app.report")
def report() -> None: ...


@app.task(base=LaneTask, name="entry_app.light", lane=Lane(cadence_s=60, kind=LaneKind.LIGHT))
def light() -> None: ...
