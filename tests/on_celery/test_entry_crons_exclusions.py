"""Sentry Crons is told to leave out the ``beat_schedule`` entries it cannot monitor (intervals
that are not whole minutes), read from the specs as beat reads them (numbers, ``timedelta``,
``schedule`` objects, ``relative``), without making an entry per spec."""

from __future__ import annotations

from datetime import timedelta

from celery import Celery
from celery.schedules import crontab, schedule

from schedproj.on_celery.entries import beat_schedule_table, entry_crons_exclusions


def test_the_entries_sentry_cannot_monitor_are_excluded_by_name() -> None:
    app = Celery("exclusions", set_as_current=False)
    app.conf.beat_schedule = {
        "number": {"task": "t", "schedule": 30},
        "minutes": {"task": "t", "schedule": timedelta(minutes=2)},
        "object": {"task": "t", "schedule": schedule(timedelta(seconds=90))},
        "relative": {"task": "t", "schedule": 600, "relative": True},
        "cron": {"task": "t", "schedule": crontab(minute="*/5")},
        "a.b": {"task": "t", "schedule": 0.5},
    }
    table = beat_schedule_table(app)
    assert entry_crons_exclusions(table.schedules()) == [r"^a\.b$", "^number$", "^object$"]
    # The same schedules the entries are judged by.
    assert [(n, type(s)) for n, s in table.schedules()] == [
        (n, type(table[n].schedule)) for n in table]
