"""What status and ``entry list`` say about a runtime entry beat has not read yet: its
schedule in the words ``schedproj entry add`` took, one-off instants and own zones included."""

from __future__ import annotations

from datetime import UTC, datetime

import redis

from schedproj.core.entries import EntryDefinition
from schedproj.store.protocol import Keys
from schedproj.telemetry.entries_view import read_entries


def test_unread_definitions_show_their_own_schedule(redis_client: redis.Redis,
                                                    key_prefix: str) -> None:
    keys = Keys(key_prefix)
    at = datetime(2027, 3, 28, 2, 30, tzinfo=UTC).timestamp()
    defs = {
        "every": EntryDefinition(task="t.every", every_s=90.0),
        "berlin": EntryDefinition(task="t.cron", cron="30 2 * * *", timezone="Europe/Berlin",
                                  catchup_window_s=3600.0),
        "plain": EntryDefinition(task="t.cron", cron="0 9 * * 1"),
        "once": EntryDefinition(task="t.once", at=at, catchup_window_s=600.0),
    }
    redis_client.hset(keys.entry_defs, mapping={n: d.encode() for n, d in defs.items()})
    rows = {r.name: r for r in read_entries(redis_client, keys).entries}
    assert {n: rows[n].schedule for n in defs} == {
        "every": "every 90s",
        "berlin": "cron 30 2 * * * in Europe/Berlin, catch-up 3600s",
        "plain": "cron 0 9 * * 1",
        "once": "at 2027-03-28T02:30:00+00:00, catch-up 600s",
    }
    assert {r.source for r in rows.values()} == {"runtime (not yet read by beat)"}
    assert all(r.problem == "" for r in rows.values())


def test_an_entry_missing_from_the_due_index_is_a_problem_and_overdue(
        redis_client: redis.Redis, key_prefix: str) -> None:
    """Beat never looks at an entry with no next look (its index lost or the member
    removed) until it heals the index: the view says so, and the entry counts as overdue."""
    keys = Keys(key_prefix)
    info = '{"task":"t","schedule":"every 60s","source":"code"}'
    redis_client.hset(keys.entries_info, mapping={"kept": info, "lost": info})
    redis_client.zadd(keys.entries_due, {"kept": 1e12})
    rows = {r.name: r for r in read_entries(redis_client, keys).entries}
    assert not rows["kept"].unindexed and rows["kept"].problem == ""
    assert rows["lost"].unindexed and keys.entries_due in rows["lost"].problem
    assert rows["lost"].overdue(2e12, 60.0) and not rows["kept"].overdue(1e12, 60.0)
