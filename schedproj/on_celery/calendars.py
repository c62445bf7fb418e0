"""Celery's schedules as the pure core's fire times, and the app's time zone.

A lane's ``schedule=`` may be a cron expression or a Celery ``crontab`` (read by
:mod:`schedproj.core.calendar`, whose DST rules are exact), or any other Celery schedule —
``solar``, an interval ``schedule``, a custom class. Those are asked their own
``remaining_estimate``: their fire times are theirs (a ``solar`` event is astronomical, so
DST does not touch it).
"""

from __future__ import annotations

import math
import os
import time
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from schedproj.core.calendar import CalendarError
from schedproj.core.schedules import FireTimes, fire_times

#: How many fire times a previous-fire search walks before it gives up (a schedule that
#: fires a thousand times between two of beat's looks is a cadence, not a calendar).
_WALK_MAX = 1000


class EstimatedFireTimes:
    """Fire times of a Celery schedule that only knows ``remaining_estimate(last_run_at)``:
    the next fire after an instant is that instant's estimate; the previous one is found by
    walking forward from far enough back."""

    __slots__ = ("schedule", "text", "zone")

    def __init__(self, schedule: Any, zone: str) -> None:
        self.schedule, self.zone = schedule, ZoneInfo(zone)
        self.text = f"celery {schedule!r}"

    def next_fire(self, after: float) -> float:
        when = datetime.fromtimestamp(after, self.zone)
        # The estimate is relative to the schedule's own clock (now): add it to ours.
        fire = time.time() + self.schedule.remaining_estimate(when).total_seconds()
        # Celery may answer "now" for a fire time already passed; keep "strictly after".
        return fire if fire > after else math.nextafter(after, math.inf)

    def previous_fire(self, at: float) -> float:
        span = 60.0
        while span < 4e8:   # back up to about 12 years
            fire = self.next_fire(at - span)
            if fire <= at:
                for _ in range(_WALK_MAX):
                    following = self.next_fire(fire)
                    if following > at:
                        return fire
                    fire = following
                return fire
            span *= 4
        return -math.inf

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EstimatedFireTimes) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


def celery_fire_times(schedule: Any, zone: str) -> FireTimes:
    """The converter beat gives the lane set: the core's for cron expressions and
    ``crontab``, Celery's own estimate for every other Celery schedule."""
    try:
        return fire_times(schedule, zone)
    except CalendarError:
        if callable(getattr(schedule, "remaining_estimate", None)):
            return EstimatedFireTimes(schedule, zone)
        raise


def app_timezone(conf: Any) -> str:
    """The IANA zone calendar lanes default to: the app's ``timezone``; without one, UTC
    when ``enable_utc`` is on (Celery's default), else the host's zone (``TZ``, then
    ``/etc/localtime``), else UTC."""
    zone = conf.get("timezone") if hasattr(conf, "get") else getattr(conf, "timezone", None)
    if zone:
        return str(zone)
    utc = conf.get("enable_utc", True) if hasattr(conf, "get") else True
    if utc:
        return "UTC"
    local = os.environ.get("TZ", "").lstrip(":")
    if not local:
        try:
            target = os.path.realpath("/etc/localtime")
            local = target.split("zoneinfo/", 1)[1] if "zoneinfo/" in target else ""
        except OSError:
            local = ""
    return local or "UTC"


__all__ = ["EstimatedFireTimes", "app_timezone", "celery_fire_times"]
