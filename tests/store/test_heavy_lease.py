"""The heavy lease against a real Redis: exclusion under a race, ownership, fencing, expiry.

Every test uses its own key prefix in Redis DB 14 (see ``conftest.py``) and is bounded in time:
expiry is checked with short TTLs and bounded polling loops, never with one long sleep.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import queue
import time
from typing import Any

import pytest
import redis

from schedproj.core.errors import StateError
from schedproj.devtools.processes import wait_until
from schedproj.store import scripts
from schedproj.store.connection import connect
from schedproj.store.lane_store import LaneStore
from schedproj.store.lease import HeavyLease
from schedproj.store.protocol import Keys
from tests.conftest import REDIS_URL, token

pytestmark = pytest.mark.timeout(60)

LANE = "summary"
#: A TTL long enough that no test sees it lapse by accident.
LONG_TTL = 30.0
#: A TTL short enough to watch it lapse.
SHORT_TTL = 0.3


@pytest.fixture
def lease(client: redis.Redis, keys: Keys) -> HeavyLease:
    return HeavyLease(client, keys)


# -- mutual exclusion under a race of OS processes ----------------------------------------------

RACERS = 12


def _race(url: str, prefix: str, lane: str, tok: str, barrier: Any, results: Any) -> None:
    """One contender: its own client, connected before the start line, then one acquire."""
    try:
        c = connect(url)
        c.ping()
        heavy = HeavyLease(c, Keys(prefix))
        barrier.wait(timeout=30)
        grant = heavy.acquire(lane, tok, LONG_TTL, time.time())
        results.put((tok, lane, grant.granted, grant.fence, grant.holder, ""))
        c.close()
    except BaseException as exc:  # reported to the parent, which fails the test
        results.put((tok, lane, False, 0, None, repr(exc)))


def _mp_context() -> mp.context.BaseContext:
    methods = mp.get_all_start_methods()
    return mp.get_context("fork" if "fork" in methods else "spawn")


def test_racing_processes_end_with_exactly_one_holder(
    redis_url: str, key_prefix: str, client: redis.Redis, lease: HeavyLease
) -> None:
    # Load the script up front so every contender goes straight to EVALSHA (a tight race).
    client.script_load(scripts.source("lease_acquire"))
    ctx = _mp_context()
    barrier = ctx.Barrier(RACERS)
    results = ctx.Queue()
    contenders = [(f"lane-{i}", token()) for i in range(RACERS)]
    procs = [ctx.Process(target=_race, args=(redis_url, key_prefix, lane, tok, barrier, results))
             for lane, tok in contenders]
    for p in procs:
        p.start()
    answers: list[tuple[str, str, bool, int, str | None, str]] = []
    deadline = time.monotonic() + 30
    try:
        while len(answers) < RACERS and time.monotonic() < deadline:
            try:
                answers.append(results.get(timeout=0.5))
            except queue.Empty:
                if not any(p.is_alive() for p in procs) and results.empty():
                    break  # a contender died without answering
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)

    assert [a[5] for a in answers if a[5]] == [], "a contender failed"
    assert len(answers) == RACERS, f"only {len(answers)} of {RACERS} contenders answered " \
        f"(exit codes {[p.exitcode for p in procs]})"
    winners = [a for a in answers if a[2]]
    assert len(winners) == 1, f"expected exactly one grant, got {winners}"
    win_tok, win_lane, _, win_fence, _, _ = winners[0]
    assert win_fence >= 1
    # Every loser was told who holds it: the winner's lane.
    assert {a[4] for a in answers if not a[2]} == {win_lane}
    record = lease.read()
    assert record is not None
    assert record.token == win_tok
    assert record.lane == win_lane
    assert record.fence == win_fence
    # Losers never bumped the fencing counter.
    assert lease.current_fence() == win_fence > 0


# -- ownership -------------------------------------------------------------------------------


def test_non_owner_cannot_renew_start_or_release(lease: HeavyLease, client: redis.Redis,
                                                  keys: Keys) -> None:
    owner, intruder = token(), token()
    grant = lease.acquire(LANE, owner, LONG_TTL, time.time(), task_id="task-1")
    assert grant.granted
    before = lease.read()
    raw_before = client.get(keys.lease)

    assert lease.renew(intruder, LONG_TTL, time.time(), 3600) == (False, "lost")
    assert lease.start(intruder, LONG_TTL, time.time()) == (False, "taken")
    assert lease.release(intruder) is False
    # A second acquisition is refused too, naming the holder's lane.
    again = lease.acquire("backup", intruder, LONG_TTL, time.time())
    assert not again.granted
    assert again.holder == LANE

    assert client.get(keys.lease) == raw_before
    assert lease.read() == before
    assert before is not None
    assert before.token == owner
    assert before.fence == grant.fence
    assert before.task_id == "task-1"
    assert before.started_at is None
    assert client.pttl(keys.lease) > 0

    assert lease.release(owner) is True
    assert lease.read() is None
    assert client.exists(keys.lease) == 0
    # Releasing twice is a no-op, and the fence counter survives the release.
    assert lease.release(owner) is False
    assert lease.current_fence() == grant.fence


def test_release_frees_the_lease_for_the_next_holder(lease: HeavyLease) -> None:
    first, second = token(), token()
    assert lease.acquire(LANE, first, LONG_TTL, time.time()).granted
    assert lease.release(first)
    grant = lease.acquire("dream", second, LONG_TTL, time.time())
    assert grant.granted
    view = lease.read()
    assert view is not None
    assert (view.lane, view.token) == ("dream", second)


# -- fencing ---------------------------------------------------------------------------------


def test_fence_strictly_increases_across_release_and_expiry(lease: HeavyLease) -> None:
    fences: list[int] = []
    for _ in range(5):
        tok = token()
        grant = lease.acquire(LANE, tok, LONG_TTL, time.time())
        assert grant.granted
        fences.append(grant.fence)
        assert lease.release(tok)
    # Twice across expiry rather than release.
    for _ in range(2):
        grant = lease.acquire(LANE, token(), SHORT_TTL, time.time())
        assert grant.granted
        fences.append(grant.fence)
        assert wait_until(lambda: lease.read() is None, 5.0)
    grant = lease.acquire(LANE, token(), LONG_TTL, time.time())
    assert grant.granted
    fences.append(grant.fence)

    assert all(a < b for a, b in itertools.pairwise(fences)), fences
    assert fences[0] >= 1
    assert lease.current_fence() == fences[-1]
    view = lease.read()
    assert view is not None
    assert view.fence == fences[-1]


def test_refused_acquisitions_do_not_bump_the_fence(lease: HeavyLease) -> None:
    holder = token()
    grant = lease.acquire(LANE, holder, LONG_TTL, time.time())
    for _ in range(5):
        assert not lease.acquire("dream", token(), LONG_TTL, time.time()).granted
    assert lease.current_fence() == grant.fence
    assert lease.release(holder)
    assert lease.acquire("dream", token(), LONG_TTL, time.time()).fence > grant.fence


# -- TTL ---------------------------------------------------------------------------------------


def test_unrenewed_lease_frees_itself_after_its_ttl(lease: HeavyLease, client: redis.Redis,
                                                    keys: Keys) -> None:
    t0 = time.monotonic()
    assert lease.acquire(LANE, token(), SHORT_TTL, time.time()).granted
    assert 0 < client.pttl(keys.lease) <= SHORT_TTL * 1000
    assert lease.read() is not None
    assert wait_until(lambda: lease.read() is None, 5.0), "the lease never expired"
    elapsed = time.monotonic() - t0
    assert elapsed >= SHORT_TTL * 0.8, f"freed after {elapsed:.3f}s, before its TTL"
    # And somebody else can take it.
    assert lease.acquire("dream", token(), LONG_TTL, time.time()).granted


def test_renew_keeps_the_lease_alive_past_its_ttl(lease: HeavyLease) -> None:
    owner = token()
    assert lease.acquire(LANE, owner, SHORT_TTL, time.time()).granted
    assert lease.start(owner, SHORT_TTL, time.time())[0]
    t0 = time.monotonic()
    while time.monotonic() - t0 < 4 * SHORT_TTL:
        assert lease.renew(owner, SHORT_TTL, time.time(), 3600) == (True, "")
        view = lease.read()
        assert view is not None and view.token == owner
        time.sleep(SHORT_TTL / 4)
    # Held well past its TTL; once renewal stops it lapses on its own.
    view = lease.read()
    assert view is not None and view.token == owner
    assert wait_until(lambda: lease.read() is None, 5.0)
    assert lease.renew(owner, SHORT_TTL, time.time(), 3600) == (False, "lost")


# -- start -----------------------------------------------------------------------------------


def test_start_succeeds_once_per_token(lease: HeavyLease) -> None:
    owner = token()
    grant = lease.acquire(LANE, owner, LONG_TTL, 1000.0)
    assert lease.start(owner, LONG_TTL, 1005.5) == (True, grant.fence)
    view = lease.read()
    assert view is not None
    assert view.started_at == pytest.approx(1005.5)
    assert view.granted_at == pytest.approx(1000.0)
    assert view.fence == grant.fence
    assert lease.start(owner, LONG_TTL, 1010.0) == (False, "already-started")
    # The refused second start did not move started_at.
    view = lease.read()
    assert view is not None
    assert view.started_at == pytest.approx(1005.5)


def test_start_refuses_an_expired_token(lease: HeavyLease) -> None:
    owner = token()
    assert lease.acquire(LANE, owner, SHORT_TTL, time.time()).granted
    assert wait_until(lambda: lease.read() is None, 5.0)
    assert lease.start(owner, LONG_TTL, time.time()) == (False, "gone")
    # The refusal did not resurrect the lease.
    assert lease.read() is None


def test_start_refuses_a_token_superseded_after_release(lease: HeavyLease) -> None:
    old, new = token(), token()
    assert lease.acquire(LANE, old, LONG_TTL, time.time()).granted
    assert lease.release(old)
    assert lease.acquire("dream", new, LONG_TTL, time.time()).granted
    assert lease.start(old, LONG_TTL, time.time()) == (False, "taken")
    view = lease.read()
    assert view is not None
    assert view.token == new
    assert view.started_at is None


def test_start_refuses_a_token_superseded_after_expiry(lease: HeavyLease) -> None:
    old, new = token(), token()
    assert lease.acquire(LANE, old, SHORT_TTL, time.time()).granted
    assert wait_until(lambda: lease.read() is None, 5.0)
    assert lease.acquire("dream", new, LONG_TTL, time.time()).granted
    assert lease.start(old, LONG_TTL, time.time()) == (False, "taken")
    assert lease.renew(old, LONG_TTL, time.time(), 3600) == (False, "lost")
    assert lease.release(old) is False
    view = lease.read()
    assert view is not None
    assert view.token == new


# -- maximum hold ------------------------------------------------------------------------------


def test_renew_refuses_past_max_hold(lease: HeavyLease, client: redis.Redis, keys: Keys) -> None:
    owner = token()
    max_hold = 60.0
    assert lease.acquire(LANE, owner, LONG_TTL, 1000.0).granted
    assert lease.start(owner, LONG_TTL, 1100.0)[0]
    # Measured from started_at, not granted_at: 1100 + 59 is still inside the hold.
    assert lease.renew(owner, LONG_TTL, 1100.0 + max_hold - 1, max_hold) == (True, "")
    assert lease.renew(owner, LONG_TTL, 1100.0 + max_hold, max_hold) == (False, "max-hold")
    assert lease.renew(owner, LONG_TTL, 1_000_000.0, max_hold) == (False, "max-hold")
    # Refusing renewal does not drop the lease at once: it lapses at its TTL.
    view = lease.read()
    assert view is not None and view.token == owner
    assert client.pttl(keys.lease) > 0


def test_renew_before_start_measures_max_hold_from_grant(lease: HeavyLease) -> None:
    owner = token()
    assert lease.acquire(LANE, owner, LONG_TTL, 1000.0).granted
    assert lease.renew(owner, LONG_TTL, 1010.0, 60.0) == (True, "")
    assert lease.renew(owner, LONG_TTL, 5000.0, 60.0) == (False, "max-hold")


def test_a_lease_refused_at_max_hold_lapses_at_its_ttl(lease: HeavyLease) -> None:
    owner = token()
    assert lease.acquire(LANE, owner, SHORT_TTL, 1000.0).granted
    assert lease.start(owner, SHORT_TTL, 1000.0)[0]
    assert lease.renew(owner, SHORT_TTL, 9999.0, 60.0) == (False, "max-hold")
    assert wait_until(lambda: lease.read() is None, 5.0)


# -- beat guard --------------------------------------------------------------------------------


def test_acquire_with_beat_token_requires_the_active_beat(
    lease: HeavyLease, client: redis.Redis, keys: Keys
) -> None:
    beat = token()
    # No beat holds the lock: refused, nothing written, fence untouched.
    grant = lease.acquire(LANE, token(), LONG_TTL, time.time(), beat_token=beat)
    assert not grant.granted
    assert grant.not_active_beat
    assert lease.read() is None
    assert lease.current_fence() == 0

    # Another beat holds it: still refused.
    other = token()
    store = LaneStore(client, keys)
    assert store.snapshot(other, LONG_TTL).lock.held
    grant = lease.acquire(LANE, token(), LONG_TTL, time.time(), beat_token=beat)
    assert grant.not_active_beat and not grant.granted
    assert lease.read() is None
    assert lease.current_fence() == 0

    # Our beat takes the lock (through the beat_lock script): granted.
    assert store.unlock(other)
    snap = store.snapshot(beat, LONG_TTL)
    assert snap.lock.held and snap.lock.event == "acquired"
    tok = token()
    grant = lease.acquire(LANE, tok, LONG_TTL, time.time(), beat_token=beat)
    assert grant.granted and not grant.not_active_beat
    view = lease.read()
    assert view is not None and view.token == tok


def test_acquire_with_beat_token_set_directly_on_the_lock_key(
    lease: HeavyLease, client: redis.Redis, keys: Keys
) -> None:
    beat = token()
    client.set(keys.beat_lock, beat, px=int(LONG_TTL * 1000))
    assert lease.acquire(LANE, token(), LONG_TTL, time.time(), beat_token=beat).granted
    # Once the lock is lost, the same beat is refused again (after a release).
    client.delete(keys.beat_lock)
    view = lease.read()
    assert view is not None
    assert lease.release(view.token)
    grant = lease.acquire(LANE, token(), LONG_TTL, time.time(), beat_token=beat)
    assert grant.not_active_beat


def test_beat_guard_is_checked_before_the_holder(lease: HeavyLease) -> None:
    """A beat that lost its lock is told so, even when the lease is also held."""
    assert lease.acquire(LANE, token(), LONG_TTL, time.time()).granted
    grant = lease.acquire("dream", token(), LONG_TTL, time.time(), beat_token=token())
    assert grant.not_active_beat
    assert not grant.granted


# -- malformed lease value --------------------------------------------------------------------

GARBAGE_LEASES = [
    pytest.param("garbage", id="not-json"),
    pytest.param("[1, 2, 3]", id="json-array"),
    pytest.param('"a string"', id="json-string"),
    pytest.param('{"v": 99, "lane": "x", "token": "t", "fence": 1, "granted_at": 0}',
                 id="future-version"),
    pytest.param('{"v": 1, "lane": "x", "token": 5, "fence": 1, "granted_at": 0}',
                 id="wrong-type"),
    pytest.param('{"v": 1, "lane": "x", "token": "t", "fence": 1, "granted_at": 0, "x": 1}',
                 id="unknown-field"),
    pytest.param('{"v": 1, "lane": "x"}', id="missing-fields"),
]


@pytest.mark.parametrize("garbage", GARBAGE_LEASES)
def test_malformed_lease_is_reported_and_never_overwritten(
    lease: HeavyLease, client: redis.Redis, keys: Keys, garbage: str
) -> None:
    client.set(keys.lease, garbage)
    with pytest.raises(StateError) as info:
        lease.read()
    assert info.value.key == keys.lease
    assert keys.lease in str(info.value)

    grant = lease.acquire(LANE, token(), LONG_TTL, time.time())
    assert not grant.granted
    assert not grant.not_active_beat
    assert grant.holder in ("?", "x")
    # A caller without its token cannot start, renew or release over it either.
    other = token()
    assert lease.start(other, LONG_TTL, time.time())[0] is False
    assert lease.renew(other, LONG_TTL, time.time(), 3600)[0] is False
    assert lease.release(other) is False

    assert client.get(keys.lease) == garbage
    assert client.ttl(keys.lease) == -1  # not even given a TTL
    assert lease.current_fence() == 0


def test_malformed_lease_with_ttl_keeps_its_ttl(lease: HeavyLease, client: redis.Redis,
                                                keys: Keys) -> None:
    client.set(keys.lease, "garbage", px=int(LONG_TTL * 1000))
    pttl = client.pttl(keys.lease)
    assert not lease.acquire(LANE, token(), LONG_TTL, time.time()).granted
    assert client.get(keys.lease) == "garbage"
    assert 0 < client.pttl(keys.lease) <= pttl


def test_fences_keep_increasing_after_redis_lost_everything(redis_client, key_prefix) -> None:
    """Redis here keeps nothing on disk: after a restart the fence counter is gone. Fences are
    seeded from the clock, so a holder from before the loss is still outranked after it."""
    from schedproj.store.connection import connect
    from schedproj.store.lease import HeavyLease
    from schedproj.store.protocol import Keys

    keys = Keys(key_prefix)
    lease = HeavyLease(connect(REDIS_URL), keys)
    before = lease.acquire("summary", "old-token", 30, time.time())
    assert before.granted
    time.sleep(0.01)  # a restart takes longer than the millisecond fences count in
    redis_client.delete(*redis_client.keys(f"{key_prefix}:*"))  # the restart
    refused = lease.acquire("dream", "new-token", 30, time.time() + 0.01)
    assert not refused.granted and refused.quarantine_s == -1.0, "granted with no epoch"
    # (Beat starts the quarantine; here the test declares the state new to skip it.)
    assert LaneStore(redis_client, keys).declare_fresh()
    after = lease.acquire("dream", "new-token", 30, time.time() + 0.01)
    assert after.granted and after.fence > before.fence


def test_a_rolled_back_fence_counter_never_hands_out_a_used_fence(
        lease: HeavyLease, client: redis.Redis, keys: Keys) -> None:
    """A failover to a replica that lacks the last grants (or a restart from an old snapshot)
    brings back an older counter; the next grant must still outrank every fence used before."""
    first = lease.acquire(LANE, token(), LONG_TTL, time.time())
    client.delete(keys.lease)
    client.set(keys.lease_fence, first.fence - 5)  # the replica's counter, five grants behind
    time.sleep(0.005)  # a failover takes seconds; the server's clock has moved on meanwhile
    second = lease.acquire("dream", token(), LONG_TTL, time.time())
    assert second.granted and second.fence > first.fence


# -- the start that marks the run record (issue 23: 3) ----------------------------------------


def _mark(keys: Keys, expected: str | None, record: str, fence: int, *,
          journal: bool = True) -> Any:
    from schedproj.store.lease import RunMark
    from schedproj.store.protocol import run_field
    return RunMark(lanes=keys.lanes, changed=keys.changed, field=run_field(LANE),
                   expected=expected, record=record, lane=LANE, fence=fence,
                   journal=keys.journal if journal else "",
                   entry='{"ev":"start"}' if journal else "", journal_len=5)


def _start_marked(lease: HeavyLease, owner: str, mark: Any, *, lane: str = LANE) -> Any:
    from schedproj.store.lease import NO_HOLDER
    return lease.start_marked(owner, LONG_TTL, time.time(), beat_fence=_beat_fence(lease),
                              holder=NO_HOLDER, lane=lane, task_id="", mark=mark)


def _beat_fence(lease: HeavyLease) -> int:
    lease.client.set(lease.keys.beat_fence, "7")
    return 7


def test_start_marks_the_record_it_expected_and_journals_in_the_same_call(
        lease: HeavyLease, client: redis.Redis, keys: Keys) -> None:
    from schedproj.store.protocol import run_field
    client.hset(keys.lanes, run_field(LANE), "old")
    owner = token()
    grant = lease.acquire(LANE, owner, LONG_TTL, time.time())
    reply = _start_marked(lease, owner, _mark(keys, "old", "new", grant.fence))
    assert (reply.ok, reply.value, reply.marked, reply.journaled) == (True, grant.fence, True,
                                                                      True)
    assert client.hget(keys.lanes, run_field(LANE)) == "new"
    assert client.sismember(keys.changed, LANE)
    assert client.lrange(keys.journal, 0, -1) == ['{"ev":"start"}']


@pytest.mark.parametrize("case", ["other-record", "absent", "read-only", "other-fence"])
def test_start_leaves_a_record_it_did_not_expect_and_returns_it(
        lease: HeavyLease, client: redis.Redis, keys: Keys, case: str) -> None:
    """The lease starts all the same; the caller's own compare and set works on what came
    back, and journals then (nothing journaled here)."""
    from schedproj.store.protocol import run_field
    if case != "absent":
        client.hset(keys.lanes, run_field(LANE), "stored")
    owner = token()
    grant = lease.acquire(LANE, owner, LONG_TTL, time.time())
    expected, record, fence = {
        "other-record": ("old", "new", grant.fence), "absent": ("old", "new", grant.fence),
        "read-only": ("stored", "", grant.fence),
        "other-fence": ("stored", "new", grant.fence - 1)}[case]
    reply = _start_marked(lease, owner, _mark(keys, expected, record, fence))
    assert (reply.ok, reply.value, reply.marked, reply.journaled) == (True, grant.fence, False,
                                                                      False)
    assert reply.stored == (None if case == "absent" else "stored")
    assert client.hget(keys.lanes, run_field(LANE)) == (None if case == "absent" else "stored")
    assert not client.exists(keys.journal) and not client.exists(keys.changed)
    view = lease.read()
    assert view is not None and view.started_at is not None


def test_a_refused_start_writes_no_record(lease: HeavyLease, client: redis.Redis,
                                          keys: Keys) -> None:
    from schedproj.store.protocol import run_field
    client.hset(keys.lanes, run_field(LANE), "old")
    owner = token()
    grant = lease.acquire(LANE, owner, LONG_TTL, time.time())
    reply = _start_marked(lease, token(), _mark(keys, "old", "new", grant.fence))
    assert (reply.ok, reply.value, reply.marked) == (False, "taken", False)
    reply = _start_marked(lease, owner, _mark(keys, "old", "new", grant.fence), lane="other")
    assert (reply.ok, reply.value, reply.marked) == (False, "wrong-lane", False)
    assert client.hget(keys.lanes, run_field(LANE)) == "old"
    assert not client.exists(keys.journal) and not client.exists(keys.changed)


def test_a_journal_of_the_wrong_type_does_not_stop_the_start(
        lease: HeavyLease, client: redis.Redis, keys: Keys) -> None:
    from schedproj.store.protocol import run_field
    client.hset(keys.lanes, run_field(LANE), "old")
    client.set(keys.journal, "garbage")
    owner = token()
    grant = lease.acquire(LANE, owner, LONG_TTL, time.time())
    reply = _start_marked(lease, owner, _mark(keys, "old", "new", grant.fence))
    assert (reply.ok, reply.marked, reply.journaled) == (True, True, False)
    assert client.hget(keys.lanes, run_field(LANE)) == "new"


def test_a_lanes_hash_of_the_wrong_type_reads_as_changed(
        lease: HeavyLease, client: redis.Redis, keys: Keys) -> None:
    client.set(keys.lanes, "garbage")
    owner = token()
    grant = lease.acquire(LANE, owner, LONG_TTL, time.time())
    reply = _start_marked(lease, owner, _mark(keys, None, "new", grant.fence))
    assert (reply.ok, reply.marked, reply.stored) == (True, False, None)
    assert client.get(keys.lanes) == "garbage"


# -- the grant and the dispatch's record in one call (issue 23: 3) ----------------------------


def _write(client: redis.Redis, keys: Keys, beat: str) -> tuple[list[str], list[str]]:
    from schedproj.core.records import SchedRecord
    store = LaneStore(client, keys)
    return store.sched_write(beat, {LANE: SchedRecord(inflight_task_id="task-1")},
                             {LANE: 123.0})


def _beat(client: redis.Redis, keys: Keys) -> str:
    beat = token()
    assert LaneStore(client, keys).snapshot(beat, LONG_TTL).lock.held
    return beat


def test_the_grant_and_its_record_are_written_together(lease: HeavyLease, client: redis.Redis,
                                                         keys: Keys) -> None:
    from schedproj.store.protocol import sched_field
    beat = _beat(client, keys)
    grant, written = lease.acquire_and_write(LANE, token(), LONG_TTL, time.time(),
                                             task_id="task-1", beat_token=beat,
                                             write=_write(client, keys, beat))
    assert grant.granted and written == 1
    assert "task-1" in client.hget(keys.lanes, sched_field(LANE))
    view = lease.read()
    assert view is not None and view.fence == grant.fence and view.task_id == "task-1"


def test_a_refused_grant_records_nothing(lease: HeavyLease, client: redis.Redis,
                                         keys: Keys) -> None:
    from schedproj.store.protocol import sched_field
    beat = _beat(client, keys)
    held = lease.acquire("other", token(), LONG_TTL, time.time(), beat_token=beat)
    assert held.granted
    grant, written = lease.acquire_and_write(LANE, token(), LONG_TTL, time.time(),
                                             task_id="task-1", beat_token=beat,
                                             write=_write(client, keys, beat))
    assert (grant.granted, grant.holder, written) == (False, "other", -2)
    assert client.hget(keys.lanes, sched_field(LANE)) is None
    # Not the active beat: neither granted nor written.
    client.delete(keys.lease)
    grant, written = lease.acquire_and_write(LANE, token(), LONG_TTL, time.time(),
                                             task_id="task-1", beat_token="not-the-beat",
                                             write=_write(client, keys, "not-the-beat"))
    assert grant.not_active_beat and written == -2
    assert client.hget(keys.lanes, sched_field(LANE)) is None and lease.read() is None


def test_a_garbage_fence_counter_is_refused_with_its_key_named(
        lease: HeavyLease, client: redis.Redis, keys: Keys) -> None:
    beat = _beat(client, keys)
    client.set(keys.lease_fence, "garbage")
    with pytest.raises(redis.ResponseError, match=keys.lease_fence):
        lease.acquire_and_write(LANE, token(), LONG_TTL, time.time(), task_id="task-1",
                                beat_token=beat, write=_write(client, keys, beat))
    assert lease.read() is None
