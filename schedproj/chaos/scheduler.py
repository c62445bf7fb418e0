"""The chaos run's beat: :class:`FairScheduler` with the beat-freeze fault in its dispatch seam.

The fault - a beat that stalls between recording a dispatch and sending it, as a SIGSTOP or a
long GC pause would - lives here, in the fault run, not in the production settings: the chaos
run starts that beat with ``-S schedproj.chaos.scheduler:FreezingScheduler`` and the stall's
length in :data:`FREEZE_ENV`.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from schedproj.core.planner import Plan
from schedproj.on_celery.beat import FairScheduler, stall_before_send
from schedproj.settings import Settings

#: Seconds the frozen beat stalls before each send (unset or 0: it does not stall). Not a
#: ``SCHEDPROJ_`` variable: no production process reads it.
FREEZE_ENV = "CHAOS_FREEZE_BEFORE_SEND_S"
#: The ``-S`` argument that starts a beat with the fault.
FREEZING_SCHEDULER = "schedproj.chaos.scheduler:FreezingScheduler"


def freeze_s(environ: dict[str, str] | os._Environ[str] = os.environ) -> float:
    """The stall :data:`FREEZE_ENV` asks for; a value that is no positive number is none."""
    try:
        seconds = float(environ.get(FREEZE_ENV, "") or 0.0)
    except ValueError:
        return 0.0
    return seconds if seconds > 0 else 0.0


class FreezingScheduler(FairScheduler):
    """Stalls between recording a dispatch and sending it, for :func:`freeze_s` seconds."""

    def dispatch_seams(self, settings: Settings) -> dict[str, Callable[[Plan], None]]:
        seconds = freeze_s()
        return {"before_send": stall_before_send(seconds)} if seconds else {}


__all__ = ["FREEZE_ENV", "FREEZING_SCHEDULER", "FreezingScheduler", "freeze_s"]
