"""Lane families: one Celery task, many keyed member lanes (one per tenant, repo, shard).

Declared once::

    @app.task(base=LaneTask, lane=LaneFamily(cadence_s=1800, kind=LaneKind.HEAVY, jitter=0.2))
    def repo_sync(key: str): ...

Each member is a lane of its own, named ``<family>[<key>]``, with its own state, ranked by the
same rules as any lane. Members come and go at runtime (``schedproj family add``). Pure.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from schedproj.core.errors import SchedprojError
from schedproj.core.frozen import evolve
from schedproj.core.lanes import Lane, LaneSpec, fixed_unit

#: A member key: 1 to :data:`KEY_MAX_LEN` characters out of letters, digits and ``._-:/@+=``.
KEY_PATTERN = re.compile(r"[A-Za-z0-9._:/@+=-]+")
KEY_MAX_LEN = 128
KEY_CHARS = "letters, digits and . _ - : / @ + ="
#: Beat calls a family's ``members`` hook at most this often by default (seconds).
MEMBERS_SYNC_S = 60.0


class FamilyError(SchedprojError):
    """A family or member key is unknown or malformed."""

    def __init__(self, thing: str, problem: str, fix: str) -> None:
        self.thing = thing
        self.problem = problem
        self.fix = fix
        super().__init__(f"{thing}: {problem}. Fix: {fix}")


#: A hook returning the member keys a family should have now (beat syncs to it).
MembersHook = Callable[[], Iterable[str]]


@dataclass(frozen=True, kw_only=True)
class LaneFamily(Lane):
    """The lane options of a family task. Every option of :class:`Lane` applies to each
    member; ``jitter`` (0 to 0.5) spreads members' due times deterministically per key;
    ``members`` is an optional hook beat calls every ``members_sync_s`` to sync the set."""

    #: Spreads the members' due times (0 to 0.5): a member falls due at a staleness ratio of
    #: ``1 ± jitter`` fixed by a hash of its key, while ranking uses the true ratio.
    jitter: float = 0.0
    #: A function returning the member keys the family should have; beat makes the stored set
    #: what it returns (None: members are added and removed by hand or API).
    members: MembersHook | None = field(default=None, compare=False)
    #: Beat calls ``members`` at most this often (seconds).
    members_sync_s: float = MEMBERS_SYNC_S

    def check(self, lane: str) -> None:
        super().check(lane)
        jitter = self.jitter
        if (isinstance(jitter, bool) or not isinstance(jitter, int | float)
                or not math.isfinite(jitter) or not 0 <= jitter <= 0.5):
            raise FamilyError(f"family {lane!r}", f"jitter must be between 0 and 0.5, got "
                              f"{jitter!r}", "pass jitter=0.2 for ±20 % (or leave it out)")
        if self.priority0:
            raise FamilyError(f"family {lane!r}", "priority0 is set on a family",
                              "priority-0 is for one data-safety lane; declare it as a Lane")
        if self.members is not None and not callable(self.members):
            raise FamilyError(f"family {lane!r}", "members is not callable",
                              "pass a function returning the member keys")
        if not (isinstance(self.members_sync_s, int | float) and self.members_sync_s > 0):
            raise FamilyError(f"family {lane!r}", f"members_sync_s must be > 0, got "
                              f"{self.members_sync_s!r}", "pass a number of seconds")


def member_lane(family: str, key: str) -> str:
    """The lane name of a member: ``family[key]``."""
    return f"{family}[{key}]"


def split_member(lane: str) -> tuple[str, str] | None:
    """(family, key) of a member lane name; None for a lane of its own."""
    if not lane.endswith("]"):
        return None
    family, sep, key = lane[:-1].partition("[")
    return (family, key) if sep and family and key else None


def check_key(family: str, key: object) -> str:
    """The key, if it is a valid member key; else a :class:`FamilyError` saying the fix."""
    if not isinstance(key, str) or not key:
        raise FamilyError(f"family {family!r}", f"member key {key!r} is empty or not text",
                          f"use 1 to {KEY_MAX_LEN} characters out of {KEY_CHARS}")
    if len(key) > KEY_MAX_LEN:
        raise FamilyError(f"family {family!r}", f"member key {key[:40]!r}… is {len(key)} "
                          f"characters long", f"use at most {KEY_MAX_LEN} characters (a hash "
                          "of a longer identifier, say)")
    if not KEY_PATTERN.fullmatch(key):
        bad = sorted({c for c in key if not KEY_PATTERN.fullmatch(c)})
        raise FamilyError(f"family {family!r}", f"member key {key!r} holds characters "
                          f"outside the allowed set: {''.join(bad)!r}",
                          f"use only {KEY_CHARS}")
    return key


def jitter_unit(family: str, key: str) -> float:
    """A fixed number in [0, 1) from the member's name: the same on every host and run."""
    return fixed_unit(member_lane(family, key))


def member_spec(family: LaneSpec, jitter: float, key: str) -> LaneSpec:
    """The lane spec of one member: the family's, named for the key, due at a staleness ratio
    of ``1 + jitter * (2u - 1)`` for the key's fixed ``u`` (ranking still uses the ratio).

    Beat builds one per due member (hundreds of thousands on the tick after a bulk add), so
    it is ``evolve``: ``replace`` re-ran ``LaneSpec.__init__`` and walked its 18 fields, about
    6 µs of the 7 a member cost. ``LaneSpec`` is plain, so the record is the same."""
    name = member_lane(family.name, key)
    due_ratio = 1.0 + jitter * (2.0 * fixed_unit(name) - 1.0)
    return evolve(family, name=name, family=family.name, due_ratio=due_ratio)


@dataclass(frozen=True)
class FamilyStats:
    """One family folded for status: how many members, due, deferred, running, worst ratio
    (and which member has it)."""

    family: str
    kind: str
    members: int
    due: int
    deferred: int
    running: int
    max_ratio: float
    worst: str | None


def fold(family: str, kind: str, members: int, lanes: Iterable[Any]) -> FamilyStats:
    """Fold the status rows (``core.health.LaneHealth``) of a family's members into one."""
    due = deferred = running = 0
    worst: str | None = None
    max_ratio = 0.0
    for h in lanes:
        running += bool(h.in_flight)
        deferred += bool(h.deferral_reason) and not h.in_flight
        due += bool(h.due) and not h.in_flight and not h.deferral_reason
        if worst is None or h.ratio > max_ratio:
            worst, max_ratio = h.name, h.ratio
    return FamilyStats(family=family, kind=kind, members=members, due=due, deferred=deferred,
                       running=running, max_ratio=max_ratio, worst=worst)


__all__ = [
    "KEY_CHARS",
    "KEY_MAX_LEN",
    "FamilyError",
    "FamilyStats",
    "LaneFamily",
    "check_key",
    "fold",
    "jitter_unit",
    "member_lane",
    "member_spec",
    "split_member",
]
