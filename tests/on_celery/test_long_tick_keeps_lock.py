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
from schedproj.core.families import LaneFamily, member_lane
from schedproj.core.records import Outcome, RunRecord, encode
from schedproj.on_celery.beat import FairScheduler
from schedproj.store.families import FamilyStore
from schedproj.store.protocol import STAMP_MEMBER, Keys, run_field
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
    members = [f"m{i:06d}" for i in range(MEMBERS)]
    lanes = [member_lane(FAMILY, m) for m in members]
    FamilyStore(redis_client, keys, [FAMILY]).add(FAMILY, members)
    now = time.time()
    # Every member due; the last added the stalest (the one the heavy lease goes to).
    redis_client.hset(keys.lanes, mapping={
        run_field(lane): encode(RunRecord(
            last_run_at=now - CADENCE_S * (10.0 if i == MEMBERS - 1 else 1.5 + (i % 10) / 10),
            last_outcome=Outcome.COMPLETED, runs=1))
        for i, lane in enumerate(lanes)})
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


def test_a_state_loss_while_a_long_tick_plans_still_puts_back_what_beat_remembers(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis loses everything while a tick plans, past a third of the lock TTL: the renewal
    before the dispatch's writes finds the lock vanished. Beat keeps what it remembers and
    stays the active beat, as for a lock vanished between pages (9f78fc4), and its next tick
    puts DREAM's record back. The renewal went through beat_lock.lua, which took the vacant
    lock and gave it back, and beat stood by with its memory reset: its next tick took the
    lock as a beat that was not active and put back nothing (DREAM read as never run)."""
    keys = Keys(key_prefix)
    app = make_app(key_prefix, declare_dream, beat_max_loop_interval_s=LOCK_TTL_S / 3,
                   beat_lock_ttl_s=LOCK_TTL_S, start_deadline_s=60.0)
    ran_at = time.time() - 10
    redis_client.hset(keys.lanes, run_field(DREAM), encode(RunRecord(
        last_run_at=ran_at, last_outcome=Outcome.COMPLETED, runs=7)))
    sched = FairScheduler(app=app)
    sched.tick()
    sched.tick()  # a normal tick: beat remembers DREAM's record
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
    raw = redis_client.hget(keys.lanes, run_field(DREAM))
    assert raw is not None, f"{DREAM}'s run record (ran 10 s ago) was not put back"
    back = sched.rt.store.read_run(DREAM)
    assert back.runs == 7 and back.last_run_at == pytest.approx(ran_at), back
    assert sched.active and redis_client.get(keys.beat_lock) == sched.token
    sched.close()
