"""End to end with real processes: ``celery beat -S fair``, ``worker -Q heavy -c 1``,
``worker -Q light``, on real Redis, with cadences of seconds."""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from schedproj.store.protocol import Keys
from tests.conftest import E2E_REDIS_URL
from tests.procs import FAST_SETTINGS, Cluster, wait_for
from tests.rabbitmq import Broker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

#: For tests whose subject lives on Redis (the beat lock, the lease and its start deadline):
#: RabbitMQ's run of them is slow, kept out of the default run's 20-minute budget; the default
#: run still takes RabbitMQ through fair sharing and a killed heavy worker here, and through
#: the start deadline as an AMQP expiration in tests/e2e/test_rabbitmq.py.
REDIS_FIRST = pytest.mark.parametrize(
    "e2e_broker", ["redis", pytest.param("amqp", marks=pytest.mark.slow)], indirect=True)

PREFIX = "schedproj"
KEYS = Keys(PREFIX)


@pytest.fixture
def r(e2e_redis: redis.Redis) -> redis.Redis:
    return e2e_redis


def make_cluster(tmp_path: Path, scenario: str, broker: Broker | None = None,
                 **extra: str) -> Cluster:
    """Processes on the e2e Redis (state, lease and, unless ``broker`` says otherwise, the
    broker)."""
    env = dict(os.environ)
    env.update(FAST_SETTINGS)
    env.update({
        "CELERY_BROKER_URL": E2E_REDIS_URL,
        "SCHEDPROJ_REDIS_URL": E2E_REDIS_URL,
        "SCHEDPROJ_KEY_PREFIX": PREFIX,
        "E2E_SCENARIO": scenario,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    })
    if broker is not None:
        env.update(broker.env)
    env.update(extra)
    return Cluster(env=env, logdir=tmp_path)


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[list[Cluster]]:
    made: list[Cluster] = []
    yield made
    for cluster in made:
        cluster.stop_all()


def runs(r: redis.Redis) -> list[dict]:
    return [json.loads(x) for x in r.lrange(f"{PREFIX}:e2e:runs", 0, -1)]


def heavy_runs(r: redis.Redis) -> list[dict]:
    return sorted((x for x in runs(r) if x["fence"] > 0), key=lambda x: x["start"])


def assert_no_overlap(intervals: list[dict]) -> None:
    for before, after in itertools.pairwise(intervals):
        assert after["start"] >= before["end"], f"heavy runs overlap: {before} and {after}"
        assert after["fence"] > before["fence"], f"fence did not increase: {before} {after}"


def test_fair_sharing_yield_and_light_lanes(r: redis.Redis, e2e_broker: Broker, tmp_path: Path,
                                            cluster_factory: list[Cluster]) -> None:
    """A backlog lane yields at the hold cap, the starved lane wins next, heavy runs never
    overlap, and the light lane keeps running while heavy lanes hold the lease."""
    r.set(f"{PREFIX}:e2e:backlog", 60)  # 60 items x 0.1 s = 6 s of heavy work, cap 1.5 s
    c = make_cluster(tmp_path, "fairness", e2e_broker)
    cluster_factory.append(c)
    c.worker("heavy1", "heavy")
    c.worker("light1", "light", concurrency=2)
    c.beat("beat1")
    wait_for(lambda: int(r.get(f"{PREFIX}:e2e:backlog") or 0) <= 0, 40, "backlog drained")
    time.sleep(2)

    heavy = heavy_runs(r)
    assert_no_overlap(heavy)
    backlog = [x for x in heavy if x["lane"] == "e2e.backlog"]
    yielded = [x for x in backlog if x["left"] > 0]
    assert len(yielded) >= 3, f"the backlog lane should have yielded at the cap: {backlog}"
    for run in yielded:
        # Hold cap 1.5 s plus one 0.1 s item and scheduling slack.
        assert run["end"] - run["start"] < 1.5 + 0.6, run
    # The backlog never monopolized the lease: the starved lane ran while backlog was left.
    first_yield, last_yield = yielded[0]["start"], yielded[-1]["start"]
    starved_between = [x for x in heavy if x["lane"] == "e2e.starved"
                        and first_yield < x["start"] < last_yield]
    assert starved_between, f"e2e.starved never ran while the backlog drained: {heavy}"

    light = sorted((x for x in runs(r) if x["lane"] == "e2e.light"), key=lambda x: x["start"])
    during_heavy = [x for x in light
                    if any(h["start"] < x["start"] < h["end"] for h in heavy)]
    assert during_heavy, "no light run started while a heavy lane held the lease"
    gaps = [b["start"] - a["start"] for a, b in itertools.pairwise(light)]
    # Cadence 1 s; a light lane is dispatched in the tick it falls due (loop 0.5 s).
    assert max(gaps) < 1.0 + 0.5 + 0.75, f"light lane delayed: gaps {gaps}"

    record = json.loads(r.hget(KEYS.lanes, "e2e.backlog|run"))
    assert record["runs"] >= 4 and record["fence"] > 0
    assert "yielded" in c.procs[0].text()


@REDIS_FIRST
def test_restarting_beat_does_not_rerun_early(r: redis.Redis, e2e_broker: Broker, tmp_path: Path,
                                              cluster_factory: list[Cluster]) -> None:
    c = make_cluster(tmp_path, "restart", e2e_broker)
    cluster_factory.append(c)
    c.worker("heavy1", "heavy")
    c.worker("light1", "light")
    beat = c.beat("beat1")
    wait_for(lambda: {x["lane"] for x in runs(r)} >= {"e2e.hourly-heavy", "e2e.hourly-light"},
             20, "both hourly lanes ran once")
    beat.signal(signal.SIGTERM)
    beat.popen.wait(timeout=10)
    assert "released the beat lock" in beat.text()
    c.beat("beat2")
    time.sleep(4)  # many ticks of 0.5 s: nothing may be re-sent
    counts = {lane: sum(1 for x in runs(r) if x["lane"] == lane)
              for lane in ("e2e.hourly-heavy", "e2e.hourly-light")}
    assert counts == {"e2e.hourly-heavy": 1, "e2e.hourly-light": 1}
    assert "dispatch:" not in c.procs[-1].text()


@REDIS_FIRST
def test_second_beat_stands_by_then_takes_over(r: redis.Redis, e2e_broker: Broker, tmp_path: Path,
                                               cluster_factory: list[Cluster]) -> None:
    c = make_cluster(tmp_path, "fairness", e2e_broker)
    cluster_factory.append(c)
    c.worker("light1", "light")
    c.worker("heavy1", "heavy")
    first = c.beat("beat1")
    second = c.beat("beat2", wait_active=False)
    time.sleep(4)
    assert ": active" not in second.text()
    assert "dispatch:" not in second.text(), "the standby beat dispatched"
    assert "dispatch:" in first.text()

    first.signal(signal.SIGKILL)
    killed_at = time.time()
    wait_for(lambda: ": active" in second.text(), 10, "standby beat takes over")
    failover_s = time.time() - killed_at
    assert failover_s < 3 + 2, f"failover took {failover_s:.1f}s with a 3 s lock TTL"
    wait_for(lambda: any(x["lane"] == "e2e.light" and x["start"] > killed_at + failover_s
                         for x in runs(r)), 10, "light lane runs again after failover")


def test_killed_heavy_worker_frees_lease_and_lane_runs_again(
        r: redis.Redis, e2e_broker: Broker, tmp_path: Path, cluster_factory: list[Cluster]) -> None:
    c = make_cluster(tmp_path, "slow", e2e_broker, SCHEDPROJ_HOLD_CAP_S="60")
    cluster_factory.append(c)
    victim = c.worker("heavy1", "heavy")
    c.beat("beat1")
    started = f"{PREFIX}:e2e:started"
    wait_for(lambda: r.llen(started) >= 1, 20, "the long heavy lane started")
    first = json.loads(r.lindex(started, 0))
    assert r.exists(KEYS.lease)

    victim.signal(signal.SIGKILL)
    killed_at = time.time()
    wait_for(lambda: not r.exists(KEYS.lease) or
             json.loads(r.get(KEYS.lease) or "{}").get("fence", 0) > first["fence"],
             2 + 1.5, "the dead worker's lease to free itself within its TTL")
    freed_s = time.time() - killed_at
    assert freed_s <= 2 + 1.0, freed_s

    c.worker("heavy2", "heavy")
    wait_for(lambda: r.llen(started) >= 2, 20, "the lane picked again on a live worker")
    second = json.loads(r.lindex(started, 1))
    assert second["fence"] > first["fence"]


@REDIS_FIRST
def test_missing_heavy_worker_cannot_wedge_the_lease(r: redis.Redis, e2e_broker: Broker,
                                                     tmp_path: Path,
                                                     cluster_factory: list[Cluster]) -> None:
    """With no heavy worker, each grant lapses after the start deadline and is granted anew;
    when a worker arrives, expired messages are dropped and exactly the current one runs.
    Meanwhile a light lane slower than its cadence never runs twice at once."""
    c = make_cluster(tmp_path, "deadline", e2e_broker)
    cluster_factory.append(c)
    c.worker("light1", "light", concurrency=3)
    c.beat("beat1")

    def fence() -> int:
        raw = r.get(KEYS.lease)
        return int(json.loads(raw)["fence"]) if raw else 0

    wait_for(lambda: fence() > 0, 10, "a first heavy grant")
    first = fence()
    wait_for(lambda: fence() > first, 5 + 3, "the unstarted grant to lapse and be re-granted")
    assert not any(x["lane"] == "e2e.quick" for x in runs(r))

    c.worker("heavy1", "heavy")
    wait_for(lambda: sum(x["lane"] == "e2e.quick" for x in runs(r)) >= 3, 20,
             "the heavy lane runs once a worker is there")
    assert_no_overlap(heavy_runs(r))

    slow = sorted((x for x in runs(r) if x["lane"] == "e2e.slowlight"),
                  key=lambda x: x["start"])
    assert len(slow) >= 3
    for before, after in itertools.pairwise(slow):
        assert after["start"] >= before["end"] - 0.01, f"two runs of one light lane: {slow}"


def test_forged_or_missing_token_is_refused_and_lease_untouched(
        r: redis.Redis, tmp_path: Path, cluster_factory: list[Cluster]) -> None:
    from celery import Celery

    from schedproj.store.connection import connect
    from schedproj.store.lease import HeavyLease

    c = make_cluster(tmp_path, "deadline")
    cluster_factory.append(c)
    c.worker("heavy1", "heavy")
    lease = HeavyLease(connect(E2E_REDIS_URL), KEYS)
    grant = lease.acquire("e2e.somebody-else", "real-token", 60, time.time())
    assert grant.granted

    sender = Celery("sender", broker=E2E_REDIS_URL, set_as_current=False)
    sender.conf.task_serializer = "json"
    sender.send_task("e2e.quick", kwargs={"schedproj_lease": {"token": "forged", "fence": 999}},
                     queue="heavy")
    sender.send_task("e2e.quick", queue="heavy")

    def reasons() -> str:
        return c.procs[0].text()

    # The forged grant carries no beat fence: refused before the lease is even looked at.
    wait_for(lambda: "missing-beat-fence" in reasons() and "missing-lease-token" in reasons(),
             15, "both messages refused")
    assert not any(x["lane"] == "e2e.quick" for x in runs(r)), "a refused run executed"
    current = lease.read()
    assert current is not None and current.token == "real-token" and current.fence == grant.fence
    record = json.loads(r.hget(KEYS.lanes, "e2e.quick|run"))
    assert record["last_outcome"] == "skipped"
    assert record.get("runs", 0) == 0  # nothing ran


def test_hard_time_limit_releases_lease_and_records_failure(
        r: redis.Redis, tmp_path: Path, cluster_factory: list[Cluster]) -> None:
    """A run that ignores its soft limit is killed at the hard limit; the worker's main
    process records the failure and releases the lease at once (not after its TTL)."""
    c = make_cluster(tmp_path, "hang", SCHEDPROJ_LEASE_TTL_S="30")
    cluster_factory.append(c)
    c.worker("heavy1", "heavy")
    c.beat("beat1")
    wait_for(lambda: r.llen(f"{PREFIX}:e2e:started") >= 1, 20, "the hanging lane started")
    started = time.time()
    wait_for(lambda: not r.exists(KEYS.lease), 10, "the lease released after the hard limit")
    assert time.time() - started < 10, "lease waited for its 30 s TTL instead"
    record = json.loads(r.hget(KEYS.lanes, "e2e.hang|run"))
    assert record["last_outcome"] == "failed"
    # Billiard ends the pool process with SystemExit (recorded by the run itself); had it been
    # killed outright, LaneTask.on_failure records TimeLimitExceeded from the main process.
    assert any(k in record["last_reason"] for k in ("TimeLimitExceeded", "SystemExit"))
    assert "Hard time limit" in c.procs[0].text()
    # (A cleared in-flight mark is left out of the record since f22a769: absent reads null.)
    assert record["failures"] == 1 and record.get("running_task_id") is None


def test_gated_lane_runs_right_after_its_blocker_finishes(
        r: redis.Redis, tmp_path: Path, cluster_factory: list[Cluster]) -> None:
    """The consumer is due from the start but deferred while the producer is due or running;
    the producer's finish wakes beat, which dispatches the consumer at once (well inside one
    0.5 s loop interval)."""
    c = make_cluster(tmp_path, "gate")
    cluster_factory.append(c)
    c.worker("heavy1", "heavy")
    c.worker("light1", "light")
    beat = c.beat("beat1")
    wait_for(lambda: sum(x["lane"] == "e2e.consumer" for x in runs(r)) >= 2, 30,
             "two consumer runs")
    producer = [x for x in runs(r) if x["lane"] == "e2e.producer"]
    consumer = sorted((x for x in runs(r) if x["lane"] == "e2e.consumer"),
                      key=lambda x: x["start"])
    first = consumer[0]
    blocker = next(p for p in producer if p["end"] <= first["start"])
    assert first["start"] - blocker["end"] < 0.3, (blocker, first)
    for p in producer:
        assert not any(p["start"] < x["start"] < p["end"] for x in consumer), \
            "the consumer ran while its blocker was running"
    assert ("lane e2e.consumer deferred: golden-path-dependency-backpressure "
            "(blocker e2e.producer)") in beat.text()


def test_a_fleet_mid_way_through_turning_compact_records_on(
        r: redis.Redis, tmp_path: Path, cluster_factory: list[Cluster]) -> None:
    """SCHEDPROJ_COMPACT_RECORDS on for beat and the heavy worker, still off for the light
    worker (a rollout half done): the lanes run as ever, heavy runs never overlap, and every
    record decodes, in the format of the process that wrote it."""
    from schedproj.core.records import (
        COMPACT_FORMAT,
        LONG_FORMAT,
        RunRecord,
        SchedRecord,
        decode_with_format,
    )
    r.set(f"{PREFIX}:e2e:backlog", 30)  # 3 s of heavy work, cap 1.5 s: it yields
    c = make_cluster(tmp_path, "fairness")
    cluster_factory.append(c)
    c.env["SCHEDPROJ_COMPACT_RECORDS"] = "1"
    c.worker("heavy1", "heavy")
    c.beat("beat1")
    c.env["SCHEDPROJ_COMPACT_RECORDS"] = "0"
    c.worker("light1", "light", concurrency=2)
    wait_for(lambda: int(r.get(f"{PREFIX}:e2e:backlog") or 0) <= 0, 40, "backlog drained")
    wait_for(lambda: sum(x["lane"] == "e2e.light" for x in runs(r)) >= 3, 20, "light runs")
    assert_no_overlap(heavy_runs(r))
    assert not r.hgetall(KEYS.errors), r.hgetall(KEYS.errors)

    def stored(field: str, cls: type) -> tuple[int, object]:
        return decode_with_format(cls, r.hget(KEYS.lanes, field), field)

    version, backlog = stored("e2e.backlog|run", RunRecord)
    assert version == COMPACT_FORMAT and backlog.runs >= 2 and backlog.fence > 0
    version, light = stored("e2e.light|run", RunRecord)
    assert version == LONG_FORMAT and light.runs >= 3 and light.failures == 0
    assert stored("e2e.light|sched", SchedRecord)[0] == COMPACT_FORMAT
