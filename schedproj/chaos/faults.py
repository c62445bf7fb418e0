"""The faults of the chaos run: what each does to the fleet and its Redis servers, and the
figures they leave for the report."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from schedproj.chaos.processes import (
    BEAT_LOCK_TTL_S,
    LEASE_TTL_S,
    LOOP_S,
    PREFIX,
    Child,
    Fleet,
)
from schedproj.core.errors import ConfigurationError
from schedproj.core.pools import DEFAULT_POOL
from schedproj.devtools.processes import wait_until
from schedproj.devtools.redis_server import RedisServer
from schedproj.devtools.sentinel import LOCKOUT, SentinelSet
from schedproj.store.protocol import Keys

FAULTS = ("kill-heavy", "kill-beat", "pause-heavy", "restart-redis", "block-redis",
          "lose-redis-mid-run", "freeze-beat", "restart-redis-under-light", "corrupt-derived")
#: Faults after which Redis holds none of the state it had (restarted without persistence).
STATE_LOSSES = ("restart-redis", "lose-redis-mid-run", "restart-redis-under-light")
#: The fault kind of a run on a Sentinel set: a failover to a lagging replica.
FAILOVER = "failover"
#: Names ``min_faults`` may use besides fault kinds: a group counts all its kinds.
FAULT_GROUPS = {"state-loss": STATE_LOSSES}
#: How long after a fault's action returns the fleet may still be recovering from it (the
#: audit does not count this time against a lane's wait). The other actions return only once
#: the fleet is back (a new holder started, a standby beat took over, the paused holder's
#: lease passed on).
RECOVERY_AFTER_S = {
    # Redis came back empty (or a replica was promoted): a quarantine, then beat's next loop.
    **dict.fromkeys((*STATE_LOSSES, FAILOVER), 4 / 3 * LEASE_TTL_S + LOOP_S),
    # Redis resumed after the beat lock may have lapsed: a beat takes it again.
    "block-redis": BEAT_LOCK_TTL_S + LOOP_S,
    # A derived key damaged: the documented heal time (docs/architecture.md), beat's next tick.
    "corrupt-derived": LOOP_S,
}
#: How the derived-key fault damages the due index and the changed set, in turn (both each
#: time): deleted, replaced by a wrong type, or (the index) restored from a copy 2 s older.
DUE_DAMAGE = ("delete", "wrong-type", "restore-older")
CHANGED_DAMAGE = ("delete", "wrong-type")
#: How much older the restored copy of the due index is (seconds).
RESTORE_AGE_S = 2.0
#: How often a fault looks again at what it waits for (each look reads the journal).
POLL_S = 0.05
#: How long the beat-freeze fault stalls a beat between recording and sending: past its lock.
FREEZE_S = BEAT_LOCK_TTL_S + 1.5


def fault_kinds(sentinel: bool) -> tuple[str, ...]:
    """The fault kinds a run injects, in turn."""
    return (*FAULTS, FAILOVER) if sentinel else FAULTS


def parse_min_faults(text: str) -> dict[str, int]:
    """``state-loss=100,failover=20`` -> {"state-loss": 100, "failover": 20}."""
    known = {*FAULTS, FAILOVER, *FAULT_GROUPS}
    out: dict[str, int] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, _, value = item.partition("=")
        if name not in known or not value.isdigit():
            raise ConfigurationError(
                f"--min-faults: {item!r} is not KIND=COUNT; the kinds are "
                f"{', '.join(sorted(known))}")
        out[name] = int(value)
    return out


def fault_count(kills: Counter[str], name: str) -> int:
    return sum(kills[k] for k in FAULT_GROUPS.get(name, (name,)))


@dataclass
class Figures:
    kills: Counter[str] = field(default_factory=Counter)
    #: Children the driver killed on purpose (any other that died is a worker exit).
    killed: set[int] = field(default_factory=set)
    #: When Redis came back empty after each state loss (to measure the quarantine's wait).
    losses: list[float] = field(default_factory=list)
    lease_recovery_s: list[float] = field(default_factory=list)
    failover_s: list[float] = field(default_factory=list)
    paused_fences: list[int] = field(default_factory=list)
    #: The fences of the pool runs paused with the lease's holder.
    paused_pool_fences: list[int] = field(default_factory=list)
    #: Sentinel failovers: how each was made, how long until the replica was promoted, and
    #: how many bytes of replication stream the promoted replica lacked.
    failover_methods: Counter[str] = field(default_factory=Counter)
    promotion_s: list[float] = field(default_factory=list)
    replica_behind: list[int] = field(default_factory=list)
    #: How each derived key was damaged (``due:delete``, ``changed:wrong-type``, ...).
    derived_damage: Counter[str] = field(default_factory=Counter)
    #: (began, fault kind, ended) of every fault injected.
    log: list[tuple[float, str, float]] = field(default_factory=list)


def journal(audit_redis: RedisServer) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(audit_redis.url, decode_responses=True)
    return [json.loads(x) for x in client.lrange(Keys(PREFIX).journal, 0, -1)]


def current_holder(audit_redis: RedisServer) -> dict[str, Any] | None:
    """The newest run of the heavy lease that started and has not ended, from the journal
    (the pool's runs hold slots, not the lease)."""
    open_runs: dict[str, dict[str, Any]] = {}
    for e in journal(audit_redis):
        if e["fence"] <= 0 or e.get("pool", DEFAULT_POOL) != DEFAULT_POOL:
            continue
        if e["ev"] == "start":
            open_runs[e["task"]] = e
        else:
            open_runs.pop(e["task"], None)
    return max(open_runs.values(), key=lambda e: e["t"], default=None)


def pool_holders(audit_redis: RedisServer) -> list[dict[str, Any]]:
    """The runs of the pools beyond the default that started and have not ended."""
    open_runs: dict[str, dict[str, Any]] = {}
    for e in journal(audit_redis):
        if e["ev"] == "start" and e.get("pool", DEFAULT_POOL) != DEFAULT_POOL:
            open_runs[e["task"]] = e
        elif e["ev"] != "start":
            open_runs.pop(e["task"], None)
    return list(open_runs.values())


def active_beat(sc: Scene) -> Child | None:
    try:
        info = sc.state_client().hgetall(Keys(PREFIX).beat_info)
    except redis.RedisError:
        return None
    pid = int(info.get("pid", 0))
    return next((c for c in sc.fleet.live("beat") if c.popen.pid == pid), None)


@dataclass
class Scene:
    """What a fault acts on. ``state`` is the state Redis (and broker); with ``sentinel``
    the state lives on the Sentinel set and ``state`` is the broker only."""

    fleet: Fleet
    state: RedisServer
    audit_redis: RedisServer
    figures: Figures
    sentinel: SentinelSet | None = None

    @property
    def state_url(self) -> str:
        """Where beat and workers find the state: the Sentinel set, or the plain Redis."""
        return self.state.url if self.sentinel is None else self.sentinel.url

    def state_client(self) -> redis.Redis:
        """A plain client of the server holding the state now (no retries, short timeout)."""
        if self.sentinel is None:
            return self.state.client()
        port = self.sentinel.master_port() or 0
        return redis.Redis(port=port, decode_responses=True, socket_timeout=1,
                           password=LOCKOUT if port in self.sentinel.locked else None)

    def restart_state(self, down_s: float) -> None:
        """The state Redis (and the broker) restart without persistence: all state is lost."""
        self.state.kill()
        if self.sentinel is not None:
            self.sentinel.restart_master(down_s)
        else:
            time.sleep(down_s)
        self.state.start()

    def freeze_state(self, seconds: float) -> None:
        self.state.signal(signal.SIGSTOP)
        master = self.sentinel.master_port() if self.sentinel is not None else None
        if self.sentinel is not None and master is not None:
            self.sentinel.signal_node(master, signal.SIGSTOP)
        time.sleep(seconds)
        if self.sentinel is not None and master is not None:
            self.sentinel.signal_node(master, signal.SIGCONT)
        self.state.signal(signal.SIGCONT)


def _kill_heavy(sc: Scene) -> None:
    holder = current_holder(sc.audit_redis)
    worker = sc.fleet.holding(int(holder["pid"])) if holder else None
    if holder is None or worker is None:
        return
    worker.signal(signal.SIGKILL)
    sc.figures.killed.add(worker.popen.pid)
    sc.figures.kills["kill-heavy"] += 1
    pool_worker = _pool_worker_running(sc)
    if pool_worker is not None:  # and the pool's worker, its runs with it: lost per slot
        pool_worker.signal(signal.SIGKILL)
        sc.figures.killed.add(pool_worker.popen.pid)
        sc.figures.kills["kill-pool-worker"] += 1
        sc.fleet.spawn("pool")
    fence = int(holder["fence"])
    killed_at = time.monotonic()
    if wait_until(lambda: any(e["ev"] == "start" and e["fence"] > fence
                              and e.get("pool", DEFAULT_POOL) == DEFAULT_POOL
                              for e in journal(sc.audit_redis)), 30, poll_s=POLL_S):
        sc.figures.lease_recovery_s.append(time.monotonic() - killed_at)
    sc.fleet.spawn("heavy")


def _pause_heavy(sc: Scene) -> None:
    holder = current_holder(sc.audit_redis)
    worker = sc.fleet.holding(int(holder["pid"])) if holder else None
    if holder is None or worker is None:
        return
    pool_worker = _pool_worker_running(sc)
    paused = [worker] if pool_worker is None else [worker, pool_worker]
    for child in paused:
        child.signal(signal.SIGSTOP)
    sc.figures.kills["pause-heavy"] += 1
    sc.figures.paused_fences.append(int(holder["fence"]))
    if pool_worker is not None:  # the pool's runs are paused past their slots' TTL too
        sc.figures.kills["pause-pool-worker"] += 1
        sc.figures.paused_pool_fences.extend(int(r["fence"]) for r in pool_holders(sc.audit_redis))
    time.sleep(LEASE_TTL_S + 1.5)
    for child in paused:
        child.signal(signal.SIGCONT)


def _pool_worker_running(sc: Scene) -> Child | None:
    """The pool's worker while a pool run is open in the journal (the one worker serves the
    pool), else None."""
    holders = pool_holders(sc.audit_redis)
    return next((w for r in holders if (w := sc.fleet.holding(int(r["pid"]), "pool"))), None)


def _kill_beat(sc: Scene) -> None:
    beat = active_beat(sc)
    if beat is None:
        return
    beat.signal(signal.SIGKILL)
    sc.figures.killed.add(beat.popen.pid)
    sc.figures.kills["kill-beat"] += 1
    killed_at = time.monotonic()
    if wait_until(lambda: (b := active_beat(sc)) is not None and b is not beat, 30,
                  poll_s=POLL_S):
        sc.figures.failover_s.append(time.monotonic() - killed_at)
    sc.fleet.spawn("beat")


def _restart_redis(sc: Scene, down_s: float = 0.5, kind: str = "restart-redis") -> None:
    sc.figures.kills[kind] += 1
    sc.restart_state(down_s)
    sc.figures.losses.append(time.time())


def _lose_redis_mid_run(sc: Scene) -> None:
    """Redis restarts empty while a heavy run holds the lease, down well under a TTL: the
    case where a beat used to grant a second lease while the first holder ran on."""
    if not wait_until(lambda: current_holder(sc.audit_redis) is not None, 5, poll_s=POLL_S):
        return
    time.sleep(0.3)
    _restart_redis(sc, down_s=0.2, kind="lose-redis-mid-run")


def _restart_redis_under_light(sc: Scene) -> None:
    """Several quick restarts while the light worker runs (acks_late): it must survive them
    and no light lane may run twice at once."""
    for _ in range(3):
        _restart_redis(sc, down_s=0.2, kind="restart-redis-under-light")
        time.sleep(1.0)


def _block_redis(sc: Scene) -> None:
    sc.figures.kills["block-redis"] += 1
    sc.freeze_state(LEASE_TTL_S + 1.0)


def _freeze_beat(sc: Scene) -> None:
    """A beat stalls between recording its dispatch and publishing it, past its lock; another
    takes over and dispatches; the stalled one then publishes. Its messages must run nothing."""
    frozen = sc.fleet.spawn("beat", freeze_before_send_s=FREEZE_S)
    for beat in sc.fleet.live("beat"):
        if beat is not frozen:
            beat.signal(signal.SIGKILL)
            sc.figures.killed.add(beat.popen.pid)
    if not wait_until(lambda: active_beat(sc) is frozen, 15, poll_s=POLL_S):
        sc.fleet.spawn("beat")
        return
    sc.fleet.spawn("beat")
    sc.figures.kills["freeze-beat"] += 1
    time.sleep(FREEZE_S + 2.0)
    frozen.signal(signal.SIGKILL)
    sc.figures.killed.add(frozen.popen.pid)
    sc.fleet.spawn("beat")


def _corrupt_derived(sc: Scene) -> None:
    """Damage the due index and the changed set mid-run, as an operator's stray command or a
    partial restore would: beat must see it at its next tick and rebuild both from the lane
    records, so no lane waits past its bound beyond that (the audit's gaps)."""
    n, keys = sc.figures.kills["corrupt-derived"], Keys(PREFIX)
    due, changed = DUE_DAMAGE[n % len(DUE_DAMAGE)], CHANGED_DAMAGE[n % len(CHANGED_DAMAGE)]
    try:
        client = sc.state_client()
        old = client.dump(keys.due) if due == "restore-older" else None
        if old is not None:
            time.sleep(RESTORE_AGE_S)
            client.restore(keys.due, 0, old, replace=True)
        elif due in ("delete", "wrong-type"):
            client.delete(keys.due)
            if due == "wrong-type":
                client.set(keys.due, "garbage")
        client.delete(keys.changed)
        if changed == "wrong-type":
            client.hset(keys.changed, "garbage", "1")
    except redis.RedisError:
        return
    sc.figures.kills["corrupt-derived"] += 1
    sc.figures.derived_damage.update((f"due:{due}", f"changed:{changed}"))


def _failover(sc: Scene) -> None:
    """The Sentinel set fails over to a replica that lags: it is locked out of the master,
    the master takes the latest writes (a new grant if one comes within a lease TTL) alone,
    then it is SIGKILLed or ``SENTINEL FAILOVER`` is sent, in turn. The old master comes back
    as a replica of the new one before the next fault."""
    s = sc.sentinel
    if s is None or not s.wait_synced(30):
        return
    method = ("sigkill", "command")[sc.figures.kills[FAILOVER] % 2]
    newest = max((int(e["fence"]) for e in journal(sc.audit_redis) if e["ev"] == "start"),
                 default=0)
    master = s.lag_replica()
    wait_until(lambda: any(e["ev"] == "start" and int(e["fence"]) > newest
                           for e in journal(sc.audit_redis)), LEASE_TTL_S, poll_s=POLL_S)
    replica = s.replica_port()
    try:
        behind = int(s.client(master).info("replication")["master_repl_offset"]) - \
            int(s.client(replica or 0).info("replication").get("slave_repl_offset", 0))
    except redis.RedisError:
        behind = -1
    began = time.monotonic()
    if method == "sigkill":
        s.kill_master()
    else:
        s.command_failover()
    promoted = s.wait_promoted(master, 60)
    if promoted:
        sc.figures.promotion_s.append(time.monotonic() - began)
        sc.figures.losses.append(time.time())
        sc.figures.kills[FAILOVER] += 1
        sc.figures.failover_methods[method] += 1
        sc.figures.replica_behind.append(behind)
    s.rejoin(master)
    s.wait_synced(30)


ACTIONS: dict[str, Callable[[Scene], None]] = {
    "kill-heavy": _kill_heavy, "pause-heavy": _pause_heavy, "kill-beat": _kill_beat,
    "restart-redis": _restart_redis, "block-redis": _block_redis,
    "lose-redis-mid-run": _lose_redis_mid_run, "freeze-beat": _freeze_beat,
    "restart-redis-under-light": _restart_redis_under_light,
    "corrupt-derived": _corrupt_derived, FAILOVER: _failover,
}
