"""Outcomes the design expects and handles log one line, no traceback: a lease renewal that
times out on a frozen Redis, a Redis that refuses connections, a fenced write refused
(LeaseLost) in a lane body. A failure the design does not expect (a bug) keeps its traceback.
"""

from __future__ import annotations

import logging
import shutil
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from billiard.einfo import ExceptionInfo
from celery.app.trace import get_log_policy, log_policy_expected, log_policy_unexpected

from schedproj.core.errors import LeaseLost
from schedproj.devtools.processes import wait_until
from schedproj.devtools.redis_server import RedisServer, free_port
from schedproj.on_celery.expected import expected, log_failure
from schedproj.on_celery.keepalive import LeaseRenewer, RunHeartbeat
from schedproj.on_celery.run_context import RunContext
from schedproj.on_celery.task import LaneTask
from schedproj.store.connection import connect
from schedproj.store.lane_store import LaneStore
from schedproj.store.lease import HeavyLease
from schedproj.store.protocol import Keys

TASK_LOGGER = "schedproj.on_celery.task"
needs_redis_server = pytest.mark.skipif(shutil.which("redis-server") is None,
                                        reason="needs the redis-server binary")


def context(lane: str = "big") -> RunContext:
    return RunContext(lane=lane, task_id="run-1", started_at=time.time(), hold_cap_s=3600)


def lines(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()]


@needs_redis_server
def test_a_renewal_that_times_out_on_a_frozen_redis_logs_one_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    server = RedisServer(tmp_path, "frozen")
    server.start()
    try:
        # The renewal client's time-out, as a worker has it: a sixth of the TTL.
        lease = HeavyLease(connect(server.url, socket_timeout_s=0.1, retry=False), Keys("t"))
        rt = SimpleNamespace(settings=SimpleNamespace(lease_ttl_s=0.6, max_hold_s=60),
                             lease=lease)
        ctx = context()
        server.signal(signal.SIGSTOP)
        caplog.set_level(logging.WARNING, logger=TASK_LOGGER)
        renewer = LeaseRenewer(rt, "tok", ctx)  # type: ignore[arg-type]
        renewer.start()
        try:
            assert wait_until(ctx.lost.is_set, 5.0), "a holder cut off never learned it lost"
        finally:
            renewer.stopped.set()
            renewer.join(5)
    finally:
        server.signal(signal.SIGCONT)
        server.kill()
    failed = lines(caplog, "cannot renew the heavy lease")
    assert failed, caplog.text
    assert all(r.exc_info is None for r in failed), "an expected time-out logged a traceback"
    assert "TimeoutError" in failed[0].getMessage()
    assert "Traceback" not in caplog.text
    assert ctx.lost_reason == "redis-unreachable"


def test_a_light_runs_heartbeat_on_a_redis_that_refuses_connections_logs_one_line(
        caplog: pytest.LogCaptureFixture) -> None:
    nobody = f"redis://127.0.0.1:{free_port()}/0"  # a restarting Redis: connection refused
    rt = SimpleNamespace(settings=SimpleNamespace(lease_ttl_s=0.6),
                         store=LaneStore(connect(nobody, socket_timeout_s=0.1, retry=False),
                                         Keys("t")))
    ctx = context("small")
    caplog.set_level(logging.WARNING, logger=TASK_LOGGER)
    heartbeat = RunHeartbeat(rt, ctx)  # type: ignore[arg-type]
    heartbeat.start()
    try:
        assert wait_until(ctx.lost.is_set, 5.0), "an unrefreshed mark never flagged the run"
    finally:
        heartbeat.stopped.set()
        heartbeat.join(5)
    failed = lines(caplog, "cannot refresh the in-flight mark")
    assert failed and all(r.exc_info is None for r in failed), caplog.text
    assert "ConnectionError" in failed[0].getMessage()
    assert ctx.lost_reason == "in-flight-mark-unrefreshed"


def test_a_failure_the_design_does_not_expect_keeps_its_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        """A renewal that fails the way a bug does, not the way Redis does."""

        def renew(self, *args: object, **kwargs: object) -> object:
            raise KeyError("pressure")

    rt = SimpleNamespace(settings=SimpleNamespace(lease_ttl_s=0.6, max_hold_s=60),
                         lease=Broken())
    ctx = context()
    caplog.set_level(logging.WARNING, logger=TASK_LOGGER)
    renewer = LeaseRenewer(rt, "tok", ctx)  # type: ignore[arg-type]
    renewer.start()
    try:
        assert wait_until(ctx.lost.is_set, 5.0)
    finally:
        renewer.stopped.set()
        renewer.join(5)
    failed = lines(caplog, "cannot renew the heavy lease")
    assert failed and failed[0].exc_info is not None, "a bug lost its traceback"
    assert "Traceback" in caplog.text and "KeyError" in caplog.text


def test_log_failure_tells_redis_failures_from_bugs(caplog: pytest.LogCaptureFixture) -> None:
    import redis

    log = logging.getLogger("schedproj.test.expected")
    caplog.set_level(logging.WARNING, logger=log.name)
    for exc in (redis.TimeoutError("Timeout reading from socket"), TimeoutError("timed out"),
                redis.ConnectionError("Connection closed by server."),
                ConnectionRefusedError(111, "Connection refused"),
                redis.exceptions.ReadOnlyError("You can't write against a read only replica.")):
        assert expected(exc)
        log_failure(log, exc, "lane %s: cannot do it", "x")
    for bug in (KeyError("k"), ValueError("v"), redis.ResponseError("WRONGTYPE")):
        assert not expected(bug)
    log_failure(log, ValueError("v"), "lane %s: cannot do it", "y", level=logging.ERROR)
    one, bug = caplog.records[:-1], caplog.records[-1]
    assert [r.getMessage().split(": ", 2)[2].split(":")[0] for r in one] == [
        "TimeoutError", "TimeoutError", "ConnectionError", "ConnectionRefusedError",
        "ReadOnlyError"]
    assert all(r.exc_info is None and r.levelno == logging.WARNING for r in one)
    assert bug.exc_info is not None and bug.levelno == logging.ERROR
    assert bug.getMessage() == "lane y: cannot do it"


def test_a_fenced_write_refused_in_a_lane_body_is_logged_by_celery_as_expected() -> None:
    """Celery logs a task's exception with its traceback ("raised unexpected") unless the task
    declares it in ``throws``; a lane body whose fenced write was refused (LeaseLost) is the
    design at work, recorded failed with its reason."""
    task = LaneTask()
    try:
        raise LeaseLost("chaos.h2: write refused, fence 7 is no longer newest")
    except LeaseLost as exc:
        einfo = ExceptionInfo()
        assert get_log_policy(task, einfo, exc) is log_policy_expected
    try:
        raise KeyError("a bug")
    except KeyError as exc:
        assert get_log_policy(task, ExceptionInfo(), exc) is log_policy_unexpected


@needs_redis_server
def test_a_message_a_worker_cannot_ack_while_redis_restarts_is_one_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """kombu logs "Couldn't ack" with a traceback (CRITICAL, through Celery's request logger)
    when the broker is gone at the end of an acks_late run; a worker gets the filter at start
    (worker_init), and the record keeps its level and words, on one line."""
    import redis
    from kombu import Connection, Queue

    from schedproj.on_celery.expected import CELERY_LOGGERS, one_line_for_celery

    server = RedisServer(tmp_path, "broker")
    server.start()
    try:
        with Connection(server.url) as conn:
            queue = Queue("q", channel=conn.default_channel)
            queue.declare()
            conn.default_channel.basic_publish(
                conn.default_channel.prepare_message("x"), exchange="", routing_key="q")
            message = queue.get(no_ack=False)
            assert message is not None
            server.kill()  # the broker restarts while the run ends
            one_line_for_celery()
            log = logging.getLogger(CELERY_LOGGERS[0])
            caplog.set_level(logging.CRITICAL, logger=log.name)
            message.ack_log_error(log, (redis.ConnectionError, ConnectionError))
    finally:
        server.kill()
    [record] = [r for r in caplog.records if "Couldn't ack" in r.getMessage()]
    assert record.levelno == logging.CRITICAL and record.exc_info is None
    assert "ConnectionError" in record.getMessage() and "Traceback" not in caplog.text


def test_the_filter_leaves_a_bug_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    from schedproj.on_celery.expected import CELERY_LOGGERS, one_line_for_celery

    one_line_for_celery()
    log = logging.getLogger(CELERY_LOGGERS[0])
    caplog.set_level(logging.CRITICAL, logger=log.name)
    try:
        raise KeyError("a bug")
    except KeyError:
        log.critical("Couldn't ack %r, reason:%r", 7, "x", exc_info=True)
    assert caplog.records[-1].exc_info is not None
