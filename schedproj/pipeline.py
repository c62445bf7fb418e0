"""The scheduling pipeline: (lanes, state, lease, now, profile) -> Decision. Pure: no I/O, no clock.

Stages, in order (as in the original orchestrator):

1. drop lanes disabled by the deployment profile, paused, or whose state is unreadable;
2. drop lanes not due or already running / in flight;
3. defer heavy candidates while the lease is held;
4. apply soft gates (deferral only, with reason codes; the legacy registry policy applies only
   the gates the legacy system had);
5. pick the heavy winner; the other due heavy lanes are deferred behind it;
6. every surviving light lane is dispatched in the same tick (``also_dispatched``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from schedproj import gates
from schedproj.lanes import DeferralReason, DeploymentClass, Gate, LaneSpec
from schedproj.picker import Policy, pick
from schedproj.settings import Profile
from schedproj.state import Deferral, LaneState, LeaseView, SchedRecord
from schedproj.views import LaneView, view_all

#: Reasons that mean "waiting for the heavy lease", not a gate.
LEASE_WAITS = frozenset({DeferralReason.LEASE_HELD, DeferralReason.BACKPRESSURE})


@dataclass(frozen=True)
class Decision:
    """What one tick decided. ``winner`` keeps the ADR's single-winner shape; the light lanes
    dispatched in the same tick are ``also_dispatched``."""

    winner: str | None
    also_dispatched: tuple[str, ...] = ()
    deferred: tuple[Deferral, ...] = ()
    expired_gates: tuple[tuple[str, Gate], ...] = ()
    views: Mapping[str, LaneView] = field(default_factory=dict)

    @property
    def dispatched(self) -> tuple[str, ...]:
        return ((self.winner,) if self.winner else ()) + self.also_dispatched


def enabled_under(profile: Profile, deployment: DeploymentClass) -> bool:
    """ADR-0014: the cloud profile never runs local-only lanes."""
    return not (profile is Profile.CLOUD and deployment is DeploymentClass.LOCAL_ONLY)


def continue_streak(previous: Deferral | None, lane: str, reason: DeferralReason,
                    blocker: str | None, now: float) -> Deferral:
    """This tick's deferral of ``lane``, continuing ``previous`` (its streak start never
    slides). Within the streak a gate's clock (for its max_defer_s) runs while that gate's
    blocker defers the lane; waiting for the lease in between neither stops nor restarts it,
    or a busy lease would keep a gated lane waiting forever."""
    if previous is None:
        return Deferral(lane=lane, reason=reason, blocker=blocker, since=now)
    if reason in LEASE_WAITS:
        owner = previous.gate_owner
        return Deferral(lane=lane, reason=reason, blocker=blocker, since=previous.since,
                        blocker_since=previous.blocker_since if owner is not None else None,
                        gate_blocker=owner)
    clock = previous.gate_clock(blocker) if blocker is not None else None
    if clock is None:
        clock = now
    return Deferral(lane=lane, reason=reason, blocker=blocker, since=previous.since,
                    blocker_since=None if clock == previous.since else clock)


def eligible(lanes: Collection[LaneSpec], states: Mapping[str, LaneState], profile: Profile,
             excluded: Collection[str]) -> tuple[LaneSpec, ...]:
    """Stage 1: lanes the profile enables, not paused, readable — in declared order."""
    return tuple(sorted(
        (s for s in lanes
         if enabled_under(profile, s.deployment) and s.name not in excluded
         and not states.get(s.name, LaneState()).sched.paused),
        key=lambda s: s.sort_key,
    ))


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
) -> Decision:
    """Decide one tick. Neither argument is mutated; the result does not depend on the order
    in which ``lanes`` are given. ``paused`` lanes are left out; ``forced`` lanes (an
    operator's "run now") are due whatever their cadence, and still need the lease."""
    empty = SchedRecord()
    specs = eligible(lanes, states, profile, excluded={*unreadable, *paused})
    views = view_all(specs, states, lease, now, probes or {}, forced)
    candidates = [v for v in views.values() if v.due and not v.in_flight]

    def sched(name: str) -> SchedRecord:
        st = states.get(name)
        return st.sched if st is not None else empty

    deferred: list[Deferral] = []

    def defer(name: str, reason: DeferralReason, blocker: str | None) -> None:
        deferred.append(continue_streak(sched(name).deferral, name, reason, blocker, now))

    survivors: list[LaneView] = []
    expired: list[tuple[str, Gate]] = []
    for view in candidates:
        if view.spec.heavy and lease is not None:
            defer(view.name, DeferralReason.LEASE_HELD, lease.lane)
            continue
        gate, lapsed = gates.evaluate(view, views, sched(view.name).deferral, now,
                                      legacy=policy is Policy.REGISTRY)
        expired.extend((view.name, g) for g in lapsed)
        if gate is not None:
            defer(view.name, gate.reason, gate.blocker)
            continue
        survivors.append(view)

    winner = pick((v for v in survivors if v.spec.heavy), policy)
    for view in survivors:
        if view.spec.heavy and winner is not None and view.name != winner.name:
            defer(view.name, DeferralReason.BACKPRESSURE, winner.name)
    light = tuple(v.name for v in survivors if not v.spec.heavy)
    return Decision(
        winner=winner.name if winner else None,
        also_dispatched=light,
        deferred=tuple(deferred),
        expired_gates=tuple(expired),
        views=views,
    )


def seconds_until_next_due(views: Mapping[str, LaneView], states: Mapping[str, LaneState],
                           now: float) -> float | None:
    """How long until some idle, time-driven lane turns due (None if none will by time alone)."""
    best: float | None = None
    for view in views.values():
        if view.in_flight or view.due or view.spec.backlog_driven:
            continue
        last = states.get(view.name, LaneState()).run.last_run_at
        if last is None:
            continue
        wait = max(0.0, last + view.spec.cadence_s - now)
        best = wait if best is None else min(best, wait)
    return best
