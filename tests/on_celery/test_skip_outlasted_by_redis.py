"""A refused message's bookkeeping (the skip counter and the skipped mark) while Redis cannot
take writes (a failover's demoted master, a pause) for longer than the task's soft time limit:
the skip is said on one line and the task ends, with no traceback (the chaos run's logs found
one: a watchdog skip's counter write retried through a Sentinel failover past its 9 s soft
limit)."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterator

import pytest
import redis
from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded

from schedproj import Lane, LaneTask
from schedproj.core.records import Outcome
from tests.conftest import make_app

pytestmark = pytest.mark.timeout(60)


def declare(app: Celery) -> None:
    @app.task(shared=False, base=LaneTask, name="s.heavy", lane=Lane(cadence_s=60))
    def heavy() -> None:
        raise AssertionError("a message without a lease token must run nothing")


@pytest.fixture
def soft_limit_in() -> Iterator[None]:
    """What the prefork pool does at a task's soft time limit (SIGUSR1 -> raise
    SoftTimeLimitExceeded in the task), here on a timer, 0.5 s into the call."""
    def fire(*_: object) -> None:
        raise SoftTimeLimitExceeded()

    before = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def test_a_skip_whose_writes_outlast_the_soft_time_limit_ends_on_one_line(
        key_prefix: str, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture,
        request: pytest.FixtureRequest) -> None:
    app = make_app(key_prefix, declare)
    task = app.tasks["s.heavy"]
    redis_client.client_pause(3000, all=False)  # writes wait 3 s; reads go on
    try:
        task.push_request(id="t-skip-1")
        started = time.monotonic()
        with caplog.at_level(logging.INFO):
            request.getfixturevalue("soft_limit_in")
            result = task()
    finally:
        task.pop_request()
        redis_client.client_unpause()
    assert time.monotonic() - started < 2.5, "the skip waited for Redis past its soft limit"
    assert isinstance(result, dict) and result["outcome"] == Outcome.SKIPPED.value
    said = [r for r in caplog.records if "t-skip-1" in r.getMessage()]
    assert any("not recorded" in r.getMessage() for r in said), [r.getMessage() for r in said]
    assert not any(r.exc_info for r in caplog.records), "a traceback was logged"
