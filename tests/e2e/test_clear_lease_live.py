"""``schedproj clear-lease`` against real workers and beat (issue 19: 1).

The finding: with the holder on a busy ``-P solo`` worker (it cannot answer ``inspect`` while
its task runs), the light worker answered, the lease was cleared, and beat dispatched the same
heavy lane again 20 ms later: two runs at once. Here the holder is such a worker, a light
worker answers beside it, and no second run may ever overlap the first.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from schedproj.store.lease import HeavyLease
from schedproj.store.protocol import Keys
from tests.conftest import E2E_REDIS_URL
from tests.procs import FAST_SETTINGS, Cluster, Proc, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "schedproj"
LANE = "e2e.clear-long"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    # The holder's run (0.5 s steps) must outlast every clear-lease call made while it runs,
    # each a Python start and an inspect timeout: 400 steps, with the hold cap beyond them.
    env = {**os.environ, **FAST_SETTINGS, "SCHEDPROJ_HOLD_CAP_S": "300", "E2E_CLEAR_STEPS": "400",
           "CELERY_BROKER_URL": E2E_REDIS_URL, "SCHEDPROJ_REDIS_URL": E2E_REDIS_URL,
           "SCHEDPROJ_KEY_PREFIX": PREFIX, "E2E_SCENARIO": "clear-lease",
           "PYTHONPATH": str(ROOT)}
    c = Cluster(env=env, logdir=tmp_path)
    yield c
    # A holder still in its 400-step run would hold a worker's warm shutdown (SIGTERM) for
    # the whole default 10 s; what this test checks was over by then.
    c.stop_all(timeout_s=2.0)


def heavy_worker(cluster: Cluster, name: str, *pool: str) -> Proc:
    proc = cluster.start(name, "worker", "-Q", "heavy", *pool, "-n", f"{name}@%h",
                         "--without-gossip", "--without-mingle", "--without-heartbeat",
                         "-l", "info")
    wait_for(lambda: "ready." in proc.text() or not proc.alive(), 30, f"{name} ready")
    assert proc.alive(), proc.text()
    return proc


def clear_lease(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "schedproj.ops.cli", "clear-lease",
                           "--timeout", "1", *args], cwd=ROOT, env=cluster.env,
                          capture_output=True, text=True, timeout=90)


def held_on(lease: HeavyLease, node: str) -> Any:
    """Wait until a run of the long lane holds the lease, started on ``node``."""
    found: list[Any] = []

    def started() -> bool:
        current = lease.read()
        if current is not None and current.started_at is not None \
                and (current.node or "").startswith(f"{node}@"):
            found.append(current)
            return True
        return False
    wait_for(started, 40, f"the long lane running on {node}")
    return found[-1]


def runs(r: redis.Redis) -> list[tuple[float, float, int]]:
    """Every run of the long lane as (start, end, fence); a run still going ends now."""
    ends = {json.loads(x)["fence"]: json.loads(x)["end"]
            for x in r.lrange(f"{PREFIX}:e2e:runs", 0, -1)}
    started = [json.loads(x) for x in r.lrange(f"{PREFIX}:e2e:started", 0, -1)]
    return sorted((s["start"], ends.get(s["fence"], time.time()), s["fence"]) for s in started)


def assert_no_overlap(r: redis.Redis) -> None:
    spans = runs(r)
    for (_, end, fence), (start, _, later) in itertools.pairwise(spans):
        assert start >= end, f"run {later} started while run {fence} still ran: {spans}"


def test_a_solo_holder_is_never_cut_off_and_stop_ends_it_cleanly(
        e2e_redis: redis.Redis, cluster: Cluster) -> None:
    heavy_worker(cluster, "heavyS", "-P", "solo")
    cluster.worker("light1", "light")
    cluster.beat("beat1")
    lease = HeavyLease(e2e_redis, Keys(PREFIX))
    holder = held_on(lease, "heavyS")

    refused = clear_lease(cluster)
    assert refused.returncode != 0, refused.stdout + refused.stderr
    assert "heavyS@" in refused.stderr and "--stop" in refused.stderr, refused.stderr
    current = lease.read()
    assert current is not None and current.token == holder.token, "the holder was cut off"
    # The --terminate of a busy solo worker cannot be confirmed: refused too, nothing freed.
    unconfirmed = clear_lease(cluster, "--terminate", "--wait", "5")
    assert unconfirmed.returncode != 0 and "did not confirm" in unconfirmed.stderr
    time.sleep(2.0)  # beat ticks every 0.5 s: a cleared lease would be granted again by now
    current = lease.read()
    assert current is not None and current.token == holder.token
    assert len(runs(e2e_redis)) == 1, "a second run started"

    stopped = clear_lease(cluster, "--stop", "--wait", "30")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "yielded" in stopped.stdout
    record = json.loads(e2e_redis.hget(f"{PREFIX}:lanes", f"{LANE}|run"))
    assert record["last_task_id"] == holder.task_id
    assert (record["last_outcome"], record["last_reason"]) == ("yielded", "operator-stop")
    assert_no_overlap(e2e_redis)


def test_terminate_frees_the_lease_only_after_the_holder_process_stopped(
        e2e_redis: redis.Redis, cluster: Cluster) -> None:
    heavy_worker(cluster, "heavyP", "-c", "1")
    cluster.worker("light1", "light")
    cluster.beat("beat1")
    lease = HeavyLease(e2e_redis, Keys(PREFIX))
    holder = held_on(lease, "heavyP")
    assert holder.pid

    done = clear_lease(cluster, "--terminate", "--wait", "30")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "confirmed" in done.stdout
    current = lease.read()
    assert current is None or current.token != holder.token
    # By the time the lease was free, the run had stopped: its own end is journaled (the
    # SIGTERM interrupted its body, which ended the run and released the lease by token), or
    # its process is gone (killed outright: the lease then expired with its renewals).
    ended = [x for x in map(json.loads, e2e_redis.lrange(f"{PREFIX}:journal", 0, -1))
             if x.get("task") == holder.task_id and x["ev"] != "start"]
    if not ended:
        with pytest.raises(ProcessLookupError):
            os.kill(holder.pid, 0)
    started = [json.loads(x) for x in e2e_redis.lrange(f"{PREFIX}:e2e:started", 0, -1)]
    assert started[0]["pid"] == holder.pid
    assert not [x for x in ended if x["ev"] == "lost"], ended
    assert_no_overlap(e2e_redis)
    # Its end is recorded by the run itself as it was terminated (SIGTERM in a prefork child:
    # failed), or, had it died without a word, by beat as cleared: never as lost.
    record = json.loads(e2e_redis.hget(f"{PREFIX}:lanes", f"{LANE}|run"))
    assert record["last_task_id"] == holder.task_id
    assert record["last_outcome"] == "failed" or record["last_reason"].startswith("cleared")


def test_a_pool_slot_is_cleared_by_the_same_rules(e2e_redis: redis.Redis,
                                                   cluster: Cluster) -> None:
    """``--pool gpu --slot I``: a busy solo holder of a gpu slot is never cut off; a slot out
    of range names the declared pools; ``--stop`` ends the holder at a checkpoint."""
    cluster.env.update({"SCHEDPROJ_LANE_MODULES": "tests.pool_clear_e2e",
                        "SCHEDPROJ_POOLS": "gpu=2"})
    worker = cluster.start("gpuS", "worker", "-Q", "gpu", "-P", "solo", "-n", "gpuS@%h",
                           "--without-gossip", "--without-mingle", "--without-heartbeat",
                           "-l", "info")
    wait_for(lambda: "ready." in worker.text() or not worker.alive(), 30, "gpuS ready")
    cluster.beat("beat1")
    slots = [HeavyLease(e2e_redis, Keys(PREFIX).slot("gpu", i)) for i in range(2)]
    found: list[tuple[int, Any]] = []

    def started() -> bool:
        found[:] = [(i, x) for i, lease in enumerate(slots) for x in [lease.read()]
                    if x is not None and x.started_at is not None]
        return bool(found)
    wait_for(started, 40, "the pool lane running on a gpu slot")
    slot, holder = found[0]
    assert (holder.lane, (holder.node or "").split("@")[0]) == ("e2e.pool-long", "gpuS")
    where = ["--pool", "gpu", "--slot", str(slot)]

    refused = clear_lease(cluster, *where)
    assert refused.returncode != 0, refused.stdout + refused.stderr
    assert f"holds slot {slot} of pool gpu" in refused.stderr, refused.stderr
    assert f"clear-lease --pool gpu --slot {slot} --stop" in refused.stderr, refused.stderr
    wrong = clear_lease(cluster, "--pool", "gpu", "--slot", "2")
    assert wrong.returncode != 0 and "pool gpu has 2 slots (0 to 1)" in wrong.stderr
    assert "heavy (1 slot), gpu (2 slots)" in wrong.stderr, wrong.stderr
    current = slots[slot].read()
    assert current is not None and current.token == holder.token, "the holder was cut off"

    stopped = clear_lease(cluster, *where, "--stop", "--wait", "30")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert f"yielded; slot {slot} of pool gpu is free" in stopped.stdout
    record = json.loads(e2e_redis.hget(f"{PREFIX}:lanes", "e2e.pool-long|run"))
    assert record["last_task_id"] == holder.task_id
    assert (record["last_outcome"], record["last_reason"]) == ("yielded", "operator-stop")
    assert_no_overlap(e2e_redis)
