"""RabbitMQ as the broker (lease and lane state stay on Redis).

The core end-to-end tests run on both brokers (tests/e2e/test_heavy_and_light_lanes.py, the
``e2e_broker`` fixture). Here:
the hard time limits are checked against RabbitMQ's ``consumer_timeout`` as they are against
Redis's visibility timeout (settings, a lane's own ``time_limit``, and real beat and worker
processes refusing to start), and a heavy message's start deadline becomes an AMQP per-message
expiration that RabbitMQ itself enforces.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from schedproj import Lane, LaneKind, LaneTask
from schedproj.core.errors import ConfigurationError, LaneDeclarationError
from schedproj.on_celery.config import configure_app, lane_set_for
from schedproj.settings import Settings
from schedproj.store.protocol import Keys
from tests import rabbitmq
from tests.conftest import E2E_REDIS_URL, REDIS_URL
from tests.procs import FAST_SETTINGS, ROOT, Cluster, wait_for

AMQP = "amqp://guest:guest@rabbit:5672//"
STATE = REDIS_URL


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("SCHEDPROJ_") or name == "CELERY_BROKER_URL":
            monkeypatch.delenv(name)


def settings_error(**overrides: Any) -> str:
    with pytest.raises(ConfigurationError) as info:
        Settings.load(**overrides)
    return str(info.value)


# -- the consumer_timeout rule -----------------------------------------------------------------

def test_default_heavy_limit_is_refused_on_rabbitmq_defaults(clean_env: None) -> None:
    """2 h heavy runs against RabbitMQ's default 30 min consumer_timeout: RabbitMQ would close
    the channel mid-run and redeliver. The error names both settings and both fixes."""
    message = settings_error(broker_url=AMQP, redis_url=STATE)
    assert "SCHEDPROJ_HEAVY_TIME_LIMIT_S" in message
    assert "consumer_timeout 1800s" in message
    assert "SCHEDPROJ_RABBITMQ_CONSUMER_TIMEOUT_S" in message and "rabbitmq.conf" in message
    assert "guest" not in message  # no broker credentials echoed
    for scheme in ("amqps", "pyamqp"):
        assert "SCHEDPROJ_HEAVY_TIME_LIMIT_S" in settings_error(
            broker_url=AMQP.replace("amqp", scheme, 1), redis_url=STATE)


@pytest.mark.parametrize("overrides", [
    {"heavy_time_limit_s": 1200},                                   # below the default 30 min
    {"rabbitmq_consumer_timeout_s": 3 * 3600},                      # the server's raised one
    {"rabbitmq_consumer_timeout_s": 0},                             # disabled on the server
], ids=["lower-limit", "raised-timeout", "disabled"])
def test_either_fix_is_accepted(clean_env: None, overrides: dict[str, Any]) -> None:
    settings = Settings.load(broker_url=AMQP, redis_url=STATE, **overrides)
    assert settings.broker_is_amqp


def test_light_limit_is_checked_too_and_redis_brokers_are_not(clean_env: None) -> None:
    message = settings_error(broker_url=AMQP, redis_url=STATE, heavy_time_limit_s=1200,
                             light_time_limit_s=1800)
    assert "SCHEDPROJ_LIGHT_TIME_LIMIT_S" in message and "consumer_timeout" in message
    # On Redis the visibility timeout is the rule, not the consumer timeout.
    assert not Settings.load(broker_url=STATE).broker_is_amqp


def test_a_lanes_own_time_limit_is_checked(clean_env: None) -> None:
    app = Celery("t-amqp", broker="memory://", set_as_current=False)
    try:
        @app.task(base=LaneTask, shared=False, name="t.long", time_limit=2400,
                  lane=Lane(cadence_s=3600, kind=LaneKind.HEAVY))
        def long() -> None: ...

        configure_app(app, Settings.load(broker_url=AMQP, redis_url=STATE,
                                         heavy_time_limit_s=1200))
        with pytest.raises(LaneDeclarationError) as info:
            lane_set_for(app)
        text = str(info.value)
        assert "t.long" in text and "time_limit 2400s" in text
        assert "consumer_timeout 1800s" in text and "lower the task's time_limit" in text
    finally:
        app.close()


# -- on the real server --------------------------------------------------------------------------

@pytest.fixture
def amqp_env(rabbitmq_url: str, e2e_redis: redis.Redis) -> Iterator[dict[str, str]]:
    rabbitmq.empty_queues(rabbitmq_url)
    env = dict(os.environ)
    env.update(FAST_SETTINGS)
    env.update({"SCHEDPROJ_REDIS_URL": E2E_REDIS_URL, "SCHEDPROJ_KEY_PREFIX": "schedproj",
                "PYTHONPATH": str(ROOT)})
    env.update(rabbitmq.amqp_env(rabbitmq_url))
    yield env


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_beat_and_worker_refuse_a_heavy_limit_past_the_servers_consumer_timeout(
        amqp_env: dict[str, str], tmp_path: Path) -> None:
    """The server's own consumer_timeout (read with rabbitmqctl) in the setting, the default
    2 h heavy limit: beat and a heavy worker exit 2 with one line naming the settings."""
    server_s = rabbitmq.server_consumer_timeout_s()
    if not server_s:
        pytest.skip("the server's consumer_timeout cannot be read here, or it is disabled")
    env = {**amqp_env, "SCHEDPROJ_RABBITMQ_CONSUMER_TIMEOUT_S": f"{server_s:g}",
           "SCHEDPROJ_HEAVY_TIME_LIMIT_S": f"{server_s + 60:g}"}
    base = [sys.executable, "-m", "celery", "-A", "schedproj.app"]
    for args in (["beat", "-S", "fair"], ["worker", "-Q", "heavy", "-c", "1"]):
        done = subprocess.run([*base, *args], env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=60)
        out = done.stdout + done.stderr
        assert done.returncode == 2, out[-3000:]
        assert "Traceback" not in out, out[-3000:]
        lines = [line for line in out.splitlines() if "SCHEDPROJ_HEAVY_TIME_LIMIT_S" in line]
        assert len(lines) == 1, out[-3000:]
        assert f"consumer_timeout {server_s:g}s" in lines[0]
        assert "SCHEDPROJ_RABBITMQ_CONSUMER_TIMEOUT_S" in lines[0]


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_wrong_rabbitmq_password_is_one_masked_line(amqp_env: dict[str, str],
                                                    rabbitmq_url: str) -> None:
    secret = "wrong-rabbit-pw"
    bad = rabbitmq_url.replace("guest:guest@", f"guest:{secret}@", 1)
    assert bad != rabbitmq_url
    env = {**amqp_env, "CELERY_BROKER_URL": bad}
    base = [sys.executable, "-m", "celery", "-A", "schedproj.app"]
    for process, args in (("beat", ["beat", "-S", "fair"]),
                          ("worker", ["worker", "-Q", "light", "-c", "1"])):
        done = subprocess.run([*base, *args], env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=60)
        out = done.stdout + done.stderr
        assert done.returncode == 2, out[-3000:]
        lines = [line for line in out.splitlines() if f"cannot start {process}" in line]
        assert len(lines) == 1 and "Traceback" not in out, out[-3000:]
        assert "RabbitMQ at amqp://guest:***@" in lines[0], lines[0]
        assert "CELERY_BROKER_URL" in lines[0] and "refused the credentials" in lines[0]
        assert secret not in out


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_start_deadline_is_an_amqp_expiration_rabbitmq_enforces(
        amqp_env: dict[str, str], rabbitmq_url: str, e2e_redis: redis.Redis,
        tmp_path: Path) -> None:
    """No heavy worker: each grant's message carries an AMQP expiration of the start deadline
    (Celery's ``expires``), and RabbitMQ drops it when the grant lapses, so the queue never
    holds more than the current grant's message; a worker arriving runs the current one."""
    keys = Keys("schedproj")
    env = {**amqp_env, "E2E_SCENARIO": "deadline"}
    cluster = Cluster(env=env, logdir=tmp_path)
    deadline_s = float(FAST_SETTINGS["SCHEDPROJ_START_DEADLINE_S"])

    def fence() -> int:
        raw = e2e_redis.get(keys.lease)
        return int(json.loads(raw)["fence"]) if raw else 0

    try:
        cluster.worker("light1", "light", concurrency=3)
        cluster.beat("beat1")
        wait_for(lambda: fence() > 0, 15, "a first heavy grant")
        first = fence()
        # Look at the message RabbitMQ holds for it, and put it back.
        from kombu import Connection

        with Connection(rabbitmq_url) as conn:
            channel = conn.channel()
            message: Any = wait_for(lambda: channel.basic_get("heavy", no_ack=False), 5,
                                    "the heavy message in its queue")
            expiration_ms = float(message.properties["expiration"])
            channel.basic_reject(message.delivery_tag, requeue=True)
            channel.close()
        assert 0 < expiration_ms <= deadline_s * 1000, message.properties

        wait_for(lambda: fence() >= first + 2, 2 * deadline_s + 6,
                 "two more grants after the first lapsed")
        # Three messages were sent; RabbitMQ dropped the expired ones.
        wait_for(lambda: rabbitmq.queue_depth(rabbitmq_url, "heavy") <= 1, 3,
                 "expired heavy messages dropped by RabbitMQ")
        assert not any(json.loads(x)["lane"] == "e2e.quick"
                       for x in e2e_redis.lrange("schedproj:e2e:runs", 0, -1))

        started = time.time()
        cluster.worker("heavy1", "heavy")
        wait_for(lambda: any(json.loads(x)["lane"] == "e2e.quick"
                             for x in e2e_redis.lrange("schedproj:e2e:runs", 0, -1)),
                 deadline_s + 10, "the current grant runs once a heavy worker is there")
        assert time.time() - started < deadline_s + 10
    finally:
        cluster.stop_all()
