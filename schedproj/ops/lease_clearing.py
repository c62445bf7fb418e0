"""``schedproj clear-lease``: free the heavy lease, never while its holder may still execute.

The same for one slot of a pool (``--pool P --slot I``): every slot is a lease like the heavy
lease, with the same record and the same request key, so the same rules clear it.

A granted lease whose run has not started is released only if it is still unstarted, in one
step (``lua/lease_clear.lua``): a start racing the clear wins or loses cleanly, and a message
that loses is refused as stale. A started lease names its holder's worker node; only that node
can say the holder no longer runs, so it alone is asked (``inspect`` with a destination). A node
that does not answer - a busy ``-P solo`` worker, a blocked main process, remote control off, a
slow network - may still be running the holder: the clear is refused, naming the node and the
two ways on: ``--stop`` asks the holder to yield at its next checkpoint (its lease renewals read
the request), ``--terminate`` revokes the task on its node with terminate, confirmed by the
node's reply. Either way the lease is then released by the holder itself or expires once its
renewals stop; it is never released by force while the holder may run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from schedproj.core.records import LeaseView
from schedproj.store.lease import HeavyLease, OperatorRequest


class Refused(Exception):
    """The lease was not cleared; the message says why and what the operator can do."""


def celery_node(lease: LeaseView) -> str:
    """The Celery node name of the lease's holder (its identity is ``node#boot#namespace``)."""
    return (lease.node or "").split("#", 1)[0]


def options(lease: LeaseView, wait_s: float, target: str = "") -> str:
    """The ways on, as commands; ``target`` is the slot's options (`` --pool gpu --slot 1``)."""
    return (f"Options: schedproj clear-lease{target} --stop (it yields at its next checkpoint), "
            f"schedproj clear-lease{target} --terminate (kills the run on its node), or stop "
            f"worker {celery_node(lease) or '?'} (the lease then expires on its own within its "
            f"TTL); --wait {wait_s:g} bounds how long either waits")


@dataclass
class LeaseClearer:
    """The three ways to clear: judged on the holder's own node, stop, terminate."""

    lease: HeavyLease
    #: ``app.control`` of a Celery app on the workers' broker.
    control: Any
    timeout_s: float
    wait_s: float
    say: Callable[[str], None]
    #: Renewals stop within this long of a holder's death (the renewable lease TTL).
    lease_ttl_s: float
    #: What is cleared, in words, and the command-line options naming it: the heavy lease
    #: (none), or a slot (``slot 1 of pool gpu``, `` --pool gpu --slot 1``).
    what: str = "the lease"
    target: str = ""

    def clear(self, current: LeaseView) -> str:
        """Release ``current`` if unstarted, or started and its node says it no longer runs
        it; raises :class:`Refused` otherwise."""
        if current.started_at is None:
            outcome = self.lease.clear(current, started=False)
            if outcome == "cleared":
                return (f"cleared {self.what} granted to {current.lane} (fence "
                        f"{current.fence}); its run had not started, and its message is "
                        "refused as stale")
            if outcome != "started":
                return f"{self.what} changed meanwhile; nothing cleared"
            fresh = self.lease.read()
            if fresh is None or fresh.token != current.token:
                return f"{self.what} changed meanwhile; nothing cleared"
            current = fresh
        return self._clear_started(current)

    def _clear_started(self, current: LeaseView) -> str:
        node = self._node_of(current)
        runs = self.holder_runs(node, str(current.task_id))
        if runs is None:
            raise Refused(
                f"worker {node}, which holds {self.what} ({current.lane}, task "
                f"{current.task_id}), did not answer within {self.timeout_s:g}s, so it may "
                f"still be running it (a busy -P solo worker cannot answer); not clearing. "
                + options(current, self.wait_s, self.target))
        if runs:
            raise Refused(
                f"worker {node} is running the holder ({current.lane}, task "
                f"{current.task_id}); not clearing. "
                + options(current, self.wait_s, self.target))
        request = self._request("clear", current)
        outcome = self.lease.clear(current, started=True, request=request)
        if outcome != "cleared":
            return f"{self.what} changed meanwhile; nothing cleared"
        return (f"cleared {self.what} held by {current.lane} (fence {current.fence}): worker "
                f"{node} says it no longer runs task {current.task_id}")

    def stop(self, current: LeaseView) -> str:
        """Ask the holder to yield at its next checkpoint; wait until the lease is free."""
        if current.started_at is None:
            return self.clear(current)
        self.lease.ask(self._request("stop", current))
        self.say(f"asked {current.lane} (task {current.task_id}, worker "
                 f"{celery_node(current) or '?'}) to yield at its next checkpoint")
        return self._await_release(current, f"yielded; {self.what} is free")

    def terminate(self, current: LeaseView) -> str:
        """Revoke the holder with terminate on its node, confirmed by the node's reply; wait
        until the lease frees itself (its renewals stop)."""
        if current.started_at is None:
            return self.clear(current)
        node = self._node_of(current)
        # Written first: beat reads it when it records the run's end as cleared, not lost.
        self.lease.ask(self._request("terminate", current))
        replies = self.control.revoke(str(current.task_id), terminate=True, signal="SIGTERM",
                                      destination=[node], reply=True, timeout=self.timeout_s)
        if not any(node in reply for reply in replies or []):
            raise Refused(
                f"worker {node} did not confirm the revoke of task {current.task_id} within "
                f"{self.timeout_s:g}s (a busy -P solo worker handles control messages only "
                "between tasks), so the holder may still run; nothing cleared. Use --stop, or "
                f"stop worker {node}: the lease then expires within {self.lease_ttl_s:g}s")
        self.say(f"worker {node} confirmed: task {current.task_id} is being terminated")
        return self._await_release(current, "stopped; its lease expired with its renewals")

    def holder_runs(self, node: str, task_id: str) -> bool | None:
        """Does ``node`` say it runs ``task_id`` (active or reserved)? None: it did not
        answer both questions, so it may."""
        inspect = self.control.inspect(destination=[node], timeout=self.timeout_s)
        active, reserved = inspect.active() or {}, inspect.reserved() or {}
        if node not in active or node not in reserved:
            return None
        tasks = [*(active[node] or []), *(reserved[node] or [])]
        return any(isinstance(t, dict) and t.get("id") == task_id for t in tasks)

    def _node_of(self, current: LeaseView) -> str:
        node = celery_node(current)
        if not node or not current.task_id:
            raise Refused(f"{self.what} held by {current.lane} names no worker node or task, so "
                          "nobody can say its holder is gone; not clearing. It frees itself "
                          f"within {self.lease_ttl_s:g}s once its holder stops renewing it")
        return node

    def _request(self, action: str, current: LeaseView) -> OperatorRequest:
        return OperatorRequest(action=action, task_id=str(current.task_id), lane=current.lane,
                               fence=current.fence, at=time.time())

    def _await_release(self, current: LeaseView, done: str) -> str:
        """Wait (bounded by ``wait_s``) until ``current`` is no longer the lease, saying how
        long it has waited every few seconds."""
        start = time.monotonic()
        said = start
        while time.monotonic() - start < self.wait_s:
            held = self.lease.read()
            if held is None or held.token != current.token:
                return f"{current.lane} (task {current.task_id}) {done}"
            if time.monotonic() - said >= 2.0:
                said = time.monotonic()
                self.say(f"waiting for {current.lane} to let go of {self.what}: "
                         f"{said - start:.0f}s of {self.wait_s:g}s")
            time.sleep(0.2)
        raise Refused(f"{current.lane} (task {current.task_id}) still holds {self.what} after "
                      f"{self.wait_s:g}s; the request stands (it is acted on at the holder's "
                      "next checkpoint or renewal). Wait longer with --wait, or use "
                      "--terminate")


__all__ = ["LeaseClearer", "Refused", "celery_node"]
