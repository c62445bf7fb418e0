"""How a lane is declared: the options a Celery task carries to become a lane.

A lane is an ordinary Celery task with a ``lane=Lane(...)`` option::

    @app.task(base=LaneTask, lane=Lane(cadence_s=600, kind=LaneKind.HEAVY, order=20))
    def summary(): ...

The scheduler finds lanes in the app's task registry (see :mod:`schedproj.core.laneset`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from schedproj.core import defaults
from schedproj.core.errors import LaneDeclarationError
from schedproj.core.pools import DEFAULT_POOL, pool_name_problem
from schedproj.core.schedules import FireTimes


class LaneKind(StrEnum):
    """Which contention class a lane belongs to (ADR 0022 section 2.3)."""

    #: Takes the one fleet-wide heavy lease; runs on queue ``heavy``, one at a time.
    HEAVY = "heavy"
    #: Needs no lease; dispatched to queue ``light`` in the same tick as the heavy winner.
    LIGHT = "light"


class DeploymentClass(StrEnum):
    """ADR-0014 deployment axis: where a lane may run."""

    #: May run in a cloud deployment.
    CLOUD_DEPLOYABLE = "cloud-deployable"
    #: Only on a local host; disabled under the ``cloud`` profile.
    LOCAL_ONLY = "local-only"
    #: A primitive every deployment runs.
    SHARED = "shared"


class Profile(StrEnum):
    """Deployment profile (ADR-0014): which lane deployment classes may run here."""

    #: A developer or on-premises host: every lane may run.
    LOCAL = "local"
    #: A cloud deployment: lanes declared local-only are disabled.
    CLOUD = "cloud"


class GateCondition(StrEnum):
    """When a soft gate defers its lane."""

    #: Defer while the blocker is due and still has backlog (or has never run).
    DUE_AND_BEHIND = "due-and-behind"
    #: Defer while the blocker is due or running.
    DUE_OR_RUNNING = "due-or-running"


class DeferralReason(StrEnum):
    """Why a due lane was not dispatched this tick. Stored in Redis and shown to operators."""

    #: A heavy lane was due while another heavy lane held the lease.
    LEASE_HELD = "heavy-maintenance-lease-held"
    #: A heavy lane was due but another heavy lane won the pick this tick.
    BACKPRESSURE = "heavy-maintenance-backpressure"
    #: golden-path waits for dream (the original's reason code).
    GOLDEN_PATH_DEPENDENCY = "golden-path-dependency-backpressure"
    #: A soft gate on a producer lane deferred its consumer.
    DEPENDENCY = "dependency-backpressure"
    #: Redis lost state (restart, failover): nothing is dispatched until every earlier heavy
    #: holder and light run has had time to re-assert itself.
    STATE_LOSS_QUARANTINE = "state-loss-quarantine"


@dataclass(frozen=True)
class Gate:
    """A soft, deferral-only edge: defer this lane while ``blocker`` meets ``when``.

    ``max_defer_s`` bounds how long one streak may defer: past it the gate lets the lane go (and
    the decision says so), so a blocker that never drains cannot deadlock the chain.
    ``in_legacy`` says whether the legacy registry pipeline (``Policy.REGISTRY``, kept only to
    show the starvation ADR 0022 fixed) applied this gate too; gates ADR 0022 introduced
    leave it False.
    """

    #: The lane (or lane family, or one member ``family[key]``) this lane waits for.
    blocker: str
    #: When to defer: while the blocker is due and behind (``due-and-behind``), or due or
    #: running (``due-or-running``).
    when: GateCondition = GateCondition.DUE_AND_BEHIND
    #: The deferral reason recorded and shown to operators.
    reason: DeferralReason = DeferralReason.DEPENDENCY
    #: The longest one deferral streak may last (seconds); past it the gate lets the lane go.
    #: None: no bound.
    max_defer_s: float | None = None
    #: Whether the legacy registry picker applied this gate too (comparison runs only).
    in_legacy: bool = False

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "when", GateCondition(self.when))
            object.__setattr__(self, "reason", DeferralReason(self.reason))
        except ValueError as exc:
            raise LaneDeclarationError(
                f"gate on {self.blocker!r}", str(exc),
                f"use when= one of {[c.value for c in GateCondition]} and reason= one of "
                f"{[r.value for r in DeferralReason]}",
            ) from None


class DueAnswer(NamedTuple):
    """What a due check may return instead of a bare backlog: the backlog, and the time
    (epoch seconds) at which the answer changes with nothing written, e.g. when a backoff
    ends. Only a stamped check (:class:`DueCheckStamp`) uses ``until``: beat calls it again
    then; an unstamped check is called every tick anyway."""

    backlog: int
    until: float | None = None


#: A cheap hook the scheduler calls each tick: returns the lane's current backlog (0 = none),
#: as an int or a :class:`DueAnswer`.
DueCheck = Callable[[], int | DueAnswer]


@dataclass(frozen=True)
class DueCheckStamp:
    """Opt-in: the lane's due check answers only from data whose every write also sets one
    Redis key, the stamp, to a value it never held before (a fresh random token). Beat then
    reads the stamps of all such checks in one request per tick and calls a check only when
    its stamp moved since the call it remembers, when the answer's ``until`` passed, when a
    lane record changed in the tick's read (a run started or ended), or when its answer is
    ``max_age_s`` old. A write that sets the stamp is seen by the next tick, as without the
    stamp; ``max_age_s`` bounds how late a write that does not (a hand edit with redis-cli, a
    writer of a release before the stamp) is seen.
    """

    #: The stamp's key, relative to the deployment's key prefix (``"rem:write-stamp"`` is
    #: ``<prefix>:rem:write-stamp``), so it is read from schedproj's Redis, in the deployment's
    #: hash slot on a cluster.
    key: str
    #: The oldest a remembered answer may get before beat calls the check anyway (seconds).
    max_age_s: float = 60.0

    def check(self, lane: str) -> None:
        if not isinstance(self.key, str) or not self.key or self.key != self.key.strip():
            raise LaneDeclarationError(
                lane, f"due_check_stamp key must be a non-empty key name, got {self.key!r}",
                "pass DueCheckStamp('myapp:inbox-stamp') and set that key (under the key "
                "prefix) to a fresh value on every write the due check reads")
        age: Any = self.max_age_s
        if (isinstance(age, bool) or not isinstance(age, int | float)
                or not math.isfinite(age) or age <= 0):
            raise LaneDeclarationError(
                lane, f"due_check_stamp max_age_s must be a positive number of seconds, "
                f"got {age!r}", "pass max_age_s=60 (or leave it out)")


@dataclass(frozen=True, kw_only=True)
class Lane:
    """The lane options a Celery task carries. Validated by :meth:`check` with the lane's name.

    ``cadence_s`` is how often the lane should run; its staleness ratio is
    ``(now - last_run_at) / cadence_s``. A calendar lane gives ``schedule=`` instead (a cron
    expression, a Celery ``crontab``, ``solar`` or other schedule) and runs at its fire times
    in ``timezone`` (default: the app's); its ratio is measured on its own period
    (:func:`schedproj.core.schedules.calendar_ratio`). A ``backlog_driven`` lane is due only
    while it has backlog (reported by its last run or by ``due_check``) but is ranked with its
    cadence.
    """

    #: How often the lane should run (seconds, > 0): the staleness ratio's unit. Give this or
    #: ``schedule``.
    cadence_s: float | None = None
    #: A calendar instead of a cadence: a cron expression (``"30 2 * * *"``), a Celery
    #: ``crontab``/``solar``, or any Celery schedule. Fire times follow cron's DST rules.
    schedule: Any = field(default=None, compare=False)
    #: The IANA time zone of ``schedule`` (``"Europe/Berlin"``); default: the app's
    #: ``timezone`` (UTC when it has none and ``enable_utc`` is on).
    timezone: str | None = None
    #: A calendar lane's fire time may start at most this long after it (seconds); a later
    #: start is skipped and counted missed, and the lane waits for its next fire. None:
    #: missed fire times coalesce into one run.
    catchup_window_s: float | None = None
    #: ``heavy`` takes the one fleet-wide lease and runs on queue ``heavy``; ``light`` needs no
    #: lease and runs on queue ``light``.
    kind: LaneKind = LaneKind.HEAVY
    #: A heavy data-safety lane that wins outright whenever it is due.
    priority0: bool = False
    #: ``shared``, ``cloud-deployable`` or ``local-only`` (disabled under the ``cloud``
    #: profile: never a candidate, never dispatched).
    deployment: DeploymentClass = DeploymentClass.SHARED
    #: Soft gates (:class:`Gate`): defer this lane while a blocker is busy; they only defer,
    #: never block.
    gates: tuple[Gate, ...] = ()
    #: Declared order for ties (then the name); lanes without one come after, at 1000.
    order: int | None = None
    #: Due only while it has backlog (reported by its last run or its ``due_check``), but
    #: ranked with its cadence.
    backlog_driven: bool = False
    #: A cheap function beat calls each tick, returning the lane's current backlog (0: none).
    due_check: DueCheck | None = field(default=None, compare=False)
    #: Opt-in (:class:`DueCheckStamp`): beat calls ``due_check`` only when the stamp key its
    #: data's writers set has moved (or its answer grew old), not every tick.
    due_check_stamp: DueCheckStamp | None = None
    #: After a failed (or lost) run, due again this many seconds later (with
    #: ``retry_window_s``).
    retry_after_failure_s: float | None = None
    #: Retries are made while the first failure of the streak is at most this old (seconds).
    retry_window_s: float | None = None
    #: The pool a heavy lane runs in (:class:`schedproj.core.pools.Pool`, declared with
    #: ``configure_app(app, pools=...)`` or ``SCHEDPROJ_POOLS``); None: the default pool
    #: ``heavy`` of one slot, the one heavy lease. Its runs go to the queue of the pool's name.
    pool: str | None = None
    #: Scales the lane's staleness ratio in the ranking among heavy lanes (a weight-2 lane at
    #: ratio 1.5 outranks a weight-1 lane at 2.5); never changes when the lane is due. > 0.
    weight: float = 1.0
    #: How many slots of its pool a heavy lane takes at once (a job needing both GPUs: 2);
    #: at most the pool's slot count (the default pool has one).
    slots: int = 1
    #: The lane's name (default: the Celery task's name).
    name: str | None = None

    def __post_init__(self) -> None:
        # Accept plain strings and lists from users; store the validated, hashable forms.
        try:
            object.__setattr__(self, "kind", LaneKind(self.kind))
            object.__setattr__(self, "deployment", DeploymentClass(self.deployment))
        except ValueError as exc:
            raise LaneDeclarationError(
                self.name or "<unnamed>", str(exc),
                f"use one of {[k.value for k in LaneKind]} for kind and "
                f"{[d.value for d in DeploymentClass]} for deployment",
            ) from None
        gates: Any = self.gates
        if gates is None:
            gates = ()
        if not isinstance(gates, list | tuple):
            raise LaneDeclarationError(
                self.name or "<unnamed>", f"gates must be a tuple of Gate, got {gates!r}",
                "pass gates=(Gate('blocker-lane'),) or leave it out",
            )
        object.__setattr__(self, "gates", tuple(gates))

    def check(self, lane: str) -> None:
        """Reject declarations that cannot be scheduled, naming the lane and the fix."""
        if self.schedule is not None:
            self._check_calendar(lane)
        else:
            self._check_cadence(lane)
        self._check_options(lane)
        for gate in self.gates:
            self._check_gate(lane, gate)

    def _check_cadence(self, lane: str) -> None:
        cadence: Any = self.cadence_s
        if cadence is None:
            raise LaneDeclarationError(
                lane, "cadence_s is missing",
                "pass cadence_s=<seconds>, e.g. cadence_s=600 for ten minutes",
            )
        if isinstance(cadence, bool) or not isinstance(cadence, int | float):
            raise LaneDeclarationError(
                lane, f"cadence_s must be a number of seconds, got {cadence!r}",
                "pass cadence_s=<seconds>, e.g. cadence_s=600 for ten minutes",
            )
        if not math.isfinite(cadence) or cadence <= 0:
            raise LaneDeclarationError(
                lane, f"cadence_s must be a positive finite number, got {cadence!r}",
                "pass cadence_s=<seconds> greater than 0",
            )

    def _check_calendar(self, lane: str) -> None:
        if self.cadence_s is not None:
            raise LaneDeclarationError(
                lane, "both cadence_s and schedule are given",
                "give one: cadence_s=<seconds> for a cadence, or schedule=crontab(...) for a "
                "calendar",
            )
        if self.backlog_driven:
            raise LaneDeclarationError(
                lane, "a backlog-driven lane has a calendar schedule",
                "a backlog-driven lane runs when it has backlog: give it cadence_s=<seconds> "
                "(its ranking unit), or drop backlog_driven",
            )
        window: Any = self.catchup_window_s
        if window is not None and (isinstance(window, bool) or not isinstance(window, int | float)
                                   or not math.isfinite(window) or window < 0):
            raise LaneDeclarationError(
                lane, f"catchup_window_s must be a number of seconds >= 0, got {window!r}",
                "pass catchup_window_s=<seconds>, e.g. 300, or leave it out to coalesce "
                "missed fire times into one run",
            )
        if self.timezone is not None and not isinstance(self.timezone, str):
            raise LaneDeclarationError(
                lane, f"timezone must be an IANA zone name, got {self.timezone!r}",
                "pass timezone='Europe/Berlin' (or leave it out for the app's time zone)",
            )

    def _check_retry(self, lane: str) -> None:
        after, window = self.retry_after_failure_s, self.retry_window_s
        if after is None and window is None:
            return
        numbers = all(isinstance(v, int | float) and not isinstance(v, bool)
                      and math.isfinite(v) for v in (after, window))
        if not numbers or not (0 < after <= window):  # type: ignore[operator]
            raise LaneDeclarationError(
                lane, f"retry_after_failure_s={after!r} and retry_window_s={window!r} do not "
                "fit together", "set both, with 0 < retry_after_failure_s <= retry_window_s "
                "(e.g. 900 and 3600: retry 15 min after a failure, for up to an hour)",
            )

    def _check_options(self, lane: str) -> None:
        for flag in ("priority0", "backlog_driven"):
            if not isinstance(getattr(self, flag), bool):
                raise LaneDeclarationError(
                    lane, f"{flag} must be True or False, got {getattr(self, flag)!r}",
                    f"pass {flag}=True or leave it out",
                )
        self._check_retry(lane)
        self._check_pool(lane)
        if self.schedule is None and (self.timezone is not None
                                      or self.catchup_window_s is not None):
            raise LaneDeclarationError(
                lane, "timezone or catchup_window_s is given without a schedule",
                "they apply to calendar lanes: add schedule=crontab(...) or drop them",
            )
        if self.priority0 and self.kind is LaneKind.LIGHT:
            raise LaneDeclarationError(
                lane, "priority0 is set on a light lane",
                "priority-0 only ranks heavy lanes; drop priority0 or make the lane heavy",
            )
        if self.order is not None and (isinstance(self.order, bool)
                                       or not isinstance(self.order, int)):
            raise LaneDeclarationError(
                lane, f"order must be an integer, got {self.order!r}", "pass order=<int>"
            )
        if self.due_check is not None and not callable(self.due_check):
            raise LaneDeclarationError(
                lane, "due_check is not callable", "pass a function returning the backlog"
            )
        if self.due_check_stamp is not None:
            if not isinstance(self.due_check_stamp, DueCheckStamp):
                raise LaneDeclarationError(
                    lane, f"due_check_stamp must be a DueCheckStamp, got "
                    f"{self.due_check_stamp!r}", "pass due_check_stamp=DueCheckStamp('key')")
            if self.due_check is None:
                raise LaneDeclarationError(
                    lane, "due_check_stamp is given without a due_check",
                    "pass the due_check the stamp is for, or drop due_check_stamp")
            self.due_check_stamp.check(lane)

    def _check_pool(self, lane: str) -> None:
        """The pool options on their own; that the pool is declared and has the slots is
        checked where the pools are known (``laneset.build_lane_set``)."""
        weight: Any = self.weight
        if (isinstance(weight, bool) or not isinstance(weight, int | float)
                or not math.isfinite(weight) or weight <= 0):
            raise LaneDeclarationError(
                lane, f"weight must be a positive finite number, got {weight!r}",
                "pass weight=2 to rank the lane as if twice as stale (or leave it out: 1)",
            )
        slots: Any = self.slots
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise LaneDeclarationError(
                lane, f"slots must be an integer >= 1, got {slots!r}",
                "pass slots=<how many slots of its pool one run takes>, e.g. slots=2 (or "
                "leave it out: 1)",
            )
        if self.pool is not None:
            problem = pool_name_problem(self.pool)
            if problem is not None:
                raise LaneDeclarationError(
                    lane, problem, "name a declared pool (Pool('gpu', slots=2) in code or "
                    "SCHEDPROJ_POOLS='gpu=2'), or leave pool out for the default pool "
                    f"{DEFAULT_POOL!r}",
                )
        if self.kind is LaneKind.LIGHT:
            used = [f"{opt}={getattr(self, opt)!r}" for opt, default in
                    (("pool", None), ("slots", 1), ("weight", 1.0))
                    if getattr(self, opt) != default]
            if used:
                raise LaneDeclarationError(
                    lane, f"{' and '.join(used)} is set on a light lane",
                    "pools, slots and weights apply to heavy lanes (light lanes need no "
                    "slot and are all dispatched when due); drop them or make the lane heavy",
                )

    @staticmethod
    def _check_gate(lane: str, gate: Any) -> None:
        if not isinstance(gate, Gate):
            raise LaneDeclarationError(
                lane, f"gate {gate!r} is not a schedproj.Gate", "use Gate(blocker=...)"
            )
        if gate.blocker == lane:
            raise LaneDeclarationError(
                lane, "a gate names the lane itself", "remove the self-referencing gate"
            )
        if gate.max_defer_s is not None and not gate.max_defer_s > 0:
            raise LaneDeclarationError(
                lane, f"gate on {gate.blocker!r} has max_defer_s={gate.max_defer_s!r}",
                "pass a positive number of seconds or None",
            )


@dataclass(frozen=True)
class LaneSpec:
    """A validated lane as the pure core sees it: no callables, no Celery."""

    name: str
    task_name: str
    kind: LaneKind
    cadence_s: float
    priority0: bool = False
    deployment: DeploymentClass = DeploymentClass.SHARED
    gates: tuple[Gate, ...] = ()
    order: int = 1000
    backlog_driven: bool = False
    retry_after_failure_s: float | None = None
    retry_window_s: float | None = None
    #: The lane family this lane is a member of (None: a lane of its own).
    family: str | None = None
    #: Due once the staleness ratio reaches this (1.0; a family member's jitter moves it
    #: within ``1 ± jitter``, so members' due times spread while they rank by true staleness).
    due_ratio: float = 1.0
    #: A calendar lane's fire times (None: a cadence lane). ``cadence_s`` then holds the
    #: schedule's nominal period (:func:`schedproj.core.schedules.nominal_period`).
    calendar: FireTimes | None = None
    #: A calendar lane's catch-up window (seconds; None: missed fire times coalesce).
    catchup_window_s: float | None = None
    #: The pool a heavy lane runs in (``heavy``: the default pool of one slot, the lease).
    pool: str = DEFAULT_POOL
    #: Scales the staleness ratio in the ranking (``weight x ratio``), never the due-ness.
    weight: float = 1.0
    #: Slots of its pool one run takes at once.
    slots: int = 1

    @property
    def heavy(self) -> bool:
        return self.kind is LaneKind.HEAVY

    @property
    def sort_key(self) -> tuple[int, str]:
        """Declared order, then name: never import order."""
        return (self.order, self.name)


def enabled_under(profile: Profile, deployment: DeploymentClass) -> bool:
    """ADR-0014: the cloud profile never runs local-only lanes."""
    return not (profile is Profile.CLOUD and deployment is DeploymentClass.LOCAL_ONLY)


def queue_for(kind: LaneKind, pool: str | None = None) -> str:
    """The queue a lane of ``kind`` is sent to: heavy lanes never share the light queue. A
    heavy lane's is its pool's, named after the pool (``heavy`` for the default pool)."""
    if kind is not LaneKind.HEAVY:
        return defaults.LIGHT_QUEUE
    return pool or DEFAULT_POOL


def fixed_unit(name: str) -> float:
    """A fixed number in [0, 1) from a lane's name: the same on every host and run (spreads
    family members' due times, and lanes' rebuilt last runs after Redis lost state)."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64
