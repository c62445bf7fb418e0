"""Schedule entries in the Prometheus scrape: counts by source, overdue entries, per-entry
runs and times, read from real Redis after an in-process beat ran them."""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from schedproj.on_celery.beat import FairScheduler
from schedproj.settings import Settings
from schedproj.store.protocol import Keys
from schedproj.telemetry.metrics import SchedprojCollector
from tests.on_celery.test_schedule_entries import app_with, queues  # noqa: F401
from tests.telemetry.test_status_page import get, serve  # noqa: F401


def scrape(client: redis.Redis, prefix: str) -> dict[str, dict[tuple[str, ...], float]]:
    out: dict[str, dict[tuple[str, ...], float]] = {}
    for fam in SchedprojCollector(client, Keys(prefix), Settings(), ()).collect():
        for sample in fam.samples:
            out.setdefault(sample.name, {})[tuple(sample.labels.values())] = sample.value
    return out


def test_entries_are_counted_timed_and_flagged_overdue(
        key_prefix: str, queues: redis.Redis, redis_client: redis.Redis) -> None:  # noqa: F811
    sched = FairScheduler(app=app_with(key_prefix, {
        "fast": {"task": "shop.report", "schedule": 0.2},
        "slow": {"task": "shop.report", "schedule": 3600.0}}))
    sched.tick()
    time.sleep(0.25)
    sched.tick()
    got = scrape(redis_client, key_prefix)
    assert got["schedproj_entries"] == {("code",): 2}
    assert got["schedproj_entries_overdue"] == {(): 0}
    assert got["schedproj_entry_runs_total"] == {("fast",): 1, ("slow",): 0}
    assert abs(got["schedproj_entry_last_run_timestamp_seconds"][("fast",)] - time.time()) < 5
    assert got["schedproj_entry_next_due_timestamp_seconds"][("slow",)] > time.time() + 3000
    sched.close()
    # No beat: the next look of "fast" passes and stays past.
    redis_client.zadd(Keys(key_prefix).entries_due, {"fast": time.time() - 120})
    assert scrape(redis_client, key_prefix)["schedproj_entries_overdue"] == {(): 1}


def test_the_status_page_lists_the_entries(
        key_prefix: str, queues: redis.Redis,  # noqa: F811
        redis_client: redis.Redis, serve: Any) -> None:  # noqa: F811
    sched = FairScheduler(app=app_with(key_prefix, {
        "hourly": {"task": "shop.report", "schedule": 3600.0}}))
    sched.tick()
    sched.engine.entries.store.pause("hourly")
    base = serve()
    code, page = get(f"{base}/")
    assert code == 200 and "Schedule entries (1)" in page
    assert 'data-entry="hourly"' in page and "paused" in page and "shop.report" in page
    status = json.loads(get(f"{base}/api/status")[1])
    assert status["entries_total"] == 1 and status["entries"][0]["paused"] is True
    sched.close()


def test_a_page_without_entries_has_no_entries_section() -> None:
    from schedproj.telemetry.statuspage import entries_section

    assert entries_section({"now": 0.0, "entries": [], "entries_total": 0}) == ""
