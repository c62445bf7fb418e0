"""LaneStore against a real Redis: the beat lock, the one-round-trip snapshot, guarded writes,
garbage reported and left in place, atomic finish with fencing, and the wake list.

Every test uses its own key prefix in Redis DB 14 (see ``conftest.py``) and is bounded in time.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.client

from schedproj.core.deferrals import Deferral
from schedproj.core.lanes import DeferralReason
from schedproj.core.records import LaneState, Outcome, RunRecord, SchedRecord, encode
from schedproj.devtools.processes import wait_until
from schedproj.store.connection import connect
from schedproj.store.lane_store import UNREADABLE_LEASE, LaneStore
from schedproj.store.lease import HeavyLease
from schedproj.store.protocol import Keys, run_field, sched_field
from tests.conftest import token

pytestmark = pytest.mark.timeout(60)

LONG_TTL = 30.0
SHORT_TTL = 0.3


@pytest.fixture
def store(client: redis.Redis, keys: Keys) -> LaneStore:
    return LaneStore(client, keys)


@pytest.fixture
def lease(client: redis.Redis, keys: Keys) -> HeavyLease:
    return HeavyLease(client, keys)


# -- the single-active-beat lock ---------------------------------------------------------------


def test_beat_lock_acquire_renew_hold_unlock(store: LaneStore, client: redis.Redis,
                                             keys: Keys) -> None:
    first, second = token(), token()

    snap = store.snapshot(first, LONG_TTL)
    assert snap.lock.held
    assert snap.lock.event == "acquired"
    assert snap.lock.fence >= 1
    fence1 = snap.lock.fence
    assert client.get(keys.beat_lock) == first
    assert 0 < client.pttl(keys.beat_lock) <= LONG_TTL * 1000

    snap = store.snapshot(first, LONG_TTL)
    assert snap.lock.held
    assert snap.lock.event == "renewed"
    assert snap.lock.fence == fence1

    snap = store.snapshot(second, LONG_TTL)
    assert not snap.lock.held
    assert snap.lock.event == "held"
    assert snap.lock.holder == first
    assert client.get(keys.beat_lock) == first

    # Only the holder can unlock.
    assert store.unlock(second) is False
    assert client.get(keys.beat_lock) == first
    assert store.unlock(first) is True
    assert client.exists(keys.beat_lock) == 0
    assert store.unlock(first) is False

    snap = store.snapshot(second, LONG_TTL)
    assert snap.lock.held
    assert snap.lock.event == "acquired"
    assert snap.lock.fence > fence1
    assert client.get(keys.beat_lock) == second


def test_beat_lock_renewal_extends_its_ttl(store: LaneStore, client: redis.Redis,
                                           keys: Keys) -> None:
    beat = token()
    assert store.snapshot(beat, SHORT_TTL).lock.event == "acquired"
    t0 = time.monotonic()
    while time.monotonic() - t0 < 4 * SHORT_TTL:
        snap = store.snapshot(beat, SHORT_TTL)
        assert snap.lock.held and snap.lock.event == "renewed"
        time.sleep(SHORT_TTL / 4)
    assert client.get(keys.beat_lock) == beat


def test_beat_lock_expires_on_its_own(store: LaneStore, client: redis.Redis, keys: Keys) -> None:
    dead, standby = token(), token()
    snap = store.snapshot(dead, SHORT_TTL)
    assert snap.lock.held
    fence1 = snap.lock.fence
    # While it lives, the standby is refused.
    assert store.snapshot(standby, LONG_TTL).lock.holder == dead
    t0 = time.monotonic()
    assert wait_until(lambda: client.exists(keys.beat_lock) == 0, 5.0), "lock never expired"
    assert time.monotonic() - t0 >= SHORT_TTL * 0.5
    snap = store.snapshot(standby, LONG_TTL)
    assert snap.lock.held
    assert snap.lock.event == "acquired"
    assert snap.lock.fence > fence1
    # The dead beat, back again, finds the standby in charge.
    snap = store.snapshot(dead, SHORT_TTL)
    assert not snap.lock.held
    assert snap.lock.holder == standby


def test_snapshot_reads_lanes_and_lease(store: LaneStore, lease: HeavyLease, client: redis.Redis,
                                        keys: Keys) -> None:
    beat = token()
    assert store.snapshot(beat, LONG_TTL).lock.held
    run = RunRecord(last_run_at=1000.0, last_outcome=Outcome.COMPLETED, runs=3, backlog=7,
                    fence=2)
    sched = SchedRecord(
        inflight_task_id="t-1", last_dispatch_at=990.0, dispatches=4,
        deferral=Deferral(lane="summary", reason=DeferralReason.DEPENDENCY,
                          blocker="memory-summary-backfill", since=900.0),
    )
    store.write_run("summary", run)
    assert store.write_sched(beat, {"summary": sched, "dream": SchedRecord(paused=True)})
    tok = token()
    grant = lease.acquire("backup", tok, LONG_TTL, 1234.5, task_id="task-9")

    snap = store.snapshot(beat, LONG_TTL)
    assert snap.errors == {}
    assert snap.states == {
        "summary": LaneState(run=run, sched=sched),
        "dream": LaneState(sched=SchedRecord(paused=True)),
    }
    assert snap.lease is not None
    assert (snap.lease.lane, snap.lease.token, snap.lease.fence) == ("backup", tok, grant.fence)
    assert snap.lease.task_id == "task-9"
    assert snap.lease.granted_at == pytest.approx(1234.5)


def test_snapshot_with_nothing_stored(store: LaneStore) -> None:
    snap = store.snapshot(token(), LONG_TTL)
    assert snap.states == {}
    assert snap.lease is None
    assert snap.errors == {}


# -- one round trip --------------------------------------------------------------------------


def _fill_lanes(client: redis.Redis, keys: Keys, n: int) -> None:
    mapping: dict[str, str] = {}
    for i in range(n):
        mapping[run_field(f"lane-{i}")] = encode(RunRecord(runs=i, fence=i))
        mapping[sched_field(f"lane-{i}")] = encode(SchedRecord(dispatches=i))
    client.hset(keys.lanes, mapping=mapping)


class _Calls:
    """Counts pipeline executes and direct (non-pipeline) client commands."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.executes = 0
        self.direct: list[Any] = []
        orig_execute = redis.client.Pipeline.execute
        orig_command = redis.Redis.execute_command

        def execute(pipe: Any, *a: Any, **kw: Any) -> Any:
            self.executes += 1
            return orig_execute(pipe, *a, **kw)

        def command(r: Any, *a: Any, **kw: Any) -> Any:
            self.direct.append(a[0] if a else None)
            return orig_command(r, *a, **kw)

        monkeypatch.setattr(redis.client.Pipeline, "execute", execute)
        monkeypatch.setattr(redis.Redis, "execute_command", command)


class _Wire:
    """Counts requests written to the socket: each is one network round trip."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, client: redis.Redis) -> None:
        self.sent: list[bytes] = []
        cls = client.connection_pool.connection_class
        orig = cls.send_packed_command

        def send(conn: Any, command: Any, check_health: bool = True) -> Any:
            chunks = command if isinstance(command, list) else [command]
            self.sent.append(b"".join(c if isinstance(c, bytes) else bytes(c) for c in chunks))
            return orig(conn, command, check_health)

        monkeypatch.setattr(cls, "send_packed_command", send)

    def verbs(self) -> list[str]:
        out = []
        for req in self.sent:
            parts = req.split(b"\r\n")
            # *N, $len, VERB, ...; a pipeline shows its first command.
            out.append(parts[2].decode() if len(parts) > 2 else "?")
        return out


@pytest.mark.parametrize("lanes", [1, 500])
def test_snapshot_is_a_single_pipeline_execute(
    store: LaneStore, client: redis.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch,
    lanes: int,
) -> None:
    _fill_lanes(client, keys, lanes)
    beat = token()
    calls = _Calls(monkeypatch)
    snap = store.snapshot(beat, LONG_TTL)
    assert calls.executes == 1
    assert calls.direct == [], f"snapshot issued client commands outside its pipeline: " \
                               f"{calls.direct}"
    assert snap.lock.held
    assert snap.errors == {}
    assert len(snap.states) == lanes
    assert snap.states[f"lane-{lanes - 1}"].run.runs == lanes - 1
    # Steady state too (script already known to the server).
    calls.executes, calls.direct = 0, []
    snap = store.snapshot(beat, LONG_TTL)
    assert (calls.executes, calls.direct) == (1, [])
    assert len(snap.states) == lanes


@pytest.mark.parametrize("lanes", [1, 500])
def test_snapshot_is_one_network_round_trip(
    store: LaneStore, client: redis.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch,
    lanes: int,
) -> None:
    _fill_lanes(client, keys, lanes)
    beat = token()
    store.snapshot(beat, LONG_TTL)  # warm: connection open, script loaded on the server
    wire = _Wire(monkeypatch, client)
    snap = store.snapshot(beat, LONG_TTL)
    assert len(snap.states) == lanes
    assert len(wire.sent) == 1, f"round trips: {wire.verbs()}"


def test_the_incremental_tick_read_is_one_script_call(
    store: LaneStore, client: redis.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Lock renewal, epoch check and the read of what changed are one EVALSHA (tick.lua), not
    a pipeline of three: an idle tick costs Redis one script invocation."""
    _fill_lanes(client, keys, 50)
    beat = token()
    store.tick_snapshot(beat, LONG_TTL, 0.0, cursor=None, now=time.time())  # warm
    wire = _Wire(monkeypatch, client)
    snap = store.tick_snapshot(beat, LONG_TTL, 0.0, cursor=time.time() - 1, now=time.time())
    assert snap.lock.held and snap.lock.event == "renewed" and snap.epoch.cause == ""
    assert wire.verbs() == ["EVALSHA"], f"round trips: {wire.verbs()}"
    assert wire.sent[0].count(b"EVALSHA") == 1


def test_the_records_of_the_lanes_read_every_tick_are_decoded_once_while_unchanged(
        store: LaneStore, client: redis.Redis, keys: Keys) -> None:
    """The lanes a tick reads every time (gate blockers, due-check lanes: ``always``) come
    back each tick; a record read back as the last read had it is the record decoded then
    (decoding the REM chain's eight records was a third of the idle tick). A record that
    changed is decoded afresh, and a lane not read every tick is not kept."""
    now = round(time.time(), 3)
    client.hset(keys.lanes, mapping={
        run_field("kept"): encode(RunRecord(runs=1, last_run_at=now - 5)),
        sched_field("kept"): encode(SchedRecord(dispatches=1)),
        run_field("other"): encode(RunRecord(runs=7))})
    client.sadd(keys.changed, "other")
    beat = token()
    first = store.tick_snapshot(beat, LONG_TTL, 0.0, cursor=None, now=now, always=["kept"])
    assert {"kept", "other"} <= set(first.states)
    again = store.tick_snapshot(beat, LONG_TTL, 0.0, cursor=now, now=now + 1, always=["kept"])
    assert again.states["kept"].run is first.states["kept"].run, "decoded again"
    assert again.states["kept"].sched is first.states["kept"].sched
    client.hset(keys.lanes, run_field("kept"), encode(RunRecord(runs=2, last_run_at=now)))
    later = store.tick_snapshot(beat, LONG_TTL, 0.0, cursor=now + 1, now=now + 2,
                                always=["kept"])
    assert later.states["kept"].run == RunRecord(runs=2, last_run_at=now)
    assert later.states["kept"].sched is first.states["kept"].sched
    assert {fld for fld, _ in store._always_decoded} == {run_field("kept"), sched_field("kept")}


# -- guarded beat writes -----------------------------------------------------------------------


def test_write_sched_refused_without_the_beat_lock(store: LaneStore, client: redis.Redis,
                                                   keys: Keys) -> None:
    record = {"summary": SchedRecord(dispatches=1, inflight_task_id="t-1")}
    # Nobody holds the lock.
    assert store.write_sched(token(), record) is False
    assert client.exists(keys.lanes) == 0
    # Somebody else holds it.
    holder = token()
    assert store.snapshot(holder, LONG_TTL).lock.held
    assert store.write_sched(token(), record) is False
    assert client.exists(keys.lanes) == 0
    # The holder may write.
    assert store.write_sched(holder, record) is True
    assert client.hget(keys.lanes, sched_field("summary")) == encode(record["summary"])


def test_write_sched_refused_after_the_lock_moves_on(store: LaneStore, client: redis.Redis,
                                                     keys: Keys) -> None:
    old, new = token(), token()
    assert store.snapshot(old, SHORT_TTL).lock.held
    assert store.write_sched(old, {"summary": SchedRecord(dispatches=1)})
    assert wait_until(lambda: client.exists(keys.beat_lock) == 0, 5.0)
    assert store.snapshot(new, LONG_TTL).lock.held
    before = client.hgetall(keys.lanes)
    assert store.write_sched(old, {"summary": SchedRecord(dispatches=99),
                                   "dream": SchedRecord(dispatches=99)}) is False
    assert client.hgetall(keys.lanes) == before


def test_write_sched_leaves_run_fields_alone(store: LaneStore, client: redis.Redis,
                                             keys: Keys) -> None:
    beat = token()
    assert store.snapshot(beat, LONG_TTL).lock.held
    run = RunRecord(runs=5, fence=3)
    store.write_run("summary", run)
    assert store.write_sched(beat, {"summary": SchedRecord(dispatches=2)})
    assert store.read_run("summary") == run


# -- garbage in the lanes hash -----------------------------------------------------------------

GOOD_RUN = RunRecord(last_run_at=1000.0, last_outcome=Outcome.COMPLETED, runs=2, fence=1)
GOOD_SCHED = SchedRecord(dispatches=2, last_dispatch_at=999.0)

GARBAGE = [
    pytest.param("run", "not json {", id="run-not-json"),
    pytest.param("run", "", id="run-empty"),
    pytest.param("run", "[1, 2]", id="run-array"),
    pytest.param("run", "null", id="run-null"),
    pytest.param("run", '{"v": 99, "runs": 1}', id="run-future-version"),
    pytest.param("run", '{"runs": 1}', id="run-no-version"),
    pytest.param("run", '{"v": 1, "bogus": 1}', id="run-unknown-field"),
    pytest.param("run", '{"v": 1, "runs": "many"}', id="run-wrong-type-int"),
    pytest.param("run", '{"v": 1, "backlog": true}', id="run-bool-for-int"),
    pytest.param("run", '{"v": 1, "last_run_at": "yesterday"}', id="run-wrong-type-float"),
    pytest.param("run", '{"v": 1, "last_task_id": 7}', id="run-wrong-type-str"),
    pytest.param("run", '{"v": 1, "last_outcome": "exploded"}', id="run-bad-enum"),
    pytest.param("sched", "\x00\xff garbage", id="sched-binary-ish"),
    pytest.param("sched", '{"v": 99}', id="sched-future-version"),
    pytest.param("sched", '{"v": 1, "surprise": {}}', id="sched-unknown-field"),
    pytest.param("sched", '{"v": 1, "paused": "yes"}', id="sched-wrong-type-bool"),
    pytest.param("sched", '{"v": 1, "dispatches": [1]}', id="sched-wrong-type-int"),
    pytest.param("sched", '{"v": 1, "deferral": "soon"}', id="sched-deferral-string"),
    pytest.param("sched", '{"v": 1, "deferral": {"lane": "x", "reason": "nope", '
                          '"blocker": null, "since": 1.0}}', id="sched-deferral-bad-reason"),
    pytest.param("sched", '{"v": 1, "deferral": {"lane": "x", "reason": '
                          '"dependency-backpressure"}}', id="sched-deferral-missing-field"),
    pytest.param("sched", '{"v": 1, "deferral": {"lane": "x", "reason": '
                          '"dependency-backpressure", "blocker": null, "since": 1.0, "z": 0}}',
                 id="sched-deferral-unknown-field"),
]


def _seed_good(client: redis.Redis, keys: Keys) -> None:
    client.hset(keys.lanes, mapping={
        run_field("good"): encode(GOOD_RUN),
        sched_field("good"): encode(GOOD_SCHED),
        run_field("also-good"): encode(RunRecord(runs=1)),
    })


@pytest.mark.parametrize(("part", "garbage"), GARBAGE)
def test_garbage_lane_field_is_reported_and_left_in_place(
    store: LaneStore, client: redis.Redis, keys: Keys, part: str, garbage: str
) -> None:
    _seed_good(client, keys)
    fld = f"bad|{part}"
    client.hset(keys.lanes, fld, garbage)
    # The other record of the bad lane is fine: the whole lane is still unreadable.
    other = sched_field("bad") if part == "run" else run_field("bad")
    client.hset(keys.lanes, other, encode(GOOD_SCHED if part == "run" else GOOD_RUN))

    beat = token()
    snap = store.snapshot(beat, LONG_TTL)
    assert snap.lock.held
    assert set(snap.errors) == {"bad"}
    message = snap.errors["bad"]
    assert keys.lanes in message and repr(fld) in message
    assert "bad" not in snap.states
    assert snap.states["good"] == LaneState(run=GOOD_RUN, sched=GOOD_SCHED)
    assert snap.states["also-good"] == LaneState(run=RunRecord(runs=1))

    # A tick's writes for the healthy lanes do not touch it; nor does a second snapshot.
    assert store.write_sched(beat, {"good": SchedRecord(dispatches=3)})
    store.snapshot(beat, LONG_TTL)
    assert client.hget(keys.lanes, fld) == garbage


def test_unexpected_hash_field_is_reported_and_left_in_place(
    store: LaneStore, client: redis.Redis, keys: Keys
) -> None:
    _seed_good(client, keys)
    client.hset(keys.lanes, mapping={"stray": "x", "good|weird": "{}"})
    snap = store.snapshot(token(), LONG_TTL)
    assert set(snap.errors) == {"stray", "good|weird"}
    assert snap.states["good"] == LaneState(run=GOOD_RUN, sched=GOOD_SCHED)
    assert client.hget(keys.lanes, "stray") == "x"
    assert client.hget(keys.lanes, "good|weird") == "{}"


def test_garbage_inside_a_deferral_is_reported(store: LaneStore, client: redis.Redis,
                                               keys: Keys) -> None:
    _seed_good(client, keys)
    garbage = json.dumps({"v": 1, "deferral": {
        "lane": 5, "reason": DeferralReason.LEASE_HELD.value, "blocker": [],
        "since": "yesterday"}})
    client.hset(keys.lanes, sched_field("bad"), garbage)
    snap = store.snapshot(token(), LONG_TTL)
    assert client.hget(keys.lanes, sched_field("bad")) == garbage
    assert "good" in snap.states
    assert "bad" in snap.errors
    assert "bad" not in snap.states


@pytest.mark.parametrize("deferral", [{"lane": "x"}, {}, [["lane", "x"]]])
def test_deferral_without_a_reason_is_reported_not_raised(
    store: LaneStore, client: redis.Redis, keys: Keys, deferral: Any
) -> None:
    _seed_good(client, keys)
    garbage = json.dumps({"v": 1, "deferral": deferral})
    client.hset(keys.lanes, sched_field("bad"), garbage)
    snap = store.snapshot(token(), LONG_TTL)
    assert "bad" in snap.errors
    assert "bad" not in snap.states
    assert "good" in snap.states
    assert client.hget(keys.lanes, sched_field("bad")) == garbage


def test_garbage_lease_in_snapshot_counts_as_held(store: LaneStore, client: redis.Redis,
                                                  keys: Keys) -> None:
    _seed_good(client, keys)
    client.set(keys.lease, "not a lease")
    snap = store.snapshot(token(), LONG_TTL)
    assert "<lease>" in snap.errors
    assert keys.lease in snap.errors["<lease>"]
    assert snap.lease == UNREADABLE_LEASE
    assert "good" in snap.states
    assert client.get(keys.lease) == "not a lease"


# -- finish: atomic outcome + release + wake ---------------------------------------------------


def _record(fence: int, runs: int = 1, outcome: Outcome = Outcome.COMPLETED) -> RunRecord:
    return RunRecord(last_run_at=2000.0, last_outcome=outcome, last_task_id=f"task-{fence}",
                     runs=runs, fence=fence)


def test_finish_by_the_owner_releases_writes_and_wakes(
    store: LaneStore, lease: HeavyLease, client: redis.Redis, keys: Keys
) -> None:
    tok = token()
    grant = lease.acquire("summary", tok, LONG_TTL, time.time())
    assert lease.start(tok, LONG_TTL, time.time())[0]
    record = _record(grant.fence)
    released, written = store.finish("summary", record, token=tok, fence=grant.fence,
                                     wake_message="summary:completed")
    assert (released, written) == (True, 1)
    assert lease.read() is None
    assert store.read_run("summary") == record
    assert client.lrange(keys.wake, 0, -1) == ["summary:completed"]
    # The next acquisition gets a higher fence.
    assert lease.acquire("dream", token(), LONG_TTL, time.time()).fence > grant.fence


def test_finish_with_a_stale_token_keeps_the_current_lease(
    store: LaneStore, lease: HeavyLease, client: redis.Redis, keys: Keys
) -> None:
    old, new = token(), token()
    g_old = lease.acquire("summary", old, LONG_TTL, time.time())
    assert lease.release(old)
    g_new = lease.acquire("dream", new, LONG_TTL, time.time())
    raw = client.get(keys.lease)

    released, _ = store.finish("summary", _record(g_old.fence), token=old, fence=g_old.fence,
                               wake_message="summary:completed")
    assert released is False
    assert client.get(keys.lease) == raw
    view = lease.read()
    assert view is not None
    assert (view.token, view.fence) == (new, g_new.fence)
    assert client.pttl(keys.lease) > 0


def test_finish_of_a_light_lane_never_releases(store: LaneStore, lease: HeavyLease) -> None:
    tok = token()
    assert lease.acquire("summary", tok, LONG_TTL, time.time()).granted
    released, written = store.finish("golden-path", _record(0), token="", fence=0,
                                     wake_message="golden-path:completed")
    assert (released, written) == (False, 1)
    view = lease.read()
    assert view is not None and view.token == tok


def test_late_finish_with_a_lower_fence_cannot_clobber_a_newer_run(
    store: LaneStore, lease: HeavyLease, client: redis.Redis, keys: Keys
) -> None:
    old, new = token(), token()
    g_old = lease.acquire("summary", old, SHORT_TTL, time.time())
    assert wait_until(lambda: lease.read() is None, 5.0)  # the old run lost its lease
    g_new = lease.acquire("summary", new, LONG_TTL, time.time())
    assert g_new.fence > g_old.fence
    newer = _record(g_new.fence, runs=7)
    assert store.finish("summary", newer, token=new, fence=g_new.fence,
                        wake_message="summary:completed") == (True, 1)
    stored = client.hget(keys.lanes, run_field("summary"))

    # The old run wakes up late and reports.
    late = _record(g_old.fence, runs=99, outcome=Outcome.FAILED)
    released, written = store.finish("summary", late, token=old, fence=g_old.fence,
                                     wake_message="summary:failed")
    assert (released, written) == (False, 0)
    assert client.hget(keys.lanes, run_field("summary")) == stored
    assert store.read_run("summary") == newer
    # Beat is still woken, so it re-ranks at once.
    assert client.lrange(keys.wake, 0, -1) == ["summary:failed", "summary:completed"]


def test_finish_with_an_equal_fence_writes(store: LaneStore, client: redis.Redis) -> None:
    """A run's own running-mark carries its fence; its finish must still land."""
    store.write_run("summary", RunRecord(running_task_id="task-4", fence=4))
    record = _record(4)
    assert store.finish("summary", record, token="", fence=4, wake_message="w") == (False, 1)
    assert store.read_run("summary") == record


@pytest.mark.parametrize("garbage", ["not json {", '"a string"', "42"])
def test_finish_leaves_an_unreadable_record_untouched(
    store: LaneStore, lease: HeavyLease, client: redis.Redis, keys: Keys, garbage: str
) -> None:
    client.hset(keys.lanes, run_field("summary"), garbage)
    tok = token()
    grant = lease.acquire("summary", tok, LONG_TTL, time.time())
    released, written = store.finish("summary", _record(grant.fence), token=tok,
                                     fence=grant.fence, wake_message="summary:completed")
    assert written == -1
    assert client.hget(keys.lanes, run_field("summary")) == garbage
    # The rest of the step still happened: the lease is free and beat is woken.
    assert released is True
    assert lease.read() is None
    assert client.lrange(keys.wake, 0, -1) == ["summary:completed"]


@pytest.mark.parametrize("garbage", [
    '{"v": 1, "fence": "abc"}', '{"v": 1, "fence": null}', '{"v": 1, "fence": true}'])
def test_finish_with_a_non_numeric_stored_fence_reports_unreadable(
    store: LaneStore, lease: HeavyLease, client: redis.Redis, keys: Keys, garbage: str
) -> None:
    client.hset(keys.lanes, run_field("summary"), garbage)
    tok = token()
    grant = lease.acquire("summary", tok, LONG_TTL, time.time())
    result = store.finish("summary", _record(grant.fence), token=tok, fence=grant.fence,
                          wake_message="summary:completed")
    assert result == (True, -1)
    assert client.hget(keys.lanes, run_field("summary")) == garbage
    assert client.lrange(keys.wake, 0, -1) == ["summary:completed"]


@pytest.mark.parametrize("garbage", [
    pytest.param("[1, 2]", id="json-array"),
    pytest.param('{"v": 99, "fence": 0, "runs": 3}', id="future-version"),
    pytest.param('{"v": 1, "fence": 0, "runs": "many"}', id="wrong-type"),
])
def test_finish_leaves_a_record_schedproj_cannot_decode_untouched(
    store: LaneStore, client: redis.Redis, keys: Keys, garbage: str
) -> None:
    client.hset(keys.lanes, run_field("summary"), garbage)
    _, written = store.finish("summary", _record(5), token="", fence=5,
                              wake_message="summary:completed")
    assert client.hget(keys.lanes, run_field("summary")) == garbage
    assert written == -1


def test_wake_list_is_bounded(store: LaneStore, client: redis.Redis, keys: Keys) -> None:
    for i in range(100):
        store.finish("golden-path", _record(0), token="", fence=0, wake_message=f"m{i}")
    for i in range(10):
        store.wake(f"w{i}")
    assert client.llen(keys.wake) == 64
    assert client.lindex(keys.wake, 0) == "w9"


# -- wake ----------------------------------------------------------------------------------


def _push_later(redis_url: str, keys: Keys, delay_s: float,
                push: Callable[[LaneStore], None]) -> threading.Thread:
    def run() -> None:
        c = connect(redis_url)
        try:
            time.sleep(delay_s)
            push(LaneStore(c, keys))
        finally:
            c.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("how", ["wake", "finish"])
def test_wait_for_wake_returns_promptly_when_woken(
    store: LaneStore, client: redis.Redis, keys: Keys, redis_url: str, how: str
) -> None:
    def push(other: LaneStore) -> None:
        if how == "wake":
            other.wake("summary:completed")
        else:
            other.finish("golden-path", _record(0), token="", fence=0,
                         wake_message="golden-path:completed")

    pusher = _push_later(redis_url, keys, 0.3, push)
    t0 = time.monotonic()
    woke = store.wait_for_wake(10.0)
    elapsed = time.monotonic() - t0
    pusher.join(timeout=5)
    assert woke is True
    assert 0.2 <= elapsed < 2.0, f"woke after {elapsed:.3f}s"
    # One tick handles every pending message: its read empties the list.
    store.tick_snapshot(token(), LONG_TTL, 0.0, cursor=None, now=time.time())
    assert client.llen(keys.wake) == 0


def test_wait_for_wake_returns_at_once_when_messages_are_pending(
    store: LaneStore, client: redis.Redis, keys: Keys
) -> None:
    store.wake("a")
    store.wake("b")
    t0 = time.monotonic()
    assert store.wait_for_wake(10.0) is True
    assert time.monotonic() - t0 < 1.0
    # Emptied by the next tick's read, in its round trip (not one of the wait's own).
    assert client.llen(keys.wake) == 1
    store.tick_snapshot(token(), LONG_TTL, 0.0, cursor=None, now=time.time())
    assert client.llen(keys.wake) == 0


def test_a_wake_after_the_ticks_read_is_seen_by_the_next_wait(
    store: LaneStore, client: redis.Redis, keys: Keys
) -> None:
    beat = token()
    store.wake("a")
    assert store.wait_for_wake(10.0) is True
    store.tick_snapshot(beat, LONG_TTL, 0.0, cursor=None, now=time.time())
    store.wake("b")  # a run ended after the tick's read: the next wait must not sleep
    t0 = time.monotonic()
    assert store.wait_for_wake(10.0) is True
    assert time.monotonic() - t0 < 1.0
    # A tick without a wake before it leaves the list alone.
    store.tick_snapshot(beat, LONG_TTL, 0.0, cursor=None, now=time.time())
    assert client.llen(keys.wake) == 0
    store.wake("c")
    store.tick_snapshot(beat, LONG_TTL, 0.0, cursor=None, now=time.time())
    assert client.llen(keys.wake) == 1


def test_wait_for_wake_times_out(store: LaneStore) -> None:
    t0 = time.monotonic()
    assert store.wait_for_wake(0.3) is False
    elapsed = time.monotonic() - t0
    assert 0.25 <= elapsed < 2.0, f"returned after {elapsed:.3f}s"


def test_wait_for_wake_with_no_time_left(store: LaneStore) -> None:
    store.wake("pending")
    t0 = time.monotonic()
    assert store.wait_for_wake(0) is False
    assert store.wait_for_wake(-1) is False
    assert time.monotonic() - t0 < 0.5


def test_a_long_tick_renews_the_lock_only_while_it_still_holds_it(store: LaneStore,
                                                                  client: redis.Redis) -> None:
    beat = token()
    assert store.snapshot(beat, SHORT_TTL).lock.held
    assert store.renew(beat, LONG_TTL)
    assert client.pttl(store.keys.beat_lock) > SHORT_TTL * 1000
    client.delete(store.keys.beat_lock)  # expired mid-tick
    assert not store.renew(beat, LONG_TTL), "a lock taken afresh has another fence"
    assert client.get(store.keys.beat_lock) is None
    other = token()
    assert store.snapshot(other, LONG_TTL).lock.held
    assert not store.renew(beat, LONG_TTL)


def test_the_tick_read_returns_what_changed_and_what_fell_due(store: LaneStore,
                                                              client: redis.Redis) -> None:
    beat = token()
    now = time.time()
    store.write_run("a", RunRecord(last_run_at=now, runs=1))
    client.zadd(store.keys.due, {"a": now + 100, "b": now - 5, "c": now + 10})
    full = store.tick_snapshot(beat, LONG_TTL, 0.0, cursor=None, now=now)
    assert set(full.looked) == {"a", "b"} and full.changed == {"a"}
    assert full.scores == {"a": now + 100, "b": now - 5} and full.next_look == now + 10
    assert full.states["a"].run.runs == 1 and full.states["b"] == LaneState()
    later = store.tick_snapshot(beat, LONG_TTL, 0.0, cursor=now, now=now + 11)
    assert later.looked == ("c",) and not later.changed, "only what fell due since"
    idle = store.tick_snapshot(beat, LONG_TTL, 0.0, cursor=now + 11, now=now + 12)
    assert idle.looked == () and idle.next_look == now + 100
    standby = store.tick_snapshot(token(), LONG_TTL, 0.0, cursor=None, now=now)
    assert not standby.lock.held and standby.looked == ()


# -- what the epoch check saw: an empty Redis, a partial loss (lua/epoch.lua's cause) ----------


def tick(store: LaneStore, beat: str) -> Any:
    return store.tick_snapshot(beat, LONG_TTL, 20.0, cursor=None, now=time.time()).epoch


def test_the_epoch_check_says_an_empty_redis_and_who_read_state_before(
        store: LaneStore, client: redis.Redis, keys: Keys) -> None:
    client.delete(keys.epoch)  # the fixture declared the prefix new: now it holds nothing
    beat = token()
    first = tick(store, beat)
    assert first.cause == "state-empty" and first.known_id == ""
    assert first.quarantine_left_s > 19, "an empty Redis waits the quarantine like any loss"
    again = tick(store, beat)
    assert again.cause == "" and again.known_id == first.id
    client.delete(*client.scan_iter(f"{keys.prefix}:*"))  # then Redis loses everything
    lost = tick(store, beat)
    assert lost.cause == "state-empty" and lost.known_id == first.id != lost.id
    # Without the keys that tell (the pipelined snapshot), nothing shows emptiness.
    client.delete(*client.scan_iter(f"{keys.prefix}:*"))
    assert LaneStore(client, keys).snapshot(token(), LONG_TTL, 20.0).epoch.cause == (
        "state-missing")


WITNESSES: dict[str, Callable[[redis.Redis, Keys], Any]] = {
    "lane record": lambda c, k: c.hset(k.lanes, run_field("x"), encode(RunRecord(runs=1))),
    "lease": lambda c, k: c.set(k.lease, json.dumps({"lane": "x"}), px=60_000),
    "due index": lambda c, k: c.zadd(k.due, {"x": 1.0}),
    "changed set": lambda c, k: c.sadd(k.changed, "x"),
    "due stamp": lambda c, k: c.set(k.due_stamp, "1"),
    "changed stamp": lambda c, k: c.set(k.changed_stamp, "1"),
    "garbled epoch record": lambda c, k: c.set(k.epoch, "{not json"),
}


@pytest.mark.parametrize("left", sorted(WITNESSES))
def test_a_lost_epoch_record_beside_other_state_is_a_partial_loss(
        store: LaneStore, client: redis.Redis, keys: Keys, left: str) -> None:
    client.delete(keys.epoch)
    WITNESSES[left](client, keys)
    epoch = tick(store, token())
    assert epoch.cause == "state-missing" and epoch.known_id == ""
    assert epoch.quarantine_left_s > 19
