"""The defaults (``core.defaults``) agree with each other: each relation a default's comment
promises, checked, so changing one value cannot silently break another's guarantee."""

from __future__ import annotations

from schedproj.core import defaults as d


def test_a_heavy_run_is_cut_off_before_its_message_is_redelivered() -> None:
    # A run still going when the broker redelivers its message would start a second copy.
    assert d.HEAVY_TIME_LIMIT_S < d.VISIBILITY_TIMEOUT_S
    assert d.LIGHT_TIME_LIMIT_S < d.VISIBILITY_TIMEOUT_S
    assert d.LIGHT_TIME_LIMIT_S <= d.RABBITMQ_CONSUMER_TIMEOUT_S


def test_the_hold_cap_comes_before_the_backstop_and_the_time_limit() -> None:
    assert d.HOLD_CAP_S < d.HEAVY_TIME_LIMIT_S <= d.MAX_HOLD_S


def test_the_beat_lock_outlives_the_loop_intervals_it_promises() -> None:
    assert d.BEAT_LOCK_TTL_S >= d.BEAT_LOCK_MIN_LOOP_RATIO * d.BEAT_MAX_LOOP_INTERVAL_S
    assert 0 < d.BEAT_IDLE_SLEEP_FLOOR_S < d.BEAT_MAX_LOOP_INTERVAL_S


def test_the_quarantine_covers_a_ttl_and_one_renewal_interval() -> None:
    # A holder renews every third of a TTL: after a loss it re-asserts within that much.
    assert d.QUARANTINE_TTL_RATIO == 1 + 1 / 3
    assert d.LEASE_TTL_S < d.START_DEADLINE_S


def test_the_queues_are_apart_and_every_number_is_positive() -> None:
    assert d.HEAVY_QUEUE != d.LIGHT_QUEUE
    numbers = {name: value for name, value in vars(d).items()
               if name.isupper() and isinstance(value, int | float) and not isinstance(value, bool)}
    assert numbers and all(value > 0 for value in numbers.values()), numbers
    assert d.CLOCK_SKEW_TOLERANCE_S < d.LEASE_TTL_S
