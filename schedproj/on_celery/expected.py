"""Failures the design expects and handles, told apart from bugs.

A worker whose Redis restarts, fails over, is paused or cut off sees connection errors and
time-outs; every caller below has a rule for them (give up the lease a third of a TTL early,
let a lease expire on its own, record a run lost). Such an outcome is logged as one line that
names the error; a traceback is kept for anything else, which is a bug. The same holds for the
few records Celery itself writes about a broker restart (:class:`OneLineForExpected`).
"""

from __future__ import annotations

import logging

import redis
from celery import signals

#: Redis unreachable, restarting, loading, failing over (a demoted master refuses writes) or
#: too slow to answer within the socket time-out.
EXPECTED_REDIS_FAILURES: tuple[type[BaseException], ...] = (
    redis.ConnectionError, redis.TimeoutError, redis.exceptions.ReadOnlyError,
    ConnectionError, TimeoutError,
)


def expected(exc: BaseException) -> bool:
    """Is ``exc`` an outcome the design handles (log one line), not a bug (log a traceback)?"""
    return isinstance(exc, EXPECTED_REDIS_FAILURES)


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line, for the log line that replaces a traceback."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def log_failure(log: logging.Logger, exc: BaseException, message: str, *args: object,
                level: int = logging.WARNING) -> None:
    """Log ``message`` (%-formatted with ``args``) for a caught ``exc``: one line ending in
    ``Type: text`` when the design expects it, the full traceback when it does not."""
    if expected(exc):
        log.log(level, "%s: %s", message % args, one_line(exc))
    else:
        log.log(level, "%s", message % args, exc_info=exc)


class OneLineForExpected(logging.Filter):
    """Keeps a record that carries an expected failure's traceback, as one line instead.

    Celery and kombu log some of what a broker restart does to a worker with a traceback: an
    ``acks_late`` message the worker cannot acknowledge or reject while Redis is down
    (kombu's ``ack_log_error``, "Couldn't ack ..."). By design that message is delivered again
    and refused as stale (its lease or dispatch is no longer current), so the record keeps its
    level and words, and loses the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and expected(exc):
            record.msg, record.args = f"{record.getMessage()}: {one_line(exc)}", ()
            record.exc_info, record.exc_text = None, None
        return True


#: Celery's loggers whose records of a broker restart carry a traceback: a message the worker
#: could not acknowledge or reject (``celery.worker.request`` hands its logger to kombu).
CELERY_LOGGERS = ("celery.worker.request",)
_ONE_LINE = OneLineForExpected()


def one_line_for_celery() -> None:
    """Put the filter on :data:`CELERY_LOGGERS` (once; a worker's pool inherits it)."""
    for name in CELERY_LOGGERS:
        log = logging.getLogger(name)
        if _ONE_LINE not in log.filters:
            log.addFilter(_ONE_LINE)


@signals.worker_init.connect  # type: ignore[untyped-decorator]
def _worker_logs_expected_failures_on_one_line(**_: object) -> None:
    one_line_for_celery()


__all__ = ["CELERY_LOGGERS", "EXPECTED_REDIS_FAILURES", "OneLineForExpected", "expected",
           "log_failure", "one_line", "one_line_for_celery"]
