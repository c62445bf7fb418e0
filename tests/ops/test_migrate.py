"""``schedproj migrate`` against the real old schedulers: Celery's PersistentScheduler writes a
real celerybeat-schedule file and celery-redbeat real keys (both run in process and send to the
test broker); migrate imports them, the FairScheduler judges every imported entry exactly as the
old scheduler judges it from its own state, and a FairScheduler started right after sends the
entries that are due and no other.

The PersistentScheduler runs on a clock the test sets (the schedules' ``nowfun``, which the file
keeps), so its runs happen at chosen moments hours back. redbeat reads the wall clock in places
no ``nowfun`` reaches, so it runs in real time, its earlier runs recorded through its own
``RedBeatSchedulerEntry``.
"""

from __future__ import annotations

import ast
import json
import os
import shelve
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from celery import Celery, _state
from celery.beat import PersistentScheduler
from celery.schedules import crontab, schedule
from click.testing import CliRunner, Result

from schedproj.core.entries import EntryState
from schedproj.on_celery.beat import FairScheduler
from schedproj.on_celery.entries import CeleryTiming, code_entries, schedule_key
from schedproj.ops.cli import main
from schedproj.ops.migrate import epoch_of, redbeat_time
from schedproj.ops.runtime_entries import define
from schedproj.store.protocol import Keys
from tests.conftest import BROKER_URL, REDIS_URL, make_app

TZ = ZoneInfo("Europe/Berlin")
#: The app ``schedproj migrate -A tests.ops.test_migrate:APP`` loads (set by each test).
APP: Celery | None = None
#: The time the test's schedules read (None: the wall clock).
_FROZEN: list[datetime | None] = [None]


def clock_now() -> datetime:
    """The schedules' ``nowfun``: module level, so the PersistentScheduler's file can keep it."""
    return (_FROZEN[0] or datetime.now(UTC)).astimezone(TZ)


@pytest.fixture
def clock() -> Iterator[list[datetime | None]]:
    yield _FROZEN
    _FROZEN[0] = None


@pytest.fixture
def queue(key_prefix: str) -> Iterator[str]:
    """A queue of this test's own on the broker; the entries send there."""
    name = f"migrate-{key_prefix}"
    client = redis.Redis.from_url(BROKER_URL, decode_responses=True)
    yield name
    client.delete(name)
    client.close()


def sent_entries(queue: str) -> list[str]:
    """The entry names (each entry sends its own name as its argument) waiting in ``queue``."""
    client = redis.Redis.from_url(BROKER_URL, decode_responses=True)
    try:
        return sorted(ast.literal_eval(json.loads(m)["headers"]["argsrepr"])[0]
                      for m in client.lrange(queue, 0, -1))
    finally:
        client.close()


def empty(queue: str) -> None:
    client = redis.Redis.from_url(BROKER_URL, decode_responses=True)
    client.delete(queue)
    client.close()


def app_for(key_prefix: str, queue: str, schedules: dict[str, Any], **conf: Any) -> Celery:
    def declare(app: Celery) -> None:
        @app.task(shared=False, name="shop.report")
        def report(*args: Any) -> None: ...

        app.conf.timezone = "Europe/Berlin"
        app.conf.beat_schedule = {name: {"task": "shop.report", "schedule": sched,
                                         "args": (name,), "options": {"queue": queue}}
                                  for name, sched in schedules.items()}
        app.conf.update(conf)

    app = make_app(key_prefix, declare)
    assert app.timezone == TZ
    global APP
    APP = app
    return app


def migrate(*args: str) -> Result:
    return CliRunner().invoke(main, ["migrate", "-A", f"{__name__}:APP", *args],
                              catch_exceptions=False)


def states(client: redis.Redis, prefix: str) -> dict[str, EntryState]:
    return {str(k): EntryState.decode(v, "t")
            for k, v in client.hgetall(Keys(prefix).entries).items()}


def judged(app: Celery, name: str, last_run_at: float) -> tuple[bool, float]:
    """How the FairScheduler judges the entry from an imported last run."""
    entry = code_entries(app)[name]
    return CeleryTiming(entry.schedule, app.timezone).check(last_run_at)


def clear_of_a_minute_boundary(margin_s: float = 2.0) -> None:
    """Wait out the last ``margin_s`` seconds of a minute: crontab(minute='*') turns due at
    the boundary, and the two schedulers are asked one after the other."""
    now = datetime.now(UTC)
    into = now.second + now.microsecond / 1e6
    if into >= 60 - margin_s:
        time.sleep(60.2 - into)


# -- PersistentScheduler ------------------------------------------------------------------------
def file_schedules() -> dict[str, Any]:
    return {
        "every-10min": schedule(timedelta(minutes=10), nowfun=clock_now),
        "hourly": schedule(timedelta(hours=1), nowfun=clock_now),
        "minutely": crontab(minute="*", nowfun=clock_now),
        "at-nine": crontab(minute=0, hour=9, nowfun=clock_now),
    }


def run_old_beat(app: Celery, path: Path, clock: list[datetime | None],
                 ticks: list[datetime]) -> None:
    """``celery beat`` (PersistentScheduler) started at ``ticks[0]``, ticking at each later
    moment until nothing is due, then stopped as SIGTERM stops it (its file synced)."""
    clock[0] = ticks[0]
    with as_current(app):
        old = PersistentScheduler(app=app, schedule_filename=str(path))
        for at in ticks[1:]:
            clock[0] = at
            for _ in range(20):
                if old.tick() != 0:
                    break
        old.close()


@contextmanager
def as_current(app: Celery) -> Iterator[None]:
    """The app current, as in a `celery beat` process: the schedules Celery unpickles from
    its file carry no app and read their time zone from the current one."""
    before = _state.get_current_app()
    app.set_current()
    try:
        yield
    finally:
        before.set_current()


def old_view(app: Celery, path: Path) -> dict[str, Any]:
    """The old beat restarted on its file: its entries as it would judge them (without the
    result cleanup Celery adds itself, which -S fair runs only for an app with a result
    backend). Judge them inside :func:`as_current`."""
    with as_current(app):
        old = PersistentScheduler(app=app, schedule_filename=str(path))
        entries = {k: v for k, v in old.schedule.items() if k != "celery.backend_cleanup"}
        old.close()
    return entries


def test_a_celerybeat_schedule_file_is_imported_and_judged_as_celery_judged_it(
        key_prefix: str, queue: str, redis_client: redis.Redis, tmp_path: Path,
        clock: list[datetime | None]) -> None:
    app = app_for(key_prefix, queue, file_schedules())
    path = tmp_path / "celerybeat-schedule"
    base = datetime.now(UTC).replace(microsecond=0)
    # Started 3 h ago, ticked 2 h ago, 65 min ago and 20 min ago, then stopped.
    run_old_beat(app, path, clock, [base - timedelta(hours=3), base - timedelta(hours=2),
                                    base - timedelta(minutes=65),
                                    base - timedelta(minutes=20)])
    clock[0] = base
    result = migrate("--from-file", str(path))
    assert result.exit_code == 0, result.output
    assert "imported from the celerybeat-schedule file" in result.output

    old = old_view(app, path)
    found = states(redis_client, key_prefix)
    assert set(found) == set(file_schedules())
    for name, entry in old.items():
        state = found[name]
        assert state.last_run_at == epoch_of(entry.last_run_at), name
        assert state.total_run_count == entry.total_run_count, name
        assert state.schedule_key == schedule_key(entry.schedule)
    assert found["hourly"].last_run_at == (base - timedelta(minutes=20)).timestamp()
    assert found["every-10min"].total_run_count == 3

    # Now and at later moments, -S fair decides what Celery's beat decides from its file.
    for later in (timedelta(0), timedelta(minutes=5), timedelta(minutes=45),
                  timedelta(hours=7), timedelta(days=1, hours=1)):
        clock[0] = base + later
        for name, entry in old.items():
            with as_current(app):
                due, next_s = entry.is_due()
            assert judged(app, name, found[name].last_run_at) == (
                due, pytest.approx(next_s, abs=1e-6)), (name, later)

    # A FairScheduler started now sends what is due (the 10-minute entry, missed while the
    # old beat was down; the minutely crontab), and not the hourly entry (run 20 min ago).
    clock[0] = None
    clear_of_a_minute_boundary()
    with as_current(app):
        due_now = {name for name, entry in old.items() if entry.is_due()[0]}
    assert {"every-10min", "minutely"} <= due_now and "hourly" not in due_now
    empty(queue)
    fair = FairScheduler(app=app)
    fair.tick()
    assert sent_entries(queue) == sorted(due_now)
    fair.tick()
    assert sent_entries(queue) == sorted(due_now), "a due time was sent twice"
    fair.close()


def test_naive_last_runs_in_a_file_are_read_as_utc_as_celery_reads_them(
        key_prefix: str, queue: str, redis_client: redis.Redis, tmp_path: Path,
        clock: list[datetime | None]) -> None:
    """Celery before 4 wrote naive datetimes; Celery's schedules read a naive time as UTC."""
    app = app_for(key_prefix, queue, file_schedules())
    path = tmp_path / "celerybeat-schedule"
    base = datetime.now(UTC).replace(microsecond=0)
    run_old_beat(app, path, clock, [base - timedelta(hours=2), base - timedelta(minutes=30)])
    with shelve.open(str(path), writeback=True) as shelf:
        for entry in shelf["entries"].values():
            entry.last_run_at = entry.last_run_at.astimezone(UTC).replace(tzinfo=None)
    clock[0] = base
    result = migrate("--from-file", str(path))
    assert result.exit_code == 0, result.output
    old = old_view(app, path)
    found = states(redis_client, key_prefix)
    for name, entry in old.items():
        assert entry.last_run_at.tzinfo is None
        assert found[name].last_run_at == entry.last_run_at.replace(tzinfo=UTC).timestamp()
        with as_current(app):
            assert judged(app, name, found[name].last_run_at) == entry.is_due(), name


def test_migrate_refuses_while_fair_beat_runs_and_force_writes_into_it(
        key_prefix: str, queue: str, redis_client: redis.Redis, tmp_path: Path,
        clock: list[datetime | None]) -> None:
    app = app_for(key_prefix, queue, file_schedules())
    path = tmp_path / "celerybeat-schedule"
    base = datetime.now(UTC).replace(microsecond=0)
    run_old_beat(app, path, clock, [base - timedelta(hours=2), base - timedelta(minutes=30)])
    clock[0] = None
    empty(queue)
    fair = FairScheduler(app=app)
    fair.tick()  # counts every entry from now: a state in schedproj for each, nothing sent
    started = states(redis_client, key_prefix)
    assert set(started) == set(file_schedules()) and not sent_entries(queue)

    refused = migrate("--from-file", str(path))
    assert refused.exit_code == 2
    assert "holds the beat lock" in refused.output and "--force" in refused.output
    dry = migrate("--from-file", str(path), "--dry-run", "--force")
    assert dry.exit_code == 0 and "dry run: nothing written" in dry.output
    assert "would import" in dry.output and "-S fair` beat is running" in dry.output
    fair.tick()
    assert states(redis_client, key_prefix) == started, "written while beat ran"

    forced = migrate("--from-file", str(path), "--force")
    assert forced.exit_code == 0, forced.output
    assert "replaces schedproj's state (0 runs)" in forced.output
    found = states(redis_client, key_prefix)
    assert found["hourly"] == EntryState((base - timedelta(minutes=30)).timestamp(), 1,
                                         schedule_key(file_schedules()["hourly"]))
    # The running beat judges the imported states at its next tick (they were marked
    # changed): what was due under the old beat is sent now, not 10 minutes on.
    clear_of_a_minute_boundary()
    with as_current(app):
        due_now = {name for name, entry in old_view(app, path).items() if entry.is_due()[0]}
    assert {"every-10min", "minutely"} <= due_now and "hourly" not in due_now
    fair.tick()
    assert sent_entries(queue) == sorted(due_now)
    assert states(redis_client, key_prefix)["every-10min"].total_run_count == \
        found["every-10min"].total_run_count + 1
    fair.close()

    # Without --force, the state schedproj holds now (its own runs since) is kept.
    held = states(redis_client, key_prefix)
    kept = migrate("--from-file", str(path))
    assert kept.exit_code == 0, kept.output
    assert kept.output.count("already has state in schedproj") == len(file_schedules())
    assert states(redis_client, key_prefix) == held


def test_a_missing_or_foreign_file_is_named_with_the_fix(
        key_prefix: str, queue: str, tmp_path: Path) -> None:
    app_for(key_prefix, queue, {"hourly": 3600.0})
    missing = migrate("--from-file", str(tmp_path / "nothing-here"))
    assert missing.exit_code == 1 and "no celerybeat-schedule file at" in missing.output
    foreign = tmp_path / "foreign"
    foreign.write_text("not a dbm file\n" * 50)
    out = migrate("--from-file", str(foreign))
    assert out.exit_code == 1 and "not a dbm file" in out.output
    assert migrate().exit_code == 2  # no source named
    with shelve.open(str(tmp_path / "other-shelf")) as shelf:
        shelf["something"] = 1
    out = migrate("--from-file", str(tmp_path / "other-shelf"))
    assert out.exit_code == 1 and "holds no 'entries'" in out.output


def test_an_entry_the_file_holds_garbage_for_is_skipped_the_rest_imported(
        key_prefix: str, queue: str, redis_client: redis.Redis, tmp_path: Path,
        clock: list[datetime | None]) -> None:
    app = app_for(key_prefix, queue, file_schedules())
    path = tmp_path / "celerybeat-schedule"
    base = datetime.now(UTC).replace(microsecond=0)
    run_old_beat(app, path, clock, [base - timedelta(hours=2), base - timedelta(minutes=30)])
    with shelve.open(str(path), writeback=True) as shelf:
        shelf["entries"]["hourly"].last_run_at = "yesterday"
    result = migrate("--from-file", str(path))
    assert result.exit_code == 0, result.output
    skipped = result.output[result.output.index("skipped"):]
    assert "hourly" in skipped and "unreadable in the old schedule" in skipped
    assert set(states(redis_client, key_prefix)) == set(file_schedules()) - {"hourly"}


# -- celery-redbeat ------------------------------------------------------------------------------
@pytest.fixture
def redbeat() -> Any:
    try:
        import redbeat.schedulers as schedulers
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("celery-redbeat is required under CI (pip install -e '.[bench]')")
        pytest.skip("celery-redbeat is not installed")
    return schedulers


def test_redbeat_keys_are_imported_and_judged_as_redbeat_judged_them(
        key_prefix: str, queue: str, redis_client: redis.Redis, redbeat: Any) -> None:
    clear_of_a_minute_boundary(margin_s=10.0)  # minutely runs once in redbeat, not twice
    now = datetime.now(TZ)
    schedules = {
        "fast": schedule(1.0),
        "hourly": schedule(3600.0),
        "minutely": crontab(minute="*"),
        "twice-a-day": crontab(minute=0, hour=f"{(now.hour + 6) % 24},{(now.hour + 18) % 24}"),
        "corrupt": schedule(300.0),
    }
    prefix = f"{key_prefix}:rb:"
    app = app_for(key_prefix, queue, schedules, redbeat_redis_url=REDIS_URL,
                  redbeat_key_prefix=prefix, redbeat_lock_key=None, redbeat_redis_options={})
    # The last runs redbeat holds when its beat starts, written by redbeat itself.
    for name, ago in (("hourly", timedelta(hours=2)), ("minutely", timedelta(minutes=5)),
                      ("twice-a-day", timedelta(hours=1))):
        redbeat.RedBeatSchedulerEntry(name, "shop.report", schedules[name], args=(name,),
                                      options={"queue": queue}, app=app,
                                      last_run_at=now - ago).save()
    # Entries added to redbeat at runtime: one added to schedproj too (imported), one not.
    # The one imported is disabled in redbeat and due (it would be sent, were it enabled).
    redbeat.RedBeatSchedulerEntry("dynamic", "shop.report", schedule(60.0), args=("dynamic",),
                                  options={"queue": queue}, app=app,
                                  last_run_at=now - timedelta(seconds=10)).save()
    redbeat.RedBeatSchedulerEntry("added-at-runtime", "shop.report", schedule(60.0),
                                  args=("added-at-runtime",), options={"queue": queue},
                                  app=app, enabled=False,
                                  last_run_at=now - timedelta(minutes=2)).save()
    define(redis_client, Keys(key_prefix), "added-at-runtime", "shop.report", every=60.0,
           args=["added-at-runtime"], queue=queue)
    old = redbeat.RedBeatScheduler(app=app)
    assert old.lock_key is None
    old.tick()  # sends hourly and minutely (due), records their runs
    time.sleep(1.05)
    old.tick()  # sends fast
    old.close()
    assert sent_entries(queue) == ["fast", "hourly", "minutely"]
    redis_client.hset(f"{prefix}corrupt", "meta", "{not json")

    result = migrate("--from-redbeat")
    assert result.exit_code == 0, result.output
    skipped = result.output[result.output.index("skipped"):]
    assert "dynamic" in skipped and "not in the app's beat_schedule" in skipped
    assert "corrupt" in skipped and "unreadable" in skipped

    found = states(redis_client, key_prefix)
    assert set(found) == {"fast", "hourly", "minutely", "twice-a-day", "added-at-runtime"}
    assert found["added-at-runtime"].schedule_key == schedule_key(schedule(60.0))
    assert redis_client.smembers(Keys(key_prefix).entries_paused) == {"added-at-runtime"}
    assert "disabled in redbeat: paused" in result.output
    runtime = found.pop("added-at-runtime")
    time.sleep(max(0.0, 1.05 - (time.time() - found["fast"].last_run_at)))
    clear_of_a_minute_boundary()
    due_in_redbeat = set()
    for name, state in found.items():
        entry = redbeat.RedBeatSchedulerEntry.from_key(f"{prefix}{name}", app=app)
        assert state.last_run_at == entry.last_run_at.timestamp()
        assert state.total_run_count == entry.total_run_count
        due, next_s = entry.is_due()
        assert judged(app, name, state.last_run_at) == (due, pytest.approx(next_s, abs=0.5))
        if due:
            due_in_redbeat.add(name)
    assert found["hourly"].total_run_count == 1 and found["fast"].total_run_count == 1
    assert "fast" in due_in_redbeat and "hourly" not in due_in_redbeat
    assert "twice-a-day" not in due_in_redbeat

    empty(queue)
    fair = FairScheduler(app=app)
    fair.tick()
    assert sent_entries(queue) == sorted(due_in_redbeat)
    after = states(redis_client, key_prefix)
    assert "corrupt" in after, "a new entry was not started"
    assert after["added-at-runtime"] == runtime, "the paused entry was sent, or restarted"
    fair.close()


@pytest.mark.parametrize("when", [
    datetime(2026, 10, 25, 2, 30, tzinfo=ZoneInfo("Europe/Berlin")),  # ambiguous: fold 0
    datetime(2026, 3, 1, 9, 0, 0, 250000, tzinfo=ZoneInfo("America/New_York")),
    datetime(2026, 3, 1, 9, 0, tzinfo=timezone(timedelta(hours=5, minutes=30))),
    datetime(2026, 3, 1, 9, 0, tzinfo=UTC),
    datetime(2026, 3, 1, 9, 0),  # naive: redbeat writes it as UTC
])
def test_redbeat_times_are_read_as_redbeat_reads_them(when: datetime, redbeat: Any) -> None:
    encoded = json.dumps({"last_run_at": when}, cls=redbeat.RedBeatJSONEncoder)
    theirs = json.loads(encoded, cls=redbeat.RedBeatJSONDecoder)["last_run_at"]
    ours = redbeat_time(json.loads(encoded)["last_run_at"])
    assert ours == theirs and ours.utcoffset() == theirs.utcoffset()
    assert ours.timestamp() == theirs.timestamp()


def test_epoch_of_reads_naive_times_as_utc() -> None:
    aware = datetime(2026, 7, 1, 9, 0, tzinfo=TZ)
    assert epoch_of(aware) == aware.timestamp()
    assert epoch_of(datetime(2026, 7, 1, 7, 0)) == aware.timestamp()

