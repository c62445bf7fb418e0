"""Lanes for the end-to-end test of pools (tests/e2e/test_pools_live.py): a pool ``gpu`` of
two slots (declared by ``SCHEDPROJ_POOLS=gpu=2`` in the processes' environment) beside the
default pool ``heavy``, with cadences of a second.

Each run proves its exclusion with OS-level locks: a ``gpu`` run takes one of the two slot
files (``fcntl.flock`` ``LOCK_EX | LOCK_NB``; the two-slot lane takes both), a default-pool run
the one ``heavy`` file. A run that cannot take the files it needs records an overlap. Every
run appends (lane, pool, start, end, fence, files, overlap) to a Redis list that outlives the
worker; start and end are taken while the files are held.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import redis
from celery import shared_task

from schedproj import Lane, LaneKind, LaneTask
from schedproj.store.connection import connect

PREFIX = os.environ.get("SCHEDPROJ_KEY_PREFIX", "schedproj")
LOCK_DIR = Path(os.environ.get("E2E_LOCK_DIR", "/tmp"))
#: The slot files of each pool: as many as the pool has slots.
SLOT_FILES = {"gpu": ["gpu-0.lock", "gpu-1.lock"], "heavy": ["heavy-0.lock"]}
_client: redis.Redis | None = None


def runs_key() -> str:
    return f"{PREFIX}:e2e:pool-runs"


def client() -> redis.Redis:
    global _client
    if _client is None:
        _client = connect(os.environ["SCHEDPROJ_REDIS_URL"])
    return _client


@contextlib.contextmanager
def slot_files(pool: str, need: int) -> Iterator[list[str]]:
    """Take ``need`` of the pool's slot files, each exclusively and without waiting; yields
    the files taken (fewer than ``need``: the run overlapped runs holding the others)."""
    held: list[tuple[str, IO[bytes]]] = []
    try:
        for name in SLOT_FILES[pool]:
            if len(held) == need:
                break
            handle = (LOCK_DIR / name).open("ab")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            held.append((name, handle))
        yield [name for name, _ in held]
    finally:
        for _, handle in held:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()


def run_in_slots(task: LaneTask, lane: str, pool: str, need: int, seconds: float) -> None:
    with slot_files(pool, need) as files:
        start = time.time()
        time.sleep(seconds)
        end = time.time()
    client().rpush(runs_key(), json.dumps({
        "lane": lane, "pool": pool, "slots": need, "start": start, "end": end,
        "fence": task.fence, "files": files, "overlap": len(files) < need}))


def _gpu_lane(name: str, cadence_s: float, seconds: float, slots: int = 1) -> None:
    def body(self: LaneTask) -> None:
        run_in_slots(self, name, "gpu", slots, seconds)
    shared_task(base=LaneTask, bind=True, name=name,
                lane=Lane(cadence_s=cadence_s, kind=LaneKind.HEAVY, pool="gpu",
                          slots=slots))(body)


def _heavy_lane(name: str, cadence_s: float, seconds: float) -> None:
    def body(self: LaneTask) -> None:
        run_in_slots(self, name, "heavy", 1, seconds)
    shared_task(base=LaneTask, bind=True, name=name,
                lane=Lane(cadence_s=cadence_s, kind=LaneKind.HEAVY))(body)


# More work than two slots can do (four 0.6 s runs a second), so the pool stays full and a
# freed slot is handed on at once; a lane needing both slots at once among them.
for _n in range(4):
    _gpu_lane(f"e2e.gpu.{_n}", cadence_s=1.0, seconds=0.6)
_gpu_lane("e2e.gpu.both", cadence_s=3.0, seconds=0.4, slots=2)
for _n in range(2):
    _heavy_lane(f"e2e.heavy.{_n}", cadence_s=1.0, seconds=0.3)
