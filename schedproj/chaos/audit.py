"""The overlap and loss detector: reads the run journal and dispatch log, reports violations.

Pure functions over journal entries (``{"ev": "start"|"end", "lane", "task", "fence", "t",
...}``) and dispatch-log entries (``{"lane", "task", "fence", "t"}``), plus
:class:`FencedLedger`, the fenced write every heavy lane's side effects should go through.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

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


def family_members(count: int) -> list[str]:
    """The chaos family's member keys."""
    return [f"t{i:03d}" for i in range(count)]


def overlaps_key(prefix: str) -> str:
    """Audit-Redis list of overlaps seen at the OS level (written by the chaos lanes)."""
    return f"{prefix}:os-overlaps"


@dataclass(frozen=True)
class Run:
    lane: str
    task: str
    fence: int
    start: float
    end: float | None
    outcome: str | None
    lost: str | None


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

    def summary(self) -> dict[str, Any]:
        return {"heavy_runs": self.heavy_runs, "light_runs": self.light_runs,
                "overlaps": len(self.overlaps), "duplicates": len(self.duplicates),
                "stale_starts": len(self.stale_starts), "lost_runs": len(self.lost),
                "fenced_stragglers": len(self.fenced_stragglers),
                "stale_beat_starts": len(self.stale_beat_starts),
                "recorded_lost": len(self.recorded_lost),
                "unended_unrecorded": len(self.unended_unrecorded),
                "late_ends": len(self.late_ends)}


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
                        lost=ended.get("lost") if ended else None))
    return sorted(runs, key=lambda r: r.start)


def audit(journal: Iterable[Mapping[str, Any]], dispatches: Iterable[Mapping[str, Any]], *,
          due_bounds_s: Mapping[str, float], window: tuple[float, float],
          ledger: Iterable[Mapping[str, Any]] | None = None,
          disruptions: Iterable[tuple[float, float]] = ()) -> AuditReport:
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
    * duplicate: one dispatched message (task id) executed twice, or sent twice;
    * stale start: a run started with a fence older than one already started;
    * lost: a lane went longer than its bound without starting a run, inside ``window``,
      not counting the time inside ``disruptions`` ((from, to): a fault and the recovery it
      needs). Faults may come back to back (one every few seconds), and a lane waiting through
      two of them waits out both: a bound of "cadence plus one fault's recovery" would call
      that a loss, and one of "plus every fault's" would excuse anything once faults are dense.
    """
    journal = list(journal)
    runs = runs_from_journal(journal)
    heavy = [r for r in runs if r.fence > 0]
    report = AuditReport(heavy_runs=len(heavy), light_runs=len(runs) - len(heavy))
    _overlaps(heavy, ledger, report)
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
    report.lost.extend(_gaps(runs, due_bounds_s, window, _merged(disruptions)))
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
          disruptions: list[tuple[float, float]]) -> list[tuple[str, float, float, float]]:
    by_lane: dict[str, list[float]] = defaultdict(list)
    for r in runs:
        by_lane[r.lane].append(r.start)
    lost = []
    lo, hi = window
    for lane, bound in bounds.items():
        points = [lo, *sorted(t for t in by_lane.get(lane, []) if lo <= t <= hi), hi]
        for a, b in itertools.pairwise(points):
            excused = _covered(a, b, disruptions)
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
