"""Beat keeps each lane family's stored members what its ``members`` hook returns."""

from __future__ import annotations

import logging

from schedproj.core.families import LaneFamily
from schedproj.on_celery.due_checks import ErrorReporter
from schedproj.store.families import FamilyStore

logger = logging.getLogger("schedproj.beat")


class FamilySync:
    """Calls the families' ``members`` hooks, each at most every ``members_sync_s``, and makes
    the stored members what the hook returned. A hook that raises is recorded."""

    def __init__(self, families: dict[str, LaneFamily], store: FamilyStore,
                 reporter: ErrorReporter) -> None:
        self.families = families
        self.store = store
        self.reporter = reporter
        #: When each family's hook last ran (0: never, so the first tick syncs it).
        self.last_sync = dict.fromkeys(families, 0.0)

    def sync(self, now: float) -> None:
        for family, option in self.families.items():
            if now - self.last_sync[family] < option.members_sync_s:
                continue
            self.last_sync[family] = now
            self._sync(family, option)

    def _sync(self, family: str, option: LaneFamily) -> None:
        members = option.members
        try:
            added, removed = self.store.sync(family, list(members() if members else ()))
        except Exception as exc:
            message = f"members hook of family {family!r} raised {type(exc).__name__}: {exc}"
            self.reporter.report(family, message[:1000], exc_info=True, once=False)
            return
        self.reporter.resolved([family])
        if added or removed:
            logger.info("family %s: %d members added, %d removed (members hook)",
                        family, added, removed)


__all__ = ["FamilySync"]
