"""Lane families (issue 11) in-process against real Redis: declaration, member keys, the
family API and CLI, beat dispatching members, removal, the members hook, status and metrics."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
import redis
from celery import Celery
from click.testing import CliRunner

from schedproj import Gate, GateCondition, Lane, LaneKind, LaneTask, Settings
from schedproj.core.errors import LaneDeclarationError
from schedproj.core.families import (
    KEY_MAX_LEN,
    FamilyError,
    LaneFamily,
    check_key,
    jitter_unit,
    member_lane,
)
from schedproj.core.records import Outcome, RunRecord
from schedproj.on_celery.beat import FairScheduler
from schedproj.ops.cli import main
from schedproj.store.families import FamilyStore
from schedproj.store.protocol import Keys
from schedproj.telemetry.metrics import SchedprojCollector
from schedproj.telemetry.observe import observe
from tests.conftest import REDIS_URL, make_app, sent

FAMILY = "f.repo-sync"


def build(prefix: str, declare: Callable[[Celery], None], **over: object) -> Celery:
    return make_app(prefix, declare, **{"beat_max_loop_interval_s": 0.2, "beat_lock_ttl_s": 1.0,
                                        "start_deadline_s": 5.0, **over})


def family_and_lanes(app: Celery, members: object = None) -> None:
    @app.task(shared=False, base=LaneTask, name=FAMILY,
              lane=LaneFamily(cadence_s=1800, kind=LaneKind.HEAVY, jitter=0.2, order=5,
                              members=members, members_sync_s=60))
    def repo_sync(key: str) -> None: ...

    @app.task(shared=False, base=LaneTask, name="f.plain",
              lane=Lane(cadence_s=60, kind=LaneKind.HEAVY, order=1))
    def plain() -> None: ...

    @app.task(shared=False, base=LaneTask, name="f.report",
              lane=Lane(cadence_s=60, kind=LaneKind.LIGHT,
                        gates=(Gate(FAMILY, when=GateCondition.DUE_AND_BEHIND),)))
    def report() -> None: ...


def finish_run(sched: FairScheduler, client: redis.Redis, keys: Keys) -> None:
    """The lease holder's run ends as a worker ends it (``run_finish.lua``)."""
    lease = json.loads(client.get(keys.lease))
    now = time.time()
    sched.rt.store.finish(lease["lane"], RunRecord(last_run_at=now, runs=1,
                                                   last_outcome=Outcome.COMPLETED),
                          token=lease["token"], fence=lease["fence"], wake_message="done",
                          due_at=now + 1800, member="[" in lease["lane"])


# -- declarations and keys ----------------------------------------------------------------------

@pytest.mark.parametrize(("key", "says"), [
    ("", "empty"), ("a" * (KEY_MAX_LEN + 1), "characters long"), ("a b", "' '"),
    ("a|b", "'|'"), ("x[1]", "'[]'"), (7, "not text"),
])
def test_a_bad_member_key_is_a_clear_error(key: object, says: str) -> None:
    with pytest.raises(FamilyError) as err:
        check_key(FAMILY, key)
    text = str(err.value)
    assert FAMILY in text and says in text and "Fix:" in text


def test_good_keys_and_deterministic_jitter() -> None:
    assert check_key(FAMILY, "org/repo-1.x:main@v2") == "org/repo-1.x:main@v2"
    assert jitter_unit(FAMILY, "a") == jitter_unit(FAMILY, "a") != jitter_unit(FAMILY, "b")
    assert 0 <= jitter_unit(FAMILY, "a") < 1


@pytest.mark.parametrize(("lane", "says"), [
    (LaneFamily(cadence_s=60, jitter=0.9), "jitter"),
    (LaneFamily(cadence_s=60, priority0=True), "priority0"),
])
def test_a_bad_family_declaration_names_the_family(lane: LaneFamily, says: str) -> None:
    with pytest.raises(FamilyError, match=says):
        lane.check("fam")


def test_a_gate_may_name_a_family_or_member_but_not_an_unknown_family(key_prefix: str) -> None:
    def declare(app: Celery) -> None:
        family_and_lanes(app)

        @app.task(shared=False, base=LaneTask, name="f.other",
                  lane=Lane(cadence_s=60, kind=LaneKind.LIGHT,
                            gates=(Gate(member_lane(FAMILY, "a")),)))
        def other() -> None: ...

    from schedproj.on_celery.config import lane_set_for
    lanes = lane_set_for(build(key_prefix, declare))
    assert set(lanes.families) == {FAMILY}
    assert lanes.spec(member_lane(FAMILY, "a")).family == FAMILY

    def bad(app: Celery) -> None:
        @app.task(shared=False, base=LaneTask, name="f.bad",
                  lane=Lane(cadence_s=60, gates=(Gate("nope[a]"),)))
        def f() -> None: ...

    with pytest.raises(LaneDeclarationError, match="unknown lane 'nope\\[a\\]'"):
        lane_set_for(build(key_prefix, bad))


# -- the family API -------------------------------------------------------------------------------

def test_add_remove_list_and_state_cleanup(redis_client: redis.Redis, keys: Keys) -> None:
    store = FamilyStore(redis_client, keys, [FAMILY])
    assert store.add(FAMILY, ["b", "a", "a"]) == 2
    assert store.add(FAMILY, ["a"]) == 0
    assert store.members(FAMILY) == ["a", "b"]
    lane = member_lane(FAMILY, "a")
    assert redis_client.zscore(keys.due, lane) == 0.0
    redis_client.hset(keys.lanes, f"{lane}|run", "{}")
    redis_client.sadd(keys.paused, lane)
    assert store.remove(FAMILY, ["a", "zzz"]) == 1
    assert store.members(FAMILY) == ["b"]
    assert not redis_client.hexists(keys.lanes, f"{lane}|run")
    assert redis_client.zscore(keys.due, lane) is None
    assert not redis_client.sismember(keys.paused, lane)
    with pytest.raises(FamilyError, match=r"no such lane family.*f\.repo-sync"):
        store.add("f.nope", ["a"])
    with pytest.raises(FamilyError, match="outside the allowed set"):
        store.add(FAMILY, ["ok", "not ok"])
    assert store.members(FAMILY) == ["b"], "a bad key must add nothing"


# -- beat -----------------------------------------------------------------------------------------

def test_beat_dispatches_members_by_the_same_rules_and_forgets_removed_ones(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    keys = Keys(key_prefix)
    app = build(key_prefix, family_and_lanes)
    store = FamilyStore(redis_client, keys, [FAMILY])
    store.add(FAMILY, ["repo-b", "repo-a", "repo-c"])
    sched = FairScheduler(app=app)
    sched.tick()
    # All never ran (ratio ∞, a tie): declared order decides, f.plain (1) before the
    # family (5).
    assert [m["task"] for m in sent(broker, "heavy")] == ["f.plain"]
    # The gated light lane waits while members are due and behind (never ran).
    d = json.loads(redis_client.hget(keys.lanes, "f.report|sched"))["deferral"]
    assert d["blocker"] == FAMILY and d["reason"] == "dependency-backpressure"
    sched.rt.store.pause("f.plain")
    # The next winners are the members, each with its key. New members are just due (not
    # maximally stale): each at its jittered due ratio (at least 1) plus the time since added,
    # so the one whose jitter puts it latest goes first; a tie goes by name.
    def first_ratio(key: str) -> float:
        return max(1.0, jitter_unit(FAMILY, key) * 0.4 + 0.8)

    expected = sorted(["repo-a", "repo-b", "repo-c"], key=lambda k: (-first_ratio(k), k))[:2]
    order = []
    for _ in range(2):
        finish_run(sched, redis_client, keys)
        broker.delete("heavy")
        sched.tick()
        msg = json.loads(broker.lindex("heavy", 0))
        order.append((msg["headers"]["task"], msg["headers"]["argsrepr"]))
    assert order == [(FAMILY, f"['{k}']") for k in expected]
    # Removing a member drops it from beat's memory: it is never sent.
    finish_run(sched, redis_client, keys)
    (last,) = {"repo-a", "repo-b", "repo-c"} - set(expected)
    store.remove(FAMILY, [last])
    broker.delete("heavy")
    for _ in range(2):
        sched.tick()
    assert all(json.loads(m)["headers"]["argsrepr"] != f"['{last}']"
               for m in broker.lrange("heavy", 0, -1))
    assert member_lane(FAMILY, last) not in sched.memory.states
    sched.close()


def test_members_hook_is_synced_at_a_bounded_rate(key_prefix: str, broker: redis.Redis,
                                                  redis_client: redis.Redis) -> None:
    calls: list[int] = []
    wanted = ["x", "y"]

    def members() -> list[str]:
        calls.append(1)
        return list(wanted)

    sched = FairScheduler(app=build(key_prefix, lambda app: family_and_lanes(app, members)))
    sched.tick()
    sched.tick()
    assert len(calls) == 1, "the hook is called at most every members_sync_s"
    store = FamilyStore(redis_client, Keys(key_prefix))
    assert store.members(FAMILY) == ["x", "y"]
    wanted[:] = ["y", "z"]
    sched.engine.families.last_sync[FAMILY] = 0.0  # the sync interval passed
    sched.tick()
    assert store.members(FAMILY) == ["y", "z"]
    sched.close()


# -- status and metrics ------------------------------------------------------------------------

def test_status_folds_families_and_metrics_aggregate_them(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    keys = Keys(key_prefix)
    app = build(key_prefix, family_and_lanes)
    FamilyStore(redis_client, keys).add(FAMILY, [f"r{i}" for i in range(5)])
    sched = FairScheduler(app=app)
    sched.tick()
    redis_client.delete(keys.lease)
    sched.rt.store.pause("f.plain")
    sched.tick()  # a member wins, the others are deferred behind it
    monkeypatch.setenv("SCHEDPROJ_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("SCHEDPROJ_KEY_PREFIX", key_prefix)
    runner = CliRunner()
    out = runner.invoke(main, ["status", "--json"])
    data = json.loads(out.output)
    assert {lane["name"] for lane in data["lanes"]} == {"f.plain", "f.report"}
    (fam,) = data["families"]
    assert fam["family"] == FAMILY and fam["members"] == 5
    assert fam["running"] == 1 and fam["deferred"] == 4
    members = json.loads(runner.invoke(main, ["status", "--json", "--family", FAMILY]).output)
    assert len(members["lanes"]) == 5
    bad = runner.invoke(main, ["status", "--family", "nope"])
    assert bad.exit_code != 0 and "no lane family 'nope'" in bad.output
    assert runner.invoke(main, ["family", "list", FAMILY]).output.split() == \
        [f"r{i}" for i in range(5)]
    bad = runner.invoke(main, ["family", "add", FAMILY, "bad key"])
    assert bad.exit_code != 0 and "outside the allowed set" in bad.output

    families = json.loads(redis_client.get(keys.published_lanes))["families"]
    settings = Settings.load(key_prefix=key_prefix)
    names = {m.name: m for m in SchedprojCollector(
        redis_client, keys, settings, (), families).collect()}
    ratios = {s.labels["lane"] for s in names["schedproj_lane_staleness_ratio"].samples}
    assert not any(lane.startswith(FAMILY) for lane in ratios), "per-member series by default"
    (members_n,) = names["schedproj_family_members"].samples
    assert members_n.labels == {"family": FAMILY} and members_n.value == 5
    per_member = Settings.load(key_prefix=key_prefix, metrics_per_member=True)
    names = {m.name: m for m in SchedprojCollector(
        redis_client, keys, per_member, (), families).collect()}
    assert any(s.labels["lane"].startswith(FAMILY)
               for s in names["schedproj_lane_staleness_ratio"].samples)
    assert observe(redis_client, keys).family_sizes == {FAMILY: 5}
    sched.close()


def test_new_members_are_just_due_and_never_outrank_an_overdue_lane(
        key_prefix: str, broker: redis.Redis, redis_client: redis.Redis) -> None:
    """Members added in bulk count as just due (ratio 1, growing), not maximally stale: a
    thousand tenants added at once must not all run before a lane twice overdue."""
    keys = Keys(key_prefix)
    now = time.time()
    sched = FairScheduler(app=build(key_prefix, family_and_lanes))
    sched.rt.store.write_run("f.plain", RunRecord(last_run_at=now - 120, runs=1,
                                                  last_outcome=Outcome.COMPLETED))  # ratio 2
    FamilyStore(redis_client, keys, [FAMILY]).add(FAMILY, [f"t{i:04d}" for i in range(1000)])
    sched.tick()
    assert [m["task"] for m in sent(broker, "heavy")] == ["f.plain"]
    # A member's view: due (its first run comes in its turn), at a ratio near 1, not ∞.
    st = sched.rt.store.read_run(member_lane(FAMILY, "t0000"))
    assert st.since is not None and st.last_run_at is None
    sched.close()
