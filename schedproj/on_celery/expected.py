"""Failures the design expects and handles, told apart from bugs.

A worker whose Redis restarts, fails over, is paused or cut off sees connection errors and
time-outs; every caller below has a rule for them (give up the lease a third of a TTL early,
let a lease expire on its own, record a run lost). Such an outcome is logged as one line that
names the error; a traceback is kept for anything else, which is a bug.
"""

from __future__ import annotations

import logging

import redis

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


__all__ = ["EXPECTED_REDIS_FAILURES", "expected", "log_failure", "one_line"]
