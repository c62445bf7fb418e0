"""Redis loses its state (every key of the deployment gone: a restart without persistence,
a failover to an empty replica) between two pages of beat's paged tick read: beat still puts
back what it remembers.

In one call (tick.lua) the loss is seen as one: the beat still active re-takes the lock, sees
the epoch gone and puts back what it remembers (the run records: LossRecovery.put_back). Paged,
the next page found the beat lock gone and beat took it for a lock taken by another beat: it
reset its memory and stood by; on its next tick it took the lock as a beat that was not
active, so nothing was put back - every lane read as never run (each ran again at once after
the quarantine, promise 6 'restarting loses nothing and re-runs nothing early'). A page now
tells a vanished lock from a taken one, and beat keeps its memory through a vanished one."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from celery import Celery

from schedproj import Lane, LaneKind, LaneTask
from schedproj.core.families import LaneFamily, member_lane
from schedproj.core.lanes import DeferralReason, Gate, GateCondition
from schedproj.core.records import LeaseView, Outcome, RunRecord, encode
from schedproj.on_celery.beat import FairScheduler
from schedproj.store.families import FamilyStore
from schedproj.store.lane_store import LaneStore
from schedproj.store.protocol import Keys, run_field
from tests.conftest import make_app

pytestmark = pytest.mark.timeout(60)

HEAVY, LIGHT, FAMILY = "r.dream", "r.golden", "r.fam"
PAGE = 20
CADENCE_S = 3600.0


def declare(app: Celery) -> None:
    @app.task(shared=False, base=LaneTask, name=HEAVY, lane=Lane(cadence_s=CADENCE_S))
    def dream() -> None: ...

    @app.task(shared=False, base=LaneTask, name=LIGHT, lane=Lane(
        cadence_s=CADENCE_S, kind=LaneKind.LIGHT,
        gates=(Gate(HEAVY, GateCondition.DUE_OR_RUNNING, DeferralReason.DEPENDENCY),)))
    def golden() -> None: ...

    @app.task(shared=False, base=LaneTask, name=FAMILY,
              lane=LaneFamily(cadence_s=CADENCE_S, kind=LaneKind.LIGHT))
    def fam(key: str) -> None: ...


def lose_everything(client: redis.Redis, prefix: str) -> None:
    found = list(client.scan_iter(f"{prefix}:*"))
    if found:
        client.delete(*found)


@pytest.mark.parametrize(("page", "standby"), [(PAGE, False), (100_000, False), (PAGE, True)])
def test_a_state_loss_between_pages_still_puts_back_what_beat_remembers(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis, page: int,
        standby: bool) -> None:
    """``standby``: a second beat that saw this one hold the lock ticks first after the loss:
    it leaves the vacant lock to this one (the beat that was active), which puts back."""
    keys = Keys(key_prefix)
    app = make_app(key_prefix, declare, beat_max_loop_interval_s=0.2, beat_lock_ttl_s=5.0,
                   start_deadline_s=30.0)
    members = [f"m{i:04d}" for i in range(8 * PAGE)]
    FamilyStore(redis_client, keys, [FAMILY]).add(FAMILY, members)
    now = time.time()
    ran_at = now - 10
    redis_client.hset(keys.lanes, mapping={
        run_field(HEAVY): encode(RunRecord(last_run_at=ran_at, last_outcome=Outcome.COMPLETED,
                                           runs=7)),
        run_field(LIGHT): encode(RunRecord(last_run_at=ran_at, last_outcome=Outcome.COMPLETED,
                                           runs=7)),
        **{run_field(member_lane(FAMILY, m)): encode(RunRecord(
            last_run_at=ran_at, last_outcome=Outcome.COMPLETED, runs=1)) for m in members}})
    sched = FairScheduler(app=app)
    store: LaneStore = sched.rt.store
    store.read_page = page
    sched.tick()
    assert sched.active and broker.llen("heavy") == 0
    time.sleep(0.05)
    sched.tick()   # a normal tick: beat remembers HEAVY's record
    other = FairScheduler(app=make_app(key_prefix, declare, beat_max_loop_interval_s=0.2,
                                       beat_lock_ttl_s=5.0, start_deadline_s=30.0))
    if standby:
        other.tick()
        assert not other.active
    store.touch([member_lane(FAMILY, m) for m in members])   # the next read goes by pages
    real_page = store._tick_page
    lost: list[bool] = []

    def page_call(**kwargs: Any) -> Any:
        if not lost:
            lost.append(True)
            lose_everything(redis_client, key_prefix)
        return real_page(**kwargs)

    store._tick_page = page_call
    if page != PAGE:
        lose_everything(redis_client, key_prefix)
        lost.append(True)
    time.sleep(0.05)
    for _ in range(3):
        if standby:
            other.tick()
        sched.tick()
        time.sleep(0.05)
    assert lost and sched.active and not other.active
    raw = redis_client.hget(keys.lanes, run_field(HEAVY))
    assert raw is not None, (
        f"{HEAVY}'s run record (ran 10 s ago) was not put back after the loss: it reads as "
        "never run")
    back = store.read_run(HEAVY)   # what it remembers, or its estimate within a cadence
    assert back.last_run_at is not None and back.last_run_at > now - CADENCE_S, back
    sched.close()
    other.close()


def test_a_second_loss_during_the_take_over_read_still_puts_back_what_beat_remembers(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    """A failover loses HEAVY's last record; the active beat sees the loss, puts back what it
    remembers and reads every lane again (by pages: the longest read a beat makes) - and Redis
    loses everything during that read. The beat takes the lock back at its next tick and puts
    back what it remembered before the first loss, not an estimate: it had forgotten it when
    its memory was reset before the read. (HEAVY is due and waits for a lease another lane
    holds: beat remembers the due lanes.)"""
    keys = Keys(key_prefix)
    app = make_app(key_prefix, declare, beat_max_loop_interval_s=0.2, beat_lock_ttl_s=5.0,
                   start_deadline_s=30.0)
    members = [f"m{i:04d}" for i in range(8 * PAGE)]
    FamilyStore(redis_client, keys, [FAMILY]).add(FAMILY, members)
    ran_at = time.time() - 10 * CADENCE_S
    redis_client.set(keys.lease, encode(LeaseView(lane="r.other", token="other", fence=1,
                                                  granted_at=time.time())), px=60_000)
    redis_client.hset(keys.lanes, mapping={
        run_field(HEAVY): encode(RunRecord(last_run_at=ran_at, last_outcome=Outcome.COMPLETED,
                                           runs=7)),
        **{run_field(member_lane(FAMILY, m)): encode(RunRecord(
            last_run_at=time.time() - 10, last_outcome=Outcome.COMPLETED, runs=1))
           for m in members}})
    sched = FairScheduler(app=app)
    store: LaneStore = sched.rt.store
    store.read_page = PAGE
    sched.tick()
    time.sleep(0.05)
    sched.tick()   # beat remembers HEAVY's record
    assert sched.active and HEAVY in sched.memory.states
    real_reread, real_page = sched._reread_all, store._tick_page
    rereads: list[bool] = []
    lost: list[bool] = []

    def reread(snap: Any, now: float) -> Any:
        rereads.append(True)
        store.touch([member_lane(FAMILY, m) for m in members])  # its read goes by pages
        return real_reread(snap, now)

    def page_call(**kwargs: Any) -> Any:
        if rereads and not lost:
            lost.append(True)
            lose_everything(redis_client, key_prefix)
        return real_page(**kwargs)

    sched._reread_all, store._tick_page = reread, page_call  # type: ignore[method-assign]
    # A failover to a replica that lacks the last writes: the epoch record and HEAVY's record.
    redis_client.delete(keys.epoch)
    redis_client.hdel(keys.lanes, run_field(HEAVY))
    time.sleep(0.05)
    for _ in range(3):
        sched.tick()
        time.sleep(0.05)
    assert lost and len(rereads) >= 2 and sched.active
    back = store.read_run(HEAVY)
    assert (back.last_run_at, back.runs) == (pytest.approx(ran_at, abs=1e-3), 7), (
        f"{HEAVY}'s record after the second loss is not the one beat remembered: {back}")
    sched.close()
