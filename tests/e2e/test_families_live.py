"""Lane families end to end (issue 11): real beat and workers, a heavy family of 120 members
next to an ordinary heavy and an ordinary light lane, members added and removed at runtime."""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from schedproj.store.families import FamilyStore
from schedproj.store.protocol import Keys
from tests.conftest import E2E_REDIS_URL
from tests.procs import FAST_SETTINGS, Cluster, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PREFIX = "schedproj"
KEYS = Keys(PREFIX)
FAMILY = "e2e.repo-sync"
MEMBERS = [f"org/repo-{i:03d}" for i in range(120)]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    env = {**os.environ, **FAST_SETTINGS, "CELERY_BROKER_URL": E2E_REDIS_URL,
           "SCHEDPROJ_REDIS_URL": E2E_REDIS_URL, "SCHEDPROJ_KEY_PREFIX": PREFIX,
           "E2E_SCENARIO": "family", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    c = Cluster(env=env, logdir=tmp_path)
    yield c
    c.stop_all()


def runs(r: redis.Redis) -> list[dict]:
    return sorted((json.loads(x) for x in r.lrange(f"{PREFIX}:e2e:runs", 0, -1)),
                  key=lambda x: x["start"])


def test_a_family_of_120_members_shares_the_lease_with_ordinary_lanes(
        e2e_redis: redis.Redis, cluster: Cluster) -> None:
    r = e2e_redis
    families = FamilyStore(r, KEYS)
    assert families.add(FAMILY, MEMBERS) == 120
    cluster.worker("heavy1", "heavy")
    cluster.worker("light1", "light")
    cluster.beat("beat1")
    prefix = f"{FAMILY}["
    wait_for(lambda: len({x["lane"] for x in runs(r) if x["lane"].startswith(prefix)}) == 120,
             60, "every member ran once")

    heavy = [x for x in runs(r) if x["fence"] > 0]
    for before, after in itertools.pairwise(heavy):
        assert after["start"] >= before["end"] and after["fence"] > before["fence"], \
            f"heavy runs overlap: {before} {after}"
    members = [x for x in heavy if x["lane"].startswith(prefix)]
    assert len(members) == 120, "a member ran twice within its cadence"
    # New members are just due (ratio about 1, growing), not maximally stale: the ordinary
    # heavy lane (1.5 s cadence) keeps its turns while the family's first pass drains instead
    # of waiting behind all 120, and the light lane never waited behind the family.
    # (Before, every new member outranked it: it ran once, then waited for all 120.)
    plain = [x["start"] for x in heavy if x["lane"] == "e2e.plain-heavy"
             and x["start"] < members[-1]["start"]]
    points = [heavy[0]["start"], *plain, members[-1]["start"]]
    longest = max(b - a for a, b in itertools.pairwise(points))
    assert len(plain) >= 2 and longest < 3 * 1.5, \
        f"the ordinary heavy lane waited {longest:.1f} s behind the family: {plain}"
    light = [x for x in runs(r) if x["lane"] == "e2e.plain-light"]
    assert light and light[0]["start"] < members[-1]["end"] + 1.0, \
        "the light lane waited behind the family"
    record = json.loads(r.hget(KEYS.lanes, f"{FAMILY}[{MEMBERS[7]}]|run"))
    assert record["runs"] == 1 and record["fence"] > 0

    # Remove twenty members: their state goes, and none of them starts again.
    gone = MEMBERS[:20]
    assert families.remove(FAMILY, gone) == 20
    removed_at = time.time()
    r.set(f"{PREFIX}:e2e:check", 1)
    assert not any(r.hexists(KEYS.lanes, f"{FAMILY}[{k}]|run") for k in gone)
    assert families.members(FAMILY) == sorted(MEMBERS[20:])
    # Make the rest due again at once: removed ones must stay out.
    for key in MEMBERS[:25]:
        r.sadd(KEYS.run_now, f"{FAMILY}[{key}]")
    r.sadd(KEYS.changed, *(f"{FAMILY}[{k}]" for k in MEMBERS[:25]))
    r.zadd(KEYS.due, {f"{FAMILY}[{k}]": 0 for k in MEMBERS[:25]}, xx=True)
    wait_for(lambda: {f"{FAMILY}[{k}]" for k in MEMBERS[20:25]}
             <= {x["lane"] for x in runs(r) if x["start"] > removed_at}, 30,
             "run-now members ran again")
    late = [x for x in runs(r) if x["start"] > removed_at + 0.5
            and x["lane"] in {f"{FAMILY}[{k}]" for k in gone}]
    assert not late, f"a removed member ran: {late}"
    assert not any(r.hexists(KEYS.lanes, f"{FAMILY}[{k}]|run") for k in gone)
