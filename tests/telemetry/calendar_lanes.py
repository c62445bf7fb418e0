"""Lanes for ``schedproj lanes --lanes tests.telemetry.calendar_lanes``: a heavy calendar lane
in Berlin with a catch-up window, a light one on a custom Celery schedule (fire times only its
own code computes), and a cadence lane."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from celery.schedules import schedule

from schedproj import Lane, LaneKind, LaneTask


class EveryFiveMinutes(schedule):  # type: ignore[misc]
    """A custom Celery schedule: schedproj asks its own ``remaining_estimate``."""

    def __init__(self) -> None:
        super().__init__(timedelta(minutes=5))

    def __repr__(self) -> str:
        return "<every five minutes>"


@shared_task(base=LaneTask, bind=True, name="cal.backup",
             lane=Lane(kind=LaneKind.HEAVY, order=10, schedule="30 2 * * *",
                       timezone="Europe/Berlin", catchup_window_s=600))
def backup(self: LaneTask) -> None:
    """The nightly backup at 02:30 Berlin time."""


@shared_task(base=LaneTask, bind=True, name="cal.poll",
             lane=Lane(kind=LaneKind.LIGHT, order=20, schedule=EveryFiveMinutes()))
def poll(self: LaneTask) -> None:
    """A light lane on a custom schedule."""


@shared_task(base=LaneTask, bind=True, name="cal.sweep",
             lane=Lane(kind=LaneKind.LIGHT, order=30, cadence_s=600))
def sweep(self: LaneTask) -> None:
    """A cadence lane beside them."""
