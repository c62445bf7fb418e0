"""A small lane set to try schedproj with: ``schedproj up --lanes schedproj.devtools.examples``.

* ``example.ingest`` (light, 5 s) adds work items to a backlog kept in Redis;
* ``example.compact`` (heavy, backlog-driven, 20 s) drains the backlog in batches, yields at
  the hold cap and reports what it left;
* ``example.backup`` (heavy, priority-0, 60 s) always wins the lease when due;
* ``example.heartbeat`` (light, 3 s) never waits behind heavy work.
"""

from __future__ import annotations

import time

import redis
from celery import current_app, shared_task

from schedproj.core.lanes import Lane, LaneKind
from schedproj.on_celery.runtime import runtime_for
from schedproj.on_celery.task import LaneTask


def _backlog_key(task: LaneTask | None = None) -> str:
    app = task.app if task is not None else current_app
    return f"{runtime_for(app).keys.prefix}:example:backlog"


def _client(task: LaneTask | None = None) -> redis.Redis:
    app = task.app if task is not None else current_app
    return runtime_for(app).store.client


def pending_items() -> int:
    """The due-check hook beat calls each tick: a cheap read of the backlog size."""
    return int(_client().get(_backlog_key()) or 0)


@shared_task(base=LaneTask, bind=True, name="example.ingest",
             lane=Lane(cadence_s=5, kind=LaneKind.LIGHT, order=30))
def ingest(self: LaneTask) -> int:
    return int(_client(self).incrby(_backlog_key(self), 25))


@shared_task(base=LaneTask, bind=True, name="example.compact",
             lane=Lane(cadence_s=20, kind=LaneKind.HEAVY, order=20, backlog_driven=True,
                       due_check=pending_items))
def compact(self: LaneTask) -> int:
    done = 0
    left = int(_client(self).get(_backlog_key(self)) or 0)
    while left > 0 and not self.should_yield():
        time.sleep(0.1)  # one batch of work
        left = int(_client(self).decr(_backlog_key(self)))
        done += 1
    self.report_backlog(max(0, left))
    return done


@shared_task(base=LaneTask, bind=True, name="example.backup",
             lane=Lane(cadence_s=60, kind=LaneKind.HEAVY, priority0=True, order=10))
def backup(self: LaneTask) -> None:
    time.sleep(1.0)


@shared_task(base=LaneTask, bind=True, name="example.heartbeat",
             lane=Lane(cadence_s=3, kind=LaneKind.LIGHT, order=40))
def heartbeat(self: LaneTask) -> float:
    return time.time()
