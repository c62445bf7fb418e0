"""The compact record format (version 2, ``SCHEDPROJ_COMPACT_RECORDS``) through every Lua script
that reads or edits a run or sched record, against a real redis-server. Writers of either
setting meet records of either format mid-rollout: each script reads both, an edit keeps the
format of the record it found, a record written from scratch takes the format its caller was
told, and every record still decodes to the values written. The previous release's Lua
(tests/store/previous_release) refuses a compact record and leaves it untouched."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis

from schedproj.core import lifecycle
from schedproj.core.records import (
    COMPACT_FORMAT,
    LONG_FORMAT,
    SHORT_NAMES,
    Outcome,
    RunRecord,
    SchedRecord,
    decode_with_format,
    encode,
)
from schedproj.store import scripts
from schedproj.store.lane_store import LaneStore
from schedproj.store.lease import NO_HOLDER, HeavyLease, RunMark
from schedproj.store.protocol import Keys, run_field, sched_field
from schedproj.store.record_rewrite import rewrite_records
from tests.conftest import token

pytestmark = pytest.mark.timeout(60)

PREVIOUS = Path(__file__).parent / "previous_release"
FORMATS = {False: LONG_FORMAT, True: COMPACT_FORMAT}
BOTH = [False, True]


def stored(client: redis.Redis, keys: Keys, field_name: str, cls: type = RunRecord
           ) -> tuple[int, object]:
    """(format, decoded record) of a field of the lanes hash."""
    return decode_with_format(cls, client.hget(keys.lanes, field_name), field_name)


def test_the_lua_name_table_is_the_python_one(client: redis.Redis) -> None:
    listed = scripts.source("record_format") + """
local out = {}
for long, short in pairs(RECORD_SHORT_NAMES) do out[#out + 1] = long .. '=' .. short end
return out"""
    lua = dict(item.split("=") for item in client.eval(listed, 0))
    assert lua == {**SHORT_NAMES[RunRecord], **SHORT_NAMES[SchedRecord]}


def start_light(store: LaneStore, lane: str, task_id: str) -> RunRecord:
    """A light run starts as a worker's does (compare and set, its mark's end on Redis's
    clock: run_cas.lua adds a mark the text lacks); returns the record before."""
    raw, before = store.read_run_raw(lane)
    record = lifecycle.started(before, task_id=task_id, now=time.time(), running_until=None)
    assert store.cas_run(lane, raw, record, mark_ttl_s=60.0)[0]
    return before


@pytest.mark.parametrize("first_compact", BOTH)
@pytest.mark.parametrize("second_compact", BOTH)
def test_a_light_run_starts_and_finishes_across_both_formats(
        client: redis.Redis, keys: Keys, first_compact: bool, second_compact: bool) -> None:
    """T-first starts, stalls; T-second starts (by a worker of either setting); T-first ends:
    run_finish.lua reads T-second's marks in the stored record's format and copies them into
    T-first's record in that record's own format."""
    first = LaneStore(client, keys, compact_records=first_compact)
    second = LaneStore(client, keys, compact_records=second_compact)
    before = start_light(first, "L", "T-first")
    start_light(second, "L", "T-second")
    version, running = stored(client, keys, run_field("L"))
    assert version == FORMATS[second_compact]
    assert running.running_task_id == "T-second" and running.running_until is not None
    assert abs(running.running_until - (time.time() + 60)) < 5
    ended = lifecycle.finished(before, task_id="T-first", outcome=Outcome.COMPLETED,
                               reason=None, backlog=0, now=time.time())
    assert first.finish("L", ended, token="", fence=0, wake_message="w") == (False, 1)
    version, after = stored(client, keys, run_field("L"))
    assert version == FORMATS[first_compact]
    assert (after.last_task_id, after.runs, after.running_task_id) == ("T-first", 1,
                                                                       "T-second")
    assert after.running_since == pytest.approx(running.running_since, abs=1e-6)
    assert after.running_until == pytest.approx(running.running_until, abs=1e-6)


@pytest.mark.parametrize("beat_compact", BOTH)
@pytest.mark.parametrize("worker_compact", BOTH)
def test_a_light_start_checks_the_dispatch_in_the_sched_record_of_either_format(
        client: redis.Redis, keys: Keys, beat_compact: bool, worker_compact: bool) -> None:
    """run_cas.lua's dispatch check reads the task id beat wrote, in beat's format."""
    beat, worker = (LaneStore(client, keys, compact_records=beat_compact),
                    LaneStore(client, keys, compact_records=worker_compact))
    beat.declare_fresh()  # (the fixture may have declared it already)
    beat_token = token()
    assert beat.snapshot(beat_token, 30.0).lock.held
    assert beat.write_sched(beat_token, {"L": SchedRecord(
        inflight_task_id="T1", inflight_deadline=time.time() + 60,
        last_dispatch_at=time.time(), dispatches=1)})
    assert stored(client, keys, sched_field("L"), SchedRecord)[0] == FORMATS[beat_compact]
    fence = int(client.get(keys.beat_fence))
    started = RunRecord(running_task_id="T1", running_since=time.time())
    assert worker.cas_run("L", None, started, dispatch=("T-other", fence),
                          mark_ttl_s=60.0) == (False, "not-current-dispatch")
    assert worker.cas_run("L", None, started, dispatch=("T1", fence), mark_ttl_s=60.0) == (
        True, "")
    version, record = stored(client, keys, run_field("L"))
    assert version == FORMATS[worker_compact] and record.running_task_id == "T1"
    # Beat of either setting reads the worker's record; the worker reads beat's.
    state = beat.snapshot(beat_token, 30.0).states["L"]
    assert state.run == record and state.sched.inflight_task_id == "T1"


@pytest.mark.parametrize("compact", BOTH)
def test_a_finish_reads_the_fence_of_a_compact_record(client: redis.Redis, keys: Keys,
                                                      compact: bool) -> None:
    """A late heavy run (a lower fence) never overwrites the record of a newer one: the fence
    is read under its compact key too; a record whose numbers are not numbers is unreadable
    (left untouched) in either format."""
    newer = RunRecord(last_run_at=100.5, last_outcome=Outcome.COMPLETED, last_task_id="T2",
                      runs=2, fence=200)
    client.hset(keys.lanes, run_field("L"), encode(newer, compact=True))
    store = LaneStore(client, keys, compact_records=compact)
    late = RunRecord(last_run_at=90.0, last_outcome=Outcome.FAILED, last_task_id="T1",
                     runs=2, fence=100)
    assert store.finish("L", late, token="tok", fence=100, wake_message="w") == (False, 0)
    assert stored(client, keys, run_field("L")) == (COMPACT_FORMAT, newer)
    latest = RunRecord(last_run_at=300.25, last_outcome=Outcome.COMPLETED,
                       last_task_id="T3", runs=3, fence=300)
    assert store.finish("L", latest, token="tok", fence=300, wake_message="w") == (False, 1)
    assert stored(client, keys, run_field("L")) == (FORMATS[compact], latest)
    client.hset(keys.lanes, run_field("L"), '{"v":2,"n":"three"}')
    assert store.finish("L", latest, token="", fence=300, wake_message="w") == (False, -1)
    assert client.hget(keys.lanes, run_field("L")) == '{"v":2,"n":"three"}'


@pytest.mark.parametrize("stored_compact", BOTH)
@pytest.mark.parametrize("told_compact", BOTH)
def test_a_skip_edits_the_record_in_its_own_format(
        client: redis.Redis, keys: Keys, stored_compact: bool, told_compact: bool) -> None:
    """run_mark_skipped.lua sets the outcome fields under the names the stored record's format
    uses (adding those its text lacks) and leaves the rest as written; with no record stored
    it writes one in the format its caller was told."""
    before = RunRecord(last_run_at=100.5, last_outcome=Outcome.COMPLETED, last_task_id="T0",
                       runs=4, fence=7)
    client.hset(keys.lanes, run_field("L"), encode(before, compact=stored_compact))
    store = LaneStore(client, keys, compact_records=told_compact)
    assert store.mark_skipped("L", "stale-token", wake_message="w", task_id="T9")
    version, record = stored(client, keys, run_field("L"))
    assert version == FORMATS[stored_compact]
    assert record == RunRecord(last_run_at=100.5, last_outcome=Outcome.SKIPPED,
                               last_reason="stale-token", last_task_id="T0", runs=4, fence=7,
                               skipped_task_id="T9")
    assert store.mark_skipped("M", "no-token", wake_message="w", task_id="T8")
    assert stored(client, keys, run_field("M")) == (FORMATS[told_compact], RunRecord(
        last_outcome=Outcome.SKIPPED, last_reason="no-token", skipped_task_id="T8"))


@pytest.mark.parametrize("compact", BOTH)
def test_a_run_marked_lost_is_written_as_its_caller_encodes_it(
        client: redis.Redis, keys: Keys, compact: bool) -> None:
    """run_mark_lost.lua compares the raw text it was given (either format) and writes the
    caller's record as given."""
    running = RunRecord(last_run_at=100.5, runs=1, running_task_id="T1", running_since=101.0,
                        running_until=161.0)
    client.hset(keys.lanes, run_field("L"), encode(running, compact=not compact))
    store = LaneStore(client, keys, compact_records=compact)
    raw, read = store.read_run_raw("L")
    assert read == running
    lost = lifecycle.finished(read, task_id="T1", outcome=Outcome.LOST, reason="mark lapsed",
                              backlog=0, now=200.0)
    assert raw is not None and store.mark_lost("L", raw, lost, task_id="T1", heavy=False)
    assert stored(client, keys, run_field("L")) == (FORMATS[compact], lost)


@pytest.mark.parametrize("compact", BOTH)
def test_a_heavy_grant_and_start_write_records_of_either_format(
        client: redis.Redis, keys: Keys, compact: bool) -> None:
    """lease_grant_record.lua writes beat's sched record as encoded; lease_start.lua compares
    the stored run record (of the other format here) and writes the marked one as given."""
    store, lease = LaneStore(client, keys, compact_records=compact), HeavyLease(client, keys)
    beat_token = token()
    assert store.snapshot(beat_token, 30.0).lock.held
    dispatch = SchedRecord(inflight_task_id="T1", inflight_deadline=160.0,
                           last_dispatch_at=100.0, dispatches=1)
    owner = token()
    grant, written = lease.acquire_and_write(
        "L", owner, 30.0, time.time(), task_id="T1", beat_token=beat_token,
        write=store.sched_write(beat_token, {"L": dispatch}))
    assert grant.granted and written == 1
    assert stored(client, keys, sched_field("L"), SchedRecord) == (FORMATS[compact], dispatch)
    idle = RunRecord(last_run_at=50.0, last_outcome=Outcome.COMPLETED, runs=1)
    expected = encode(idle, compact=not compact)
    client.hset(keys.lanes, run_field("L"), expected)
    marked = RunRecord(last_run_at=50.0, last_outcome=Outcome.COMPLETED, runs=1,
                       running_task_id="T1", running_since=101.0, running_until=131.0,
                       fence=grant.fence)
    fence = int(client.get(keys.beat_fence))
    reply = lease.start_marked(owner, 30.0, time.time(), beat_fence=fence, holder=NO_HOLDER,
                               lane="L", task_id="T1", mark=RunMark(
                                   lanes=keys.lanes, changed=keys.changed,
                                   field=run_field("L"), expected=expected,
                                   record=store.encode_record(marked), lane="L",
                                   fence=grant.fence, journal="", entry="", journal_len=5))
    assert reply.ok and reply.marked
    assert stored(client, keys, run_field("L")) == (FORMATS[compact], marked)


def test_the_previous_release_leaves_a_compact_record_untouched(client: redis.Redis,
                                                                keys: Keys) -> None:
    """A worker of the previous release (its run_finish.lua) finishing over a compact record
    answers 'unreadable' and writes nothing: never a misread. (Its Python decode refuses it
    with a version error naming the key: tests/core/test_records.py.)"""
    compact = encode(RunRecord(last_run_at=100.5, runs=3, fence=9), compact=True)
    client.hset(keys.lanes, run_field("L"), compact)
    previous = LaneStore(client, keys)
    previous._finish = client.register_script((PREVIOUS / "run_finish.lua").read_text())
    ended = RunRecord(last_run_at=200.0, runs=4, fence=10)
    assert previous.finish("L", ended, token="", fence=10, wake_message="w",
                           encoded=encode(ended)) == (False, -1)
    assert client.hget(keys.lanes, run_field("L")) == compact


def test_records_are_rewritten_in_one_format_by_compare_and_set(client: redis.Redis,
                                                               keys: Keys) -> None:
    """``schedproj records --to long`` (before a rollback) and ``--to compact``: the same
    values in the target format, records already in it untouched, garbage reported and left."""
    run = RunRecord(last_run_at=1796405433.989978, last_outcome=Outcome.COMPLETED,
                    last_task_id="T1", runs=2, since=1796405400.5)
    sched = SchedRecord(inflight_task_id="T1", inflight_deadline=1796405493.989978,
                        last_dispatch_at=1796405433.5, dispatches=2,
                        missed_through=1796405433.1234565, missed=1)
    client.hset(keys.lanes, mapping={
        run_field("a"): encode(run, compact=True), sched_field("a"): encode(sched, compact=True),
        run_field("b"): encode(run), sched_field("b"): encode(sched),
        run_field("bad"): '{"v":2,"zz":1}'})
    dry = rewrite_records(client, keys, compact=False, dry_run=True)
    assert (dry.rewritten, dry.already, len(dry.unreadable)) == (2, 2, 1)
    assert client.hget(keys.lanes, run_field("a")) == encode(run, compact=True)
    done = rewrite_records(client, keys, compact=False)
    assert (done.rewritten, done.already, done.changed) == (2, 2, 0)
    assert "'bad|run'" in done.unreadable[0] and "unknown fields" in done.unreadable[0]
    for lane in ("a", "b"):
        assert client.hget(keys.lanes, run_field(lane)) == encode(run)
        assert client.hget(keys.lanes, sched_field(lane)) == encode(sched)
    assert client.hget(keys.lanes, run_field("bad")) == '{"v":2,"zz":1}'
    back = rewrite_records(client, keys, compact=True)
    assert (back.rewritten, back.already) == (4, 0)
    assert json.loads(client.hget(keys.lanes, run_field("b")))["v"] == COMPACT_FORMAT
    assert stored(client, keys, sched_field("b"), SchedRecord) == (COMPACT_FORMAT, sched)
