"""Beat forgets a dispatch once its run ended (``planner.sched_changes``): the sched record
left behind has no in-flight fields, which takes a resting lane's sched record from Redis's
160-byte allocation class to the 64-byte one. A rolling deploy from the previous release
meets such records both ways: its worker (tests/store/previous_release, its Lua as shipped)
refuses a redelivered copy of the ended message and starts the next dispatch; its reader
(version 1 only, unknown fields refused, missing ones defaulted) reads the record. Real
redis-server, no mocks."""

from __future__ import annotations

import json
import time
from dataclasses import fields
from pathlib import Path

import pytest
import redis

from schedproj.core import codec, lifecycle
from schedproj.core.defaults import STATE_VERSION
from schedproj.core.lanes import LaneKind, LaneSpec, Profile
from schedproj.core.pipeline import decide
from schedproj.core.planner import sched_changes
from schedproj.core.records import Outcome, RunRecord, SchedRecord
from schedproj.store.lane_store import LaneStore
from schedproj.store.protocol import Keys, run_field, sched_field
from tests.conftest import token

pytestmark = pytest.mark.timeout(60)

PREVIOUS = Path(__file__).parent / "previous_release"
LANE = LaneSpec(name="L", task_name="t.L", kind=LaneKind.LIGHT, cadence_s=3600.0)
#: The previous release's SchedRecord fields (its records.py at 5731b06): its decode refuses
#: any other field name.
PREVIOUS_SCHED_FIELDS = {"inflight_task_id", "inflight_deadline", "last_dispatch_at",
                         "dispatches", "deferral", "paused"}


def previous_worker(client: redis.Redis, keys: Keys) -> LaneStore:
    """A store calling the previous release's run_cas.lua and run_finish.lua."""
    store = LaneStore(client, keys)
    store._finish = client.register_script((PREVIOUS / "run_finish.lua").read_text())
    store._cas = client.register_script((PREVIOUS / "run_cas.lua").read_text())
    return store


def previous_encode(record: RunRecord) -> str:
    """The previous release's encoding of a run record: every field written, null or not."""
    data = {"v": STATE_VERSION}
    data.update({f.name: getattr(record, f.name) for f in fields(RunRecord)
                 if f.name != "since"})
    return json.dumps(data, separators=(",", ":"))


def beat_plans(beat: LaneStore, beat_token: str, now: float) -> dict[str, SchedRecord]:
    """One tick of beat's planning of lane L on what it reads, its changes written."""
    states = beat.snapshot(beat_token, 30.0).states
    decision = decide([LANE], states, None, now, Profile.LOCAL)
    changes, _ = sched_changes(decision, states, {}, now)
    assert beat.write_sched(beat_token, changes)
    return changes


def run_light(worker: LaneStore, task_id: str, fence: int, *, previous: bool) -> None:
    """A worker starts ``task_id`` (compare and set with the dispatch check) and ends it."""
    raw, before = worker.read_run_raw("L")
    started = lifecycle.started(before, task_id=task_id, now=time.time(),
                                 running_until=time.time() + 60)
    arg = previous_encode(started) if previous else None
    if previous:
        keys = [worker.keys.lanes, worker.keys.beat_fence, worker.keys.changed,
                worker.keys.epoch]
        code, reason = worker._cas(keys=keys, args=[run_field("L"), raw or "", arg,
                                                    sched_field("L"), task_id, str(fence),
                                                    "L", "60000"])
        assert (int(code), reason) == (1, "")
    else:
        assert worker.cas_run("L", raw, started, dispatch=(task_id, fence),
                              mark_ttl_s=60.0) == (True, "")
    _, running = worker.read_run_raw("L")
    ended = lifecycle.finished(running, task_id=task_id, outcome=Outcome.COMPLETED,
                               reason=None, backlog=0, now=time.time())
    # (no lease released, the record written)
    assert worker.finish("L", ended, token="", fence=0, wake_message="w",
                         encoded=previous_encode(ended) if previous else None) == (False, 1)


@pytest.mark.parametrize("previous", [True, False], ids=["previous-worker", "this-worker"])
def test_an_ended_dispatch_is_forgotten_and_its_copy_refused(
        client: redis.Redis, keys: Keys, previous: bool) -> None:
    beat = LaneStore(client, keys)
    beat.declare_fresh()  # (the fixture may have declared it already)
    beat_token = token()
    assert beat.snapshot(beat_token, 30.0).lock.held
    now = round(time.time(), 6)
    dispatched = SchedRecord(inflight_task_id="T1", inflight_deadline=now + 60,
                             last_dispatch_at=now, dispatches=1)
    assert beat.write_sched(beat_token, {"L": dispatched})
    fence = int(client.get(keys.beat_fence))
    worker = previous_worker(client, keys) if previous else LaneStore(client, keys)
    # Before the run ends, beat's planning keeps the dispatch (the message may still come).
    assert beat_plans(beat, beat_token, time.time()) == {}
    run_light(worker, "T1", fence, previous=previous)

    changes = beat_plans(beat, beat_token, time.time())
    # (the time as stored: to the microsecond)
    assert changes == {"L": SchedRecord(last_dispatch_at=round(now, 6), dispatches=1)}
    raw = client.hget(keys.lanes, sched_field("L"))
    assert len(raw) + 4 <= 64  # the record and its string header: the 64-byte class
    # The previous release's reader: version 1, only field names it knows.
    data = codec.loads(raw, "lanes field 'L|sched'", STATE_VERSION)
    assert set(data) <= PREVIOUS_SCHED_FIELDS and "inflight_task_id" not in data
    # Forgotten once: the next plan writes nothing.
    assert beat_plans(beat, beat_token, time.time()) == {}

    # A redelivered copy of the ended message is refused by either release's worker, and
    # nothing is written.
    run_before = client.hget(keys.lanes, run_field("L"))
    for late in (previous_worker(client, keys), LaneStore(client, keys)):
        _, before = late.read_run_raw("L")
        again = lifecycle.started(before, task_id="T1", now=time.time(),
                                  running_until=time.time() + 60)
        code, reason = late._cas(
            keys=[keys.lanes, keys.beat_fence, keys.changed, keys.epoch],
            args=[run_field("L"), run_before, previous_encode(again), sched_field("L"), "T1",
                  str(fence), "L", "60000"])
        assert (int(code), reason) == (0, "not-current-dispatch")
    assert client.hget(keys.lanes, run_field("L")) == run_before

    # The next dispatch starts under the worker of either release.
    assert beat.write_sched(beat_token, {"L": SchedRecord(
        inflight_task_id="T2", inflight_deadline=time.time() + 60,
        last_dispatch_at=time.time(), dispatches=2)})
    run_light(worker, "T2", fence, previous=previous)
    _, after = worker.read_run_raw("L")
    assert (after.last_task_id, after.runs) == ("T2", 2)
