"""sentry-sdk in beat and every worker, turned on by ``SENTRY_DSN``.

The Celery integration reports lane failures as errors; with beat monitoring on, every lane
dispatch opens a Sentry Crons check-in (monitor slug = lane name: beat's schedule entries are
named after the lanes) that the worker closes ok or error. Sentry Crons only knows intervals of
whole minutes: a lane whose cadence is not one gets no check-ins (sentry-sdk logs a warning).

A calendar lane with a cron schedule can be monitored on its own calendar
(:func:`crons_schedule`): its crontab in its zone. A fire time schedproj skips as missed sends
no check-in, so Sentry marks it *missed* itself — a client cannot send that status (a check-in
is ``in_progress``, ``ok`` or ``error``; *missed* is Sentry's verdict on a check-in that did
not come).

No personal data is sent unless ``SCHEDPROJ_SENTRY_SEND_DEFAULT_PII`` says so, and credentials
never leave the process: a lane's frames hold the lease grant and the settings (whose repr
shows the broker URL and the DSN), so every event is scrubbed recursively of secret-named keys
and of the user:password part of every URL before it is sent. The DSN is never logged.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterable
from typing import Any
from zoneinfo import ZoneInfo

import sentry_sdk
from celery.schedules import crontab
from sentry_sdk.integrations.celery import CeleryIntegration
from sentry_sdk.scrubber import DEFAULT_DENYLIST, EventScrubber
from sentry_sdk.utils import BadDsn

from schedproj.core.lanes import LaneSpec
from schedproj.core.schedules import CronFireTimes
from schedproj.settings import Settings

logger = logging.getLogger(__name__)

#: Keys scrubbed (at any depth) besides sentry-sdk's default denylist (``token``, ``auth``...).
EXTRA_DENYLIST = ("schedproj_lease", "dsn", "sentry_dsn", "broker_url", "redis_url")
#: ``scheme://userinfo@``: the userinfo (user, password, DSN public key) is replaced.
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^\s/@'\"<>]+@")
FILTERED = "[Filtered]"
#: A token inside a rendered dict (``'token': 'abc'``, ``"token": "abc"``): Celery's "Task
#: received" log line carries the message's kwargs as a repr, lease token included, and
#: sentry-sdk turns that line into a breadcrumb. Key-based scrubbing never sees inside it.
_TOKEN_IN_TEXT = re.compile(r"""(?i)((['"])(?:token|password|secret)\2\s*:\s*)(['"])[^'"]*\3""")

#: The process sentry-sdk was last initialised in (a prefork child must initialise again).
_initialised_pid: int | None = None

Hook = Callable[[Any, Any], Any]


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it, and any token rendered in it,
    replaced."""
    text = _URL_USERINFO.sub(rf"\1{FILTERED}@", text)
    return _TOKEN_IN_TEXT.sub(rf"\1\3{FILTERED}\3", text)


def _redact_all(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redact_all(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact_all(v) for v in value]
    return value


def _scrubbing(then: Hook | None) -> Hook:
    """A ``before_send`` hook: redact URL credentials in the (serialized) event, then ``then``."""

    def before_send(event: Any, hint: Any) -> Any:
        event = _redact_all(event)
        return then(event, hint) if then is not None else event

    return before_send


def crons_exclusions(specs: Iterable[LaneSpec]) -> list[str]:
    """``exclude_beat_tasks`` patterns for the lanes Sentry Crons cannot monitor.

    Crons knows intervals of whole minutes only; for any other cadence sentry-sdk sends no
    check-in and logs a warning at every dispatch. For beat:
    ``init_sentry(settings, "beat", exclude_beat_tasks=crons_exclusions(specs))``, which passes
    them to the Celery integration."""
    return [f"^{re.escape(spec.name)}$" for spec in specs
            if spec.cadence_s < 60 or spec.cadence_s % 60]


def init_sentry(settings: Settings, role: str, *,
                exclude_beat_tasks: list[str] | None = None, **extra: Any) -> bool:
    """Initialise sentry-sdk for this process (``role``: beat or worker); False if no DSN.

    Idempotent per process: a solo or threads worker gets both ``worker_init`` and
    ``worker_process_init``; a prefork child (new pid) initialises its own client. ``extra``
    goes to ``sentry_sdk.init`` (tests pass a capturing ``transport``) and always re-initialises.
    A malformed DSN stops the process at start with the setting's name (never its value).
    """
    global _initialised_pid
    if not settings.sentry_dsn:
        return False
    if not extra and _initialised_pid == os.getpid() and sentry_sdk.get_client().is_active():
        return True
    options: dict[str, Any] = {
        "dsn": settings.sentry_dsn,
        "environment": settings.sentry_environment,
        "release": settings.sentry_release,
        "send_default_pii": settings.sentry_send_default_pii,
        "integrations": [CeleryIntegration(monitor_beat_tasks=settings.sentry_beat_monitoring,
                                           exclude_beat_tasks=exclude_beat_tasks or None)],
        "event_scrubber": EventScrubber(
            denylist=[*DEFAULT_DENYLIST, *EXTRA_DENYLIST], recursive=True,
            send_default_pii=settings.sentry_send_default_pii,
        ),
    }
    before_send = _scrubbing(extra.pop("before_send", None))
    before_send_transaction = _scrubbing(extra.pop("before_send_transaction", None))
    options.update(extra, before_send=before_send,
                   before_send_transaction=before_send_transaction)
    try:
        with warnings.catch_warnings():
            # sentry-sdk 2.7x deprecates send_default_pii for ``data_collection``, which older
            # 2.x releases reject and which turns off the event scrubber relied on above.
            warnings.filterwarnings("ignore", message="The send_default_pii option is deprec",
                                    category=DeprecationWarning)
            sentry_sdk.init(**options)
    except BadDsn as exc:
        # Like a bad lane declaration: stop at start, name the setting, never echo its value
        # (a DSN holds a key). SystemExit, because Celery's signal dispatch swallows the rest.
        sys.stderr.write(f"schedproj: cannot start {role}: SENTRY_DSN is not a valid Sentry "
                         f"DSN ({redact(str(exc))}). Fix: copy the project's DSN from Sentry "
                         "(Settings > Client Keys), or unset SENTRY_DSN to run without Sentry\n")
        raise SystemExit(2) from None
    # On the global scope: every thread and task of the process carries it.
    sentry_sdk.get_global_scope().set_tag("schedproj.role", role)
    _initialised_pid = os.getpid()
    logger.info("sentry enabled for %s (environment %s, beat monitoring %s, default PII %s)",
                role, settings.sentry_environment or "-",
                "on" if settings.sentry_beat_monitoring else "off",
                "on" if settings.sentry_send_default_pii else "off")
    return True


class ZonedCrontab(crontab):  # type: ignore[misc]
    """A Celery ``crontab`` that names its own zone. sentry-sdk builds a Crons monitor from a
    beat entry's schedule and takes the zone from its ``tz`` (a plain ``crontab`` answers
    with the app's zone): this one answers with the lane's."""

    def __init__(self, times: CronFireTimes) -> None:
        minute, hour, day_of_month, month_of_year, day_of_week = times.schedule.text.split()
        super().__init__(minute=minute, hour=hour, day_of_month=day_of_month,
                         month_of_year=month_of_year, day_of_week=day_of_week)
        self.zone = times.zone

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.zone)


def crons_schedule(spec: LaneSpec) -> Any:
    """The schedule beat's entry for ``spec`` should carry so Sentry Crons monitors the lane
    on its own calendar: for a calendar lane with a cron schedule, its crontab in its zone
    (:class:`ZonedCrontab`); None for the others (a cadence lane, and a calendar Sentry cannot
    express — solar, a custom Celery schedule, a one-off instant — keep the interval monitor
    of their nominal period).

    With it, the check-in beat opens at dispatch and the one the worker closes (from the
    message's headers) both name the crontab and the zone, and a fire time schedproj skips
    for its catch-up window sends no check-in, so Sentry marks it *missed*. The expression is
    read by Sentry with classic cron's rules: where Celery's (and schedproj's) differ — a day
    must match both the day of month and the day of week; the DST rules of docs/calendar.md —
    Sentry's expected times may differ from the lane's fire times."""
    times = spec.calendar
    if not isinstance(times, CronFireTimes):
        return None
    try:
        return ZonedCrontab(times)
    except ValueError:   # a spelling Celery's own parser refuses: keep the interval monitor
        return None
