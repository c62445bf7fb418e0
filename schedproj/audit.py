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

from schedproj import scripts


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
    lost: list[tuple[str, float, float]] = field(default_factory=list)
    fenced_stragglers: list[Run] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"heavy_runs": self.heavy_runs, "light_runs": self.light_runs,
                "overlaps": len(self.overlaps), "duplicates": len(self.duplicates),
                "stale_starts": len(self.stale_starts), "lost_runs": len(self.lost),
                "fenced_stragglers": len(self.fenced_stragglers)}


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
          due_bounds_s: Mapping[str, float], window: tuple[float, float]) -> AuditReport:
    """Check the promises on what actually ran.

    * overlap: a heavy run that did not notice losing its lease ran on after a newer-fenced
      heavy run started (a run that noticed, and stopped at its checkpoint, is a fenced
      straggler: its writes are refused by the fence, see :class:`FencedLedger`);
    * duplicate: one dispatched message (task id) executed twice, or sent twice;
    * stale start: a run started with a fence older than one already started;
    * lost: a lane went longer than its bound without starting a run, inside ``window``.
    """
    journal = list(journal)
    runs = runs_from_journal(journal)
    heavy = [r for r in runs if r.fence > 0]
    report = AuditReport(heavy_runs=len(heavy), light_runs=len(runs) - len(heavy))
    for i, older in enumerate(heavy):
        for newer in heavy[i + 1:]:
            if newer.fence <= older.fence or older.end is None or older.end <= newer.start:
                continue
            if older.lost:
                report.fenced_stragglers.append(older)
            else:
                report.overlaps.append((older, newer))
    started = Counter(str(e["task"]) for e in journal if e["ev"] == "start")
    sent = Counter(str(d["task"]) for d in dispatches)
    report.duplicates.extend(sorted(t for t, n in (started + sent).items()
                                    if started[t] > 1 or sent[t] > 1))
    top = 0
    for run in heavy:
        if run.fence < top:
            report.stale_starts.append(run)
        top = max(top, run.fence)
    report.lost.extend(_gaps(runs, due_bounds_s, window))
    return report


def _gaps(runs: list[Run], bounds: Mapping[str, float],
          window: tuple[float, float]) -> list[tuple[str, float, float]]:
    by_lane: dict[str, list[float]] = defaultdict(list)
    for r in runs:
        by_lane[r.lane].append(r.start)
    lost = []
    lo, hi = window
    for lane, bound in bounds.items():
        points = [lo, *sorted(t for t in by_lane.get(lane, []) if lo <= t <= hi), hi]
        for a, b in itertools.pairwise(points):
            if b - a > bound:
                lost.append((lane, a, b))
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
