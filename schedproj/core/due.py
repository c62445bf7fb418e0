"""When a lane is due: the retry rule and the due-time rule, each written once. Pure.

Beat judges "due now" in its views (``views.view_lane``), files "due when" in the due index
(``dueindex.next_look``, and the worker's finish through ``due_at``), and sleeps until the next
lane falls due (``pipeline.seconds_until_next_due``); the simulator asks the same questions.
All of them call these functions, so a lane is due at the same instant whoever asks.
"""

from __future__ import annotations

import math

from schedproj.core import defaults
from schedproj.core.lanes import LaneSpec
from schedproj.core.records import LaneState, Outcome
from schedproj.core.schedules import calendar_due_at, calendar_ratio

#: A lane that never falls due by time alone (backlog-driven without backlog, paused).
NEVER = math.inf


def effective_last_run(state: LaneState, cadence_s: float, now: float,
                       due_ratio: float = 1.0) -> float | None:
    """When the lane last ran, bounded by beat's clock. Pure.

    ``last_run_at`` comes from the clock of the worker that ran the lane. A clock that is ahead
    writes a time in the future, which taken at its word holds the lane back by the whole skew
    (an hour ahead made a 10-minute lane wait 70 minutes). A time further in the future than
    ``min(CLOCK_SKEW_TOLERANCE_S, cadence)`` is therefore capped at the lane's last dispatch
    (written with beat's clock; the run ended after it) plus one cadence: a skewed host never
    delays a lane by more than one cadence (it may make it run up to one cadence early). A
    time within the tolerance (a run that ended while this tick was reading, host jitter) is
    taken as it is. With no dispatch recorded, a time up to one cadence ahead is taken as it
    is, and a further one makes the lane just due now: no host's clock delays a lane by more
    than one cadence, whatever its cadence. A family member that never ran counts
    as having run one cadence (its due ratio's worth, if more) before it was added.
    """
    last = state.run.last_run_at
    if last is None:
        # Never ran: maximally stale (None), unless it is a family member with an add time,
        # which is just due from then (see RunRecord.since): at its due ratio, or 1.
        since = state.run.since
        return None if since is None else min(since, now) - cadence_s * max(1.0, due_ratio)
    if last <= now:
        return last  # not ahead of beat's clock: taken as it is (what every branch below does)
    dispatched = state.sched.last_dispatch_at
    if dispatched is None:
        # No dispatch of beat's to anchor a cap on (a lost or hand-made sched record). Up to
        # one cadence ahead delays the lane by at most one cadence: taken as it is. Further
        # ahead, the time says nothing trustworthy and the lane is just due now (a cap
        # anchored on ``now`` would move with every tick and never fall due).
        return last if last - now <= cadence_s else now - cadence_s * due_ratio
    if last - now <= min(defaults.CLOCK_SKEW_TOLERANCE_S, cadence_s):
        return last
    return min(last, dispatched + cadence_s)


def retry_at(spec: LaneSpec, state: LaneState, now: float) -> float:
    """The retry rule: when the lane's retry falls due, as it stands at ``now``.

    A run that failed (or was recorded lost) is retried ``retry_after_failure_s`` after it
    ended, as long as the failing streak — counted from the end of its first failure
    (``failing_since``), else from this run — is at most ``retry_window_s`` old at that
    moment and at ``now`` (the original backup: after 15 min, within 1 h). :data:`NEVER` when
    no retry is pending: the lane has no retry policy, its last run did not fail, or the
    window closes before the retry or has closed by ``now``. A time at or before ``now``
    means the retry is due.
    """
    run = state.run
    after, window = spec.retry_after_failure_s, spec.retry_window_s
    if (after is None or window is None or run.last_run_at is None
            or run.last_outcome not in (Outcome.FAILED, Outcome.LOST)):
        return NEVER
    streak_start = run.failing_since if run.failing_since is not None else run.last_run_at
    at = run.last_run_at + after
    closes = streak_start + window
    return at if at <= closes and now <= closes else NEVER


def calendar_last_run(spec: LaneSpec, state: LaneState, now: float) -> float | None:
    """A calendar lane's last run as its rules count it: :func:`effective_last_run` (a skewed
    clock bounded by the nominal period), with a never-run family member's add time as a run
    then (it waits for its first fire time after it was added).

    A run counts from when beat dispatched it, if that was before it ended: a fire time that
    passed while the run was queued or executing was not served by it. Counted from its end,
    a run sent before 09:00 (``schedproj run`` a minute early, a lane late for 08:00 behind the
    lease) that ended after 09:00 swallowed the 09:00 fire time: not run, not counted missed,
    no alarm. The dispatch is beat's own clock, the one fire times are judged on, so a worker
    whose clock is behind never makes a lane run twice for one fire time. A dispatch after
    the run's end (a message refused as stale, which ended nothing) leaves the end."""
    if state.run.last_run_at is None:
        return state.run.since
    last = effective_last_run(state, spec.cadence_s, now)
    dispatched = state.sched.last_dispatch_at
    if last is not None and dispatched is not None and dispatched < last:
        return dispatched
    return last


def calendar_due_at_for(spec: LaneSpec, state: LaneState, now: float) -> float:
    """When a calendar lane falls due by its fire times (``schedules.calendar_due_at``)."""
    assert spec.calendar is not None
    return calendar_due_at(spec.calendar, calendar_last_run(spec, state, now), now,
                           spec.catchup_window_s, abs(spec.due_ratio - 1.0))


def staleness(spec: LaneSpec, state: LaneState, now: float) -> float:
    """The lane's staleness ratio at ``now``: ``(now - last_run_at) / cadence_s`` for a
    cadence lane (``views.staleness_ratio``), measured on its own period for a calendar lane
    (``schedules.calendar_ratio``). A cadence lane that never ran is maximally stale."""
    if spec.calendar is not None:
        return calendar_ratio(spec.calendar, calendar_last_run(spec, state, now), now)
    last = state.run.last_run_at
    if last is None or last > now:  # (else effective_last_run is last: every view asks)
        last = effective_last_run(state, spec.cadence_s, now, spec.due_ratio)
        if last is None:
            return math.inf
    return max(0.0, now - last) / spec.cadence_s


def due_at(spec: LaneSpec, state: LaneState, now: float, backlog: int | None = None) -> float:
    """The due-time rule: when the lane falls due, as ``views.view_lane`` judges "due".

    A lane is due once its staleness ratio (from :func:`effective_last_run`) reaches its
    ``due_ratio`` — a backlog-driven lane never by time alone — or while it has backlog, or
    when a retry falls due (:func:`retry_at`); a lane that never ran is due at once (a
    backlog-driven one unless its due-check reported no backlog: its first run measures it).
    ``backlog`` is what the lane's due-check reported this tick; None: it has none, so the
    record's backlog counts. Returns a time at or before ``now`` when the lane is due already
    (one that stays the same from tick to tick, so the due index is not rewritten for lanes
    waiting their turn), or :data:`NEVER` when time alone never makes it due.
    """
    run = state.run
    retry = retry_at(spec, state, now)
    behind = run.backlog if backlog is None else backlog
    if run.last_run_at is None:
        if spec.backlog_driven:
            return 0.0 if backlog is None or behind > 0 else NEVER
        if run.since is None or behind > 0:
            return 0.0
        # A member never run is due by its cadence from when it was added (below).
    elif behind > 0:
        return min(run.last_run_at, now)
    elif spec.backlog_driven:
        return retry
    if spec.calendar is not None:
        return min(retry, calendar_due_at_for(spec, state, now))
    last = effective_last_run(state, spec.cadence_s, now, spec.due_ratio)
    assert last is not None
    return min(retry, last + spec.cadence_s * spec.due_ratio)


__all__ = ["NEVER", "calendar_due_at_for", "calendar_last_run", "due_at", "effective_last_run",
           "retry_at", "staleness"]
