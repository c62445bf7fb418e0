"""A real Redis Sentinel set on loopback: one master, one replica, three sentinels.

Used by the Sentinel tests and by ``schedproj chaos --sentinel``. Every server is a
``redis-server`` process (the sentinels run ``redis-server CONF --sentinel``) that keeps
nothing on disk. The set can fail over two ways, both to a replica made to lag first, so the
promoted replica lacks the latest writes:

* :meth:`SentinelSet.lag_replica` locks the replica out (the master asks for a password the
  replica does not have, and drops its link), so it cannot resync;
* :meth:`SentinelSet.kill_master` SIGKILLs the master (the sentinels agree it is down and
  promote the replica), or :meth:`SentinelSet.command_failover` sends ``SENTINEL FAILOVER``.

:meth:`SentinelSet.rejoin` then brings the old master back as a replica of the new one.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from schedproj.core.errors import ConfigurationError
from schedproj.devtools.processes import wait_until
from schedproj.devtools.redis_server import RedisServer, free_port, redis_server_binary

SERVICE = "svc"
#: The password that keeps a lagging replica out of its master (never a credential).
LOCKOUT = "keep-the-replica-out"


@dataclass
class SentinelSet:
    """Master, replica and three sentinels on free loopback ports under ``workdir``."""

    workdir: Path
    service: str = SERVICE
    #: How long a master must stay silent before the sentinels call it down.
    down_after_ms: int = 1000
    failover_timeout_ms: int = 5000
    ports: list[int] = field(default_factory=list)
    sentinel_ports: list[int] = field(default_factory=list)
    nodes: dict[int, RedisServer] = field(default_factory=dict)
    sentinels: list[RedisServer] = field(default_factory=list)
    #: Nodes locked out by :meth:`lag_replica` (port -> the master that asks a password).
    locked: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        redis_server_binary()  # fail before starting anything when there is none

    # -- the set --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def start(self, timeout_s: float = 20.0) -> None:
        master, replica = free_port(), free_port()
        self.ports = [master, replica]
        self.start_node(master)
        self.start_node(replica, replica_of=master)
        config = (f"sentinel monitor {self.service} 127.0.0.1 {master} 2\n"
                  f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}\n"
                  f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}\n")
        self.sentinels = [RedisServer(self.workdir, f"sentinel{i}", sentinel_config=config)
                          for i in range(3)]
        self.sentinel_ports = [s.port for s in self.sentinels]
        for sentinel in self.sentinels:
            sentinel.launch()  # all three at once, then wait for each
        for sentinel in self.sentinels:
            sentinel.wait_answering(timeout_s)
        if not self.wait_synced(timeout_s):
            raise ConfigurationError("the replica did not sync with the master")

    def stop(self) -> None:
        for server in [*self.nodes.values(), *self.sentinels]:
            server.kill()
        self.nodes.clear()
        self.sentinels.clear()

    # -- nodes ----------------------------------------------------------------------------

    def start_node(self, port: int, replica_of: int | None = None) -> None:
        """Start (or restart, empty) the server on ``port``, a replica of ``replica_of``."""
        replica = () if replica_of is None else ("--replicaof", "127.0.0.1", str(replica_of))
        node = RedisServer(self.workdir, f"node{port}", port=port, extra_args=replica)
        self.nodes[port] = node
        node.start()

    def kill_node(self, port: int) -> None:
        node = self.nodes.pop(port, None)
        if node is not None:
            node.kill()
        self.locked.pop(port, None)

    def signal_node(self, port: int, sig: int) -> None:
        node = self.nodes.get(port)
        if node is not None:
            node.signal(sig)

    def master_port(self) -> int | None:
        """The master the sentinels name now (the first sentinel that answers)."""
        for port in self.sentinel_ports:
            try:
                addr = redis.Redis(port=port, socket_timeout=1).sentinel_get_master_addr_by_name(
                    self.service)
            except redis.RedisError:
                continue
            if isinstance(addr, tuple | list) and addr:
                return int(addr[1])
        return None

    def replica_port(self) -> int | None:
        master = self.master_port()
        return next((p for p in self.ports if p != master), None)

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, password=LOCKOUT if port in self.locked else None,
                           socket_timeout=2, socket_connect_timeout=2)

    def wait_synced(self, timeout_s: float = 20.0) -> bool:
        """Wait until the replica's link to the master is up and the sentinels know both."""

        def synced() -> bool:
            master, replica = self.master_port(), self.replica_port()
            if master is None or replica is None:
                return False
            try:
                info = self.client(replica).info("replication")
                known = redis.Redis(port=self.sentinel_ports[0], socket_timeout=1) \
                    .sentinel_slaves(self.service)
            except redis.RedisError:
                return False
            return (info.get("role") == "slave" and int(info.get("master_port", 0)) == master
                    and info.get("master_link_status") == "up"
                    and any(int(r.get("port", 0)) == replica
                            and "s_down" not in str(r.get("flags", "")) for r in known))

        return wait_until(synced, timeout_s, poll_s=0.1)

    # -- failover -------------------------------------------------------------------------

    def lag_replica(self) -> int:
        """Lock the replica out of the master: from now on writes land on the master only.
        Returns the master's port."""
        master = self.master_port()
        if master is None:
            raise ConfigurationError("no master to lag behind")
        client = self.client(master)
        client.config_set("requirepass", LOCKOUT)
        self.locked[master] = master
        with contextlib.suppress(redis.RedisError):
            self.client(master).client_kill_filter(_type="replica")
        return master

    def kill_master(self) -> int:
        """SIGKILL the master; return its port."""
        master = self.master_port()
        if master is None:
            raise ConfigurationError("no master to kill")
        self.kill_node(master)
        return master

    def command_failover(self) -> int:
        """``SENTINEL FAILOVER``: promote the replica without the master being down."""
        master = self.master_port()
        if master is None:
            raise ConfigurationError("no master to fail over from")
        redis.Redis(port=self.sentinel_ports[0], socket_timeout=2).sentinel_failover(
            self.service)
        return master

    def wait_promoted(self, old_master: int, timeout_s: float = 60.0) -> bool:
        """Wait until the sentinels name another master and it answers as one."""

        def promoted() -> bool:
            new = self.master_port()
            if new is None or new == old_master:
                return False
            try:
                return self.client(new).info("replication").get("role") == "master"
            except redis.RedisError:
                return False

        return wait_until(promoted, timeout_s, poll_s=0.05)

    def rejoin(self, old_master: int) -> None:
        """Bring the old master back as a replica of the new one (restarted empty if it was
        killed; let in again if it was locked)."""
        new = self.master_port()
        if old_master not in self.nodes:
            # Not promoted (the sentinels still name the dead master): it comes back master.
            self.start_node(old_master, replica_of=None if new == old_master else new)
            return
        if old_master in self.locked:
            with contextlib.suppress(redis.RedisError):
                self.client(old_master).config_set("requirepass", "")
            self.locked.pop(old_master, None)
        # The sentinels reconfigure it too; this only saves waiting for them.
        with contextlib.suppress(redis.RedisError):
            self.client(old_master).replicaof("127.0.0.1", new)

    # -- the current master as one restartable server ---------------------------------------

    def restart_master(self, down_s: float) -> None:
        """Kill the master and start it again empty on the same port, quicker than the
        sentinels call it down: a restart without persistence, not a failover."""
        master = self.master_port()
        if master is None:
            raise ConfigurationError("no master to restart")
        self.kill_node(master)
        time.sleep(down_s)
        self.start_node(master)
        # Clients write again at once, so ask what the start loaded rather than count keys.
        loaded = self.client(master).info("persistence").get("rdb_last_load_keys_loaded", 0)
        if int(loaded):
            raise ConfigurationError(f"redis on {master} restarted with {loaded} keys loaded; "
                                     "it must start empty")

    def signal_master(self, sig: int) -> None:
        master = self.master_port()
        if master is not None:
            self.signal_node(master, sig)

