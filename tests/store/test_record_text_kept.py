"""Scripts that change a stored record change only the fields they mean to, in its text: the
rest stays as Python wrote it. Redis's cjson keeps 14 significant digits, so a record decoded
and re-encoded in Lua had every time cut to 10 ms (1796405433.989978 became 1796405433.99),
integers past 14 digits rounded (2**52 + 1 became 4.5035996273705e+15) and integer-valued
floats turned into integers. Checked: run_mark_skipped.lua (a refused message's outcome),
lease_acquire.lua (the grant) and lease_start.lua (the run's start on its lease).
Real redis-server, no mocks."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis

from schedproj.core.records import LeaseView, Outcome, RunRecord, encode
from schedproj.store.lane_store import LaneStore
from schedproj.store.lease import HeavyLease, Holder
from schedproj.store.protocol import Keys, run_field

pytestmark = pytest.mark.timeout(60)

PREVIOUS = Path(__file__).parent / "previous_release"
REASON = "stale-lease:taken"

#: Every field set; microsecond times, an integer-valued float, an integer past 2**53, and a
#: reason holding every character that ends a JSON value or a string.
FULL = RunRecord(
    last_run_at=1796405433.989978, last_outcome=Outcome.FAILED,
    last_reason='boom, {"at": [1, 2]} \\ \\" end', last_task_id="T-last", backlog=12,
    runs=2 ** 53 + 7, failures=3, running_task_id="T-running", running_since=1796405433.123457,
    running_until=1796405493.000001, fence=1796405433989, failing_since=1796405000.5,
    skipped_task_id="T-skipped-before", since=1796400000.0)


def skip(store: LaneStore, task_id: str = "T-refused", reason: str = REASON) -> bool:
    return store.mark_skipped("L", reason, wake_message="L:skipped", task_id=task_id)


def stored(client: redis.Redis, keys: Keys) -> str:
    raw = client.hget(keys.lanes, run_field("L"))
    assert raw is not None
    return str(raw)


def typed(data: dict[str, Any]) -> dict[str, tuple[type, Any]]:
    """Each field's JSON type and value: 1.0 and 1 compare equal, but they are not the same."""
    return {name: (type(value), value) for name, value in data.items()}


def test_a_skip_keeps_every_other_field_exactly(client: redis.Redis, keys: Keys) -> None:
    store = LaneStore(client, keys)
    client.hset(keys.lanes, run_field("L"), encode(FULL))
    assert skip(store)
    expected = replace(FULL, last_outcome=Outcome.SKIPPED, last_reason=REASON,
                       skipped_task_id="T-refused")
    assert store.read_run("L") == expected  # dataclass equality: floats compared exactly
    after = json.loads(stored(client, keys))
    changed = {"last_outcome", "last_reason", "skipped_task_id"}
    before = json.loads(encode(FULL))
    assert typed({k: v for k, v in after.items() if k not in changed}) == typed(
        {k: v for k, v in before.items() if k not in changed})
    # In place, in Python's order: the text is what Python would write for the new record.
    assert stored(client, keys) == encode(expected)


def test_a_skip_without_a_task_id_leaves_the_earlier_refusal(client: redis.Redis,
                                                              keys: Keys) -> None:
    store = LaneStore(client, keys)
    client.hset(keys.lanes, run_field("L"), encode(FULL))
    assert skip(store, task_id="")
    assert stored(client, keys) == encode(
        replace(FULL, last_outcome=Outcome.SKIPPED, last_reason=REASON))


def test_a_compact_record_gets_the_fields_it_left_out(client: redis.Redis,
                                                       keys: Keys) -> None:
    store = LaneStore(client, keys)
    member = RunRecord(since=1796400000.25, backlog=4)
    client.hset(keys.lanes, run_field("L"), encode(member))
    assert skip(store)
    assert store.read_run("L") == replace(member, last_outcome=Outcome.SKIPPED,
                                          last_reason=REASON, skipped_task_id="T-refused")
    assert stored(client, keys).startswith(encode(member)[:-1] + ",")


def test_a_record_of_the_previous_release_with_null_marks(client: redis.Redis,
                                                         keys: Keys) -> None:
    """The previous release wrote every in-flight mark, null while unset."""
    store = LaneStore(client, keys)
    ended = replace(FULL, running_task_id=None, running_since=None, running_until=None)
    data = json.loads(encode(ended))
    data.update(running_task_id=None, running_since=None, running_until=None)
    written = json.dumps(data, separators=(",", ":"))
    client.hset(keys.lanes, run_field("L"), written)
    assert skip(store)
    assert store.read_run("L") == replace(ended, last_outcome=Outcome.SKIPPED,
                                          last_reason=REASON, skipped_task_id="T-refused")
    after = json.loads(stored(client, keys))
    assert typed(after) == typed({**data, "last_outcome": "skipped", "last_reason": REASON,
                                  "skipped_task_id": "T-refused"})


def test_a_hand_written_record_with_spaces_is_changed_in_place(client: redis.Redis,
                                                               keys: Keys) -> None:
    store = LaneStore(client, keys)
    client.hset(keys.lanes, run_field("L"), json.dumps(
        {"v": 1, "last_reason": "x, y}", "last_outcome": "failed", "runs": 2,
         "last_run_at": 1796405433.989978}) + "\n")
    assert skip(store)
    text = stored(client, keys)
    assert text.count('"last_reason"') == 1 and text.count('"last_outcome"') == 1, text
    assert store.read_run("L") == RunRecord(
        last_run_at=1796405433.989978, last_outcome=Outcome.SKIPPED, last_reason=REASON,
        runs=2, skipped_task_id="T-refused")


def test_no_record_yet_gets_one_with_the_outcome(client: redis.Redis, keys: Keys) -> None:
    store = LaneStore(client, keys)
    assert skip(store, reason='odd "reason", with /slash')
    assert store.read_run("L") == RunRecord(last_outcome=Outcome.SKIPPED,
                                            last_reason='odd "reason", with /slash',
                                            skipped_task_id="T-refused")


@pytest.mark.parametrize("garbage", ["{not json", '{"v":999,"runs":1}', "[1,2]", '"text"'])
def test_an_unreadable_record_is_left_untouched(client: redis.Redis, keys: Keys,
                                                garbage: str) -> None:
    client.hset(keys.lanes, run_field("L"), garbage)
    assert not skip(LaneStore(client, keys))
    assert stored(client, keys) == garbage


def test_the_previous_release_finishes_on_a_skipped_record(client: redis.Redis,
                                                          keys: Keys) -> None:
    """A worker of the previous release (its run_finish.lua) reads what a skip wrote."""
    store = LaneStore(client, keys)
    client.hset(keys.lanes, run_field("L"), encode(FULL))
    assert skip(store)
    previous = LaneStore(client, keys)
    previous._finish = client.register_script((PREVIOUS / "run_finish.lua").read_text())
    ended = replace(FULL, running_task_id=None, running_since=None, running_until=None,
                    last_task_id="T-running", last_outcome=Outcome.COMPLETED, runs=FULL.runs + 1)
    # Sent in that release's own encoding: every in-flight mark written, null while unset.
    data = json.loads(encode(ended))
    data.update(running_task_id=None, running_since=None, running_until=None)
    _, written = previous.finish("L", ended, token="", fence=FULL.fence,
                                 wake_message="L:done",
                                 encoded=json.dumps(data, separators=(",", ":")))
    assert written == 1
    assert store.read_run("L") == ended


# -- the lease -------------------------------------------------------------------------------


def test_a_grant_and_its_start_keep_their_times_and_fence_exactly(client: redis.Redis,
                                                                 keys: Keys) -> None:
    lease = HeavyLease(client, keys)
    client.set(keys.lease_fence, str(2 ** 52))  # a sane counter (lease_acquire.lua: < 2**53)
    granted_at, started_at = 1796405433.989978, 1796405434.000001
    grant = lease.acquire("summary", "tok", 30, granted_at, task_id="T-1")
    assert grant.granted and grant.fence == 2 ** 52 + 1
    view = lease.read()
    assert view is not None
    assert (view.fence, view.granted_at) == (2 ** 52 + 1, granted_at)
    assert type(view.fence) is int
    holder = Holder(host="host/a", pid=4242, node='celery@"a"')
    assert lease.start("tok", 30, started_at, holder=holder, lane="summary",
                       task_id="T-1") == (True, 2 ** 52 + 1)
    started = lease.read()
    assert started is not None
    assert started == replace(view, started_at=started_at, host="host/a", pid=4242,
                              node='celery@"a"')
    assert type(started.fence) is int


def test_a_grant_at_an_integer_valued_time_keeps_it_a_float(client: redis.Redis,
                                                          keys: Keys) -> None:
    lease = HeavyLease(client, keys)
    grant = lease.acquire("summary", "tok", 30, 1796405433.0)
    assert grant.granted
    view = lease.read()
    assert view is not None
    assert view == LeaseView(lane="summary", token="tok", fence=grant.fence,
                             granted_at=1796405433.0, task_id="", epoch=view.epoch)
    assert type(view.granted_at) is float, "written as an integer"


def test_a_grant_of_the_previous_release_starts(client: redis.Redis, keys: Keys) -> None:
    """The previous release's lease_acquire.lua wrote the lease with cjson (its own order, its
    14 digits); this release's start sets its fields in that text."""
    lease = HeavyLease(client, keys)
    assert lease.acquire("summary", "tok", 30, 1796405433.989978).granted
    view = lease.read()
    assert view is not None
    written = client.eval("return cjson.encode(cjson.decode(ARGV[1]))", 0,
                          str(client.get(keys.lease)))
    client.set(keys.lease, written, px=30_000)
    assert lease.start("tok", 30, 1796405434.5, holder=Holder("h", 7, "n"))[0]
    assert lease.read() == replace(view, granted_at=1796405433.99, started_at=1796405434.5,
                                   host="h", pid=7, node="n")
