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
    def errors(self) -> str:
        """Hash: lane -> last scheduling error (due-check raised, malformed state)."""
        return f"{self.prefix}:errors"


def run_field(lane: str) -> str:
    return f"{lane}|run"


def sched_field(lane: str) -> str:
    return f"{lane}|sched"
