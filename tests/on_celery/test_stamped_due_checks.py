"""The REM chain's due checks read the store of the app that is current (beat's, in a beat
process), whichever app was current before."""

from __future__ import annotations

import uuid

import pytest
import redis
from celery import Celery, _state

from schedproj.ops.apps import configure_app
from schedproj.rem.store import MemoryStore, Summary
from schedproj.settings import Settings
from tests.conftest import BROKER_URL, REDIS_URL

pytestmark = pytest.mark.timeout(60)


def test_the_rem_due_checks_read_the_current_apps_store(redis_client: redis.Redis) -> None:
    """Each app's own store, whichever app was current before: the checks' runtime was keyed
    by ``current_app`` (one proxy for every app), so a later app read the first one's."""
    from schedproj.rem.lanes import dream_pending

    previous = _state.get_current_app()
    prefixes = [f"t-{uuid.uuid4().hex[:12]}" for _ in range(2)]
    try:
        for n, prefix in enumerate(prefixes):
            app = Celery(f"t-{uuid.uuid4().hex[:6]}", set_as_current=True)
            configure_app(app, Settings.load(broker_url=BROKER_URL, redis_url=REDIS_URL,
                                             key_prefix=prefix))
            store = MemoryStore(redis_client, prefix)
            store.put_summaries({f"s{i}": Summary("x.", 1.0, False) for i in range(n + 1)},
                                fence=1)
            assert dream_pending() == n + 1, f"app {n} read another app's store"
    finally:
        previous.set_current()
        for prefix in prefixes:
            keys = list(redis_client.scan_iter(f"{prefix}:*"))
            if keys:
                redis_client.delete(*keys)
