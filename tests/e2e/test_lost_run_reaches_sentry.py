"""A run recorded ``lost`` reaches Sentry (issue 10, "a failure in status, metrics and Sentry").

Real processes: beat and a heavy worker with ``SENTRY_DSN`` set, their envelopes captured by
the transport of tests/sentry_capture.py (the only thing swapped: the HTTP hop to Sentry).
The heavy worker is SIGKILLed mid-run; its lease lapses; beat records the run lost, and the
error it logs is an event naming the lane, the run and that it was lost, with no credentials
(neither the DSN's key nor the lease token of the lost run).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from schedproj.devtools.redis_server import RedisServer
from schedproj.store.lane_store import LaneStore
from schedproj.store.protocol import Keys
from tests.conftest import E2E_REDIS_URL
from tests.procs import FAST_SETTINGS, Cluster, wait_for
from tests.sentry_capture import ENV_KEY, ENV_URL, read_captured

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

PUBLIC_KEY = "e2e0lost0sentry0key"
DSN = f"http://{PUBLIC_KEY}@127.0.0.1:9/1"
PREFIX = "schedproj"
KEYS = Keys(PREFIX)
CAPTURED = "e2e:sentry:lost"


@pytest.fixture
def state(tmp_path: Path) -> Iterator[RedisServer]:
    proc = RedisServer(tmp_path, "state")
    proc.start()
    yield proc
    proc.kill()


def _lost_event(items: list[dict[str, Any]]) -> dict[str, Any] | None:
    for x in items:
        if x["type"] == "event" and "lost" in (x["payload"].get("logentry") or {}).get(
                "message", ""):
            return x
    return None


def test_a_run_recorded_lost_is_a_sentry_error_naming_the_lane(
        e2e_redis: redis.Redis, tmp_path: Path, state: RedisServer) -> None:
    client = redis.Redis.from_url(state.url, decode_responses=True)
    LaneStore(client, KEYS).declare_fresh()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SENTRY_", "SCHEDPROJ_"))}
    env.update(FAST_SETTINGS)
    env.update({"CELERY_BROKER_URL": E2E_REDIS_URL, "SCHEDPROJ_REDIS_URL": state.url,
                "SCHEDPROJ_KEY_PREFIX": PREFIX, "E2E_SCENARIO": "slow",
                "SCHEDPROJ_HOLD_CAP_S": "60",
                "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
                "SENTRY_DSN": DSN, ENV_KEY: CAPTURED, ENV_URL: state.url})
    c = Cluster(env=env, logdir=tmp_path)
    try:
        victim = c.worker("heavy1", "heavy")
        c.beat("beat1")
        wait_for(lambda: client.llen(f"{PREFIX}:e2e:started") >= 1, 30,
                 "the long heavy lane started")
        lease = json.loads(client.get(KEYS.lease) or "{}")
        token = lease.get("token")
        assert token, lease
        victim.signal(signal.SIGKILL)
        victim.popen.wait()
        wait_for(lambda: _lost_event(read_captured(client, CAPTURED)), 20,
                 "the lost run's event captured from beat")
    finally:
        c.stop_all()
    items = read_captured(client, CAPTURED)
    event = _lost_event(items)
    assert event is not None and event["process"] == "beat"
    payload = event["payload"]
    lost = [e for e in (json.loads(x) for x in client.lrange(KEYS.journal, 0, -1))
            if e["ev"] == "lost"]
    assert lost and lost[0]["lane"] == "e2e.long"
    entry = payload["logentry"]
    assert payload["level"] == "error"
    assert payload["logger"] == "schedproj.beat"
    assert entry["message"].startswith("lane %s: run %s lost")
    assert entry["params"][:2] == ["e2e.long", lost[0]["task"]]
    assert "lost (its lease lapsed" in entry["formatted"]
    assert payload["tags"]["schedproj.role"] == "beat"
    run = json.loads(client.hget(KEYS.lanes, "e2e.long|run") or "{}")
    assert run.get("last_outcome") == "lost", run
    text = json.dumps(items)
    assert PUBLIC_KEY not in text, "the DSN's key reached Sentry"
    assert token not in text, "the lost run's lease token reached Sentry"
