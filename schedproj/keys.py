"""Every Redis key name schedproj uses, built from one prefix."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    """Key names under one prefix. ``Keys("schedproj").lease == "schedproj:lease"``."""

    prefix: str

    @property
    def lanes(self) -> str:
        """Hash: field ``<lane>|run`` (written by workers), ``<lane>|sched`` (written by beat)."""
        return f"{self.prefix}:lanes"

    @property
    def lease(self) -> str:
        """String (JSON): the heavy lease record, with a Redis TTL."""
        return f"{self.prefix}:lease"

    @property
    def lease_fence(self) -> str:
        """Integer: the fencing counter, incremented on every lease grant. Never decreases."""
        return f"{self.prefix}:lease:fence"

    @property
    def beat_lock(self) -> str:
        """String (JSON): the single-active-beat lock, with a Redis TTL."""
        return f"{self.prefix}:beat:lock"

    @property
    def beat_fence(self) -> str:
        """Integer: incremented each time a beat takes the lock."""
        return f"{self.prefix}:beat:fence"

    @property
    def wake(self) -> str:
        """List: a finishing run pushes here; the active beat blocks on it between ticks."""
        return f"{self.prefix}:wake"

    @property
    def beat_info(self) -> str:
        """Hash: who the active beat is (token, host, pid, since), for operators."""
        return f"{self.prefix}:beat:info"

    @property
    def registry(self) -> str:
        """String (JSON): the lanes beat schedules, so status works without the app's code."""
        return f"{self.prefix}:registry"

    @property
    def paused(self) -> str:
        """Set: lanes an operator paused (never dispatched until resumed)."""
        return f"{self.prefix}:paused"

    @property
    def run_now(self) -> str:
        """Set: lanes an operator asked to run now (due at once; still through the lease)."""
        return f"{self.prefix}:run-now"

    @property
    def watchdog(self) -> str:
        """String (JSON): the starvation watchdog's posture and alarm latch."""
        return f"{self.prefix}:watchdog"

    @property
    def counters(self) -> str:
        """Hash: durable event counters (``deferrals|<reason>``, ``yields|<lane>``, ...)."""
        return f"{self.prefix}:counters"

    @property
    def journal(self) -> str:
        """List (JSON): run starts and ends with their fencing numbers, for the audit."""
        return f"{self.prefix}:journal"

    @property
    def dispatch_log(self) -> str:
        """List (JSON): every message beat sent (lane, task id, fence), for the audit."""
        return f"{self.prefix}:dispatch-log"

    @property
    def errors(self) -> str:
        """Hash: lane -> last scheduling error (due-check raised, malformed state)."""
        return f"{self.prefix}:errors"


def run_field(lane: str) -> str:
    return f"{lane}|run"


def sched_field(lane: str) -> str:
    return f"{lane}|sched"
