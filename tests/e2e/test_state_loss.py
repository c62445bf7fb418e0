"""Safety when Redis loses its state, and lost runs, with real processes (issue 10).

The state Redis here is a private redis-server that the tests restart empty (it keeps
nothing on disk, like the machine's own); the broker stays on the end-to-end database, so
only the scheduler's state is lost.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from schedproj.devtools.redis_server import RedisServer
from schedproj.store.lane_store import LaneStore
from schedproj.store.protocol import Keys
from tests.conftest import E2E_REDIS_URL
from tests.procs import FAST_SETTINGS, Cluster, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

PREFIX = "schedproj"
KEYS = Keys(PREFIX)


@pytest.fixture
def state(tmp_path: Path) -> Iterator[RedisServer]:
    proc = RedisServer(tmp_path, "state")
    proc.start()
    yield proc
    proc.kill()


def client(proc: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(proc.url, decode_responses=True, socket_timeout=2)


def cluster(tmp_path: Path, state: RedisServer, scenario: str, **extra: str) -> Cluster:
    env = dict(os.environ)
    env.update(FAST_SETTINGS)
    env.update({"CELERY_BROKER_URL": E2E_REDIS_URL, "SCHEDPROJ_REDIS_URL": state.url,
                "SCHEDPROJ_KEY_PREFIX": PREFIX, "E2E_SCENARIO": scenario,
                "PYTHONPATH": str(Path(__file__).resolve().parents[2]), **extra})
    LaneStore(client(state), KEYS).declare_fresh()
    return Cluster(env=env, logdir=tmp_path)


def journal(proc: RedisServer) -> list[dict]:
    return [json.loads(x) for x in client(proc).lrange(KEYS.journal, 0, -1)]


def heavy_intervals(proc: RedisServer) -> list[tuple[float, float | None, str]]:
    starts = {e["task"]: e for e in journal(proc) if e["ev"] == "start" and e["fence"] > 0}
    ends = {e["task"]: e["t"] for e in journal(proc) if e["ev"] == "end"}
    return sorted((s["t"], ends.get(t), t) for t, s in starts.items())


def test_redis_restarting_empty_mid_run_grants_no_second_lease(
        e2e_redis: redis.Redis, tmp_path: Path, state: RedisServer) -> None:
    """Found #1: Redis restarts empty while a heavy run holds the lease, down far less than a
    TTL. The holder re-asserts its lease at its next renewal; beat waits out the quarantine;
    no second heavy run starts while the first runs."""
    c = cluster(tmp_path, state, "slow", SCHEDPROJ_HOLD_CAP_S="60", SCHEDPROJ_LEASE_TTL_S="3")
    try:
        workers = [c.worker("heavy1", "heavy"), c.worker("heavy2", "heavy")]
        beat = c.beat("beat1")
        started = f"{PREFIX}:e2e:started"
        wait_for(lambda: client(state).llen(started) >= 1, 30, "the long heavy lane started")
        first = json.loads(client(state).lindex(started, 0))
        time.sleep(0.5)
        state.kill()
        time.sleep(0.2)
        state.start()
        wait_for(lambda: any("re-asserted it" in w.text() for w in workers), 10,
                 "the holder re-asserted its lease")
        wait_for(lambda: "state loss" in beat.text(), 10, "beat noticed the state loss")
        wait_for(lambda: any(e["ev"] == "end" and e["fence"] == first["fence"]
                             for e in journal(state)), 20, "the first run ended")
        time.sleep(2)
    finally:
        c.stop_all()
    # The first run's start was lost with Redis; its end, and every start after the loss, are
    # in the journal: no heavy run may have started before the first one ended.
    entries = journal(state)
    first_end = next(e["t"] for e in entries if e["ev"] == "end"
                     and e["fence"] == first["fence"])
    early = [e for e in entries if e["ev"] == "start" and e["fence"] > 0
             and e["t"] < first_end]
    assert not early, f"a heavy run started while the first still ran: {early}"
    assert any(e["ev"] == "end" and e["fence"] == first["fence"] and e["outcome"] == "completed"
               for e in entries), "the re-asserted run should finish normally"


def test_killed_holder_is_recorded_lost_and_a_restarted_worker_frees_its_lease(
        e2e_redis: redis.Redis, tmp_path: Path, state: RedisServer) -> None:
    """Found #9: a run killed with its worker is recorded as outcome ``lost`` (a failure), and
    a heavy worker restarted on the same node frees the dead run's lease at once instead of
    waiting out the lease TTL (30 s here)."""
    c = cluster(tmp_path, state, "slow", SCHEDPROJ_HOLD_CAP_S="60", SCHEDPROJ_LEASE_TTL_S="30")
    try:
        victim = c.worker("heavy1", "heavy")
        c.beat("beat1")
        started = f"{PREFIX}:e2e:started"
        wait_for(lambda: client(state).llen(started) >= 1, 30, "the long heavy lane started")
        first = json.loads(client(state).lindex(started, 0))
        victim.signal(signal.SIGKILL)
        victim.popen.wait()
        killed_at = time.time()
        c.worker("heavy1", "heavy")  # the same node name, restarted
        wait_for(lambda: client(state).llen(started) >= 2, 20,
                 "the lane ran again well before the 30 s TTL")
        resumed_s = time.time() - killed_at
        wait_for(lambda: any(e["ev"] == "lost" for e in journal(state)), 10,
                 "the killed run recorded lost")
    finally:
        c.stop_all()
    assert resumed_s < 15, resumed_s
    second = json.loads(client(state).lindex(started, 1))
    assert second["fence"] > first["fence"]
    lost = [e for e in journal(state) if e["ev"] == "lost"]
    assert lost and lost[0]["lane"] == "e2e.long"
    counters = client(state).hgetall(KEYS.counters)
    assert int(counters.get("lost|e2e.long", 0)) >= 1
