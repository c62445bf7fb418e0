"""Stamps along the hand-off path, for the breakdown of the gap (``BENCH_TRACE_DIR``).

Installed by :mod:`bench.lanes` in every benchmark process (beat, the worker's main process
and its pool child) when ``BENCH_TRACE_DIR`` names a directory: each stamp is one line
``event<TAB>time.time()<TAB>id`` appended to ``<dir>/<pid>.trace`` (one ``write`` call, a few
microseconds). The stamps wrap the functions the hand-off goes through; nothing in
``schedproj`` is changed, so an untraced run is the product as shipped.

The path of one hand-off, run A ending and run B starting (``bench.handoff`` reads it back):

* worker, pool child, end of A: ``body_end`` (the lane body returns), ``journal`` /
  ``journaled`` (``LaneStore.log``: the journal's 'end' entry), ``finish_call`` /
  ``finish_done`` (``LaneStore.finish``: record the outcome, release the lease and push to
  the wake list, one Lua call);
* beat: ``wait`` (it blocks on the wake list), ``blpop_return`` (its BLPOP returns),
  ``tick_start``, ``snapshot`` (the tick's read), ``planned`` (``plan_tick`` returns),
  ``granted`` (the heavy lease granted to B), ``recorded`` (the dispatch written),
  ``send_entry`` (the scheduler's send called), ``publish`` (kombu's ``Producer.publish``
  called for B's message) and ``pushed`` (its LPUSH answered);
* worker, main process: ``acked`` (A's message acknowledged: only then may it fetch the
  next, prefetch being 1), ``brpop_sent`` (its BRPOP on the queue sent), ``brpop_read``
  (the BRPOP's reply being read: the message arrived), ``appended`` (the message recorded
  as unacknowledged), ``received`` (Celery's ``task_received``), ``to_pool`` (handed to the
  pool);
* worker, pool child, start of B: ``prerun`` (Celery's ``task_prerun``), ``lease_started``
  (the lease checked and marked started, one Lua call: since issue 23: 3 it also marks the
  run record running and journals the start when the record is the one the process
  expected), ``marked`` (the run record marked running by its own compare and set, when
  not), ``journal`` / ``journaled`` (the journal's 'start' entry, when apart), ``body_start``;
* everywhere: ``rt``, each request a redis-py connection sends (a pipeline being one), so the
  round trips each process waits for on the path are counted.
  Since issue 23: 3 the journal's 'end' goes with ``finish`` in one round trip (no
  ``journal`` stamp there).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class Stamps:
    """Appends ``event time id`` lines to this process's own file (re-opened after a fork)."""

    def __init__(self, directory: str) -> None:
        self.directory = Path(directory)
        self.pid = 0
        self.fd = -1

    def __call__(self, event: str, ident: str = "", at: float | None = None) -> None:
        t = time.time() if at is None else at
        pid = os.getpid()
        if pid != self.pid:  # a pool child forked from the worker: a file of its own
            self.fd = os.open(self.directory / f"{pid}.trace",
                              os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self.pid = pid
        os.write(self.fd, f"{event}\t{t!r}\t{ident}\n".encode())


#: The stamps of this process (None: tracing off).
stamp: Stamps | None = None


def mark(event: str, ident: str = "", at: float | None = None) -> None:
    """Stamp ``event`` if tracing is on (the lane bodies call this)."""
    if stamp is not None:
        stamp(event, ident, at)


def _around(owner: Any, name: str, before: str | None = None, after: str | None = None,
            ident: Callable[..., str] | None = None) -> None:
    """Wrap ``owner.name`` so it stamps ``before`` on entry and ``after`` on return (a
    function this checkout does not have is left alone: one bench traces older code too)."""
    original = getattr(owner, name, None)
    if original is None:
        return

    @functools.wraps(original)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        label = ident(*args, **kwargs) if ident is not None else ""
        if before:
            mark(before, label)
        result = original(*args, **kwargs)
        if after:
            mark(after, label)
        return result

    setattr(owner, name, wrapped)


def _routing_key(_producer: Any, _body: Any, *args: Any, **kwargs: Any) -> str:
    return str(kwargs.get("routing_key") or "")


def _queue(_channel: Any, queue: Any, *args: Any, **kwargs: Any) -> str:
    return str(queue)


def install(directory: str) -> None:
    """Wrap the hand-off path's functions in this process (once)."""
    global stamp
    if stamp is not None:
        return
    stamp = Stamps(directory)
    from celery import signals
    from kombu.messaging import Producer
    from kombu.transport import redis as kombu_redis

    from schedproj.on_celery.beat import FairScheduler
    from schedproj.on_celery.task import LaneTask
    from schedproj.store.lane_store import LaneStore
    from schedproj.store.lease import HeavyLease

    _around(LaneStore, "finish", "finish_call", "finish_done")
    _around(LaneStore, "log", "journal", "journaled")
    _around(LaneStore, "wait_for_wake", "wait")
    _around(LaneStore, "tick_snapshot", after="snapshot")
    _around(LaneStore, "write_sched", after="recorded")
    _around(HeavyLease, "acquire", after="granted")
    _around(HeavyLease, "acquire_and_write", after="recorded")  # granted and recorded at once
    _around(HeavyLease, "start", after="lease_started")
    _around(HeavyLease, "start_marked", after="lease_started")
    _around(LaneTask, "_mark_running", after="marked")
    _around(FairScheduler, "tick", "tick_start", "tick_end")
    _around(FairScheduler, "send_entry", "send_entry")
    from schedproj.on_celery import beat

    _around(beat, "plan_tick", after="planned")
    _around(Producer, "publish", "publish", ident=_routing_key)
    _around(kombu_redis.Channel, "_put", after="pushed", ident=_queue)
    _around(kombu_redis.Channel, "_brpop_start", after="brpop_sent")
    _around(kombu_redis.Channel, "_brpop_read", "brpop_read")
    _around(kombu_redis.QoS, "append", after="appended")
    _around(kombu_redis.QoS, "ack", after="acked")
    import redis
    from redis.connection import Connection

    _around(redis.Redis, "blpop", after="blpop_return")
    # Every request a redis-py connection sends (a pipeline is one): the round trips.
    _around(Connection, "send_packed_command", "rt")
    from celery.concurrency.base import BasePool

    # Not Request.execute_using_pool: the worker's request class is a subclass made at start.
    _around(BasePool, "apply_async", "to_pool")

    def received(request: Any = None, **_: Any) -> None:
        mark("received", str(getattr(request, "id", "")))

    def prerun(task_id: str = "", **_: Any) -> None:
        mark("prerun", str(task_id))

    signals.task_received.connect(received, weak=False)
    signals.task_prerun.connect(prerun, weak=False)


def profile(directory: str, every: int = 50) -> None:
    """Profile beat's ticks and the worker's lane calls in CPU time (``BENCH_PROFILE_DIR``):
    each process dumps its cProfile stats to ``<dir>/<pid>.prof`` every ``every`` calls (a
    benchmark process is stopped, not asked to exit)."""
    import cProfile

    from schedproj.on_celery.beat import FairScheduler
    from schedproj.on_celery.task import LaneTask

    profiler = cProfile.Profile(time.process_time)
    calls = [0]

    def wrap(owner: Any, name: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def profiled(*args: Any, **kwargs: Any) -> Any:
            profiler.enable()
            try:
                return original(*args, **kwargs)
            finally:
                profiler.disable()
                calls[0] += 1
                if calls[0] % every == 0:
                    profiler.dump_stats(str(Path(directory) / f"{os.getpid()}.prof"))

        setattr(owner, name, profiled)

    wrap(FairScheduler, "tick")
    wrap(LaneTask, "__call__")


def read(directory: Path) -> list[tuple[float, str, str, int]]:
    """Every stamp of a traced run: (time, event, id, pid), in time order."""
    out: list[tuple[float, str, str, int]] = []
    for path in directory.glob("*.trace"):
        pid = int(path.stem)
        for line in path.read_text().splitlines():
            event, t, ident = [*line.split("\t"), "", ""][:3]
            out.append((float(t), event, ident, pid))
    out.sort()
    return out
