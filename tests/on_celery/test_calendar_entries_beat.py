"""Calendar entries in an in-process FairScheduler against real Redis (issue 21): a crontab entry
past Celery's ``beat_cron_starting_deadline`` is recorded as missed (state, counter, log line)
and not sent; one in its own zone with its own window coalesces its missed fire times into one
run; a runtime one-off entry runs once at its instant and never again, across a beat restart,
and ``schedproj entry list`` shows it spent.

Sends go to the real Redis broker; the tests read the queued messages back.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from celery import Celery
from celery.schedules import crontab

from schedproj.core.entries import EntryState
from schedproj.on_celery.beat import FairScheduler
from schedproj.on_celery.entries import schedule_key
from schedproj.ops.runtime_entries import define
from schedproj.store.protocol import CounterKind, Keys, counter_field
from tests.conftest import make_app
from tests.on_celery.test_schedule_entries import messages, queues  # noqa: F401
from tests.ops.test_entry_cli import cli


def app_with(key_prefix: str, beat_schedule: dict[str, Any], **conf: Any) -> Celery:
    def declare(app: Celery) -> None:
        @app.task(shared=False, name="shop.report")
        def report(*args: Any, **kwargs: Any) -> None: ...

        app.conf.update(beat_schedule=beat_schedule, **conf)

    return make_app(key_prefix, declare, beat_max_loop_interval_s=0.2, beat_lock_ttl_s=1.0)


def away_from_a_minute_boundary(margin: float = 3.0) -> None:
    """A minutely fire time within ``margin`` seconds would still be in a 1 s window or fall
    during the test: start safely inside a minute."""
    into = time.time() % 60
    if into < margin or into > 60 - margin:
        time.sleep((margin - into) % 60 + 0.1)


def test_a_crontab_entry_past_the_deadline_is_recorded_missed_and_not_sent(
        key_prefix: str, queues: redis.Redis, redis_client: redis.Redis,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    """Beat was down three minutes. ``late`` (the app's deadline of 1 s) sends nothing: its
    three fire times are counted missed, in its state and ``missed|late``, with a log line.
    ``kolkata`` (its own zone, its own window of an hour) runs once for the three: coalesced;
    its ``schedproj`` options are not on the message."""
    away_from_a_minute_boundary()
    hour = datetime.now(ZoneInfo("Asia/Kolkata")).hour
    own = {"schedproj": {"timezone": "Asia/Kolkata", "catchup_window_s": 3600},
           "queue": "reports"}
    beat_schedule = {
        "late": {"task": "shop.report", "schedule": crontab(minute="*")},
        # Only in this hour of Kolkata: never due if judged in the app's zone (New York).
        "kolkata": {"task": "shop.report", "schedule": crontab(minute="*", hour=hour),
                    "options": own},
    }
    app = app_with(key_prefix, beat_schedule, timezone="America/New_York",
                   beat_cron_starting_deadline=1)
    keys = Keys(key_prefix)
    down_since = time.time() - 180
    for name, spec in beat_schedule.items():
        # As a beat before keys named a crontab's own zone wrote it (key format 1): the
        # upgrade must not make "kolkata" (which names its zone) count from now.
        stored = json.loads(EntryState(down_since, 5, schedule_key(spec["schedule"])).encode())
        del stored["key_format"]
        redis_client.hset(keys.entries, name, json.dumps(stored))
    sched = FairScheduler(app=app)
    with caplog.at_level("WARNING", logger="schedproj.beat"):
        sched.tick()
        sched.tick()
    assert not messages(queues, "celery"), "a fire time past the deadline was sent"
    late = EntryState.decode(redis_client.hget(keys.entries, "late"), "late")
    assert late.missed == 3 and late.total_run_count == 5
    assert redis_client.hget(keys.counters, counter_field(CounterKind.MISSED, "late")) == "3"
    assert "schedule entry late missed 3 fire time(s)" in caplog.text
    assert redis_client.zscore(keys.entries_due, "late") == pytest.approx(
        (time.time() // 60 + 1) * 60, abs=0.5), "it waits for its next fire time"
    (coalesced,) = messages(queues, "reports")
    assert "schedproj" not in coalesced["properties"] and "schedproj" not in coalesced["headers"]
    kolkata = EntryState.decode(redis_client.hget(keys.entries, "kolkata"), "kolkata")
    assert kolkata.total_run_count == 6 and kolkata.missed == 0
    assert redis_client.hget(keys.counters, counter_field(CounterKind.MISSED, "kolkata")) is None
    sched.close()


def test_a_one_off_entry_runs_once_and_not_again_after_a_beat_restart(
        key_prefix: str, queues: redis.Redis, redis_client: redis.Redis) -> None:  # noqa: F811
    app = app_with(key_prefix, {})
    keys = Keys(key_prefix)
    sched = FairScheduler(app=app)
    sched.tick()
    at = datetime.now(UTC) + timedelta(seconds=0.6)
    define(redis_client, keys, "once", "shop.report", at=at, args=["x"], app=app)
    sched.tick()
    assert not messages(queues, "celery"), "sent before its instant"
    time.sleep(max(0.0, at.timestamp() - time.time()) + 0.05)
    for _ in range(3):
        sched.tick()
    (sent,) = messages(queues, "celery")
    assert sent["args"] == "['x']"
    sched.close()
    restarted = FairScheduler(app=app_with(key_prefix, {}))
    for _ in range(3):
        restarted.tick()
    assert len(messages(queues, "celery")) == 1, "a restarted beat ran the one-off again"
    (row,) = json.loads(cli(key_prefix, "entry", "list", "--json").stdout)
    assert row["name"] == "once" and row["spent"] and row["runs"] == 1
    assert "spent" in cli(key_prefix, "entry", "list").stdout
    restarted.close()


def test_entry_add_at_from_the_command_line(key_prefix: str) -> None:
    at = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    out = cli(key_prefix, "entry", "add", "once", "shop.report", "--at", at.isoformat(),
              "--catchup-window", "60")
    assert out.returncode == 0, out.stderr
    assert "once at" in out.stdout and "catch-up window 60s" in out.stdout
    (row,) = json.loads(cli(key_prefix, "entry", "list", "--json").stdout)
    assert row["name"] == "once" and not row["spent"]
    for args, says in [
        (("--at", "2027-03-28T02:30:00"), "no offset"),
        (("--at", "tomorrow"), "not an ISO 8601 instant"),
        (("--at", "2020-01-01T00:00:00Z"), "has passed"),
        (("--cron", "30 2 * * *", "--timezone", "Mars/Olympus"), "Mars/Olympus"),
        (("--every", "60", "--timezone", "UTC"), "cron or one-off"),
    ]:
        out = cli(key_prefix, "entry", "add", "x", "shop.report", *args)
        assert out.returncode != 0 and says in out.stderr, (args, out.stderr)
    out = cli(key_prefix, "entry", "add", "berlin", "shop.report", "--cron", "30 2 * * *",
              "--timezone", "Europe/Berlin")
    assert out.returncode == 0 and "in Europe/Berlin" in out.stdout, out.stderr
