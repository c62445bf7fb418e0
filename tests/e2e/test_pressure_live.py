"""Pressure-aware yielding, live side (issue 14): beat publishes the pressure only when it
changed, the holder learns it in its renewal reply, ``should_yield`` weighs it, the yield is
recorded and shown; and end to end with real processes."""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from schedproj.core.lanes import LaneKind, LaneSpec
from schedproj.core.picker import Policy
from schedproj.core.pipeline import decide
from schedproj.core.pressure import (
    Pressure,
    PressureRule,
    PressureYield,
    changed,
    decode,
    decode_yield,
    encode,
    encode_yield,
    yielded,
)
from schedproj.core.records import LaneState, LeaseView, Outcome, RunRecord
from schedproj.core.records import encode as encode_record
from schedproj.on_celery.dispatch import PressurePublisher
from schedproj.on_celery.task import LeaseRenewer, RunContext
from schedproj.store.lease import HeavyLease, Renewal
from schedproj.store.protocol import Keys
from schedproj.telemetry.metrics import SchedprojCollector
from schedproj.telemetry.observe import observe
from schedproj.telemetry.status import as_json, pressure_lines
from tests.conftest import E2E_REDIS_URL, token
from tests.procs import FAST_SETTINGS, Cluster, wait_for

RULE = PressureRule(target_ratio=1.5, min_hold_s=10.0)
NOW = 1_000_000.0


def press(*, last: float | None = NOW - 120, cadence: float = 60.0, fence: int = 7,
          at: float = NOW) -> Pressure:
    return Pressure(lane="short", cadence_s=cadence, last_run_at=last, priority0=False,
                    fence=fence, at=at)


# -- the renewal reply carries the pressure --------------------------------------------------

@pytest.fixture
def lease(client: redis.Redis, keys: Keys) -> HeavyLease:
    return HeavyLease(client, keys)


def held(lease: HeavyLease) -> tuple[str, int]:
    owner = token()
    grant = lease.acquire("long", owner, 30.0, time.time())
    assert grant.granted and lease.start(owner, 30.0, time.time())[0]
    return owner, grant.fence


def test_renew_returns_the_published_pressure_and_stays_a_pair(
        lease: HeavyLease, client: redis.Redis, keys: Keys) -> None:
    owner, fence = held(lease)
    reply = lease.renew(owner, 30.0, time.time(), 3600)
    assert reply == (True, "") and reply.pressure is None
    published = encode(press(fence=fence))
    client.hset(keys.pressure, "current", published)
    reply = lease.renew(owner, 30.0, time.time(), 3600)
    ok, reason = reply
    assert (ok, reason, reply.pressure) == (True, "", published)
    assert isinstance(reply, Renewal) and decode(reply.pressure, "k") == press(fence=fence)
    # Refusals carry none.
    assert lease.renew(token(), 30.0, time.time(), 3600).pressure is None


def test_a_reasserted_lease_also_learns_the_pressure(
        lease: HeavyLease, client: redis.Redis, keys: Keys) -> None:
    owner, fence = held(lease)
    mine = lease.read()
    assert mine is not None
    client.hset(keys.pressure, "current", encode(press(fence=fence)))
    client.delete(keys.lease)  # Redis lost the lease
    reply = lease.renew(owner, 30.0, time.time(), 3600, reassert=mine)
    assert reply == (True, "reasserted") and reply.pressure is not None
    assert lease.renew(owner, 30.0, time.time(), 0.0) == (False, "max-hold")


def test_garbage_at_the_pressure_key_never_costs_the_lease(
        lease: HeavyLease, client: redis.Redis, keys: Keys) -> None:
    owner, _ = held(lease)
    client.set(keys.pressure, "not a hash")
    reply = lease.renew(owner, 30.0, time.time(), 3600)
    assert reply == (True, "") and reply.pressure is None


# -- should_yield with pressure ----------------------------------------------------------------

def context(held_s: float, pressure: Pressure | None, rule: PressureRule | None = RULE,
            fence: int = 7) -> RunContext:
    ctx = RunContext(lane="long", task_id="t1", started_at=time.time() - held_s,
                     hold_cap_s=1800.0, fence=fence)
    ctx.pressure_rule, ctx.pressure = rule, pressure
    return ctx


def test_should_yield_to_a_lane_past_the_target_after_the_minimum_hold() -> None:
    now = time.time()
    pressing = press(last=now - 200, cadence=60.0)  # ratio 3.3
    recorded: list[PressureYield] = []
    ctx = context(30.0, pressing)
    ctx.on_pressure_yield = recorded.append
    assert ctx.should_yield()
    assert ctx.lost_reason == "pressure:short" and not ctx.lost.is_set()
    assert [(y.lane, y.pressing, y.fence) for y in recorded] == [("long", "short", 7)]
    assert recorded[0].ratio > 3.0 and recorded[0].held_s >= 30.0
    # It stays yielded, and the yield is recorded once.
    ctx.pressure = None
    assert ctx.should_yield() and len(recorded) == 1


def test_should_not_yield_below_the_target_before_the_minimum_hold_or_for_another_hold(
        ) -> None:
    now = time.time()
    assert not context(30.0, press(last=now - 30, cadence=60.0)).should_yield()  # ratio 0.5
    assert not context(5.0, press(last=now - 600, cadence=60.0)).should_yield()  # min hold
    assert not context(30.0, press(last=now - 600, fence=6)).should_yield()  # other fence
    assert not context(30.0, press(last=now - 600), rule=None).should_yield()  # off
    assert not context(30.0, None).should_yield()


def test_the_hold_cap_and_a_lost_lease_still_yield_without_pressure() -> None:
    ctx = context(1800.0, None)
    assert ctx.should_yield() and ctx.lost_reason == ""
    ctx = context(1.0, None)
    ctx.lost_reason = "lost"
    ctx.lost.set()
    assert ctx.should_yield() and ctx.lost_reason == "lost"


def test_a_failing_yield_record_never_stops_the_yield() -> None:
    def broken(_: PressureYield) -> None:
        raise redis.ConnectionError("cut off")

    ctx = context(30.0, press(last=time.time() - 600))
    ctx.on_pressure_yield = broken
    assert ctx.should_yield() and ctx.lost_reason == "pressure:short"


def renewer(policy: Policy = Policy.STALENESS) -> LeaseRenewer:
    settings = SimpleNamespace(pressure_rule=RULE, policy=policy, lease_ttl_s=30.0)
    rt = SimpleNamespace(settings=settings, keys=Keys("t"))
    ctx = RunContext(lane="long", task_id="t", started_at=time.time(), hold_cap_s=None)
    return LeaseRenewer(rt, "tok", ctx)  # type: ignore[arg-type]


def test_the_renewer_hands_the_run_the_pressure_and_the_rule() -> None:
    r = renewer()
    r.learn(encode(press()))
    assert r.ctx.pressure == press() and r.ctx.pressure_rule == RULE
    r.learn("garbage")  # reported, read as none
    assert r.ctx.pressure is None
    r.learn(None)
    assert r.ctx.pressure is None
    legacy = renewer(Policy.REGISTRY)
    legacy.learn(encode(press()))
    assert legacy.ctx.pressure_rule is None  # the legacy picker never yields to pressure


# -- beat publishes only when the pressure changed ---------------------------------------------

class CountingClient:
    def __init__(self) -> None:
        self.writes: list[tuple[str, str, str]] = []

    def hset(self, key: str, field: str, value: str) -> int:
        self.writes.append((key, field, value))
        return 1


def heavy(name: str, cadence: float, order: int) -> LaneSpec:
    return LaneSpec(name=name, task_name=name, kind=LaneKind.HEAVY, cadence_s=cadence,
                    order=order)


def publish(beat: PressurePublisher, states: dict[str, LaneState], lease: LeaseView | None,
            now: float, event: str = "renewed") -> None:
    lanes = [heavy("long", 86400, 1), heavy("short", 60, 2)]
    snap = SimpleNamespace(states=states, lease=lease, lock=SimpleNamespace(event=event),
                           epoch=SimpleNamespace(cause=""))
    beat.publish(decide(lanes, states, lease, now), snap, now,  # type: ignore[arg-type]
                 states=states, partial=False)


def test_beat_publishes_the_pressure_once_per_change() -> None:
    client = CountingClient()
    rt = SimpleNamespace(store=SimpleNamespace(client=client), keys=Keys("t"),
                         settings=SimpleNamespace(policy=Policy.STALENESS))
    beat = PressurePublisher(rt, lanes=None)  # type: ignore[arg-type]
    states = {"long": LaneState(run=RunRecord(last_run_at=NOW - 86400, backlog=9)),
              "short": LaneState(run=RunRecord(last_run_at=NOW - 90))}
    lease = LeaseView(lane="long", token="x", fence=4, granted_at=NOW - 30, started_at=NOW)
    publish(beat, states, lease, NOW, event="acquired")
    publish(beat, states, lease, NOW + 1)  # same lane, last run and hold: no write
    publish(beat, states, lease, NOW + 2)
    assert len(client.writes) == 1
    first = decode(client.writes[0][2], "k")
    assert first is not None and (first.lane, first.fence, first.last_run_at) == \
        ("short", 4, NOW - 90)
    publish(beat, states, None, NOW + 3)  # the lease freed: nobody presses
    assert decode(client.writes[-1][2], "k") is None and len(client.writes) == 2
    publish(beat, states, None, NOW + 4, event="acquired")  # a new active beat: write again
    assert len(client.writes) == 3


def test_changed_ignores_only_when_beat_looked() -> None:
    assert not changed(press(at=1.0), press(at=2.0))
    assert changed(press(), press(fence=8)) and changed(None, press()) and changed(press(), None)
    assert not changed(None, None)


# -- recorded and shown --------------------------------------------------------------------------

def test_a_pressure_yield_is_recorded_and_shown_by_status_and_metrics(
        client: redis.Redis, keys: Keys) -> None:
    now = time.time()
    rt = SimpleNamespace(store=SimpleNamespace(client=client), keys=keys)
    ctx = RunContext(lane="long", task_id="t", started_at=now - 20, hold_cap_s=None, fence=7)
    r = LeaseRenewer(rt, "tok", ctx)  # type: ignore[arg-type]
    record = yielded(lane="long", task_id="t", fence=7, held_s=20.0, now=now,
                     pressure=press(last=now - 100))
    r.record_pressure_yield(record)
    r.record_pressure_yield(record)
    client.hset(keys.pressure, "current", encode(press(last=now - 100, at=now)))
    obs = observe(client, keys, specs=())
    assert obs.pressure_yields == 2 and obs.last_pressure_yield == record
    assert obs.pressure is not None and obs.pressure.lane == "short"
    shown = as_json(obs, obs.health())["pressure"]
    assert shown["yields"] == 2 and shown["last_yield"]["pressing"] == "short"
    assert shown["current"]["lane"] == "short" and shown["current"]["ratio"] > 1.6
    lines = pressure_lines(obs)
    assert lines[0].startswith("pressure: short waits for the lease (ratio 1.6")
    assert "last pressure yield: long yielded to short" in lines[1] and "2 pressure" in lines[1]
    settings = SimpleNamespace(starvation_threshold_s=3600.0, hold_cap_s=1800.0, profile=None)
    families = {m.name: m for m in SchedprojCollector(client, keys, settings,  # type: ignore
                                                      ()).collect()}
    assert families["schedproj_pressure_yields"].samples[0].value == 2
    assert families["schedproj_pressure_ratio"].samples[0].labels == {"lane": "short"}
    last = families["schedproj_last_pressure_yield_timestamp_seconds"].samples[0]
    assert last.labels == {"lane": "long", "pressing": "short"} and last.value == record.at


def test_unreadable_pressure_is_a_problem_not_a_crash(client: redis.Redis, keys: Keys) -> None:
    client.hset(keys.pressure, mapping={"current": "nope", "yields": "3"})
    obs = observe(client, keys, specs=())
    assert obs.pressure is None and obs.pressure_yields == 3
    assert any("field current" in p for p in obs.problems)
    client.delete(keys.pressure)
    client.set(keys.pressure, "a string")
    obs = observe(client, keys, specs=())
    assert any("unreadable" in p for p in obs.problems)
    assert decode_yield(encode_yield(yielded(lane="a", task_id="t", fence=1, held_s=1, now=2,
                                             pressure=press(last=None)))
                        , "k") is not None  # never ran: the ratio stays finite JSON


# -- end to end, real processes ------------------------------------------------------------------

PREFIX = "schedproj"
KEYS = Keys(PREFIX)
#: Test-sized rule: target 1.5 (the default), minimum hold 1 s; the hold cap far away.
PRESSURE_SETTINGS = {"SCHEDPROJ_HOLD_CAP_S": "60", "SCHEDPROJ_PRESSURE_YIELD": "true",
                     "SCHEDPROJ_PRESSURE_TARGET_RATIO": "1.5",
                     "SCHEDPROJ_PRESSURE_MIN_HOLD_S": "1.0"}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    env = {**os.environ, **FAST_SETTINGS, **PRESSURE_SETTINGS,
           "CELERY_BROKER_URL": E2E_REDIS_URL, "SCHEDPROJ_REDIS_URL": E2E_REDIS_URL,
           "SCHEDPROJ_KEY_PREFIX": PREFIX, "E2E_SCENARIO": "pressure",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    c = Cluster(env=env, logdir=tmp_path)
    yield c
    c.stop_all()


def e2e_runs(r: redis.Redis) -> list[dict[str, Any]]:
    return sorted((json.loads(x) for x in r.lrange(f"{PREFIX}:e2e:runs", 0, -1)),
                  key=lambda x: x["start"])


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_holder_yields_to_a_short_lane_once_its_ratio_crosses_the_target(
        e2e_redis: redis.Redis, cluster: Cluster) -> None:
    """A 2 s heavy lane waits behind a run that would hold 20 s (a checkpoint every 0.2 s):
    the holder yields at its first checkpoint after the short lane's ratio reaches 1.5, the
    short lane runs next, and the heavy runs never overlap."""
    r = e2e_redis
    r.set(f"{PREFIX}:e2e:hog-steps", 100)  # 100 x 0.2 s = 20 s of work
    r.sadd(KEYS.paused, "e2e.short")  # held back until the hog holds the lease
    cluster.worker("heavy1", "heavy")
    cluster.beat("beat1")
    wait_for(lambda: r.llen(f"{PREFIX}:e2e:started") > 0, 30, "the hog started")
    seeded = time.time()  # the short lane "just ran": due at +2 s, ratio 1.5 at +3 s
    pipe = r.pipeline(transaction=True)
    pipe.hset(KEYS.lanes, "e2e.short|run", encode_record(
        RunRecord(last_run_at=seeded, runs=1, last_outcome=Outcome.COMPLETED)))
    pipe.srem(KEYS.paused, "e2e.short")
    pipe.sadd(KEYS.changed, "e2e.short")  # written outside schedproj: tell beat
    pipe.execute()
    crossing = seeded + 1.5 * 2
    wait_for(lambda: any(x["lane"] == "e2e.short" for x in e2e_runs(r)), 30,
             "the short lane ran")

    heavy = [x for x in e2e_runs(r) if x["fence"] > 0]
    for before, after in itertools.pairwise(heavy):
        assert after["start"] >= before["end"] and after["fence"] > before["fence"], heavy
    hog, nxt = heavy[0], heavy[1]
    assert hog["lane"] == "e2e.hog" and nxt["lane"] == "e2e.short", heavy
    assert hog["left"] > 0, f"the hog finished instead of yielding: {hog}"
    previous_check, yield_check = hog["checks"]
    print(f"\npressure e2e: seeded {seeded:.3f}; ratio crosses 1.5 at +3.000 s; checkpoint "
          f"before the yield at +{previous_check - seeded:.3f} s; yielded at checkpoint "
          f"+{yield_check - seeded:.3f} s ({yield_check - crossing:+.3f} s after crossing); "
          f"hog held {hog['end'] - hog['start']:.2f} s; short started "
          f"+{nxt['start'] - seeded:.3f} s")
    assert yield_check >= crossing, "yielded before the ratio reached the target"
    # The holder learns the pressure at its renewals (every TTL/3 = 0.67 s) after beat's tick
    # (every 0.5 s at most); it knew before the crossing, so it yields at the first checkpoint
    # after it — within a step (0.2 s) and some slack.
    assert yield_check - crossing < 0.2 + 0.3, (previous_check, yield_check, crossing)
    assert previous_check < crossing

    run = json.loads(r.hget(KEYS.lanes, "e2e.hog|run"))
    assert (run["last_outcome"], run["last_reason"]) == ("yielded", "pressure:e2e.short")
    assert int(r.hget(KEYS.pressure, "yields") or 0) >= 1
    last = decode_yield(r.hget(KEYS.pressure, "last-yield"), "last-yield")
    assert last is not None and (last.lane, last.pressing) == ("e2e.hog", "e2e.short")
    assert 1.5 <= last.ratio < 1.5 + 0.25
