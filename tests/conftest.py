"""Shared fixtures: real Redis (never mocked), unique key prefixes, per-test settings.

Tests that need Redis skip on a developer machine without one, and fail under CI (``CI`` set),
where ``.ci/run`` starts Redis first.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from celery import Celery

from schedproj import Settings, configure_app
from schedproj.store.connection import connect, mask
from schedproj.store.lane_store import LaneStore
from schedproj.store.protocol import Keys
from tests import rabbitmq

#: Integration tests share this database and keep apart by key prefix (no FLUSHDB).
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/14")
#: End-to-end tests own this database (its queues carry the public names heavy/light) and
#: flush it before each test.
E2E_REDIS_URL = os.environ.get("TEST_E2E_REDIS_URL", "redis://127.0.0.1:6379/15")


def _database_beside(url: str) -> str:
    """The same server's database just below ``url``'s (13 beside 14; 1 beside 0)."""
    parts = urlsplit(url)
    db = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{db - 1 if db > 0 else db + 1}"))


#: Apps from :func:`make_app` send here: a database of the integration Redis of its own, so a
#: test reads an in-process beat's messages back from its ``heavy`` and ``light`` lists.
BROKER_URL = _database_beside(REDIS_URL)


def _redis_or_skip(url: str) -> redis.Redis:
    client = redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"Redis is required under CI and does not answer at {url}: {exc}")
        pytest.skip(f"no Redis at {url}")
    return client


@pytest.fixture(autouse=True)
def _environment_restored() -> Iterator[None]:
    """Put ``os.environ`` back after every test: in-process CLI calls (``--lanes`` sets
    ``SCHEDPROJ_LANE_MODULES`` for ``schedproj.app``, as it must in a real process) would
    otherwise leak lanes into the apps later tests build."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def _no_shared_rem_lanes_in_later_apps() -> Iterator[None]:
    """The REM lanes are Celery shared tasks: once a test imports them in-process (the
    simulator's forensic scenario reads their declarations), Celery adds them to every app
    created afterwards, where they would win other tests' ticks (backup is priority-0). After
    each test, forget those registrations (tests that run the REM lanes do so in child
    processes). They are kept in ``FORGOTTEN_REM_REGISTRATIONS`` for the tests that read the
    declarations (``rem_lanes_resolvable``)."""
    yield
    from celery import _state

    for callback in list(_state._on_app_finalizers):
        cells = getattr(callback, "__closure__", None) or ()
        for cell in cells:
            fun = cell.cell_contents
            if getattr(fun, "__module__", "") == "schedproj.rem.lanes":
                _state._on_app_finalizers.discard(callback)
                FORGOTTEN_REM_REGISTRATIONS.add(callback)
                break


#: The REM lanes' app-finalize registrations the fixture above took away.
FORGOTTEN_REM_REGISTRATIONS: set[Callable[..., object]] = set()


@pytest.fixture(scope="module")
def rem_lanes_resolvable() -> Iterator[None]:
    """Make the REM lanes' shared-task proxies resolve, whatever earlier tests did: a shared
    task resolves against Celery's current app, which lacks them once an earlier test imported
    the lanes (the fixture above then forgot their registration) and later tests made new
    apps. Give their registrations back and make a current app that has them."""
    from celery import Celery, _state

    for callback in FORGOTTEN_REM_REGISTRATIONS:
        _state.connect_on_app_finalize(callback)
    app = Celery("rem-declarations", set_as_current=True)
    app.finalize()
    yield
    app.close()


@pytest.fixture
def redis_url() -> str:
    return REDIS_URL


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = _redis_or_skip(redis_url)
    yield client
    client.close()


def declare_fresh(client: redis.Redis, prefix: str) -> None:
    """Say that nothing ever ran under ``prefix``: a new deployment needs no state-loss
    quarantine before its first heavy grant (tests of the quarantine don't call this)."""
    assert LaneStore(client, Keys(prefix)).declare_fresh(), f"{prefix}: state exists"


@pytest.fixture
def key_prefix(redis_client: redis.Redis) -> Iterator[str]:
    """A fresh prefix per test, declared a new deployment (no state-loss quarantine before its
    first grant); its keys are deleted afterwards."""
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    declare_fresh(redis_client, prefix)
    yield prefix
    keys = list(redis_client.scan_iter(f"{prefix}:*"))
    if keys:
        redis_client.delete(*keys)


@pytest.fixture
def e2e_redis() -> Iterator[redis.Redis]:
    """The end-to-end database, flushed: real processes share its queues and state."""
    client = _redis_or_skip(E2E_REDIS_URL)
    client.flushdb()
    declare_fresh(client, "schedproj")
    yield client
    client.close()


@pytest.fixture(scope="session")
def rabbitmq_url() -> Iterator[str]:
    """A private vhost on the local RabbitMQ for this session (tests/rabbitmq.py). Skips on a
    developer machine without RabbitMQ; under CI (``CI`` set), where ``.ci/run`` starts it,
    its absence fails."""
    url = os.environ.get("TEST_AMQP_URL") or f"{rabbitmq.SERVER_URL}//"
    why = rabbitmq.problem(url)
    vhost = rabbitmq.session_vhost()
    if why is None:
        try:
            url = next(vhost)
        except RuntimeError as exc:  # no rabbitmqctl, or it may not talk to the server
            why = f"cannot make a vhost: {exc}"
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"RabbitMQ is required under CI and is not usable at {mask(url)}: "
                        f"{why}")
        pytest.skip(f"no usable RabbitMQ at {mask(url)} ({why})")
    yield url
    next(vhost, None)  # deletes the vhost


@pytest.fixture(params=["redis", "amqp"])
def e2e_broker(request: pytest.FixtureRequest, e2e_redis: redis.Redis) -> rabbitmq.Broker:
    """The broker of an end-to-end test, once Redis (the state Redis's database) and once
    RabbitMQ (a session vhost, its queues emptied first); lane state and the lease stay on
    Redis either way."""
    if request.param == "redis":
        return rabbitmq.Broker("redis", E2E_REDIS_URL, {"CELERY_BROKER_URL": E2E_REDIS_URL})
    url = request.getfixturevalue("rabbitmq_url")
    rabbitmq.empty_queues(url)
    return rabbitmq.Broker("amqp", url, rabbitmq.amqp_env(url))


def token() -> str:
    """A random owner token."""
    return uuid.uuid4().hex


def make_app(key_prefix: str, declare: Callable[[Celery], None] | None = None,
             **settings: object) -> Celery:
    """A Celery app configured by schedproj as a deployment's would be, not the current app:
    state under ``key_prefix`` on ``REDIS_URL``, broker on ``BROKER_URL``, ``settings`` over
    the defaults, lanes added by ``declare``."""
    app = Celery(f"t-{uuid.uuid4().hex[:6]}", set_as_current=False)
    configure_app(app, Settings.load(**{"broker_url": BROKER_URL, "redis_url": REDIS_URL,
                                        "key_prefix": key_prefix, **settings}))
    if declare is not None:
        declare(app)
    # Celery's shared tasks join every app in the process: once any earlier test imported the
    # REM lanes (shared_task), they would be lanes of this app too. Keep to the test's own.
    for name in [n for n in app.tasks if n.startswith("schedproj.rem.")]:
        app.tasks.unregister(name)
    return app


@pytest.fixture
def broker(redis_client: redis.Redis) -> Iterator[redis.Redis]:
    """The broker of :func:`make_app`'s apps, its ``heavy`` and ``light`` queues emptied before
    and after the test."""
    client = redis.Redis.from_url(BROKER_URL, decode_responses=True)
    client.delete("heavy", "light")
    yield client
    client.delete("heavy", "light")
    client.close()


def sent(broker: redis.Redis, queue: str) -> list[dict]:
    """The task name and id of every message waiting in ``queue`` of the broker, in list order."""
    messages = [json.loads(m) for m in broker.lrange(queue, 0, -1)]
    return [{"task": m["headers"]["task"], "id": m["headers"]["id"]} for m in messages]


@pytest.fixture
def keys(key_prefix: str) -> Keys:
    return Keys(key_prefix)


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    """A schedproj-style client (decoded strings, timeouts) on the integration database."""
    c = connect(redis_url)
    yield c
    c.close()
