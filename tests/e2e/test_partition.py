"""A network partition between "hosts" (network namespaces): the cut-off holder is fenced.

A heavy worker in its own namespace holds the lease and is cut off from Redis; the lease
passes to a worker on the other side after its TTL; when the cut heals, the cut-off worker's
late writes carry an old fencing number and are refused. Runs as root where ``ip netns``
works (CI here); skips cleanly elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from schedproj.chaos.audit import FencedLedger
from schedproj.devtools.redis_server import RedisServer
from schedproj.store.protocol import Keys
from tests.procs import FAST_SETTINGS, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]
ROOT = Path(__file__).resolve().parents[2]
PREFIX = "part"


def run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def netns_available() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("redis-server") is None:
        return False
    name = f"spchk{uuid.uuid4().hex[:6]}"
    try:
        run("ip", "netns", "add", name)
        run("ip", "netns", "del", name)
        return True
    except (subprocess.CalledProcessError, OSError):
        return False


@pytest.fixture
def host_a(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """A namespace "host A" linked to this host by a veth pair: (netns, our side, its IP)."""
    if not netns_available():
        pytest.skip("network namespaces need root and iproute2")
    tag = uuid.uuid4().hex[:5]
    ns, here, there = f"spa{tag}", f"spa{tag}h", f"spa{tag}n"
    octet = int(tag[:2], 16) % 250 + 1
    ip_here, ip_there = f"10.231.{octet}.1", f"10.231.{octet}.2"
    run("ip", "netns", "add", ns)
    try:
        run("ip", "link", "add", here, "type", "veth", "peer", "name", there)
        run("ip", "link", "set", there, "netns", ns)
        run("ip", "addr", "add", f"{ip_here}/30", "dev", here)
        run("ip", "link", "set", here, "up")
        run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ip_there}/30", "dev", there)
        run("ip", "netns", "exec", ns, "ip", "link", "set", there, "up")
        run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield ns, here, ip_here
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_partitioned_holder_is_fenced_when_the_cut_heals(host_a: tuple[str, str, str],
                                                         tmp_path: Path) -> None:
    ns, link, ip_here = host_a
    server = RedisServer(tmp_path, "redis")
    _start_redis(server, ip_here)
    local_url = f"redis://127.0.0.1:{server.port}/0"
    remote_url = f"redis://{ip_here}:{server.port}/0"
    base = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDPROJ_")}
    base.update(FAST_SETTINGS)
    base.update({"SCHEDPROJ_KEY_PREFIX": PREFIX, "E2E_SCENARIO": "partition",
                 "PYTHONPATH": str(ROOT), "SCHEDPROJ_HOLD_CAP_S": "60"})
    env_a = {**base, "CELERY_BROKER_URL": remote_url, "SCHEDPROJ_REDIS_URL": remote_url}
    env_b = {**base, "CELERY_BROKER_URL": local_url, "SCHEDPROJ_REDIS_URL": local_url}
    r = redis.Redis.from_url(local_url, decode_responses=True)
    procs: list[subprocess.Popen[bytes]] = []

    def start(env: dict[str, str], name: str, *args: str, netns: str | None = None) -> None:
        prefix = ["ip", "netns", "exec", netns] if netns else []
        log = (tmp_path / f"{name}.log").open("wb")
        procs.append(subprocess.Popen(
            [*prefix, sys.executable, "-m", "celery", "-A", "schedproj.app", *args],
            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    keys = Keys(PREFIX)
    try:
        start(env_a, "heavyA", "worker", "-Q", "heavy", "-c", "1", "-n", "heavyA@%h",
              "--without-gossip", "--without-mingle", "-l", "info", netns=ns)
        start(env_b, "beat", "beat", "-S", "fair", "-l", "info")
        wait_for(lambda: r.get(keys.lease) and json.loads(r.get(keys.lease)).get("started_at"),
                 40, "host A's worker to start the lane under the lease")
        fence_a = json.loads(r.get(keys.lease))["fence"]
        start(env_b, "heavyB", "worker", "-Q", "heavy", "-c", "1", "-n", "heavyB@%h",
              "--without-gossip", "--without-mingle", "-l", "info")
        wait_for(lambda: any(e["fence"] == fence_a for e in FencedLedger(r, PREFIX).entries()),
                 10, "host A writing under its fence")

        run("ip", "link", "set", link, "down")  # the cut
        cut_at = time.time()
        wait_for(lambda: (raw := r.get(keys.lease)) is not None
                 and json.loads(raw)["fence"] > fence_a, 2 + 10,
                 "the lease to pass to host B after its TTL")
        moved_s = time.time() - cut_at
        wait_for(lambda: any(e["fence"] > fence_a for e in FencedLedger(r, PREFIX).entries()),
                 15, "host B writing under the newer fence")
        run("ip", "link", "set", link, "up")  # the cut heals
        ledger = FencedLedger(r, PREFIX)
        wait_for(lambda: ledger.refused() >= 1, 30,
                 "host A's late write to be refused by its old fence")
        monotone, entries = ledger.monotone(), ledger.entries()
        journal = [json.loads(x) for x in r.lrange(keys.journal, 0, -1)]
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        server.kill()

    assert moved_s < 2 + 8, f"the lease took {moved_s:.1f}s to move"
    assert monotone, "a write with an older fence landed after a newer one"
    first_newer = next(i for i, e in enumerate(entries) if e["fence"] > fence_a)
    assert all(e["fence"] > fence_a for e in entries[first_newer:]), \
        "host A wrote with its old fence after host B took over"
    ended_a = [e for e in journal if e["ev"] == "end" and e["fence"] == fence_a]
    assert not ended_a or ended_a[0]["lost"], "host A's run ended without knowing it lost"


def _start_redis(server: RedisServer, ip: str) -> None:
    server.proc = subprocess.Popen(
        [server.binary, "--port", str(server.port), "--bind", "127.0.0.1", ip,
         "--protected-mode", "no", "--save", "", "--appendonly", "no", "--dir",
         str(server.dir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: _ping(f"redis://127.0.0.1:{server.port}/0"), 10, "redis to start")


def _ping(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.2).ping())
    except redis.RedisError:
        return False

