"""Lanes for the end-to-end tests, declared as ordinary Celery tasks.

``E2E_SCENARIO`` selects which lanes exist, so each test runs real beat/worker processes on a
small lane set with cadences of seconds. Every run appends its interval (start, end, fence) to
a Redis list that outlives the process, so tests can check for overlaps afterwards.
"""

from __future__ import annotations

import json
import os
import time

import redis
from celery import shared_task

from schedproj import Lane, LaneKind, LaneTask
from schedproj.store.connection import connect

SCENARIO = os.environ.get("E2E_SCENARIO", "fairness")
PREFIX = os.environ.get("SCHEDPROJ_KEY_PREFIX", "schedproj")
_client: redis.Redis | None = None


def client() -> redis.Redis:
    global _client
    if _client is None:
        # schedproj's own client: the state Redis may be a Sentinel or a Redis Cluster URL.
        _client = connect(os.environ["SCHEDPROJ_REDIS_URL"])
    return _client


def runs_key() -> str:
    return f"{PREFIX}:e2e:runs"


def backlog_key() -> str:
    return f"{PREFIX}:e2e:backlog"


def record(lane: str, start: float, fence: int, **extra: object) -> None:
    client().rpush(runs_key(), json.dumps(
        {"lane": lane, "start": start, "end": time.time(), "fence": fence, **extra}))


def drain(task: LaneTask, lane: str, item_s: float) -> None:
    """Work a shared backlog counter item by item, yielding at the hold cap."""
    start = time.time()
    left = int(client().get(backlog_key()) or 0)
    done = 0
    while left > 0 and not task.should_yield():
        time.sleep(item_s)
        left = int(client().decr(backlog_key()))
        done += 1
    task.report_backlog(max(0, left))
    record(lane, start, task.fence, done=done, left=max(0, left))


def sleeper(task: LaneTask, lane: str, seconds: float) -> None:
    start = time.time()
    time.sleep(seconds)
    record(lane, start, task.fence)


if os.environ.get("E2E_SENTRY_CAPTURE"):
    # Any scenario can capture what Sentry would be sent (see tests/sentry_capture.py).
    from tests import sentry_capture

    sentry_capture.activate_from_env()

if SCENARIO == "fairness":
    @shared_task(base=LaneTask, bind=True, name="e2e.backlog",
                 lane=Lane(cadence_s=3, kind=LaneKind.HEAVY, order=10))
    def backlog_lane(self: LaneTask) -> None:
        drain(self, "e2e.backlog", 0.1)

    @shared_task(base=LaneTask, bind=True, name="e2e.starved",
                 lane=Lane(cadence_s=2, kind=LaneKind.HEAVY, order=20))
    def starved_lane(self: LaneTask) -> None:
        sleeper(self, "e2e.starved", 0.3)

    @shared_task(base=LaneTask, bind=True, name="e2e.light",
                 lane=Lane(cadence_s=1, kind=LaneKind.LIGHT, order=30))
    def light_lane(self: LaneTask) -> None:
        sleeper(self, "e2e.light", 0.05)

elif SCENARIO == "slow":
    # One long heavy lane (killed mid-run in tests) and a slow-cadence lane (restart tests).
    @shared_task(base=LaneTask, bind=True, name="e2e.long",
                 lane=Lane(cadence_s=1, kind=LaneKind.HEAVY, order=10))
    def long_lane(self: LaneTask) -> None:
        start = time.time()
        client().rpush(f"{PREFIX}:e2e:started", json.dumps({"start": start, "fence": self.fence}))
        while time.time() - start < 8 and not self.should_yield():
            time.sleep(0.1)
        record("e2e.long", start, self.fence)

    @shared_task(base=LaneTask, bind=True, name="e2e.rare",
                 lane=Lane(cadence_s=3600, kind=LaneKind.LIGHT, order=20))
    def rare_lane(self: LaneTask) -> None:
        sleeper(self, "e2e.rare", 0.01)

    @shared_task(base=LaneTask, bind=True, name="e2e.pulse",
                 lane=Lane(cadence_s=1, kind=LaneKind.LIGHT, order=30))
    def pulse_lane(self: LaneTask) -> None:
        sleeper(self, "e2e.pulse", 0.01)

    if "gpu=" in os.environ.get("SCHEDPROJ_POOLS", ""):
        # The compose test's pool gpu=2 (its gpu service): three lanes of one slot each, due
        # every second and running 1.5 s, so the pool's two slots are busy at once and a
        # third run would overlap them were the slots not held.
        def _gpu_lane(name: str) -> None:
            @shared_task(base=LaneTask, bind=True, name=name,
                         lane=Lane(cadence_s=1, kind=LaneKind.HEAVY, pool="gpu", order=40))
            def gpu_lane(self: LaneTask) -> None:
                sleeper(self, name, 1.5)

        for _n in range(3):
            _gpu_lane(f"e2e.gpu{_n}")

elif SCENARIO == "calendar":
    # Calendar lanes on every minute in a zone that is not the host's (St John's is UTC-3:30
    # or -2:30: its minutes are UTC's, its hours are not), beside a cadence lane.
    from celery.schedules import crontab

    _WINDOW = os.environ.get("E2E_CATCHUP_WINDOW_S")
    _CALENDAR = {"schedule": crontab(minute="*"), "timezone": "America/St_Johns",
                 "catchup_window_s": float(_WINDOW) if _WINDOW else None}

    @shared_task(base=LaneTask, bind=True, name="e2e.minutely-heavy",
                 lane=Lane(kind=LaneKind.HEAVY, order=10, **_CALENDAR))
    def minutely_heavy(self: LaneTask) -> None:
        sleeper(self, "e2e.minutely-heavy", 0.2)

    @shared_task(base=LaneTask, bind=True, name="e2e.minutely-light",
                 lane=Lane(kind=LaneKind.LIGHT, order=20, **_CALENDAR))
    def minutely_light(self: LaneTask) -> None:
        sleeper(self, "e2e.minutely-light", 0.01)

    @shared_task(base=LaneTask, bind=True, name="e2e.every-2s",
                 lane=Lane(cadence_s=2, kind=LaneKind.LIGHT, order=30))
    def every_2s(self: LaneTask) -> None:
        sleeper(self, "e2e.every-2s", 0.01)

elif SCENARIO == "restart":
    # Slow cadences: after one run each, nothing is due again for a long while.
    @shared_task(base=LaneTask, bind=True, name="e2e.hourly-heavy",
                 lane=Lane(cadence_s=3600, kind=LaneKind.HEAVY, order=10))
    def hourly_heavy(self: LaneTask) -> None:
        sleeper(self, "e2e.hourly-heavy", 0.1)

    @shared_task(base=LaneTask, bind=True, name="e2e.hourly-light",
                 lane=Lane(cadence_s=3600, kind=LaneKind.LIGHT, order=20))
    def hourly_light(self: LaneTask) -> None:
        sleeper(self, "e2e.hourly-light", 0.01)

elif SCENARIO == "deadline":
    @shared_task(base=LaneTask, bind=True, name="e2e.quick",
                 lane=Lane(cadence_s=1, kind=LaneKind.HEAVY, order=10))
    def quick(self: LaneTask) -> None:
        sleeper(self, "e2e.quick", 0.05)

    @shared_task(base=LaneTask, bind=True, name="e2e.slowlight",
                 lane=Lane(cadence_s=0.5, kind=LaneKind.LIGHT, order=20))
    def slowlight(self: LaneTask) -> None:
        sleeper(self, "e2e.slowlight", 1.5)

elif SCENARIO == "hang":
    from celery.exceptions import SoftTimeLimitExceeded

    @shared_task(base=LaneTask, bind=True, name="e2e.hang", time_limit=2.0, soft_time_limit=1.0,
                 lane=Lane(cadence_s=3600, kind=LaneKind.HEAVY, order=10))
    def hang(self: LaneTask) -> None:
        start = time.time()
        client().rpush(f"{PREFIX}:e2e:started", json.dumps({"start": start, "fence": self.fence}))
        try:
            time.sleep(30)
        except SoftTimeLimitExceeded:
            time.sleep(30)  # ignores the soft limit: only the hard limit stops it

elif SCENARIO == "gate":
    from schedproj import DeferralReason, Gate, GateCondition

    @shared_task(base=LaneTask, bind=True, name="e2e.producer",
                 lane=Lane(cadence_s=2.5, kind=LaneKind.HEAVY, order=10))
    def producer(self: LaneTask) -> None:
        sleeper(self, "e2e.producer", 1.0)

    @shared_task(base=LaneTask, bind=True, name="e2e.consumer",
                 lane=Lane(cadence_s=5, kind=LaneKind.LIGHT, order=20,
                           gates=(Gate("e2e.producer", GateCondition.DUE_OR_RUNNING,
                                       DeferralReason.GOLDEN_PATH_DEPENDENCY),)))
    def consumer(self: LaneTask) -> None:
        sleeper(self, "e2e.consumer", 0.01)

elif SCENARIO == "sentry":
    # Sentry's capture in these processes (see tests/sentry_capture.py); Sentry Crons knows
    # only whole-minute intervals, so these lanes run every minute (once in a test). The lane
    # names differ from the task names: the monitor slug must be the lane's.
    from tests import sentry_capture

    sentry_capture.activate_from_env()

    class LaneBroke(RuntimeError):
        """What the failing lane raises (the error event must carry it)."""

    @shared_task(base=LaneTask, bind=True, name="e2e.sentry-broken",
                 lane=Lane(cadence_s=60, kind=LaneKind.HEAVY, order=10,
                           name="e2e-sentry-broken"))
    def sentry_broken(self: LaneTask) -> None:
        # The lease token rides in the message; the test checks it never reaches Sentry.
        grant = (self.request.kwargs or {}).get("schedproj_lease") or {}
        record("e2e-sentry-broken", time.time(), self.fence, token=grant.get("token"))
        raise LaneBroke("e2e-sentry-broken failed on purpose")

    @shared_task(base=LaneTask, bind=True, name="e2e.sentry-fine",
                 lane=Lane(cadence_s=60, kind=LaneKind.LIGHT, order=20, name="e2e-sentry-fine"))
    def sentry_fine(self: LaneTask) -> None:
        sleeper(self, "e2e-sentry-fine", 0.05)

elif SCENARIO == "partition":
    from schedproj.chaos.audit import FencedLedger
    from schedproj.core.errors import LeaseLost

    def _ledger() -> FencedLedger:
        return FencedLedger(client(), PREFIX)

    @shared_task(base=LaneTask, bind=True, name="part.long",
                 lane=Lane(cadence_s=1, kind=LaneKind.HEAVY, order=10))
    def part_long(self: LaneTask) -> None:
        """A stubborn writer: it never checks should_yield and retries writes through a cut,
        the worst case. Only the fencing number can stop its late writes."""
        for step in range(40):
            time.sleep(0.2)
            deadline = time.time() + 30
            while True:
                try:
                    accepted = _ledger().append(self.fence, {"fence": self.fence, "step": step,
                                                             "pid": os.getpid()})
                    break
                except redis.RedisError:
                    if time.time() > deadline:
                        raise
                    time.sleep(0.2)
            if not accepted:
                raise LeaseLost(f"fence {self.fence} refused at step {step}")

elif SCENARIO == "clear-lease":
    # Issue 19 (1): a long heavy run that checks should_yield() between steps, the holder
    # schedproj clear-lease must never cut off, and a light lane beside it.
    CLEAR_STEP_S = 0.5

    @shared_task(base=LaneTask, bind=True, name="e2e.clear-long",
                 lane=Lane(cadence_s=1, kind=LaneKind.HEAVY, order=10))
    def clear_long(self: LaneTask) -> None:
        start = time.time()
        client().rpush(f"{PREFIX}:e2e:started", json.dumps(
            {"lane": "e2e.clear-long", "start": start, "fence": self.fence,
             "pid": os.getpid()}))
        steps = int(os.environ.get("E2E_CLEAR_STEPS", "80"))
        done = 0
        while done < steps and not self.should_yield():
            time.sleep(CLEAR_STEP_S)
            done += 1
        self.report_backlog(steps - done)
        record("e2e.clear-long", start, self.fence, left=steps - done, pid=os.getpid())

    @shared_task(base=LaneTask, bind=True, name="e2e.clear-pulse",
                 lane=Lane(cadence_s=1, kind=LaneKind.LIGHT, order=20))
    def clear_pulse(self: LaneTask) -> None:
        sleeper(self, "e2e.clear-pulse", 0.01)

elif SCENARIO == "pressure":
    # Pressure-aware yielding (issue 14): a hog whose run would hold the lease 20 s, checking
    # should_yield() every 0.2 s, and a 2-second lane that waits behind it.
    HOG_STEP_S = 0.2

    @shared_task(base=LaneTask, bind=True, name="e2e.hog",
                 lane=Lane(cadence_s=3600, kind=LaneKind.HEAVY, order=10))
    def hog(self: LaneTask) -> None:
        start = time.time()
        client().rpush(f"{PREFIX}:e2e:started", json.dumps({"lane": "e2e.hog", "start": start,
                                                            "fence": self.fence}))
        left = int(client().get(f"{PREFIX}:e2e:hog-steps") or 0)
        checks: list[float] = []
        while left > 0:
            checks.append(time.time())
            if self.should_yield():
                break
            time.sleep(HOG_STEP_S)
            left = int(client().decr(f"{PREFIX}:e2e:hog-steps"))
        self.report_backlog(max(0, left))
        # The last two checkpoints: the one that said "yield" and the one before it.
        record("e2e.hog", start, self.fence, left=max(0, left), checks=checks[-2:])

    @shared_task(base=LaneTask, bind=True, name="e2e.short",
                 lane=Lane(cadence_s=2, kind=LaneKind.HEAVY, order=20))
    def short(self: LaneTask) -> None:
        sleeper(self, "e2e.short", 0.3)

elif SCENARIO == "family":
    # Issue 11: a heavy lane family of many members (one per repository) next to ordinary
    # lanes, heavy and light.
    from schedproj.core.families import LaneFamily

    @shared_task(base=LaneTask, bind=True, name="e2e.repo-sync",
                 lane=LaneFamily(cadence_s=30, kind=LaneKind.HEAVY, jitter=0.2, order=20))
    def repo_sync(self: LaneTask, key: str) -> None:
        # 40 ms: the family's first pass lasts several of the ordinary heavy lane's cadences
        # (at 10 ms it drained within two on a fast hour, and the lane could not be seen
        # keeping its turns).
        sleeper(self, f"e2e.repo-sync[{key}]", 0.04)

    @shared_task(base=LaneTask, bind=True, name="e2e.plain-heavy",
                 lane=Lane(cadence_s=1.5, kind=LaneKind.HEAVY, order=10))
    def plain_heavy(self: LaneTask) -> None:
        sleeper(self, "e2e.plain-heavy", 0.05)

    @shared_task(base=LaneTask, bind=True, name="e2e.plain-light",
                 lane=Lane(cadence_s=1, kind=LaneKind.LIGHT, order=30))
    def plain_light(self: LaneTask) -> None:
        sleeper(self, "e2e.plain-light", 0.01)
