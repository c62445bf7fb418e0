"""A family's members added at once, at the default beat lock TTL: does beat plan them all in
one tick and keep its lock (issue 23: 1)?

``python -m bench.at_once --members N --redis URL [--no-keeper] [--lock-ttl S]`` prints one JSON
object. An active beat and a standby beat (sends replaced by a no-op that keeps the scheduler's
bookkeeping, ``bench.tickcost.noop_sends``), a heavy family of one-hour cadence; N members are
added through the family API at once (timed): each is due, with no record. Then the two beats
tick in turn, as a deployment's do, until every member is planned (its next look written over
the 0 it was added with) or ``--rounds`` rounds passed; then the heavy run ends and one more
round is timed (``hand_off``: every waiting member planned again, the lease changed hands).
Reported: each round's tick time and which beat held the lock after it, the rounds, the lock
keeper's renewals, the longest Redis command (slow log) and beat's peak RSS. ``--no-keeper``
runs the same with the keeper earning nothing (``lock_keeper.PER_LANE_S`` 0): beat as it was
before it, renewing between the tick's steps only.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

import redis
from celery import Celery

from bench.million import HEAVY_FAMILY, longest_script_ms, member_key, reset_slowlog, say
from bench.tickcost import end_run, mib, noop_sends, proc_kib
from schedproj import LaneTask, Settings, configure_app
from schedproj.core.families import LaneFamily
from schedproj.core.lanes import LaneKind
from schedproj.on_celery import lock_keeper
from schedproj.on_celery.beat import FairScheduler
from schedproj.store.families import FamilyStore
from schedproj.store.lane_store import LaneStore
from schedproj.store.protocol import Keys

PREFIX = "ao"
CADENCE_S = 3600.0


def family_app(url: str, lock_ttl_s: float, prefix: str = PREFIX,
               kind: LaneKind = LaneKind.HEAVY) -> Celery:
    """The heavy family alone (no REM chain), the lock TTL given, the default loop interval
    (or a third of the TTL, whichever is shorter)."""
    defaults = Settings.load(broker_url=url, redis_url=url)
    settings = Settings.load(broker_url=url, redis_url=url, key_prefix=prefix,
                             wake_on_release=False, beat_lock_ttl_s=lock_ttl_s,
                             beat_max_loop_interval_s=min(defaults.beat_max_loop_interval_s,
                                                          lock_ttl_s / 3))
    app = Celery("bench-at-once", set_as_current=False)
    configure_app(app, settings)
    for name in [n for n in app.tasks if n.startswith("schedproj.rem.")]:
        app.tasks.unregister(name)
    LaneStore(redis.Redis.from_url(url, decode_responses=True), Keys(prefix)).declare_fresh()

    def sync(key: str) -> None:
        return None

    app.task(shared=False, base=LaneTask, name=HEAVY_FAMILY,
             lane=LaneFamily(cadence_s=CADENCE_S, kind=kind))(sync)
    return app


def unplanned(client: redis.Redis, keys: Keys) -> int:
    """Members whose next look is still the 0 they were added with."""
    return int(client.zcount(keys.due, "-inf", 0))


def tick(sched: FairScheduler) -> tuple[float, str]:
    """One tick, timed; '' or the exception it raised (beat would tick again)."""
    start = time.perf_counter()
    try:
        sched.tick()
        failed = ""
    except Exception as exc:  # counted, as beat's loop goes on
        failed = f"{type(exc).__name__}: {exc}"[:200]
    return time.perf_counter() - start, failed


def run(url: str, members: int, lock_ttl_s: float, rounds: int,
        prefix: str = PREFIX, kind: LaneKind = LaneKind.HEAVY) -> dict[str, Any]:
    client = redis.Redis.from_url(url, decode_responses=True)
    keys = Keys(prefix)
    app = family_app(url, lock_ttl_s, prefix, kind)
    active, standby = FairScheduler(app=app), FairScheduler(app=app)
    sent = noop_sends(active)
    noop_sends(standby)
    active.tick()
    standby.tick()
    assert active.active and not standby.active, "the first beat did not take the lock"
    reset_slowlog(client)
    start = time.perf_counter()
    FamilyStore(client, keys, [HEAVY_FAMILY]).add(HEAVY_FAMILY,
                                                  (member_key(i) for i in range(members)))
    out: dict[str, Any] = {"add_s": round(time.perf_counter() - start, 1), "rounds": []}
    say(f"at once: {members:,} members added in {out['add_s']} s")
    while len(out["rounds"]) < rounds and unplanned(client, keys):
        took, failed = tick(active)
        standby_took, standby_failed = tick(standby)
        row = {"tick_s": round(took, 2), "failed": failed, "active_holds": active.active,
               "standby_took_over": standby.active, "standby_tick_s": round(standby_took, 2),
               "standby_failed": standby_failed, "unplanned_after": unplanned(client, keys)}
        out["rounds"].append(row)
        say(f"at once: round {len(out['rounds'])}: {row}")
        if standby.active:  # the beats trade places, as a deployment's would
            active, standby = standby, active
    if unplanned(client, keys) == 0:
        # The heavy run ends: the next tick plans every waiting member again (the lease
        # changed hands) having read one lane - the tick after, timed the same way.
        end_run(client, keys)
        took, failed = tick(active)
        standby_took, _ = tick(standby)
        out["hand_off"] = {"tick_s": round(took, 2), "failed": failed,
                           "active_holds": active.active,
                           "standby_took_over": standby.active,
                           "granted_again": client.exists(keys.lease) == 1}
        say(f"at once: the tick after the run's end: {out['hand_off']}")
    out.update(
        planned_all=unplanned(client, keys) == 0,
        rounds_to_plan_all=len(out["rounds"]) if unplanned(client, keys) == 0 else None,
        lock_changed_hands=sum(r["standby_took_over"] for r in out["rounds"]),
        keeper_renewals=active.keeper.renewals + standby.keeper.renewals,
        sent=sent[0], longest_command_ms=longest_script_ms(client),
        first_tick_s=out["rounds"][0]["tick_s"] if out["rounds"] else None)
    for beat in (active, standby):
        beat.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, required=True)
    parser.add_argument("--redis", required=True, help="a Redis this run may flush")
    parser.add_argument("--lock-ttl", type=float, default=None,
                        help="beat lock TTL (default: the setting's default, 15 s)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds at most")
    parser.add_argument("--kind", choices=["heavy", "light"], default="heavy",
                        help="the family's kind (light: every member is sent at once)")
    parser.add_argument("--no-keeper", action="store_true",
                        help="the lock keeper earns nothing: beat as before it")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    redis.Redis.from_url(args.redis).flushdb()
    if args.no_keeper:
        lock_keeper.PER_LANE_S = 0.0
    ttl = args.lock_ttl or Settings.load(broker_url=args.redis,
                                         redis_url=args.redis).beat_lock_ttl_s
    result = {"members": args.members, "lock_ttl_s": ttl, "keeper": not args.no_keeper,
              "kind": args.kind,
              **run(args.redis, args.members, ttl, args.rounds, kind=LaneKind(args.kind)),
              "peak_rss_mib": mib(proc_kib("VmHWM"))}
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


__all__ = ["main", "run"]

if __name__ == "__main__":
    raise SystemExit(main())
