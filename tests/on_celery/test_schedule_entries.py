"""The app's beat_schedule under the FairScheduler, in process against real Redis: entries are
sent as ordinary tasks with Celery's semantics, once per due time, across beats and restarts.

Sends go to the real Redis broker of :func:`tests.conftest.make_app`; the tests read the queued
messages back instead of running workers.
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
from celery.schedules import crontab, schedule, solar

from schedproj import Lane, LaneKind, LaneTask
from schedproj.core.entries import EntryState
from schedproj.on_celery.beat import FairScheduler
from schedproj.on_celery.entries import CeleryTiming, schedule_key
from schedproj.store.protocol import Keys
from tests.conftest import make_app

QUEUES = ("celery", "reports", "light", "heavy")


@pytest.fixture
def queues(broker: redis.Redis) -> Any:
    def empty() -> None:
        broker.delete(*QUEUES, *broker.scan_iter("reports\x06\x16*"))
    empty()
    yield broker
    empty()


def messages(broker: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """The messages waiting in ``queue``, its priority lists included (kombu's Redis transport
    keeps a message with a priority in a list named after the queue and the priority step)."""
    out = []
    lists = [queue, *(k for k in broker.scan_iter(f"{queue}\x06\x16*"))]
    for raw in (m for key in lists for m in broker.lrange(key, 0, -1)):
        m = json.loads(raw)
        out.append({"task": m["headers"]["task"], "id": m["headers"]["id"],
                    "args": m["headers"].get("argsrepr"), "headers": m["headers"],
                    "properties": m["properties"]})
    return out


def app_with(key_prefix: str, beat_schedule: dict[str, Any], **settings: Any) -> Celery:
    def declare(app: Celery) -> None:
        @app.task(shared=False, name="shop.report")
        def report(*args: Any, **kwargs: Any) -> None: ...

        @app.task(shared=False, base=LaneTask, name="t.light",
                  lane=Lane(cadence_s=3600, kind=LaneKind.LIGHT))
        def light() -> None: ...

        app.conf.beat_schedule = beat_schedule

    return make_app(key_prefix, declare, **{"beat_max_loop_interval_s": 0.2,
                                            "beat_lock_ttl_s": 1.0, **settings})


def states(client: redis.Redis, prefix: str) -> dict[str, EntryState]:
    return {str(k): EntryState.decode(v, "t")
            for k, v in client.hgetall(Keys(prefix).entries).items()}


def test_entries_of_every_interval_kind_run_once_per_due_time_with_their_options(
        key_prefix: str, queues: redis.Redis, redis_client: redis.Redis) -> None:
    beat_schedule = {
        "number": {"task": "shop.report", "schedule": 0.5, "args": (1, 2)},
        "delta": {"task": "shop.report", "schedule": timedelta(seconds=0.5),
                  "kwargs": {"x": 1}, "options": {"queue": "reports", "priority": 3}},
        "relative": {"task": "shop.report", "schedule": schedule(2, relative=True)},
        # Twelve hours away, in any zone: a crontab in the mix that is not due in the test.
        "minutely": {"task": "shop.report",
                     "schedule": crontab(minute="*", hour=(datetime.now().hour + 12) % 24)},
    }
    sched = FairScheduler(app=app_with(key_prefix, beat_schedule))
    sched.tick()
    # Celery's rule: a new entry counts from now; nothing is sent for being new.
    assert not messages(queues, "celery") and not messages(queues, "reports")
    assert set(states(redis_client, key_prefix)) == set(beat_schedule)
    time.sleep(2.05)  # ``relative`` rounds its due time down to the whole second
    sched.tick()
    sent = messages(queues, "celery")
    assert sorted(m["args"] for m in sent) == ["()", "[1, 2]"]  # number, relative
    assert all(m["task"] == "shop.report" for m in sent)
    (to_reports,) = messages(queues, "reports")
    assert to_reports["properties"]["priority"] == 3, "the entry's options travel"
    assert to_reports["headers"]["kwargsrepr"] == "{'x': 1}"
    # The lane still goes to its own queue, beside the entries, in the same tick.
    assert [m["task"] for m in messages(queues, "light")] == ["t.light"]
    sched.tick()  # same due time: nothing again
    assert len(messages(queues, "celery")) == 2 and len(messages(queues, "reports")) == 1
    counts = {n: s.total_run_count for n, s in states(redis_client, key_prefix).items()}
    assert counts == {"number": 1, "delta": 1, "relative": 1, "minutely": 0}
    sched.close()


def test_two_beats_send_one_due_time_once_and_a_new_beat_neither_repeats_nor_skips(
        key_prefix: str, queues: redis.Redis, redis_client: redis.Redis) -> None:
    beat_schedule = {"every": {"task": "shop.report", "schedule": 1.0}}
    first = FairScheduler(app=app_with(key_prefix, beat_schedule))
    second = FairScheduler(app=app_with(key_prefix, beat_schedule))
    first.tick()
    time.sleep(1.05)
    for _ in range(3):
        first.tick()
        second.tick()
    assert len(messages(queues, "celery")) == 1 and not second.active
    first.close()  # releases the lock: the second takes over from the stored state
    second.tick()
    assert second.active and len(messages(queues, "celery")) == 1, "a takeover re-sent"
    time.sleep(1.05)
    second.tick()
    assert len(messages(queues, "celery")) == 2, "the takeover skipped a due time"
    assert states(redis_client, key_prefix)["every"].total_run_count == 2
    second.close()


def test_a_claim_made_by_another_beat_since_the_read_is_not_sent_again(
        key_prefix: str, queues: redis.Redis, redis_client: redis.Redis) -> None:
    """The compare-and-set, not the lock alone: a state written between this beat's read and
    its claim (another beat that held the lock meanwhile) makes the claim fail."""
    sched = FairScheduler(app=app_with(key_prefix, {"e": {"task": "shop.report",
                                                          "schedule": 0.2}}))
    sched.tick()
    time.sleep(0.3)
    store = sched.engine.entries.store
    real_due = store.due

    def due_then_someone_runs_it(now: float) -> Any:
        read = real_due(now)
        redis_client.hset(Keys(key_prefix).entries, "e",
                          EntryState(now, 7, schedule_key(schedule(0.2))).encode())
        return read

    store.due = due_then_someone_runs_it  # type: ignore[method-assign]
    sched.tick()
    assert not messages(queues, "celery")
    assert states(redis_client, key_prefix)["e"].total_run_count == 7
    sched.close()


def test_a_failed_send_leaves_the_due_time_due(key_prefix: str, queues: redis.Redis,
                                               redis_client: redis.Redis) -> None:
    class FailingOnce(FairScheduler):
        failures = 1

        def send_entry(self, entry: Any) -> None:
            if entry.name == "e" and self.failures:
                self.failures -= 1
                entry.send_error = ConnectionError("broker down")
                return
            super().send_entry(entry)

    sched = FailingOnce(app=app_with(key_prefix, {"e": {"task": "shop.report",
                                                        "schedule": 0.3}}))
    sched.tick()
    time.sleep(0.35)
    sched.tick()
    assert not messages(queues, "celery")
    assert states(redis_client, key_prefix)["e"].total_run_count == 0, "the claim was not undone"
    time.sleep(1.1)
    sched.tick()
    assert len(messages(queues, "celery")) == 1
    sched.close()


def test_beat_start_deletes_removed_entries_and_restarts_changed_schedules(
        key_prefix: str, queues: redis.Redis, redis_client: redis.Redis) -> None:
    old = {"kept": {"task": "shop.report", "schedule": 0.2},
           "changed": {"task": "shop.report", "schedule": 0.2},
           "removed": {"task": "shop.report", "schedule": 0.2}}
    sched = FairScheduler(app=app_with(key_prefix, old))
    sched.tick()
    time.sleep(0.25)
    sched.tick()
    assert len(messages(queues, "celery")) == 3
    sched.close()
    new = {"kept": old["kept"], "changed": {"task": "shop.report", "schedule": 3600.0}}
    sched = FairScheduler(app=app_with(key_prefix, new))
    sched.tick()
    found = states(redis_client, key_prefix)
    assert set(found) == {"kept", "changed"}
    assert redis_client.zscore(Keys(key_prefix).entries_due, "removed") is None
    assert found["kept"].total_run_count >= 1
    assert found["changed"].total_run_count == 0, "a changed schedule keeps its old count"
    assert found["changed"].schedule_key == schedule_key(schedule(3600.0))
    sched.close()


def test_an_entry_named_like_a_lane_is_refused_at_start(key_prefix: str, queues: redis.Redis,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    sched = FairScheduler(app=app_with(key_prefix, {"t.light": {"task": "shop.report",
                                                               "schedule": 0.1}}))
    assert "t.light" not in sched.engine.entries.names
    assert "has the name of a lane" in caplog.text
    sched.close()


def test_crontab_is_judged_in_the_app_time_zone() -> None:
    """09:00 in Berlin is 08:00 UTC in winter: a last run at 08:59 Berlin makes 09:00 Berlin
    due, and 09:00 UTC (10:00 Berlin) is not what it waits for."""
    berlin = ZoneInfo("Europe/Berlin")
    app = Celery(set_as_current=False)
    app.conf.timezone = "Europe/Berlin"
    clock = {"now": datetime(2026, 12, 3, 8, 0, 30, tzinfo=UTC)}
    nine = crontab(minute=0, hour=9, app=app, nowfun=lambda: clock["now"])
    timing = CeleryTiming(nine, berlin)
    last = datetime(2026, 12, 3, 8, 59, tzinfo=berlin).timestamp()
    due, next_s = timing.check(last)
    assert due and next_s == pytest.approx(24 * 3600 - 30, abs=1)
    clock["now"] = datetime(2026, 12, 3, 7, 59, 0, tzinfo=UTC)
    due, next_s = timing.check(datetime(2026, 12, 3, 8, 30, tzinfo=berlin).timestamp())
    assert not due and next_s == pytest.approx(60, abs=1)


def test_solar_entries_are_judged_by_celerys_solar_schedule() -> None:
    app = Celery(set_as_current=False)
    app.conf.timezone = "UTC"
    clock = {"now": datetime(2026, 6, 21, 12, 0, tzinfo=UTC)}
    noon = solar("solar_noon", 0.0, 0.0, app=app, nowfun=lambda: clock["now"])
    timing = CeleryTiming(noon, UTC)
    # Solar noon at longitude 0 is near 12:00 UTC; a last run the noon before: due by 12:10.
    clock["now"] = datetime(2026, 6, 21, 12, 10, tzinfo=UTC)
    due, _ = timing.check(datetime(2026, 6, 20, 12, 5, tzinfo=UTC).timestamp())
    assert due
    due, next_s = timing.check(datetime(2026, 6, 21, 12, 5, tzinfo=UTC).timestamp())
    assert not due and 23 * 3600 < next_s < 25 * 3600


def test_the_active_beat_puts_back_entry_states_redis_lost(
        key_prefix: str, queues: redis.Redis, redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    """Redis restarts empty while beat runs: the states it remembers go back, so an entry
    neither runs again at once nor waits a fresh interval, and its count goes on."""
    sched = FairScheduler(app=app_with(key_prefix, {"e": {"task": "shop.report",
                                                          "schedule": 1.0}}))
    sched.tick()
    time.sleep(1.05)
    sched.tick()
    assert len(messages(queues, "celery")) == 1
    ran_at = states(redis_client, key_prefix)["e"].last_run_at
    redis_client.delete(*redis_client.scan_iter(f"{key_prefix}:*"))
    with caplog.at_level("WARNING", logger="schedproj.beat"):
        sched.tick()
    assert "put back 1 of the 1" in caplog.text
    back = states(redis_client, key_prefix)["e"]
    assert back.last_run_at == ran_at and back.total_run_count == 1
    assert len(messages(queues, "celery")) == 1, "the loss made the entry run again"
    time.sleep(max(0.0, ran_at + 1.05 - time.time()))
    sched.tick()
    assert len(messages(queues, "celery")) == 2, "the put-back state did not come due"
    sched.close()


def test_runtime_entries_are_picked_up_changed_and_removed_within_one_tick(
        key_prefix: str, queues: redis.Redis, redis_client: redis.Redis) -> None:
    from schedproj.core.entries import EntryDefinition
    from schedproj.store.entry_store import EntryStore

    app = app_with(key_prefix, {})
    store = EntryStore(redis_client, Keys(key_prefix))
    sched = FairScheduler(app=app)
    sched.tick()
    store.put_definition("added", EntryDefinition.build(task="shop.report", every_s=0.3,
                                                        args=["rt"]))
    sched.tick()
    assert "added" in sched.engine.entries.names
    assert json.loads(redis_client.hget(Keys(key_prefix).entries_info, "added"))[
        "source"] == "runtime"
    time.sleep(0.35)
    sched.tick()
    assert [m["args"] for m in messages(queues, "celery")] == ["['rt']"]
    store.put_definition("added", EntryDefinition.build(task="shop.report", every_s=3600,
                                                        args=["changed"]))
    sched.tick()
    assert states(redis_client, key_prefix)["added"].total_run_count == 0, \
        "a changed schedule starts from its new definition"
    store.remove_definition("added")
    sched.tick()
    assert "added" not in sched.engine.entries.names
    assert "added" not in states(redis_client, key_prefix)
    assert redis_client.zscore(Keys(key_prefix).entries_due, "added") is None
    sched.close()


def test_paused_entries_wait_and_run_now_sends_at_the_next_tick(
        key_prefix: str, queues: redis.Redis, redis_client: redis.Redis) -> None:
    from schedproj.store.entry_store import EntryStore

    store = EntryStore(redis_client, Keys(key_prefix))
    sched = FairScheduler(app=app_with(key_prefix, {"e": {"task": "shop.report",
                                                          "schedule": 3600.0}}))
    sched.tick()
    store.run_now("e")
    sched.tick()
    assert len(messages(queues, "celery")) == 1
    assert not redis_client.smembers(Keys(key_prefix).entries_run_now)
    store.pause("e")
    store.run_now("e")
    sched.tick()
    assert len(messages(queues, "celery")) == 1, "a paused entry was sent"
    store.resume("e")
    sched.tick()
    assert len(messages(queues, "celery")) == 2, "run-now waited past the resume"
    sched.close()


def test_thousands_due_at_once_are_sent_over_ticks_within_a_budget(
        key_prefix: str, queues: redis.Redis, redis_client: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A start with many entries judges them in budgeted ticks (the lanes' tick and the beat
    lock's renewal come between), and every one is judged."""
    from schedproj.on_celery import entries as entries_module

    monkeypatch.setattr(entries_module, "TICK_BUDGET_S", 0.0)
    monkeypatch.setattr("schedproj.store.entry_store.READ_LIMIT", 100)
    beat_schedule = {f"e{i:04d}": {"task": "shop.report", "schedule": 3600.0}
                     for i in range(350)}
    sched = FairScheduler(app=app_with(key_prefix, beat_schedule))
    ticks = 0
    while len(states(redis_client, key_prefix)) < 350 and ticks < 10:
        sched.tick()
        ticks += 1
    assert len(states(redis_client, key_prefix)) == 350 and ticks == 4
    sched.close()


def test_judging_leaves_the_apps_schedule_objects_as_they_were(
        key_prefix: str, queues: redis.Redis) -> None:
    """Beat asks a copy: Celery's ``is_due`` caches the time zone in the object it is asked
    of, which gives each of the app's schedule objects a dict of its own (6 MiB at 100,000
    entries). The copies judge as the originals would: the entries still run."""
    # The crontab is not due within the test (two hours ahead); it is judged all the same.
    every, cron = schedule(0.2), crontab(minute=0, hour=(datetime.now(UTC).hour + 2) % 24)
    sched = FairScheduler(app=app_with(key_prefix, {
        "every": {"task": "shop.report", "schedule": every},
        "cron": {"task": "shop.report", "schedule": cron}}))
    sched.tick()
    time.sleep(0.25)
    sched.tick()
    assert [m["task"] for m in messages(queues, "celery")] == ["shop.report"]
    assert "tz" not in vars(every) and "tz" not in vars(cron)
    sched.close()


def test_what_beat_remembers_of_an_entry_is_put_back_whole(key_prefix: str) -> None:
    """The remembered states are kept in columns: a state measured from another schedule is
    not taken, a count past 32 bits is kept whole, and each comes back as it was stored."""
    from schedproj.on_celery.entries import beat_schedule_table

    app = app_with(key_prefix, {"b": {"task": "shop.report", "schedule": 60.0},
                                "a": {"task": "shop.report", "schedule": crontab(minute=5)}})
    table = beat_schedule_table(app)
    assert list(table) == ["a", "b"] and "b" in table and "c" not in table
    a_key, b_key = table["a"].schedule_key, table["b"].schedule_key
    table.remember("b", EntryState(100.5, 2**40, b_key))
    table.remember("a", EntryState(7.25, 3, "another schedule"))
    assert dict(table.remembered()) == {"b": EntryState(100.5, 2**40, b_key)}
    table.remember("a", EntryState(7.25, 3, a_key))
    table.remember("c", EntryState(1.0, 1, a_key))
    assert dict(table.remembered()) == {"a": EntryState(7.25, 3, a_key),
                                        "b": EntryState(100.5, 2**40, b_key)}
    assert (table["a"].last_run_at, table["a"].runs) == (7.25, 3)
