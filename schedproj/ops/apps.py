"""Where apps are made: the public ``configure_app`` and ``create_app``.

They sit above the Celery side because the starvation watchdog lane they may declare is an
operations lane (it reads telemetry and is a LaneTask); the Celery side's own configuration is
:func:`schedproj.on_celery.config.configure_app`, which knows nothing of the watchdog.
"""

from __future__ import annotations

from celery import Celery

from schedproj.on_celery import config
from schedproj.ops.watchdog import register
from schedproj.settings import Settings


def configure_app(app: Celery, settings: Settings | None = None, *,
                  watchdog: bool = False) -> Celery:
    """Apply schedproj's settings to ``app``; with ``watchdog``, declare the starvation
    watchdog lane on it too."""
    if watchdog:
        register(app)
    return config.configure_app(app, settings)


def create_app(settings: Settings | None = None) -> Celery:
    """The ``schedproj.app`` Celery app: lanes come from ``SCHEDPROJ_LANE_MODULES``."""
    settings = settings or config.load_settings()
    app = Celery("schedproj", include=settings.lane_module_list)
    # The starvation watchdog always runs alongside the user's lanes.
    return configure_app(app, settings, watchdog=True)
