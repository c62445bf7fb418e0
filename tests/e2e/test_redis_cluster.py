"""schedproj's state on a real Redis Cluster: three masters with a replica each, on loopback
(schedproj.devtools.redis_cluster), started and stopped by these tests.

One deployment's keys share a hash tag (``{e2e}``), so they all live in one slot and every
Lua script runs there unchanged; real ``celery beat -S fair`` and workers run the core
scenario on it (the Celery broker stays a plain Redis: kombu has no cluster transport). When
the master holding the slot fails (SIGKILL, or ``CLUSTER FAILOVER FORCE`` on its replica) over
to a replica that lacks the last writes, the promoted replica is another server process, so
the epoch starts a quarantine, nothing is granted, and the heavy holder re-asserts its lease
by token and fence: as with Sentinel (tests/e2e/test_sentinel.py).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import time
import uuid
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest
import redis

from schedproj.core.errors import ConfigurationError
from schedproj.core.records import LeaseView
from schedproj.devtools.processes import wait_for, wait_until
from schedproj.devtools.redis_cluster import LoopbackCluster
from schedproj.settings import Settings
from schedproj.store.connection import (
    cluster_key_prefix,
    connect,
    hash_tag,
    parse_cluster_url,
    redis_url_problem,
)
from schedproj.store.lane_store import LaneStore
from schedproj.store.lease import HeavyLease
from schedproj.store.protocol import Keys
from tests.conftest import E2E_REDIS_URL
from tests.procs import FAST_SETTINGS, Cluster

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None,
                                reason="needs the redis-server binary (scripts/setup.sh "
                                       "installs it)")

#: The e2e deployment's prefix: already tagged, so the lanes' own keys (tests/lanes_e2e.py
#: reads the variable as given) are the ones schedproj uses.
PREFIX = "{e2e}"
KEYS = Keys(PREFIX)


@pytest.fixture
def loopback_cluster(tmp_path: Path) -> Iterator[LoopbackCluster]:
    """A cluster of the test's own (its failover leaves a master gone)."""
    c = LoopbackCluster(tmp_path / "cluster")
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackCluster]:
    """One cluster for the tests that leave it whole (a graceful failover does: every slot
    still has a master and a replica), each under prefixes of its own."""
    c = LoopbackCluster(tmp_path_factory.mktemp("shared-cluster"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


# -- the URL and the prefix ---------------------------------------------------------------

def test_cluster_urls_parse_and_bad_ones_name_the_setting_and_the_fix() -> None:
    assert parse_cluster_url("redis+cluster://u:p@10.0.0.1:7000,10.0.0.2/0?ssl_ca_certs=ca") == \
        ([("10.0.0.1", 7000), ("10.0.0.2", 6379)], {"ssl_ca_certs": "ca"})
    assert redis_url_problem("rediss+cluster://clustercfg.example:6379") is None
    with pytest.raises(ConfigurationError) as err:
        Settings.load(redis_url="redis+cluster://u:secret@10.0.0.1:7000/2",
                      broker_url="redis://127.0.0.1:1/0")
    text = str(err.value)
    assert "SCHEDPROJ_REDIS_URL" in text and "database 0 only" in text and "Fix:" in text
    assert "secret" not in text
    with pytest.raises(ConfigurationError, match=r"SCHEDPROJ_REDIS_URL: cluster node address "
                                                 r"'h:x' is not host:port\. Fix:"):
        Settings.load(redis_url="redis+cluster://h:x", broker_url="redis://127.0.0.1:1/0")
    with pytest.raises(ConfigurationError, match=r"CELERY_BROKER_URL: .*cannot use a Redis "
                                                 r"Cluster.* Fix: point CELERY_BROKER_URL"):
        Settings.load(broker_url="redis+cluster://10.0.0.1:7000")
    with pytest.raises(ConfigurationError, match=r"SCHEDPROJ_REDIS_URL: scheme 'redis-cluster'.*"
                                                 r"redis\+cluster://"):
        Settings.load(redis_url="redis-cluster://10.0.0.1:7000")


def test_a_redis_py_without_cluster_transactions_is_refused_naming_the_fix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from schedproj.store import connection

    assert connection.cluster_client_problem("6.1.0") is None
    assert connection.cluster_client_problem("8.1.0") is None
    problem = connection.cluster_client_problem("5.0.0")
    assert problem is not None and "redis-py 5.0.0" in problem and "redis>=6.1" in problem
    monkeypatch.setattr(connection.redis, "__version__", "6.0.2")
    with pytest.raises(ConfigurationError, match=r"SCHEDPROJ_REDIS_URL: a Redis Cluster needs "
                                                 r"redis-py 6.1 or later.*Fix: pip install"):
        Settings.load(redis_url="redis+cluster://10.0.0.1:7000", broker_url="redis://h:1/0")
    assert connection.redis_url_problem("redis+sentinel://10.0.0.1/svc") is None  # others go


def test_the_prefix_carries_a_hash_tag_on_a_cluster_only() -> None:
    cluster = {"redis_url": "redis+cluster://10.0.0.1:7000", "broker_url": "redis://h:1/0"}
    assert Settings.load(**cluster).key_prefix == "{schedproj}"
    assert Settings.load(**cluster, key_prefix="app").key_prefix == "{app}"
    assert Settings.load(**cluster, key_prefix="acme:{app}").key_prefix == "acme:{app}"
    assert Settings.load(redis_url="redis://h:1/0", key_prefix="app").key_prefix == "app"
    with pytest.raises(ConfigurationError, match=r"SCHEDPROJ_KEY_PREFIX: .*no hash tag.* Fix: "
                                                 r"write it as \{name\}"):
        Settings.load(**cluster, key_prefix="app{}")
    # Redis hashes the text between the first { and the first } after it, if any.
    assert [hash_tag(p) for p in ("{a}", "x:{a}:y", "a{", "{}", "}{b}", "a")] == \
        ["a", "a", None, None, "b", None]
    assert cluster_key_prefix("app") == "{app}" and cluster_key_prefix("{app}") == "{app}"


#: Commands whose first argument (after the name) is a key, as the scripts use them.
_KEY_COMMANDS = {
    "GET", "SET", "DEL", "EXISTS", "INCR", "PEXPIRE", "PTTL", "TYPE", "HGET", "HSET", "HDEL",
    "HMGET", "HINCRBY", "ZADD", "ZREM", "ZSCORE", "ZRANGE", "ZRANGEBYSCORE", "ZCARD", "SADD",
    "SREM", "SMEMBERS", "LPUSH", "RPUSH", "LTRIM",
}


def test_every_lua_script_touches_only_the_keys_it_is_given() -> None:
    """Redis 7 does not make a script declare the keys it touches; on a cluster it refuses a
    key of a slot another node serves ("non local key") and, for scripts without a ``#!lua``
    line (ours), lets through a key of another slot on the same node, which breaks the day the
    slot moves. So no script may name a key itself: every key a command touches comes from
    ``KEYS`` (directly, or through a helper's parameter that is given a ``KEYS`` entry), and
    one deployment's keys share one hash tag, so all of them are in one slot."""
    # A command, whether called directly, through pcall or through tick_read's try().
    calls = re.compile(r"(?:redis\.p?call\(|\btry\(|pcall\(redis\.p?call,)\s*'(\w+)'\s*,"
                       r"\s*([^,)]+)")
    lua = resources.files("schedproj.store").joinpath("lua")
    checked = 0
    for script in sorted(p.name for p in lua.iterdir() if p.name.endswith(".lua")):
        text = lua.joinpath(script).read_text()
        # Helpers take keys as parameters: the names they are called with must be KEYS too.
        params = set()
        for match in re.finditer(r"local function \w+\(([^)]*)\)", text):
            params |= {p.strip() for p in match.group(1).split(",") if p.strip()}
        for command, first in calls.findall(text):
            if command.upper() not in _KEY_COMMANDS:
                continue
            first = first.strip()
            checked += 1
            assert first.startswith(("KEYS[", "unpack(KEYS")) or first in params - {"ARGV"}, \
                f"{script}: {command} {first}: a key not taken from KEYS"
        for helper_call in re.finditer(r"\b(due_ok|due_trusted|bump_due_stamp|epoch_refusal)"
                                       r"\(([^)]*)\)", text):
            if helper_call.group(0).startswith(("due_ok(due", "due_trusted(due",
                                                "bump_due_stamp(due", "epoch_refusal(key")):
                continue  # the definition
            for arg in helper_call.group(2).split(",")[:2]:  # (the third is a member)
                assert arg.strip().startswith("KEYS["), \
                    f"{script}: {helper_call.group(0)} is given a key not from KEYS"
    assert checked > 100  # the pattern still finds the scripts' commands


def test_an_unreachable_cluster_is_a_connection_error_said_in_one_line() -> None:
    """redis-py's cluster client connects when built, and its error is no RedisError: it is
    raised as a ConnectionError, so beat and workers wait for the cluster as for any Redis."""
    from schedproj.store.connection import describe_failure

    url = "redis+cluster://sched:secret@127.0.0.1:1"
    with pytest.raises(redis.ConnectionError) as err:
        connect(url)
    line, fatal = describe_failure(url, err.value, "SCHEDPROJ_REDIS_URL")
    assert not fatal and "secret" not in line
    assert line.startswith("Redis at redis+cluster://sched:***@127.0.0.1:1 "
                           "(SCHEDPROJ_REDIS_URL): ") and "127.0.0.1:1" in line


def test_what_redis_does_with_a_key_a_script_was_not_given(
        shared_cluster: LoopbackCluster) -> None:
    """Why the rule above: the facts docs/cluster.md states, as this Redis shows them. A key
    of the given key's slot passes undeclared; one of a slot another node serves is refused;
    one of another slot on the same node passes, unless the script has a ``#!lua`` line."""
    c = shared_cluster
    given = "{facts}:given"
    master = c.master_of(given)
    assert master is not None
    same_node = next(k for k in (f"{{k{i}}}" for i in range(10_000))
                     if c.master_of(k) == master and c.slot_of(k) != c.slot_of(given))
    other_node = next(k for k in (f"{{k{i}}}" for i in range(10_000))
                      if c.master_of(k) not in (master, None))

    def touch(key: str, shebang: bool = False) -> str:
        script = ("#!lua\n" if shebang else "") + f"redis.call('SET', '{key}', 1) return 'ok'"
        try:
            return str(c.command(master, "EVAL", script, 1, given))
        except redis.ResponseError as exc:
            return str(exc)

    assert touch("{facts}:undeclared") == "ok"
    assert "non local key" in touch(other_node)
    assert touch(same_node) == "ok"
    assert "do not hash to the same slot" in touch(same_node, shebang=True)


# -- the stores on a real cluster ---------------------------------------------------------

@pytest.mark.timeout(90)
@pytest.mark.parametrize("method", ["sigkill", "command"])
def test_failover_to_a_lagging_replica_quarantines_and_the_holder_reasserts(
        loopback_cluster: LoopbackCluster, method: str) -> None:
    c = loopback_cluster
    client = connect(c.url)
    keys = Keys(cluster_key_prefix(f"s-{uuid.uuid4().hex[:8]}"))
    store, lease = LaneStore(client, keys), HeavyLease(client, keys)
    assert store.declare_fresh()
    beat = uuid.uuid4().hex
    first = store.tick_snapshot(beat, 30.0, 5.0, cursor=None, now=time.time())
    assert first.lock.held and first.epoch.quarantine_left_s == 0
    assert not store.state_uncertain()
    master = c.master_of(keys.lease)
    replica = c.replica_of(master) if master else None
    assert master and replica, c.describe()
    # Every key of the deployment is on that one master: no other holds any.
    store.pause("a-lane")
    for port in c.ports:
        if port != master and port != replica:
            assert not c.client(port).keys(f"{keys.prefix}*"), port
    c.command(master, "WAIT", 1, 2000)  # the epoch is on the replica too
    # The replica lags: the master now asks for a password the replica does not have and
    # drops it, so it cannot resync; the grant lands on the master only; then it fails.
    c.lock_out_replica(master)
    now = time.time()
    grant = lease.acquire("summary", "holder-token", 30.0, now, task_id="t1", beat_token=beat)
    assert grant.granted
    if method == "sigkill":
        c.kill_node(master)
    else:  # the old master lives on and becomes the new one's replica
        c.command(replica, "CLUSTER", "FAILOVER", "FORCE")
    promoted = c.wait_promoted(master, keys.lease, 30)
    assert promoted == replica, c.describe()
    c.let_replicas_in(master)
    assert wait_until(lambda: _answers(client), 20)
    assert wait_until(lambda: lease.read() is None, 10), \
        "the promoted replica should lack the last grant"
    assert store.state_uncertain()
    after = store.tick_snapshot(beat, 30.0, 5.0, cursor=None, now=time.time())
    assert after.epoch.cause == "server-changed" and after.epoch.quarantine_left_s > 0
    refused = lease.acquire("dream", "other-token", 30.0, time.time(), task_id="t2",
                            beat_token=beat)
    assert not refused.granted and refused.quarantine_s is not None
    # The holder re-asserts its lease at its next renewal; no one else gets it.
    mine = LeaseView(lane="summary", token="holder-token", fence=grant.fence, granted_at=now,
                     started_at=now, task_id="t1")
    assert lease.renew("holder-token", 30.0, time.time(), 3600.0, reassert=mine) == \
        (True, "reasserted")
    current = lease.read()
    assert current is not None and current.token == "holder-token"
    assert current.fence == grant.fence


@pytest.mark.timeout(60)
def test_a_graceful_failover_loses_nothing_and_still_quarantines_once(
        shared_cluster: LoopbackCluster) -> None:
    """``CLUSTER FAILOVER`` (planned maintenance): the replica catches up first, so the
    lease survives and its holder just renews; the client follows the MOVED redirection; beat
    quarantines once all the same (another server process holds the state now)."""
    c = shared_cluster
    client = connect(c.url)
    keys = Keys(cluster_key_prefix(f"g-{uuid.uuid4().hex[:8]}"))
    store, lease = LaneStore(client, keys), HeavyLease(client, keys)
    assert store.declare_fresh()
    beat = uuid.uuid4().hex
    assert store.tick_snapshot(beat, 30.0, 5.0, cursor=None, now=time.time()).lock.held
    grant = lease.acquire("summary", "holder-token", 30.0, time.time(), task_id="t1",
                          beat_token=beat)
    assert grant.granted
    master = c.master_of(keys.lease)
    replica = c.replica_of(master) if master else None
    assert master and replica, c.describe()
    c.manual_failover(replica)
    assert c.wait_promoted(master, keys.lease, 30) == replica, c.describe()
    current = lease.read()  # through the old master's MOVED
    assert current is not None and current.fence == grant.fence
    assert lease.renew("holder-token", 30.0, time.time(), 3600.0) == (True, "")
    after = store.tick_snapshot(beat, 30.0, 5.0, cursor=None, now=time.time())
    assert after.lock.held and after.epoch.cause == "server-changed"
    assert after.epoch.quarantine_left_s > 0


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@pytest.mark.timeout(60)
def test_a_tls_cluster_is_reached_with_the_settings_ca_and_refused_without(
        tmp_path: Path) -> None:
    """``rediss+cluster://``: every node TLS-only (clients, replication, cluster bus); the
    CA from SCHEDPROJ_REDIS_SSL_CA_CERTS is trusted, and without it the failure is said in
    one line that names the fix and stops the process (retrying cannot cure it)."""
    from schedproj.store.connection import describe_failure
    from tests.tls_redis import make_certs

    certs = make_certs(tmp_path / "certs")
    c = LoopbackCluster(tmp_path / "cluster", tls=(certs.ca, certs.cert, certs.key))
    try:
        c.start()
        url = c.url.partition("?")[0]  # no ?ssl_ca_certs=: the setting names the CA
        assert url.startswith("rediss+cluster://")
        settings = Settings.load(redis_url=url, broker_url="redis://127.0.0.1:1/0",
                                 redis_ssl_ca_certs=str(certs.ca))
        client = connect(settings.state_redis_url, tls=settings.redis_tls)
        keys = Keys(settings.key_prefix)
        assert keys.prefix == "{schedproj}"
        store, lease = LaneStore(client, keys), HeavyLease(client, keys)
        assert store.declare_fresh()
        beat = uuid.uuid4().hex
        assert store.tick_snapshot(beat, 30.0, 5.0, cursor=None, now=time.time()).lock.held
        assert lease.acquire("summary", "token", 30.0, time.time(), beat_token=beat).granted
        with pytest.raises(redis.ConnectionError) as err:
            connect(url)  # the system's CAs do not know the test CA
        line, fatal = describe_failure(url, err.value, "SCHEDPROJ_REDIS_URL")
        assert fatal and "not trusted" in line and "Fix: set SCHEDPROJ_REDIS_SSL_CA_CERTS" in line
    finally:
        c.stop()


# -- real beat and workers on the cluster -------------------------------------------------

@pytest.fixture
def broker() -> Iterator[redis.Redis]:
    """The plain Redis the Celery broker stays on (its queues emptied first)."""
    client = redis.Redis.from_url(E2E_REDIS_URL, decode_responses=True,
                                  socket_connect_timeout=2)
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.skip(f"no Redis at {E2E_REDIS_URL} for the broker")
    client.flushdb()
    yield client
    client.close()


def processes(tmp_path: Path, c: LoopbackCluster, scenario: str, **extra: str) -> Cluster:
    env = dict(os.environ)
    env.update(FAST_SETTINGS)
    env.update({"CELERY_BROKER_URL": E2E_REDIS_URL, "SCHEDPROJ_REDIS_URL": c.url,
                "SCHEDPROJ_KEY_PREFIX": PREFIX, "E2E_SCENARIO": scenario,
                "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    env.update(extra)
    return Cluster(env=env, logdir=tmp_path)


def runs(state: redis.Redis) -> list[dict]:
    return [json.loads(x) for x in state.lrange(f"{PREFIX}:e2e:runs", 0, -1)]


def heavy_runs(state: redis.Redis) -> list[dict]:
    return sorted((x for x in runs(state) if x["fence"] > 0), key=lambda x: x["start"])


def assert_no_overlap(intervals: list[dict]) -> None:
    for before, after in itertools.pairwise(intervals):
        assert after["start"] >= before["end"], f"heavy runs overlap: {before} and {after}"
        assert after["fence"] > before["fence"], f"fence did not increase: {before} {after}"


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_fair_sharing_and_light_lanes_on_a_cluster(shared_cluster: LoopbackCluster,
                                                    broker: redis.Redis,
                                                    tmp_path: Path) -> None:
    """The end-to-end core on a cluster: a backlog lane yields at the hold cap, the starved
    lane wins next, heavy runs never overlap, the light lane keeps its cadence while heavy
    lanes hold the lease; all state is on the slot's master."""
    c = shared_cluster
    state = connect(c.url)
    state.set(f"{PREFIX}:e2e:backlog", 40)  # 40 items x 0.1 s = 4 s of heavy work, cap 1.5 s
    procs = processes(tmp_path, c, "fairness")
    try:
        procs.worker("heavy1", "heavy")
        procs.worker("light1", "light", concurrency=2)
        procs.beat("beat1")
        wait_for(lambda: int(state.get(f"{PREFIX}:e2e:backlog") or 0) <= 0, 40,
                 "backlog drained")
        time.sleep(1)
    finally:
        procs.stop_all()
    heavy = heavy_runs(state)
    assert_no_overlap(heavy)
    backlog = [x for x in heavy if x["lane"] == "e2e.backlog"]
    yielded = [x for x in backlog if x["left"] > 0]
    assert len(yielded) >= 2, f"the backlog lane should have yielded at the cap: {backlog}"
    for run in yielded:
        assert run["end"] - run["start"] < 1.5 + 0.6, run
    first_yield, last_yield = yielded[0]["start"], backlog[-1]["start"]
    assert any(x["lane"] == "e2e.starved" and first_yield < x["start"] < last_yield
               for x in heavy), f"e2e.starved never ran while the backlog drained: {heavy}"
    light = sorted((x for x in runs(state) if x["lane"] == "e2e.light"),
                   key=lambda x: x["start"])
    assert any(any(h["start"] < x["start"] < h["end"] for h in heavy) for x in light), \
        "no light run started while a heavy lane held the lease"
    gaps = [b["start"] - a["start"] for a, b in itertools.pairwise(light)]
    assert max(gaps) < 1.0 + 0.5 + 0.75, f"light lane delayed: gaps {gaps}"
    record = json.loads(state.hget(KEYS.lanes, "e2e.backlog|run"))
    assert record["runs"] >= 3 and record["fence"] > 0
    master = c.master_of(KEYS.lanes)
    for port in c.ports:
        found = c.client(port).keys(f"{PREFIX}*")
        if port == master:
            assert KEYS.lanes in found and KEYS.epoch in found
        elif port != c.replica_of(master or 0):
            assert not found, f"{port} holds keys of the deployment: {found}"


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_failover_of_the_slots_master_under_a_running_heavy_lane(
        loopback_cluster: LoopbackCluster, broker: redis.Redis, tmp_path: Path) -> None:
    """Real beat and workers while the master holding the deployment's slot is SIGKILLed and
    its replica, which missed everything since the processes started (the grant, the start,
    the lane records), is promoted: beat quarantines (the server changed), the running heavy holder
    re-asserts its lease, no second heavy run starts over it, and the lanes run again after
    the quarantine."""
    c = loopback_cluster
    state = connect(c.url)
    assert LaneStore(state, KEYS).declare_fresh()
    master = c.master_of(KEYS.lease)
    replica = c.replica_of(master) if master else None
    assert master and replica, c.describe()
    c.command(master, "WAIT", 1, 2000)  # the epoch is on the replica too
    # The processes log in as a user of their own and know the cluster by one other master,
    # as by a managed service's configuration endpoint.
    c.add_user("app", "app-password")
    endpoint = next(p for p in c.ports if p not in (master, replica))
    # From now on the replica receives nothing: every write lands on the master only.
    c.lock_out_replica(master)
    # Renewals every 5 s: the first after the kill (4.5 s after it) lands once a failover of
    # up to about 4 s is over, and the holder, which yields only after 10 s without a renewal,
    # runs its 8 s through. (At 9 s, renewals every 3 s, a failover slowed past 2.5 s by a
    # loaded CI machine made the holder yield: two renewals missed.) A quarantine shorter than
    # the default 12 s (still past the next renewal) keeps this short.
    procs = processes(tmp_path, c, "slow",
                      SCHEDPROJ_REDIS_URL=c.url_of(endpoint, user=("app", "app-password")),
                      SCHEDPROJ_HOLD_CAP_S="60", SCHEDPROJ_LEASE_TTL_S="15",
                      SCHEDPROJ_STATE_LOSS_QUARANTINE_S="7")
    try:
        worker = procs.worker("heavy1", "heavy")
        procs.worker("light1", "light")
        beat = procs.beat("beat1")
        started = f"{PREFIX}:e2e:started"
        wait_for(lambda: state.llen(started) >= 1, 20, "e2e.long started")
        running = json.loads(str(state.lindex(started, -1)))
        time.sleep(0.5)
        c.kill_node(master)
        killed_at = time.time()
        assert c.wait_promoted(master, KEYS.lease, 30) == replica, c.describe()
        promoted_s = time.time() - killed_at
        wait_for(lambda: "re-asserted it" in worker.text(), 15,
                 "the heavy holder re-asserts its lease")
        wait_for(lambda: "another server process" in beat.text(), 15,
                 "beat sees the new server and quarantines")
        wait_for(lambda: any(x["fence"] > running["fence"] for x in starts(state)), 30,
                 "the heavy lane starts again")
        wait_for(lambda: any(x["lane"] == "e2e.pulse" and x["start"] > killed_at
                             for x in runs(state)), 10, "the light lane runs again")
    finally:
        procs.stop_all()
    assert promoted_s < 10, promoted_s
    held = [x for x in heavy_runs(state) if x["fence"] == running["fence"]]
    assert held and held[0]["end"] - held[0]["start"] > 7, \
        f"the run that held the lease across the failover should have run on: {held}"
    assert "heavy lease lost" not in worker.text()
    # Nothing heavy started before the holder ended, and nothing without a newer fence.
    later = [x for x in starts(state) if x["start"] > running["start"]]
    assert later and all(x["start"] >= held[0]["end"] and x["fence"] > running["fence"]
                         for x in later), (held, later)


def starts(state: redis.Redis) -> list[dict]:
    """The e2e.long starts the state Redis holds (those before a failover may be lost)."""
    return [json.loads(x) for x in state.lrange(f"{PREFIX}:e2e:started", 0, -1)]


# -- more of the end-to-end core on a cluster (slow: the default run has the two above) -----

@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_second_beat_stands_by_then_takes_over_on_a_cluster(
        loopback_cluster: LoopbackCluster, broker: redis.Redis, tmp_path: Path) -> None:
    c = loopback_cluster
    state = connect(c.url)
    assert LaneStore(state, KEYS).declare_fresh()
    procs = processes(tmp_path, c, "fairness")
    try:
        procs.worker("light1", "light")
        procs.worker("heavy1", "heavy")
        first = procs.beat("beat1")
        second = procs.beat("beat2", wait_active=False)
        time.sleep(4)
        assert ": active" not in second.text()
        assert "dispatch:" not in second.text(), "the standby beat dispatched"
        assert "dispatch:" in first.text()
        first.signal(signal.SIGKILL)
        killed_at = time.time()
        wait_for(lambda: ": active" in second.text(), 10, "standby beat takes over")
        assert time.time() - killed_at < 3 + 2, "takeover slower than the 3 s lock TTL allows"
        wait_for(lambda: any(x["lane"] == "e2e.light" and x["start"] > killed_at + 1
                             for x in runs(state)), 10, "light lane runs again after takeover")
    finally:
        procs.stop_all()
    assert_no_overlap(heavy_runs(state))


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_killed_heavy_worker_frees_the_lease_on_a_cluster(
        loopback_cluster: LoopbackCluster, broker: redis.Redis, tmp_path: Path) -> None:
    c = loopback_cluster
    state = connect(c.url)
    assert LaneStore(state, KEYS).declare_fresh()
    procs = processes(tmp_path, c, "slow", SCHEDPROJ_HOLD_CAP_S="60")
    try:
        victim = procs.worker("heavy1", "heavy")
        procs.beat("beat1")
        wait_for(lambda: state.llen(f"{PREFIX}:e2e:started") >= 1, 20, "e2e.long started")
        first = starts(state)[0]
        victim.signal(signal.SIGKILL)
        killed_at = time.time()
        wait_for(lambda: not state.exists(KEYS.lease)
                 or json.loads(str(state.get(KEYS.lease) or "{}")).get("fence", 0)
                 > first["fence"], 2 + 1.5, "the dead worker's lease to free itself")
        assert time.time() - killed_at <= 2 + 1.0
        procs.worker("heavy2", "heavy")
        wait_for(lambda: len(starts(state)) >= 2, 20, "the lane runs again on a live worker")
    finally:
        procs.stop_all()
    assert starts(state)[1]["fence"] > first["fence"]


def test_a_read_and_a_heal_by_pages_run_on_a_cluster(shared_cluster: LoopbackCluster) -> None:
    """The paged scripts (tick_page.lua, heal_page.lua) take every key from KEYS: on a
    cluster the pages read what one call reads, and a heal by pages leaves stamps that agree."""
    from schedproj.store.families import FamilyStore
    from tests.store.test_paged_read import PAGE, at_most_a_page, comparable, lay_out

    client = connect(shared_cluster.url)
    now = time.time()
    laid = [Keys(cluster_key_prefix(f"p-{uuid.uuid4().hex[:8]}")) for _ in range(2)]
    for keys in laid:
        assert LaneStore(client, keys).declare_fresh()
        lay_out(client, keys, now)
    whole, paged = LaneStore(client, laid[0]), LaneStore(client, laid[1], read_page=PAGE)
    beat = uuid.uuid4().hex
    # The due checks' stamps ride with the read (in its pipeline, then after the last page):
    # under the prefix, so in the script's slot.
    stamps = [f"{keys.prefix}:app:stamp" for keys in laid]
    for n, stamp in enumerate(stamps):
        client.set(stamp, f"stamp {n}")
    # So do the pool slots' leases beat compares with its read of the slots (before it).
    slots = [laid[1].slot("gpu", i).lease for i in range(2)]
    client.set(slots[0], "a slot's lease")
    one = whole.tick_snapshot(beat, 30.0, 0.0, cursor=None, now=now, also_get=stamps[:1])
    by_pages = paged.tick_snapshot(beat, 30.0, 0.0, cursor=None, now=now,
                                   also_get=stamps[1:], watch=slots)
    assert len(paged.read_pages) >= 4 and at_most_a_page(paged.read_pages)
    assert comparable(by_pages, laid[1]) == comparable(one, laid[0])
    assert (one.got, by_pages.got) == ({stamps[0]: "stamp 0"}, {stamps[1]: "stamp 1"})
    assert by_pages.watched == {slots[0]: "a slot's lease", slots[1]: None}
    FamilyStore(client, laid[1]).add("fam", [f"m{i}" for i in range(3 * PAGE)])
    assert paged.heal_derived(beat, [], rescore=True)
    assert len(paged.heal_pages) >= 3 and at_most_a_page(paged.heal_pages[1:])
    healed = paged.tick_snapshot(beat, 30.0, 0.0, cursor=None, now=now)
    assert healed.broken == {} and {f"fam[m{i}]" for i in range(3 * PAGE)} <= set(healed.looked)
