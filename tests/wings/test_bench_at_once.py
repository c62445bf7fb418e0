"""The members-added-at-once bench (``python -m bench.at_once``) runs and reports: a small
family here, its figures at a million in docs/performance.md. That the lock is kept through a
step longer than its TTL is tested in tests/on_celery/test_long_tick_keeps_lock.py."""

from __future__ import annotations

import pytest
import redis

from bench import at_once

pytestmark = pytest.mark.timeout(120)


def test_members_added_at_once_are_planned_in_one_round_by_the_beat_holding_the_lock(
        redis_url: str, redis_client: redis.Redis, key_prefix: str) -> None:
    out = at_once.run(redis_url, 3_000, lock_ttl_s=3.0, rounds=3, prefix=key_prefix)
    assert out["planned_all"] and out["rounds_to_plan_all"] == 1, out
    assert out["lock_changed_hands"] == 0 and out["sent"] == 2, out  # then the next
    (row,) = out["rounds"]
    assert row["active_holds"] and not row["standby_took_over"] and row["failed"] == ""
    assert out["first_tick_s"] > 0 and out["add_s"] >= 0
    after = out["hand_off"]
    assert after["active_holds"] and not after["standby_took_over"] and after["granted_again"]


def test_the_million_section_judges_one_tick_and_a_kept_lock() -> None:
    from bench import million

    kept = {"rounds_to_plan_all": 1, "lock_changed_hands": 0,
            "hand_off": {"active_holds": True, "standby_took_over": False}}
    assert million._one_tick(kept)["met"] is True
    lost_after = {**kept, "hand_off": {"active_holds": False, "standby_took_over": True}}
    assert million._one_tick(lost_after)["met"] is False
    assert million._one_tick({**kept, "lock_changed_hands": 1})["met"] is False
    assert million._one_tick({"rounds_to_plan_all": None, "lock_changed_hands": 3})["met"] is False
    assert million._one_tick({})["met"] is None
    assert million._one_tick({"failed": "boom"})["met"] is None
