"""Fit a Celery app for schedproj: JSON only, a single-slot heavy queue, lane routing, checks.

``schedproj.app`` is built with :func:`create_app`; an existing app adopts schedproj with
:func:`configure_app`.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from celery import Celery, signals

from schedproj import defaults
from schedproj.errors import ConfigurationError, SchedprojError
from schedproj.lanes import LaneKind
from schedproj.registry import LaneSet, build_lane_set, lane_tasks, queue_for
from schedproj.sentry_setup import init_sentry
from schedproj.settings import Settings

logger = logging.getLogger(__name__)


def route_lane(name: str, args: Any, kwargs: Any, options: Any, task: Any = None,
               **kw: Any) -> dict[str, str] | None:
    """Celery router: heavy lanes to queue ``heavy``, light lanes to ``light``."""
    lane = getattr(task, "lane", None)
    kind = getattr(lane, "kind", None)
    if isinstance(kind, LaneKind):
        return {"queue": queue_for(kind)}
    return None


def configure_app(app: Celery, settings: Settings | None = None, *,
                  watchdog: bool = False) -> Celery:
    """Apply schedproj's settings to ``app``; with ``watchdog``, declare the starvation
    watchdog lane on it too."""
    settings = settings or Settings.load()
    if watchdog:
        from schedproj.watchdog import register

        register(app)
    app.schedproj_settings = settings
    routes = app.conf.task_routes
    routes = list(routes) if isinstance(routes, list | tuple) else ([routes] if routes else [])
    app.conf.update(
        broker_url=settings.broker_url,
        # JSON only on the wire: a pickle payload is refused by every consumer.
        task_serializer="json",
        result_serializer="json",
        event_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_ignore_result=True,
        # A heavy worker holds one message at a time and acks it only when the run ends; a
        # worker killed mid-run gets its message redelivered, which then refuses its stale lease.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_transport_options={"visibility_timeout": int(settings.visibility_timeout_s)},
        task_routes=[*routes, route_lane],
        task_create_missing_queues=True,
        task_default_queue=defaults.LIGHT_QUEUE,
        worker_send_task_events=True,
        task_send_sent_event=True,
        beat_scheduler="schedproj.scheduler:FairScheduler",
        beat_max_loop_interval=settings.beat_max_loop_interval_s,
        broker_connection_retry_on_startup=True,
    )
    return app


def create_app(settings: Settings | None = None) -> Celery:
    """The ``schedproj.app`` Celery app: lanes come from ``SCHEDPROJ_LANE_MODULES``."""
    settings = settings or Settings.load()
    app = Celery("schedproj", include=settings.lane_module_list)
    # The starvation watchdog always runs alongside the user's lanes.
    return configure_app(app, settings, watchdog=True)


def lane_set_for(app: Celery) -> LaneSet:
    """Validate and return the app's lanes, applying default time limits (cached)."""
    cached = getattr(app, "schedproj_lanes", None)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    settings: Settings = app.schedproj_settings
    try:
        app.loader.import_default_modules()
    except ImportError as exc:
        raise ConfigurationError(
            f"cannot import lane module {exc.name!r} ({exc}). Fix: check SCHEDPROJ_LANE_MODULES "
            f"(now {settings.lane_modules!r}) or the app's include list, and that the module is "
            "on PYTHONPATH"
        ) from None
    tasks = app.tasks

    def routed(task_name: str) -> str | None:
        route = app.amqp.router.route({}, task_name, (), {}, tasks[task_name])
        queue = route.get("queue")
        name = getattr(queue, "name", queue)
        return None if name is None else str(name)

    lanes = build_lane_set(tasks, routed, settings.cadence_scale)
    for task_name, task, lane in lane_tasks(tasks):
        _apply_time_limits(task_name, task, lane.kind, settings)
    app.schedproj_lanes = lanes
    return lanes


def _apply_time_limits(task_name: str, task: Any, kind: LaneKind, settings: Settings) -> None:
    from schedproj.errors import LaneDeclarationError

    if kind is LaneKind.HEAVY:
        limit = task.time_limit or settings.heavy_time_limit_s
        if limit >= settings.max_hold_s:
            raise LaneDeclarationError(
                task_name, f"time_limit {limit}s is not below the maximum lease hold "
                f"{settings.max_hold_s}s, so a run could outlive its lease",
                "lower the task's time_limit or raise SCHEDPROJ_MAX_HOLD_S",
            )
        if limit >= settings.visibility_timeout_s:
            raise LaneDeclarationError(
                task_name, f"time_limit {limit}s is not below the broker visibility timeout "
                f"{settings.visibility_timeout_s}s, so a long run would be redelivered while "
                "it still runs", "lower the task's time_limit or raise "
                "SCHEDPROJ_VISIBILITY_TIMEOUT_S",
            )
    else:
        limit = task.time_limit or settings.light_time_limit_s
    task.time_limit = limit
    if not task.soft_time_limit:
        # The soft limit raises inside the run so its outcome is recorded and the lease released.
        task.soft_time_limit = max(limit * 0.9, limit - 60.0)


def validate_or_exit(app: Celery, process: str) -> LaneSet:
    """Validate at process start; print the problem and exit instead of a deep traceback."""
    try:
        return lane_set_for(app)
    except SchedprojError as exc:
        sys.stderr.write(f"schedproj: cannot start {process}: {exc}\n")
        raise SystemExit(2) from None


@signals.worker_init.connect  # type: ignore[untyped-decorator]
def _check_worker(sender: Any = None, **kwargs: Any) -> None:
    app = getattr(sender, "app", None)
    if app is None or getattr(app, "schedproj_settings", None) is None:
        return
    validate_or_exit(app, "worker")
    init_sentry(app.schedproj_settings, "worker")


@signals.worker_ready.connect  # type: ignore[untyped-decorator]
def _report_worker(sender: Any = None, **kwargs: Any) -> None:
    """Said once logging is set up (worker_init runs before Celery configures it)."""
    app = getattr(sender, "app", None)
    if app is None or getattr(app, "schedproj_settings", None) is None:
        return
    lanes = lane_set_for(app)
    queues = {q.name for q in app.amqp.queues.consume_from.values()} \
        if app.amqp.queues.consume_from else set()
    concurrency = getattr(getattr(sender, "controller", None), "concurrency", None)
    if defaults.HEAVY_QUEUE in queues and concurrency and concurrency > 1:
        logger.warning("this worker consumes queue %r with concurrency %s; use -c 1 (the lease "
                       "keeps heavy runs exclusive anyway, extra slots only sit idle)",
                       defaults.HEAVY_QUEUE, concurrency)
    logger.info("schedproj worker: %d lanes (%s)", len(lanes.specs), ", ".join(lanes.names))


@signals.worker_process_init.connect  # type: ignore[untyped-decorator]
def _init_pool_process(sender: Any = None, **kwargs: Any) -> None:
    """Prefork children run the lanes: each initialises sentry-sdk for itself."""
    from celery import current_app

    settings = getattr(current_app, "schedproj_settings", None)
    if settings is not None:
        init_sentry(settings, "worker")
