"""Regression tests for the protocol breaks an adversarial review found (state loss, failover,
clock skew, stalled heartbeats, zombies), against real redis-servers.

Where state must be lost or failed over, each test runs its own redis-server on a free
loopback port (``RedisServer``): a "failover to a lagging replica" is a second server given a
copy of the first one's keys (DUMP/RESTORE with their TTLs) at the instant the replica stopped
receiving the stream, so every later write is lost there, and its run_id differs.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis

import schedproj.on_celery.keepalive as keepalive_module
import schedproj.on_celery.task as task_module
from schedproj.core import lifecycle
from schedproj.core.lanes import LaneKind, LaneSpec, Profile
from schedproj.core.picker import Policy
from schedproj.core.planner import TickInput, plan_tick
from schedproj.core.records import LeaseView, Outcome, RunRecord, SchedRecord
from schedproj.devtools.redis_server import RedisServer
from schedproj.on_celery.messages import heavy_kwargs, light_kwargs, pop_dispatch
from schedproj.on_celery.task import LaneTask, RunContext, RunHeartbeat
from schedproj.store.lane_store import LaneStore
from schedproj.store.lease import HeavyLease, Renewal
from schedproj.store.protocol import Keys
from tests.conftest import REDIS_URL, make_app

pytestmark = pytest.mark.timeout(60)

PREFIX = "sp"
KEYS = Keys(PREFIX)
#: Quarantine of these tests: short, so a test can also watch what happens after it.
QUARANTINE_S = 0.3


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Callable[[], redis.Redis]]:
    """Start private redis-servers on free loopback ports; all killed at the end."""
    procs: list[RedisServer] = []

    def start() -> redis.Redis:
        proc = RedisServer(tmp_path, f"redis{len(procs)}")
        proc.start()
        procs.append(proc)
        return redis.Redis.from_url(proc.url, decode_responses=True, socket_timeout=5)

    yield start
    for proc in procs:
        proc.kill()


def copy_state(src: redis.Redis, dst: redis.Redis) -> None:
    """What a replica that stopped receiving the stream at this instant holds."""
    raw_src = redis.Redis(connection_pool=redis.ConnectionPool(
        **{**src.connection_pool.connection_kwargs, "decode_responses": False}))
    raw_dst = redis.Redis(connection_pool=redis.ConnectionPool(
        **{**dst.connection_pool.connection_kwargs, "decode_responses": False}))
    for key in raw_src.scan_iter("*"):
        dump = raw_src.dump(key)
        ttl = raw_src.pttl(key)
        assert dump is not None
        raw_dst.restore(key, max(ttl, 0), dump, replace=True)


def handles(client: redis.Redis) -> tuple[HeavyLease, LaneStore]:
    return HeavyLease(client, KEYS), LaneStore(client, KEYS)


def light_rt(store: LaneStore, ttl: float = 20.0) -> SimpleNamespace:
    return SimpleNamespace(store=store, settings=SimpleNamespace(lease_ttl_s=ttl))


def start_light(store: LaneStore, lane: str, task_id: str, beat_fence: int,
                ttl: float = 20.0) -> tuple[str, RunRecord | None, RunContext]:
    """What ``LaneTask._run_light`` does to start a light message: (refusal or '', before)."""
    ctx = RunContext(lane=lane, task_id=task_id, started_at=time.time(), hold_cap_s=None)
    refused, before = LaneTask._start_light(LaneTask(), light_rt(store, ttl), ctx, beat_fence)
    return refused, before, ctx


# -- finding 1: a failover to a lagging replica must not start a message a second time ---------

def test_heavy_message_from_before_a_failover_never_starts_again(servers) -> None:
    a, b = servers(), servers()
    lease_a, store_a = handles(a)
    assert store_a.declare_fresh()
    beat = uuid.uuid4().hex
    snap = store_a.snapshot(beat, 15, QUARANTINE_S)
    tok, now = uuid.uuid4().hex, time.time()
    grant = lease_a.acquire("X", tok, 60, now, task_id="task-X", beat_token=beat)
    assert grant.granted
    copy_state(a, b)  # the replica has the grant (and the message), not the start
    assert lease_a.start(tok, 20, time.time(), beat_fence=snap.lock.fence) == (True, grant.fence)
    mine = LeaseView(lane="X", token=tok, fence=grant.fence, granted_at=now, started_at=now,
                     task_id="task-X")
    lease_b, store_b = handles(b)
    # Sentinel promoted B; a second worker consumes the same message there before beat ticks.
    assert lease_b.start(tok, 20, time.time(), beat_fence=snap.lock.fence) == \
        (False, "server-changed")
    snap_b = store_b.snapshot(beat, 15, QUARANTINE_S)
    assert snap_b.epoch.cause == "server-changed"
    assert lease_b.renew(tok, 20, time.time(), 3600, reassert=mine).ok  # W1 runs on
    assert lease_b.start(tok, 20, time.time(), beat_fence=snap_b.lock.fence) == \
        (False, "quarantine")
    time.sleep(QUARANTINE_S + 0.1)
    snap_b = store_b.snapshot(beat, 15, QUARANTINE_S)
    assert snap_b.epoch.quarantine_left_s == 0
    for fence in (snap.lock.fence, snap_b.lock.fence):
        assert lease_b.start(tok, 20, time.time(), beat_fence=fence) == (False, "stale-epoch")
    # Refusals leave the lease to the run that holds it.
    assert lease_b.renew(tok, 20, time.time(), 3600, reassert=mine) == (True, "")
    view = lease_b.read()
    assert view is not None and view.token == tok
    # A grant made after the loss starts normally.
    assert lease_b.release(tok)
    tok2 = uuid.uuid4().hex
    g2 = lease_b.acquire("Y", tok2, 60, time.time(), task_id="task-Y", beat_token=beat)
    assert g2.granted
    assert lease_b.start(tok2, 20, time.time(), beat_fence=snap_b.lock.fence) == \
        (True, g2.fence)


def test_light_message_from_before_a_failover_never_starts_again(servers) -> None:
    a, b = servers(), servers()
    _, store_a = handles(a)
    assert store_a.declare_fresh()
    beat = uuid.uuid4().hex
    snap = store_a.snapshot(beat, 15, QUARANTINE_S)
    now = time.time()
    assert store_a.write_sched(beat, {"L": SchedRecord(
        inflight_task_id="light-T1", inflight_deadline=now + 60, last_dispatch_at=now,
        dispatches=1)})
    copy_state(a, b)  # the replica stops here: it has the dispatch, not the start
    refused, before, _ = start_light(store_a, "L", "light-T1", snap.lock.fence)
    assert refused == ""
    assert before is not None
    store_a.finish("L", lifecycle.finished(before, task_id="light-T1",
                                           outcome=Outcome.COMPLETED, reason=None, backlog=0,
                                           now=time.time()),
                   token="", fence=0, wake_message="L:completed")
    _, store_b = handles(b)
    assert start_light(store_b, "L", "light-T1", snap.lock.fence)[0] == "server-changed"
    snap_b = store_b.snapshot(beat, 15, QUARANTINE_S)
    assert snap_b.epoch.cause == "server-changed"
    # The loss moved the beat fence on: every message sent before it is stale from now on.
    assert start_light(store_b, "L", "light-T1", snap.lock.fence)[0] == "stale-beat"
    current = int(b.get(KEYS.beat_fence) or 0)
    assert current > snap.lock.fence
    assert start_light(store_b, "L", "light-T1", current)[0] == "quarantine"
    time.sleep(QUARANTINE_S + 0.1)
    snap_b = store_b.snapshot(beat, 15, QUARANTINE_S)
    assert snap_b.epoch.quarantine_left_s == 0 and snap_b.lock.fence != snap.lock.fence
    assert start_light(store_b, "L", "light-T1", snap.lock.fence)[0] == "stale-beat"
    assert store_b.read_run("L").running_task_id is None


# -- finding 2: a light lane must never run twice (skewed clocks, stalled heartbeat) ----------

LIGHT_TTL = 1.5


def _beat_tick(store: LaneStore, beat: str, spec: LaneSpec, now: float) -> tuple[int, list[str]]:
    """One tick as FairScheduler._tick plans it (in-flight grace: one lease TTL)."""
    snap = store.snapshot(beat, 15, LIGHT_TTL * 4 / 3)
    plan = plan_tick([spec], TickInput(states=snap.states, lease=snap.lease,
                                       quarantined=snap.epoch.quarantine_left_s > 0,
                                       inflight_grace_s=LIGHT_TTL),
                     now, profile=Profile.LOCAL, policy=Policy.STALENESS, start_deadline_s=60,
                     task_id=lambda lane: "T-" + uuid.uuid4().hex[:6])
    assert store.write_sched(beat, plan.changes)
    return snap.lock.fence, [s.task_id for s in plan.sends.values()]


@pytest.mark.parametrize("mode", ["skew", "stall"])
def test_light_lane_never_runs_twice_under_skew_or_a_stalled_heartbeat(
        redis_client: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch,
        mode: str) -> None:
    keys = Keys(key_prefix)
    store = LaneStore(redis_client, keys)
    if mode == "skew":  # the worker's clock is 0.9 TTL behind beat's (and Redis's)
        for worker_module in (task_module, keepalive_module):
            monkeypatch.setattr(worker_module, "time", SimpleNamespace(
                time=lambda: time.time() - 0.9 * LIGHT_TTL, monotonic=time.monotonic))
    spec = LaneSpec(name="L", task_name="t.L", kind=LaneKind.LIGHT, cadence_s=60)
    beat = uuid.uuid4().hex
    fence, sent = _beat_tick(store, beat, spec, time.time())
    assert len(sent) == 1
    refused, before, ctx = start_light(store, "L", sent[0], fence, LIGHT_TTL)
    assert refused == ""
    # The mark's end is on Redis's clock, whatever the worker's says.
    mark = store.read_run("L").running_until
    assert mark is not None and abs(mark - (time.time() + LIGHT_TTL)) < 0.5
    heartbeat = RunHeartbeat(light_rt(store, LIGHT_TTL), ctx)
    last = time.monotonic()
    started = time.monotonic()
    while time.monotonic() - started < 3.5 * LIGHT_TTL:
        time.sleep(LIGHT_TTL / 7)
        if mode == "skew" and time.monotonic() - last >= LIGHT_TTL / 3:
            assert heartbeat.refresh(LIGHT_TTL)
            last = time.monotonic()
        now = time.time()
        run = store.read_run("L")
        assert run.running_until is not None
        _, again = _beat_tick(store, beat, spec, now)
        if again:
            # Only once the mark is a whole TTL past: when beat records the run lost.
            assert mode == "stall" and now >= run.running_until + LIGHT_TTL, \
                f"dispatched again {run.running_until + LIGHT_TTL - now:.2f}s early"
            break
    else:
        assert mode == "skew", "a stalled run's lane was never dispatched again"
    # Run 1 ends: it must not erase the mark of a run that started after it.
    raw, now_rec = store.read_run_raw("L")
    assert store.cas_run("L", raw, lifecycle.started(now_rec, task_id="T-second",
                                                     now=time.time(),
                                                     running_until=time.time() + 60))[0]
    assert before is not None
    store.finish("L", lifecycle.finished(before, task_id=ctx.task_id,
                                         outcome=Outcome.COMPLETED, reason=None, backlog=0,
                                         now=time.time()),
                 token="", fence=0, wake_message="L:completed")
    after = store.read_run("L")
    assert after.last_task_id == ctx.task_id and after.running_task_id == "T-second"
    assert after.running_until is not None and after.running_until > time.time() + 50


class _Unreachable:
    """A store whose Redis does not answer."""

    def read_run_raw(self, lane: str) -> Any:
        raise redis.ConnectionError("unreachable")


def test_light_run_is_flagged_lost_when_its_mark_cannot_be_kept(
        redis_client: redis.Redis, key_prefix: str) -> None:
    store = LaneStore(redis_client, Keys(key_prefix))
    # Redis unreachable: lost after two thirds of a TTL without a refresh, not before.
    ctx = RunContext(lane="L", task_id="T1", started_at=time.time(), hold_cap_s=None)
    hb = RunHeartbeat(SimpleNamespace(store=_Unreachable(),
                                      settings=SimpleNamespace(lease_ttl_s=0.6)), ctx)
    t0 = time.monotonic()
    hb.start()
    hb.join(5)
    assert ctx.lost.is_set() and ctx.lost_reason == "in-flight-mark-unrefreshed"
    assert 0.6 * 2 / 3 <= time.monotonic() - t0 < 0.6 + 0.3
    assert ctx.should_yield()
    # Another run owns the record: lost at once.
    raw, rec = store.read_run_raw("L")
    assert store.cas_run("L", raw, lifecycle.started(rec, task_id="T-other", now=time.time(),
                                                     running_until=time.time() + 60))[0]
    ctx2 = RunContext(lane="L", task_id="T2", started_at=time.time(), hold_cap_s=None)
    hb2 = RunHeartbeat(light_rt(store, 0.6), ctx2)
    hb2.start()
    hb2.join(5)
    assert ctx2.lost.is_set() and ctx2.lost_reason == "in-flight-mark-lost"
    assert ctx2.should_yield()


# -- finding 3: after a failover that rolls back a run, the running one re-asserts its mark ----

def test_light_heartbeat_reasserts_over_a_rolled_back_run_after_a_failover(servers) -> None:
    a, b = servers(), servers()
    _, store_a = handles(a)
    assert store_a.declare_fresh()
    spec = LaneSpec(name="L", task_name="t.L", kind=LaneKind.LIGHT, cadence_s=0.5)
    beat = uuid.uuid4().hex
    fence, sent = _beat_tick(store_a, beat, spec, time.time())
    refused, before0, _ = start_light(store_a, "L", sent[0], fence, LIGHT_TTL)
    assert refused == "" and before0 is not None
    copy_state(a, b)  # the replica stops here: it names run T0 as running
    store_a.finish("L", lifecycle.finished(before0, task_id=sent[0],
                                           outcome=Outcome.COMPLETED, reason=None, backlog=0,
                                           now=time.time()),
                   token="", fence=0, wake_message="L:completed")
    time.sleep(0.6)
    fence, sent1 = _beat_tick(store_a, beat, spec, time.time())
    refused, _, ctx1 = start_light(store_a, "L", sent1[0], fence, LIGHT_TTL)
    assert refused == ""
    # Failover to B: run T1 goes on; its heartbeat now talks to B.
    _, store_b = handles(b)
    hb = RunHeartbeat(light_rt(store_b, LIGHT_TTL), ctx1)
    assert hb.refresh(LIGHT_TTL), "the heartbeat gave up over the rolled-back run's mark"
    assert store_b.read_run("L").running_task_id == ctx1.task_id
    deadline = time.monotonic() + 4 * LIGHT_TTL
    last = time.monotonic()
    while time.monotonic() < deadline:  # through the quarantine and after it
        time.sleep(LIGHT_TTL / 7)
        if time.monotonic() - last >= LIGHT_TTL / 3:
            assert hb.refresh(LIGHT_TTL)
            last = time.monotonic()
        _, again = _beat_tick(store_b, beat, spec, time.time())
        assert not again, "the lane was dispatched again while T1 runs"
    # Once the state is settled, another run's mark is a newer run's: not overwritten.
    raw, rec = store_b.read_run_raw("L")
    assert store_b.cas_run("L", raw, lifecycle.started(rec, task_id="T-newer", now=time.time(),
                                                       running_until=time.time() + 60))[0]
    assert not hb.refresh(LIGHT_TTL)


# -- finding 4: after an empty restart a zombie re-asserting first must not win ---------------

def test_newer_holder_takes_back_a_lease_a_zombie_reasserted_first(servers) -> None:
    c = servers()
    lease, store = handles(c)
    assert store.declare_fresh()
    beat = uuid.uuid4().hex
    store.snapshot(beat, 15, QUARANTINE_S)
    ttl = 1.0

    def grant(lane: str) -> LeaseView:
        tok = uuid.uuid4().hex
        assert lease.acquire(lane, tok, 60, time.time(), task_id=lane, beat_token=beat).granted
        ok, fence = lease.start(tok, ttl, time.time())
        assert ok
        t = time.time()
        return LeaseView(lane=lane, token=tok, fence=int(fence), granted_at=t, started_at=t,
                         task_id=lane)

    zombie = grant("Z")
    time.sleep(ttl + 0.2)  # Z is paused; its lease lapses and passes to B
    legit = grant("B")
    assert legit.fence > zombie.fence
    c.flushall()  # Redis restarts empty
    assert lease.renew(zombie.token, ttl, time.time(), 3600, reassert=zombie) == \
        (True, "reasserted")
    assert lease.renew(legit.token, ttl, time.time(), 3600, reassert=legit) == \
        (True, "reasserted")
    view = lease.read()
    assert view is not None and view.token == legit.token and view.reasserted
    assert lease.renew(zombie.token, ttl, time.time(), 3600, reassert=zombie) == \
        (False, "lost")
    assert lease.renew(legit.token, ttl, time.time(), 3600, reassert=legit) == (True, "")
    assert lease.current_fence() >= legit.fence


def test_reasserted_lease_is_not_taken_over_once_state_is_settled(servers) -> None:
    c = servers()
    lease, store = handles(c)
    assert store.declare_fresh()
    beat = uuid.uuid4().hex
    store.snapshot(beat, 15, QUARANTINE_S)
    holder = LeaseView(lane="Z", token="tz", fence=5, granted_at=time.time(),
                       started_at=time.time(), task_id="Z")
    assert lease.renew("tz", 5, time.time(), 3600, reassert=holder) == (True, "reasserted")
    other = LeaseView(lane="B", token="tb", fence=9, granted_at=time.time(),
                      started_at=time.time(), task_id="B")
    # The epoch is intact and out of quarantine: no take-over, whatever the fence.
    assert lease.renew("tb", 5, time.time(), 3600, reassert=other) == (False, "lost")


# -- finding 5: a worker that declares a heavy lane light must not run its heavy messages -----

def test_light_worker_refuses_a_heavy_message(redis_client: redis.Redis,
                                              key_prefix: str) -> None:
    keys = Keys(key_prefix)
    lease, store = HeavyLease(redis_client, keys), LaneStore(redis_client, keys)
    beat = uuid.uuid4().hex
    snap = store.snapshot(beat, 15, QUARANTINE_S)
    tok = uuid.uuid4().hex
    grant = lease.acquire("X", tok, 60, time.time(), task_id="T-X1", beat_token=beat)
    assert store.write_sched(beat, {"X": SchedRecord(inflight_task_id="T-X1",
                                                     inflight_deadline=time.time() + 60)})
    dispatch = pop_dispatch(heavy_kwargs(tok, grant.fence, snap.lock.fence))

    class OldCode(LaneTask):  # this worker's code declares X light
        lane = SimpleNamespace(name="X", kind=LaneKind.LIGHT)  # type: ignore[assignment]

    ran: list[str] = []
    task = OldCode()
    task.run = lambda *a, **k: ran.append("ran")
    rt = SimpleNamespace(store=store, keys=keys,
                         settings=SimpleNamespace(lease_ttl_s=20.0))
    result = task._run_light(rt, "T-X1", dispatch, (), {})
    assert result == {"outcome": "skipped", "reason": "kind-mismatch"} and not ran
    run = store.read_run("X")
    assert run.running_task_id is None and run.last_reason == "kind-mismatch"


# -- finding 6: fences are seeded from Redis's clock, never a beat host's ----------------------

def test_lease_fence_never_goes_backwards_across_a_loss_whatever_beat_clocks_say(
        servers) -> None:
    c = servers()
    lease, store = handles(c)
    assert store.declare_fresh()
    beat1 = uuid.uuid4().hex
    store.snapshot(beat1, 15, QUARANTINE_S)
    # beat-1's host clock runs two minutes ahead.
    g1 = lease.acquire("Z", uuid.uuid4().hex, 60, time.time() + 120, task_id="tz",
                       beat_token=beat1)
    assert g1.granted
    c.flushall()  # Redis restarts empty; beat-2 (a correct clock) takes over
    beat2 = uuid.uuid4().hex
    store.snapshot(beat2, 15, QUARANTINE_S)
    time.sleep(QUARANTINE_S + 0.05)
    store.snapshot(beat2, 15, QUARANTINE_S)
    g2 = lease.acquire("Y", uuid.uuid4().hex, 60, time.time(), task_id="tb", beat_token=beat2)
    assert g2.granted and g2.fence > g1.fence, "a fence from before the loss outranks"


# -- finding 7: a cut-off heavy holder stops before its lease can expire on the server --------

class _StuckLease:
    """A lease whose first renewal lands and whose later ones hang (a blackholed link) for
    ``hang_s``, then fail."""

    def __init__(self, hang_s: float) -> None:
        self.hang_s, self.calls = hang_s, 0

    def renew(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            return Renewal(True, "")
        time.sleep(self.hang_s)
        raise redis.TimeoutError("timed out")


def test_cut_off_heavy_holder_stops_within_two_thirds_of_a_ttl() -> None:
    ttl = 1.5
    stuck = _StuckLease(hang_s=10.0)  # the old client's socket timeout: far past the TTL
    settings = SimpleNamespace(lease_ttl_s=ttl, max_hold_s=3600.0, policy=Policy.STALENESS,
                               pressure_rule=None)
    rt = SimpleNamespace(settings=settings, lease=stuck, keys=Keys("x"), store=None)
    ctx = RunContext(lane="X", task_id="tx", started_at=time.time(), hold_cap_s=None)
    renewer = task_module.LeaseRenewer(rt, "tok", ctx)
    renewer.start()
    deadline = time.monotonic() + 3 * ttl
    while not ctx.should_yield() and time.monotonic() < deadline:
        time.sleep(0.02)
    stopped = time.monotonic()
    assert ctx.lost.is_set() and ctx.lost_reason == "lease-unrenewed"
    assert ctx.renewed_at is not None
    # The last renewal that landed was sent at renewed_at: the server's TTL runs from later.
    assert stopped - ctx.renewed_at < ttl * 2 / 3 + 0.2
    renewer.stopped.set()


def test_renewals_use_a_client_that_times_out_within_a_sixth_of_the_ttl() -> None:
    from schedproj.on_celery.runtime import Runtime
    from schedproj.settings import Settings

    rt = Runtime.build(Settings(lease_ttl_s=3.0, redis_url=REDIS_URL))
    assert rt.renewal is not None
    timeout = rt.renewal.client.connection_pool.connection_kwargs["socket_timeout"]
    assert timeout is not None and timeout <= 3.0 / 6


def test_a_renewal_to_a_silent_server_fails_once_within_its_timeout() -> None:
    """One attempt, no retries with backoff: a renewal through a sentinel that accepts and
    never answers (a cut-off link) fails within about its socket timeout, so the renewer can try
    again at its next interval and the holder learns in time to stop."""
    import socket
    import time

    from schedproj.on_celery.runtime import Runtime
    from schedproj.settings import Settings

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections (the kernel does), never reads or replies
    port = silent.getsockname()[1]
    try:
        # Behind Sentinel, where a client retrying with backoff took 95 s to give up here.
        rt = Runtime.build(Settings(lease_ttl_s=3.0,
                                    redis_url=f"redis+sentinel://127.0.0.1:{port}/svc/0"))
        assert rt.renewal is not None
        started = time.monotonic()
        with pytest.raises(redis.RedisError):
            rt.renewal.client.ping()
        took = time.monotonic() - started
        assert took < 2 * 3.0 / 6, f"the renewal client retried: {took:.2f}s"
    finally:
        silent.close()


# -- finding 8: no message carries an absolute expiry that a worker judges on its own clock ---

def test_beat_messages_carry_no_worker_judged_expiry(servers, key_prefix: str) -> None:
    import json

    from schedproj import Lane, LaneTask
    from schedproj.on_celery.beat import FairScheduler

    broker = servers()  # a private broker: its queues hold exactly this test's messages
    url = broker.connection_pool.connection_kwargs
    app = make_app(key_prefix, broker_url=f"redis://127.0.0.1:{url['port']}/0",
                   beat_max_loop_interval_s=0.2, beat_lock_ttl_s=1.0, start_deadline_s=30.0)

    @app.task(shared=False, base=LaneTask, name="x.heavy", lane=Lane(cadence_s=60))
    def heavy() -> None: ...

    @app.task(shared=False, base=LaneTask, name="x.light",
              lane=Lane(cadence_s=60, kind=LaneKind.LIGHT))
    def light() -> None: ...

    sched = FairScheduler(app=app)
    try:
        sched.tick()
    finally:
        sched.close()
    messages = [json.loads(m) for q in ("heavy", "light") for m in broker.lrange(q, 0, -1)]
    assert {m["headers"]["task"] for m in messages} == {"x.heavy", "x.light"}
    for m in messages:
        # An absolute time on beat's clock: a worker whose clock runs ahead would drop it.
        assert m["headers"].get("expires") is None, m["headers"]
        assert 0 < float(m["properties"]["expiration"]) <= 30_000  # relative, for AMQP


# -- finding 9: `schedproj init` cannot cancel a running quarantine ---------------------------

def test_init_cannot_cancel_the_quarantine_after_an_empty_restart(servers) -> None:
    c = servers()
    lease, store = handles(c)
    assert store.declare_fresh()
    assert not store.declare_fresh(), "declared twice"
    beat = uuid.uuid4().hex
    store.snapshot(beat, 15, 30.0)
    tok = uuid.uuid4().hex
    assert lease.acquire("A", tok, 60, time.time(), task_id="ta", beat_token=beat).granted
    assert lease.start(tok, 20, time.time())[0]
    c.flushall()  # Redis restarted empty; A still runs
    snap = store.snapshot(beat, 15, 30.0)
    assert snap.epoch.cause == "state-missing" and snap.epoch.quarantine_left_s > 0
    assert not store.declare_fresh(), "`schedproj init` cancelled the quarantine"
    store.snapshot(beat, 15, 30.0)
    g = lease.acquire("B", uuid.uuid4().hex, 60, time.time(), task_id="tb", beat_token=beat)
    assert not g.granted and g.quarantine_s is not None and g.quarantine_s > 0


# -- finding 10: a worker never frees the lease of a same-named process on another machine ----

def test_node_identity_tells_machines_with_one_hostname_apart() -> None:
    import os

    from schedproj.on_celery import recovery

    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    mine = recovery.node_identity("heavy1@host")
    assert boot in mine
    # The same hostname and node name on another machine (the host pid namespace has the same
    # inode on every machine): a pid there that is gone here proves nothing.
    elsewhere = mine.replace(boot, "0" * len(boot))
    lease = LeaseView(lane="X", token="t", fence=1, granted_at=0.0, started_at=1.0,
                      host="host", pid=2 ** 22 + 1, node=elsewhere)
    assert recovery.process_gone(2 ** 22 + 1)
    assert not recovery.predecessor_dead(lease, "host", mine, os.getpid())
    assert recovery.predecessor_dead(replace(lease, node=mine), "host", mine, os.getpid())


# -- finding 11: a refused light message frees its lane at once ---------------------------------

def test_refused_light_message_does_not_hold_its_lane_until_the_deadline(
        redis_client: redis.Redis, key_prefix: str) -> None:
    keys = Keys(key_prefix)
    store = LaneStore(redis_client, keys)
    spec = LaneSpec(name="L", task_name="t.L", kind=LaneKind.LIGHT, cadence_s=60)
    beat = uuid.uuid4().hex
    fence, sent = _beat_tick(store, beat, spec, time.time())
    assert len(sent) == 1

    class Light(LaneTask):
        lane = SimpleNamespace(name="L", kind=LaneKind.LIGHT)  # type: ignore[assignment]

    ran: list[str] = []
    task = Light()
    task.run = lambda *a, **k: ran.append("ran")
    rt = SimpleNamespace(store=store, keys=keys, settings=SimpleNamespace(lease_ttl_s=20.0))
    # The beat that sent it lost its lock since (frozen between recording and sending).
    result = task._run_light(rt, sent[0], pop_dispatch(light_kwargs(fence - 1)), (), {})
    assert result == {"outcome": "skipped", "reason": "stale-beat"} and not ran
    _, again = _beat_tick(store, beat, spec, time.time())
    assert len(again) == 1 and again != sent, "the refused message held its lane"


# -- finding 12: a paused heavy holder's start mark never overwrites a newer run's ------------

def test_paused_holder_never_overwrites_a_newer_runs_mark(redis_client: redis.Redis,
                                                          key_prefix: str) -> None:
    store = LaneStore(redis_client, Keys(key_prefix))
    raw, rec = store.read_run_raw("X")
    newer = lifecycle.started(rec, task_id="T-new", now=time.time(),
                              running_until=time.time() + 60, fence=9)
    assert store.cas_run("X", raw, newer)[0]
    rt = SimpleNamespace(store=store, keys=Keys(key_prefix),
                         settings=SimpleNamespace(lease_ttl_s=20.0, heavy_time_limit_s=600.0))
    ctx = RunContext(lane="X", task_id="T-old", started_at=time.time() - 30, hold_cap_s=None,
                     fence=5)  # resumed after a pause: its lease passed to fence 9
    LaneTask._mark_running(LaneTask(), rt, ctx)
    after = store.read_run("X")
    assert after.running_task_id == "T-new" and after.fence == 9
    assert ctx.lost.is_set() and ctx.should_yield()
    # Its own (newest) run marks normally.
    ctx2 = RunContext(lane="X", task_id="T-next", started_at=time.time(), hold_cap_s=None,
                      fence=12)
    LaneTask._mark_running(LaneTask(), rt, ctx2)
    assert store.read_run("X").running_task_id == "T-next" and not ctx2.lost.is_set()
