"""One exception hierarchy for the project.

Every message says what was wrong and how to fix it, naming the lane or setting involved.
"""

from __future__ import annotations


class SchedprojError(Exception):
    """Base class of every error schedproj raises on purpose."""


class ConfigurationError(SchedprojError):
    """A setting is missing, malformed or inconsistent with another setting."""


class LaneDeclarationError(ConfigurationError):
    """A lane's declaration is invalid (bad cadence, unknown gate target, cycle, ...)."""

    def __init__(self, lane: str, problem: str, fix: str) -> None:
        self.lane = lane
        self.problem = problem
        self.fix = fix
        super().__init__(f"lane {lane!r}: {problem}. Fix: {fix}")


class StateError(SchedprojError):
    """A value stored in Redis is malformed or written by an unknown format version."""

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        self.problem = problem
        super().__init__(
            f"state at Redis key {key!r}: {problem}. It was left untouched; inspect it and "
            f"delete it (or run a matching schedproj version) to let the lane be scheduled again"
        )


class LeaseLost(SchedprojError):
    """The heavy lease this run held is no longer ours (expired, taken over, or forged)."""


class BeatLockLost(SchedprojError):
    """This beat no longer holds the single-active-beat lock and must stop dispatching."""


class BeatLockVanished(BeatLockLost):
    """The beat lock vanished during a tick, no other beat holding it (Redis lost its state,
    or the lock expired): the tick stops, but this beat stays the one that was active and
    keeps what it remembers, so its next tick takes the lock back as current and puts back
    what a state loss took."""
