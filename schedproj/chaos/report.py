"""What a chaos run found: the audit of its journal, dispatch log and fenced ledger, the
figures of the faults, and the table printed at the end."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

import redis

from schedproj.chaos.audit import (
    ENTRY_INTERVALS,
    ENTRY_MINUTELY,
    FAMILY,
    FAMILY_CADENCE_S,
    FAMILY_JITTER,
    POOL_SLOTS,
    Disruption,
    EntryAudit,
    FencedLedger,
    audit,
    audit_entries,
    entry_runs_key,
    entry_sends_key,
    family_members,
    overlaps_key,
    runs_from_journal,
    slot_ledger_prefix,
)
from schedproj.chaos.faults import (
    FAILOVER,
    RECOVERY_AFTER_S,
    STATE_LOSSES,
    Figures,
    fault_count,
    journal,
)
from schedproj.chaos.processes import (
    BEAT_LOCK_TTL_S,
    LEASE_TTL_S,
    LOOP_S,
    PREFIX,
    START_DEADLINE_S,
)
from schedproj.core.pools import DEFAULT_POOL
from schedproj.devtools.redis_server import RedisServer
from schedproj.store.protocol import Keys

#: The chaos lanes (schedproj.chaos.lanes) by what serves them, with their cadences: the heavy
#: lanes of the lease (the heavy workers), the lanes of the pool (its own worker), the light
#: lane (the light worker, as the family's members).
HEAVY_CADENCES = {"chaos.h1": 2.0, "chaos.h2": 3.0, "chaos.h3": 4.0}
POOL_CADENCES = {"chaos.g1": 3.0, "chaos.g2": 3.0, "chaos.g3": 6.0}
LIGHT_CADENCES = {"chaos.pulse": 1.0}
CADENCES = {**HEAVY_CADENCES, **LIGHT_CADENCES, **POOL_CADENCES}
#: How late an entry may be claimed outside faults: beat looks when its schedule says, within
#: a loop interval, and its tick may first dispatch the lanes (a hundred family members).
ENTRY_SLACK_S = LOOP_S + 1.0
#: How long a published entry message may wait for the light worker before it counts as gone
#: with a broker restart.
ENTRY_DELIVER_S = 10.0
#: Faults that kill the active beat (between an entry's claim and its publish, that due time
#: is not sent: docs/entries.md), and how many beats that may hold the lock each kills: each
#: may take one claim of an entry with it. kill-beat kills the active beat; freeze-beat kills
#: it, then the frozen beat that took over at the fault's end.
BEAT_KILLS = {"kill-beat": 1, "freeze-beat": 2}
#: Faults that stall beat's tick without killing it or losing the state: Redis frozen. With
#: the kills and the state losses, the faults whose time excuses an entry's wait.
BEAT_STALLS = ("block-redis",)
#: Faults that SIGKILL or SIGSTOP the heavy worker holding the lease, and the pool's worker
#: with it while that runs a pool run (faults._kill_heavy, _pause_heavy): they delay the
#: lease's lanes (and the pool's, when its worker was hit), never a light lane - light lanes
#: never wait behind heavy work (docs/guarantees.md), and their worker is not touched.
HEAVY_WORKER_FAULTS = ("kill-heavy", "pause-heavy")
#: Faults that stop or stall what every lane goes through: beat (killed, frozen), Redis
#: (frozen, restarted empty or failed over: the state, and the broker with it) or the due
#: index every lane is planned from (corrupt-derived). Each delays every lane.
FLEET_FAULTS = (*BEAT_KILLS, *BEAT_STALLS, *STATE_LOSSES, FAILOVER, "corrupt-derived")


def run_figures(figures: Figures, exits: list[str], sentinel: bool,
                min_faults: dict[str, int]) -> dict[str, Any]:
    """The report's figures about the run itself (besides the audit's)."""
    return {"worker_exits": len(exits), "sentinel": sentinel,
            "state_loss_faults": fault_count(figures.kills, "state-loss"),
            "min_faults": dict(min_faults),
            "min_faults_met": all(fault_count(figures.kills, k) >= n
                                  for k, n in min_faults.items())}


def collect(audit_redis: RedisServer, figures: Figures, started: float,
            ended: float, members: int = 0, *, stopping: float,
            entry_states: Mapping[str, tuple[float, int]] | None = None) -> dict[str, Any]:
    """Audit from 15 s after ``started`` (settling) to ``stopping``, when the driver began to
    stop the fleet (it takes seconds); ``entry_states``: :func:`audit_entries`' final_states."""
    window = (started + 15, stopping)
    client = redis.Redis.from_url(audit_redis.url, decode_responses=True)
    entries = journal(audit_redis)
    dispatches = [json.loads(x) for x in client.lrange(Keys(PREFIX).dispatch_log, 0, -1)]
    ledger = FencedLedger(client, PREFIX)
    recovering = [(began, kind, done + RECOVERY_AFTER_S.get(kind, 0.0))
                  for began, kind, done in figures.log]
    slot_ledgers = pool_ledgers(client)
    bounds = due_bounds(members)
    report = audit(entries, dispatches, due_bounds_s=bounds, window=window,
                   ledger=ledger.entries(),
                   disruptions=lane_disruptions(recovering, entries, bounds),
                   slot_ledgers={slot: led.entries() for slot, led in slot_ledgers.items()})
    beat_entries = audit_schedule_entries(client, disruptions=recovering, window=window,
                                          final_states=entry_states or {})
    os_overlaps = [json.loads(x) for x in client.lrange(overlaps_key(PREFIX), 0, -1)]
    paused = set(figures.paused_fences) | set(figures.paused_pool_fences)
    after_pause = [o for o in os_overlaps if (o.get("holder") or {}).get("fence") in paused]
    return {
        "duration_s": round(ended - started, 1),
        **report.summary(),
        **beat_entries.summary(),
        **family_figures(entries, members),
        "os_overlaps": len(os_overlaps) - len(after_pause),
        "os_overlaps_with_a_paused_holder": len(after_pause),
        **pool_figures(entries, slot_ledgers,
                       [o for o in os_overlaps if o.get("pool") and o not in after_pause]),
        "pool_os_overlaps_with_a_paused_holder": sum(1 for o in after_pause if o.get("pool")),
        "longest_wait_after_state_loss_s": longest_wait(entries, figures.losses),
        "faults": dict(figures.kills),
        "derived_damage": dict(figures.derived_damage),
        "lease_recovery_after_kill_s": med_max(figures.lease_recovery_s),
        "beat_failover_s": med_max(figures.failover_s),
        "late_writes_refused": ledger.refused(),
        "ledger_monotone": ledger.monotone(),
        "paused_writer_fenced": paused_writers_fenced(entries, figures.paused_fences),
        "failover_methods": dict(figures.failover_methods),
        "failover_promotion_s": med_max(figures.promotion_s),
        "failovers_to_a_lagging_replica": sum(1 for b in figures.replica_behind if b > 0),
        "details": {
            "overlaps": [[a.task, b.task] for a, b in report.overlaps],
            "late_ends": [[a.task, b.task] for a, b in report.late_ends],
            "pool_overlaps": [[a.task, b.task] for a, b in report.pool_overlaps],
            "pool_late_ends": [[a.task, b.task] for a, b in report.pool_late_ends],
            "duplicates": report.duplicates,
            "lost": report.lost,
            "stale_starts": [r.task for r in report.stale_starts],
            "stale_beat_starts": report.stale_beat_starts,
            "unended_unrecorded": report.unended_unrecorded,
            "os_overlaps": [o for o in os_overlaps if o not in after_pause],
            "entries": entry_details(beat_entries),
        },
    }


def family_figures(entries: list[dict[str, Any]], members: int) -> dict[str, Any]:
    """The family's members, their runs, and how many of them ran."""
    member_starts = [e for e in entries if e["ev"] == "start"
                     and str(e.get("lane", "")).startswith(f"{FAMILY}[")]
    return {"family_members": members, "member_runs": len(member_starts),
            "members_that_ran": len({e["lane"] for e in member_starts})}


def lane_disruptions(faults: list[tuple[float, str, float]], entries: list[dict[str, Any]],
                     lanes: Iterable[str]) -> list[Disruption]:
    """Each fault ((began, kind, recovered)) with the lanes it can delay, for :func:`audit`:
    a :data:`FLEET_FAULTS` kind every lane; a :data:`HEAVY_WORKER_FAULTS` kind the lease's
    lanes, and the pool's if a pool run was under way in it (its worker was hit too: the
    driver looks for one once it has hit the holder). Any other kind touches no lane's path:
    it excuses no wait (a kind added to the driver must be placed here first)."""
    everyone, runs = frozenset(lanes), runs_from_journal(entries)
    out: list[Disruption] = []
    for began, kind, until in faults:
        if kind in FLEET_FAULTS:
            out.append((began, until, everyone))
        elif kind in HEAVY_WORKER_FAULTS:
            pool_hit = any(r.pool != DEFAULT_POOL and r.start <= until
                           and (r.end is None or r.end >= began) for r in runs)
            out.append((began, until, frozenset(HEAVY_CADENCES)
                        | (frozenset(POOL_CADENCES) if pool_hit else frozenset())))
    return out


def pool_ledgers(client: redis.Redis) -> dict[tuple[str, int], FencedLedger]:
    """The fenced ledger of each slot of the chaos pools, by (pool, slot)."""
    return {(pool, i): FencedLedger(client, slot_ledger_prefix(PREFIX, pool, i))
            for pool, n in POOL_SLOTS.items() for i in range(n)}


def pool_figures(entries: list[dict[str, Any]],
                 ledgers: dict[tuple[str, int], FencedLedger],
                 os_overlaps: list[dict[str, Any]]) -> dict[str, Any]:
    """The pools' figures besides the audit's: runs by lane, overlaps the slot files saw (a
    SIGSTOPped holder's excepted, as for the lease), and the slot ledgers' refusals."""
    return {
        "pool_os_overlaps": len(os_overlaps),
        "pool_slots": dict(POOL_SLOTS),
        "pool_lane_runs": dict(sorted(Counter(
            str(e["lane"]) for e in entries
            if e["ev"] == "start" and e.get("pool") in POOL_SLOTS).items())),
        "pool_late_writes_refused": sum(led.refused() for led in ledgers.values()),
        "pool_ledgers_monotone": all(led.monotone() for led in ledgers.values()),
    }


def audit_schedule_entries(client: redis.Redis, disruptions: list[tuple[float, str, float]],
                           window: tuple[float, float],
                           final_states: Mapping[str, tuple[float, int]]) -> EntryAudit:
    """The beat_schedule entries' audit (:func:`audit_entries`) on what beat published and the
    light worker ran."""
    return audit_entries(
        [json.loads(x) for x in client.lrange(entry_sends_key(PREFIX), 0, -1)],
        [json.loads(x) for x in client.lrange(entry_runs_key(PREFIX), 0, -1)],
        intervals=ENTRY_INTERVALS, minutely=(ENTRY_MINUTELY,), window=window,
        slack_s=ENTRY_SLACK_S, faults=disruptions, state_losses=(*STATE_LOSSES, FAILOVER),
        broker_losses=STATE_LOSSES, beat_kills=BEAT_KILLS, beat_stalls=BEAT_STALLS,
        deliver_s=ENTRY_DELIVER_S,
        final_states=final_states)


def awaiting_delivery(client: redis.Redis, since: float) -> list[str]:
    """The entry messages beat published after ``since`` that no worker has run yet (task
    ids): what the light worker is still owed before the fleet stops (the driver waits for
    them, at most :data:`ENTRY_DELIVER_S`)."""
    ran = {json.loads(x)["task"] for x in client.lrange(entry_runs_key(PREFIX), 0, -1)}
    return [s["task"] for s in map(json.loads, client.lrange(entry_sends_key(PREFIX), 0, -1))
            if float(s["t"]) > since and s["task"] not in ran]


def entry_details(entries: EntryAudit) -> dict[str, Any]:
    return {"duplicate_runs": entries.duplicate_runs, "duplicate_due": entries.duplicate_due,
            "missed": entries.missed, "unsent": entries.unsent,
            "undelivered": entries.undelivered,
            "delayed_after_loss": entries.delayed_after_loss,
            "skipped_after_loss": entries.skipped_after_loss,
            "unsent_at_beat_kill": entries.unsent_at_beat_kill,
            "count_rollbacks": entries.count_rollbacks,
            "recorded_early": entries.recorded_early}


def due_bounds(members: int) -> dict[str, float]:
    """How soon each lane must start again: its cadence plus a slack (a lapsed start deadline,
    lease TTLs, a beat lock, and the queue behind the other heavy lanes: after a state loss
    all of them are due at once), not counting the time a fault and its recovery took (faults
    come every few seconds, and a lane may wait through several; see audit())."""
    slack = START_DEADLINE_S + LEASE_TTL_S + BEAT_LOCK_TTL_S + LEASE_TTL_S + 8.0
    bounds = {lane: cadence + slack for lane, cadence in CADENCES.items()}
    # A member falls due at up to (1 + jitter) cadences.
    bounds.update(dict.fromkeys((f"{FAMILY}[{k}]" for k in family_members(members)),
                                FAMILY_CADENCE_S * (1 + FAMILY_JITTER) + slack))
    return bounds


def med_max(xs: list[float]) -> dict[str, float | None]:
    return {"median": round(statistics.median(xs), 3) if xs else None,
            "max": round(max(xs), 3) if xs else None}


def dump(audit_redis: RedisServer, figures: Figures, path: Path) -> None:
    client = redis.Redis.from_url(audit_redis.url, decode_responses=True)
    keys = Keys(PREFIX)
    path.write_text(json.dumps({
        "journal": journal(audit_redis),
        "dispatches": [json.loads(x) for x in client.lrange(keys.dispatch_log, 0, -1)],
        "ledger": FencedLedger(client, PREFIX).entries(),
        "os_overlaps": [json.loads(x) for x in client.lrange(overlaps_key(PREFIX), 0, -1)],
        "entry_sends": [json.loads(x) for x in client.lrange(entry_sends_key(PREFIX), 0, -1)],
        "entry_runs": [json.loads(x) for x in client.lrange(entry_runs_key(PREFIX), 0, -1)],
        "faults": figures.log,
    }))


def longest_wait(entries: list[dict[str, Any]], losses: list[float]) -> float | None:
    """After each state loss, how long until a heavy run started again (the quarantine, plus
    waiting for the next lane to fall due); the longest of them."""
    starts = sorted(float(e["t"]) for e in entries if e["ev"] == "start" and e["fence"] > 0)
    waits = [min((t for t in starts if t > back), default=back) - back for back in losses]
    return round(max(waits), 2) if waits else None


def paused_writers_fenced(entries: list[dict[str, Any]], fences: list[int]) -> bool:
    """Every holder paused past its TTL ended knowing it had lost the lease (its renewal or
    a fenced write was refused), so nothing it wrote after losing it was accepted."""
    if not fences:
        return False
    ends = {int(e["fence"]): e for e in entries if e["ev"] == "end"}
    return all(f in ends and ends[f].get("lost") for f in fences)


def entry_rows(report: dict[str, Any]) -> list[tuple[str, Any]]:
    """The table's rows about the beat_schedule entries."""
    return [
        ("beat_schedule entries: published / run",
         f"{report.get('entry_sends')} / {report.get('entry_runs')}"),
        ("entry due times sent twice (must be 0)", report.get("entry_duplicates")),
        ("entry due times missed beyond the bound (must be 0)", report.get("entry_missed")),
        ("entry due times delayed an interval / skipped after a state loss",
         f"{report.get('entry_delayed_after_state_loss')} / "
         f"{report.get('entry_skipped_after_state_loss')}"),
        ("entry claims not published: beat killed between claim and publish",
         report.get("entry_unsent_at_beat_kill")),
        ("entry counts gone back (a state older than the last claim)",
         report.get("entry_count_rollbacks")),
        ("entry messages lost with a broker restart", report.get("entry_lost_with_broker")),
        ("entry claims recorded > 1 s before their publish began",
         report.get("entry_claims_recorded_early")),
        ("entry due times during each fault", report.get("entry_due_during_faults")),
    ]


def pool_rows(report: dict[str, Any]) -> list[tuple[str, Any]]:
    """The table's rows about the pool beyond the default."""
    return [
        ("pools: slots / runs", f"{report.get('pool_slots')} / {report.get('pool_runs')}"),
        ("  ... runs by lane", report.get("pool_lane_runs")),
        ("runs beyond a pool's slots, by the slots' ledgers (must be 0)",
         report.get("pool_overlaps")),
        ("  ... seen by the OS slot files (must be 0; in the OS count above)",
         report.get("pool_os_overlaps")),
        ("  ... by the OS slot files, a SIGSTOPped holder resumed (fenced)",
         report.get("pool_os_overlaps_with_a_paused_holder")),
        ("  ... fenced stragglers / late ends on a slot",
         f"{report.get('pool_fenced_stragglers')} / {report.get('pool_late_ends')}"),
        ("pool writes refused by a slot's fence / slot ledgers monotone",
         f"{report.get('pool_late_writes_refused')} / {report.get('pool_ledgers_monotone')}"),
    ]


def render(report: dict[str, Any], out: TextIO) -> None:
    rows = [
        ("duration", f"{report['duration_s']} s"),
        ("heavy runs", report["heavy_runs"]),
        ("light runs", report["light_runs"]),
        ("light family: members / member runs / members that ran",
         f"{report.get('family_members')} / {report.get('member_runs')} / "
         f"{report.get('members_that_ran')}"),
        *((f"faults: {k}", v) for k, v in sorted(report["faults"].items())),
        *((f"derived key damaged: {k}", v)
          for k, v in sorted(report.get("derived_damage", {}).items())),
        ("state-loss faults (Redis restarted empty)", report.get("state_loss_faults")),
        *([("failovers by method", report["failover_methods"]),
           ("  ... to a replica lacking the latest writes",
            report["failovers_to_a_lagging_replica"]),
           ("replica promoted after, median / max",
            f"{report['failover_promotion_s']['median']} / "
            f"{report['failover_promotion_s']['max']} s")]
          if report.get("sentinel") else []),
        ("overlaps (must be 0)", report["overlaps"]),
        ("duplicate executions/dispatches (must be 0)", report["duplicates"]),
        ("lost runs (must be 0)", report["lost_runs"]),
        ("runs started with a stale fence (must be 0)", report["stale_starts"]),
        ("overlaps seen by the OS lock (must be 0)", report["os_overlaps"]),
        *pool_rows(report),
        ("  ... with a SIGSTOPped holder resumed (fenced)",
         report["os_overlaps_with_a_paused_holder"]),
        ("runs from a beat that had lost its lock (must be 0)", report["stale_beat_starts"]),
        ("killed runs recorded lost", report["recorded_lost"]),
        ("killed runs not recorded (state lost with them)", report["unended_unrecorded"]),
        ("worker exits (must be 0)", report["worker_exits"]),
        *entry_rows(report),
        ("longest wait after a state loss",
         f"{report['longest_wait_after_state_loss_s']} s"),
        ("fenced stragglers (stopped at a checkpoint)", report["fenced_stragglers"]),
        ("ends journaled after a newer start, no write after it (late, not overlaps)",
         report["late_ends"]),
        ("late writes refused by fence", report["late_writes_refused"]),
        ("ledger fences monotone", report["ledger_monotone"]),
        ("lease recovery after SIGKILL, median / max",
         f"{report['lease_recovery_after_kill_s']['median']} / "
         f"{report['lease_recovery_after_kill_s']['max']} s"),
        ("beat failover, median / max",
         f"{report['beat_failover_s']['median']} / {report['beat_failover_s']['max']} s"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        out.write(f"{k:<{width}}  {v}\n")
