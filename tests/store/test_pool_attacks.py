"""Adversarial checks of the pool protocol (a pool = N fenced slot leases beside the heavy
lease), against a real Redis, a real in-process beat tick and the real worker task.

Each test states the invariant it attacks. Seven attacks found bugs (they were committed as
strict xfails, each fix flipped one: pools resized down or removed under a run, lanes moved
between pools, grants not matching the worker's declaration, operator clears and stops on
slots, a broken slot); the others passed the attack and stay for the coverage they add.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest
import redis
from celery import Celery

from schedproj import Lane, LaneTask
from schedproj.core import lifecycle
from schedproj.core.pools import parse_pools
from schedproj.on_celery.beat import FairScheduler
from schedproj.on_celery.keepalive import OPERATOR_STOP, LeaseRenewer
from schedproj.on_celery.messages import heavy_kwargs
from schedproj.on_celery.run_context import RunContext
from schedproj.on_celery.run_records import swap_run
from schedproj.store.lease import HeavyLease, Holder, OperatorRequest, PoolSlots, SlotGroup
from schedproj.store.protocol import CounterKind, Keys, counter_field
from tests.conftest import make_app, sent

pytestmark = pytest.mark.timeout(60)

BEAT_FENCE = 7


@pytest.fixture
def gpu_queue(broker: redis.Redis) -> Iterator[redis.Redis]:
    broker.delete("gpu")
    yield broker
    broker.delete("gpu")


def nothing() -> None:
    """A lane body: the beat tests only look at what beat sends and records."""


def queued(broker: redis.Redis, queue: str) -> list[dict]:
    out = []
    for raw in reversed(broker.lrange(queue, 0, -1)):
        message = json.loads(raw)
        _, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        out.append({"task": message["headers"]["task"], "id": message["headers"]["id"],
                    "kwargs": kwargs})
    return out


def beat_app(prefix: str, declare: Callable[[Celery], None], pools: str) -> Celery:
    return make_app(prefix, declare, beat_max_loop_interval_s=0.2, beat_lock_ttl_s=1.0,
                    start_deadline_s=5.0, pools=pools)


def running(client: redis.Redis, keys: Keys, lane: str, task: str, *, last_run_at: float,
            fence: int = 1) -> None:
    """The run record a started heavy run leaves: ``task`` runs now (due again by cadence)."""
    now = time.time()
    client.hset(keys.lanes, f"{lane}|run", json.dumps({
        "v": 1, "last_run_at": last_run_at, "last_task_id": "done-0", "running_task_id": task,
        "running_since": now - 5, "fence": fence}))


def ran_recently(client: redis.Redis, keys: Keys, lane: str) -> None:
    client.hset(keys.lanes, f"{lane}|run", json.dumps({
        "v": 1, "last_run_at": time.time() - 1, "last_task_id": "done-0", "fence": 1}))


def hold(client: redis.Redis, keys: Keys, pool: str, index: int, lane: str,
         task: str) -> HeavyLease:
    """A started slot lease of ``pool`` naming run ``task`` of ``lane`` (a live holder)."""
    lease = HeavyLease(client, keys.slot(pool, index))
    tok = f"tok-{pool}-{index}"
    assert lease.acquire(lane, tok, 30.0, time.time(), task_id=task).granted
    assert lease.start(tok, 30.0, time.time(), lane=lane, task_id=task,
                       holder=Holder("box", 1, "gpu1@box#b#1"))[0]
    return lease


def declared_before(client: redis.Redis, keys: Keys, pools: str) -> None:
    """The beat before the deploy declared ``pools``: it recorded them, as every beat does at
    its first look at the slots, before it granted any (``PoolSlots``, lua/pools_declare.lua)."""
    assert PoolSlots(client, keys, {p.name: p for p in parse_pools(pools)})
    assert client.exists(keys.pools)


def gpu_lanes(count: int) -> Callable[[Celery], None]:
    def declare(app: Celery) -> None:
        for n in range(count):
            app.task(shared=False, base=LaneTask, name=f"t.gpu-{n}",
                     lane=Lane(cadence_s=60, pool="gpu", order=n))(nothing)
    return declare


def journal(client: redis.Redis, keys: Keys) -> list[dict]:
    return [json.loads(e) for e in client.lrange(keys.journal, 0, -1)]


# -- resizing a pool down while its top slot is held ------------------------------------------


def test_a_pool_resized_down_never_runs_more_than_its_slots(
        key_prefix: str, gpu_queue: redis.Redis, redis_client: redis.Redis) -> None:
    """docs/pools.md: 'an operator can resize a pool without a release' and 'at most N runs
    of a pool's lanes execute at once'. gpu was 3 slots; t.gpu-2 runs on slot 2; beat restarts
    with SCHEDPROJ_POOLS=gpu=2. The pool must not run three lanes at once."""
    keys = Keys(key_prefix)
    declared_before(redis_client, keys, "gpu=3")
    running(redis_client, keys, "t.gpu-2", "alive-2", last_run_at=time.time() - 1)
    hold(redis_client, keys, "gpu", 2, "t.gpu-2", "alive-2")
    sched = FairScheduler(app=beat_app(key_prefix, gpu_lanes(3), "gpu=2"))
    sched.tick()
    sched.close()
    held = {i: HeavyLease(redis_client, keys.slot("gpu", i)).read() for i in range(3)}
    holders = sorted(lease.lane for lease in held.values() if lease is not None)
    assert len(holders) <= 2, f"a pool of 2 slots has {len(holders)} holders: {holders}"


def test_a_run_on_a_slot_past_a_resized_pool_is_neither_lost_nor_run_twice(
        key_prefix: str, gpu_queue: redis.Redis, redis_client: redis.Redis) -> None:
    """The lane holding slot 2 (pool shrunk to 2 slots) is due by cadence; its run is alive
    and renewing slot 2. Beat must neither record it lost nor send the lane again."""
    keys = Keys(key_prefix)
    declared_before(redis_client, keys, "gpu=3")
    for lane in ("t.gpu-0", "t.gpu-1"):
        ran_recently(redis_client, keys, lane)  # not due: only t.gpu-2 is
    running(redis_client, keys, "t.gpu-2", "alive-2", last_run_at=time.time() - 600)
    slot2 = hold(redis_client, keys, "gpu", 2, "t.gpu-2", "alive-2")
    sched = FairScheduler(app=beat_app(key_prefix, gpu_lanes(3), "gpu=2"))
    sched.tick()
    sched.tick()
    sched.close()
    assert slot2.read() is not None  # the run still holds its slot (it renews it)
    lost = [e for e in journal(redis_client, keys) if e.get("ev") == "lost"]
    again = [m["task"] for m in queued(gpu_queue, "gpu")]
    record = json.loads(redis_client.hget(keys.lanes, "t.gpu-2|run"))
    assert (lost, again, record.get("running_task_id")) == ([], [], "alive-2"), (
        lost, again, record)


# -- a lane moved out of its pool while it runs (a rolling deploy) ----------------------------


@pytest.mark.parametrize("gpu_still_declared", [True, False])
def test_a_lane_moved_out_of_its_pool_while_running_is_not_lost_nor_run_twice(
        key_prefix: str, broker: redis.Redis, gpu_queue: redis.Redis,
        redis_client: redis.Redis, gpu_still_declared: bool) -> None:
    """Release N: t.big in pool gpu, running on gpu slot 0. Release N+1 (a new beat) declares
    t.big in the default pool. Its run is alive (it renews its gpu slot): beat must not record
    it lost, and must not send t.big again while that run goes on."""
    keys = Keys(key_prefix)
    declared_before(redis_client, keys, "gpu=2")

    def declare(app: Celery) -> None:
        app.task(shared=False, base=LaneTask, name="t.big", lane=Lane(cadence_s=60))(nothing)
        if gpu_still_declared:
            app.task(shared=False, base=LaneTask, name="t.embed",
                     lane=Lane(cadence_s=60, pool="gpu"))(nothing)

    if gpu_still_declared:
        ran_recently(redis_client, keys, "t.embed")
    running(redis_client, keys, "t.big", "alive-1", last_run_at=time.time() - 600)
    slot0 = hold(redis_client, keys, "gpu", 0, "t.big", "alive-1")
    sched = FairScheduler(app=beat_app(key_prefix, declare,
                                       "gpu=2" if gpu_still_declared else ""))
    sched.tick()
    sched.tick()
    sched.close()
    assert slot0.read() is not None
    lost = [e for e in journal(redis_client, keys) if e.get("ev") == "lost"]
    again = [m["task"] for m in sent(broker, "heavy")]
    record = json.loads(redis_client.hget(keys.lanes, "t.big|run"))
    assert (lost, again, record.get("running_task_id")) == ([], [], "alive-1"), (
        lost, again, record)


def test_a_lane_moved_into_a_pool_while_running_is_not_lost_nor_run_twice(
        key_prefix: str, gpu_queue: redis.Redis, redis_client: redis.Redis) -> None:
    """The other way: release N runs t.big under the heavy lease; release N+1 declares it in
    pool gpu. Its run is alive (it renews the heavy lease): beat must not record it lost
    (judging it on gpu's slots alone would), nor grant it a gpu slot while it runs."""
    keys = Keys(key_prefix)

    def declare(app: Celery) -> None:
        app.task(shared=False, base=LaneTask, name="t.big",
                 lane=Lane(cadence_s=60, pool="gpu"))(nothing)

    running(redis_client, keys, "t.big", "alive-1", last_run_at=time.time() - 600)
    lease = HeavyLease(redis_client, keys)
    assert lease.acquire("t.big", "tok", 30.0, time.time(), task_id="alive-1").granted
    assert lease.start("tok", 30.0, time.time(), lane="t.big", task_id="alive-1",
                       holder=Holder("box", 1, "heavy@box#b#1"))[0]
    sched = FairScheduler(app=beat_app(key_prefix, declare, "gpu=2"))
    sched.tick()
    sched.tick()
    sched.close()
    assert lease.read() is not None
    lost = [e for e in journal(redis_client, keys) if e.get("ev") == "lost"]
    again = [m["task"] for m in queued(gpu_queue, "gpu")]
    record = json.loads(redis_client.hget(keys.lanes, "t.big|run"))
    assert (lost, again, record.get("running_task_id")) == ([], [], "alive-1"), (
        lost, again, record)


# -- the worker runs a grant that does not match its lane's pool or slots ---------------------


def call(app: Celery, task: str, task_id: str, **kwargs: object) -> object:
    lane_task = app.tasks[task]
    lane_task.push_request(id=task_id)
    try:
        return lane_task(**kwargs)
    finally:
        lane_task.pop_request()


def test_a_two_slot_lane_never_runs_on_one_slot(key_prefix: str,
                                                redis_client: redis.Redis) -> None:
    """Rolling deploy: the old beat declares t.train with 1 slot and grants it one; the new
    worker declares Lane(slots=2) (it needs both GPUs). It must refuse the grant, as a light
    worker refuses a heavy message (``kind-mismatch``), not run on half its resources while
    the other slot goes to another lane."""
    ran: list[str] = []

    def declare(app: Celery) -> None:
        @app.task(shared=False, base=LaneTask, name="t.train",
                  lane=Lane(cadence_s=60, pool="gpu", slots=2))
        def train() -> None:
            ran.append("train")

    app = make_app(key_prefix, declare, pools="gpu=2")
    keys = Keys(key_prefix)
    redis_client.set(keys.beat_fence, BEAT_FENCE)
    slot0 = HeavyLease(redis_client, keys.slot("gpu", 0))
    grant = slot0.acquire("t.train", "tok", 30.0, time.time(), task_id="m-1")
    assert grant.granted
    call(app, "t.train", "m-1",
         **heavy_kwargs("tok", grant.fence, BEAT_FENCE, pool="gpu", slots=(0,)))
    assert ran == [], "a lane declared slots=2 ran holding one slot"


def test_a_grant_of_another_pool_than_the_lanes_is_refused(key_prefix: str,
                                                           redis_client: redis.Redis) -> None:
    """Rolling deploy moving t.embed into pool gpu (2 slots): the old beat still grants it the
    heavy lease; the new worker's t.embed uses a GPU. Run under the lease, it is a third GPU
    job beside the two the new beat grants the gpu slots to."""
    ran: list[str] = []

    def declare(app: Celery) -> None:
        @app.task(shared=False, base=LaneTask, name="t.embed",
                  lane=Lane(cadence_s=60, pool="gpu"))
        def embed() -> None:
            ran.append("embed")

    app = make_app(key_prefix, declare, pools="gpu=2")
    keys = Keys(key_prefix)
    redis_client.set(keys.beat_fence, BEAT_FENCE)
    lease = HeavyLease(redis_client, keys)
    grant = lease.acquire("t.embed", "tok", 30.0, time.time(), task_id="m-1")
    assert grant.granted
    call(app, "t.embed", "m-1", **heavy_kwargs("tok", grant.fence, BEAT_FENCE))
    assert ran == [], "a gpu lane ran under the heavy lease, outside its pool's slots"


# -- operator verbs on a slot -----------------------------------------------------------------


@pytest.mark.parametrize("action", ["clear", "terminate"])
def test_a_pool_run_cleared_by_an_operator_is_recorded_cleared(
        key_prefix: str, gpu_queue: redis.Redis, redis_client: redis.Redis,
        action: str) -> None:
    """The pool analogue of tests/on_celery/test_cleared_run_recorded.py: ``clear-lease --pool
    gpu --slot 0`` (or ``--terminate``) leaves its request on the slot's request key; beat must
    record the run ``cleared``, not lost (docs/pools.md: a slot is freed 'by the rules that
    free the heavy lease')."""
    keys = Keys(key_prefix)
    sched = FairScheduler(app=beat_app(key_prefix, gpu_lanes(1), "gpu=1"))
    sched.tick()
    slot = HeavyLease(redis_client, keys.slot("gpu", 0))
    granted = slot.read()
    assert granted is not None and granted.task_id
    now = time.time()
    assert slot.start(granted.token, 30, now, holder=Holder("box", 1, "gpu1@box#b#1"))[0]
    swap_run(sched.rt.store, granted.lane,
             lambda before: lifecycle.started(before, task_id=str(granted.task_id), now=now,
                                              running_until=now + 60, fence=granted.fence),
             tries=3)
    sched.tick()  # beat sees the run started
    request = OperatorRequest(action, str(granted.task_id), granted.lane, granted.fence, now)
    if action == "clear":
        assert slot.clear(granted, started=True, request=request) == "cleared"
    else:
        slot.ask(request)
        redis_client.delete(keys.slot("gpu", 0).lease)
    sched.tick()
    sched.close()
    record = json.loads(redis_client.hget(keys.lanes, f"{granted.lane}|run"))
    assert record["last_task_id"] == granted.task_id
    assert redis_client.hget(keys.counters, counter_field(CounterKind.LOST, granted.lane)) \
        is None, "counted lost"
    assert record["last_reason"].startswith("cleared: by an operator"), record


def test_a_stop_on_the_second_slot_of_a_two_slot_run_is_heeded(client: redis.Redis,
                                                               keys: Keys) -> None:
    """docs/pools.md: '--stop on either slot stops the run'. Every clear-lease verb leaves its
    request for a day (REQUEST_TTL_S), so slot 0 commonly carries an earlier run's."""
    group = SlotGroup(client, keys, "gpu", (0, 1))
    now = time.time()
    group.leases[0].ask(OperatorRequest("clear", "an-earlier-run", "t.embed", 3, now - 600))
    group.leases[1].ask(OperatorRequest("stop", "run-1", "t.train", 9, now))
    ctx = RunContext(lane="t.train", task_id="run-1", started_at=now, hold_cap_s=3600)
    LeaseRenewer(SimpleNamespace(), "tok", ctx).heed_operator(group)  # type: ignore[arg-type]
    assert ctx.should_yield() and ctx.lost_reason == OPERATOR_STOP


def test_a_stop_on_either_slot_of_a_two_slot_run_is_heeded_when_alone(
        client: redis.Redis, keys: Keys) -> None:
    """Refuted attack: with no leftover request, a stop on either slot reaches the run."""
    for index in (0, 1):
        group = SlotGroup(client, keys, "gpu", (0, 1))
        for lease in group.leases:
            client.delete(lease.keys.lease_request)
        group.leases[index].ask(OperatorRequest("stop", "run-1", "t.train", 9, time.time()))
        ctx = RunContext(lane="t.train", task_id="run-1", started_at=time.time(),
                         hold_cap_s=3600)
        LeaseRenewer(SimpleNamespace(), "tok", ctx).heed_operator(  # type: ignore[arg-type]
            group)
        assert ctx.should_yield(), index


def test_clearing_one_slot_of_an_unstarted_two_slot_grant_starts_nothing(
        client: redis.Redis, keys: Keys) -> None:
    """Refuted attack on ``clear-lease --pool gpu --slot 1`` racing a two-slot start: the
    worker's SlotGroup.start has started slot 0 when the operator clears slot 1 (still
    unstarted). The run must not go on with one slot: its start of slot 1 finds it gone,
    slot 0 is released, and both slots are free for beat."""
    now = time.time()
    group = SlotGroup(client, keys, "gpu", (0, 1))
    for lease in group.leases:
        assert lease.acquire("t.train", "tok", 30.0, now, task_id="m-1").granted
    second = group.leases[1]
    start_second = second.start

    def operator_clears_first(*args: object, **kwargs: object) -> tuple[bool, int | str]:
        pending = second.read()
        assert pending is not None and pending.started_at is None
        assert group.leases[0].read().started_at is not None  # type: ignore[union-attr]
        assert second.clear(pending, started=False) == "cleared"
        return start_second(*args, **kwargs)  # type: ignore[arg-type]

    second.start = operator_clears_first  # type: ignore[method-assign]
    ok, why = group.start("tok", 30.0, now, lane="t.train", task_id="m-1")
    assert (ok, why) == (False, "gone")
    assert [lease.read() for lease in group.leases] == [None, None]


# -- one broken slot key ----------------------------------------------------------------------


def test_one_broken_slot_does_not_stop_a_pool_with_a_healthy_free_slot(
        key_prefix: str, gpu_queue: redis.Redis, redis_client: redis.Redis) -> None:
    """Slot 0's fence counter holds garbage (lease_acquire.lua refuses it, naming the key);
    slot 1 is healthy and free. The pool's one due lane must still be granted slot 1."""
    keys = Keys(key_prefix)
    redis_client.set(keys.slot("gpu", 0).lease_fence, "garbage")
    sched = FairScheduler(app=beat_app(key_prefix, gpu_lanes(1), "gpu=2"))
    for _ in range(3):
        sched.tick()
    sched.close()
    granted = [(m["task"], m["kwargs"]["schedproj_lease"]["slots"])
               for m in queued(gpu_queue, "gpu")]
    assert granted == [("t.gpu-0", [1])], granted


def test_a_pool_stopped_by_a_broken_slot_is_not_reported_healthy(
        key_prefix: str, gpu_queue: redis.Redis, redis_client: redis.Redis) -> None:
    """Refuted attack on the derived posture: while a broken slot key keeps the pool's lane
    from being granted, status does not say HEALTHY once the lane has waited past the
    undispatched threshold (the lane is due, neither dispatched nor deferred)."""
    from schedproj.core.health import UNDISPATCHED_AFTER_S, Posture
    from schedproj.telemetry.observe import observe

    keys = Keys(key_prefix)
    redis_client.set(keys.slot("gpu", 0).lease_fence, "garbage")
    sched = FairScheduler(app=beat_app(key_prefix, gpu_lanes(1), "gpu=1"))
    for _ in range(3):
        sched.tick()
    sched.close()
    assert queued(gpu_queue, "gpu") == []
    later = observe(redis_client, keys, now=time.time() + UNDISPATCHED_AFTER_S + 5).health()
    assert later.posture is Posture.DEGRADED and later.undispatched == ("t.gpu-0",), later


# -- the pools hash (derived state) lost or raced -------------------------------------------


def test_a_lost_pools_hash_is_declared_again_and_another_beats_slots_are_read(
        client: redis.Redis, keys: Keys) -> None:
    """The pools hash is what lets a beat see slots past its declaration. Deleted, the next
    read declares this beat's pools again; raised by another beat (gpu=4 while this one says
    gpu=2), the next read includes slots 2 and 3, and a run holding slot 3 takes a place."""
    slots = PoolSlots(client, keys, {p.name: p for p in parse_pools("gpu=2")})
    assert slots and client.hgetall(keys.pools) == {"gpu": "2"}
    client.delete(keys.pools)
    assert slots.read() == {"gpu": [None, None]}
    assert client.hgetall(keys.pools) == {"gpu": "2"}, "declared again"
    declared_before(client, keys, "gpu=4")
    hold(client, keys, "gpu", 3, "t.gpu-3", "alive-3")
    read = slots.read()
    assert [lease.task_id if lease else None for lease in read["gpu"]] == [None, None,
                                                                          "alive-3"]
    declared_before(client, keys, "gpu=1")  # a smaller declaration never lowers it
    assert client.hgetall(keys.pools) == {"gpu": "4"}
    client.hset(keys.pools, "gpu", "garbage")
    assert slots.read()["gpu"][:2] == [None, None]
    # Garbage is replaced by the most slots this beat knew (slot 3 was read: a run may
    # hold it), not by its own declaration alone.
    assert client.hget(keys.pools, "gpu") == "4", "garbage replaced by what beat knew"


# -- the pools hash lost while a run holds a slot past a shrunk pool --------------------------


def test_a_run_past_a_shrunk_pool_stays_known_when_the_pools_hash_is_deleted(
        key_prefix: str, gpu_queue: redis.Redis, redis_client: redis.Redis) -> None:
    """Beat read slot 2 of gpu (3 slots before the deploy, 2 now); then ``<prefix>:pools`` is
    deleted. Beat declared its own 2 slots again and forgot slot 2: the live run there was
    recorded lost and its lane sent again beside it - two runs of one heavy lane at once."""
    keys = Keys(key_prefix)
    declared_before(redis_client, keys, "gpu=3")
    for lane in ("t.gpu-0", "t.gpu-1"):
        ran_recently(redis_client, keys, lane)
    running(redis_client, keys, "t.gpu-2", "alive-2", last_run_at=time.time() - 600)
    hold(redis_client, keys, "gpu", 2, "t.gpu-2", "alive-2")
    sched = FairScheduler(app=beat_app(key_prefix, gpu_lanes(3), "gpu=2"))
    sched.tick()
    redis_client.delete(keys.pools)
    redis_client.sadd(keys.changed, "t.gpu-2")  # a lane to look at: the tick reads the slots
    sched.tick()
    sched.tick()
    sched.close()
    lost = [e for e in journal(redis_client, keys) if e.get("ev") == "lost"]
    again = [m["task"] for m in queued(gpu_queue, "gpu")]
    record = json.loads(redis_client.hget(keys.lanes, "t.gpu-2|run"))
    assert (lost, again, record.get("running_task_id")) == ([], [], "alive-2"), (
        lost, again, record)
    assert redis_client.hget(keys.pools, "gpu") == "3"


def test_a_slot_holders_renewal_puts_its_slot_back_in_a_lost_pools_hash(
        key_prefix: str, gpu_queue: redis.Redis, redis_client: redis.Redis) -> None:
    """The pools hash went (Redis lost its state, or it was deleted) while t.gpu-2 runs on
    slot 2 of a pool shrunk to 2; a new beat starts. The holder's renewal (every third of a
    TTL, and inside the quarantine after a loss) records its slot again, so the new beat reads
    slot 2 and neither records the run lost nor sends its lane again."""
    keys = Keys(key_prefix)
    declared_before(redis_client, keys, "gpu=3")
    for lane in ("t.gpu-0", "t.gpu-1"):
        ran_recently(redis_client, keys, lane)
    running(redis_client, keys, "t.gpu-2", "alive-2", last_run_at=time.time() - 600)
    slot2 = hold(redis_client, keys, "gpu", 2, "t.gpu-2", "alive-2")
    redis_client.delete(keys.pools)
    assert slot2.renew("tok-gpu-2", 30.0, time.time(), 3600.0).ok
    assert redis_client.hget(keys.pools, "gpu") == "3"
    sched = FairScheduler(app=beat_app(key_prefix, gpu_lanes(3), "gpu=2"))
    sched.tick()
    sched.tick()
    sched.close()
    lost = [e for e in journal(redis_client, keys) if e.get("ev") == "lost"]
    again = [m["task"] for m in queued(gpu_queue, "gpu")]
    assert (lost, again) == ([], []), (lost, again)
