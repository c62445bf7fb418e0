"""The overlap and loss detector: reads the run journal and dispatch log, reports violations.

Pure functions over journal entries (``{"ev": "start"|"end", "lane", "task", "fence", "t",
...}``) and dispatch-log entries (``{"lane", "task", "fence", "t"}``), plus
:class:`FencedLedger`, the fenced write every heavy lane's side effects should go through.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from schedproj.core.pools import DEFAULT_POOL
from schedproj.store import scripts

#: Environment variable naming the directory of the execution lock files (set by the driver;
#: here, not in the lanes module, so importing the driver declares no Celery tasks).
LOCK_DIR_ENV = "CHAOS_LOCK_DIR"
#: The chaos lane family (light, declared in the lanes module): its name, cadence and jitter,
#: and the variable that says how many members it has (the driver sets it).
FAMILY = "chaos.tenant"
FAMILY_CADENCE_S = 20.0
FAMILY_JITTER = 0.2
FAMILY_MEMBERS_ENV = "CHAOS_FAMILY_MEMBERS"
#: The chaos pool beyond the default (declared with SCHEDPROJ_POOLS by the fleet) and its
#: slots: its lanes are in the lanes module, its worker serves its queue.
POOL = "gpu"
POOL_SLOTS = {POOL: 2}


#: The chaos app's schedule entries (its ``beat_schedule``, declared in the lanes module), each
#: an ordinary task :data:`ENTRY_TASK` sent with its entry's name: interval entries (seconds:
#: one given as a number, one as a timedelta) and a crontab entry due at every minute.
ENTRY_TASK = "chaos.entry"
ENTRY_INTERVALS = {"chaos.every-2s": 2.0, "chaos.every-3s": 3.0}
ENTRY_MINUTELY = "chaos.minutely"
#: Two claims of one interval entry are made at least an interval apart on beat's clock (one
#: host, every beat): this much less is a rounding, anything more a second claim of one due
#: time.
CLAIM_EPS_S = 0.01
#: A claim records when the entry ran (``last_run_at``, what its next due time counts from);
#: its message's publish begins within this of it (the entries come after the lanes in a
#: tick). A claim recorded earlier than that measures the next due time from a moment before
#: the run: the next run comes that much early, as Celery's beat would not send it.
CLAIM_LAG_S = 1.0


def family_members(count: int) -> list[str]:
    """The chaos family's member keys."""
    return [f"t{i:03d}" for i in range(count)]


def slot_ledger_prefix(prefix: str, pool: str, slot: int) -> str:
    """The :class:`FencedLedger` prefix of slot ``slot`` of ``pool`` (each slot has its own:
    runs on different slots of a pool write at once, each with its own fence)."""
    return f"{prefix}:pool:{pool}:{slot}"


def overlaps_key(prefix: str) -> str:
    """Audit-Redis list of overlaps seen at the OS level (written by the chaos lanes)."""
    return f"{prefix}:os-overlaps"


def entry_sends_key(prefix: str) -> str:
    """Audit-Redis list of the entry messages beat published, with the due time each claimed."""
    return f"{prefix}:entry-sends"


def entry_runs_key(prefix: str) -> str:
    """Audit-Redis list of the entry messages a worker ran."""
    return f"{prefix}:entry-runs"


#: A fault's time as the lane audit counts it: (from, to, the lanes it can delay); from its
#: start to the end of the recovery it needs.
Disruption = tuple[float, float, Collection[str]]


@dataclass(frozen=True)
class Run:
    lane: str
    task: str
    fence: int
    start: float
    end: float | None
    outcome: str | None
    lost: str | None
    #: The pool whose slots the run held, and which of them (a default-pool run: the heavy
    #: lease, no slot numbers).
    pool: str = DEFAULT_POOL
    slots: tuple[int, ...] = ()


@dataclass(frozen=True)
class AuditReport:
    heavy_runs: int
    light_runs: int
    overlaps: list[tuple[Run, Run]] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    stale_starts: list[Run] = field(default_factory=list)
    #: (lane, from, to, seconds excused): a lane waited longer than its bound, counting only
    #: the time no fault was disrupting the fleet.
    lost: list[tuple[str, float, float, float]] = field(default_factory=list)
    fenced_stragglers: list[Run] = field(default_factory=list)
    #: Runs started by a message from a beat that had lost its lock (a newer beat fence was
    #: taken before the run started).
    stale_beat_starts: list[str] = field(default_factory=list)
    #: Runs that started and never ended, and that beat recorded lost / did not record.
    recorded_lost: list[str] = field(default_factory=list)
    unended_unrecorded: list[str] = field(default_factory=list)
    #: (older, newer): the older run's end was journaled after the newer one started, but its
    #: last accepted fenced write came before that start: it had stopped, and journaled its
    #: end late (the end is written after the lease renewer is joined, up to a lease TTL, so
    #: a renewal stuck in retries delays it). Not an overlap; told apart only given the ledger.
    late_ends: list[tuple[Run, Run]] = field(default_factory=list)
    #: Runs of the pools beyond the default, by pool.
    pool_runs: Counter[str] = field(default_factory=Counter)
    #: (older, newer) on one slot of a pool: a run beyond the pool's slots (the older one ran
    #: on after the newer one started on its slot, judged as ``overlaps`` are per slot, with
    #: that slot's ledger); fenced stragglers and late ends on a slot are counted apart.
    pool_overlaps: list[tuple[Run, Run]] = field(default_factory=list)
    pool_fenced_stragglers: list[Run] = field(default_factory=list)
    pool_late_ends: list[tuple[Run, Run]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"heavy_runs": self.heavy_runs, "light_runs": self.light_runs,
                "overlaps": len(self.overlaps), "duplicates": len(self.duplicates),
                "stale_starts": len(self.stale_starts), "lost_runs": len(self.lost),
                "fenced_stragglers": len(self.fenced_stragglers),
                "stale_beat_starts": len(self.stale_beat_starts),
                "recorded_lost": len(self.recorded_lost),
                "unended_unrecorded": len(self.unended_unrecorded),
                "late_ends": len(self.late_ends),
                "pool_runs": dict(sorted(self.pool_runs.items())),
                "pool_overlaps": len(self.pool_overlaps),
                "pool_fenced_stragglers": len(self.pool_fenced_stragglers),
                "pool_late_ends": len(self.pool_late_ends)}


def runs_from_journal(entries: Iterable[Mapping[str, Any]]) -> list[Run]:
    """Pair starts with ends (by task id and fence); a run killed mid-way has no end."""
    starts: dict[tuple[str, int], Mapping[str, Any]] = {}
    ends: dict[tuple[str, int], Mapping[str, Any]] = {}
    order: list[tuple[str, int]] = []
    for e in entries:
        key = (str(e["task"]), int(e["fence"]))
        if e["ev"] == "start":
            if key not in starts:
                order.append(key)
            starts.setdefault(key, e)
        elif e["ev"] == "end":
            ends[key] = e
    runs = []
    for key in order:
        begun, ended = starts[key], ends.get(key)
        runs.append(Run(lane=str(begun["lane"]), task=key[0], fence=key[1],
                        start=float(begun["t"]),
                        end=float(ended["t"]) if ended else None,
                        outcome=ended.get("outcome") if ended else None,
                        lost=ended.get("lost") if ended else None,
                        pool=str(begun.get("pool") or DEFAULT_POOL),
                        slots=tuple(int(i) for i in begun.get("slots") or ())))
    return sorted(runs, key=lambda r: r.start)


def audit(journal: Iterable[Mapping[str, Any]], dispatches: Iterable[Mapping[str, Any]], *,
          due_bounds_s: Mapping[str, float], window: tuple[float, float],
          ledger: Iterable[Mapping[str, Any]] | None = None,
          disruptions: Iterable[Disruption] = (),
          slot_ledgers: Mapping[tuple[str, int], Iterable[Mapping[str, Any]]] | None = None,
          ) -> AuditReport:
    """Check the promises on what actually ran.

    * overlap: a heavy run that did not notice losing its lease ran on after a newer-fenced
      heavy run started (a run that noticed, and stopped at its checkpoint, is a fenced
      straggler: its writes are refused by the fence, see :class:`FencedLedger`). A run's
      journaled end is no measure of when it stopped: it is written after the lease renewer
      is joined (up to a lease TTL). So given the ``ledger`` (the accepted entries of
      :class:`FencedLedger`, every step of a chaos heavy run), "ran on" means a fenced write
      of the older run was accepted at or after the newer run's start: a chaos lane body
      checks ``should_yield`` right after each write and then either stops or writes again,
      and a write it makes once a newer run has written is refused (a fenced straggler). An
      end journaled late with no such write is a late end, not an overlap. Without the
      ledger the journaled end is taken as the stop (an over-count, never an under-count);
    * a run beyond a pool's slots (``pool_overlaps``): the same, per slot of each pool
      beyond the default (a run of k slots is on each of its k slots), with each slot's own
      ledger (``slot_ledgers`` by (pool, slot): a pool run writes each step to the ledger of
      every slot it holds). Two runs never share a slot, so at most N runs of a pool of N
      slots execute at once; a run on a slot is judged only against the runs of that slot,
      never against the default pool's or another slot's;
    * duplicate: one dispatched message (task id) executed twice, or sent twice;
    * stale start: a run started with a fence older than one already started;
    * lost: a lane went longer than its bound without starting a run, inside ``window``,
      not counting the time of the ``disruptions`` that can delay it ((from, to, lanes): a
      fault and its recovery, and the lanes it can hold up; a fault that left a lane's path
      alone excuses none of its wait). Faults may come back to back (one every few seconds),
      and a lane waiting through two waits out both: a bound of "cadence plus one fault's
      recovery" would call that a loss, one of "plus every fault's" excuse anything.
    """
    journal = list(journal)
    runs = runs_from_journal(journal)
    pooled = [r for r in runs if r.fence > 0 and r.pool != DEFAULT_POOL]
    heavy = [r for r in runs if r.fence > 0 and r.pool == DEFAULT_POOL]
    report = AuditReport(heavy_runs=len(heavy), light_runs=len(runs) - len(heavy) - len(pooled))
    report.pool_runs.update(r.pool for r in pooled)
    _overlaps(heavy, ledger, report)
    _pool_overlaps(pooled, slot_ledgers, report)
    dispatches = list(dispatches)
    started = Counter(str(e["task"]) for e in journal if e["ev"] == "start")
    sent = Counter(str(d["task"]) for d in dispatches if "ev" not in d)
    report.duplicates.extend(sorted(t for t, n in (started + sent).items()
                                    if started[t] > 1 or sent[t] > 1))
    top = 0
    for run in heavy:
        if run.fence < top:
            report.stale_starts.append(run)
        top = max(top, run.fence)
    report.lost.extend(_gaps(runs, due_bounds_s, window, list(disruptions)))
    report.stale_beat_starts.extend(_stale_beat_starts(journal, dispatches))
    lost_events = {str(e["task"]) for e in journal if e["ev"] == "lost"}
    for run in runs:
        if run.end is None:
            (report.recorded_lost if run.task in lost_events
             else report.unended_unrecorded).append(run.task)
    return report


def _overlaps(heavy: list[Run], ledger: Iterable[Mapping[str, Any]] | None,
              report: AuditReport) -> None:
    """Each older run whose journaled end comes after a newer run's start: a fenced straggler
    (it noticed its loss), a late end (given the ledger: no write of it accepted from the
    newer start on) or an overlap."""
    writes: dict[int, list[float]] | None = None
    if ledger is not None:
        writes = defaultdict(list)
        for w in ledger:
            writes[int(w["fence"])].append(float(w["t"]))
    for i, older in enumerate(heavy):
        for newer in heavy[i + 1:]:
            if newer.fence <= older.fence or older.end is None or older.end <= newer.start:
                continue
            if older.lost:
                report.fenced_stragglers.append(older)
            elif writes is not None and all(t < newer.start for t in writes[older.fence]):
                report.late_ends.append((older, newer))
            else:
                report.overlaps.append((older, newer))


def _pool_overlaps(pooled: list[Run],
                   ledgers: Mapping[tuple[str, int], Iterable[Mapping[str, Any]]] | None,
                   report: AuditReport) -> None:
    """:func:`_overlaps` per slot of each pool, and stale starts per slot (a slot's fences
    only grow)."""
    by_slot: dict[tuple[str, int], list[Run]] = defaultdict(list)
    for run in pooled:
        for index in run.slots:
            by_slot[(run.pool, index)].append(run)
    for slot, on_it in sorted(by_slot.items()):
        found = AuditReport(heavy_runs=0, light_runs=0)
        _overlaps(on_it, None if ledgers is None else ledgers.get(slot, ()), found)
        report.pool_overlaps.extend(found.overlaps)
        report.pool_fenced_stragglers.extend(found.fenced_stragglers)
        report.pool_late_ends.extend(found.late_ends)
        top = 0
        for run in on_it:
            if run.fence < top:
                report.stale_starts.append(run)
            top = max(top, run.fence)


def _stale_beat_starts(journal: list[Mapping[str, Any]],
                       dispatches: list[Mapping[str, Any]]) -> list[str]:
    """Starts whose message carried a beat fence older than one a beat had already taken."""
    locks = sorted((float(d["t"]), int(d["fence"])) for d in dispatches
                   if d.get("ev") == "lock")
    stale = []
    for e in journal:
        if e["ev"] != "start" or not e.get("beat_fence"):
            continue
        newest = max((f for t, f in locks if t < float(e["t"])), default=0)
        if int(e["beat_fence"]) < newest:
            stale.append(str(e["task"]))
    return stale


def _merged(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping spans joined, sorted."""
    out: list[tuple[float, float]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _covered(a: float, b: float, spans: list[tuple[float, float]]) -> float:
    """How much of (a, b) the (merged) spans cover."""
    return sum(max(0.0, min(b, hi) - max(a, lo)) for lo, hi in spans)


def _gaps(runs: list[Run], bounds: Mapping[str, float], window: tuple[float, float],
          disruptions: list[Disruption]) -> list[tuple[str, float, float, float]]:
    """Each wait of a lane between its starts longer than its bound, net of the time of the
    disruptions that name it (the others' time counts against it)."""
    by_lane: dict[str, list[float]] = defaultdict(list)
    for r in runs:
        by_lane[r.lane].append(r.start)
    lost = []
    lo, hi = window
    for lane, bound in bounds.items():
        spans = _merged((began, until) for began, until, lanes in disruptions if lane in lanes)
        points = [lo, *sorted(t for t in by_lane.get(lane, []) if lo <= t <= hi), hi]
        for a, b in itertools.pairwise(points):
            excused = _covered(a, b, spans)
            if b - a - excused > bound:
                lost.append((lane, a, b, round(excused, 2)))
    return lost


class FencedLedger:
    """An append-only ledger that refuses writers older than the newest fence it has seen."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.keys = [f"{prefix}:ledger:fence", f"{prefix}:ledger", f"{prefix}:ledger:refused"]
        self._append = scripts.register(client, "fenced_append")

    def append(self, fence: int, entry: Mapping[str, Any]) -> bool:
        return int(self._append(keys=self.keys, args=[fence, json.dumps(entry)])) == 1

    def entries(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.client.lrange(self.keys[1], 0, -1)]

    def refused(self) -> int:
        return int(self.client.get(self.keys[2]) or 0)

    def monotone(self) -> bool:
        """Accepted writes never go back to an older fence."""
        fences = [int(e["fence"]) for e in self.entries()]
        return all(a <= b for a, b in itertools.pairwise(fences))


# -- schedule entries ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Claim:
    """One entry message as beat published it: the due time it claimed (the state's
    ``last_run_at`` after the claim; the publish time when the state could not be read) and
    the run count the claim set (None: unknown)."""

    entry: str
    task: str
    at: float
    count: int | None
    sent: float
    #: When its publish began (None: not journaled).
    began: float | None = None


@dataclass(frozen=True)
class EntryAudit:
    sends: int
    runs: int
    #: (entry, task id): one message run more than once.
    duplicate_runs: list[tuple[str, str]] = field(default_factory=list)
    #: (entry, earlier, later): two claims for one due time (interval entries: less than an
    #: interval apart; crontab: two in one minute).
    duplicate_due: list[tuple[str, float, float]] = field(default_factory=list)
    #: (entry, from, to, seconds excused): a due time not claimed within its bound.
    missed: list[tuple[str, float, float, float]] = field(default_factory=list)
    #: (entry, from, to): an interval entry's claim came up to one interval later than its
    #: bound, with a state loss between: the state it counted from was lost.
    delayed_after_loss: list[tuple[str, float, float]] = field(default_factory=list)
    #: (entry, minute): a crontab minute that fell while Redis had lost the state, not sent.
    skipped_after_loss: list[tuple[str, float]] = field(default_factory=list)
    #: (entry, count): a claim no published message carries (its count was skipped), with a
    #: beat killed between the claims around it (documented: killed between claim and
    #: publish, that due time is not sent) / without.
    unsent_at_beat_kill: list[tuple[str, int]] = field(default_factory=list)
    unsent: list[tuple[str, int]] = field(default_factory=list)
    #: (entry, earlier count, later count): the count went back with no fresh start (a state
    #: older than the last claim: a failover to a replica lacking it).
    count_rollbacks: list[tuple[str, int, int]] = field(default_factory=list)
    #: Messages published and never run: the broker restarted empty soon after / not.
    lost_with_broker: list[str] = field(default_factory=list)
    undelivered: list[str] = field(default_factory=list)
    #: Runs of a message no publish record names (a beat killed between publishing and
    #: journaling it).
    unlogged_runs: list[str] = field(default_factory=list)
    #: (entry, recorded run time, publish began): claims recorded more than
    #: :data:`CLAIM_LAG_S` before their publish began.
    recorded_early: list[tuple[str, float, float]] = field(default_factory=list)
    #: Fault kind -> entry due times that fell while it disrupted the fleet.
    due_during: Counter[str] = field(default_factory=Counter)

    @property
    def violations(self) -> int:
        """Due times run twice or missed beyond the documented bounds."""
        return (len(self.duplicate_runs) + len(self.duplicate_due) + len(self.missed)
                + len(self.unsent) + len(self.undelivered))

    def summary(self) -> dict[str, Any]:
        return {"entry_sends": self.sends, "entry_runs": self.runs,
                "entry_duplicates": len(self.duplicate_runs) + len(self.duplicate_due),
                "entry_missed": len(self.missed) + len(self.unsent) + len(self.undelivered),
                "entry_delayed_after_state_loss": len(self.delayed_after_loss),
                "entry_skipped_after_state_loss": len(self.skipped_after_loss),
                "entry_unsent_at_beat_kill": len(self.unsent_at_beat_kill),
                "entry_count_rollbacks": len(self.count_rollbacks),
                "entry_lost_with_broker": len(self.lost_with_broker),
                "entry_unlogged_runs": len(self.unlogged_runs),
                "entry_claims_recorded_early": len(self.recorded_early),
                "entry_due_during_faults": dict(sorted(self.due_during.items()))}


#: The beat kill faults, (began, ended, beats killed that may hold the lock), and how many
#: more unpublished claims of the entry under audit each may account for.
Kills = tuple[list[tuple[float, float, int]], list[int]]


def claims_from_sends(sends: Iterable[Mapping[str, Any]]) -> list[Claim]:
    return sorted((Claim(entry=str(s["entry"]), task=str(s["task"]),
                         at=float(s["at"] if s.get("at") is not None else s["t"]),
                         count=None if s.get("count") is None else int(s["count"]),
                         sent=float(s["t"]),
                         began=None if s.get("began") is None else float(s["began"]))
                   for s in sends), key=lambda c: c.at)


def audit_entries(sends: Iterable[Mapping[str, Any]], runs: Iterable[Mapping[str, Any]], *,
                  intervals: Mapping[str, float], minutely: Iterable[str],
                  window: tuple[float, float], slack_s: float,
                  faults: Iterable[tuple[float, str, float]], state_losses: Iterable[str],
                  broker_losses: Iterable[str], beat_kills: Mapping[str, int],
                  deliver_s: float, beat_stalls: Iterable[str] = (),
                  final_states: Mapping[str, tuple[float, int]] = {}) -> EntryAudit:
    """Check that each entry due time was sent once, from what beat published
    (:func:`entry_sends_key`: entry, task id, the claimed due time and count) and what the
    workers ran (:func:`entry_runs_key`).

    ``faults`` are (began, kind, until): until when the fleet may still be recovering. Time
    inside those that can hold beat's entries step up is not counted against an entry's wait:
    beat killed or frozen (``beat_kills``), its Redis frozen (``beat_stalls``), restarted or
    failed over (``state_losses``), the broker restarted (``broker_losses``); a fault that
    left beat and Redis alone (a heavy worker killed or paused) excuses nothing. The bounds,
    as docs/entries.md documents them:

    * an interval entry is claimed at least one interval after its last claim (less: a
      second claim of one due time) and at most an interval plus ``slack_s`` after it, not
      counting fault time; one interval more after a state loss (``state_losses`` kinds) is
      counted as delayed, not missed: an entry whose state was lost counts from when beat
      saw the loss;
    * a crontab entry (``minutely``) is claimed once in each minute, within ``slack_s`` of the
      minute (not counting fault time; a minute with no claim waited until the next claim, or
      the window's end); a minute that fell inside a state loss may be skipped (counted: a
      state that was lost counts from when beat saw the loss);
    * the claims' counts go up one at a time (or start again at 1 after a state loss): a
      count skipped is a claim never published, allowed only across a beat killed between
      the claim and the publish, and one per entry for each beat killed (``beat_kills``: a
      fault kind -> how many beats that may hold the lock it kills): a tick claims an entry
      at most once and publishes its claims before it claims again (on_celery/entries.py);
      ``final_states`` tells of claims after the last published one (:func:`_last_claims`);
    * every published message runs once, unless a broker restart (a ``broker_losses`` kind)
      was under way within ``deliver_s`` after it was published: the message went with it.
    """
    claims = claims_from_sends(sends)
    runs = list(runs)
    faults = sorted(faults)
    holds_beat = {*state_losses, *broker_losses, *beat_kills, *beat_stalls}
    spans = _merged((began, until) for began, kind, until in faults if kind in holds_beat)
    lossy = [(b, u) for b, kind, u in faults if kind in set(state_losses)]
    kills = [(b, u, beat_kills[kind]) for b, kind, u in faults if kind in beat_kills]
    broker = [(b, u) for b, kind, u in faults if kind in set(broker_losses)]
    report = EntryAudit(sends=len(claims), runs=len(runs))
    hi = window[1]
    unlogged = _messages(claims, runs, broker, deliver_s, hi, report)
    for name in {c.entry for c in claims} | set(intervals) | set(minutely):
        mine = [c for c in claims if c.entry == name]
        left = [n for *_, n in kills]   # claims of this entry each kill may still have lost
        hidden = _entry_counts(name, mine, unlogged, (kills, left), report)
        if name in final_states:
            _last_claims(name, mine, final_states[name], unlogged, (kills, left), hi, hidden,
                         report)
        if name in intervals:
            _interval_entry(name, intervals[name], mine, window, slack_s, spans, lossy,
                            faults, hidden, report)
        elif name in set(minutely):
            _minutely_entry(name, mine, window, slack_s, spans, lossy, faults, hidden, report)
    return report


def _messages(claims: list[Claim], runs: list[Mapping[str, Any]],
              broker: list[tuple[float, float]], deliver_s: float, stop: float,
              report: EntryAudit) -> list[Mapping[str, Any]]:
    """The messages' findings: run twice, claims recorded early, published by ``stop`` and
    never run (:func:`_deliveries`). Returns the runs no publish record names."""
    ran = Counter(str(r["task"]) for r in runs)
    sent_ids = {c.task for c in claims}
    entry_of = {str(r["task"]): str(r["entry"]) for r in runs}
    report.duplicate_runs.extend(sorted((entry_of[t], t) for t, n in ran.items() if n > 1))
    unlogged = [r for r in runs if str(r["task"]) not in sent_ids]
    report.unlogged_runs.extend(str(r["task"]) for r in unlogged)
    report.recorded_early.extend((c.entry, c.at, c.began) for c in claims
                                 if c.began is not None and c.began - c.at > CLAIM_LAG_S)
    _deliveries([c for c in claims if c.sent <= stop], ran, broker, deliver_s, report)
    return unlogged


def _deliveries(claims: list[Claim], ran: Counter[str], broker: list[tuple[float, float]],
                deliver_s: float, report: EntryAudit) -> None:
    """Each published message that never ran: gone with a broker restart under way within
    ``deliver_s`` after its publish, else undelivered."""
    for c in claims:
        if c.task not in ran:
            gone = any(began <= c.sent + deliver_s and c.sent <= until
                       for began, until in broker)
            (report.lost_with_broker if gone else report.undelivered).append(c.task)


def _hidden_between(since: float, until: float, hidden: Mapping[float, int]) -> int:
    """How many claims the counts say were made after the claim at ``since`` and before the
    one at ``until`` without a publish record: each stands for one due time in between."""
    return sum(n for after, n in hidden.items() if since <= after < until)


def _during(t: float, faults: list[tuple[float, str, float]], report: EntryAudit) -> None:
    report.due_during.update({kind for began, kind, until in faults if began <= t <= until})


def _interval_entry(name: str, every: float, mine: list[Claim], window: tuple[float, float],
                    slack_s: float, spans: list[tuple[float, float]],
                    lossy: list[tuple[float, float]], faults: list[tuple[float, str, float]],
                    hidden: Mapping[float, int], report: EntryAudit) -> None:
    for a, b in itertools.pairwise(mine):
        if b.at - a.at < every - CLAIM_EPS_S:
            report.duplicate_due.append((name, a.at, b.at))
        _during(a.at + every, faults, report)
    lo, hi = window
    points = [lo, *(c.at for c in mine if lo < c.at < hi), hi]
    for since, until in itertools.pairwise(points):
        excused = _covered(since, until, spans)
        # A claim the counts account for (a beat killed between its claim and its publish, or
        # between the publish and its record) holds an interval of its own.
        over = until - since - excused - (every + slack_s) * (1 + _hidden_between(
            since, until, hidden))
        if over <= 0:
            continue
        if over <= every and any(since < began < until for began, _ in lossy):
            report.delayed_after_loss.append((name, since, until))
        else:
            report.missed.append((name, since, until, round(excused, 2)))


def _minutely_entry(name: str, mine: list[Claim], window: tuple[float, float], slack_s: float,
                    spans: list[tuple[float, float]], lossy: list[tuple[float, float]],
                    faults: list[tuple[float, str, float]], hidden: Mapping[float, int],
                    report: EntryAudit) -> None:
    by_minute: dict[float, list[Claim]] = defaultdict(list)
    for c in mine:
        by_minute[c.at // 60 * 60].append(c)
    for same_minute in by_minute.values():
        for a, b in itertools.pairwise(same_minute):
            report.duplicate_due.append((name, a.at, b.at))
    # Claims the counts account for without a publish record (see _entry_counts), keyed by the
    # recorded claim before them: each may stand for one unrecorded minute after that claim.
    unrecorded = dict(hidden)
    claimed_ats = sorted(c.at for c in mine)
    lo, hi = window
    # Every minute whose bound (slack_s after it) ended inside the window.
    for minute in range(int(lo // 60 + 1) * 60, math.ceil(hi - slack_s), 60):
        _during(minute, faults, report)
        claimed = by_minute.get(float(minute))
        if claimed:
            first = claimed[0].at
        else:
            before = max((at for at in claimed_ats if at < minute), default=-math.inf)
            if unrecorded.get(before, 0) > 0:
                unrecorded[before] -= 1  # already counted by _entry_counts
                continue
            if any(began <= minute <= until for began, until in lossy):
                report.skipped_after_loss.append((name, float(minute)))
                continue
            # Not claimed in its minute: it waited at least until the next claim (of a later
            # minute), or to the window's end - judged on that wait as a late claim is, not
            # counting fault time. A run whose last fault (a beat killed just before the
            # minute) ends as the window does stopped the fleet before the standby's first
            # tick could send it: its bound had not passed.
            first = min((at for at in claimed_ats if at > minute), default=hi)
        excused = _covered(minute, first, spans)
        if first - minute - excused > slack_s:
            report.missed.append((name, float(minute), first, round(excused, 2)))


def _entry_counts(name: str, mine: list[Claim], unlogged: list[Mapping[str, Any]],
                  kills: Kills, report: EntryAudit) -> dict[float, int]:
    """Counts go up one per claim: a count skipped is a claim never published (unless its
    message ran unlogged); a count that goes back, other than a fresh start at 1, read a
    state older than the last claim.

    Returns, keyed by the due time of the recorded claim before them, how many claims were
    made with no publish record that the fault bounds allow (a message that ran unlogged, a
    claim lost with a beat killed before its publish): the due times they took are neither
    missed nor late, they are accounted for here."""
    hidden: dict[float, int] = {}
    known = [c for c in sorted(mine, key=lambda c: c.sent) if c.count is not None]
    for a, b in itertools.pairwise(known):
        assert a.count is not None and b.count is not None
        if b.count == 1 or b.count == a.count + 1:
            continue
        if b.count <= a.count:
            report.count_rollbacks.append((name, a.count, b.count))
            continue
        quiet = sum(1 for r in unlogged
                    if str(r["entry"]) == name and a.sent < float(r["t"]) <= b.sent)
        missing = range(a.count + 1, b.count)
        lost = _lost_at_kills(kills, a.sent, b.sent, len(missing) - min(quiet, len(missing)))
        allowed = _unpublished(name, missing, quiet, lost, report)
        if allowed:
            hidden[a.at] = hidden.get(a.at, 0) + allowed
    return hidden


def _lost_at_kills(kills: Kills, since: float, until: float, wanted: int) -> int:
    """How many of ``wanted`` claims made and never published between ``since`` and
    ``until`` the beat kill faults under way then account for: each at most the beats it
    killed, over the whole run (``kills``: the faults (began, ended, beats killed) and what
    each may still account for, taken from)."""
    faults, left = kills
    lost = 0
    for i, (began, ended, _) in enumerate(faults):
        if began <= until and ended >= since and lost < wanted:
            take = min(left[i], wanted - lost)
            left[i] -= take
            lost += take
    return lost


def _unpublished(name: str, missing: range, quiet: int, lost: int, report: EntryAudit) -> int:
    """The ``missing`` counts, claims never published: the first ``quiet`` ran unlogged (a
    beat killed between the publish and its record), the next ``lost`` died with a beat
    killed before the publish, the rest are unsent. Returns how many are accounted for."""
    for i, count in enumerate(missing[quiet:]):
        (report.unsent_at_beat_kill if i < lost else report.unsent).append((name, count))
    return min(quiet, len(missing)) + min(lost, len(missing[quiet:]))


def _last_claims(name: str, mine: list[Claim], final: tuple[float, int],
                 unlogged: list[Mapping[str, Any]], kills: Kills, stop: float,
                 hidden: dict[float, int], report: EntryAudit) -> None:
    """The claims after the last published one, told by the state at the end (``final``:
    ``last_run_at`` and count, read once the beats stopped; the window ends at ``stop``,
    when they were told to): each count above the last published one (0 before the first:
    a fresh state) is a claim never published, unless its message ran unlogged; allowed
    one per beat killed since the last published claim (:func:`_lost_at_kills`), and one
    for the fleet's ``stop`` (which stops beat too) when the newest claim was made just
    before it; the newest claim needs a beat killed or stopped after it. A state lost
    since, or rolled back,
    counts no higher and tells nothing. Adds them to ``hidden`` (as :func:`_entry_counts`
    does) under the last published claim's due time (``-inf`` before the first)."""
    known = [c for c in sorted(mine, key=lambda c: c.sent) if c.count is not None]
    last = known[-1] if known else None
    at, count = final
    base = last.count if last is not None and last.count is not None else 0
    since = last.sent if last is not None else -math.inf
    if count <= base or (last is not None and at <= last.at):
        return
    quiet = sum(1 for r in unlogged if str(r["entry"]) == name and float(r["t"]) > since)
    missing = range(base + 1, count + 1)
    unpublished = len(missing) - min(quiet, len(missing))
    stopped = int(stop - at <= CLAIM_LAG_S and unpublished > 0)
    # The newest claim (made at ``at``) died with a beat only if one was killed or stopped
    # after it (a kill fault's end: the frozen beat dies then); else beat ran on unpublished.
    if not stopped and not any(ended >= at for _, ended, _ in kills[0]):
        unpublished -= 1
    lost = stopped + _lost_at_kills(kills, since, math.inf, max(unpublished - stopped, 0))
    allowed = _unpublished(name, missing, quiet, lost, report)
    if allowed:
        key = last.at if last is not None else -math.inf
        hidden[key] = hidden.get(key, 0) + allowed
