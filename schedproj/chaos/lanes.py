"""Lanes for the chaos run: heavy lanes whose every step is a fenced write, a light pulse.

Besides the journal, execution is observed directly: every heavy run holds one OS-level
exclusive lock (``fcntl.flock`` on a file shared by all heavy lanes) for its whole body, and
each light lane one of its own. Failing to take it means another run is executing right now:
an overlap, recorded on the audit Redis with who held the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from celery import shared_task

from schedproj.chaos.audit import (
    FAMILY,
    FAMILY_CADENCE_S,
    FAMILY_JITTER,
    FAMILY_MEMBERS_ENV,
    LOCK_DIR_ENV,
    FencedLedger,
    family_members,
    overlaps_key,
)
from schedproj.core.errors import LeaseLost
from schedproj.core.families import LaneFamily
from schedproj.core.lanes import Lane, LaneKind
from schedproj.on_celery.task import LaneTask
from schedproj.store.connection import connect

#: Work per heavy run: steps of this many seconds, checking should_yield() between them.
STEP_S = 0.15
STEPS = 12


@cache
def ledger(pid: int) -> FencedLedger:
    """Per process (after fork): the ledger lives on the audit Redis, which chaos never kills."""
    url = os.environ.get("SCHEDPROJ_AUDIT_REDIS_URL") or os.environ["SCHEDPROJ_REDIS_URL"]
    return FencedLedger(connect(url), os.environ.get("SCHEDPROJ_KEY_PREFIX", "chaos"))


@contextlib.contextmanager
def executing(task: LaneTask, lock_name: str, lane: str) -> Iterator[None]:
    """Hold the execution lock ``lock_name`` while the body runs; record an overlap if another
    process holds it."""
    where = os.environ.get(LOCK_DIR_ENV)
    if not where:
        yield
        return
    path = Path(where) / f"{lock_name}.lock"
    me = {"pid": os.getpid(), "lane": lane, "fence": task.fence,
          "task": str(getattr(task.request, "id", "")), "t": time.time()}
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read()
            ledger(os.getpid()).client.rpush(
                overlaps_key(os.environ.get("SCHEDPROJ_KEY_PREFIX", "chaos")),
                json.dumps({**me, "holder": json.loads(holder) if holder else None}))
            yield
            return
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(me))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def work(task: LaneTask, lane: str) -> int:
    with executing(task, "heavy", lane):
        return _steps(task, lane)


def _steps(task: LaneTask, lane: str) -> int:
    done = 0
    for step in range(STEPS):
        if task.should_yield():
            task.report_backlog(STEPS - step)
            break
        time.sleep(STEP_S)
        if not ledger(os.getpid()).append(task.fence, {"lane": lane, "fence": task.fence,
                                                       "step": step, "t": time.time()}):
            raise LeaseLost(f"{lane}: write refused, fence {task.fence} is no longer newest")
        done += 1
    return done


@shared_task(base=LaneTask, bind=True, name="chaos.h1",
             lane=Lane(cadence_s=2, kind=LaneKind.HEAVY, order=1))
def h1(self: LaneTask) -> int:
    return work(self, "chaos.h1")


@shared_task(base=LaneTask, bind=True, name="chaos.h2",
             lane=Lane(cadence_s=3, kind=LaneKind.HEAVY, order=2))
def h2(self: LaneTask) -> int:
    return work(self, "chaos.h2")


@shared_task(base=LaneTask, bind=True, name="chaos.h3",
             lane=Lane(cadence_s=4, kind=LaneKind.HEAVY, order=3))
def h3(self: LaneTask) -> int:
    return work(self, "chaos.h3")


@shared_task(base=LaneTask, bind=True, name="chaos.pulse",
             lane=Lane(cadence_s=1, kind=LaneKind.LIGHT, order=4))
def pulse(self: LaneTask) -> None:
    with executing(self, "light-chaos.pulse", "chaos.pulse"):
        time.sleep(0.3)



def tenants() -> list[str]:
    """The members hook: beat calls it every few seconds, so after Redis lost state (and the
    member set with it) the family comes back by itself, as a user's hook would bring it."""
    return family_members(int(os.environ.get(FAMILY_MEMBERS_ENV, "0") or 0))


@shared_task(base=LaneTask, bind=True, name=FAMILY,
             lane=LaneFamily(cadence_s=FAMILY_CADENCE_S, kind=LaneKind.LIGHT, jitter=FAMILY_JITTER,
                             order=5, members=tenants, members_sync_s=2))
def tenant(self: LaneTask, key: str) -> None:
    """A light member: each holds its own execution lock (two runs of one member at once is a
    light duplicate seen by the OS)."""
    lane = self.lane_name
    with executing(self, f"light-{lane}", lane):
        time.sleep(0.05)
