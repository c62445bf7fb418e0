"""A tick that outlasts the beat lock TTL keeps the lock: tens of thousands of family members
added at once are all read and planned by beat's next tick (one tick, every lane), which ran
past the TTL - the lock lapsed in it, the guarded writes after planning were refused
(BeatLockLost), and the next tick took the lock afresh and read and planned every lane again,
never finishing; with a standby beat the two took turns at it. Beat now renews the lock at
each step of a tick that began more than a third of the TTL after the last renewal
(``FairScheduler._keep_lock``; the read's pages renew it too).

In-process beats, real Redis; the 1,000,000-member case (bench/million.py, 66.6 s for that
tick) is scaled down with the TTL: a 1.2 s TTL, and two of the tick's steps (focus, planning)
each made to take 0.7 s, as they do with about 40,000 members here - slowed on purpose rather
than by members, so that each step stays under the TTL however loaded the machine is (with
40,000 real members a loaded CI machine made one step outlast it) while the tick outlasts it.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis
from celery import Celery

import schedproj.on_celery.beat as beat_module
from schedproj import Lane, LaneKind, LaneTask
from schedproj.core import defaults
from schedproj.core.families import LaneFamily, member_lane
from schedproj.core.records import Outcome, RunRecord, SchedRecord, decode, encode
from schedproj.on_celery import lock_keeper
from schedproj.on_celery.beat import FairScheduler
from schedproj.store.families import FamilyStore
from schedproj.store.protocol import STAMP_MEMBER, Keys, run_field, sched_field
from tests.conftest import make_app
from tests.on_celery.test_state_loss_mid_read import lose_everything

pytestmark = pytest.mark.timeout(120)

FAMILY = "p.sync"
CADENCE_S = 3600.0
MEMBERS = 3_000
#: How long each of the two slowed steps takes: under the TTL, together over it.
STEP_S = 0.7
LOCK_TTL_S = 1.2
#: Rounds (a tick of each beat) to converge: the first does it when the lock is kept.
ROUNDS = 3


def declare(app: Celery) -> None:
    @app.task(shared=False, base=LaneTask, name=FAMILY,
              lane=LaneFamily(cadence_s=CADENCE_S, kind=LaneKind.HEAVY))
    def sync(key: str) -> None: ...


def converged(client: redis.Redis, keys: Keys, lanes: list[str]) -> bool:
    """Every member planned (its next look written over the 0 it was added with) and the
    changed set drained (its stamp members aside)."""
    scores = client.zmscore(keys.due, lanes)
    changed = [m for m in client.smembers(keys.changed) if not m.startswith(STAMP_MEMBER)]
    return (all(s is not None and s > 0 for s in scores) and not changed
            and not client.exists(keys.changed_reading))


def add_due_members(client: redis.Redis, keys: Keys) -> tuple[list[str], list[str]]:
    """MEMBERS members of FAMILY added at once, every one due; the last added the stalest
    (the one the heavy lease goes to). Their keys and lane names."""
    members = [f"m{i:06d}" for i in range(MEMBERS)]
    lanes = [member_lane(FAMILY, m) for m in members]
    FamilyStore(client, keys, [FAMILY]).add(FAMILY, members)
    now = time.time()
    client.hset(keys.lanes, mapping={
        run_field(lane): encode(RunRecord(
            last_run_at=now - CADENCE_S * (10.0 if i == MEMBERS - 1 else 1.5 + (i % 10) / 10),
            last_outcome=Outcome.COMPLETED, runs=1))
        for i, lane in enumerate(lanes)})
    return members, lanes


@pytest.mark.parametrize("standby", [False, True])
def test_a_tick_longer_than_the_lock_ttl_plans_every_member_added_at_once(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis,
        standby: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``standby``: a second beat ticks after each tick of the active one, as a deployment's
    standby polls the lock: it must stand by throughout, not take a lapsed lock."""
    real_plan, real_focus = beat_module.plan_tick, FairScheduler._focus

    def slow_plan(*args: Any, **kwargs: Any) -> Any:
        time.sleep(STEP_S)
        return real_plan(*args, **kwargs)

    def slow_focus(self: FairScheduler, *args: Any, **kwargs: Any) -> Any:
        time.sleep(STEP_S)
        return real_focus(self, *args, **kwargs)

    keys = Keys(key_prefix)
    app = make_app(key_prefix, declare, beat_max_loop_interval_s=LOCK_TTL_S / 3,
                   beat_lock_ttl_s=LOCK_TTL_S, start_deadline_s=60.0)
    beats = [FairScheduler(app=app) for _ in range(2 if standby else 1)]
    for beat in beats:
        beat.tick()  # the first takes the lock, the second stands by
    active = beats[0]
    assert active.active and not any(b.active for b in beats[1:])
    members, lanes = add_due_members(redis_client, keys)
    monkeypatch.setattr(beat_module, "plan_tick", slow_plan)
    monkeypatch.setattr(FairScheduler, "_focus", slow_focus)
    took: list[float] = []
    rounds = 0
    while rounds < ROUNDS and not converged(redis_client, keys, lanes):
        rounds += 1
        for beat in beats:
            started = time.monotonic()
            beat.tick()
            took.append(time.monotonic() - started)
    # The case at hand: the tick that reads and plans them all outlasts the lock's TTL.
    assert took[0] > LOCK_TTL_S, took
    assert converged(redis_client, keys, lanes), f"not converged in {rounds} rounds: {took}"
    assert rounds == 1, took
    assert active.active and not any(b.active for b in beats[1:])
    assert redis_client.get(keys.beat_lock) == active.token
    heavy = [json.loads(m) for m in broker.lrange("heavy", 0, -1)]
    assert [m["headers"]["argsrepr"] for m in heavy] == [f"['{members[-1]}']"]
    for beat in beats:
        beat.close()


DREAM = "p.dream"


def declare_dream(app: Celery) -> None:
    @app.task(shared=False, base=LaneTask, name=DREAM, lane=Lane(cadence_s=CADENCE_S))
    def dream() -> None: ...


def dream_beat(key_prefix: str, redis_client: redis.Redis,
               declare_lanes: Any = None, **settings: Any) -> tuple[FairScheduler, float]:
    """A beat (lock TTL LOCK_TTL_S unless ``settings`` say otherwise) that has ticked twice
    remembering DREAM's record (ran 10 s ago, 7 runs), and when that run was."""
    keys = Keys(key_prefix)
    app = make_app(key_prefix, declare_lanes or declare_dream, start_deadline_s=60.0,
                   **(settings or {"beat_max_loop_interval_s": LOCK_TTL_S / 3,
                                   "beat_lock_ttl_s": LOCK_TTL_S}))
    ran_at = time.time() - 10
    redis_client.hset(keys.lanes, run_field(DREAM), encode(RunRecord(
        last_run_at=ran_at, last_outcome=Outcome.COMPLETED, runs=7)))
    sched = FairScheduler(app=app)
    sched.tick()
    sched.tick()  # a normal tick: beat remembers DREAM's record
    return sched, ran_at


def assert_put_back(sched: FairScheduler, client: redis.Redis, ran_at: float) -> None:
    """DREAM's record is back as ``dream_beat`` wrote it, and ``sched`` holds the lock."""
    keys = Keys(sched.settings.key_prefix)
    raw = client.hget(keys.lanes, run_field(DREAM))
    assert raw is not None, f"{DREAM}'s run record (ran 10 s ago) was not put back"
    back = sched.rt.store.read_run(DREAM)
    assert back.runs == 7 and back.last_run_at == pytest.approx(ran_at), back
    assert sched.active and client.get(keys.beat_lock) == sched.token
    sched.close()


def test_a_state_loss_while_a_long_tick_plans_still_puts_back_what_beat_remembers(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis loses everything while a tick plans, past a third of the lock TTL: the renewal
    before the dispatch's writes finds the lock vanished. Beat keeps what it remembers and
    stays the active beat, as for a lock vanished between pages (9f78fc4), and its next tick
    puts DREAM's record back. The renewal went through beat_lock.lua, which took the vacant
    lock and gave it back, and beat stood by with its memory reset: its next tick took the
    lock as a beat that was not active and put back nothing (DREAM read as never run)."""
    sched, ran_at = dream_beat(key_prefix, redis_client)
    assert sched.active and broker.llen("heavy") == 0
    sched.rt.store.touch([DREAM])  # the next tick plans it
    real_plan = beat_module.plan_tick
    lost: list[bool] = []

    def slow_plan(*args: Any, **kwargs: Any) -> Any:
        if not lost:
            lost.append(True)
            lose_everything(redis_client, key_prefix)
            time.sleep(LOCK_TTL_S / 3 + 0.1)  # a long plan: the dispatch renews first
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(beat_module, "plan_tick", slow_plan)
    sched.tick()
    assert lost
    sched.tick()
    assert_put_back(sched, redis_client, ran_at)


def slowed_once(monkeypatch: pytest.MonkeyPatch, seconds: float,
                meanwhile: Any = None) -> list[bool]:
    """Planning's next call takes ``seconds`` more (one step of the tick), then calls
    ``meanwhile`` (a standby's tick, while the active beat's tick is still in that step)."""
    real_plan = beat_module.plan_tick
    slowed: list[bool] = []

    def slow_plan(*args: Any, **kwargs: Any) -> Any:
        if not slowed:
            slowed.append(True)
            time.sleep(seconds)
            if meanwhile is not None:
                meanwhile()
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(beat_module, "plan_tick", slow_plan)
    return slowed


@pytest.mark.parametrize("standby", [False, True])
def test_one_step_longer_than_the_lock_ttl_keeps_the_lock_the_tick_earned(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis,
        standby: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """One step of the tick - planning, here - outlasts the lock TTL (as decoding, planning or
    recording a million members added at once does at the default 15 s). Renewals between
    steps cannot help: the lock lapsed inside the step and the tick started over, forever.
    The lock keeper renews it from its thread, within what the tick earned by the lanes it
    read (scaled here: 2 ms a lane, 3,000 members: 6 s), and the standby, ticking in the
    middle of that step, stands by."""
    monkeypatch.setattr(lock_keeper, "PER_LANE_S", 2e-3)
    keys = Keys(key_prefix)
    app = make_app(key_prefix, declare, beat_max_loop_interval_s=LOCK_TTL_S / 3,
                   beat_lock_ttl_s=LOCK_TTL_S, start_deadline_s=60.0)
    active, other = FairScheduler(app=app), FairScheduler(app=app)
    active.tick()
    members, lanes = add_due_members(redis_client, keys)
    slowed = slowed_once(monkeypatch, 2.5 * LOCK_TTL_S, other.tick if standby else None)
    active.tick()
    assert slowed and converged(redis_client, keys, lanes)
    assert active.active and not other.active
    assert active.keeper.renewals >= 3, active.keeper.renewals
    assert redis_client.get(keys.beat_lock) == active.token
    heavy = [json.loads(m) for m in broker.lrange("heavy", 0, -1)]
    assert [m["headers"]["argsrepr"] for m in heavy] == [f"['{members[-1]}']"]
    made = active.keeper.renewals
    active.tick()  # nothing left to do: the next tick keeps nothing
    time.sleep(LOCK_TTL_S / 2)
    assert active.keeper.renewals == made
    for beat in (active, other):
        beat.close()


def test_a_tick_hung_past_what_it_earned_lets_the_lock_go(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A tick that read one lane and then hangs (a step stuck for 3 TTLs: a user's hook, a
    broker that does not answer) earned nothing to keep: the lock lapses a TTL after its last
    renewal as it always did, a standby takes it over, and the hung tick, once back, records
    and sends nothing (its guarded writes are refused) and stands by."""
    keys = Keys(key_prefix)
    app = make_app(key_prefix, declare_dream, beat_max_loop_interval_s=LOCK_TTL_S / 3,
                   beat_lock_ttl_s=LOCK_TTL_S, start_deadline_s=60.0)
    hung, other = FairScheduler(app=app), FairScheduler(app=app)
    hung.tick()
    other.tick()
    assert hung.active and not other.active
    hung.rt.store.touch([DREAM])  # never ran: due, the next tick plans it
    slowed = slowed_once(monkeypatch, 3 * LOCK_TTL_S, other.tick)
    hung.tick()
    assert slowed and hung.keeper.renewals == 0
    assert other.active and not hung.active
    assert redis_client.get(keys.beat_lock) == other.token
    # The standby, once active, sent DREAM; the hung tick sent nothing after it.
    assert len(broker.lrange("heavy", 0, -1)) <= 1
    for beat in (hung, other):
        beat.close()


def paged_beat(key_prefix: str, redis_client: redis.Redis,
               ) -> tuple[FairScheduler, list[str], list[str]]:
    """A beat (the default lock TTL) with pages of 500, MEMBERS due members just added
    (``add_due_members``: their keys and lanes)."""
    app = make_app(key_prefix, declare, start_deadline_s=60.0)
    sched = FairScheduler(app=app)
    sched.tick()
    sched.rt.store.read_page = 500
    members, lanes = add_due_members(redis_client, Keys(key_prefix))
    return sched, members, lanes


def test_a_plan_over_many_lanes_is_recorded_by_pages_the_sends_last(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    """Every member's record and next look in one guarded call held Redis for 1.5 s at 200,000
    members (every worker's renewal waiting behind it); they go a page of lanes a call, and
    the lanes sent - the heavy winner here - in the last: a tick cut off between two calls
    leaves no in-flight mark of a message never sent."""
    keys = Keys(key_prefix)
    sched, members, lanes = paged_beat(key_prefix, redis_client)
    calls: list[list[str]] = []
    real_write = sched.rt.store.write_sched

    def write_sched(token: str, records: Any, looks: Any = None) -> bool:
        calls.append(sorted({*records, *(looks or {})}))
        return real_write(token, records, looks)

    sched.rt.store.write_sched = write_sched  # type: ignore[method-assign]
    sched.tick()
    assert converged(redis_client, keys, lanes)
    winner = member_lane(FAMILY, members[-1])
    assert len(calls) >= MEMBERS // 500 and max(len(c) for c in calls) <= 500
    assert calls[-1] == [winner], calls[-1]
    assert sum(len(c) for c in calls) == len({lane for c in calls for lane in c})
    sched.close()


def test_a_lock_lost_between_pages_sends_nothing_and_marks_nothing_in_flight(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    """Another beat takes the lock after the second page: the later pages are refused, the
    heavy lease granted for the winner is given back, no message leaves, and the winner's
    record holds no in-flight mark (it is in the last page)."""
    keys = Keys(key_prefix)
    sched, members, _ = paged_beat(key_prefix, redis_client)
    real_write = sched.rt.store.write_sched
    made: list[bool] = []

    def write_sched(token: str, records: Any, looks: Any = None) -> bool:
        if len(made) == 2:
            redis_client.set(keys.beat_lock, "another-beat", px=60_000)
        made.append(True)
        return real_write(token, records, looks)

    sched.rt.store.write_sched = write_sched  # type: ignore[method-assign]
    sched.tick()
    assert len(made) == 3 and not sched.active
    assert broker.llen("heavy") == 0
    assert not redis_client.exists(keys.lease)
    winner = member_lane(FAMILY, members[-1])
    raw = redis_client.hget(keys.lanes, sched_field(winner))
    assert raw is None or decode(SchedRecord, raw, winner).inflight_task_id is None, raw
    sched.close()


def test_a_tick_that_read_few_lanes_but_plans_many_keeps_the_lock_it_earned(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The due members wait in beat's memory after the first tick; when the heavy lease
    changes hands, the next tick plans every one of them again having read a few lanes. At a
    million members that planning took 17-19 s: the keeper, earning only by the lanes read,
    kept nothing and the lock vanished inside the step. A tick earns by the lanes it plans
    too."""
    monkeypatch.setattr(lock_keeper, "PER_LANE_S", 2e-3)
    keys = Keys(key_prefix)
    app = make_app(key_prefix, declare, beat_max_loop_interval_s=LOCK_TTL_S / 3,
                   beat_lock_ttl_s=LOCK_TTL_S, start_deadline_s=60.0)
    sched = FairScheduler(app=app)
    sched.tick()
    _, lanes = add_due_members(redis_client, keys)
    sched.tick()
    assert converged(redis_client, keys, lanes) and redis_client.exists(keys.lease)
    redis_client.delete(keys.lease)  # the lease changes hands: every waiter is planned again
    planned: list[int] = []
    real_plan = beat_module.plan_tick

    def slow_plan(specs: Any, *args: Any, **kwargs: Any) -> Any:
        planned.append(len(specs))
        time.sleep(2.5 * LOCK_TTL_S)
        return real_plan(specs, *args, **kwargs)

    monkeypatch.setattr(beat_module, "plan_tick", slow_plan)
    made = sched.keeper.renewals
    sched.tick()
    assert planned and planned[0] >= MEMBERS - 1, planned
    assert sched.active and redis_client.get(keys.beat_lock) == sched.token
    assert sched.keeper.renewals >= made + 3


def test_a_state_loss_inside_a_step_the_keeper_kept_still_puts_back_what_beat_remembers(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The keeper held the lock through one step 2.5 TTLs long, then Redis lost everything
    and the keeper found the lock vanished. Beat held the lock a moment before: its next tick
    takes it back and puts back DREAM's record. It judged whether it held the lock a moment
    ago by its last read alone (the tick's start, over a TTL before), so it put back nothing
    and DREAM read as never run."""
    monkeypatch.setattr(lock_keeper, "PER_LANE_S", 10.0)  # DREAM's read earns 10 s
    sched, ran_at = dream_beat(key_prefix, redis_client)
    sched.rt.store.touch([DREAM])  # read by the next tick: it earns, and plans DREAM

    def lose() -> None:
        lose_everything(redis_client, key_prefix)
        deadline = time.monotonic() + 2 * LOCK_TTL_S
        while sched.keeper.lost() is None and time.monotonic() < deadline:
            time.sleep(0.01)  # until the keeper's next renewal finds it vanished

    slowed = slowed_once(monkeypatch, 2.5 * LOCK_TTL_S, lose)
    sched.tick()
    assert slowed and sched.keeper.renewals >= 3 and sched.keeper.lost() == ""
    assert sched.active
    sched.tick()
    assert broker.llen("heavy") == 0
    assert_put_back(sched, redis_client, ran_at)


def test_a_state_loss_just_after_a_tick_the_keeper_kept_still_puts_back_run_records(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A tick 2.5 TTLs long, its lock kept throughout, ends; Redis then loses everything.
    Beat held the lock to the end of that tick, so its next tick puts back the run records
    (DREAM's estimated: planned and not due, beat no longer keeps it in memory). Judged by the
    long tick's read alone, beat counted as away for over a TTL and put back nothing."""
    monkeypatch.setattr(lock_keeper, "PER_LANE_S", 10.0)
    keys = Keys(key_prefix)
    sched, _ = dream_beat(key_prefix, redis_client)
    sched.rt.store.touch([DREAM])
    slowed = slowed_once(monkeypatch, 2.5 * LOCK_TTL_S)
    sched.tick()
    assert slowed and sched.keeper.renewals >= 3 and sched.active
    assert redis_client.get(keys.beat_lock) == sched.token
    lose_everything(redis_client, key_prefix)
    sched.tick()
    assert redis_client.hget(keys.lanes, run_field(DREAM)) is not None, (
        f"{DREAM}'s run record was not put back")
    assert sched.active and broker.llen("heavy") == 0
    sched.close()


def declare_both(app: Celery) -> None:
    declare(app)
    declare_dream(app)


def test_a_state_loss_between_pages_of_the_record_keeps_beat_the_one_that_puts_back(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    """Redis loses everything between two pages of a plan's record (a restart, a failover:
    the client reconnects to an empty server). The next page is refused for a lock no beat
    holds: a state loss, as the dispatch's renewal would have found it, not another beat's
    take-over. Beat keeps what it remembers and stays the beat that was active, so its next
    tick takes the lock back and puts DREAM's record back as read in that tick. It stood by
    with its memory reset, took the lock afresh as a new beat and put back nothing."""
    keys = Keys(key_prefix)
    sched, _ = dream_beat(key_prefix, redis_client, declare_both,  # the default lock TTL
                          beat_max_loop_interval_s=defaults.BEAT_MAX_LOOP_INTERVAL_S,
                          beat_lock_ttl_s=defaults.BEAT_LOCK_TTL_S)
    sched.rt.store.read_page = 500
    add_due_members(redis_client, keys)
    ran_at = time.time() - 5
    redis_client.hset(keys.lanes, run_field(DREAM), encode(RunRecord(
        last_run_at=ran_at, last_outcome=Outcome.COMPLETED, runs=8)))
    sched.rt.store.touch([DREAM])  # a run ended: read and planned (not due) in that tick
    real_write = sched.rt.store.write_sched
    made: list[bool] = []

    def write_sched(token: str, records: Any, looks: Any = None) -> bool:
        if len(made) == 2:
            lose_everything(redis_client, key_prefix)
        made.append(True)
        return real_write(token, records, looks)

    sched.rt.store.write_sched = write_sched  # type: ignore[method-assign]
    sched.tick()
    assert len(made) == 3 and broker.llen("heavy") == 0
    assert sched.active, "a lock vanished with Redis's state was taken for another beat's"
    sched.rt.store.write_sched = real_write  # type: ignore[method-assign]
    sched.tick()
    assert redis_client.hget(keys.lanes, run_field(DREAM)) is not None, (
        f"{DREAM}'s run record was not put back")
    # As read in that tick: the plan it was cut off recording had not yet replaced what beat
    # remembered (a lane planned not due was forgotten, its record only estimated).
    back = sched.rt.store.read_run(DREAM)
    assert back.runs == 8 and back.last_run_at == pytest.approx(ran_at), back
    assert sched.active and redis_client.get(keys.beat_lock) == sched.token
    sched.close()


def test_redis_restarting_inside_a_step_the_keeper_kept_still_puts_back_what_beat_remembers(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As above, but the main thread meets the restart itself (its call fails: cut off from
    Redis, it stands by until it is back). The keeper held the lock until just before: back,
    beat takes the lock and puts DREAM's record back; counted as away since the tick's read, it
    put back nothing."""
    monkeypatch.setattr(lock_keeper, "PER_LANE_S", 10.0)
    sched, ran_at = dream_beat(key_prefix, redis_client)
    sched.rt.store.touch([DREAM])
    real_renew = sched.rt.store.renew_held

    def unreachable(*args: Any, **kwargs: Any) -> str | None:
        raise redis.ConnectionError("Connection refused")

    def restart() -> None:
        sched.rt.store.renew_held = unreachable  # type: ignore[method-assign]
        lose_everything(redis_client, key_prefix)

    slowed = slowed_once(monkeypatch, 2.5 * LOCK_TTL_S, restart)
    sched.tick()  # the dispatch's renewal fails: cut off
    assert slowed and sched.keeper.renewals >= 3 and not sched.active
    sched.rt.store.renew_held = real_renew  # type: ignore[method-assign]
    sched.tick()
    assert_put_back(sched, redis_client, ran_at)


PING = "p.ping"
LIGHT_MEMBERS = 1_200


def declare_light(app: Celery) -> None:
    @app.task(shared=False, base=LaneTask, name=PING,
              lane=LaneFamily(cadence_s=CADENCE_S, kind=LaneKind.LIGHT))
    def ping(key: str) -> None: ...


def light_beat(key_prefix: str, redis_client: redis.Redis,
               ) -> tuple[FairScheduler, list[tuple[str, list[str]]]]:
    """A beat with LIGHT_MEMBERS light members just added (all due), pages of 500, and a log
    of its guarded record calls ("write", lanes) and the lanes it sent ("send", [lane])."""
    keys = Keys(key_prefix)
    app = make_app(key_prefix, declare_light, start_deadline_s=60.0)
    sched = FairScheduler(app=app)
    sched.tick()
    sched.rt.store.read_page = 500
    FamilyStore(redis_client, keys, [PING]).add(PING, [f"k{i:05d}" for i in range(LIGHT_MEMBERS)])
    events: list[tuple[str, list[str]]] = []
    real_write, real_send = sched.rt.store.write_sched, sched.engine.dispatcher.send

    def write_sched(token: str, records: Any, looks: Any = None) -> bool:
        events.append(("write", sorted({*records, *(looks or {})})))
        return real_write(token, records, looks)

    def send(lane: str, *args: Any) -> bool:
        events.append(("send", [lane]))
        return real_send(lane, *args)

    sched.rt.store.write_sched = write_sched  # type: ignore[method-assign]
    sched.engine.dispatcher.send = send  # type: ignore[method-assign]
    return sched, events


def in_flight(client: redis.Redis, keys: Keys) -> set[str]:
    """The members whose sched record holds an in-flight mark."""
    lanes = [member_lane(PING, f"k{i:05d}") for i in range(LIGHT_MEMBERS)]
    raws = client.hmget(keys.lanes, [sched_field(lane) for lane in lanes])
    return {lane for lane, raw in zip(lanes, raws, strict=True)
            if raw is not None and decode(SchedRecord, raw, lane).inflight_task_id}


def test_more_sends_than_a_page_are_recorded_and_sent_a_page_at_a_time(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    """Every light member due at once: their in-flight marks went in one call (0.66 s of
    Redis at 200,000). Each page's marks are written just before its messages leave."""
    sched, events = light_beat(key_prefix, redis_client)
    sched.tick()
    assert broker.llen("light") == LIGHT_MEMBERS
    assert max(len(lanes) for kind, lanes in events if kind == "write") <= 500
    written: set[str] = set()
    for kind, lanes in events:
        if kind == "write":
            written |= set(lanes)
        else:
            assert lanes[0] in written, f"{lanes[0]} sent before its mark was written"
    # Interleaved: a page's sends come before the next page's marks are written.
    writes_after_a_send = [i for i, (kind, _) in enumerate(events)
                           if kind == "write" and any(k == "send" for k, _ in events[:i])]
    assert len(writes_after_a_send) >= 2, [k for k, _ in events][:20]
    assert in_flight(redis_client, Keys(key_prefix)) == {
        lanes[0] for kind, lanes in events if kind == "send"}
    sched.close()


def test_a_lock_lost_between_pages_of_sends_leaves_a_mark_only_for_each_message_sent(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    """Another beat takes the lock once the first page of sends left: the next page's marks
    are refused, nothing more is sent, beat stands by, and every in-flight mark in Redis is
    that of a message that left."""
    keys = Keys(key_prefix)
    sched, events = light_beat(key_prefix, redis_client)
    real_write = sched.rt.store.write_sched

    def write_sched(token: str, records: Any, looks: Any = None) -> bool:
        if any(kind == "send" for kind, _ in events):
            redis_client.set(keys.beat_lock, "another-beat", px=60_000)
        return real_write(token, records, looks)

    sched.rt.store.write_sched = write_sched  # type: ignore[method-assign]
    sched.tick()
    sent = {lanes[0] for kind, lanes in events if kind == "send"}
    assert 0 < len(sent) < LIGHT_MEMBERS and not sched.active
    assert broker.llen("light") == len(sent)
    assert in_flight(redis_client, keys) == sent
    sched.close()
