"""A heavy run's start and end on the hand-off's path (issue 23: 3): the start marks the run
record in the lease start's call when the record is the one this process last wrote, else by
one compare and set on the record that call returned; either way the record is marked running
before the body, the journal holds one start and one end per run, in order, and a newer run's
record fences the start out. The lease renewer is stopped without a join: the end waits for a
renewal in progress, never for the thread to wake."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import Celery

from schedproj import Lane, LaneTask
from schedproj.core.records import RunRecord, encode
from schedproj.on_celery.keepalive import LeaseRenewer
from schedproj.on_celery.messages import heavy_kwargs
from schedproj.on_celery.run_context import RunContext, current_run
from schedproj.on_celery.runtime import runtime_for
from schedproj.store.lane_store import LaneStore
from schedproj.store.lease import HeavyLease, Renewal
from schedproj.store.protocol import Keys, run_field
from tests.conftest import make_app

pytestmark = pytest.mark.timeout(60)

LANE = "h.compact"


def heavy_app(prefix: str, seen: list[RunRecord]) -> Celery:
    def declare(app: Celery) -> None:
        @app.task(shared=False, base=LaneTask, name=LANE, lane=Lane(cadence_s=60))
        def compact() -> None:
            rt = runtime_for(app)
            seen.append(rt.store.read_run(LANE))  # what beat would read mid-run

    return make_app(prefix, declare)


def run_once(app: Celery, client: redis.Redis, keys: Keys, task_id: str) -> int:
    """Grant as beat would, then run the message in this process; the grant's fence."""
    grant = HeavyLease(client, keys).acquire(LANE, f"tok-{task_id}", 30, time.time(),
                                             task_id=task_id)
    assert grant.granted
    task = app.tasks[LANE]
    task.push_request(id=task_id)
    try:
        task(**heavy_kwargs(f"tok-{task_id}", grant.fence, 7))
    finally:
        task.pop_request()
    return grant.fence


def journal(client: redis.Redis, keys: Keys) -> list[tuple[str, str, int]]:
    return [(e["ev"], e["task"], e["fence"])
            for e in map(json.loads, client.lrange(keys.journal, 0, -1))]


@pytest.fixture
def cas_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The compare-and-set writes of run records made apart from the lease start."""
    calls: list[str] = []
    original = LaneStore.cas_run

    def spy(self: LaneStore, lane: str, *args: Any, **kwargs: Any) -> tuple[bool, str]:
        calls.append(lane)
        return original(self, lane, *args, **kwargs)

    monkeypatch.setattr(LaneStore, "cas_run", spy)
    return calls


def test_the_second_start_marks_the_record_in_the_lease_starts_call(
        key_prefix: str, redis_client: redis.Redis, cas_calls: list[str]) -> None:
    seen: list[RunRecord] = []
    app, keys = heavy_app(key_prefix, seen), Keys(key_prefix)
    redis_client.set(keys.beat_fence, 7)
    fences = [run_once(app, redis_client, keys, f"run-{i}") for i in range(3)]
    # The first start knew no record (one compare and set); the next two expected the one
    # the previous run's end wrote here, and marked it in the lease start's call.
    assert cas_calls == [LANE]
    assert [(r.running_task_id, r.fence) for r in seen] == [
        (f"run-{i}", fence) for i, fence in enumerate(fences)]
    record = runtime_for(app).store.read_run(LANE)
    assert (record.runs, record.last_task_id, record.fence) == (3, "run-2", fences[-1])
    assert journal(redis_client, keys) == [
        (ev, f"run-{i}", fence) for i, fence in enumerate(fences) for ev in ("start", "end")]


def test_a_record_written_elsewhere_meanwhile_costs_one_compare_and_set(
        key_prefix: str, redis_client: redis.Redis, cas_calls: list[str]) -> None:
    seen: list[RunRecord] = []
    app, keys = heavy_app(key_prefix, seen), Keys(key_prefix)
    redis_client.set(keys.beat_fence, 7)
    run_once(app, redis_client, keys, "run-0")
    # Another writer (beat recording a run lost, an operator) changes the record.
    other = RunRecord(runs=41, last_task_id="elsewhere", fence=1)
    redis_client.hset(keys.lanes, run_field(LANE), encode(other))
    fence = run_once(app, redis_client, keys, "run-1")
    assert cas_calls == [LANE, LANE]
    assert (seen[-1].running_task_id, seen[-1].runs) == ("run-1", 41)
    record = runtime_for(app).store.read_run(LANE)
    assert (record.runs, record.last_task_id, record.fence) == (42, "run-1", fence)
    assert journal(redis_client, keys)[-2:] == [("start", "run-1", fence),
                                                ("end", "run-1", fence)]


def test_a_newer_runs_record_fences_the_start_out(
        key_prefix: str, redis_client: redis.Redis, cas_calls: list[str]) -> None:
    seen: list[RunRecord] = []
    app, keys = heavy_app(key_prefix, seen), Keys(key_prefix)
    redis_client.set(keys.beat_fence, 7)
    run_once(app, redis_client, keys, "run-0")
    lost: list[bool] = []
    newer = RunRecord(running_task_id="newer", fence=2 ** 52)
    redis_client.hset(keys.lanes, run_field(LANE), encode(newer))
    original = app.tasks[LANE].run

    def body() -> None:
        run = current_run()
        lost.append(run is not None and run.lost.is_set())
        original()

    app.tasks[LANE].run = body
    fence = run_once(app, redis_client, keys, "run-1")
    assert lost == [True], "a run whose record a newer run owns must stop at its checkpoint"
    stored = runtime_for(app).store.read_run(LANE)
    assert stored.running_task_id == "newer" and stored.fence == 2 ** 52
    assert journal(redis_client, keys)[-2][:2] == ("start", "run-1")
    assert journal(redis_client, keys)[-2][2] == fence


class SlowLease:
    """A lease whose renewal takes ``delay_s`` and notes when it landed."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.started = threading.Event()
        self.landed: list[float] = []

    def renew(self, *args: Any, **kwargs: Any) -> Renewal:
        self.started.set()
        time.sleep(self.delay_s)
        self.landed.append(time.monotonic())
        return Renewal(True, "")

    def request(self) -> None:
        return None


def renewer(lease: SlowLease, ttl_s: float) -> LeaseRenewer:
    rt = SimpleNamespace(settings=SimpleNamespace(lease_ttl_s=ttl_s, max_hold_s=60,
                                                  pressure_rule=None, policy=None),
                         lease=lease, keys=Keys("t"))
    ctx = RunContext(lane="big", task_id="run-1", started_at=time.time(), hold_cap_s=3600)
    return LeaseRenewer(rt, "tok", ctx, lease=lease)  # type: ignore[arg-type]


def test_the_end_waits_for_a_renewal_in_progress() -> None:
    lease = SlowLease(0.3)
    r = renewer(lease, ttl_s=0.15)  # a renewal every 50 ms
    r.start()
    assert lease.started.wait(5)
    r.finish(5.0)
    ended = time.monotonic()
    assert lease.landed and lease.landed[0] <= ended, "the outcome came before the refresh"
    count = len(lease.landed)
    time.sleep(0.2)
    assert len(lease.landed) == count, "a renewal started after the end"


def test_the_end_does_not_wait_for_the_renewer_to_wake() -> None:
    lease = SlowLease(0.0)
    r = renewer(lease, ttl_s=30.0)  # the thread sleeps 10 s between renewals
    r.start()
    r.finish(30.0)  # no renewal in progress: nothing to wait for
    assert lease.landed == []
    r.join(5)
    assert not r.is_alive()


class BlockingLease(SlowLease):
    """A lease whose renewal blocks until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__(0.0)
        self.release = threading.Event()
        self.threads: list[int] = []

    def renew(self, *args: Any, **kwargs: Any) -> Renewal:
        self.threads.append(threading.get_ident())
        self.started.set()
        self.release.wait(10)
        return Renewal(True, "")


def test_renewers_of_runs_at_once_each_renew_on_a_thread_of_their_own() -> None:
    # Kept threads must never make one run's renewal wait behind another's (a pool worker
    # runs several at once): the second renews while the first's renewal is blocked.
    first, second = BlockingLease(), BlockingLease()
    a, b = renewer(first, ttl_s=0.03), renewer(second, ttl_s=0.03)  # type: ignore[arg-type]
    a.start()
    assert first.started.wait(5)
    b.start()
    try:
        assert second.started.wait(5), "the second renewer waited behind the first"
        assert first.threads[0] != second.threads[0]
    finally:
        for lease, r in ((first, a), (second, b)):
            lease.release.set()
            r.finish(5.0)
            r.join(5)
    assert not a.is_alive() and not b.is_alive()


def test_the_next_renewer_runs_on_the_kept_thread_at_once() -> None:
    # A new thread's start waits for the OS to schedule it (about 1 ms on the hand-off's
    # path); the renewer of the next run is handed the thread the last one ended on.
    first, second = BlockingLease(), BlockingLease()
    first.release.set()
    second.release.set()
    a = renewer(first, ttl_s=0.03)  # type: ignore[arg-type]
    a.start()
    assert first.started.wait(5)
    a.finish(5.0)
    a.join(5)
    assert not a.is_alive()
    b = renewer(second, ttl_s=0.03)  # type: ignore[arg-type]
    b.start()
    try:
        assert second.started.wait(5)
        assert second.threads[0] == first.threads[0], "a new thread for each run"
    finally:
        b.finish(5.0)
    with pytest.raises(RuntimeError):
        b.start()


def test_a_forked_child_renews_on_threads_of_its_own() -> None:
    # Prefork's pool children are forked: the kept threads of the parent do not exist in
    # the child, so a renewer there must not be handed one (it would never renew).
    import os

    kept = SlowLease(0.0)
    a = renewer(kept, ttl_s=0.03)
    a.start()
    assert kept.started.wait(5)
    a.finish(5.0)
    a.join(5)  # the parent now keeps an idle thread
    pid = os.fork()
    if pid == 0:  # the child: exits 0 only if its renewer renewed
        code = 1
        try:
            lease = SlowLease(0.0)
            r = renewer(lease, ttl_s=0.03)
            r.start()
            code = 0 if lease.started.wait(5) else 1
            r.finish(5.0)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the forked child's renewer never renewed"
