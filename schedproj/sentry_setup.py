"""sentry-sdk in beat and every worker, turned on by ``SENTRY_DSN``.

The Celery integration reports lane failures as errors; with beat monitoring on, every lane
dispatch opens a Sentry Crons check-in (monitor slug = lane name) that the worker closes ok or
error. No personal data is sent unless ``SCHEDPROJ_SENTRY_SEND_DEFAULT_PII`` says so.
"""

from __future__ import annotations

import logging
from typing import Any

import sentry_sdk
from sentry_sdk.integrations.celery import CeleryIntegration

from schedproj.settings import Settings

logger = logging.getLogger(__name__)


def init_sentry(settings: Settings, role: str, **extra: Any) -> bool:
    """Initialise sentry-sdk for this process (``role``: beat or worker); False if no DSN.

    ``extra`` goes to ``sentry_sdk.init`` (tests pass a capturing ``transport``).
    """
    if not settings.sentry_dsn:
        return False
    sentry_sdk.init(
        dsn=settings.sentry_dsn,
        environment=settings.sentry_environment,
        release=settings.sentry_release,
        send_default_pii=settings.sentry_send_default_pii,
        integrations=[CeleryIntegration(monitor_beat_tasks=settings.sentry_beat_monitoring)],
        **extra,
    )
    sentry_sdk.set_tag("schedproj.role", role)
    logger.info("sentry enabled for %s (environment %s)", role, settings.sentry_environment)
    return True
