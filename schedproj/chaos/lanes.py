"""Lanes for the chaos run: heavy lanes whose every step is a fenced write, a light pulse.

Besides the journal, execution is observed directly: every heavy run holds one OS-level
exclusive lock (``fcntl.flock`` on a file shared by all heavy lanes) for its whole body, and
each light lane one of its own. Failing to take it means another run is executing right now:
an overlap, recorded on the audit Redis with who held the lock. The lanes of the pool
:data:`~schedproj.chaos.audit.POOL` (two slots, a weighted lane and a lane of two slots among
them) take as many of the pool's slot files as the slots they hold: a run that cannot is
beyond the pool's slots, recorded likewise; each step is written to the fenced ledger of every
slot it holds.

Beside the lanes, the app's own ``beat_schedule`` (:data:`~schedproj.chaos.audit.ENTRY_INTERVALS`
and a crontab every minute): ordinary tasks, journaled twice on the audit Redis — by beat
when it has published one (with the due time and count it claimed, read back from the
entry's state), and by the worker that runs it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from datetime import timedelta
from functools import cache
from pathlib import Path
from typing import IO, Any

import redis
from celery import current_app, shared_task
from celery.schedules import crontab
from celery.signals import after_task_publish, before_task_publish

from schedproj.chaos.audit import (
    ENTRY_INTERVALS,
    ENTRY_MINUTELY,
    ENTRY_TASK,
    FAMILY,
    FAMILY_CADENCE_S,
    FAMILY_JITTER,
    FAMILY_MEMBERS_ENV,
    LOCK_DIR_ENV,
    POOL,
    POOL_SLOTS,
    FencedLedger,
    entry_runs_key,
    entry_sends_key,
    family_members,
    overlaps_key,
    slot_ledger_prefix,
)
from schedproj.core.entries import EntryState
from schedproj.core.errors import LeaseLost, StateError
from schedproj.core.families import LaneFamily
from schedproj.core.lanes import Lane, LaneKind
from schedproj.on_celery.run_context import current
from schedproj.on_celery.task import LaneTask
from schedproj.store.connection import connect
from schedproj.store.protocol import Keys

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


# -- the pool ``gpu`` of two slots (SCHEDPROJ_POOLS, set by the fleet) ------------------------

@cache
def slot_ledger(pid: int, pool: str, slot: int) -> FencedLedger:
    """Per process and slot: each slot of a pool has its fenced ledger on the audit Redis."""
    return FencedLedger(ledger(pid).client, slot_ledger_prefix(_prefix(), pool, slot))


@contextlib.contextmanager
def holding_slot_files(task: LaneTask, lane: str, pool: str, need: int) -> Iterator[None]:
    """Take ``need`` of the pool's :data:`POOL_SLOTS` slot files (``<pool>-<i>.lock``), each
    exclusively without waiting, for the whole body: a run that cannot take them all runs
    beside more runs than the pool has slots, an overlap recorded with the files' holders."""
    where = os.environ.get(LOCK_DIR_ENV)
    if not where:
        yield
        return
    me = {"pid": os.getpid(), "lane": lane, "fence": task.fence, "pool": pool,
          "task": str(getattr(task.request, "id", "")), "t": time.time()}
    held: list[IO[str]] = []
    holders: list[Any] = []
    try:
        for index in range(POOL_SLOTS[pool]):
            if len(held) == need:
                break
            handle = (Path(where) / f"{pool}-{index}.lock").open("a+")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read()
                holders.append(json.loads(holder) if holder else None)
                handle.close()
                continue
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps(me))
            handle.flush()
            held.append(handle)
        if len(held) < need:
            ledger(os.getpid()).client.rpush(overlaps_key(_prefix()), json.dumps(
                {**me, "holder": holders[0] if holders else None, "holders": holders}))
        yield
    finally:
        for taken in held:
            fcntl.flock(taken, fcntl.LOCK_UN)
            taken.close()


def pool_work(task: LaneTask, lane: str, pool: str, need: int) -> int:
    """A pool run: the heavy lanes' steps, each written to the ledger of every slot it holds."""
    ctx = current.get()
    slots = ctx.slots.slots if ctx is not None and ctx.slots is not None else ()
    done = 0
    with holding_slot_files(task, lane, pool, need):
        for step in range(STEPS):
            if task.should_yield():
                task.report_backlog(STEPS - step)
                break
            time.sleep(STEP_S)
            entry = {"lane": lane, "fence": task.fence, "step": step, "t": time.time()}
            for index in slots:
                if not slot_ledger(os.getpid(), pool, index).append(task.fence, entry):
                    raise LeaseLost(f"{lane}: write refused on slot {index} of {pool}, fence "
                                    f"{task.fence} is no longer newest")
            done += 1
    return done


@shared_task(base=LaneTask, bind=True, name="chaos.g1",
             lane=Lane(cadence_s=3, kind=LaneKind.HEAVY, pool=POOL, order=6))
def g1(self: LaneTask) -> int:
    return pool_work(self, "chaos.g1", POOL, 1)


@shared_task(base=LaneTask, bind=True, name="chaos.g2",
             lane=Lane(cadence_s=3, kind=LaneKind.HEAVY, pool=POOL, weight=2, order=7))
def g2(self: LaneTask) -> int:
    """The weighted lane: its staleness ratio counts twice in the pool's ranking."""
    return pool_work(self, "chaos.g2", POOL, 1)


@shared_task(base=LaneTask, bind=True, name="chaos.g3",
             lane=Lane(cadence_s=6, kind=LaneKind.HEAVY, pool=POOL, slots=2, order=8))
def g3(self: LaneTask) -> int:
    """The lane of two slots: both of the pool's at once."""
    return pool_work(self, "chaos.g3", POOL, 2)


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


# -- the app's own beat_schedule ----------------------------------------------------------------

def _prefix() -> str:
    return os.environ.get("SCHEDPROJ_KEY_PREFIX", "chaos")


@shared_task(bind=True, name=ENTRY_TASK)
def entry(self: Any, name: str) -> None:
    """An ordinary task (no LaneTask): says which message of which entry ran, and when."""
    ledger(os.getpid()).client.rpush(entry_runs_key(_prefix()), json.dumps(
        {"entry": name, "task": str(self.request.id), "t": time.time()}))


@cache
def state_client(pid: int) -> redis.Redis:
    """Per process: the state Redis, asked once, briefly (it may be restarting)."""
    return connect(os.environ["SCHEDPROJ_REDIS_URL"], socket_timeout_s=1.0, retry=False)


#: Entry messages being published in this process (task id -> when the publish began).
_publishing: dict[str, float] = {}


@before_task_publish.connect
def _entry_publishing(sender: str | None = None, headers: dict[str, Any] | None = None,
                      **_: Any) -> None:
    if sender == ENTRY_TASK and headers:
        _publishing[str(headers["id"])] = time.time()


@after_task_publish.connect
def _journal_entry_sent(sender: str | None = None, headers: dict[str, Any] | None = None,
                        body: Any = None, **_: Any) -> None:
    """In beat, once an entry's message is published: journal it with when its publish
    began, the due time and the count its claim set (the entry's state, read back at once;
    unknown when Redis cannot say)."""
    if sender != ENTRY_TASK or not headers:
        return
    name = str(body[0][0])
    began = _publishing.pop(str(headers["id"]), None)
    at, count = None, None
    try:
        raw = state_client(os.getpid()).hget(Keys(_prefix()).entries, name)
        if raw is not None:
            state = EntryState.decode(str(raw), name)
            at, count = state.last_run_at, state.total_run_count
    except (redis.RedisError, StateError):
        pass
    # The audit Redis is never harmed; a record lost anyway shows as an unlogged run.
    with contextlib.suppress(redis.RedisError):
        ledger(os.getpid()).client.rpush(entry_sends_key(_prefix()), json.dumps(
            {"entry": name, "task": str(headers["id"]), "t": time.time(), "began": began,
             "at": at, "count": count, "pid": os.getpid()}))


def beat_schedule() -> dict[str, dict[str, Any]]:
    """The entries: a number, a timedelta and a crontab, each sending its own name."""
    every_2s, every_3s = ENTRY_INTERVALS
    return {
        every_2s: {"task": ENTRY_TASK, "schedule": ENTRY_INTERVALS[every_2s],
                   "args": (every_2s,)},
        every_3s: {"task": ENTRY_TASK,
                   "schedule": timedelta(seconds=ENTRY_INTERVALS[every_3s]),
                   "args": (every_3s,)},
        ENTRY_MINUTELY: {"task": ENTRY_TASK, "schedule": crontab(minute="*"),
                         "args": (ENTRY_MINUTELY,)},
    }


# The chaos fleet runs schedproj's own app (``-A schedproj.app``), which imports this module as
# its lane module: it has no module of its own to write a beat_schedule in, so this one does.
current_app.conf.beat_schedule = {**(current_app.conf.beat_schedule or {}), **beat_schedule()}
