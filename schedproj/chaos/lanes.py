"""Lanes for the chaos run: heavy lanes whose every step is a fenced write, a light pulse."""

from __future__ import annotations

import os
import time
from functools import cache

from celery import shared_task

from schedproj.audit import FencedLedger
from schedproj.errors import LeaseLost
from schedproj.lanes import Lane, LaneKind
from schedproj.redis_conn import connect
from schedproj.task import LaneTask

#: Work per heavy run: steps of this many seconds, checking should_yield() between them.
STEP_S = 0.15
STEPS = 12


@cache
def ledger(pid: int) -> FencedLedger:
    """Per process (after fork): the ledger lives on the audit Redis, which chaos never kills."""
    url = os.environ.get("SCHEDPROJ_AUDIT_REDIS_URL") or os.environ["SCHEDPROJ_REDIS_URL"]
    return FencedLedger(connect(url), os.environ.get("SCHEDPROJ_KEY_PREFIX", "chaos"))


def work(task: LaneTask, lane: str) -> int:
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
    time.sleep(0.01)
