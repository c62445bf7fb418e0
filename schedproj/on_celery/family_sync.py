"""Beat keeps each lane family's stored members what its ``members`` hook returns."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from schedproj.core.families import LaneFamily
from schedproj.on_celery.due_checks import ErrorReporter
from schedproj.store.families import FamilyStore

logger = logging.getLogger("schedproj.beat")

#: A family found unchanged is still read in full at least this often (seconds): a writer of a
#: release from before the members' generation (a rolling deploy) changes them unbumped.
FULL_READ_EVERY_S = 600.0


@dataclass(frozen=True)
class Synced:
    """What a family's last sync left: the hook's answer, and the members' generation and
    count once it was made (the count: a writer that bumps no generation changes it too)."""

    wanted: frozenset[str]
    generation: int
    count: int
    at: float


class FamilySync:
    """Calls the families' ``members`` hooks, each at most every ``members_sync_s``, and makes
    the stored members what the hook returned. A hook that raises is recorded."""

    def __init__(self, families: dict[str, LaneFamily], store: FamilyStore,
                 reporter: ErrorReporter,
                 earn: Callable[[int], None] = lambda members: None) -> None:
        self.families = families
        #: Told how many members a hook returned before they are compared and written (beat's
        #: lock keeper: a million members outlast the lock).
        self.earn = earn
        self.store = store
        self.reporter = reporter
        #: When each family's hook last ran (0: never, so the first tick syncs it).
        self.last_sync = dict.fromkeys(families, 0.0)
        #: Each family's last sync, while nothing says its members changed since.
        self.synced: dict[str, Synced] = {}
        #: How many syncs read a family's members (the others found it unchanged).
        self.reads = 0

    def sync(self, now: float) -> None:
        for family, option in self.families.items():
            if now - self.last_sync[family] < option.members_sync_s:
                continue
            self.last_sync[family] = now
            self._sync(family, option, now)

    def _unchanged(self, family: str, wanted: frozenset[str], now: float) -> bool:
        """The hook answers what the last sync made the members, and they are as it left them
        (their generation and count): nothing to read or write."""
        last = self.synced.get(family)
        if last is None or last.wanted != wanted or now - last.at >= FULL_READ_EVERY_S:
            return False
        return self.store.generation_and_count(family) == (last.generation, last.count)

    def _sync(self, family: str, option: LaneFamily, now: float) -> None:
        members = option.members
        try:
            wanted = list(members() if members else ())
            self.earn(len(wanted))
            wanted_set = frozenset(wanted)
            if self._unchanged(family, wanted_set, now):
                self.reporter.resolved([family])
                return
            self.synced.pop(family, None)
            self.reads += 1
            added, removed, generation = self.store.sync_counted(family, wanted)
            if generation is not None:
                self.synced[family] = Synced(wanted_set, generation,
                                             self.store.count(family), now)
        except Exception as exc:
            message = f"members hook of family {family!r} raised {type(exc).__name__}: {exc}"
            self.reporter.report(family, message[:1000], exc_info=True, once=False)
            return
        self.reporter.resolved([family])
        if added or removed:
            logger.info("family %s: %d members added, %d removed (members hook)",
                        family, added, removed)


__all__ = ["FamilySync"]
