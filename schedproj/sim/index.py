"""Which lanes a simulated decision plans: beat's due index (``core.dueindex``) in virtual time,
so a decision costs the lanes that need a look, not every lane.

Beat plans the lanes whose next look has come, the lanes whose records changed, the lanes it
reads every tick (gate blockers) and the lease holder; a heavy lane recorded as waiting for
the lease is skipped, since the planner would defer it again with the same streak. The
simulator does the same, with one addition beat does not need: the waiting lanes the picker
would rank first (:meth:`LaneIndex.leaders`) are planned too, so the pick at a hand-off and
the pressure published during a hold see the lane they would see planning every lane. A
waiting lane's rank changes only with time, and along a line: its weighted staleness ratio is
``weight x (now - last run) / cadence``, so waiting lanes of one pool, cadence and weight keep
their order, and the leaders are found from one heap per such group without looking at the
rest. A pool of ``n`` slots grants at most ``n`` lanes a tick, walking past at most its lanes
that take more than one slot (``pools.grant``): its leaders are the first that many.
"""

from __future__ import annotations

import heapq
import math
from enum import StrEnum
from typing import Any, NamedTuple

from schedproj.core.planner import Plan
from schedproj.core.pools import DEFAULT_POOL
from schedproj.core.pressure import measure
from schedproj.core.records import LeaseView
from schedproj.sim.model import SimError

#: A look this close after ``now`` counts as come: the planner judges "due" by a ratio and the
#: index by a time, and the two may round a lane falling due exactly now differently. Planning
#: a lane early costs a view; planning it late would change the output.
LOOK_SLACK_S = 1e-6
#: Ratios this close (relative) to the best waiting lane's are planned too: the planner's own
#: arithmetic then breaks the tie (declared order, name) exactly.
RANK_SLACK = 1e-9


class Planning(StrEnum):
    """How the simulator chooses the lanes a decision plans."""

    #: The lanes the due index names (the default): what beat plans, plus the waiting leaders.
    INDEX = "index"
    #: Every lane at every decision, as before the due index (kept to check ``INDEX`` against).
    FULL = "full"
    #: ``INDEX``, and at every decision also the full plan, compared: a difference is an error.
    CHECK = "check"


class Rank(NamedTuple):
    """How the picker ranks a lane waiting for the lease (or a slot of its pool), fixed
    while it waits: its pool, priority-0 tier, cadence and weight (its group), its last run
    as the staleness ratio counts it (None: never ran, maximally stale), its declared order
    and name. (A named tuple: one is built for every lane filed as waiting, and a frozen
    dataclass's ``__init__`` costs three times as much.)"""

    tier: int
    cadence_s: float
    last: float | None
    order: int
    name: str
    pool: str = DEFAULT_POOL
    weight: float = 1.0

    def ratio(self, now: float) -> float:
        """The weighted staleness ratio at ``now`` (``views.staleness_ratio``'s arithmetic,
        times the weight, as ``picker.rank_key`` ranks)."""
        if self.last is None:
            return math.inf
        return self.weight * (max(0.0, now - self.last) / self.cadence_s)


_Entry = tuple[float, int, str]
_Group = tuple[str, int, float, float]
#: A group heap's entry: the lane's key in the group's order (declared order and name, or
#: whether it ran, its last run, order and name), then its version and name, in one flat
#: tuple (a nested key costs every heap comparison a second tuple comparison).
_Member = tuple[Any, ...]  # (its fields are of several types: Any, for the last two)


class LaneIndex:
    """The lanes' next looks and wake-ups, and the lanes due now: ``active`` (planned at every
    decision) and ``waiting`` (heavy lanes recorded as waiting for the lease, skipped but for
    their leaders). ``dirty`` lanes changed since they were last filed: planned next.
    ``walks``: per pool, how many lanes its grant may walk in a tick (its slots, plus its
    lanes taking more than one slot); 1 for a pool not given."""

    def __init__(self, by_order: bool, walks: dict[str, int] | None = None) -> None:
        #: The legacy registry picker ranks by declared order alone (no staleness).
        self.by_order = by_order
        self.walks = walks or {}
        self.active: set[str] = set()
        self.waiting: dict[str, tuple[Rank, int]] = {}
        self.dirty: set[str] = set()
        self._version: dict[str, int] = {}
        self._seq = 0
        self._looks: list[_Entry] = []
        #: (wake, version, lane, whether the wake is also the lane's look: no looks entry).
        self._wakes: list[tuple[float, int, str, bool]] = []
        self._groups: dict[_Group, list[_Member]] = {}
        #: Entries in the groups' heaps, stale ones included (when to compact them).
        self._entries = 0
        #: Each group's leader as a walk of one last found it: (lane, its rank, until when
        #: no other lane of the group can tie with it, its heap entry). A group's order does
        #: not move with time, so only the ratio is computed again; a lane joining the group
        #: is compared with the leader (:meth:`_join`), the leader leaving drops it.
        self._tops: dict[_Group, tuple[str, Rank, float, _Member]] = {}

    def _group(self, rank: Rank) -> _Group:
        return (("", 0, 0.0, 1.0) if self.by_order
                else (rank.pool, rank.tier, rank.cadence_s, rank.weight))

    def file(self, lane: str, look: float, wake: float | None, now: float,
             rank: Rank | None = None) -> None:
        """Where the lane stands after a decision at ``now``: its next look (due now when it
        has come), the instant it falls due by time (None: it does not while in flight), and
        its rank when it waits for the lease and may be skipped."""
        self._seq += 1
        version = self._seq
        self._version[lane] = version
        self.active.discard(lane)
        left = self.waiting.pop(lane, None)
        if left is not None:
            group = self._group(left[0])
            top = self._tops.get(group)
            if top is not None and top[0] == lane:
                del self._tops[group]  # (another lane leaving only widens the leader's lead)
        if look <= now + LOOK_SLACK_S:
            if rank is None:
                self.active.add(lane)
                return
            self.waiting[lane] = (rank, version)
            group = self._group(rank)
            self._entries += 1
            entry: _Member = ((rank.order, rank.name, version, lane) if self.by_order else
                              (rank.last is not None, rank.last or 0.0, rank.order, rank.name,
                               version, lane))
            if group in self._tops:
                self._join(group, lane, rank, entry, now)
            heapq.heappush(self._groups.setdefault(group, []), entry)
            return
        if wake is not None and wake != math.inf:
            # A lane due at its look (a probed one: look and wake are one instant) has one
            # entry, in the wakes (:meth:`advance` reads them too): one push and pop fewer.
            heapq.heappush(self._wakes, (wake, version, lane, wake == look))
            if wake == look:
                return
        if look != math.inf:
            heapq.heappush(self._looks, (look, version, lane))

    def _join(self, group: _Group, lane: str, rank: Rank, key: _Member,
              now: float) -> None:
        """A lane joins a group whose leader is kept: it leads now if it ranks first, and
        until when no lane can tie with the leader is shortened by its gap (the gaps within
        a group never shrink). Dropped when that cannot be told (ties, two never-run lanes).
        (Entries compare as their keys: two lanes' keys differ, by name at least.)"""
        tops = self._tops
        lead, lead_rank, until, lead_key = tops[group]
        if self.by_order:  # (declared order and name: no ties)
            if key < lead_key:
                tops[group] = (lane, rank, math.inf, key)
            return
        mine, theirs = rank.ratio(now), lead_rank.ratio(now)
        if mine == theirs == math.inf:
            del tops[group]
        elif key < lead_key:  # leads now: every other lane trails the old leader, and it
            tops[group] = (lane, rank, _apart_until(rank, mine - theirs), key)
        elif theirs != math.inf:
            tops[group] = (lead, lead_rank, min(until, _apart_until(lead_rank, theirs - mine)),
                           lead_key)

    def _valid(self, version: int, lane: str) -> bool:
        return self._version.get(lane) == version

    def advance(self, now: float) -> None:
        """Lanes whose next look has come by ``now`` become active: from the looks, and from
        the wakes those filed due at their look (a lane's look is never after its wake, so a
        wake come by ``now`` is a look come too; an entry of a lane whose look came is stale)."""
        looks, wakes, versions = self._looks, self._wakes, self._version
        while looks and looks[0][0] <= now + LOOK_SLACK_S:
            _, version, lane = heapq.heappop(looks)
            if versions.get(lane) == version:
                self._seq += 1
                versions[lane] = self._seq  # its wake-up goes with it
                self.active.add(lane)
        while wakes and wakes[0][0] <= now + LOOK_SLACK_S:
            _, version, lane, _ = heapq.heappop(wakes)
            if versions.get(lane) == version:
                self._seq += 1
                versions[lane] = self._seq
                self.active.add(lane)

    def next_wake(self) -> float | None:
        """The earliest instant a lane not due now falls due by time (None: none does)."""
        wakes = self._wakes
        while wakes and not self._valid(wakes[0][1], wakes[0][2]):
            heapq.heappop(wakes)
        return wakes[0][0] if wakes else None

    def leaders(self, now: float) -> list[str]:
        """The waiting lanes a pool's grant could walk at ``now``: per pool, the first of its
        walk's length (:attr:`walks`; the lease: 1) in rank order, and any whose ratio ties
        with the last of them within :data:`RANK_SLACK`."""
        if not self.waiting:
            return []
        found: dict[str, list[tuple[int, float, str]]] = {}
        walks, tops, inf = self.walks, self._tops, math.inf
        for group, heap in self._groups.items():
            if not heap:
                continue
            pool = group[0]
            walk = walks.get(pool, 1)
            cached = tops.get(group) if walk == 1 else None
            if cached is not None and now <= cached[2]:
                # The kept leader (the usual case): Rank.ratio's arithmetic, inline.
                rank = cached[1]
                last = rank.last
                ratio = (inf if last is None
                         else rank.weight * (max(0.0, now - last) / rank.cadence_s))
                entry = (group[1], ratio, cached[0])
                lanes = found.get(pool)
                if lanes is None:
                    found[pool] = [entry]
                else:
                    lanes.append(entry)
                continue
            top = self._group_top(heap, now, walk, group)
            if top:  # (lists, not generators: a decision asks this of a few groups)
                found.setdefault(pool, []).extend([(group[1], r, lane) for r, lane in top])
        if self._entries > 4 * len(self.waiting) + 64:
            self._compact()
        return self._pick_leaders(found)

    def _pick_leaders(self, found: dict[str, list[tuple[int, float, str]]]) -> list[str]:
        """Per pool, of its groups' leaders (tier, ratio, lane): the first of its walk's
        length in rank order and those tying with the last of them."""
        if self.by_order:
            return [lane for lanes in found.values() for _, _, lane in lanes]
        out: list[str] = []
        walks = self.walks
        for pool, lanes in found.items():
            walk = walks.get(pool, 1)
            if len(lanes) <= walk:  # all of them (in no order: the caller takes a set)
                out.extend([lane for _, _, lane in lanes])
                continue
            if walk == 1:  # the lease: the first in rank order, no sort needed
                tier, last = min([(t, -r) for t, r, _ in lanes])
                last = -last
            else:
                lanes.sort(key=lambda x: (x[0], -x[1]))
                tier, last = lanes[walk - 1][0], lanes[walk - 1][1]
            floor = _floor(last)
            out.extend([lane for i, (t, r, lane) in enumerate(lanes)
                        if (t == tier and r >= floor) or (walk > 1 and i < walk)])
        return out

    def _group_top(self, heap: list[_Member],
                   now: float, walk: int = 1, group: _Group | None = None,
                   ) -> list[tuple[float, str]]:
        """The group's first ``walk`` valid lanes and those tying with the last of them (put
        back afterwards)."""
        if walk == 1:
            quick = self._group_first(heap, now, group)
            if quick is not None:
                return quick
        taken: list[_Member] = []
        out: list[tuple[float, str]] = []
        floor: float | None = None
        while heap:
            entry = heap[0]
            state = self.waiting.get(entry[-1])
            if state is None or state[1] != entry[-2]:
                heapq.heappop(heap)  # stale: the lane was filed again or left
                self._entries -= 1
                continue
            ratio = state[0].ratio(now)
            if len(out) >= walk and (self.by_order or floor is None or ratio < floor):
                break
            if len(out) == walk - 1:
                floor = _floor(ratio)
            out.append((ratio, entry[-1]))
            taken.append(heapq.heappop(heap))
        for entry in taken:
            heapq.heappush(heap, entry)
        return out

    def _group_first(self, heap: list[_Member],
                     now: float, group: _Group | None = None,
                     ) -> list[tuple[float, str]] | None:
        """:meth:`_group_top` for a walk of one, without taking the lane out of the heap when
        the entry ranked next cannot tie with it (the usual case, and one a decision meets
        once per group): [] for a group with no valid lane, None when the full walk must
        decide. The entry ranked next is the smaller of the root's two children."""
        waiting = self.waiting
        while heap:
            first = heap[0]
            version, lane = first[-2], first[-1]
            state = waiting.get(lane)
            if state is None or state[1] != version:
                heapq.heappop(heap)  # stale: the lane was filed again or left
                self._entries -= 1
                continue
            rank = state[0]
            ratio = rank.ratio(now)
            if self.by_order or len(heap) == 1:
                if group is not None:  # (the only lane, or the legacy order: no ties)
                    self._tops[group] = (lane, rank, math.inf, first)
                return [(ratio, lane)]
            second = heap[1] if len(heap) == 2 or heap[1] < heap[2] else heap[2]
            other = waiting.get(second[-1])
            if other is None or other[1] != second[-2]:
                return None  # a stale entry next: the full walk looks past it
            next_ratio = other[0].ratio(now)
            if next_ratio >= _floor(ratio):
                return None
            if group is not None:
                self._tops[group] = (lane, rank, _apart_until(rank, ratio - next_ratio),
                                     first)
            return [(ratio, lane)]
        return []

    def _compact(self) -> None:
        """Drop stale entries, so the heaps stay the size of what they index."""
        for group, heap in list(self._groups.items()):
            live = [e for e in heap if (s := self.waiting.get(e[-1])) is not None
                    and s[1] == e[-2]]
            heapq.heapify(live)
            self._entries += len(live) - len(heap)
            if live:
                self._groups[group] = live
            else:
                del self._groups[group]


def _apart_until(first: Rank, gap: float) -> float:
    """Until when no lane of ``first``'s group ranked after it can tie with it, ``gap``
    being the difference of their ratios now: within a group the ratios grow at the same
    rate, so the gap never shrinks, while the tie margin (:data:`RANK_SLACK`, relative) grows
    with the ratio; the leader is kept while that margin is at most half the gap (the float
    error of the ratios is far smaller). -inf: no such instant (a gap within a few margins)."""
    if first.last is None:
        return math.inf  # never ran: ranked first for good; only another such lane ties
    if gap < 4 * RANK_SLACK or first.weight <= 0:
        return -math.inf
    return first.last + gap / (2 * RANK_SLACK) * first.cadence_s / first.weight


def _floor(ratio: float) -> float:
    """Ratios at or above this tie with ``ratio`` (within :data:`RANK_SLACK`)."""
    return ratio - RANK_SLACK * max(1.0, abs(ratio)) if ratio != math.inf else ratio


def check_plans(part: Plan, full: Plan, lease: LeaseView | None, now: float,
                pressure: bool, heavy_resting: bool = False) -> None:
    """Raise :class:`SimError` where the plan of the lanes the index names decides otherwise
    than the plan of every lane: what is sent, the records written, the deferrals logged,
    the gates that lapsed, whether a heavy lane is due (the lease's holder aside: it is not
    planned; ``heavy_resting``: a heavy gated lane at rest, due and not planned), and
    (``pressure``: the simulation publishes it) the pressure on the lease."""
    a, b = part.decision, full.decision
    holder = lease.lane if lease is not None else None
    checks = {
        "winner": (a.winner, b.winner),
        "light lanes sent": (a.also_dispatched, b.also_dispatched),
        "message ids": ({k: v.task_id for k, v in part.sends.items()},
                        {k: v.task_id for k, v in full.sends.items()}),
        "records written": (part.changes, full.changes),
        "deferrals logged": (sorted(part.new_deferrals, key=repr),
                             sorted(full.new_deferrals, key=repr)),
        "gates lapsed": (a.expired_gates, b.expired_gates),
        "a heavy lane due": (heavy_resting or any(v.due for v in a.views.values()
                                                  if v.spec.heavy and v.name != holder),
                             any(v.due for v in b.views.values()
                                 if v.spec.heavy and v.name != holder)),
        "pressure": ((measure(a, part.states, lease, now), measure(b, full.states, lease, now))
                     if lease is not None and pressure else (None, None)),
    }
    for what, (mine, every) in checks.items():
        if mine != every:
            raise SimError(f"t={now}: planning the due index's lanes differs from planning "
                           f"every lane in {what}: {mine!r} != {every!r}")


__all__ = ["LOOK_SLACK_S", "RANK_SLACK", "LaneIndex", "Planning", "Rank", "check_plans"]
