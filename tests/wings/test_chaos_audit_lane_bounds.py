"""The chaos lane audit excuses a lane's wait only for the faults that can delay that lane: a
heavy worker killed or paused holds up the heavy lanes (and the pool's, when the driver hit the
pool's worker too), never a light lane - light lanes never wait behind heavy work
(docs/guarantees.md); beat, Redis or the due index disrupted holds up every lane. Hand-built
journals on the tests' Redis, audited by the chaos report's own ``collect``."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

from schedproj.chaos.audit import FAMILY
from schedproj.chaos.faults import Figures, fault_kinds
from schedproj.chaos.processes import PREFIX
from schedproj.chaos.report import (
    FLEET_FAULTS,
    HEAVY_WORKER_FAULTS,
    collect,
    due_bounds,
)
from schedproj.store.protocol import Keys
from tests.wings.test_chaos_audit import AuditRedis

MEMBER = f"{FAMILY}[t000]"
#: Every kind of lane: the lease's, the pool's, the light pulse and a family member.
LANES = ("chaos.h1", "chaos.g1", "chaos.pulse", MEMBER)
#: The window audited: collect starts it 15 s after the run's start, ends it at the stop.
STARTED, STOPPING = 1000.0, 1100.0


def starts(lane: str, times: list[float]) -> list[dict]:
    """A lane's runs, started and ended 0.1 s later (light fence 0; the pool's on slot 0)."""
    fence = 0 if lane in ("chaos.pulse", MEMBER) else 1
    extra = {"pool": "gpu", "slots": [0]} if lane.startswith("chaos.g") else {}
    out = []
    for i, t in enumerate(times):
        task, fence_i = f"{lane}-{i}", fence and fence + int(t * 10)
        out += [{"ev": "start", "lane": lane, "task": task, "fence": fence_i, "t": t, **extra},
                {"ev": "end", "lane": lane, "task": task, "fence": fence_i, "t": t + 0.1,
                 "outcome": "completed", "lost": None}]
    return out


def steady_except(gap: tuple[float, float]) -> list[float]:
    """A run every second of the window, none inside ``gap``: one wait of its length."""
    return [t for t in (STARTED + 15 + i for i in range(86)) if not gap[0] < t < gap[1]]


@pytest.fixture
def audit_redis(redis_client: redis.Redis, redis_url: str) -> Iterator[AuditRedis]:
    for key in redis_client.scan_iter(f"{PREFIX}:*"):
        redis_client.delete(key)
    yield AuditRedis(redis_url)
    for key in redis_client.scan_iter(f"{PREFIX}:*"):
        redis_client.delete(key)


def lost_lanes(client: redis.Redis, where: AuditRedis, journal: list[dict],
               fault: tuple[float, str, float]) -> dict[str, float]:
    """Which of :data:`LANES` the audit found waiting past their bound, with the seconds
    excused, given the ``journal`` and one fault."""
    client.delete(Keys(PREFIX).journal)
    for entry in sorted(journal, key=lambda e: e["t"]):
        client.rpush(Keys(PREFIX).journal, json.dumps(entry))
    figures = Figures()
    figures.log.append(fault)
    report = collect(where, figures, STARTED, STOPPING + 2, members=1, stopping=STOPPING)
    return {lane: excused for lane, _, _, excused in report["details"]["lost"]
            if lane in LANES}


def test_a_heavy_worker_killed_or_paused_excuses_no_light_lanes_wait(
        redis_client: redis.Redis, audit_redis: AuditRedis) -> None:
    """Every lane waited 50 s (1035 to 1085) across a heavy worker's fault of 1038-1072: 16 s
    of its own, within every bound (pulse 20 s, member 43 s, h1 21 s, g1 22 s) once the
    fault's 34 s is excused - but the light lanes' path (beat, Redis, the light worker) was
    untouched, so theirs is a wait of 50 s: past the bound. No pool run was under way, so
    the pool's worker was not hit: the pool lane is past its bound too."""
    bounds = due_bounds(1)
    gap = (1035.0, 1085.0)
    journal = [e for lane in LANES for e in starts(lane, steady_except(gap))]
    assert all(16 <= bounds[lane] < gap[1] - gap[0] for lane in LANES), bounds
    for kind in HEAVY_WORKER_FAULTS:
        lost = lost_lanes(redis_client, audit_redis, journal, (1038.0, kind, 1072.0))
        assert lost == {"chaos.pulse": 0.0, MEMBER: 0.0, "chaos.g1": 0.0}, kind


def test_a_heavy_worker_fault_excuses_the_pools_wait_when_it_hit_the_pools_worker(
        redis_client: redis.Redis, audit_redis: AuditRedis) -> None:
    """A pool run of g2 under way as the fault began (its worker SIGKILLed or SIGSTOPped with
    the holder): g1 waited behind it, excused as the lease's lanes are."""
    gap = (1035.0, 1085.0)
    journal = [e for lane in LANES for e in starts(lane, steady_except(gap))]
    under_way = [{"ev": "start", "lane": "chaos.g2", "task": "g2-open", "fence": 9, "t": 1037.0,
                  "pool": "gpu", "slots": [1]}]
    for kind in HEAVY_WORKER_FAULTS:
        lost = lost_lanes(redis_client, audit_redis, journal + under_way,
                          (1038.0, kind, 1072.0))
        assert lost == {"chaos.pulse": 0.0, MEMBER: 0.0}, kind


def test_beat_or_redis_disrupted_excuses_every_lanes_wait(
        redis_client: redis.Redis, audit_redis: AuditRedis) -> None:
    """The same waits across a fault of beat, Redis or the due index: every lane's path
    went through it, every lane's wait is 16 s of its own."""
    gap = (1035.0, 1085.0)
    journal = [e for lane in LANES for e in starts(lane, steady_except(gap))]
    for kind in FLEET_FAULTS:
        assert lost_lanes(redis_client, audit_redis, journal, (1038.0, kind, 1072.0)) == {}, kind


def test_every_fault_kind_the_driver_injects_says_which_lanes_it_delays() -> None:
    """A kind in neither list would excuse no wait at all: placed on purpose, or not at all."""
    kinds = set(fault_kinds(sentinel=True))
    assert kinds <= {*FLEET_FAULTS, *HEAVY_WORKER_FAULTS}, kinds
    assert not set(FLEET_FAULTS) & set(HEAVY_WORKER_FAULTS)
