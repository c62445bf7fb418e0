"""Where apps are made: the public ``configure_app`` and ``create_app``.

They sit above the Celery side because the starvation watchdog lane they may declare is an
operations lane (it reads telemetry and is a LaneTask); the Celery side's own configuration is
:func:`schedproj.on_celery.config.configure_app`, which knows nothing of the watchdog.
"""

from __future__ import annotations

from collections.abc import Iterable

from celery import Celery

from schedproj.core.pools import Pool
from schedproj.on_celery import config
from schedproj.ops.watchdog import register
from schedproj.settings import Settings


def configure_app(app: Celery, settings: Settings | None = None, *, watchdog: bool = False,
                  pools: Iterable[Pool] | None = None) -> Celery:
    """Fit ``app`` for lanes, keeping its own configuration (docs/adoption.md lists what is
    touched, where and why); with ``watchdog``, declare the starvation watchdog lane on it
    too; ``pools``: the pools its heavy lanes may name (``[Pool("gpu", slots=2)]``; the
    setting ``SCHEDPROJ_POOLS`` wins over a pool of the same name). A bad pool is a
    :class:`~schedproj.core.pools.PoolError` naming it and the fix."""
    if watchdog:
        register(app)
    return config.configure_app(app, settings, pools=pools)


def create_app(settings: Settings | None = None) -> Celery:
    """The ``schedproj.app`` Celery app: lanes come from ``SCHEDPROJ_LANE_MODULES``. It is
    schedproj's own app, with no tasks but lanes, so it also takes schedproj's app-wide
    defaults (default queue ``light``, JSON, no results, …: :func:`config.own_app_conf`)."""
    settings = settings or config.load_settings()
    app = Celery("schedproj", include=settings.lane_module_list)
    app.conf.update(config.own_app_conf(settings))
    # The starvation watchdog always runs alongside the user's lanes.
    return configure_app(app, settings, watchdog=True)
