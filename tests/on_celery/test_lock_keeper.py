"""The lock keeper renews only within what a tick earned, stops at the tick's end and at a lost
lock, and never counts a failed renewal as one. Its renewal function is a stand-in here (the
real one is ``lua/beat_renew.lua``, tested in tests/store/test_beat_renew.py and with beats in
test_long_tick_keeps_lock.py); the thread and the clock are real."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from schedproj.on_celery import lock_keeper
from schedproj.on_celery.lock_keeper import LockKeeper

pytestmark = pytest.mark.timeout(30)

TTL_S = 0.3


class Renewals:
    """Counts calls; answers what ``answer`` says (None: renewed)."""

    def __init__(self) -> None:
        self.calls: list[float] = []
        self.answer: str | None = None
        self.fail = False
        self.lock = threading.Lock()

    def __call__(self) -> str | None:
        with self.lock:
            self.calls.append(time.time())
        if self.fail:
            raise redis.ConnectionError("refused")
        return self.answer


@pytest.fixture
def per_lane(monkeypatch: pytest.MonkeyPatch) -> float:
    """A lane earns 10 ms here: 100 lanes keep the lock for 1 s (3 TTLs)."""
    monkeypatch.setattr(lock_keeper, "PER_LANE_S", 0.01)
    return 0.01


def test_a_tick_that_earned_nothing_is_not_kept(per_lane: float) -> None:
    renew = Renewals()
    keeper = LockKeeper(renew, TTL_S)
    keeper.begin(time.time())
    keeper.earn(5)  # 50 ms: the next step's own renewal comes sooner
    time.sleep(3 * TTL_S)
    keeper.end()
    assert renew.calls == []


def test_a_long_step_is_kept_for_what_the_tick_earned_and_no_longer(per_lane: float) -> None:
    renew = Renewals()
    keeper = LockKeeper(renew, TTL_S)
    began = time.time()
    keeper.begin(began)
    keeper.earn(100)  # kept until 1 s after it began
    time.sleep(2.0)  # one step, hung past what it earned
    calls = list(renew.calls)
    keeper.end()
    # A renewal each third of the TTL while earned (about 10), none after.
    assert 5 <= len(calls) <= 11, calls
    assert all(t - began <= 1.0 + 0.05 for t in calls), [t - began for t in calls]
    assert keeper.renewed_at() == pytest.approx(calls[-1], abs=0.05)
    assert keeper.renewals == len(calls) and keeper.lost() is None


def test_the_tick_ending_stops_the_renewals(per_lane: float) -> None:
    renew = Renewals()
    keeper = LockKeeper(renew, TTL_S)
    keeper.begin(time.time())
    keeper.earn(1000)  # 10 s
    time.sleep(TTL_S)
    keeper.end()
    made = len(renew.calls)
    assert made >= 1
    time.sleep(3 * TTL_S)
    assert len(renew.calls) == made


@pytest.mark.parametrize("holder", ["other-beat", ""])
def test_a_renewal_that_finds_the_lock_gone_stops_and_says_who_holds_it(
        per_lane: float, holder: str) -> None:
    renew = Renewals()
    renew.answer = holder
    keeper = LockKeeper(renew, TTL_S)
    keeper.begin(time.time())
    keeper.earn(1000)
    time.sleep(3 * TTL_S)
    assert len(renew.calls) == 1 and keeper.lost() == holder
    keeper.end()
    keeper.begin(time.time())  # the next tick starts with a clean slate
    assert keeper.lost() is None


def test_a_renewal_that_fails_on_redis_is_retried_and_not_counted(per_lane: float) -> None:
    renew = Renewals()
    renew.fail = True
    keeper = LockKeeper(renew, TTL_S)
    began = time.time()
    keeper.begin(began)
    keeper.earn(1000)
    time.sleep(TTL_S)
    assert len(renew.calls) >= 3  # retried every tenth of the TTL
    assert keeper.renewals == 0 and keeper.renewed_at() == began and keeper.lost() is None
    renew.fail = False
    time.sleep(TTL_S / 2)
    keeper.end()
    assert keeper.renewals >= 1 and keeper.renewed_at() > began


def test_the_main_threads_own_renewal_moves_the_next_one_on(per_lane: float) -> None:
    renew = Renewals()
    keeper = LockKeeper(renew, TTL_S)
    began = time.time()
    keeper.begin(began)
    keeper.earn(1000)
    for _ in range(6):  # the main thread renews at each step, a quarter TTL apart
        time.sleep(TTL_S / 4)
        keeper.renewed(time.time())
    keeper.end()
    assert renew.calls == []


def test_a_renewal_that_fails_with_an_error_beyond_redis_errors_is_retried(
        per_lane: float) -> None:
    """redis-py's cluster client says a cluster it cannot reach with RedisClusterException,
    no RedisError: it ended the keeper's thread, silently, and the long step it was keeping
    lost the lock (the thread started again only with the next tick's earnings)."""
    answers = iter([redis.exceptions.RedisClusterException("cannot be connected")])
    calls: list[float] = []

    def renew() -> str | None:
        calls.append(time.time())
        failure = next(answers, None)
        if failure is not None:
            raise failure
        return None

    keeper = LockKeeper(renew, TTL_S)
    began = time.time()
    keeper.begin(began)
    keeper.earn(1000)
    time.sleep(TTL_S)
    keeper.end()
    assert len(calls) >= 2 and keeper.renewals >= 1 and keeper.renewed_at() > began, calls


class SteppedClock:
    """``time`` as the keeper sees it, with the wall clock stepped by ``step`` seconds (an NTP
    step) and the monotonic clock left alone."""

    def __init__(self) -> None:
        self.step = 0.0

    def time(self) -> float:
        return time.time() + self.step

    def monotonic(self) -> float:
        return time.monotonic()


def test_a_wall_clock_stepped_back_during_a_step_holds_no_renewal_back(
        per_lane: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scheduled on the wall clock, a step of the clock 10 s back during a long step held
    every renewal back 10 s: the lock lapsed. The keeper schedules on the monotonic clock."""
    clock = SteppedClock()
    monkeypatch.setattr(lock_keeper, "time", clock)
    renew = Renewals()
    keeper = LockKeeper(renew, TTL_S)
    keeper.begin(clock.time())
    keeper.earn(1000)
    clock.step = -10.0
    time.sleep(4 * TTL_S)
    keeper.end()
    assert len(renew.calls) >= 3, renew.calls
