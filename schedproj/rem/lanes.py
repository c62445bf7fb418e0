"""The REM chain as real lanes (DESIGN.md sections 4 and 5): the reference lane set.

``SCHEDPROJ_LANE_MODULES=schedproj.rem.lanes``. Cadences are the original's; gates are ADR
0022's (backfill -> summary, new) and the original's (dream -> golden-path).
"""

from __future__ import annotations

import os
import socket
import time
from functools import cache
from pathlib import Path
from typing import Any

from celery import current_app, shared_task

from schedproj.core.lanes import (
    DeferralReason,
    DeploymentClass,
    DueAnswer,
    DueCheckStamp,
    Gate,
    GateCondition,
    Lane,
    LaneKind,
)
from schedproj.on_celery.runtime import runtime_for
from schedproj.on_celery.task import LaneTask
from schedproj.rem import work
from schedproj.rem.backup import snapshot
from schedproj.rem.settings import rem_settings
from schedproj.rem.store import MemoryStore
from schedproj.rem.store.keys import WRITE_STAMP_KEY
from schedproj.rem.summarizer import Summarizer, load_summarizer

MIN, HOUR = 60.0, 3600.0
#: The original's cadences (seconds), before SCHEDPROJ_CADENCE_SCALE.
CADENCES_S = {
    "backup": 24 * HOUR,
    "memory-summary-backfill": 10 * MIN,  # backlog-driven, ranked with the summary cadence
    "summary": 10 * MIN,
    "dream": HOUR,
    "golden-path": HOUR,
    "swarm-heartbeat": 20 * MIN,
}
LANE_NAMES = tuple(CADENCES_S)
#: A backfill run that makes no progress backs off this long (before scaling).
BACKFILL_BACKOFF_S = 10 * MIN
#: The backfill -> summary gate lets summary go after deferring it this long (before scaling),
#: so a backfill that can never drain cannot hold the chain.
SUMMARY_GATE_MAX_DEFER_S = 30 * MIN
#: The dream -> golden-path gate lets golden-path go after deferring it this long (before
#: scaling), so a dream that stays due (or runs on and on) delays the scoring pass, never
#: starves it. Two golden-path cadences: past the default starvation threshold (1 h), so the
#: watchdog raises its alarm before the bound lets golden-path go.
GOLDEN_PATH_GATE_MAX_DEFER_S = 2 * HOUR


def rem_store(app: Any) -> MemoryStore:
    rt = runtime_for(app)
    return MemoryStore(rt.store.client, rt.keys.prefix, rem_settings().window_words)


@cache
def _summarizer(spec: str | None, latency_s: float) -> Summarizer:
    return load_summarizer(spec, latency_s)


def summarizer_for(app: Any) -> Summarizer:
    s = rem_settings()
    return _summarizer(s.summarizer, s.summarizer_latency_s)


def current_store() -> MemoryStore:
    """The store of the current app (beat's, in a beat process). Its runtime is keyed by the
    app itself: ``current_app`` is one proxy whatever app is current, so keying by it gave
    every later app the first one's prefix."""
    return rem_store(current_app._get_current_object())


# -- due checks: cheap reads beat makes when the store was written ----------------------------
#: Every REM due check reads only the memory store, and every write to it sets this stamp
#: (``MemoryStore``): beat calls them again only when it moved, a run started or ended, or
#: the answer is a minute old (a write that skips the stamp: a worker of a release before
#: it, a hand edit), not every tick (issue 23: the idle tick's round trips).
REM_STAMP = DueCheckStamp(WRITE_STAMP_KEY, max_age_s=MIN)


def backfill_pending() -> DueAnswer:
    store = current_store()
    until = store.backfill_backoff_until()
    if until is not None and until > time.time():
        # Backing off after a run that made no progress: none until then, written or not.
        return DueAnswer(0, until=until)
    return DueAnswer(store.backfill_backlog())


def summary_pending() -> int:
    return len(current_store().unsummarized())


def dream_pending() -> int:
    return current_store().undigested_count()


def golden_path_pending() -> int:
    store = current_store()
    return int(store.golden_path_version() != store.graph_version())


# -- the lanes ----------------------------------------------------------------------------------
@shared_task(base=LaneTask, bind=True, name="schedproj.rem.backup", lane=Lane(
    name="backup", cadence_s=CADENCES_S["backup"], kind=LaneKind.HEAVY, priority0=True,
    order=0, retry_after_failure_s=15 * MIN, retry_window_s=HOUR))
def backup(self: LaneTask) -> str:
    s = rem_settings()
    path = snapshot(rem_store(self.app), Path(s.backup_dir), fence=self.fence,
                    keep=s.backup_keep)
    return str(path)


@shared_task(base=LaneTask, bind=True, name="schedproj.rem.summary", lane=Lane(
    name="summary", cadence_s=CADENCES_S["summary"], kind=LaneKind.HEAVY, order=10,
    due_check=summary_pending, due_check_stamp=REM_STAMP,
    gates=(Gate("memory-summary-backfill", GateCondition.DUE_AND_BEHIND,
                DeferralReason.DEPENDENCY, max_defer_s=SUMMARY_GATE_MAX_DEFER_S),)))
def summary(self: LaneTask) -> dict[str, int]:
    progress = work.summarize(rem_store(self.app), summarizer_for(self.app),
                              batch=rem_settings().batch,
                              fence=self.fence, should_yield=self.should_yield)
    self.report_backlog(progress.backlog)
    return {"done": progress.done, "skipped": progress.skipped, "backlog": progress.backlog}


@shared_task(base=LaneTask, bind=True, name="schedproj.rem.dream", lane=Lane(
    name="dream", cadence_s=CADENCES_S["dream"], kind=LaneKind.HEAVY, order=20,
    due_check=dream_pending, due_check_stamp=REM_STAMP))
def dream(self: LaneTask) -> dict[str, int]:
    progress = work.dream(rem_store(self.app), batch=rem_settings().batch, fence=self.fence,
                          should_yield=self.should_yield)
    self.report_backlog(progress.backlog)
    return {"done": progress.done, "backlog": progress.backlog}


@shared_task(base=LaneTask, bind=True, name="schedproj.rem.memory_summary_backfill", lane=Lane(
    name="memory-summary-backfill", cadence_s=CADENCES_S["memory-summary-backfill"],
    kind=LaneKind.HEAVY, order=30, backlog_driven=True, due_check=backfill_pending,
    due_check_stamp=REM_STAMP))
def memory_summary_backfill(self: LaneTask) -> dict[str, int]:
    progress = work.backfill(rem_store(self.app), summarizer_for(self.app),
                             batch=rem_settings().batch, fence=self.fence,
                             should_yield=self.should_yield)
    if progress.done == 0 and progress.backlog > 0:
        backoff_s = BACKFILL_BACKOFF_S * runtime_for(self.app).settings.cadence_scale
        rem_store(self.app).put_backfill_backoff(time.time() + backoff_s)
    self.report_backlog(progress.backlog)
    return {"done": progress.done, "backlog": progress.backlog}


@shared_task(base=LaneTask, bind=True, name="schedproj.rem.golden_path", lane=Lane(
    name="golden-path", cadence_s=CADENCES_S["golden-path"], kind=LaneKind.LIGHT, order=40,
    due_check=golden_path_pending, due_check_stamp=REM_STAMP,
    gates=(Gate("dream", GateCondition.DUE_OR_RUNNING, DeferralReason.GOLDEN_PATH_DEPENDENCY,
                max_defer_s=GOLDEN_PATH_GATE_MAX_DEFER_S, in_legacy=True),)))
def golden_path(self: LaneTask) -> int:
    return len(work.golden_path(rem_store(self.app)))


@shared_task(base=LaneTask, bind=True, name="schedproj.rem.swarm_heartbeat", lane=Lane(
    name="swarm-heartbeat", cadence_s=CADENCES_S["swarm-heartbeat"], kind=LaneKind.LIGHT,
    deployment=DeploymentClass.LOCAL_ONLY, order=50))
def swarm_heartbeat(self: LaneTask) -> None:
    work.heartbeat(rem_store(self.app), host=socket.gethostname(), pid=os.getpid())
