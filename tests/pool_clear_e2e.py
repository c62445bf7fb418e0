"""Lanes for ``schedproj clear-lease --pool --slot`` against real workers
(tests/e2e/test_clear_lease_live.py): a long run in a pool ``gpu`` (declared by
``SCHEDPROJ_POOLS=gpu=2`` in the processes' environment) that checks ``should_yield()`` between
its half-second steps, so an operator's ``--stop`` ends it at a checkpoint."""

from __future__ import annotations

import json
import os
import time

from celery import shared_task

from schedproj import Lane, LaneKind, LaneTask
from schedproj.store.connection import connect

PREFIX = os.environ.get("SCHEDPROJ_KEY_PREFIX", "schedproj")
LANE = "e2e.pool-long"
STEP_S = 0.5


@shared_task(base=LaneTask, bind=True, name=LANE,
             lane=Lane(cadence_s=1, kind=LaneKind.HEAVY, pool="gpu"))
def pool_long(self: LaneTask) -> None:
    client = connect(os.environ["SCHEDPROJ_REDIS_URL"])
    start = time.time()
    client.rpush(f"{PREFIX}:e2e:started", json.dumps({"lane": LANE, "start": start,
                                                      "fence": self.fence, "pid": os.getpid()}))
    steps = int(os.environ.get("E2E_CLEAR_STEPS", "400"))
    done = 0
    while done < steps and not self.should_yield():
        time.sleep(STEP_S)
        done += 1
    self.report_backlog(steps - done)
    client.rpush(f"{PREFIX}:e2e:runs", json.dumps({"lane": LANE, "start": start,
                                                   "end": time.time(), "fence": self.fence}))
