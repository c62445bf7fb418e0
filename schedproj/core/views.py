"""Derived, per-tick facts about each lane: staleness ratio, due, in flight. Pure."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from schedproj.core.due import calendar_due_at_for, effective_last_run, retry_at, staleness
from schedproj.core.frozen import is_plain
from schedproj.core.lanes import LaneKind, LaneSpec
from schedproj.core.records import EMPTY_STATE, LaneState, LeaseView


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


_new = object.__new__
_HEAVY = LaneKind.HEAVY
assert is_plain(LaneView)  # new_view below fills what LaneView's __init__ would


def new_view(spec: LaneSpec, ratio: float, backlog: int, due: bool, in_flight: bool,
             never_run: bool) -> LaneView:
    """``LaneView(...)`` without the frozen dataclass ``__init__`` (a tick builds one per
    lane it views: see ``core.frozen``)."""
    view = _new(LaneView)
    d = view.__dict__
    d["spec"] = spec
    d["ratio"] = ratio
    d["backlog"] = backlog
    d["due"] = due
    d["in_flight"] = in_flight
    d["never_run"] = never_run
    return view


def staleness_ratio(last_run_at: float | None, cadence_s: float, now: float) -> float:
    """``(now - last_run_at) / cadence``; a lane that never ran is maximally stale (inf)."""
    if last_run_at is None:
        return math.inf
    return max(0.0, now - last_run_at) / cadence_s


def retry_due(spec: LaneSpec, state: LaneState, now: float) -> bool:
    """Is a failed run's retry due at ``now``? (The rule: :func:`schedproj.core.due.retry_at`.)"""
    return retry_at(spec, state, now) <= now


def is_in_flight(state: LaneState, now: float, grace_s: float = 0.0) -> bool:
    """A light lane's dispatch not yet finished: a run that started and has not ended counts
    while its heartbeat keeps its mark fresh (whatever beat's record says: after Redis lost
    state that record may be gone, and the run re-asserts its mark); a message not yet started
    counts until its own expiry (it may still be delivered).

    The mark's end is on Redis's clock and judged on beat's, and a heartbeat may stall (a
    partition, a long pause): the run counts as in flight for ``grace_s`` past its mark (beat
    passes one lease TTL, the grace after which it records the run lost), so a lane is never
    dispatched while its run is neither in flight nor recorded lost."""
    run = state.run
    running = run.running_task_id is not None and run.running_task_id != run.last_task_id
    if running and run.running_until is not None and now < run.running_until + grace_s:
        return True
    task_id = state.sched.inflight_task_id
    if task_id is None or task_id in (run.last_task_id, run.running_task_id,
                                      run.skipped_task_id):
        # Ended, refused (recorded skipped: a stale beat's message, say), or started (then
        # only its mark above keeps it in flight: a killed run frees its lane one heartbeat
        # TTL later, not at the start deadline).
        return False
    deadline = state.sched.inflight_deadline
    return deadline is not None and now < deadline


def dispatch_ended(state: LaneState) -> bool:
    """Has the message the sched record names as in flight ended: run (its end recorded,
    lost included) or refused (recorded skipped)? Then the record's in-flight fields say
    nothing :func:`is_in_flight` or a worker needs any more (a redelivered copy of the message
    is refused as not the lane's current dispatch, as it was refused as already started)."""
    task_id = state.sched.inflight_task_id
    return task_id is not None and (task_id == state.run.last_task_id
                                    or task_id == state.run.skipped_task_id)


def view_lane(
    spec: LaneSpec,
    state: LaneState,
    lease: LeaseView | None,
    now: float,
    probed_backlog: int | None = None,
    forced: bool = False,
    grace_s: float = 0.0,
) -> LaneView:
    """Compute the view of one lane. ``probed_backlog`` comes from the lane's due-check hook."""
    ratio = staleness(spec, state, now)
    run = state.run
    backlog = probed_backlog if probed_backlog is not None else run.backlog
    never_run = run.last_run_at is None
    # (A lane with no retry policy has no retry due: retry_at's first test, without the call.)
    if forced or (spec.retry_after_failure_s is not None and retry_at(spec, state, now) <= now):
        due = True
    elif spec.backlog_driven:
        # Ranked with its cadence, but due only while behind (a first run measures it).
        due = backlog > 0 or (never_run and probed_backlog is None)
    elif spec.calendar is not None:
        due = backlog > 0 or calendar_due_at_for(spec, state, now) <= now
    else:
        due = ratio >= spec.due_ratio or backlog > 0
    if spec.kind is _HEAVY:
        # A heavy run lives exactly as long as its lease: granted at dispatch, renewed while
        # running, gone when the run ends or its worker dies. Nothing else can wedge the lane.
        in_flight = lease is not None and lease.lane == spec.name
    else:
        in_flight = is_in_flight(state, now, grace_s)
    return new_view(spec, ratio, backlog if backlog > 0 else 0, due, in_flight, never_run)


def view_all(
    specs: tuple[LaneSpec, ...],
    states: Mapping[str, LaneState],
    lease: LeaseView | None,
    now: float,
    probes: Mapping[str, int],
    forced: Collection[str] = (),
    grace_s: float = 0.0,
) -> dict[str, LaneView]:
    empty = EMPTY_STATE
    return {
        s.name: view_lane(s, states.get(s.name, empty), lease, now, probes.get(s.name),
                          s.name in forced, grace_s)
        for s in specs
    }


# effective_last_run lives with the due-time rule (core.due); it is named here too because
# every stage that views a lane uses it.
__all__ = ["LaneView", "effective_last_run", "is_in_flight", "new_view", "retry_due",
           "staleness_ratio", "view_all", "view_lane"]
