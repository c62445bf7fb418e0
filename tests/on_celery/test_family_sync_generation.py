"""A family's ``members`` hook is synced without reading the members while nothing changed
them (issue 23: SMEMBERS of 200,000 members took 1.0-1.6 s of beat's tick every 60 s), against
real Redis: add and remove bump the members' generation, and beat reads the members again
when the hook's answer, the generation or the member count moved."""

from __future__ import annotations

import redis

from schedproj.on_celery.beat import FairScheduler
from schedproj.store.families import FamilyStore, generations_key
from schedproj.store.protocol import Keys
from tests.on_celery.test_families import FAMILY, build, family_and_lanes


def resync(sched: FairScheduler) -> int:
    """One more sync of the hook (its interval passed); how many times it read the members
    (beat's own count of the reads: the server's SMEMBERS count also holds the tick's)."""
    families = sched.engine.families
    before = families.reads
    families.last_sync[FAMILY] = 0.0
    sched.tick()
    return families.reads - before


def test_an_unchanged_family_is_synced_without_reading_its_members(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    wanted = [f"m{i:04d}" for i in range(3000)]
    sched = FairScheduler(app=build(key_prefix,
                                    lambda app: family_and_lanes(app, lambda: list(wanted))))
    sched.tick()
    store = FamilyStore(redis_client, Keys(key_prefix))
    assert store.members(FAMILY) == wanted
    assert resync(sched) == 0, "an unchanged family's members were read"
    assert resync(sched) == 0
    # Another writer adds one (bumps the generation): read again, and made what the hook says.
    store.add(FAMILY, ["intruder"])
    assert resync(sched) == 1
    assert store.members(FAMILY) == wanted
    assert resync(sched) == 0
    # A writer of an earlier release (no generation): the member count moved, read again.
    redis_client.srem(Keys(key_prefix).family(FAMILY), "m0000")
    assert resync(sched) == 1
    assert store.members(FAMILY) == wanted
    # The hook's answer changed: read and synced.
    wanted.append("m9999")
    assert resync(sched) == 1
    assert store.members(FAMILY) == sorted(wanted)
    assert resync(sched) == 0
    sched.close()


def test_a_generations_key_of_the_wrong_type_costs_reads_not_syncs(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    keys = Keys(key_prefix)
    redis_client.set(generations_key(keys), "garbage")
    wanted = ["a", "b"]
    sched = FairScheduler(app=build(key_prefix,
                                    lambda app: family_and_lanes(app, lambda: list(wanted))))
    sched.tick()
    store = FamilyStore(redis_client, keys)
    assert store.members(FAMILY) == ["a", "b"]
    assert resync(sched) == 1, "no generation to trust: read every sync"
    store.add(FAMILY, ["c"])   # the add is made, though its bump fails
    assert store.members(FAMILY) == ["a", "b", "c"]
    resync(sched)
    assert store.members(FAMILY) == ["a", "b"]
    sched.close()
