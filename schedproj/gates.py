"""Soft gates: deferral-only edges between producer and consumer lanes. Pure.

A gate never hard-blocks: it defers for this tick, is re-checked next tick (beat is woken the
moment the blocker finishes), and stops deferring once a streak exceeds ``max_defer_s``.
"""

from __future__ import annotations

from collections.abc import Mapping

from schedproj.lanes import Gate, GateCondition
from schedproj.state import Deferral
from schedproj.views import LaneView


def blocks(gate: Gate, blocker: LaneView | None) -> bool:
    """Does ``blocker`` currently meet the gate's condition? A disabled blocker never blocks."""
    if blocker is None:
        return False
    if gate.when is GateCondition.DUE_AND_BEHIND:
        return blocker.due and blocker.behind
    return blocker.due or blocker.in_flight


def evaluate(
    lane: LaneView,
    views: Mapping[str, LaneView],
    current: Deferral | None,
    now: float,
    legacy: bool = False,
) -> tuple[Gate | None, tuple[Gate, ...]]:
    """Return the first gate that defers ``lane`` now (or None) and the gates that would have
    deferred it but whose streak already lasted ``max_defer_s`` (so they let it go)."""
    expired: list[Gate] = []
    for gate in lane.spec.gates:
        if legacy and not gate.in_legacy:
            continue
        if not blocks(gate, views.get(gate.blocker)):
            continue
        if (
            gate.max_defer_s is not None
            and current is not None
            and (clock := current.gate_clock(gate.blocker)) is not None
            and now - clock >= gate.max_defer_s
        ):
            expired.append(gate)
            continue
        return gate, tuple(expired)
    return None, tuple(expired)
