"""The in-flight marks (``running_task_id/_since/_until``) in a run record's text, across a
rolling deploy. A record leaves them out while they are null (core/records.py), so
run_finish.lua and run_cas.lua add a mark the text lacks instead of only rewriting it in
place. A worker of the previous release runs its own Lua (tests/store/previous_release, as
2a75607 shipped it) with its own encoding, which always writes the marks: each pairing of
writer and finisher below keeps a newer run's marks, and the one pairing that never happens
(the previous Lua given a record without marks) shows why the omission needed the new Lua.
Real redis-server, no mocks."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis

from schedproj.core import lifecycle
from schedproj.core.records import Outcome, RunRecord, encode
from schedproj.store.lane_store import LaneStore
from schedproj.store.protocol import Keys, run_field

pytestmark = pytest.mark.timeout(60)

PREVIOUS = Path(__file__).parent / "previous_release"
MARKS = ("running_task_id", "running_since", "running_until")


def previous_encode(record: RunRecord) -> str:
    """The previous release's encoding: this one's, with every in-flight mark written (null
    when unset)."""
    data = json.loads(encode(record))
    for name in MARKS:
        data.setdefault(name, None)
    return json.dumps(data, separators=(",", ":"))


def previous_store(client: redis.Redis, keys: Keys) -> LaneStore:
    """A store calling the previous release's run_finish.lua and run_cas.lua (their keys and
    arguments did not change)."""
    store = LaneStore(client, keys)
    store._finish = client.register_script((PREVIOUS / "run_finish.lua").read_text())
    store._cas = client.register_script((PREVIOUS / "run_cas.lua").read_text())
    return store


def start_light(store: LaneStore, task_id: str, *, previous: bool) -> RunRecord:
    """Mark a light run of lane L started (compare and set on the stored record, its mark's
    end on Redis's clock), as the worker of either release does. Returns the record before."""
    raw, before = store.read_run_raw("L")
    record = lifecycle.started(before, task_id=task_id, now=time.time(),
                               running_until=time.time() + 1.0)
    if previous:  # the previous release's worker sends its own encoding
        args_record = previous_encode(record)
        keys = [store.keys.lanes, store.keys.beat_fence, store.keys.changed, store.keys.epoch]
        code, _ = store._cas(keys=keys, args=[run_field("L"), raw or "", args_record, "", "",
                                              "", "L", "60000"])
        assert int(code) == 1
    else:
        assert store.cas_run("L", raw, record, mark_ttl_s=60.0)[0]
    return before


@pytest.mark.parametrize("starter", ["this", "previous"])
@pytest.mark.parametrize("finisher", ["this", "previous"])
def test_a_finishing_light_run_keeps_the_marks_of_a_run_started_after_it(
        client: redis.Redis, keys: Keys, starter: str, finisher: str) -> None:
    this, previous = LaneStore(client, keys), previous_store(client, keys)
    first_before = start_light(this if starter == "this" else previous, "T-first",
                               previous=starter == "previous")
    # T-first stalls; beat judges it lost and dispatches T-second, which starts.
    start_light(this if starter == "this" else previous, "T-second",
                previous=starter == "previous")
    second = this.read_run("L")
    assert second.running_task_id == "T-second" and second.running_until is not None
    # T-first ends after all: its record clears the marks (left out, or null, by release).
    ended = lifecycle.finished(first_before, task_id="T-first", outcome=Outcome.COMPLETED,
                               reason=None, backlog=0, now=time.time())
    store = this if finisher == "this" else previous
    raw = encode(ended) if finisher == "this" else previous_encode(ended)
    assert store.finish("L", ended, token="", fence=0, wake_message="L:completed",
                        encoded=raw) == (False, 1)
    after = this.read_run("L")
    assert after.last_task_id == "T-first" and after.runs == first_before.runs + 1
    assert after.running_task_id == "T-second"
    # (run_finish.lua copies a time with six decimals: a microsecond, as records.encode.)
    assert after.running_since == pytest.approx(second.running_since, abs=1e-6)
    assert after.running_until == pytest.approx(second.running_until, abs=1e-6)


def test_the_previous_run_finish_would_lose_a_mark_the_record_leaves_out(
        client: redis.Redis, keys: Keys) -> None:
    """Why the marks could be left out only with this release's Lua: the previous one rewrites
    them in place, so a finishing record without them drops a newer run's mark. It never
    meets one: a worker sends its own release's encoding, which wrote them."""
    this, previous = LaneStore(client, keys), previous_store(client, keys)
    before = start_light(this, "T-first", previous=False)
    start_light(this, "T-second", previous=False)
    ended = lifecycle.finished(before, task_id="T-first", outcome=Outcome.COMPLETED,
                               reason=None, backlog=0, now=time.time())
    assert "running_task_id" not in encode(ended)
    previous.finish("L", ended, token="", fence=0, wake_message="w", encoded=encode(ended))
    assert this.read_run("L").running_task_id is None


def test_a_started_record_without_its_mark_end_gets_the_server_clock(
        client: redis.Redis, keys: Keys) -> None:
    """run_cas.lua sets running_until from Redis's clock: added when the record leaves it
    out, not silently skipped."""
    store = LaneStore(client, keys)
    record = RunRecord(running_task_id="T1", running_since=time.time())
    assert "running_until" not in encode(record)
    assert store.cas_run("L", None, record, mark_ttl_s=30.0)[0]
    stored = store.read_run("L")
    assert stored.running_task_id == "T1"
    assert stored.running_until is not None
    assert abs(stored.running_until - (time.time() + 30.0)) < 5.0


@pytest.mark.parametrize("finisher", ["this", "previous"])
def test_a_finish_over_a_record_without_marks_writes_it_as_given(
        client: redis.Redis, keys: Keys, finisher: str) -> None:
    """A lane idle since this release wrote it (no marks stored): either release's finish
    writes its record, and this release reads it."""
    this = LaneStore(client, keys)
    idle = RunRecord(last_run_at=100.5, last_outcome=Outcome.COMPLETED, last_task_id="T0",
                     runs=1)
    this.write_run("L", idle)
    assert not any(name in client.hget(keys.lanes, run_field("L")) for name in MARKS)
    ended = lifecycle.finished(idle, task_id="T1", outcome=Outcome.FAILED, reason="boom",
                               backlog=0, now=200.25)
    store = this if finisher == "this" else previous_store(client, keys)
    raw = encode(ended) if finisher == "this" else previous_encode(ended)
    assert store.finish("L", ended, token="", fence=0, wake_message="w",
                        encoded=raw) == (False, 1)
    assert client.hget(keys.lanes, run_field("L")) == raw
    assert this.read_run("L") == ended
