"""A read's entries are asked Celery's ``is_due`` at the read's instant (``LoadedEntry.clock``):
the instant the plan records a run at, read once per read instead of once per entry; the
schedule objects the app and the runtime entries hold are never changed by it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from celery import Celery
from celery.schedules import schedule

from schedproj.on_celery.entries import LoadedEntry, fixed_clock


def entry(sched: schedule, app: Celery, *, own_object: bool) -> LoadedEntry:
    return LoadedEntry("e", "t", sched, source="code", tz=UTC,
                       app=app if own_object else None)


def test_is_due_is_asked_at_the_clock_given_and_the_schedule_is_left_alone() -> None:
    app = Celery("clock", set_as_current=False)
    app.conf.enable_utc, app.conf.timezone = True, "UTC"
    last = datetime(2030, 1, 1, tzinfo=UTC)
    for own_object in (True, False):
        sched = schedule(timedelta(minutes=10), app=app)
        e = entry(sched, app, own_object=own_object)
        # Nine minutes after the last run: not due, one minute left.
        e.clock = fixed_clock(last + timedelta(minutes=9))
        due, next_s = e.check(last.timestamp())
        assert (due, round(next_s)) == (False, 60)
        # Eleven minutes after: due (the real clock, years before, would say not due).
        e.clock = fixed_clock(last + timedelta(minutes=11))
        assert e.check(last.timestamp())[0] is True
        assert sched.nowfun is None and "tz" not in vars(sched)
        e.clock = None   # the real clock: 2030 has not come
        assert e.check(last.timestamp())[0] is False


def test_a_schedule_with_its_own_nowfun_keeps_it() -> None:
    app = Celery("clock", set_as_current=False)
    app.conf.enable_utc, app.conf.timezone = True, "UTC"
    last = datetime(2030, 1, 1, tzinfo=UTC)
    own = schedule(timedelta(minutes=10), app=app,
                   nowfun=lambda: last + timedelta(minutes=30))
    e = entry(own, app, own_object=True)
    e.clock = fixed_clock(last + timedelta(minutes=1))
    assert e.check(last.timestamp())[0] is True   # its own clock: 30 minutes on
