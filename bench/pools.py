"""Pools against the single lease: rank and grant with N due heavy lanes, and the idle tick.

``python -m bench.pools --lanes N --redis URL`` prints one JSON object (issue 22's benchmark:
rank and grant with 10,000 due lanes across 4 pools at most 1.2x the single lease's figure,
the idle tick unchanged within noise). Two FairSchedulers are built in this one process, each
under its own key prefix on the same Redis, with the same N heavy lanes (four lane families
of N/4 members, cadence one hour, the records seeded as workers would write them):

* ``single``: every family in the default pool ``heavy`` (one slot: today's lease);
* ``pools``: the families spread over four pools of 1, 2, 3 and 4 slots (the default pool
  ``heavy`` and the declared pools ``p2``, ``p3``, ``p4``).

Their ticks are interleaved (which side goes first alternates), so both see the same moments
of a shared machine; the ratios are of medians taken in the same run. Before each timed
ranking tick and plan, garbage is collected (untimed): a tick makes some 10,000 objects, and
otherwise one side's garbage is collected inside the other side's next timing.

* ``rank``: all N due (staleness ratios 1.0 to 10.6), every slot free. One cycle = the tick
  that ranks them and grants the free slots (``single``: 1 grant; ``pools``: 1+2+3+4 = 10),
  the tick after it that finds every slot held, then the runs end (leases deleted, the
  winners marked changed, as ``run_finish.lua`` does). This is the figure ``tick`` reports as
  the ranking tick: beat's whole tick, Redis reads and the lease grants included (sends are
  replaced by a no-op, as there).
* ``plan``: the core alone on the same lanes: ``plan_tick`` (due, gates, per-pool ranking and
  grants, record changes), no Redis, states as the ranking tick reads them.
* ``idle``: nothing due (every lane ran just now); beat's idle tick, with pools declared
  (``pools``) and without (``single``).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery

from bench.stats import summary
from bench.tickcost import (
    BEAT_LOCK_TTL_S,
    CADENCE_S,
    LOOP_INTERVAL_S,
    ROUND_TRIPS,
    fair_idle_state,
    fair_scheduler,
    member_key,
    profiled,
    seed,
    timed,
)
from schedproj import LaneKind, LaneTask, Pool, Settings, configure_app
from schedproj.core.families import LaneFamily, member_lane
from schedproj.core.planner import TickInput, plan_tick
from schedproj.core.pools import DEFAULT_POOL
from schedproj.core.records import LaneState, Outcome, RunRecord, encode
from schedproj.on_celery.beat import FairScheduler
from schedproj.store.lane_store import LaneStore
from schedproj.store.protocol import Keys

#: The pools of the ``pools`` side: (name, slots); the default pool is the one-slot one.
POOLS = ((DEFAULT_POOL, 1), ("p2", 2), ("p3", 3), ("p4", 4))
SIDES = ("single", "pools")
#: Lease-held ticks timed after each ranking tick (the first one right after its writes).
HELD_TICKS = 1


def family_name(i: int) -> str:
    return f"bench.pool-family{i}"


class Side:
    """One FairScheduler and its N lanes: four heavy families, in the default pool (``single``)
    or one family per pool (``pools``)."""

    def __init__(self, url: str, side: str, prefix: str, n: int) -> None:
        self.side, self.prefix, self.keys = side, prefix, Keys(prefix)
        self.client = redis.Redis.from_url(url, decode_responses=True)
        settings = Settings.load(broker_url=url, redis_url=url, key_prefix=prefix,
                                 wake_on_release=False, pools="",
                                 beat_max_loop_interval_s=LOOP_INTERVAL_S,
                                 beat_lock_ttl_s=BEAT_LOCK_TTL_S)
        pooled = side == "pools"
        declared = [Pool(name, slots) for name, slots in POOLS if name != DEFAULT_POOL]
        self.app = Celery(f"bench-{prefix}", set_as_current=False)
        configure_app(self.app, settings, pools=declared if pooled else None)
        LaneStore(self.client, self.keys).declare_fresh()
        for f, (pool, _slots) in enumerate(POOLS):
            def member(key: str) -> None:
                return None

            self.app.task(shared=False, base=LaneTask, name=family_name(f), lane=LaneFamily(
                cadence_s=CADENCE_S, kind=LaneKind.HEAVY,
                pool=pool if pooled and pool != DEFAULT_POOL else None))(member)
        # Members dealt round-robin, so each family (and pool) holds every staleness ratio.
        self.names = [member_lane(family_name(i % len(POOLS)), member_key(i))
                      for i in range(n)]
        #: Grants a ranking tick makes with every slot free.
        self.grants = sum(s for _, s in POOLS) if pooled else 1
        self.sched: FairScheduler | None = None
        self.sent: list[int] = [0]

    def start(self) -> None:
        self.sched, self.sent = fair_scheduler(self.app)

    def tick(self) -> float:
        assert self.sched is not None
        return float(self.sched.tick())

    def close(self) -> None:
        if self.sched is not None:
            self.sched.close()

    def seed_due(self, now: float) -> dict[str, LaneState]:
        """All N due with different staleness ratios (1.0 to 10.6), never deferred yet; the
        states the ranking tick reads (for the core-only timing)."""
        runs = {name: RunRecord(last_run_at=now - CADENCE_S * (1.0 + (i % 97) / 10.0),
                                last_outcome=Outcome.COMPLETED, runs=1)
                for i, name in enumerate(self.names)}
        seed(self.client, self.keys, {f"{name}|run": encode(run) for name, run in runs.items()},
             dict.fromkeys(self.names, now - 1.0))
        return {name: LaneState(run=run) for name, run in runs.items()}

    def lease_keys(self) -> list[str]:
        return [self.keys.slot(pool, i).lease for pool, slots in POOLS for i in range(slots)]

    def end_runs(self) -> int:
        """Every run ended: its lease or slot lease deleted and its lane marked changed (as
        ``run_finish.lua`` does; the winners' records stay due, so they are ranked again).
        Returns how many leases were held."""
        keys = self.lease_keys()
        raws = self.client.mget(keys)
        lanes = {json.loads(raw)["lane"] for raw in raws if raw}
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(*keys)
        if lanes:
            pipe.sadd(self.keys.changed, *lanes)
        pipe.execute()
        return sum(1 for raw in raws if raw)

    def plan(self, states: dict[str, LaneState], now: float) -> Callable[[], Any]:
        """The core's rank and grant on these states, as beat calls it (pools passed only
        when pools beyond the default are declared, as beat does)."""
        assert self.sched is not None
        e, s = self.sched.engine, self.sched.settings
        specs = [spec for name in self.names if (spec := e.lanes.lanes.spec(name)) is not None]
        tick = TickInput(states=states, lease=None, inflight_grace_s=s.lease_ttl_s,
                         pools=e.lanes.lanes.pools if e.slots else None,
                         holders={pool: [] for pool in e.slots.pools} if e.slots else {})

        def run() -> Any:
            return plan_tick(specs, tick, now, profile=s.profile, policy=s.policy,
                             start_deadline_s=s.start_deadline_s,
                             task_id=lambda lane: str(uuid.uuid4()))
        return run


def make_sides(url: str, n: int) -> dict[str, Side]:
    return {side: Side(url, side, f"pb-{side}", n) for side in SIDES}


def order(cycle: int) -> tuple[str, ...]:
    """Which side goes first alternates from cycle to cycle."""
    return SIDES if cycle % 2 == 0 else SIDES[::-1]


def rank_pair(url: str, n: int, cycles: int, plans: int, profile: bool) -> dict[str, Any]:
    """Ranking ticks (and the held tick after each), then the core's plan alone, both
    interleaved between the two sides."""
    sides = make_sides(url, n)
    now = time.time()
    states = {name: side.seed_due(now) for name, side in sides.items()}
    for side in sides.values():
        side.start()
    result: dict[str, Any] = {"cycles": cycles, "grants": {s: sides[s].grants for s in SIDES}}
    result.update(rank_ticks(sides, cycles))
    # The core alone: the same states, planned again and again (pure: nothing changes).
    runs = {name: side.plan(states[name], time.time()) for name, side in sides.items()}
    result.update(core_plans(sides, runs, plans))
    if profile:
        result["profile"] = {}
        for name, side in sides.items():
            result["profile"][f"rank_{name}"] = profiled(side.tick, top=16)
            side.end_runs()
            result["profile"][f"plan_{name}"] = profiled(runs[name], top=16)
    for side in sides.values():
        side.close()
    return result


def rank_ticks(sides: dict[str, Side], cycles: int) -> dict[str, Any]:
    """``cycles`` ranking cycles per side (and one untimed first: it also loads the scripts
    and announces the beat), interleaved."""
    rank: dict[str, list[tuple[float, int]]] = {s: [] for s in SIDES}
    held: dict[str, list[tuple[float, int]]] = {s: [] for s in SIDES}
    for cycle in range(cycles + 1):
        for name in order(cycle):
            side = sides[name]
            before = side.sent[0]
            gc.collect()  # the other side's garbage is not this tick's: collected untimed
            sample = timed(side.tick)[:2]
            assert side.sent[0] == before + side.grants, (
                f"{name}: the ranking tick sent {side.sent[0] - before} messages, expected "
                f"{side.grants} (one per free slot)")
            after = [timed(side.tick)[:2] for _ in range(HELD_TICKS)]
            assert side.sent[0] == before + side.grants, f"{name}: a held tick sent"
            ended = side.end_runs()
            assert ended == side.grants, f"{name}: {ended} leases held, expected {side.grants}"
            if cycle > 0:
                rank[name].append(sample)
                held[name].extend(after)
    out: dict[str, Any] = {name: {"rank_tick": stats(rank[name]),
                                  "held_tick": stats(held[name])} for name in SIDES}
    out["ratio_rank_pools_over_single"] = ratio_of_medians(
        [t for t, _ in rank["pools"]], [t for t, _ in rank["single"]])
    out["ratio_held_pools_over_single"] = ratio_of_medians(
        [t for t, _ in held["pools"]], [t for t, _ in held["single"]])
    return out


def core_plans(sides: dict[str, Side], runs: dict[str, Callable[[], Any]],
               plans: int) -> dict[str, Any]:
    """``plans`` core-only plans per side (after one untimed), interleaved."""
    for name, run in runs.items():
        sends = len(run().sends)
        assert sends == sides[name].grants, (
            f"{name}: plan_tick dispatched {sends}, expected {sides[name].grants}")
    core: dict[str, list[float]] = {s: [] for s in SIDES}
    for rep in range(plans + 1):
        for name in order(rep):
            gc.collect()
            start = time.perf_counter()
            runs[name]()
            if rep > 0:
                core[name].append(time.perf_counter() - start)
    return {"plan": {name: {"ms": summary(core[name], 1000.0)} for name in SIDES},
            "ratio_plan_pools_over_single": ratio_of_medians(core["pools"], core["single"])}


def idle_pair(url: str, n: int, reps: int) -> dict[str, Any]:
    """Idle ticks, pools declared against none, interleaved."""
    sides = make_sides(url, n)
    now = time.time()
    for side in sides.values():
        fair_idle_state(side.client, side.keys, side.names, now)
        side.start()
        for _ in range(2):  # the first takes the lock and reads every lane; then a warm-up
            side.tick()
    samples: dict[str, list[tuple[float, int]]] = {s: [] for s in SIDES}
    for rep in range(reps):
        for name in order(rep):
            samples[name].append(timed(sides[name].tick)[:2])
    for name, side in sides.items():
        assert side.sent[0] == 0, f"{name}: an idle tick sent {side.sent[0]} messages"
        side.close()
    result: dict[str, Any] = {"reps": reps}
    for name in SIDES:
        result[name] = stats(samples[name])
    result["ratio_pools_over_single"] = ratio_of_medians(
        [t for t, _ in samples["pools"]], [t for t, _ in samples["single"]])
    return result


#: Issue 22: rank and grant across the pools within this factor of the single lease's.
RANK_GOAL = 1.2
#: "Unchanged within noise" for the idle tick, as this benchmark judges it: the same round
#: trips, and a median within this factor (a bound chosen here, not derived: a sub-ms tick's
#: median moves by several per cent between runs on a shared machine).
IDLE_NOISE = 1.1


def goals(result: dict[str, Any]) -> dict[str, Any]:
    rank, idle = result["rank"], result["idle"]
    rank_ratio = rank["ratio_rank_pools_over_single"]
    idle_ratio = idle["ratio_pools_over_single"]
    same_trips = (idle["pools"]["round_trips"]["median"]
                  == idle["single"]["round_trips"]["median"])
    return {
        "rank_within_1.2x_single": None if rank_ratio is None else rank_ratio <= RANK_GOAL,
        "idle_round_trips_unchanged": same_trips,
        "idle_within_noise": None if idle_ratio is None
        else same_trips and idle_ratio <= IDLE_NOISE,
    }


def stats(samples: list[tuple[float, int]]) -> dict[str, Any]:
    return {"ms": summary([s for s, _ in samples], 1000.0, 3),
            "round_trips": summary([float(n) for _, n in samples], 1.0, 1)}


def ratio_of_medians(num: list[float], den: list[float]) -> float | None:
    if not num or not den or statistics.median(den) == 0:
        return None
    return round(statistics.median(num) / statistics.median(den), 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", type=int, default=10_000, help="due heavy lanes (N)")
    parser.add_argument("--redis", required=True, help="a Redis this may empty (FLUSHDB)")
    parser.add_argument("--cycles", type=int, default=30, help="ranking cycles timed per side")
    parser.add_argument("--plans", type=int, default=30, help="core-only plans timed per side")
    parser.add_argument("--idle-reps", type=int, default=1000, help="idle ticks per side")
    parser.add_argument("--profile", action="store_true",
                        help="also profile one ranking tick and one plan of each side")
    args = parser.parse_args(argv)
    if args.lanes < len(POOLS) * 10:
        parser.error(f"--lanes must be at least {len(POOLS) * 10} (every pool's slots busy "
                     "with lanes still waiting)")
    logging.basicConfig(level=logging.WARNING)
    redis.Redis.from_url(args.redis).flushdb()
    ROUND_TRIPS.install()
    result: dict[str, Any] = {"lanes": args.lanes,
                              "pools": {"single": [[DEFAULT_POOL, 1]],
                                        "pools": [list(p) for p in POOLS]},
                              "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    result["rank"] = rank_pair(args.redis, args.lanes, args.cycles, args.plans, args.profile)
    redis.Redis.from_url(args.redis).flushdb()
    result["idle"] = idle_pair(args.redis, args.lanes, args.idle_reps)
    result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result["goals"] = goals(result)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
