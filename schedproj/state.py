"""Lane state as stored in Redis: frozen records with a format version.

Each lane has two records in one Redis hash, one per writer, so beat and workers never
overwrite each other's fields:

* :class:`RunRecord` (field ``<lane>|run``) is written by the worker that runs the lane;
* :class:`SchedRecord` (field ``<lane>|sched``) is written by the active beat.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from typing import Any, TypeVar

from schedproj.defaults import STATE_VERSION
from schedproj.errors import StateError
from schedproj.lanes import DeferralReason


class Outcome(StrEnum):
    """How a run ended."""

    #: Finished its work.
    COMPLETED = "completed"
    #: Raised (or hit its time limit).
    FAILED = "failed"
    #: Stopped at a checkpoint because it reached the hold cap or lost the lease; backlog left.
    YIELDED = "yielded"
    #: Refused to run (stale or missing lease token); nothing was done.
    SKIPPED = "skipped"


@dataclass(frozen=True)
class RunRecord:
    """What the workers know about a lane: its runs and their outcomes."""

    last_run_at: float | None = None
    last_outcome: Outcome | None = None
    last_reason: str | None = None
    last_task_id: str | None = None
    backlog: int = 0
    runs: int = 0
    failures: int = 0
    running_task_id: str | None = None
    running_since: float | None = None
    running_until: float | None = None
    fence: int = 0
    failing_since: float | None = None


@dataclass(frozen=True)
class Deferral:
    """A lane deferred by a gate or by the lease. ``since`` marks the streak start and never
    slides while the lane stays deferred; ``blocker_since`` is when the current blocker took
    over within the streak (None: from the start)."""

    lane: str
    reason: DeferralReason
    blocker: str | None
    since: float
    blocker_since: float | None = None
    #: The gate blocker whose clock ``blocker_since`` is, when a lease wait interrupts a gate
    #: deferral (the wait must not restart the gate's clock). None: ``blocker`` itself.
    gate_blocker: str | None = None

    @property
    def behind_blocker_since(self) -> float:
        """How long the current blocker has deferred the lane counts from here."""
        return self.since if self.blocker_since is None else self.blocker_since

    @property
    def gate_owner(self) -> str | None:
        """The gate blocker whose clock this deferral carries, if any."""
        if self.gate_blocker is not None:
            return self.gate_blocker
        lease_wait = self.reason in (DeferralReason.LEASE_HELD, DeferralReason.BACKPRESSURE)
        return None if lease_wait else self.blocker

    def gate_clock(self, blocker: str) -> float | None:
        """Since when the gate on ``blocker`` has been deferring this lane, if it is."""
        return self.behind_blocker_since if self.gate_owner == blocker else None


@dataclass(frozen=True)
class SchedRecord:
    """What the active beat knows about a lane: dispatches, in-flight message, deferral."""

    inflight_task_id: str | None = None
    inflight_deadline: float | None = None
    last_dispatch_at: float | None = None
    dispatches: int = 0
    deferral: Deferral | None = None
    paused: bool = False


@dataclass(frozen=True)
class LaneState:
    run: RunRecord = field(default_factory=RunRecord)
    sched: SchedRecord = field(default_factory=SchedRecord)


@dataclass(frozen=True)
class LeaseView:
    """The heavy lease as read from Redis."""

    lane: str
    token: str
    fence: int
    granted_at: float
    started_at: float | None = None
    task_id: str | None = None


R = TypeVar("R", RunRecord, SchedRecord, LeaseView)


def encode(record: RunRecord | SchedRecord | LeaseView) -> str:
    """Serialize a record to versioned JSON."""
    return json.dumps({"v": STATE_VERSION, **asdict(record)}, separators=(",", ":"))


def decode(cls: type[R], raw: str | bytes, key: str) -> R:
    """Parse a record, raising :class:`StateError` naming ``key`` on anything unexpected."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise StateError(key, f"not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise StateError(key, f"expected a JSON object, found {type(data).__name__}")
    version = data.pop("v", None)
    if version != STATE_VERSION:
        raise StateError(
            key, f"format version {version!r}, this schedproj reads version {STATE_VERSION}"
        )
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise StateError(key, f"unknown fields {sorted(unknown)}")
    try:
        return _build(cls, data)
    except (TypeError, ValueError) as exc:
        raise StateError(key, f"bad field value ({exc})") from None


def _build(cls: type[R], data: dict[str, Any]) -> R:
    if cls is RunRecord and data.get("last_outcome") is not None:
        data["last_outcome"] = Outcome(data["last_outcome"])
    if cls is SchedRecord and data.get("deferral") is not None:
        data["deferral"] = _build_deferral(data["deferral"])
    record = cls(**data)
    _check_types(record)
    return record


def _build_deferral(raw: Any) -> Deferral:
    if not isinstance(raw, dict):
        raise TypeError(f"deferral must be an object, got {raw!r}")
    missing = {"lane", "reason", "since"} - set(raw)
    if missing:
        raise ValueError(f"deferral lacks {sorted(missing)}")
    d = dict(raw)
    d["reason"] = DeferralReason(d["reason"])
    deferral = Deferral(**d)
    _check_types(deferral)
    return deferral


_NUMERIC = (int, float)


def _check_types(record: RunRecord | SchedRecord | LeaseView | Deferral) -> None:
    """Reject values of the wrong JSON type so garbage never reaches the picker."""
    for f in fields(record):
        value = getattr(record, f.name)
        if value is None:
            continue
        annotation = str(f.type)
        if annotation.startswith(("float", "int")) and (
            isinstance(value, bool) or not isinstance(value, _NUMERIC)
        ):
            raise TypeError(f"{f.name} must be a number, got {value!r}")
        if annotation.startswith("str") and not isinstance(value, str):
            raise TypeError(f"{f.name} must be a string, got {value!r}")
        if annotation == "bool" and not isinstance(value, bool):
            raise TypeError(f"{f.name} must be true or false, got {value!r}")


__all__ = [
    "Deferral",
    "LaneState",
    "LeaseView",
    "Outcome",
    "RunRecord",
    "SchedRecord",
    "decode",
    "encode",
    "replace",
]
