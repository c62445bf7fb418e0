"""Redis Sentinel for state and lease, with a real set on loopback: one master, one replica,
three sentinels (``redis-server CONF --sentinel``). A failover to a replica that lacks the last
writes (it is locked out of resyncing, then the master is SIGKILLed or ``SENTINEL FAILOVER``
is sent) loses the lease key; the new master is another server process, so the epoch starts a
quarantine, no lease is granted, and the holder re-asserts its lease by token and fence."""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from schedproj.core.records import LeaseView
from schedproj.devtools.processes import wait_until
from schedproj.devtools.sentinel import SentinelSet
from schedproj.store.connection import connect, parse_sentinel_url
from schedproj.store.lane_store import LaneStore
from schedproj.store.lease import HeavyLease
from schedproj.store.protocol import Keys

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None,
                                reason="needs the redis-server binary (scripts/setup.sh "
                                       "installs it)")


@pytest.fixture
def sentinel_set(tmp_path: Path) -> Iterator[SentinelSet]:
    s = SentinelSet(tmp_path)
    try:
        s.start()
        yield s
    finally:
        s.stop()


def test_sentinel_urls_parse_and_bad_ones_name_the_fix() -> None:
    hosts, service, db, options = parse_sentinel_url(
        "redis+sentinel://u:p@10.0.0.1:26380,10.0.0.2/mymaster/2?sentinel_password=s")
    assert hosts == [("10.0.0.1", 26380), ("10.0.0.2", 26379)]
    assert (service, db, options) == ("mymaster", 2, {"sentinel_password": "s"})
    from schedproj.core.errors import ConfigurationError
    with pytest.raises(ConfigurationError, match="names the sentinels and the service"):
        parse_sentinel_url("redis+sentinel://u:secret@10.0.0.1:26379")
    with pytest.raises(ConfigurationError) as err:
        parse_sentinel_url("redis+sentinel://u:secret@10.0.0.1:x/svc")
    assert "secret" not in str(err.value)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["sigkill", "command"])
def test_failover_to_a_lagging_replica_quarantines_and_the_holder_reasserts(
        sentinel_set: SentinelSet, method: str) -> None:
    client = connect(sentinel_set.url)
    keys = Keys(f"s-{uuid.uuid4().hex[:8]}")
    store, lease = LaneStore(client, keys), HeavyLease(client, keys)
    assert store.declare_fresh()
    beat = uuid.uuid4().hex
    first = store.snapshot(beat, 30.0, quarantine_s=5.0)
    assert first.lock.held and first.epoch.quarantine_left_s == 0
    client.execute_command("WAIT", 1, 2000)  # the epoch is on the replica too
    # The replica lags: the master now asks for a password the replica does not have and
    # drops it, so it cannot resync; the grant lands on the master only; the master dies.
    master = sentinel_set.lag_replica()
    now = time.time()
    grant = lease.acquire("summary", "holder-token", 30.0, now, task_id="t1", beat_token=beat)
    assert grant.granted
    if method == "sigkill":
        assert sentinel_set.kill_master() == master
    else:  # SENTINEL FAILOVER: the old master lives on, locked, until it rejoins
        assert sentinel_set.command_failover() == master
    # The sentinels promote the replica; the client follows it.
    assert sentinel_set.wait_promoted(master, 60)
    assert wait_until(lambda: _answers(client), 20)
    assert wait_until(lambda: lease.read() is None, 10), \
        "the promoted replica should lack the last grant"
    sentinel_set.rejoin(master)
    after = store.snapshot(beat, 30.0, quarantine_s=5.0)
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


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
