"""Pools end to end with real processes: ``celery beat -S fair``, three ``worker -Q gpu -c 1``
for a pool ``gpu`` of two slots (``SCHEDPROJ_POOLS=gpu=2``) and two ``worker -Q heavy -c 1``
for the default pool beside it, on real Redis. Exclusion is checked by OS-level locks, not by
what schedproj says: each run takes its pool's slot files (tests/pools_e2e.py), and a run that
cannot take the files it needs is an overlap."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from schedproj.store.protocol import Keys
from tests.conftest import E2E_REDIS_URL
from tests.procs import FAST_SETTINGS, Cluster, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PREFIX = "schedproj"
KEYS = Keys(PREFIX)
#: How long the pools run once every process is up (seconds).
RUN_S = 12.0


@pytest.fixture
def cluster(tmp_path: Path, e2e_redis: redis.Redis) -> Iterator[Cluster]:
    env = dict(os.environ)
    env.update(FAST_SETTINGS)
    locks = tmp_path / "locks"
    locks.mkdir()
    env.update({
        "CELERY_BROKER_URL": E2E_REDIS_URL, "SCHEDPROJ_REDIS_URL": E2E_REDIS_URL,
        "SCHEDPROJ_KEY_PREFIX": PREFIX, "SCHEDPROJ_LANE_MODULES": "tests.pools_e2e",
        "SCHEDPROJ_POOLS": "gpu=2", "E2E_LOCK_DIR": str(locks),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    })
    c = Cluster(env=env, logdir=tmp_path)
    yield c
    c.stop_all()


def most_at_once(runs: list[dict]) -> int:
    """The most slots the runs held at one instant (a run taking k slots counts k)."""
    events = sorted([(r["start"], r["slots"]) for r in runs]
                    + [(r["end"], -r["slots"]) for r in runs])  # an end sorts before a start
    held = most = 0
    for _, change in events:
        held += change
        most = max(most, held)
    return most


def test_a_pool_of_two_beside_the_default_pool(cluster: Cluster, e2e_redis: redis.Redis
                                               ) -> None:
    workers = [cluster.start(f"gpu{n}", "worker", "-Q", "gpu", "-c", "1", "-n", f"gpu{n}@%h",
                             "--without-gossip", "--without-mingle", "--without-heartbeat",
                             "-l", "info") for n in range(3)]
    workers += [cluster.start(f"heavy{n}", "worker", "-Q", "heavy", "-c", "1", "-n",
                              f"heavy{n}@%h", "--without-gossip", "--without-mingle",
                              "--without-heartbeat", "-l", "info") for n in range(2)]
    for proc in workers:
        wait_for(lambda p=proc: "ready." in p.text() or not p.alive(), 40, "a worker ready")
        assert proc.alive(), proc.text()
    beat = cluster.beat("beat")
    time.sleep(RUN_S)
    beat.signal(15)  # no new grants; the runs under way finish
    time.sleep(1.5)

    runs = [json.loads(x) for x in e2e_redis.lrange(f"{PREFIX}:e2e:pool-runs", 0, -1)]
    gpu = [r for r in runs if r["pool"] == "gpu"]
    heavy = [r for r in runs if r["pool"] == "heavy"]
    overlaps = [r for r in runs if r["overlap"]]
    say = (f"{len(gpu)} gpu runs, {len(heavy)} heavy runs, overlaps {overlaps}; beat log:\n"
           + beat.text()[-3000:])
    assert overlaps == [], say
    assert most_at_once(gpu) <= 2, say
    assert most_at_once(heavy) <= 1, say
    # The pool was used as a pool: both slot files, two runs at once, every lane served.
    assert {f for r in gpu for f in r["files"]} == {"gpu-0.lock", "gpu-1.lock"}, say
    assert most_at_once(gpu) == 2, say
    assert {r["lane"] for r in gpu} == {*(f"e2e.gpu.{n}" for n in range(4)), "e2e.gpu.both"}
    assert {r["lane"] for r in heavy} == {"e2e.heavy.0", "e2e.heavy.1"}, say
    # Every pool message went to the pool's queue with its slots, each slot of the pool used.
    sent = [json.loads(x) for x in e2e_redis.lrange(KEYS.dispatch_log, 0, -1)]
    pooled = [e for e in sent if e.get("pool") == "gpu"]
    assert {s for e in pooled for s in e["slots"]} == {0, 1}, say
    assert all("pool" not in e for e in sent if e.get("lane", "").startswith("e2e.heavy"))
    assert all(len(e["slots"]) == 2 for e in pooled if e["lane"] == "e2e.gpu.both")
    # Three workers served the pool; nothing ran twice, nothing was refused as stale.
    journal = [json.loads(x) for x in e2e_redis.lrange(KEYS.journal, 0, -1)]
    starts = [j for j in journal if j["ev"] == "start" and j["lane"].startswith("e2e.gpu")]
    assert len({j["task"] for j in starts}) == len(starts), say
    assert len({j["pid"] for j in starts}) >= 2, say
    skips = {k: v for k, v in e2e_redis.hgetall(KEYS.counters).items()
             if k.startswith("skips|")}
    assert skips == {}, say
