"""``schedproj clear-lease`` never frees a lease whose holder may still execute (issue 19: 1).

The workers are a fake ``app.control`` here (which nodes answer, what they run); the command
and the lease are real. ``tests/e2e/test_clear_lease_live.py`` runs it against real workers.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from schedproj.core import codec
from schedproj.core.laneset import REGISTRY_VERSION
from schedproj.ops import cli
from schedproj.store.lease import HeavyLease, Holder
from schedproj.store.protocol import Keys
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.timeout(60)

HOLDER_NODE = "heavyS@box"
LIGHT_NODE = "light1@box"


class FakeInspect:
    def __init__(self, runs: dict[str, list[str]], destination: list[str] | None) -> None:
        self.runs, self.destination = runs, destination

    def _reply(self, tasks: bool) -> dict[str, list[dict[str, Any]]] | None:
        reply = {node: [{"id": t} for t in ids] if tasks else []
                 for node, ids in self.runs.items()
                 if self.destination is None or node in self.destination}
        return reply or None

    def active(self) -> dict[str, list[dict[str, Any]]] | None:
        return self._reply(tasks=True)

    def reserved(self) -> dict[str, list[dict[str, Any]]] | None:
        return self._reply(tasks=False)


class FakeControl:
    """Nodes that answer (``runs``: node -> task ids it runs); others stay silent."""

    def __init__(self, runs: dict[str, list[str]]) -> None:
        self.runs = runs
        self.revoked: list[dict[str, Any]] = []

    def inspect(self, destination: list[str] | None = None, timeout: float = 1.0) -> FakeInspect:
        return FakeInspect(self.runs, destination)

    def revoke(self, task_id: str, **kw: Any) -> list[dict[str, Any]]:
        self.revoked.append({"task_id": task_id, **kw})
        return [{n: {"ok": f"tasks flagged as revoked: {task_id}"}}
                for n in kw["destination"] if n in self.runs]


@pytest.fixture
def env(key_prefix: str) -> dict[str, str]:
    return {"SCHEDPROJ_REDIS_URL": REDIS_URL, "CELERY_BROKER_URL": REDIS_URL,
            "SCHEDPROJ_KEY_PREFIX": key_prefix}


def clear_lease(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], control: FakeControl,
                *args: str) -> Result:
    monkeypatch.setattr(cli, "_load_app", lambda *a: SimpleNamespace(control=control))
    return CliRunner().invoke(cli.main, ["clear-lease", "--timeout", "0.2", *args], env=env)


def held(client: redis.Redis, keys: Keys, *, started: bool = True, ttl_s: float = 30) -> Any:
    lease = HeavyLease(client, keys)
    assert lease.acquire("big", "tok", ttl_s, time.time(), task_id="run-1").granted
    if started:
        assert lease.start("tok", ttl_s, time.time(),
                           holder=Holder(host="box", pid=1, node=f"{HOLDER_NODE}#b#1"))[0]
    current = lease.read()
    assert current is not None
    return lease


def test_a_silent_holder_node_is_never_cut_off_even_when_others_answer(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], client: redis.Redis,
        keys: Keys) -> None:
    """The finding: a busy -P solo holder cannot answer; the light worker did, and the lease
    was released while the holder ran."""
    lease = held(client, keys)
    out = clear_lease(monkeypatch, env, FakeControl({LIGHT_NODE: []}))
    assert out.exit_code != 0, out.output
    assert HOLDER_NODE in out.output and "--stop" in out.output and "--terminate" in out.output
    current = lease.read()
    assert current is not None and current.token == "tok", "the lease was cleared"


def test_a_holder_node_that_runs_it_is_refused(monkeypatch: pytest.MonkeyPatch,
                                               env: dict[str, str], client: redis.Redis,
                                               keys: Keys) -> None:
    lease = held(client, keys)
    out = clear_lease(monkeypatch, env, FakeControl({HOLDER_NODE: ["run-1"]}))
    assert out.exit_code != 0 and "is running the holder" in out.output
    assert lease.read() is not None


def test_cleared_when_the_holder_node_says_it_no_longer_runs_it(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], client: redis.Redis,
        keys: Keys) -> None:
    lease = held(client, keys)
    out = clear_lease(monkeypatch, env, FakeControl({HOLDER_NODE: ["other"], LIGHT_NODE: []}))
    assert out.exit_code == 0 and "cleared the lease held by big" in out.output, out.output
    assert lease.read() is None
    request = lease.request()
    assert request is not None and (request.action, request.task_id) == ("clear", "run-1")


def test_an_unstarted_grant_is_cleared_without_asking_anyone(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], client: redis.Redis,
        keys: Keys) -> None:
    lease = held(client, keys, started=False)
    out = clear_lease(monkeypatch, env, FakeControl({}))
    assert out.exit_code == 0 and "had not started" in out.output, out.output
    assert lease.read() is None
    assert lease.start("tok", 30, time.time()) == (False, "gone")


def test_stop_asks_the_holder_and_waits_until_it_let_go(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], client: redis.Redis,
        keys: Keys) -> None:
    lease = held(client, keys)

    def holder_yields() -> None:  # what the holder's renewal and end do (see keepalive.py)
        deadline = time.time() + 10
        while time.time() < deadline:
            request = lease.request()
            if request is not None and request.action == "stop":
                time.sleep(0.5)
                lease.release("tok")
                return
            time.sleep(0.05)

    thread = threading.Thread(target=holder_yields)
    thread.start()
    out = clear_lease(monkeypatch, env, FakeControl({}), "--stop", "--wait", "10")
    thread.join()
    assert out.exit_code == 0 and "yielded" in out.output, out.output


def test_stop_that_is_not_heeded_in_time_says_so_and_leaves_the_lease(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], client: redis.Redis,
        keys: Keys) -> None:
    lease = held(client, keys)
    out = clear_lease(monkeypatch, env, FakeControl({}), "--stop", "--wait", "0.5")
    assert out.exit_code != 0 and "still holds the lease" in out.output
    assert lease.read() is not None


def test_terminate_unconfirmed_by_the_holder_node_clears_nothing(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], client: redis.Redis,
        keys: Keys) -> None:
    lease = held(client, keys)
    control = FakeControl({LIGHT_NODE: []})
    out = clear_lease(monkeypatch, env, control, "--terminate", "--wait", "5")
    assert out.exit_code != 0 and "did not confirm" in out.output, out.output
    assert control.revoked[0]["destination"] == [HOLDER_NODE]
    assert lease.read() is not None


def test_terminate_confirmed_waits_for_the_lease_to_expire_never_releases_it(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], client: redis.Redis,
        keys: Keys) -> None:
    held(client, keys, ttl_s=1.0)  # nobody renews it: it expires as a killed holder's does
    control = FakeControl({HOLDER_NODE: ["run-1"]})
    began = time.monotonic()
    out = clear_lease(monkeypatch, env, control, "--terminate", "--wait", "10")
    assert out.exit_code == 0 and "expired" in out.output, out.output
    assert time.monotonic() - began >= 0.5, "released before its TTL ran out"
    (revoke,) = control.revoked
    assert revoke["terminate"] is True and revoke["task_id"] == "run-1"


def declare_gpu(client: redis.Redis, keys: Keys) -> None:
    """What a beat with a pool ``gpu`` of two slots publishes (the pools of its registry)."""
    client.set(keys.published_lanes, codec.dumps(
        {"profile": "local", "lanes": [], "families": [], "pools": {"gpu": 2, "heavy": 1}},
        REGISTRY_VERSION))


def test_a_slot_of_a_pool_is_cleared_by_the_same_rules_and_nothing_else_is(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], client: redis.Redis,
        keys: Keys) -> None:
    declare_gpu(client, keys)
    heavy = held(client, keys)
    slot = held(client, keys.slot("gpu", 1))
    other = held(client, keys.slot("gpu", 0))
    # Its node is silent: refused, and the ways on name the slot.
    out = clear_lease(monkeypatch, env, FakeControl({LIGHT_NODE: []}), "--pool", "gpu",
                      "--slot", "1")
    assert out.exit_code != 0, out.output
    assert "holds slot 1 of pool gpu" in out.output, out.output
    assert "clear-lease --pool gpu --slot 1 --stop" in out.output.replace("\n", " ")
    # Its node says it no longer runs it: that slot alone is cleared.
    out = clear_lease(monkeypatch, env, FakeControl({HOLDER_NODE: []}), "--pool", "gpu",
                      "--slot", "1")
    assert out.exit_code == 0 and "cleared slot 1 of pool gpu held by big" in out.output, \
        out.output
    assert slot.read() is None and other.read() is not None and heavy.read() is not None
    request = slot.request()
    assert request is not None and (request.action, request.task_id) == ("clear", "run-1")
    assert heavy.request() is None
    out = clear_lease(monkeypatch, env, FakeControl({}), "--pool", "gpu", "--slot", "1")
    assert out.exit_code == 0 and "slot 1 of pool gpu is free" in out.output


def test_an_unknown_pool_or_a_slot_out_of_range_names_the_declared_pools_and_the_fix(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], client: redis.Redis,
        keys: Keys) -> None:
    declare_gpu(client, keys)
    out = clear_lease(monkeypatch, env, FakeControl({}), "--pool", "tpu")
    assert out.exit_code != 0
    assert "--pool tpu: no such pool; the last beat declared heavy (1 slot), gpu (2 slots)" \
        in " ".join(out.output.split()), out.output
    assert "SCHEDPROJ_POOLS='tpu=2'" in out.output
    out = clear_lease(monkeypatch, env, FakeControl({}), "--pool", "gpu", "--slot", "2")
    assert out.exit_code != 0
    assert "pool gpu has 2 slots (0 to 1)" in out.output and "Fix: --slot 0 to 1" in out.output
    out = clear_lease(monkeypatch, env, FakeControl({}), "--slot", "1")
    assert out.exit_code != 0 and "pool heavy has 1 slot (0 to 0)" in out.output


@pytest.mark.parametrize(("pool", "slot"), [("gpu", "2"), ("tpu", "0")])
def test_a_held_slot_past_a_shrunk_or_removed_pool_can_be_cleared(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], client: redis.Redis, keys: Keys,
        pool: str, slot: str) -> None:
    """gpu was 3 slots (now 2), tpu was removed; a run still holds gpu slot 2 (tpu slot 0).
    Beat still counts it, and its holder may hang: refused as out of range, it could not be
    cleared (nor stopped, nor terminated) except by stopping its worker."""
    declare_gpu(client, keys)
    lease = held(client, keys.slot(pool, int(slot)))
    out = clear_lease(monkeypatch, env, FakeControl({HOLDER_NODE: []}), "--pool", pool,
                      "--slot", slot)
    assert out.exit_code == 0, out.output
    assert f"cleared slot {slot} of pool {pool} held by big" in out.output, out.output
    assert lease.read() is None
