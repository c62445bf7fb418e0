"""Shared fixtures: real Redis (never mocked), unique key prefixes, per-test settings.

Tests that need Redis skip on a developer machine without one, and fail under CI (``CI`` set),
where ``.ci/run`` starts Redis first.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis

from schedproj.keys import Keys
from schedproj.redis_conn import connect

#: Integration tests share this database and keep apart by key prefix (no FLUSHDB).
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/14")
#: End-to-end tests own this database (its queues carry the public names heavy/light) and
#: flush it before each test.
E2E_REDIS_URL = os.environ.get("TEST_E2E_REDIS_URL", "redis://127.0.0.1:6379/15")


def _redis_or_skip(url: str) -> redis.Redis:
    client = redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"Redis is required under CI and does not answer at {url}: {exc}")
        pytest.skip(f"no Redis at {url}")
    return client


@pytest.fixture
def redis_url() -> str:
    return REDIS_URL


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = _redis_or_skip(redis_url)
    yield client
    client.close()


@pytest.fixture
def key_prefix(redis_client: redis.Redis) -> Iterator[str]:
    """A fresh prefix per test; its keys are deleted afterwards."""
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    yield prefix
    keys = list(redis_client.scan_iter(f"{prefix}:*"))
    if keys:
        redis_client.delete(*keys)


@pytest.fixture
def e2e_redis() -> Iterator[redis.Redis]:
    """The end-to-end database, flushed: real processes share its queues and state."""
    client = _redis_or_skip(E2E_REDIS_URL)
    client.flushdb()
    yield client
    client.close()


def token() -> str:
    """A random owner token."""
    return uuid.uuid4().hex


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.02) -> bool:
    """Poll ``predicate`` until it holds or ``timeout_s`` passes; its last answer."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


@pytest.fixture
def keys(key_prefix: str) -> Keys:
    return Keys(key_prefix)


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    """A schedproj-style client (decoded strings, timeouts) on the integration database."""
    c = connect(redis_url)
    yield c
    c.close()
