"""Derived, per-tick facts about each lane: staleness ratio, due, in flight. Pure."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from schedproj.lanes import LaneSpec
from schedproj.state import LaneState, LeaseView, Outcome


@dataclass(frozen=True)
class LaneView:
    """One lane at one instant, as every pipeline stage sees it."""

    spec: LaneSpec
    ratio: float
    backlog: int
    due: bool
    in_flight: bool
    never_run: bool

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def behind(self) -> bool:
        """Has work left: reported backlog, or never run so its backlog is unknown."""
        return self.backlog > 0 or self.never_run


def staleness_ratio(last_run_at: float | None, cadence_s: float, now: float) -> float:
    """``(now - last_run_at) / cadence``; a lane that never ran is maximally stale (inf)."""
    if last_run_at is None:
        return math.inf
    return max(0.0, now - last_run_at) / cadence_s


def retry_due(spec: LaneSpec, state: LaneState, now: float) -> bool:
    """A failed run is retried ``retry_after_failure_s`` later, while the failure streak is
    younger than ``retry_window_s`` (the original backup: after 15 min, within 1 h)."""
    run = state.run
    if (spec.retry_after_failure_s is None or spec.retry_window_s is None
            or run.last_outcome is not Outcome.FAILED or run.last_run_at is None):
        return False
    streak_start = run.failing_since if run.failing_since is not None else run.last_run_at
    return (now - run.last_run_at >= spec.retry_after_failure_s
            and now - streak_start <= spec.retry_window_s)


def is_in_flight(state: LaneState, now: float) -> bool:
    """A dispatched message not yet finished, within its start deadline or its run's bound."""
    task_id = state.sched.inflight_task_id
    if task_id is None or state.run.last_task_id == task_id:
        return False
    run = state.run
    deadline = state.sched.inflight_deadline
    # Until the message's own expiry it may still be (re)delivered and start; after that, only
    # a live run's heartbeat keeps the lane in flight.
    bounds = [b for b in (deadline, run.running_until if run.running_task_id == task_id
                          else None) if b is not None]
    return bool(bounds) and now < max(bounds)


def view_lane(
    spec: LaneSpec,
    state: LaneState,
    lease: LeaseView | None,
    now: float,
    probed_backlog: int | None = None,
    forced: bool = False,
) -> LaneView:
    """Compute the view of one lane. ``probed_backlog`` comes from the lane's due-check hook."""
    ratio = staleness_ratio(state.run.last_run_at, spec.cadence_s, now)
    backlog = probed_backlog if probed_backlog is not None else state.run.backlog
    never_run = state.run.last_run_at is None
    if forced or retry_due(spec, state, now):
        due = True
    elif spec.backlog_driven:
        # Ranked with its cadence, but due only while behind (a first run measures it).
        due = backlog > 0 or (never_run and probed_backlog is None)
    else:
        due = ratio >= 1.0 or backlog > 0
    if spec.heavy:
        # A heavy run lives exactly as long as its lease: granted at dispatch, renewed while
        # running, gone when the run ends or its worker dies. Nothing else can wedge the lane.
        in_flight = lease is not None and lease.lane == spec.name
    else:
        in_flight = is_in_flight(state, now)
    return LaneView(
        spec=spec,
        ratio=ratio,
        backlog=max(0, backlog),
        due=due,
        in_flight=in_flight,
        never_run=never_run,
    )


def view_all(
    specs: tuple[LaneSpec, ...],
    states: Mapping[str, LaneState],
    lease: LeaseView | None,
    now: float,
    probes: Mapping[str, int],
    forced: Collection[str] = (),
) -> dict[str, LaneView]:
    empty = LaneState()
    return {
        s.name: view_lane(s, states.get(s.name, empty), lease, now, probes.get(s.name),
                          s.name in forced)
        for s in specs
    }
