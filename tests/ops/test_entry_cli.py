"""Runtime schedule entries and the verbs on entries, from the command line (as a user runs it)
and from Python, against real Redis and an in-process FairScheduler that picks them up."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis

import schedproj
from schedproj.core.entries import EntryDefinition
from schedproj.core.errors import ConfigurationError
from schedproj.on_celery.beat import FairScheduler
from schedproj.store.protocol import Keys
from tests.conftest import REDIS_URL
from tests.on_celery.test_schedule_entries import app_with, messages, queues  # noqa: F401
from tests.ops.test_cli import run


def cli(prefix: str, *args: str) -> Any:
    return run(*args, env={"SCHEDPROJ_REDIS_URL": REDIS_URL, "SCHEDPROJ_KEY_PREFIX": prefix})


def test_entry_add_list_pause_run_remove_from_the_command_line(
        key_prefix: str, queues: redis.Redis, redis_client: redis.Redis) -> None:  # noqa: F811
    sched = FairScheduler(app=app_with(key_prefix, {"nightly": {"task": "shop.report",
                                                                "schedule": 86400.0}}))
    sched.tick()
    out = cli(key_prefix, "entry", "add", "cleanup", "shop.report", "--cron", "0 3 * * *",
              "--args", '["x"]', "--queue", "reports")
    assert out.returncode == 0, out.stderr
    assert "added schedule entry cleanup" in out.stdout and "not checked" in out.stderr
    sched.tick()
    listed = json.loads(cli(key_prefix, "entry", "list", "--json").stdout)
    by_name = {r["name"]: r for r in listed}
    assert by_name["cleanup"]["source"] == "runtime" and "3" in by_name["cleanup"]["schedule"]
    assert by_name["nightly"]["source"] == "code"
    assert by_name["cleanup"]["next_due_at"] is not None

    assert cli(key_prefix, "run", "cleanup").returncode == 0
    sched.tick()
    assert [m["args"] for m in messages(queues, "reports")] == ["['x']"]
    assert cli(key_prefix, "pause", "nightly").stdout.startswith("paused schedule entry")
    status = json.loads(cli(key_prefix, "status", "--json").stdout)
    assert {e["name"]: e["paused"] for e in status["entries"]} == {"cleanup": False,
                                                                   "nightly": True}
    assert "schedule entries (2)" in cli(key_prefix, "status").stdout
    assert "resumed" in cli(key_prefix, "resume", "nightly").stdout

    assert cli(key_prefix, "entry", "remove", "cleanup").returncode == 0
    sched.tick()
    assert [r["name"] for r in json.loads(cli(key_prefix, "entry", "list", "--json").stdout)
            ] == ["nightly"]
    sched.close()


def test_bad_definitions_are_refused_with_the_fix(key_prefix: str,
                                                  redis_client: redis.Redis) -> None:
    sched = FairScheduler(app=app_with(key_prefix, {"nightly": {"task": "shop.report",
                                                                "schedule": 86400.0}}))
    sched.tick()
    cases = [
        (("entry", "add", "x", "t", "--cron", "61 * * * *"), "not a valid crontab"),
        (("entry", "add", "x", "t"), "exactly one schedule"),
        (("entry", "add", "x", "t", "--every", "0"), "positive number"),
        (("entry", "add", "x", "t", "--every", "5", "--args", "{bad"), "--args is not JSON"),
        (("entry", "add", "nightly", "t", "--every", "5"), "change it in the code"),
        (("entry", "add", "t.light", "t", "--every", "5"), "is a lane"),
        (("entry", "add", "a b", "t", "--every", "5"), "entry name"),
        (("entry", "remove", "nightly"), "removed in the code"),
    ]
    for args, says in cases:
        out = cli(key_prefix, *args)
        assert out.returncode != 0 and says in out.stderr, (args, out.stderr)
    assert not redis_client.hgetall(Keys(key_prefix).entry_defs)
    sched.close()


def test_the_python_api_adds_changes_and_removes(key_prefix: str, queues: redis.Redis,  # noqa: F811
                                                 caplog: pytest.LogCaptureFixture) -> None:
    app = app_with(key_prefix, {})
    sched = FairScheduler(app=app)
    sched.tick()
    added = schedproj.add_entry(app, "every", "shop.report", every=0.3, kwargs={"k": 1})
    assert not added.replaced and not added.warnings
    unknown = schedproj.add_entry(app, "other", "shop.nope", every=60)
    assert "not registered" in unknown.warnings[0] and "not registered" in caplog.text
    sched.tick()
    time.sleep(0.35)
    sched.tick()
    assert [m["headers"]["kwargsrepr"] for m in messages(queues, "celery")] == ["{'k': 1}"]
    assert schedproj.add_entry(app, "every", "shop.report", cron="*/5 * * * *").replaced
    assert isinstance(schedproj.list_entries(app)["every"], EntryDefinition)
    with pytest.raises(ConfigurationError, match="not a valid crontab"):
        schedproj.add_entry(app, "bad", "shop.report", cron="* * * * 9")
    assert schedproj.remove_entry(app, "every") and not schedproj.remove_entry(app, "every")
    sched.close()


def test_lanes_lists_the_apps_entries_with_their_next_due_time(key_prefix: str) -> None:
    out = run("lanes", "-A", "tests.entry_app", "--json",
              env={"SCHEDPROJ_REDIS_URL": REDIS_URL, "SCHEDPROJ_KEY_PREFIX": key_prefix})
    assert out.returncode == 0, out.stderr
    listed = json.loads(out.stdout)
    assert [lane["lane"] for lane in listed["lanes"]] == ["entry_app.light"]
    entries = {e["entry"]: e for e in listed["entries"]}
    assert set(entries) == {"morning-report", "ping"}
    assert "0 9" in entries["morning-report"]["schedule"]
    assert entries["ping"]["next_due_at"] is None, "no beat ran: nothing indexed yet"
    text = run("lanes", "-A", "tests.entry_app",
               env={"SCHEDPROJ_REDIS_URL": REDIS_URL, "SCHEDPROJ_KEY_PREFIX": key_prefix})
    assert "schedule entries (2)" in text.stdout
