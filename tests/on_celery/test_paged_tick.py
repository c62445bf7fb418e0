"""Beat on a read by pages (``LaneStore.tick_snapshot`` past its page): the tick plans on the
whole read, never on part of it - the heavy lease goes to the stalest lane wherever its page.

In-process beat, real Redis; the store's page set small so a few hundred lanes page.
"""

from __future__ import annotations

import json
import time

import pytest
import redis
from celery import Celery

from schedproj import LaneKind, LaneTask
from schedproj.core.families import LaneFamily, member_lane
from schedproj.core.records import Outcome, RunRecord, encode
from schedproj.on_celery.beat import FairScheduler
from schedproj.store.families import FamilyStore
from schedproj.store.protocol import Keys, run_field
from tests.conftest import make_app

pytestmark = pytest.mark.timeout(60)

FAMILY = "p.sync"
PAGE = 20
CADENCE_S = 3600.0


def declare(app: Celery) -> None:
    @app.task(shared=False, base=LaneTask, name=FAMILY,
              lane=LaneFamily(cadence_s=CADENCE_S, kind=LaneKind.HEAVY))
    def sync(key: str) -> None: ...


@pytest.mark.parametrize("page", [PAGE, 100_000])
def test_the_first_tick_grants_the_lease_to_the_stalest_lane_in_whatever_page(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis, page: int) -> None:
    keys = Keys(key_prefix)
    app = make_app(key_prefix, declare, beat_max_loop_interval_s=0.2, beat_lock_ttl_s=5.0,
                   start_deadline_s=5.0)
    members = [f"m{i:04d}" for i in range(8 * PAGE)]
    FamilyStore(redis_client, keys, [FAMILY]).add(FAMILY, members)
    now = time.time()
    # Every member due (1.5 to 2.4 cadences since its run); the last in the index's order
    # (and so in the last page of due lanes) ten cadences.
    redis_client.hset(keys.lanes, mapping={
        run_field(member_lane(FAMILY, m)): encode(RunRecord(
            last_run_at=now - CADENCE_S * (10.0 if m == members[-1] else 1.5 + (i % 10) / 10),
            last_outcome=Outcome.COMPLETED, runs=1))
        for i, m in enumerate(members)})
    sched = FairScheduler(app=app)
    sched.rt.store.read_page = page
    sched.tick()
    heavy = [json.loads(m) for m in broker.lrange("heavy", 0, -1)]
    assert [m["headers"]["argsrepr"] for m in heavy] == [f"['{members[-1]}']"]
    paged = sched.rt.store.read_pages
    if page == PAGE:
        assert len(paged) >= 8 and max(paged) <= PAGE + PAGE // 4, paged
    # Every member was judged: each has its next look in the index, none left at "now".
    scores = redis_client.zmscore(keys.due, [member_lane(FAMILY, m) for m in members])
    assert all(s is not None and s > 0 for s in scores[:-1]), "a member was never planned"
    sched.close()


def test_a_beat_new_to_the_lock_decodes_no_record_of_the_read_it_replaces(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A beat new to the lock reads every lane afresh after its first read: the first read's
    records (every member marked changed, as a start-up after adding a family finds them)
    are not decoded - at 1,000,000 members decoding them only to drop them was most of the
    first tick and its peak memory. Only the full read's (the lanes due) are."""
    from schedproj.store import lane_store

    keys = Keys(key_prefix)
    app = make_app(key_prefix, declare, beat_max_loop_interval_s=0.2, beat_lock_ttl_s=5.0)
    members = [f"m{i:04d}" for i in range(8 * PAGE)]
    FamilyStore(redis_client, keys, [FAMILY]).add(FAMILY, members)
    now = time.time()
    lanes = [member_lane(FAMILY, m) for m in members]
    # Every member ran just now (not due for a cadence) and is marked changed.
    redis_client.hset(keys.lanes, mapping={run_field(lane): encode(RunRecord(
        last_run_at=now, last_outcome=Outcome.COMPLETED, runs=1)) for lane in lanes})
    redis_client.zadd(keys.due, dict.fromkeys(lanes, now + CADENCE_S))
    redis_client.sadd(keys.changed, *lanes)
    decoded: list[str] = []
    parse = lane_store.parse_states

    def counted(raw, *args, **kwargs):  # type: ignore[no-untyped-def]
        decoded.extend(raw)
        return parse(raw, *args, **kwargs)

    monkeypatch.setattr(lane_store, "parse_states", counted)
    sched = FairScheduler(app=app)
    sched.rt.store.read_page = PAGE
    sched.tick()
    assert sched.active and not broker.lrange("heavy", 0, -1)
    assert not [f for f in decoded if f.startswith(f"{FAMILY}[")], "member records decoded"
    # The marks were read (the changed set is emptied) and the members keep their looks.
    assert not set(lanes) & redis_client.smembers(keys.changed)
    assert all(s == now + CADENCE_S for s in redis_client.zmscore(keys.due, lanes))
    # Once active, a member whose record changes is read and decoded as before.
    redis_client.sadd(keys.changed, lanes[0])
    sched.tick()
    assert run_field(lanes[0]) in decoded
    sched.close()
