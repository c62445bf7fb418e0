"""The ``schedproj`` command line, run as a user would run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.conftest import E2E_REDIS_URL
from tests.procs import FAST_SETTINGS

ROOT = Path(__file__).resolve().parents[2]
SCHEDPROJ = [sys.executable, "-m", "schedproj.ops.cli"]


def run(*args: str, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([*SCHEDPROJ, *args], cwd=ROOT, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def test_lanes_json_lists_declared_lanes_in_declared_order() -> None:
    out = run("lanes", "--lanes", "tests.lanes_e2e", "--json",
              env={"E2E_SCENARIO": "fairness", "SCHEDPROJ_REDIS_URL": E2E_REDIS_URL})
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [lane["lane"] for lane in data["lanes"]] == ["e2e.backlog", "e2e.starved",
                                                         "e2e.light", "starvation-watchdog"]
    assert {lane["queue"] for lane in data["lanes"]} == {"heavy", "light"}


def test_lanes_lists_a_pool_lanes_queue_as_its_pools() -> None:
    out = run("lanes", "--lanes", "tests.pools_e2e", "--json",
              env={"SCHEDPROJ_POOLS": "gpu=2", "SCHEDPROJ_REDIS_URL": E2E_REDIS_URL})
    assert out.returncode == 0, out.stderr
    queues = {lane["lane"]: lane["queue"] for lane in json.loads(out.stdout)["lanes"]}
    assert queues["e2e.gpu.both"] == queues["e2e.gpu.0"] == "gpu"
    assert queues["e2e.heavy.0"] == "heavy"


def test_lanes_reports_a_bad_module_without_a_traceback() -> None:
    out = run("lanes", "--lanes", "no.such.module")
    assert out.returncode != 0
    assert "SCHEDPROJ_LANE_MODULES" in out.stderr and "Traceback" not in out.stderr


def test_bad_setting_names_the_variable() -> None:
    out = run("lanes", "--lanes", "tests.lanes_e2e",
              env={"SCHEDPROJ_BEAT_LOCK_TTL_S": "1", "SCHEDPROJ_BEAT_MAX_LOOP_INTERVAL_S": "1"})
    assert out.returncode != 0
    assert "SCHEDPROJ_BEAT_LOCK_TTL_S" in out.stderr + out.stdout


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_up_runs_beat_and_one_worker_per_queue(e2e_redis: redis.Redis) -> None:
    env = {**FAST_SETTINGS, "CELERY_BROKER_URL": E2E_REDIS_URL,
           "SCHEDPROJ_REDIS_URL": E2E_REDIS_URL, "E2E_SCENARIO": "deadline"}
    out = run("up", "--lanes", "tests.lanes_e2e", "--for", "12", env=env, timeout=90)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lanes = {json.loads(x)["lane"] for x in e2e_redis.lrange("schedproj:e2e:runs", 0, -1)}
    assert lanes == {"e2e.quick", "e2e.slowlight"}, out.stdout[-3000:]
    assert "[beat ]" in out.stdout and "[heavy]" in out.stdout and "[light]" in out.stdout


def test_settings_errors_never_print_a_password() -> None:
    from schedproj.core.errors import ConfigurationError
    from schedproj.settings import Settings
    from schedproj.store.connection import mask

    assert mask("rediss://user:s3cret@host:6380/1") == "rediss://user:***@host:6380/1"
    assert mask("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    with pytest.raises(ConfigurationError) as err:
        Settings.load(broker_url="amqp://guest:s3cret@host//")
    assert "SCHEDPROJ_REDIS_URL" in str(err.value) and "s3cret" not in str(err.value)


def test_unknown_settings_are_named() -> None:
    from schedproj.core.errors import ConfigurationError
    from schedproj.settings import Settings

    with pytest.raises(ConfigurationError, match="hold_cap"):
        Settings.load(hold_cap=5)
    out = run("lanes", "--lanes", "tests.lanes_e2e", env={"SCHEDPROJ_HOLD_CAP": "5"})
    assert "SCHEDPROJ_HOLD_CAP" in out.stderr and "SCHEDPROJ_HOLD_CAP_S" in out.stderr
