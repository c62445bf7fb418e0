"""Soft gates: deferral-only edges between producer and consumer lanes. Pure.

A gate never hard-blocks: it defers for this tick, is re-checked next tick (beat is woken the
moment the blocker finishes), and stops deferring once a streak exceeds ``max_defer_s``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace

from schedproj.core.deferrals import Deferral
from schedproj.core.lanes import Gate, GateCondition
from schedproj.core.views import LaneView


def family_views(views: Mapping[str, LaneView],
                 named: Collection[str] | None = None) -> dict[str, LaneView]:
    """One view per lane family with members in ``views``, as a gate naming the family sees
    it: due (and behind) while any member is due and behind, running while any member is
    due or in flight — so ``due-and-behind`` blocks while some member is due and behind, and
    ``due-or-running`` while some member is due or running. ``named``: only these families
    (those a gate names)."""
    out: dict[str, LaneView] = {}
    if named is not None and not named:
        return out
    for view in views.values():
        family = view.spec.family
        if family is None or (named is not None and family not in named):
            continue
        hot = view.due and view.behind
        busy = view.due or view.in_flight
        old = out.get(family)
        if old is None:
            out[family] = replace(view, spec=replace(view.spec, name=family), due=hot,
                                  backlog=1 if hot else 0, never_run=False, in_flight=busy)
        elif (hot and not old.due) or (busy and not old.in_flight):
            out[family] = replace(old, due=old.due or hot, backlog=1 if old.due or hot else 0,
                                  in_flight=old.in_flight or busy)
    return out


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
    deferred it but whose streak already lasted ``max_defer_s`` (so they let it go). The
    ``legacy`` (registry) policy reproduces the original, whose gates had no bound."""
    expired: list[Gate] = []
    for gate in lane.spec.gates:
        if legacy and not gate.in_legacy:
            continue
        if not blocks(gate, views.get(gate.blocker)):
            continue
        if (
            not legacy
            and gate.max_defer_s is not None
            and current is not None
            and (clock := current.gate_clock(gate.blocker)) is not None
            and now - clock >= gate.max_defer_s
        ):
            expired.append(gate)
            continue
        return gate, tuple(expired)
    return None, tuple(expired)
