"""Fit a Celery app for schedproj: JSON only, a single-slot heavy queue, lane routing, checks.

``schedproj.app`` is built with :func:`create_app`; an existing app adopts schedproj with
:func:`configure_app`.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

import redis
from celery import Celery, signals
from kombu.transport import redis as kombu_redis
from pydantic import ValidationError

from schedproj.core import defaults
from schedproj.core.errors import ConfigurationError, LaneDeclarationError, SchedprojError
from schedproj.core.lanes import LaneKind, queue_for
from schedproj.core.laneset import LaneSet, build_lane_set, lane_tasks
from schedproj.core.pools import DEFAULT_POOL, Pool, PoolError, declare_pools
from schedproj.on_celery.calendars import app_timezone, celery_fire_times
from schedproj.settings import Settings, consumer_timeout_problem, explain
from schedproj.store.connection import connect, describe_failure, mask
from schedproj.telemetry.sentry import init_sentry

logger = logging.getLogger(__name__)


class _BrokerChannel(kombu_redis.Channel):
    """kombu's Redis channel, failing like a lost connection once its connection is gone
    (installed by :func:`use_broker_channel`).

    On a broker connection loss Celery's consumer first collects the connection (the default
    channel's close fails half-way while Redis is still down, and the transport's ``client`` is
    cleared), then closes it again: the retried close restores the unacknowledged message of
    a running ``acks_late`` task, which asks the dropped transport for its host and raised
    ``AttributeError: 'NoneType' object has no attribute 'hostname'`` — not a connection
    error, so it escaped kombu's and Celery's error handling and the worker exited
    ("Unrecoverable error"). kombu 5.7.0 and Celery 5.7.0, the newest releases, still do this.
    Raising a connection error instead lets the close, and the later acknowledgement of the
    running task, fail the way every other use of a lost connection does: logged, and the
    worker reconnects. An unacknowledged message left in Redis is redelivered after the
    visibility timeout, and the lane protocol refuses it (not the lane's current dispatch).
    """

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        transport = self.connection
        if transport is None or transport.client is None:
            raise redis.ConnectionError("the broker connection of this channel was closed")
        params: dict[str, Any] = super()._connparams(  # type: ignore[no-untyped-call]
            asynchronous=asynchronous)
        return params


def use_broker_channel() -> None:
    """Give kombu's Redis transport (``redis://`` and ``rediss://``) :class:`_BrokerChannel`.

    The channel class is swapped, not the transport: an app's ``broker_transport`` stays unset,
    so the worker banner, logs and broker errors show the app's own URL (password masked), not
    a class path. It applies to every kombu Redis connection of the process, and changes only
    what a closed connection raises. Sentinel keeps its own channel class.
    """
    kombu_redis.Transport.Channel = _BrokerChannel


def route_lane(name: str, args: Any, kwargs: Any, options: Any, task: Any = None,
               **kw: Any) -> dict[str, str] | None:
    """Celery router: heavy lanes to their pool's queue (``heavy`` for the default pool),
    light lanes to ``light``; any other task is left to the app's own routes and default
    queue."""
    lane = getattr(task, "lane", None)
    kind = getattr(lane, "kind", None)
    if isinstance(kind, LaneKind):
        return {"queue": queue_for(kind, getattr(lane, "pool", None))}
    return None


#: Celery's default ``beat_scheduler``: an app still on it gets schedproj's (lanes need it).
CELERY_DEFAULT_SCHEDULER = "celery.beat:PersistentScheduler"
FAIR_SCHEDULER = "schedproj.scheduler:FairScheduler"
#: Content types that are not JSON-safe: a lane worker accepting one breaks promise 9.
UNSAFE_CONTENT = frozenset({"pickle", "application/x-python-serialize"})


def own_app_conf(settings: Settings) -> dict[str, Any]:
    """What ``schedproj.app`` sets app-wide on its own app (it has no tasks but lanes), beyond
    :func:`configure_app`; an adopted app keeps its own values of these (docs/adoption.md)."""
    return {
        "task_serializer": "json", "result_serializer": "json", "event_serializer": "json",
        "accept_content": ["json"], "result_accept_content": ["json"],
        "task_ignore_result": True, "task_acks_late": True, "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1, "task_create_missing_queues": True,
        "task_default_queue": defaults.LIGHT_QUEUE, "worker_send_task_events": True,
        "task_send_sent_event": True, "beat_scheduler": FAIR_SCHEDULER,
        "beat_max_loop_interval": settings.beat_max_loop_interval_s,
        "broker_connection_retry_on_startup": True,
    }


def configure_app(app: Celery, settings: Settings | None = None, *,
                  pools: Iterable[Pool] | None = None) -> Celery:
    """Fit ``app`` for lanes, keeping its own configuration (the Celery side only; the public
    :func:`schedproj.configure_app` also declares the watchdog lane when asked). ``pools``
    are the pools declared in code (``SCHEDPROJ_POOLS`` wins over one of the same name):
    checked here, and again with the lanes when a process starts.

    Lanes get their options per task (:class:`LaneTask`: JSON, acks late, reject on a lost
    worker, no result; :func:`route_lane`: their queue). App-wide, only what has no per-task
    form is touched, each listed with its reason in docs/adoption.md."""
    settings = settings_for_app(app, settings or load_settings())
    app.schedproj_settings = settings
    if pools is not None:
        app.schedproj_code_pools = tuple(pools)
    pool_table = app_pools(app)  # a declaration error fails here, where pools are declared
    conf = app.conf
    if "broker_url" in settings.model_fields_set or not conf.broker_url:
        conf.broker_url = settings.broker_url  # the environment's, or the app names none
    # The app's content types, kept; stated as lists (results: the accept_content Celery
    # reads them with when unset) so the JSON-only checks read one explicit list each.
    accepted = list(conf.accept_content)
    conf.accept_content = accepted
    conf.result_accept_content = list(conf.result_accept_content or accepted)
    routes = conf.task_routes
    routes = list(routes) if isinstance(routes, list | tuple) else ([routes] if routes else [])
    if route_lane not in routes:
        # The app's routes first: one that sends a lane elsewhere is refused at start.
        conf.task_routes = [*routes, route_lane]
    _merge_visibility_timeout(app, settings)
    _adopt_scheduler(app)
    _check_queues(app, pool_table)
    _use_broker_ssl(app, settings)
    _warn_duplicate_lanes(app)
    use_broker_channel()
    return app


def settings_for_app(app: Celery, settings: Settings) -> Settings:
    """``settings`` as they apply to ``app``: its broker when no variable names one (the
    environment overrides only when set), and its visibility timeout when longer than ours."""
    updates: dict[str, Any] = {}
    broker = app.conf.broker_url
    if ("broker_url" not in settings.model_fields_set and isinstance(broker, str) and broker
            and broker != settings.broker_url):
        updates["broker_url"] = broker
    theirs = _app_visibility_timeout(app)
    if theirs is not None and theirs > settings.visibility_timeout_s:
        updates["visibility_timeout_s"] = theirs
    if not updates:
        return settings
    try:
        return type(settings)(**{**settings.model_dump(), **updates})
    except ValidationError as exc:
        raise ConfigurationError(
            f"the app's own settings (broker {mask(str(broker))} from app.conf.broker_url, as "
            "no CELERY_BROKER_URL is set) do not fit schedproj:\n  "
            + "\n  ".join(explain(exc, "SCHEDPROJ_"))
        ) from None


def _app_visibility_timeout(app: Celery) -> float | None:
    value = (app.conf.broker_transport_options or {}).get("visibility_timeout")
    return None if value is None else float(value)


def _merge_visibility_timeout(app: Celery, settings: Settings) -> None:
    """Only ``visibility_timeout`` of the transport options is ours, and only raised: a
    shorter one would redeliver a heavy run while it still runs; the user's other options
    (``global_keyprefix``, Sentinel's ``master_name`` …) are kept."""
    if settings.broker_is_amqp:
        return  # RabbitMQ redelivers on a lost channel, not after a timeout
    ours = int(settings.visibility_timeout_s)
    theirs = _app_visibility_timeout(app)
    if theirs is not None and theirs >= ours:
        return
    if theirs is not None:
        logger.warning(
            "broker_transport_options['visibility_timeout']=%gs is shorter than "
            "SCHEDPROJ_VISIBILITY_TIMEOUT_S=%ss, which heavy lanes need (a heavy run up to "
            "its time limit %gs must not be redelivered while it runs): raised to %ss for the "
            "app. Fix: set it to at least %s in broker_transport_options",
            theirs, ours, settings.heavy_time_limit_s, ours, ours)
    app.conf.broker_transport_options = {
        **(app.conf.broker_transport_options or {}), "visibility_timeout": ours}


def _adopt_scheduler(app: Celery) -> None:
    """Lanes are dispatched only by the FairScheduler: an app still on Celery's default gets
    it; an app that chose another scheduler keeps it, and is told how to run lanes."""
    chosen = app.conf.beat_scheduler
    if chosen in (CELERY_DEFAULT_SCHEDULER, FAIR_SCHEDULER):
        app.conf.beat_scheduler = FAIR_SCHEDULER
        return
    logger.warning("beat_scheduler is %r (the app's own): kept, but only schedproj's "
                   "FairScheduler dispatches lanes. Fix: run the lanes' beat with "
                   "`celery -A <app> beat -S fair`", chosen)


def _check_queues(app: Celery, pools: Iterable[str] = ()) -> None:
    """The app's queue settings must leave the lane queues to lanes (the light one, the
    heavy one and one per pool), and let them exist."""
    conf = app.conf
    if conf.task_default_queue == defaults.HEAVY_QUEUE:
        raise ConfigurationError(
            f"task_default_queue is {defaults.HEAVY_QUEUE!r}, the heavy lanes' queue: every "
            "task without a route would wait behind heavy runs on the single-slot heavy "
            "worker. Fix: give the app another default queue (Celery's is 'celery')")
    declared = {str(queue.name) for queue in conf.task_queues or ()}
    missing = sorted({defaults.HEAVY_QUEUE, defaults.LIGHT_QUEUE, *pools} - declared)
    if missing and not conf.task_create_missing_queues:
        queues = " and ".join(f"Queue({name!r})" for name in missing)
        raise ConfigurationError(
            f"task_create_missing_queues is off and task_queues does not declare {missing}, "
            f"so lanes could not be sent. Fix: add {queues} to task_queues, or turn "
            "task_create_missing_queues on")


def app_pools(app: Celery) -> dict[str, Pool]:
    """The app's pools by name: the default pool, those declared in code
    (``configure_app(app, pools=...)``), then ``SCHEDPROJ_POOLS`` (which wins). A pool may not
    take the name of a queue the app's own tasks use (its default queue, a queue its
    ``task_routes`` name): its workers would run them as pool runs, or they would wait
    behind the pool's."""
    settings: Settings = app.schedproj_settings
    table = declare_pools(getattr(app, "schedproj_code_pools", ()), settings.declared_pools)
    theirs = {str(app.conf.task_default_queue)} | _routed_queues(app.conf.task_routes)
    for name in sorted(set(table) - {DEFAULT_POOL}):
        if name in theirs:
            raise PoolError(name, f"the app's own tasks use a queue named {name!r} (its "
                            "task_default_queue or task_routes), and a pool's lanes run on the "
                            "queue of the pool's name",
                            "name the pool otherwise (Pool('gpu', slots=2) / SCHEDPROJ_POOLS="
                            "'gpu=2') and its lanes Lane(pool='gpu')")
    return table


def _routed_queues(routes: Any) -> set[str]:
    """The queue names an app's ``task_routes`` maps (dict form; a router function's
    answers cannot be listed)."""
    found: set[str] = set()
    for table in (routes if isinstance(routes, list | tuple) else [routes]):
        if isinstance(table, dict):
            for route in table.values():
                queue = route.get("queue") if isinstance(route, dict) else None
                if queue is not None:
                    found.add(str(getattr(queue, "name", queue)))
    return found


def _use_broker_ssl(app: Celery, settings: Settings) -> None:
    broker_ssl = settings.broker_ssl()
    if broker_ssl is None:
        return
    # rediss:// broker: verify the server as redis-py does for state (kombu alone would not
    # verify at all), with SCHEDPROJ_REDIS_SSL_* (the URL's ssl_* query wins); an app's own
    # TLS options are kept.
    if not app.conf.broker_use_ssl:
        app.conf.broker_use_ssl = broker_ssl
    if not app.conf.redis_backend_use_ssl:
        app.conf.redis_backend_use_ssl = broker_ssl


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

    lanes = build_lane_set(tasks, routed, settings.cadence_scale,
                           timezone=app_timezone(app.conf), converter=celery_fire_times,
                           pools=app_pools(app))
    for task_name, task, lane in lane_tasks(tasks):
        check_lane_protocol(lane.name or task_name, task_name, task)
        check_lane_options(lane.name or task_name, task)
        _apply_time_limits(task_name, task, lane.kind, settings)
    app.schedproj_lanes = lanes
    return lanes


def check_lane_protocol(name: str, task_name: str, task: Any) -> None:
    """A lane's task must carry out the lane protocol, which lives in :class:`LaneTask`:
    check the lease token before running and renew and release it (heavy), keep the in-flight
    mark and record the outcome (every lane). A plain task would be sent the lease and run
    without it, leaving the lease granted-but-not-started and re-sent until the deadline."""
    from schedproj.on_celery.task import LaneTask

    base_fix = (f"declare it with base=schedproj.LaneTask, e.g. @app.task(base=LaneTask, "
                f"name={task_name!r}, lane=Lane(...))")
    if not isinstance(task, LaneTask):
        raise LaneDeclarationError(
            name, f"its task {task_name!r} is a {type(task).__name__} without the lane protocol "
            f"(it is not a schedproj.LaneTask), so it would run without the heavy lease or an "
            f"in-flight mark", base_fix)
    call = type(task).__call__
    if call is not LaneTask.__call__ and "super" not in getattr(
            getattr(call, "__code__", None), "co_names", ("super",)):
        raise LaneDeclarationError(
            name, f"its task class {type(task).__name__} overrides __call__ without calling "
            "super().__call__, which carries out the lease protocol",
            "call super().__call__(*args, **kwargs) from the override, or remove it")


#: The per-task options every lane keeps (set by :class:`LaneTask`), and why.
LANE_OPTIONS: dict[str, tuple[Any, str]] = {
    "serializer": ("json", "JSON only on the wire"),
    "acks_late": (True, "a worker killed mid-run must leave the message to be redelivered"),
    "reject_on_worker_lost": (True, "a run whose worker died is redelivered, not acked"),
}


def check_lane_options(name: str, task: Any) -> None:
    """A lane task declared with an option that breaks a lane guarantee is refused."""
    for option, (needed, why) in LANE_OPTIONS.items():
        value = getattr(task, option, None)
        if value != needed:
            raise LaneDeclarationError(
                name, f"its task sets {option}={value!r}, but every lane needs "
                f"{option}={needed!r} ({why})", f"remove {option}= from the lane's @app.task")


def _apply_time_limits(task_name: str, task: Any, kind: LaneKind, settings: Settings) -> None:
    if kind is LaneKind.HEAVY:
        limit = task.time_limit or settings.heavy_time_limit_s
        if limit >= settings.max_hold_s:
            raise LaneDeclarationError(
                task_name, f"time_limit {limit}s is not below the maximum lease hold "
                f"{settings.max_hold_s}s, so a run could outlive its lease",
                "lower the task's time_limit or raise SCHEDPROJ_MAX_HOLD_S",
            )
        if not settings.broker_is_amqp and limit >= settings.visibility_timeout_s:
            raise LaneDeclarationError(
                task_name, f"time_limit {limit}s is not below the broker visibility timeout "
                f"{settings.visibility_timeout_s}s, so a long run would be redelivered while "
                "it still runs", "lower the task's time_limit or raise "
                "SCHEDPROJ_VISIBILITY_TIMEOUT_S",
            )
    else:
        limit = task.time_limit or settings.light_time_limit_s
    if not settings.consumer_timeout_allows(limit):
        problem, _, fix = consumer_timeout_problem(
            f"time_limit {limit:g}s", settings.rabbitmq_consumer_timeout_s,
            "lower the task's time_limit").partition("; ")
        raise LaneDeclarationError(task_name, problem, fix)
    task.time_limit = limit
    if not task.soft_time_limit:
        # The soft limit raises inside the run so its outcome is recorded and the lease released.
        task.soft_time_limit = max(limit * 0.9, limit - 60.0)


def say_failure(message: str) -> None:
    """One failure line for the operator: at ERROR through Celery's logging once it has taken
    over stderr (it would log a plain write at WARNING), else straight to stderr."""
    from celery.utils.log import LoggingProxy

    if isinstance(sys.stderr, LoggingProxy):
        logger.error("%s", message)
    else:
        sys.stderr.write(f"{message}\n")
        sys.stderr.flush()


def validate_or_exit(app: Celery, process: str) -> LaneSet:
    """Validate at process start; print the problem and exit instead of a deep traceback."""
    try:
        if process == "beat":
            _check_beat(app)
        return lane_set_for(app)
    except SchedprojError as exc:
        say_failure(f"schedproj: cannot start {process}: {exc}")
        raise SystemExit(2) from None


def _check_beat(app: Celery) -> None:
    if app.conf.task_always_eager:
        raise ConfigurationError(
            "task_always_eager is set (the app's own setting), so beat would run every lane "
            "inside itself, without a worker, the heavy queue or a lease. Fix: unset "
            "task_always_eager for the beat (keep it for tests that call tasks directly)")


def consumed_queues(app: Celery) -> set[str]:
    """The queues this process's worker consumes (all the app's, without ``-Q``)."""
    queues = app.amqp.queues.consume_from or app.amqp.queues
    return {str(queue.name) for queue in queues.values()}


def check_lane_worker(app: Celery, worker: Any) -> None:
    """Settings only a worker has, checked where they matter: a worker consuming a lane queue
    must refuse pickle; one consuming ``heavy`` takes one message at a time."""
    queues = consumed_queues(app)
    heavy_queues = {defaults.HEAVY_QUEUE, *app_pools(app)}  # the default pool's, each pool's
    lane_queues = sorted(queues & {*heavy_queues, defaults.LIGHT_QUEUE})
    unsafe = sorted(UNSAFE_CONTENT & set(app.conf.accept_content or ()))
    if lane_queues and unsafe:
        raise ConfigurationError(
            f"accept_content {list(app.conf.accept_content)} accepts {unsafe[0]!r} on a worker "
            f"consuming lane queue(s) {lane_queues}: lanes take JSON only on the wire (a pickle "
            "message runs code on load). Fix: accept_content=['json'] for this worker, or "
            "serve the lane queues from a worker that accepts JSON only")
    multiplier = getattr(worker, "prefetch_multiplier", 1)
    served = sorted(queues & heavy_queues)
    if served and multiplier > 1:
        # Per worker, not app-wide: a heavy worker holding more than one message would keep
        # the next (a light lane's, when it consumes both; a pool's other granted slot) waiting
        # behind a heavy run, its grant lapsing.
        logger.warning("worker_prefetch_multiplier is %s but this worker consumes queue %r, "
                       "whose workers take one message at a time: set to 1 for this worker "
                       "only. Fix: start heavy workers with --prefetch-multiplier 1",
                       multiplier, served[0] if len(served) == 1 else served)
        worker.prefetch_multiplier = 1


def _under_celery_command() -> bool:
    """True while Celery's own command line (``celery -A ... beat``) is loading the app."""
    import click

    ctx = click.get_current_context(silent=True)
    return ctx is not None and getattr(ctx.find_root().command, "name", None) == "celery"


_ENV_NAME = re.compile(r"\b(SCHEDPROJ_[A-Z0-9_]+|CELERY_BROKER_URL)\b")


def settings_fix(message: str) -> str:
    """The fix for a settings error: each variable it names, with its default."""
    fixes = []
    for env in dict.fromkeys(_ENV_NAME.findall(message)):
        field = "broker_url" if env == "CELERY_BROKER_URL" else \
            env.removeprefix("SCHEDPROJ_").lower()
        info = Settings.model_fields.get(field)
        if info is None or (env in os.environ and not _valid_without(env)):
            continue  # unknown, or its default would be refused as well
        default = info.default
        fixes.append(f"unset {env} (default {default!r})" if default is not None
                     else f"correct or unset {env}")
    if not fixes:
        return "Fix: correct the variables named above (`schedproj lanes` checks them)"
    return "Fix: " + "; ".join(fixes) + ", or set a valid value"


def _valid_without(env: str) -> bool:
    """Whether the settings load once ``env`` is unset (so "unset it" is a fix that works)."""
    saved = os.environ.pop(env)
    try:
        Settings.load()
    except ConfigurationError:
        return False
    finally:
        os.environ[env] = saved
    return True


def load_settings() -> Settings:
    """:meth:`Settings.load`; under Celery's command line, a bad setting prints its problem and
    the fix and exits 2, instead of Celery's "Unable to load celery application" traceback."""
    try:
        return Settings.load()
    except ConfigurationError as exc:
        if not _under_celery_command():
            raise
        say_failure(f"schedproj: {exc}\n  {settings_fix(str(exc))}")
        raise SystemExit(2) from None


def no_lanes_message(app: Celery) -> str:
    """Why an app has no lanes, and the fix that applies to this app."""
    if app.main == "schedproj":
        return ("no lanes declared. Fix: set SCHEDPROJ_LANE_MODULES (or `schedproj up "
                "--lanes`) to the modules that declare them")
    return (f"app {app.main!r} declares no lanes. Fix: declare tasks with "
            "base=schedproj.LaneTask and lane=Lane(...) in a module the app imports "
            f"(Celery({app.main!r}, include=[...]) or app.autodiscover_tasks()); "
            "SCHEDPROJ_LANE_MODULES and --lanes are read only by schedproj.app")


def _state_setting(settings: Settings) -> str:
    """The variable that names the state Redis."""
    return "SCHEDPROJ_REDIS_URL" if settings.redis_url else "CELERY_BROKER_URL"


def _unreachable(app: Celery, settings: Settings) -> tuple[str, bool] | None:
    """What cannot be reached, in one line (URL masked, the setting that names it, the fix)
    and whether it is a configuration problem (see :func:`describe_failure`); or None."""
    import kombu.exceptions

    state = settings.state_redis_url
    try:
        client = connect(state, socket_timeout_s=5.0, tls=settings.redis_tls)
        try:
            client.ping()
        finally:
            client.close()
    except (redis.RedisError, OSError, ConfigurationError) as exc:
        return describe_failure(state, exc, _state_setting(settings))
    if settings.redis_url in (None, settings.broker_url):
        return None
    with app.connection_for_write() as conn:
        # The transport's own errors too: py-amqp's AccessRefused (a wrong RabbitMQ password)
        # is none of the others.
        errors = (kombu.exceptions.OperationalError, redis.RedisError, OSError,
                  *conn.connection_errors, *conn.channel_errors)
        try:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0)
        except errors as exc:
            line, fatal = describe_failure(settings.broker_url, exc, "CELERY_BROKER_URL")
            return line.replace("Redis at", "the broker at", 1), fatal
    return None


def exit_if_misconfigured(app: Celery, settings: Settings, process: str) -> None:
    """At start: wrong credentials, an untrusted certificate or TLS on one side only cannot
    cure themselves, so say it in one line and exit 2 (an unreachable server is waited for)."""
    problem = _unreachable(app, settings)
    if problem is not None and problem[1]:
        say_failure(f"schedproj: cannot start {process}: {problem[0]}")
        raise SystemExit(2)


def wait_for_redis(app: Celery, settings: Settings, process: str, *, retry_s: float = 2.0,
                   say_every_s: float = 60.0) -> None:
    """Block until the state Redis and the broker answer, saying so in one line (again once
    a minute) instead of a connection traceback per attempt; exit at once on a configuration
    problem (see :func:`exit_if_misconfigured`)."""
    said_at: float | None = None
    problem = _unreachable(app, settings)
    if problem is None:
        return
    # Celery's own SIGTERM handler would ask the scheduler being built here to sync.
    previous = signal.signal(signal.SIGTERM, _exit_quietly) \
        if threading.current_thread() is threading.main_thread() else None
    try:
        while problem is not None:
            line, fatal = problem
            if fatal:
                say_failure(f"schedproj: cannot start {process}: {line}")
                raise SystemExit(2)
            if said_at is None or time.monotonic() - said_at >= say_every_s:
                logger.error("%s cannot reach %s. Fix: start the server there or point the "
                             "setting at one that runs; retrying every %gs", process, line,
                             retry_s)
                said_at = time.monotonic()
            time.sleep(retry_s)
            problem = _unreachable(app, settings)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    logger.info("%s: Redis answers now", process)


def _exit_quietly(*_: Any) -> None:
    raise SystemExit(0)


def _warn_duplicate_lanes(app: Celery) -> None:
    """Celery keeps the first task registered under a name and silently drops the next; for
    lanes that loses a lane, so say so when two declarations collide on a task name."""
    if getattr(app, "_schedproj_duplicates_checked", False):
        return
    original = app._task_from_fun

    def task_from_fun(fun: Any, name: str | None = None, **options: Any) -> Any:
        name = name or app.gen_task_name(fun.__name__, fun.__module__)
        existing = app._tasks.get(name) if name in app._tasks else None
        if existing is not None and (options.get("lane") is not None
                                     or getattr(existing, "lane", None) is not None):
            _say_duplicate(name, existing, fun)
        return original(fun, name=name, **options)

    app._task_from_fun = task_from_fun
    app._schedproj_duplicates_checked = True


def _where(fun: Any) -> str:
    return f"{getattr(fun, '__module__', '?')}.{getattr(fun, '__qualname__', '?')}"


def _say_duplicate(name: str, existing: Any, fun: Any) -> None:
    first = getattr(existing, "__wrapped__", None) or getattr(existing, "run", None)
    first = getattr(first, "__func__", first)
    if first is None or _where(first) == _where(fun):
        return  # the same declaration met again (a shared task on another app, a reload)
    logger.warning("lane task name %r is declared twice, by %s and by %s: Celery keeps only "
                   "the first, so the second never runs. Fix: give each task its own name=",
                   name, _where(first), _where(fun))


@signals.worker_init.connect  # type: ignore[untyped-decorator]
def _check_worker(sender: Any = None, **kwargs: Any) -> None:
    app = getattr(sender, "app", None)
    if app is None or getattr(app, "schedproj_settings", None) is None:
        return
    validate_or_exit(app, "worker")
    try:
        check_lane_worker(app, sender)
    except ConfigurationError as exc:
        say_failure(f"schedproj: cannot start worker: {exc}")
        raise SystemExit(2) from None
    init_sentry(app.schedproj_settings, "worker")
    exit_if_misconfigured(app, app.schedproj_settings, "worker")


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
