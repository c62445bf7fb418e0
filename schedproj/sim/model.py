"""What the simulator simulates: lanes (the project's own :class:`LaneSpec`) plus a work model.

A :class:`Scenario` is a lane set, each lane's work model (:class:`LaneModel`), optional
backlog arrivals, and the scheduler's timing (poll tick, hold cap). A :class:`Variant` is one
scheduling policy: the project's picker policy, with or without the light-lane second pass.
Virtual time starts at 0; a lane's history is given as "last run so many seconds before 0".
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from schedproj.core import defaults
from schedproj.core.errors import ConfigurationError
from schedproj.core.lanes import LaneSpec, Profile
from schedproj.core.picker import Policy
from schedproj.core.pools import DEFAULT_POOL, Pool
from schedproj.core.pressure import DEFAULT_MIN_HOLD_S, DEFAULT_TARGET_RATIO, PressureRule

#: The pressure rule beat runs by default (``SCHEDPROJ_PRESSURE_YIELD`` and its two settings,
#: whose defaults live in ``core.defaults`` and ``core.pressure``); every scenario starts from
#: it, so a simulation predicts the configuration users run. None would mean off by default.
BEAT_PRESSURE: PressureRule | None = (
    PressureRule(target_ratio=DEFAULT_TARGET_RATIO, min_hold_s=DEFAULT_MIN_HOLD_S)
    if defaults.PRESSURE_YIELD else None)


class SimError(ConfigurationError):
    """A scenario cannot be simulated as given; the message names the lane/field and the fix."""


@dataclass(frozen=True)
class Blocked:
    """``count`` items that wait on a producer lane: item k (0-based) can be done only once
    ``producer`` has completed ``per_item * (k + 1)`` items in total. The REM example: a long
    session can be summarized only when the backfill has written all of its turns' minis."""

    count: int
    producer: str
    per_item: int


@dataclass(frozen=True)
class LaneModel:
    """One lane: its declaration (``spec``) and how its runs behave.

    * ``run_s`` — fixed cost of every run (heavy: start-up before the first batch; light: the
      whole run);
    * ``item_s`` — time per backlog item (heavy lanes); items are done in batches of ``batch``
      and the hold cap is checked before each batch (the project's ``should_yield``);
    * ``backlog`` ready items at time 0, plus ``blocked`` items that wait on a producer (they
      sit first in the queue and are skipped, at ``skip_s`` each, while not ready);
    * ``feeds`` — each item done adds one item to every named heavy lane, and marks every
      named light lane dirty (it has work: its due-check reports 1 until it runs again);
    * ``jitter`` — every duration is multiplied by a draw from U(1 - jitter, 1 + jitter);
    * ``fail_prob`` — probability that a step (a run's fixed part, or one batch) fails: the run
      ends ``failed`` halfway through that step and the step's items stay undone;
    * ``last_run_ago_s`` — the last run ended this long before time 0 (None: never ran).
    """

    spec: LaneSpec
    run_s: float
    item_s: float = 0.0
    batch: int = 50
    backlog: int = 0
    blocked: Blocked | None = None
    skip_s: float = 0.0
    feeds: tuple[str, ...] = ()
    jitter: float = 0.0
    fail_prob: float = 0.0
    last_run_ago_s: float | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def initial_items(self) -> int:
        return self.backlog + (self.blocked.count if self.blocked else 0)


@dataclass(frozen=True)
class Arrival:
    """``items`` new backlog items for heavy lane ``lane`` at virtual time ``at_s``."""

    at_s: float
    lane: str
    items: int


@dataclass(frozen=True)
class Scenario:
    """A lane set with its work model and the scheduler's timing. Validated on creation."""

    name: str
    lanes: tuple[LaneModel, ...]
    arrivals: tuple[Arrival, ...] = ()
    tick_s: float = defaults.BEAT_MAX_LOOP_INTERVAL_S
    hold_cap_s: float = defaults.HOLD_CAP_S
    horizon_s: float = 24 * 3600.0
    profile: Profile = Profile.LOCAL
    #: A finishing run wakes beat at once (the project's default); False: the next poll sees it.
    wake_on_release: bool = True
    #: Pressure-aware yielding (``schedproj.core.pressure``) for the staleness variants: beat's
    #: default rule unless given; None: off, runs yield only at the hold cap. The legacy
    #: variants model the original system, which had no pressure yielding, and never use it.
    pressure: PressureRule | None = BEAT_PRESSURE
    description: str = ""
    #: Pools beyond the default (``core.pools.Pool``): a heavy lane naming one runs on its
    #: slots (``LaneSpec.pool``, ``slots``, ``weight``); the rest share the one lease.
    pools: tuple[Pool, ...] = ()
    #: Free-form facts about how the scenario was built (shown in the JSON report).
    params: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lanes", tuple(self.lanes))
        object.__setattr__(self, "pools", tuple(self.pools))
        object.__setattr__(self, "arrivals", tuple(sorted(self.arrivals,
                                                          key=lambda a: (a.at_s, a.lane))))
        validate(self)

    @property
    def specs(self) -> tuple[LaneSpec, ...]:
        return tuple(m.spec for m in self.lanes)

    def lane(self, name: str) -> LaneModel:
        for m in self.lanes:
            if m.name == name:
                return m
        raise KeyError(name)

    def with_(self, **changes: Any) -> Scenario:
        return replace(self, **changes)

    def map_lanes(self, **changes: Any) -> Scenario:
        """The same scenario with every lane's model changed (e.g. ``fail_prob=0.05``)."""
        return replace(self, lanes=tuple(replace(m, **changes) for m in self.lanes))


@dataclass(frozen=True)
class Variant:
    """One scheduling policy to compare: the project's picker policy, and whether due light
    lanes go in the same tick as the heavy winner (ADR 0022's B'/E second pass) or the old
    one-winner-per-poll rule applies (a heavy winner takes the tick's only dispatch)."""

    policy: Policy
    second_pass: bool

    @property
    def label(self) -> str:
        return f"{self.policy.value}{'+pass' if self.second_pass else '-nopass'}"

    @classmethod
    def parse(cls, label: str) -> Variant:
        for v in VARIANTS:
            if v.label == label:
                return v
        raise SimError(f"unknown variant {label!r}; use one of "
                       f"{', '.join(v.label for v in VARIANTS)}")


VARIANTS = (
    Variant(Policy.STALENESS, True),
    Variant(Policy.STALENESS, False),
    Variant(Policy.REGISTRY, True),
    Variant(Policy.REGISTRY, False),
)


class Durations:
    """Seeded durations of one lane. Item k and run k always get the same draw, whatever the
    policy (each lane has its own streams), so every variant of a scenario and seed faces the
    same work, and the lower bound can be computed from the very same draws."""

    def __init__(self, model: LaneModel, seed: str) -> None:
        self.model = model
        self.seed = seed
        self._items: list[float] = []
        self._runs: list[float] = []
        jitter = model.jitter
        self._item_rng = random.Random(f"{seed}|{model.name}|item") if jitter else None
        self._run_rng = random.Random(f"{seed}|{model.name}|run") if jitter else None

    @staticmethod
    def _draw(base: float, jitter: float, rng: random.Random | None) -> float:
        if rng is None:
            return base
        return base * (1.0 + jitter * (2.0 * rng.random() - 1.0))

    def item(self, k: int) -> float:
        while len(self._items) <= k:
            self._items.append(self._draw(self.model.item_s, self.model.jitter, self._item_rng))
        return self._items[k]

    def run(self, k: int) -> float:
        while len(self._runs) <= k:
            self._runs.append(self._draw(self.model.run_s, self.model.jitter, self._run_rng))
        return self._runs[k]

    def min_run(self) -> float:
        """The shortest a run's fixed part can be."""
        return self.model.run_s * (1.0 - self.model.jitter)

    def fails(self, run: int, step: int) -> bool:
        p = self.model.fail_prob
        if p <= 0.0:
            return False
        return random.Random(f"{self.seed}|{self.model.name}|fail|{run}|{step}").random() < p


# -- validation ---------------------------------------------------------------------------------

def _bad(lane: str, problem: str, fix: str) -> SimError:
    return SimError(f"lane {lane!r}: {problem}. Fix: {fix}")


def _number(value: float, what: str, lane: str, *, positive: bool = False) -> None:
    ok = (not isinstance(value, bool) and isinstance(value, int | float)
          and math.isfinite(value) and (value > 0 if positive else value >= 0))
    if not ok:
        raise _bad(lane, f"{what}={value!r}",
                   f"give {what} a {'positive' if positive else 'non-negative'} finite number")


def _check_numbers(m: LaneModel) -> None:
    name = m.name
    for what, value in (("run_s", m.run_s), ("item_s", m.item_s), ("skip_s", m.skip_s)):
        _number(value, what, name)
    if m.last_run_ago_s is not None:
        _number(m.last_run_ago_s, "last_run_ago_s", name)
    for what, count, least in (("batch", m.batch, 1), ("backlog", m.backlog, 0)):
        if isinstance(count, bool) or not isinstance(count, int) or count < least:
            raise _bad(name, f"{what}={count!r}", f"give {what} an integer >= {least}")
    if not 0.0 <= m.jitter < 1.0:
        raise _bad(name, f"jitter={m.jitter!r}", "give jitter a fraction in [0, 1)")
    if not 0.0 <= m.fail_prob < 1.0:
        raise _bad(name, f"fail_prob={m.fail_prob!r}", "give fail_prob a probability in [0, 1)")


def _check_links(m: LaneModel, names: Mapping[str, LaneModel], families: set[str | None],
                 ) -> None:
    """``families``: the families of the lanes ``names`` (computed once for the scenario,
    as the list of names in a message is built only to raise: per lane, either made every
    lane's check walk every lane, and a 10,000-member family took seconds to validate)."""
    name = m.name
    if not m.spec.heavy and (m.item_s or m.initial_items or m.feeds):
        raise _bad(name, "a light lane has backlog, item_s or feeds",
                   "only heavy lanes carry backlog items; a light lane gets work by being fed")
    for target in m.feeds:
        if target not in names or target == name:
            raise _bad(name, f"feeds {target!r}, not another declared lane",
                       f"name one of {_known(names)}, other than the lane itself")
    b = m.blocked
    if b is not None:
        if b.producer not in names or not names[b.producer].spec.heavy:
            raise _bad(name, f"blocked items wait on {b.producer!r}, not a heavy lane here",
                       "name the heavy lane that produces what these items need")
        if b.count < 0 or b.per_item < 1:
            raise _bad(name, f"blocked count={b.count!r}, per_item={b.per_item!r}",
                       "give count >= 0 and per_item >= 1")
    for gate in m.spec.gates:
        if gate.blocker not in names and gate.blocker not in families:
            raise _bad(name, f"a gate names unknown lane {gate.blocker!r}",
                       f"name one of {_known(names)}, or a lane family")


def _known(names: Mapping[str, LaneModel]) -> str:
    """The declared lanes, for a message."""
    return ", ".join(sorted(names))


def feed_order(lanes: Iterable[LaneModel]) -> list[str]:
    """Lane names so that every producer comes before the lanes it feeds and the lanes whose
    blocked items wait on it; raises on a cycle (fed items would multiply forever; blocked
    items would wait on each other)."""
    models = {m.name: m for m in lanes}
    order: list[str] = []
    state: dict[str, int] = {}
    # Each lane's feeders, found in one walk (not one walk of every lane per lane).
    feeders: dict[str, set[str]] = {}
    for n, m in models.items():
        for target in m.feeds:
            feeders.setdefault(target, set()).add(n)

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = [*path[path.index(name):], name]
            raise _bad(name, "feeds and blocked items form a cycle " + " <- ".join(cycle),
                       "remove one feed (or blocked_backlog) of the cycle")
        state[name] = 1
        blocked = models[name].blocked
        sources = set(feeders.get(name, ()))
        if blocked is not None and blocked.producer in models:
            sources.add(blocked.producer)
        for src in sorted(sources):
            visit(src, [*path, name])
        state[name] = 2
        order.append(name)

    for name in models:
        visit(name, [])
    return order


def _check_pools(s: Scenario) -> None:
    """Every heavy lane's pool is declared and has the slots it takes."""
    slots = {DEFAULT_POOL: 1}
    for pool in s.pools:
        if not isinstance(pool, Pool) or pool.name in slots:
            raise SimError(f"scenario {s.name!r}: pool {pool!r} is declared twice or is not a "
                           f"Pool. Fix: declare each pool once, as Pool(name, slots)")
        slots[pool.name] = pool.slots
    for m in s.lanes:
        spec = m.spec
        if spec.heavy and spec.pool not in slots:
            raise _bad(m.name, f"names pool {spec.pool!r}, declared nowhere",
                       f"declare it (\"pools\": {{\"{spec.pool}\": 2}}) or name one of "
                       f"{', '.join(sorted(slots))}")
        if spec.heavy and spec.slots > slots[spec.pool]:
            raise _bad(m.name, f"takes {spec.slots} slots of pool {spec.pool!r}, which has "
                       f"{slots[spec.pool]}", "give it at most the pool's slots")


def validate(s: Scenario) -> None:
    """Reject scenarios the simulator cannot run, naming the lane or field and the fix."""
    for what, value in (("tick_s", s.tick_s), ("hold_cap_s", s.hold_cap_s),
                        ("horizon_s", s.horizon_s)):
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value) or value <= 0:
            raise SimError(f"scenario {s.name!r}: {what}={value!r}. Fix: give a positive number")
    names: dict[str, LaneModel] = {}
    for m in s.lanes:
        if m.name in names:
            raise _bad(m.name, "declared twice", "give each lane a unique name")
        names[m.name] = m
    if not names:
        raise SimError(f"scenario {s.name!r} has no lanes. Fix: declare at least one lane")
    families = {lane.spec.family for lane in names.values()}
    for m in s.lanes:
        _check_numbers(m)
        _check_links(m, names, families)
    feed_order(s.lanes)
    _check_pools(s)
    heavy = ", ".join(sorted(n for n, m in names.items() if m.spec.heavy))
    for a in s.arrivals:
        if a.lane not in names or not names[a.lane].spec.heavy:
            raise SimError(f"arrival at {a.at_s}s names {a.lane!r}, not a heavy lane. Fix: "
                           f"name one of {heavy}")
        if not (math.isfinite(a.at_s) and a.at_s >= 0) or a.items < 0:
            raise SimError(f"arrival for {a.lane!r}: at_s={a.at_s!r}, items={a.items!r}. "
                           f"Fix: at_s >= 0 and items >= 0")


__all__ = [
    "BEAT_PRESSURE",
    "VARIANTS",
    "Arrival",
    "Blocked",
    "Durations",
    "LaneModel",
    "Scenario",
    "SimError",
    "Variant",
    "feed_order",
    "validate",
]
