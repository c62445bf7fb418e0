"""The scheduling pipeline: (lanes, state, lease, now, profile) -> Decision. Pure: no I/O, no clock.

Stages, in order (as in the original orchestrator):

1. drop lanes disabled by the deployment profile, paused, or whose state is unreadable (such
   a lane is still viewed as a gate's blocker: a paused lane that runs still holds back the
   lanes gated on it, though it never counts as due);
2. drop lanes not due or already running / in flight;
3. defer heavy candidates while the lease is held (more generally: while their pool has no
   free slot; the default pool ``heavy`` has one, the lease);
4. apply soft gates (deferral only, with reason codes; the legacy registry policy applies only
   the gates the legacy system had);
5. pick the heavy winner; the other due heavy lanes are deferred behind it. Per pool
   (``core.pools.grant``): the default pool's grant is the winner, and grants in the other
   pools are ``pool_grants`` — with only the default pool this is exactly the one-lease pick;
6. every surviving light lane is dispatched in the same tick (``also_dispatched``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter

from schedproj.core import gates
from schedproj.core.deferrals import Deferral, continue_streak
from schedproj.core.due import NEVER, due_at
from schedproj.core.frozen import is_plain
from schedproj.core.lanes import (
    DeferralReason,
    DeploymentClass,
    Gate,
    LaneKind,
    LaneSpec,
    Profile,
    enabled_under,
)
from schedproj.core.picker import Policy, pick
from schedproj.core.pools import DEFAULT_POOL, Grant, Pool, grant, pools_by_name
from schedproj.core.records import EMPTY_STATE, LaneState, LeaseView
from schedproj.core.views import LaneView, view_all, view_lane


@dataclass(frozen=True)
class Decision:
    """What one tick decided. ``winner`` keeps the ADR's single-winner shape; the light lanes
    dispatched in the same tick are ``also_dispatched``."""

    winner: str | None
    also_dispatched: tuple[str, ...] = ()
    deferred: tuple[Deferral, ...] = ()
    expired_gates: tuple[tuple[str, Gate], ...] = ()
    views: Mapping[str, LaneView] = field(default_factory=dict)
    #: What the gates saw: ``views`` plus family views and paused or unreadable blockers
    #: (``pressure.measure`` judges the waiting lanes' gates on these same views).
    gate_views: Mapping[str, LaneView] = field(default_factory=dict, compare=False)
    #: Slots granted in pools beyond the default (whose grant is ``winner``): each is sent
    #: once beat holds its fenced slot leases, as the winner once it holds the lease. In
    #: ``dispatched``, after the winner.
    pool_grants: tuple[Grant, ...] = ()
    #: Pools whose free slots wait for a lane needing more than are free (``pools.grant``'s
    #: backfill rule): pool -> lane.
    reserved: Mapping[str, str] = field(default_factory=dict)

    @property
    def dispatched(self) -> tuple[str, ...]:
        winner, grants = self.winner, self.pool_grants
        if not grants:  # (the usual tick: no pool beyond the default)
            return (winner, *self.also_dispatched) if winner else self.also_dispatched
        return (((winner,) if winner else ()) + tuple([g.lane for g in grants])
                + self.also_dispatched)


_SORT_KEY = attrgetter("order", "name")


def eligible(lanes: Collection[LaneSpec], states: Mapping[str, LaneState], profile: Profile,
             excluded: Collection[str]) -> tuple[LaneSpec, ...]:
    """Stage 1: lanes the profile enables, not paused, readable — in declared order."""
    get, empty = states.get, EMPTY_STATE
    # ``enabled_under``'s rule, tested once for the tick rather than once per lane.
    cloud = profile is Profile.CLOUD
    local_only = DeploymentClass.LOCAL_ONLY
    return tuple(sorted(
        [s for s in lanes  # a list, not a generator: a tick of a few lanes is mostly overhead
         if not (cloud and s.deployment is local_only) and s.name not in excluded
         and not get(s.name, empty).sched.paused],
        key=_SORT_KEY,  # LaneSpec.sort_key, computed in C: a tick may sort thousands
    ))


def blocker_views(lanes: Collection[LaneSpec], states: Mapping[str, LaneState],
                  lease: LeaseView | None, now: float, profile: Profile,
                  views: Mapping[str, LaneView],
                  unreadable: Collection[str] = (), grace_s: float = 0.0,
                  ) -> dict[str, LaneView]:
    """Views of the gate blockers left out of ``views`` (paused, or unreadable this tick) but
    enabled under ``profile``: never due (they will not be dispatched), yet running while
    they run — a heavy one while it holds the lease, a light one while its mark is fresh —
    so a gate on them still holds its consumer back. A light blocker whose record could not
    be read at all may be running: it counts as running (the gate only defers, boundedly).
    A member of a family a gate names is such a blocker too: the family runs while it runs."""
    named = {g.blocker for s in lanes if s.gates and s.name in views for g in s.gates}
    out: dict[str, LaneView] = {}
    if not named:  # no gate among the lanes viewed: no lane to walk for
        return out
    for spec in lanes:
        if ((spec.name in named or spec.family in named) and spec.name not in views
                and enabled_under(profile, spec.deployment)):
            view = view_lane(spec, states.get(spec.name, EMPTY_STATE), lease, now,
                             grace_s=grace_s)
            unknown = (not spec.heavy and spec.name in unreadable
                       and spec.name not in states)
            out[spec.name] = replace(view, due=False, in_flight=view.in_flight or unknown)
    return out


def decide(
    lanes: Collection[LaneSpec],
    states: Mapping[str, LaneState],
    lease: LeaseView | None,
    now: float,
    profile: Profile = Profile.LOCAL,
    *,
    probes: Mapping[str, int] | None = None,
    unreadable: Collection[str] = (),
    paused: Collection[str] = (),
    forced: Collection[str] = (),
    policy: Policy = Policy.STALENESS,
    inflight_grace_s: float = 0.0,
    pools: Mapping[str, Pool] | None = None,
    holders: Mapping[str, Sequence[str]] | None = None,
) -> Decision:
    """Decide one tick. Neither argument is mutated; the result does not depend on the order
    in which ``lanes`` are given. ``paused`` lanes are left out; ``forced`` lanes (an
    operator's "run now") are due whatever their cadence, and still need the lease. A light
    run counts as in flight ``inflight_grace_s`` past its mark (see ``views.is_in_flight``).
    ``pools`` and ``holders``: see :func:`_pick_heavy` (None, None: the lease alone)."""
    specs = eligible(lanes, states, profile,
                     excluded={*unreadable, *paused} if unreadable or paused else ())
    views = view_all(specs, states, lease, now, probes or {}, forced, inflight_grace_s)
    held_back = blocker_views(lanes, states, lease, now, profile, views, unreadable,
                              inflight_grace_s)
    table, busy, full = _pool_state(lease, pools, holders)
    views, held_back = _holding(views, busy), _holding(held_back, busy)
    gate_views = _gate_views(specs, views, held_back)
    deferred: list[Deferral] = []
    heavy: list[LaneView] = []
    light_views: list[LaneView] = []
    expired: list[tuple[str, Gate]] = []
    get, empty = states.get, EMPTY_STATE
    lease_held, registry = DeferralReason.LEASE_HELD, policy is Policy.REGISTRY

    def defer(name: str, reason: DeferralReason, blocker: str | None) -> None:
        deferred.append(continue_streak(get(name, empty).sched.deferral, name, reason,
                                        blocker, now))
    for view in views.values():
        if not view.due or view.in_flight:
            continue
        spec = view.spec
        is_heavy = spec.kind is _HEAVY
        if is_heavy and (spec.pool in full or spec.pool not in table):
            defer(spec.name, lease_held, _first(busy, spec.pool))
            continue
        if spec.gates:
            gate, lapsed = gates.evaluate(view, gate_views, get(spec.name, empty).sched.deferral,
                                          now, legacy=registry)
            expired.extend((spec.name, g) for g in lapsed)
            if gate is not None:
                defer(spec.name, gate.reason, gate.blocker)
                continue
        (heavy if is_heavy else light_views).append(view)
    winner, pool_grants, reserved = (_pick_heavy(heavy, policy, table, busy, defer) if heavy
                                     else (None, (), {}))  # (what it gives for none)
    return new_decision(winner, tuple([v.name for v in light_views]), tuple(deferred),
                        tuple(expired), views, gate_views, pool_grants, reserved)


_HEAVY = LaneKind.HEAVY
_new = object.__new__
assert is_plain(Decision)  # new_decision below fills what Decision's __init__ would


def new_decision(winner: str | None, also_dispatched: tuple[str, ...],
                 deferred: tuple[Deferral, ...], expired_gates: tuple[tuple[str, Gate], ...],
                 views: Mapping[str, LaneView], gate_views: Mapping[str, LaneView],
                 pool_grants: tuple[Grant, ...], reserved: Mapping[str, str]) -> Decision:
    """``Decision(...)`` without the frozen dataclass ``__init__`` (see ``core.frozen``)."""
    decision = _new(Decision)
    d = decision.__dict__
    d["winner"] = winner
    d["also_dispatched"] = also_dispatched
    d["deferred"] = deferred
    d["expired_gates"] = expired_gates
    d["views"] = views
    d["gate_views"] = gate_views
    d["pool_grants"] = pool_grants
    d["reserved"] = reserved
    return decision


def _gate_views(specs: tuple[LaneSpec, ...], views: dict[str, LaneView],
                held_back: dict[str, LaneView]) -> dict[str, LaneView]:
    """What the gates see: the views, the blockers held back, and the views of the families
    the gates name (``gates.family_views``)."""
    named = {g.blocker for s in specs if s.gates for g in s.gates}
    if not (named or held_back):  # what the merge below gives then: the views
        return dict(views)
    return {**gates.family_views({**held_back, **views}, named), **held_back, **views}


#: The pool table with the default pool alone (``pools_by_name(None)``), built once: it is
#: only read.
_DEFAULT_TABLE = pools_by_name(None)
_DEFAULT_SLOTS = _DEFAULT_TABLE[DEFAULT_POOL].slots


def _pool_state(lease: LeaseView | None, pools: Mapping[str, Pool] | None,
                holders: Mapping[str, Sequence[str]] | None,
                ) -> tuple[Mapping[str, Pool], dict[str, Sequence[str]], set[str]]:
    """(the pools by name, the lanes holding each pool's busy slots — the default pool's is
    the lease's —, the pools with no free slot). A heavy lane of a full pool (the default
    pool: the lease held) waits before any gate is looked at, as does a lane of a pool beat
    does not serve."""
    held: Sequence[str] = [lease.lane] if lease is not None else []
    if pools is None and not holders:  # the default pool alone (the usual tick)
        return (_DEFAULT_TABLE, {DEFAULT_POOL: held},
                {DEFAULT_POOL} if len(held) >= _DEFAULT_SLOTS else set())
    table = _DEFAULT_TABLE if pools is None else pools_by_name(pools)
    busy: dict[str, Sequence[str]] = ({**holders, DEFAULT_POOL: held} if holders
                                      else {DEFAULT_POOL: held})
    full = {name for name, pool in table.items() if len(busy.get(name, ())) >= pool.slots}
    return table, busy, full


def _holding(views: dict[str, LaneView], busy: Mapping[str, Sequence[str]]
             ) -> dict[str, LaneView]:
    """``views`` with every heavy lane holding a slot of its pool in flight (the default
    pool's holder already is: ``views.view_lane`` sees the lease)."""
    if len(busy) == 1 or not views:  # the default pool alone, or no view: nothing to add
        return views
    # Walk the holders (a few per pool), not the views (a tick may view 10,000 due lanes):
    # the views are copied only when a holder among them changes.
    out: dict[str, LaneView] | None = None
    for pool, lanes in busy.items():
        for name in lanes:
            v = views.get(name)
            if v is None or not v.spec.heavy or v.in_flight or v.spec.pool != pool:
                continue
            if out is None:
                out = dict(views)
            out[name] = replace(v, in_flight=True)
    return views if out is None else out


def _first(busy: Mapping[str, Sequence[str]], pool: str) -> str | None:
    """A lane holding a slot of ``pool`` (None: none known)."""
    return next(iter(busy.get(pool, ())), None)


def _pick_heavy(heavy: list[LaneView], policy: Policy, pools: Mapping[str, Pool],
                busy: Mapping[str, Sequence[str]],
                defer: Callable[[str, DeferralReason, str | None], None],
                ) -> tuple[str | None, tuple[Grant, ...], Mapping[str, str]]:
    """Stage 5, per pool (``pools``: the declared pools, the default one's slot the lease;
    ``busy``: per pool, the lane holding each busy slot, which is in flight): returns
    (the default pool's winner, the other pools' grants, the pools reserving),
    deferring the heavy lanes not granted: behind this tick's grant or the lane their pool
    reserves for (backpressure), else behind a holder (the lease held). The legacy registry
    policy knows no pools: one winner among all heavy lanes, as the legacy system had."""
    if policy is Policy.REGISTRY:
        legacy = pick(heavy, policy)
        if legacy is not None:
            for view in heavy:
                if view.name != legacy.name:
                    defer(view.name, DeferralReason.BACKPRESSURE, legacy.name)
        return (legacy.name if legacy else None), (), {}
    result = grant(heavy, pools, busy)
    granted = {g.lane for g in result.granted}
    ahead = granted.union(result.reserved.values()) if result.reserved else granted
    waiting = result.waiting
    for view in heavy:  # in the candidates' order, as before pools
        name = view.spec.name
        if name not in granted:
            blocker = waiting.get(name)
            defer(name, DeferralReason.BACKPRESSURE if blocker in ahead
                  else DeferralReason.LEASE_HELD, blocker)
    # Lists, not generators, here and above: a generator's set-up is a tick's cost too.
    winner = next(iter([g.lane for g in result.granted if g.pool == DEFAULT_POOL]), None)
    return (winner, tuple([g for g in result.granted if g.pool != DEFAULT_POOL]),
            result.reserved)


def seconds_until_next_due(views: Mapping[str, LaneView], states: Mapping[str, LaneState],
                           now: float) -> float | None:
    """How long until some idle lane not due yet turns due — by its cadence or a retry
    (``core.due.due_at``, with the backlog its view saw); None if none will by time alone."""
    empty = EMPTY_STATE
    waits = [due_at(v.spec, states.get(v.name, empty), now, v.backlog) - now
             for v in views.values() if not (v.in_flight or v.due)]
    best = min(waits, default=NEVER)
    return None if best == NEVER else max(0.0, best)
