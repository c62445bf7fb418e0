"""A worker restarted on the same node frees the lease of a predecessor it can prove dead.

Without this, a heavy worker killed outright and restarted at once waits out the whole lease
TTL before heavy work resumes: its predecessor's lease lives on until it expires. The lease
records who runs under it (host, process id, worker node name, see ``lua/lease_start.lua``);
a worker that starts with the same node name on the same host, and finds that process gone,
knows the run died with it and releases the lease by its token (compare and set). Beat then
records the run as lost on its next tick.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any

from celery import signals

from schedproj.core.pools import DEFAULT_POOL
from schedproj.core.records import LeaseView
from schedproj.on_celery.config import lane_set_for
from schedproj.on_celery.expected import log_failure
from schedproj.on_celery.runtime import runtime_for
from schedproj.store.lease import HeavyLease
from schedproj.store.protocol import SlotKeys

logger = logging.getLogger(__name__)


def process_gone(pid: int) -> bool:
    """Is there no live process ``pid`` on this host? A zombie (killed, not yet reaped: a
    pool child whose worker was killed with it) is gone; a process of another user is not."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state is the field after the parenthesised command name.
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def machine_boot() -> str:
    """This machine's current boot (the kernel's random boot id; else the machine id): two
    hosts that share a hostname (cloned VMs, a name reused) never do, nor does a host before
    and after a reboot."""
    for path in ("/proc/sys/kernel/random/boot_id", "/etc/machine-id"):
        try:
            value = Path(path).read_text().strip()
        except OSError:
            continue
        if value:
            return value
    return ""


def node_identity(nodename: str) -> str:
    """The worker's node name plus its machine boot and process namespace: containers on the
    host network share the host's name, and a pid from another container's namespace (or
    another machine: the host pid namespace has the same inode everywhere) is meaningless
    here, so only a predecessor of the same boot and namespace can be proven dead."""
    return f"{nodename}#{_boot_and_namespace()}"


#: (pid, "boot#namespace") of the process that read them: a heavy start asks for its node
#: identity each run, and the two file reads cost ~0.25 ms on the hand-off path (issue 23: 3).
#: Neither changes while a process lives (no process outlives a reboot; a process never
#: leaves its pid namespace); keyed by pid so a forked child reads its own.
_boot_and_namespace_read: tuple[int, str] | None = None


def _boot_and_namespace() -> str:
    global _boot_and_namespace_read
    pid = os.getpid()
    if _boot_and_namespace_read is None or _boot_and_namespace_read[0] != pid:
        try:
            namespace = os.stat("/proc/self/ns/pid").st_ino
        except OSError:
            namespace = 0
        _boot_and_namespace_read = (pid, f"{machine_boot()}#{namespace}")
    return _boot_and_namespace_read[1]


def predecessor_dead(lease: LeaseView, host: str, node: str, me: int) -> bool:
    """Does ``lease`` belong to a run of this very node (same host and node name) whose process
    is gone?"""
    return (lease.started_at is not None and bool(node) and lease.host == host
            and lease.node == node and lease.pid is not None and lease.pid != me
            and process_gone(lease.pid))


@signals.worker_ready.connect  # type: ignore[untyped-decorator]
def free_dead_predecessors_lease(sender: Any = None, **kwargs: Any) -> None:
    app = getattr(sender, "app", None)
    node = str(getattr(sender, "hostname", "") or "")
    if app is None or getattr(app, "schedproj_settings", None) is None:
        return
    try:
        rt = runtime_for(app)
        _free_if_dead(rt.lease, node)
    except Exception as exc:  # never stop a worker from starting over this
        log_failure(logger, exc, "could not check the heavy lease for a dead predecessor")
        return
    try:
        for pool in lane_set_for(app).pools.values():
            for index in range(pool.slots if pool.name != DEFAULT_POOL else 0):
                _free_if_dead(HeavyLease(rt.lease.client, rt.keys.slot(pool.name, index)),
                              node)
    except Exception as exc:
        log_failure(logger, exc, "could not check the pools' slots for a dead predecessor")


def _free_if_dead(held: HeavyLease, node: str) -> None:
    lease = held.read()
    if lease is None or not predecessor_dead(lease, socket.gethostname(),
                                             node_identity(node), os.getpid()):
        return
    if held.release(lease.token):
        keys = held.keys
        what = (f"slot {keys.index} of pool {keys.pool}" if isinstance(keys, SlotKeys)
                else "the heavy lease")
        logger.warning("freed %s of lane %s: it was held by process %s of this node (%s), "
                       "which is gone; its run is recorded lost", what, lease.lane, lease.pid,
                       node)


__all__ = ["free_dead_predecessors_lease", "predecessor_dead", "process_gone"]
