"""What beat says when its first read finds no epoch record (issue 20: 7).

A Redis holding no schedproj state at all is a new deployment or a Redis that lost everything,
and nothing in Redis tells the two apart: the quarantine holds either way (promise 1), but a
beat that starts on one says so at WARNING, naming ``schedproj init``. A loss seen by a beat
that read state before, or one that left other state behind, is said at ERROR. In-process
FairScheduler against real Redis; the log is read as an operator reads it (level and text).
"""

from __future__ import annotations

import logging
import time

import pytest
import redis
from click.testing import CliRunner

from schedproj.core.records import RunRecord, encode
from schedproj.on_celery.beat import FairScheduler
from schedproj.ops import cli
from schedproj.store.protocol import Keys, run_field
from tests.conftest import REDIS_URL, sent
from tests.on_celery.test_fair_scheduler_tick import build, three_lanes

pytestmark = pytest.mark.timeout(60)


def said(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """Beat's lines about a quarantine it started (not the put-back that may follow)."""
    return [r for r in caplog.records
            if "state loss" in r.getMessage() and "no lane is dispatched" in r.getMessage()]


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_first_start_on_an_empty_redis_warns_once_names_init_and_still_waits(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    keys = Keys(key_prefix)
    redis_client.delete(keys.epoch)  # undeclared: the prefix holds nothing at all
    sched = FairScheduler(app=build(key_prefix, three_lanes))
    with caplog.at_level(logging.DEBUG, logger="schedproj"):
        sched.tick()
        sched.tick()
    (line,) = said(caplog)  # once, not every tick of the quarantine
    text = line.getMessage()
    assert line.levelno == logging.WARNING, text
    assert errors(caplog) == []
    assert "first start or state loss" in text and "new deployment" in text
    assert "`schedproj init` run before beat's first start" in text
    # The seconds it waits: the quarantine the epoch record started with this tick.
    waited = float(text.split("no lane is dispatched for ")[1].split("s ")[0])
    assert sched.settings.quarantine_s - 5 < waited <= round(sched.settings.quarantine_s, 1)
    # The wait is not skipped: an empty Redis is also what a restart without persistence
    # leaves while a heavy run may still hold the lease it forgot.
    assert sent(broker, "heavy") == [] and sent(broker, "light") == []
    assert redis_client.get(keys.lease) is None
    sched.close()


def test_schedproj_init_as_the_warning_says_starts_without_a_wait_or_a_word(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    redis_client.delete(Keys(key_prefix).epoch)
    env = {"SCHEDPROJ_REDIS_URL": REDIS_URL, "CELERY_BROKER_URL": REDIS_URL,
           "SCHEDPROJ_KEY_PREFIX": key_prefix}
    out = CliRunner().invoke(cli.main, ["init"], env=env)
    assert out.exit_code == 0, out.output
    sched = FairScheduler(app=build(key_prefix, three_lanes))
    with caplog.at_level(logging.DEBUG, logger="schedproj"):
        sched.tick()
    assert said(caplog) == [] and errors(caplog) == []
    assert [m["task"] for m in sent(broker, "heavy")] == ["t.heavy-a"]
    assert [m["task"] for m in sent(broker, "light")] == ["t.light"]
    sched.close()


def test_a_running_beat_that_finds_redis_empty_says_a_loss_at_error(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    sched = FairScheduler(app=build(key_prefix, three_lanes))
    sched.tick()
    assert sent(broker, "heavy"), "the beat ran before the loss"
    broker.delete("heavy", "light")
    # Redis restarts empty under the running beat: every key of the deployment is gone.
    redis_client.delete(*redis_client.scan_iter(f"{key_prefix}:*"))
    with caplog.at_level(logging.DEBUG, logger="schedproj"):
        sched.tick()
    (line,) = said(caplog)
    text = line.getMessage()
    assert line.levelno == logging.ERROR, text
    assert text.startswith("state loss: Redis holds no schedproj state any more"), text
    assert "schedproj init" not in caplog.text, "a running beat knows it is no first start"
    assert sent(broker, "heavy") == [] and sent(broker, "light") == []
    sched.close()


def test_a_beat_starting_where_only_the_epoch_record_was_lost_says_a_loss_at_error(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    keys = Keys(key_prefix)
    redis_client.hset(keys.lanes, run_field("t.heavy-a"),
                      encode(RunRecord(last_run_at=time.time() - 600, runs=4)))
    redis_client.delete(keys.epoch)  # evicted or deleted; a lane's record is still there
    sched = FairScheduler(app=build(key_prefix, three_lanes))
    with caplog.at_level(logging.DEBUG, logger="schedproj"):
        sched.tick()
    (line,) = said(caplog)
    text = line.getMessage()
    assert line.levelno == logging.ERROR, text
    assert "lost schedproj's epoch record but holds other schedproj state" in text
    assert "schedproj init" not in caplog.text
    assert sent(broker, "heavy") == [] and sent(broker, "light") == []
    sched.close()
