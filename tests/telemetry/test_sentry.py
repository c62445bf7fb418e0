"""Sentry: error events and Crons check-ins from beat and workers, no PII, no credentials.

Nothing goes over a network: a capturing transport (tests/sentry_capture.py) records the
envelopes sentry-sdk would send. In-process tests check :func:`init_sentry` itself; the end-to-end
test runs real ``celery beat -S fair`` and heavy/light workers with ``SENTRY_DSN`` set, each
process pushing what it would send to a Redis list.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sentry_sdk
from sentry_sdk.integrations.celery import CeleryIntegration

from schedproj.settings import Settings
from schedproj.store.protocol import Keys
from schedproj.telemetry import sentry as sentry_setup
from schedproj.telemetry.sentry import init_sentry, redact
from tests.conftest import E2E_REDIS_URL
from tests.on_celery.test_schedule_entries import queues  # noqa: F401
from tests.procs import FAST_SETTINGS, Cluster, wait_for
from tests.sentry_capture import ENV_KEY, MemoryTransport, read_captured

#: A DSN nobody listens on (port 9, discard); its public key must never show up anywhere.
PUBLIC_KEY = "e2e0sentry0public0key"
DSN = f"http://{PUBLIC_KEY}@127.0.0.1:9/1"
BROKEN, FINE = "e2e-sentry-broken", "e2e-sentry-fine"


def settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {"sentry_dsn": DSN, "sentry_environment": "test",
                              "sentry_release": "schedproj-test"}
    values.update(overrides)
    return Settings.load(**values)


@pytest.fixture
def sentry_off() -> Iterator[None]:
    """Leave no Sentry client behind (the integration's patches are inert without one)."""
    yield
    sentry_sdk.get_client().close()
    sentry_sdk.get_global_scope().set_client(None)
    sentry_sdk.get_global_scope().remove_tag("schedproj.role")
    sentry_setup._initialised_pid = None


# -- in process ------------------------------------------------------------------------------

def test_without_dsn_sentry_stays_off(sentry_off: None) -> None:
    assert init_sentry(settings(sentry_dsn=None), "worker") is False
    assert not sentry_sdk.get_client().is_active()


def test_options_defaults_and_idempotence(sentry_off: None,
                                          caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="schedproj.telemetry.sentry")
    transport = MemoryTransport()
    assert init_sentry(settings(), "beat", transport=transport)
    client = sentry_sdk.get_client()
    assert client.options["send_default_pii"] is False
    assert client.options["environment"] == "test"
    assert client.options["release"] == "schedproj-test"
    integration = client.get_integration(CeleryIntegration)
    assert integration is not None and integration.monitor_beat_tasks is True
    # A second call in the same process (solo worker: worker_init + worker_process_init) is a
    # no-op: same client.
    assert init_sentry(settings(), "worker")
    assert sentry_sdk.get_client() is client
    assert "sentry enabled for beat" in caplog.text
    assert PUBLIC_KEY not in caplog.text and DSN not in caplog.text


def test_beat_monitoring_and_pii_follow_settings(sentry_off: None) -> None:
    init_sentry(settings(sentry_beat_monitoring=False, sentry_send_default_pii=True), "beat",
                transport=MemoryTransport())
    client = sentry_sdk.get_client()
    integration = client.get_integration(CeleryIntegration)
    assert integration is not None and integration.monitor_beat_tasks is False
    assert client.options["send_default_pii"] is True


def test_bad_dsn_stops_at_start_naming_the_setting_not_its_value(
        sentry_off: None, capsys: pytest.CaptureFixture[str]) -> None:
    secret = "not-a-dsn-but-secret"
    with pytest.raises(SystemExit) as exc:
        init_sentry(settings(sentry_dsn=secret), "beat")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "SENTRY_DSN" in err and "Fix:" in err
    assert secret not in err


def test_redact_url_credentials() -> None:
    assert redact("redis://:hunter2@db:6379/0") == "redis://[Filtered]@db:6379/0"
    assert redact(f"Settings(sentry_dsn='{DSN}')") == \
        "Settings(sentry_dsn='http://[Filtered]@127.0.0.1:9/1')"
    assert redact("rediss://user:pw@h/1 and amqp://u:p@q//") == \
        "rediss://[Filtered]@h/1 and amqp://[Filtered]@q//"
    assert redact("http://example.com/a@b") == "http://example.com/a@b"


def test_a_lease_token_rendered_in_a_log_line_never_reaches_sentry(sentry_off: None) -> None:
    """Celery logs "Task ... received" with the message's kwargs as a repr; sentry-sdk keeps
    that line as a breadcrumb of the next event. The token inside must be filtered."""
    token = uuid.uuid4().hex
    init_sentry(settings(), "worker", transport=MemoryTransport)
    import logging
    received = logging.getLogger("celery.worker.strategy")
    level = received.level
    received.setLevel(logging.INFO)  # as under `celery worker -l info`
    received.info(
        "Task %s received", "t.heavy", extra={"data": {"kwargs": repr(
            {"schedproj_lease": {"token": token, "fence": 7, "beat_fence": 3}})}})
    received.setLevel(level)
    sentry_sdk.capture_message("after the received line")
    transport = sentry_sdk.get_client().transport
    assert isinstance(transport, MemoryTransport)
    (event,) = transport.of_type("event")
    crumbs = json.dumps(event.get("breadcrumbs"))
    assert "t.heavy" in crumbs, "the received line should be a breadcrumb"
    assert token not in json.dumps(event)
    assert redact(f"{{'token': '{token}', 'fence': 7}}") == "{'token': '[Filtered]', 'fence': 7}"


def test_crons_exclusions_cover_cadences_crons_cannot_monitor() -> None:
    from sentry_sdk.utils import match_regex_list

    from schedproj.core.lanes import LaneKind, LaneSpec

    specs = [LaneSpec(name, f"t.{name}", LaneKind.LIGHT, cadence) for name, cadence in
             (("fast", 3.0), ("ninety", 90.0), ("minute", 60.0), ("hourly", 3600.0),
              ("a.b", 0.5), ("a-b", 120.0))]
    patterns = sentry_setup.crons_exclusions(specs)
    excluded = {s.name for s in specs if match_regex_list(s.name, patterns)}
    assert excluded == {"fast", "ninety", "a.b"}


def _fail_holding_secrets(local_settings: Settings, token: str) -> None:
    grant = {"token": token, "fence": 7}  # what a heavy lane's frames hold
    kwargs = {"schedproj_lease": grant}
    assert local_settings and kwargs
    raise RuntimeError("lane blew up")


def _capture_failure(broker: str, token: str) -> dict[str, Any]:
    try:
        _fail_holding_secrets(settings(broker_url=broker), token)
    except RuntimeError:
        sentry_sdk.capture_exception()
    transport = sentry_sdk.get_client().transport
    assert isinstance(transport, MemoryTransport)
    (event,) = transport.of_type("event")
    return event


def test_error_events_carry_no_credentials(sentry_off: None) -> None:
    """Frame variables hold the lease grant and the settings (whose repr shows the broker URL and
    the DSN): scrubbed. The control run without schedproj's scrubbing shows they would leak."""
    password, token = uuid.uuid4().hex, uuid.uuid4().hex  # not in any source line
    broker = f"redis://:{password}@127.0.0.1:6379/15"
    sentry_sdk.init(dsn=DSN, transport=MemoryTransport())
    leaky = json.dumps(_capture_failure(broker, token))
    assert password in leaky and token in leaky and PUBLIC_KEY in leaky, \
        "control: without the scrubbing, the frames' secrets are sent"

    init_sentry(settings(), "worker", transport=MemoryTransport())
    event = _capture_failure(broker, token)
    text = json.dumps(event)
    assert event["exception"]["values"][-1]["type"] == "RuntimeError"
    assert event["tags"]["schedproj.role"] == "worker"
    for secret in (password, token, PUBLIC_KEY):
        assert secret not in text, secret
    assert "user" not in event and "request" not in event


# -- end to end --------------------------------------------------------------------------------

def _cluster(tmp_path: Path, capture_key: str) -> Cluster:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SENTRY_", "SCHEDPROJ_"))}
    env.update(FAST_SETTINGS)
    env.update({
        "CELERY_BROKER_URL": E2E_REDIS_URL,
        "SCHEDPROJ_REDIS_URL": E2E_REDIS_URL,
        "SCHEDPROJ_KEY_PREFIX": "schedproj",
        "E2E_SCENARIO": "sentry",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "SENTRY_DSN": DSN,
        "SENTRY_ENVIRONMENT": "e2e",
        "SENTRY_RELEASE": "schedproj-e2e",
        ENV_KEY: capture_key,
    })
    return Cluster(env=env, logdir=tmp_path)


def _of(items: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [x for x in items if x["type"] == kind]


def _checkins(items: list[dict[str, Any]], slug: str) -> list[dict[str, Any]]:
    return [x for x in _of(items, "check_in") if x["payload"]["monitor_slug"] == slug]


def _lane_error(items: list[dict[str, Any]]) -> dict[str, Any] | None:
    for x in _of(items, "event"):
        values = x["payload"].get("exception", {}).get("values", [])
        if values and values[-1]["type"] == "LaneBroke":
            return x
    return None


def _complete(items: list[dict[str, Any]]) -> bool:
    statuses = {(x["payload"]["monitor_slug"], x["payload"]["status"])
                for x in _of(items, "check_in")}
    return _lane_error(items) is not None and statuses >= {
        (BROKEN, "in_progress"), (BROKEN, "error"), (FINE, "in_progress"), (FINE, "ok")}


@pytest.mark.e2e
@pytest.mark.timeout(60)
def test_lane_errors_and_checkins_reach_sentry_from_beat_and_workers(
        e2e_redis: redis.Redis, tmp_path: Path) -> None:
    key = "e2e:sentry:captured"
    c = _cluster(tmp_path, key)
    try:
        c.worker("heavy1", "heavy")
        # Light on the solo pool: worker_init and worker_process_init in one process.
        light = c.start("light1", "worker", "-Q", "light", "-P", "solo", "-n", "light1@%h",
                        "--without-gossip", "--without-mingle", "-l", "info")
        wait_for(lambda: "ready." in light.text() or not light.alive(), 30, "light1 ready")
        c.beat("beat1")
        wait_for(lambda: _complete(read_captured(e2e_redis, key)), 25,
                 "the lane error event and four check-ins")
    finally:
        c.stop_all()
    items = read_captured(e2e_redis, key)

    # Every process turned Sentry on from SENTRY_DSN, with PII off by default.
    clients = _of(items, "_client")
    assert {x["process"] for x in clients} >= {"beat", "worker:heavy1", "worker:light1"}
    # Once per process: the prefork heavy worker's child initialises its own client (two
    # pids), the solo light worker only once although it gets both signals.
    pids = [x["pid"] for x in clients]
    assert len(pids) == len(set(pids)), clients
    assert len({x["pid"] for x in clients if x["process"] == "worker:heavy1"}) == 2
    assert len({x["pid"] for x in clients if x["process"] == "worker:light1"}) == 1
    for x in clients:
        assert x["payload"]["send_default_pii"] is False
        assert x["payload"]["environment"] == "e2e"
        assert "CeleryIntegration" in x["payload"]["integrations"]

    # (a) The failing lane produced one error event carrying its exception, from the heavy
    # worker, for the task id the lane's run record names.
    error = _lane_error(items)
    assert error is not None and error["process"] == "worker:heavy1"
    event = error["payload"]
    exc = event["exception"]["values"][-1]
    assert exc["value"] == "e2e-sentry-broken failed on purpose"
    assert (exc["mechanism"]["type"], exc["mechanism"]["handled"]) == ("celery", False)
    assert event["level"] == "error"
    assert event["environment"] == "e2e" and event["release"] == "schedproj-e2e"
    assert event["tags"]["schedproj.role"] == "worker"
    run = json.loads(e2e_redis.hget(Keys("schedproj").lanes, f"{BROKEN}|run") or "{}")
    assert run["last_outcome"] == "failed"
    assert event["tags"]["celery_task_id"] == run["last_task_id"]
    assert event["extra"]["celery-job"]["task_name"] == "e2e.sentry-broken"

    # (b) Check-ins: in_progress from beat at dispatch, closed by the worker with the same
    # check-in id; the monitor slug is the lane name (not the task name).
    for slug, final, worker in ((BROKEN, "error", "worker:heavy1"),
                                (FINE, "ok", "worker:light1")):
        checkins = _checkins(items, slug)
        opened = [x for x in checkins if x["payload"]["status"] == "in_progress"]
        closed = [x for x in checkins if x["payload"]["status"] == final]
        assert opened and closed, checkins
        assert {x["process"] for x in opened} == {"beat"}
        assert {x["process"] for x in closed} == {worker}
        assert closed[0]["payload"]["check_in_id"] == opened[0]["payload"]["check_in_id"]
        assert closed[0]["payload"]["duration"] >= 0
        assert opened[0]["payload"]["monitor_config"]["schedule"] == {
            "type": "interval", "value": 1, "unit": "minute"}
        assert not [x for x in checkins if x["payload"]["status"] not in ("in_progress", final)]

    # (c) No PII, no credentials: no user or request data, the job's arguments filtered, and
    # neither the lease token from the message nor the DSN's key anywhere in the event.
    assert "user" not in event and "request" not in event
    assert event["extra"]["celery-job"]["args"] == "[Filtered]"
    assert event["extra"]["celery-job"]["kwargs"] == "[Filtered]"
    broken_runs = [json.loads(x) for x in e2e_redis.lrange("schedproj:e2e:runs", 0, -1)]
    tokens = [x["token"] for x in broken_runs if x["lane"] == BROKEN]
    assert tokens and all(tokens)
    text = json.dumps(items)
    for secret in (*tokens, PUBLIC_KEY):
        assert secret not in text, f"{secret!r} reached Sentry"
    # They were there to leak: the lanes' frames hold the grant and the settings' repr.
    frames = event["exception"]["values"][-1]["stacktrace"]["frames"]
    grants = [f["vars"]["grant"] for f in frames if "grant" in f.get("vars", {})]
    assert grants and all(g["token"] == "[Filtered]" for g in grants), grants
    assert "sentry_dsn='http://[Filtered]@127.0.0.1:9/1'" in json.dumps(event)
    # ... nor in any process's log. Beat and the prefork child say Sentry is on (a worker's
    # main process initialises at worker_init, before Celery has set up its logging).
    for proc in c.procs:
        assert PUBLIC_KEY not in proc.text(), f"the DSN shows in {proc.name}'s log"
    logs = {proc.name: proc.text() for proc in c.procs}
    assert "sentry enabled for beat (environment e2e" in logs["beat1"]
    assert "sentry enabled for worker (environment e2e" in logs["heavy1"]


def test_schedule_entries_open_crons_check_ins_named_after_the_entry(
        sentry_off: None, key_prefix: str, queues: redis.Redis,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries go through the scheduler's ``apply_entry``, which sentry-sdk's Celery
    integration wraps: a crontab entry opens a check-in with its crontab as the monitor's
    schedule; an interval Crons cannot monitor (not whole minutes) is left out."""
    from celery.schedules import crontab

    from schedproj.on_celery.beat import FairScheduler
    from tests.on_celery.test_schedule_entries import app_with

    transport = MemoryTransport()
    real_init = sentry_sdk.init
    monkeypatch.setattr(sentry_sdk, "init",
                        lambda *a, **kw: real_init(*a, **{**kw, "transport": transport}))
    app = app_with(key_prefix, {
        "nightly": {"task": "shop.report", "schedule": crontab(minute=30, hour=3)},
        "fast": {"task": "shop.report", "schedule": 0.2},
    }, sentry_dsn=DSN)
    sched = FairScheduler(app=app)
    sched.tick()
    sched.engine.entries.store.run_now("nightly")
    time.sleep(0.25)
    sched.tick()
    sentry_sdk.get_client().flush(timeout=5)
    checkins = transport.of_type("check_in")
    # The lane beside them opens its own; "fast" (0.2 s) sent too, but left out of Crons.
    assert {c["monitor_slug"] for c in checkins} == {"nightly", "t.light"}, checkins
    assert len(queues.lrange("celery", 0, -1)) == 2, "nightly and fast were both sent"
    (opened,) = [c for c in checkins if c["monitor_slug"] == "nightly"]
    assert opened["status"] == "in_progress"
    assert opened["monitor_config"]["schedule"] == {"type": "crontab", "value": "30 3 * * *"}
    sched.close()


# -- calendar lanes in Sentry Crons ------------------------------------------------------------

def test_calendar_lanes_check_in_on_their_own_calendar(sentry_off: None) -> None:
    """Through sentry-sdk's own beat hook (what ``FairScheduler.apply_entry`` runs): an entry
    whose schedule is :func:`crons_schedule` opens a check-in, and gives the worker headers to
    close it with, that name the lane's crontab and its zone (not the app's), so Sentry
    expects each fire time and marks one schedproj skips for its catch-up window missed."""
    from datetime import timedelta
    from types import SimpleNamespace

    from celery import Celery
    from celery.beat import ScheduleEntry
    from celery.schedules import schedule as every
    from sentry_sdk.integrations.celery.beat import _apply_crons_data_to_schedule_entry

    from schedproj.core.lanes import LaneKind, LaneSpec
    from schedproj.core.schedules import CronFireTimes, OneOffFireTimes, OpaqueFireTimes

    def spec(name: str, calendar: Any = None, cadence_s: float = 86400.0) -> LaneSpec:
        return LaneSpec(name, f"t.{name}", LaneKind.HEAVY, cadence_s, calendar=calendar,
                        catchup_window_s=None if calendar is None else 600.0)

    backup = spec("backup", CronFireTimes("30 2 * * mon-fri", "Europe/Berlin"))
    quarterly = spec("quarterly", CronFireTimes("*/15 * * * *", "America/New_York"), 900.0)
    sweep = spec("sweep", cadence_s=600.0)
    # What Sentry cannot express keeps the interval monitor of the nominal period.
    for other in (sweep, spec("solar", OpaqueFireTimes("celery <solar>")),
                  spec("once", OneOffFireTimes(1e9))):
        assert sentry_setup.crons_schedule(other) is None
    transport = MemoryTransport()
    assert init_sentry(settings(), "beat", transport=transport)
    app = Celery("calendar-crons", set_as_current=False)   # the app's zone: UTC
    integration = sentry_sdk.get_client().get_integration(CeleryIntegration)
    headers = {}
    for lane in (backup, quarterly, sweep):
        schedule = (sentry_setup.crons_schedule(lane)
                    or every(timedelta(seconds=lane.cadence_s)))
        entry = ScheduleEntry(name=lane.name, task=lane.task_name, app=app, schedule=schedule,
                              options={})
        _apply_crons_data_to_schedule_entry(SimpleNamespace(app=app), entry, integration)
        headers[lane.name] = entry.options["headers"]["sentry-monitor-config"]
    sentry_sdk.get_client().flush(timeout=5)
    configs = {c["monitor_slug"]: c["monitor_config"] for c in transport.of_type("check_in")}
    assert configs == headers
    assert configs["backup"] == {"schedule": {"type": "crontab", "value": "30 2 * * mon-fri"},
                                 "timezone": "Europe/Berlin"}
    assert configs["quarterly"] == {"schedule": {"type": "crontab", "value": "*/15 * * * *"},
                                    "timezone": "America/New_York"}
    assert configs["sweep"] == {"schedule": {"type": "interval", "value": 10, "unit": "minute"},
                                "timezone": "UTC"}
