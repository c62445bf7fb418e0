"""Pools: named heavy resources with N slots, and how each tick grants a pool's free slots. Pure.

A heavy lane runs in a pool. Without ``Lane(pool=...)`` it is in the default pool ``heavy`` of
one slot: the ADR's one heavy lease, unchanged. A team declares more pools in code
(``Pool("gpu", slots=2)``) or in the environment (``SCHEDPROJ_POOLS="gpu=2,db=3"``, read by
:func:`parse_pools`; the environment wins over code, see :func:`declare_pools`).

Each tick, :func:`grant` gives every pool's free slots to its top-ranked due lanes. The ranking
is the picker's (:func:`schedproj.core.picker.rank_key`): priority-0 first, then the weighted
staleness ratio ``weight x ratio`` (largest first), then declared order, then name. A lane
needing ``k`` slots (``Lane(slots=k)``) gets all ``k`` at once or none; the backfill rule says
when smaller lanes may use the free slots it waits for (see :func:`grant`).

This module only decides. The slot leases in Redis, the queues per pool and beat's wiring are
at the edges.
"""

from __future__ import annotations

import functools
import heapq
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from schedproj.core import defaults
from schedproj.core.errors import ConfigurationError
from schedproj.core.frozen import is_plain

if TYPE_CHECKING:  # views imports lanes, which imports this module: no cycle at run time
    from schedproj.core.views import LaneView

#: The pool every heavy lane is in unless it names another: one slot, today's heavy lease,
#: served by queue ``heavy``.
DEFAULT_POOL = defaults.HEAVY_QUEUE
#: The default pool's slot count; it cannot be changed (promise 1 is about this one lease).
DEFAULT_POOL_SLOTS = 1
#: The environment variable that declares pools (``"gpu=2,db=3"``).
POOLS_SETTING = "SCHEDPROJ_POOLS"
#: A pool name becomes a Celery queue name and part of Redis keys: 1 to 64 characters out of
#: letters, digits and ``_ - .``, starting with a letter or digit.
POOL_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
POOL_NAME_RULE = ("1 to 64 characters out of letters, digits and _ - . , starting with a "
                  "letter or digit")
#: Names a pool may not take: the light lanes' queue.
RESERVED_POOL_NAMES = frozenset({defaults.LIGHT_QUEUE})
#: The backfill bound (see :func:`grant`): a due lane that does not fit in its pool's free
#: slots lets smaller, lower-ranked lanes use them until its staleness ratio reaches its due
#: ratio plus this; from then on the pool reserves its free slots for it.
BACKFILL_RATIO = 0.5


class PoolError(ConfigurationError):
    """A pool declaration is invalid: names the pool (or setting) and the fix."""

    def __init__(self, pool: str, problem: str, fix: str) -> None:
        self.pool = pool
        self.problem = problem
        self.fix = fix
        super().__init__(f"pool {pool!r}: {problem}. Fix: {fix}")


def pool_name_problem(name: object) -> str | None:
    """What is wrong with ``name`` as a pool name (None: nothing)."""
    if not isinstance(name, str):
        return f"the pool name must be text, got {name!r}"
    if not POOL_NAME_PATTERN.fullmatch(name):
        return f"the pool name {name!r} is not {POOL_NAME_RULE}"
    if name in RESERVED_POOL_NAMES:
        return f"the pool name {name!r} is the light lanes' queue"
    return None


@dataclass(frozen=True)
class Pool:
    """A named heavy resource with ``slots`` slots: at most ``slots`` runs of its lanes at once
    (a lane declared with ``slots=k`` takes k of them). Validated when made."""

    name: str
    slots: int = 1

    def __post_init__(self) -> None:
        problem = pool_name_problem(self.name)
        if problem is not None:
            raise PoolError(str(self.name), problem,
                            f"name it with {POOL_NAME_RULE}, e.g. Pool('gpu', slots=2)")
        slots: Any = self.slots
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise PoolError(self.name, f"slots must be an integer >= 1, got {slots!r}",
                            f"declare Pool({self.name!r}, slots=<how many runs at once>), "
                            "e.g. slots=2")
        if self.name == DEFAULT_POOL and slots != DEFAULT_POOL_SLOTS:
            raise PoolError(self.name, f"the default pool {DEFAULT_POOL!r} always has "
                            f"{DEFAULT_POOL_SLOTS} slot (the heavy lease), got slots={slots}",
                            "declare a pool of its own name (Pool('gpu', slots=2)) and give "
                            "its lanes Lane(pool='gpu')")


DEFAULT = Pool(DEFAULT_POOL, DEFAULT_POOL_SLOTS)


def parse_pools(text: str | None, setting: str = POOLS_SETTING) -> tuple[Pool, ...]:
    """The pools an environment value declares: ``"gpu=2,db=3"`` (spaces allowed around names,
    numbers and commas; empty or None: none). Errors name the setting, the entry and the fix."""
    if text is None or not text.strip():
        return ()
    pools: list[Pool] = []
    seen: set[str] = set()
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            raise PoolError(setting, f"an empty entry in {text!r}",
                            "separate pools by single commas: gpu=2,db=3")
        name, sep, count = (part.strip() for part in entry.partition("="))
        if not sep:
            raise PoolError(setting, f"the entry {entry!r} has no '=<slots>'",
                            f"write {name or 'name'}=<slots>, e.g. gpu=2")
        if not re.fullmatch(r"[0-9]+", count):
            raise PoolError(setting, f"the entry {entry!r} has slots {count!r}, not a whole "
                            "number", f"write {name or 'name'}=<slots>, e.g. {name or 'gpu'}=2")
        if name in seen:
            raise PoolError(setting, f"pool {name!r} is declared twice in {text!r}",
                            f"keep one {name}=<slots> entry")
        seen.add(name)
        try:
            pools.append(Pool(name, int(count)))
        except PoolError as exc:
            raise PoolError(setting, f"the entry {entry!r}: {exc.problem}", exc.fix) from None
    return tuple(pools)


def declare_pools(code: Iterable[Pool] = (), environment: Iterable[Pool] = ()
                  ) -> dict[str, Pool]:
    """Every pool by name: the default pool, then those declared in code, then those of the
    environment (which win over code's pool of the same name: an operator resizes a pool
    without a release). A name declared twice in code is an error."""
    pools = {DEFAULT_POOL: DEFAULT}
    named_in_code: set[str] = set()
    for pool in code:
        if not isinstance(pool, Pool):
            raise PoolError(str(pool), f"{pool!r} is not a schedproj Pool",
                            "declare pools as Pool('gpu', slots=2)")
        if pool.name in named_in_code:
            raise PoolError(pool.name, "declared twice in code",
                            "declare each pool once (Pool(name, slots=...))")
        named_in_code.add(pool.name)
        pools[pool.name] = pool
    for pool in environment:
        pools[pool.name] = pool
    return pools


def pools_by_name(pools: Mapping[str, Pool] | Iterable[Pool] | None) -> dict[str, Pool]:
    """``pools`` as a table by name, the default pool always in it (None: only the default)."""
    if pools is None:
        return declare_pools()
    if isinstance(pools, Mapping):
        return declare_pools(pools.values())
    return declare_pools(pools)


# -- granting slots ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Grant:
    """A lane granted ``slots`` slots of ``pool`` this tick."""

    lane: str
    pool: str
    slots: int


@dataclass(frozen=True)
class Grants:
    """What :func:`grant` decided for one tick."""

    #: The grants, pool by pool (pools by name), each pool's in rank order.
    granted: tuple[Grant, ...] = ()
    #: Every candidate not granted, with the lane it waits behind: the pool's top grant this
    #: tick, else the lane the pool reserves for (when it ranks above), else a holder of the
    #: pool (None when none is known).
    waiting: Mapping[str, str | None] = field(default_factory=dict)
    #: Pools whose free slots are reserved for a lane that does not fit yet: pool -> lane.
    reserved: Mapping[str, str] = field(default_factory=dict)

    @property
    def lanes(self) -> tuple[str, ...]:
        return tuple(g.lane for g in self.granted)


def reserves(view: LaneView, backfill_ratio: float = BACKFILL_RATIO) -> bool:
    """Has ``view``'s lane waited long enough that its pool stops backfilling for it? A
    priority-0 lane at once; any other once its (unweighted) staleness ratio reaches its due
    ratio plus ``backfill_ratio`` (a never-run lane's ratio is infinite: at once)."""
    return view.spec.priority0 or view.ratio >= view.spec.due_ratio + backfill_ratio


def grant(candidates: Iterable[LaneView], pools: Mapping[str, Pool],
          holders: Mapping[str, Sequence[str]], *,
          backfill_ratio: float = BACKFILL_RATIO) -> Grants:
    """Grant each pool's free slots to its top-ranked candidates, at most one grant per lane.

    ``candidates`` are the heavy lanes that are due, idle and let through by their gates;
    ``holders`` gives, per pool, the lane holding each busy slot (a lane holding k slots is
    listed k times; an unknown holder as ``""``). A pool's free slots are its slot count less
    its busy slots. Light lanes, lanes already holding a slot, lanes of a pool not in ``pools``
    and lanes needing more slots than their pool has are never granted (a lane set built by
    :func:`schedproj.core.laneset.build_lane_set` has none of the last two).

    The rule, pool by pool, walking the pool's candidates in rank order (priority-0 first, then
    the largest ``weight x ratio``, then declared order, then name):

    * a lane whose ``slots`` fit in the slots still free is granted them;
    * a lane that does not fit waits. Smaller lanes ranked below it may **backfill** the free
      slots meanwhile, but only while it is young: once it is priority-0 or its staleness
      ratio has reached its due ratio + ``backfill_ratio`` (0.5 by default: half a cadence
      past due), the pool **reserves** — no lane ranked below it is granted a slot until it
      has its slots. Lanes ranked above it still are: they are ahead by the ranking.

    So a lane needing k slots waits at most until it reserves, then until enough holders
    finish (each at most its hold cap, sooner when pressed) while lanes ranked above it —
    whose weighted ratios exceed its own growing one — take their turns: its ratio stays
    below a bound that does not grow with time (docs/pools.md, "The bound"; checked in
    tests/core/test_pools.py). With only the default pool (one slot, every lane one slot)
    this is the single-lease pick: the best ranked candidate, or nothing while the lease is
    held.
    """
    if backfill_ratio is not BACKFILL_RATIO and not (  # (the default needs no check)
            isinstance(backfill_ratio, int | float) and math.isfinite(backfill_ratio)
            and backfill_ratio >= 0):
        raise ValueError(f"backfill_ratio must be a finite number >= 0, got {backfill_ratio!r}")
    heavy_kind, rank_key = _late_imports()
    by_pool: dict[str, dict[str, LaneView]] = {}
    holding = {lane for lanes in holders.values() for lane in lanes}
    for view in candidates:  # a tick may bring 10,000 due family members: kept lean
        spec = view.spec
        lanes = by_pool.get(spec.pool)
        if lanes is None:
            if spec.pool not in pools:
                continue
            lanes = by_pool[spec.pool] = {}
        if (spec.name in lanes or spec.name in holding or spec.kind is not heavy_kind
                or spec.slots > pools[spec.pool].slots):
            continue
        lanes[spec.name] = view

    granted: list[Grant] = []
    waiting: dict[str, str | None] = {}
    reserved: dict[str, str] = {}
    for name in sorted(by_pool):
        reserving = _grant_pool(pools[name], by_pool[name], holders.get(name, ()), rank_key,
                                backfill_ratio, granted, waiting)
        if reserving is not None:
            reserved[name] = reserving
    return _new_grants(tuple(granted), waiting, reserved)


_new = object.__new__
assert is_plain(Grant) and is_plain(Grants)  # built below as their __init__ would


def _new_grants(granted: tuple[Grant, ...], waiting: dict[str, str | None],
                reserved: dict[str, str]) -> Grants:
    """``Grants(...)`` without the frozen dataclass ``__init__`` (see ``core.frozen``)."""
    grants = _new(Grants)
    d = grants.__dict__
    d["granted"] = granted
    d["waiting"] = waiting
    d["reserved"] = reserved
    return grants


def _new_grant(lane: str, pool: str, slots: int) -> Grant:
    """``Grant(lane, pool, slots)`` without the frozen dataclass ``__init__``."""
    one = _new(Grant)
    d = one.__dict__
    d["lane"] = lane
    d["pool"] = pool
    d["slots"] = slots
    return one


@functools.cache
def _late_imports() -> tuple[Any, Callable[[LaneView], Any]]:
    """(``LaneKind.HEAVY``, the picker's ``rank_key``), imported on first use: lanes imports
    this module, and picker imports views, which imports lanes. Cached: an import statement
    costs a tick about a microsecond, every tick."""
    from schedproj.core.lanes import LaneKind
    from schedproj.core.picker import rank_key

    return LaneKind.HEAVY, rank_key


def _grant_pool(pool: Pool, lanes: Mapping[str, LaneView], busy: Sequence[str],
                rank_key: Callable[[LaneView], Any], backfill_ratio: float,
                granted: list[Grant], waiting: dict[str, str | None]) -> str | None:
    """One pool's walk of :func:`grant`: appends its grants and waits; returns the lane the
    pool reserves for (None: it does not reserve)."""
    free = max(0, pool.slots - len(busy))
    mine: list[str] = []  # granted, best first
    walked: dict[str, str | None] = {}  # walked past, with the lane each waits behind
    reserving: str | None = None
    for view in _in_rank_order(lanes, free, rank_key):
        lane = view.name
        if view.spec.slots <= free:
            granted.append(_new_grant(lane, pool.name, view.spec.slots))
            mine.append(lane)
            free -= view.spec.slots
        else:
            walked[lane] = mine[0] if mine else _holder(busy)
            if reserves(view, backfill_ratio):
                reserving = lane
        if free == 0 or reserving is not None:
            break  # before the generator ranks the rest
    # The lanes not walked all wait behind one lane: filled at C speed (a tick may rank
    # 10,000 due family members and walk one or two of them).
    rest: dict[str, str | None] = dict.fromkeys(
        lanes, mine[0] if mine else reserving or _holder(busy))
    rest.update(walked)
    for lane in mine:
        del rest[lane]
    waiting.update(rest)
    return reserving


def _in_rank_order(lanes: Mapping[str, LaneView], free: int,
                   rank_key: Callable[[LaneView], Any]) -> Iterator[LaneView]:
    """The pool's lanes best first, ranked lazily: a walk usually ends after the first few
    (one, for the default pool's single slot), so those come from one pass over the lanes
    (``heapq.nsmallest``; a tick may rank 10,000 due family members) and the rest are sorted
    only if the walk goes on past them."""
    if free == 0 or not lanes:
        return
    values = lanes.values()
    head = ([min(values, key=rank_key)] if free == 1
            else heapq.nsmallest(free, values, key=rank_key))
    yield from head
    if len(head) < len(lanes):
        yield from sorted(values, key=rank_key)[len(head):]


def _holder(busy: Sequence[str]) -> str | None:
    return next((lane for lane in busy if lane), None)


__all__ = ["BACKFILL_RATIO", "DEFAULT", "DEFAULT_POOL", "DEFAULT_POOL_SLOTS", "POOLS_SETTING",
           "Grant", "Grants", "Pool", "PoolError", "declare_pools", "grant",
           "parse_pools", "pool_name_problem", "pools_by_name", "reserves"]
