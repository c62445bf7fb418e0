"""What beat's tick needs from the declared lane set, worked out once at start-up."""

from __future__ import annotations

from collections.abc import Collection

from schedproj.core.families import LaneFamily
from schedproj.core.lanes import DueCheck, DueCheckStamp, LaneSpec
from schedproj.core.laneset import LaneSet


class TickLanes:
    """The lanes read every tick (gate blockers, lanes with a due-check hook, unreadable
    ones), the hooks, the families with a ``members`` hook, and each lane's spec (family
    members resolved once and kept while they are due)."""

    def __init__(self, lanes: LaneSet) -> None:
        self.lanes = lanes
        blockers = {g.blocker for spec in (*lanes.specs, *lanes.families.values())
                    for g in spec.gates}
        self.hooks: list[tuple[str, DueCheck]] = [
            (spec.name, hook) for spec in lanes.specs
            if (hook := lanes.options[spec.name].due_check) is not None]
        #: The hooks declared with a stamp (:class:`DueCheckStamp`): called when it moves.
        self.stamps: dict[str, DueCheckStamp] = {
            name: stamp for name, _ in self.hooks
            if (stamp := lanes.options[name].due_check_stamp) is not None}
        self.always = sorted({b for b in blockers if b not in lanes.families}
                             | {name for name, _ in self.hooks})
        #: Members of families a gate names are never skipped (the gate needs their views).
        self.gating_families = frozenset(b for b in blockers if b in lanes.families)
        self.synced_families = {name: opt for name, opt in lanes.options.items()
                                if isinstance(opt, LaneFamily) and opt.members is not None}
        self.specs: dict[str, LaneSpec] = {}
        #: Lanes whose stored records are unreadable: re-read every tick until readable.
        self.broken: set[str] = set()

    def reread(self) -> list[str]:
        """The lanes read every tick: gate blockers, due-check lanes, unreadable ones (beat
        leaves out those resting: ``FairScheduler._snapshot``)."""
        return [*self.always, *sorted(self.broken - set(self.always))]

    def spec(self, lane: str) -> LaneSpec | None:
        """The lane's spec, or None for a lane the lane set does not know (any more)."""
        spec = self.specs.get(lane)
        if spec is None:
            # One lookup: ``knows`` then ``spec`` built a member's spec twice (the first tick
            # after a bulk add resolves every member).
            spec = self.lanes.find(lane)
            if spec is not None:
                self.specs[lane] = spec
        return spec

    def keep_only(self, due: Collection[str]) -> None:
        """Member specs are kept while their lanes are due; drop those that no longer are."""
        if len(self.specs) > 2 * len(due) + 1000:
            self.specs = {lane: self.specs[lane] for lane in due if lane in self.specs}


__all__ = ["TickLanes"]
