"""Lanes for the TLS + ACL Redis test (tests/e2e/test_redis_tls.py): one heavy and one light lane
that record their runs in the state Redis (reached exactly as schedproj reaches it, so with the
same URL and TLS settings), and a heavy lane that fails, whose Sentry event must carry no
credentials."""

from __future__ import annotations

import json
import os
import time

import redis
from celery import shared_task

from schedproj import Lane, LaneKind, LaneTask
from schedproj.settings import Settings
from schedproj.store.connection import connect
from tests import sentry_capture

sentry_capture.activate_from_env()

PREFIX = os.environ.get("SCHEDPROJ_KEY_PREFIX", "schedproj")
_client: redis.Redis | None = None


def client() -> redis.Redis:
    global _client
    if _client is None:
        settings = Settings.load()
        _client = connect(settings.state_redis_url, tls=settings.redis_tls)
    return _client


def record(lane: str, task: LaneTask) -> None:
    start = time.time()
    time.sleep(0.05)
    client().rpush(f"{PREFIX}:tls:runs", json.dumps(
        {"lane": lane, "start": start, "end": time.time(), "fence": task.fence,
         "queue": (task.request.delivery_info or {}).get("routing_key")}))


@shared_task(base=LaneTask, bind=True, name="tls.heavy",
             lane=Lane(cadence_s=1, kind=LaneKind.HEAVY, order=10))
def heavy(self: LaneTask) -> None:
    record("tls.heavy", self)


@shared_task(base=LaneTask, bind=True, name="tls.light",
             lane=Lane(cadence_s=1, kind=LaneKind.LIGHT, order=20))
def light(self: LaneTask) -> None:
    record("tls.light", self)


class TlsLaneBroke(RuntimeError):
    """What the failing lane raises."""


@shared_task(base=LaneTask, bind=True, name="tls.broken",
             lane=Lane(cadence_s=3600, kind=LaneKind.HEAVY, order=5))
def broken(self: LaneTask) -> None:
    record("tls.broken", self)
    raise TlsLaneBroke("tls.broken failed on purpose")
