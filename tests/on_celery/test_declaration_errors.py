"""Bad input gets a clear error (DESIGN.md promise 8): lane declarations, settings, stored state.

Pure tests: fake task objects for ``build_lane_set``, one real Celery app (never connected to a
broker) for ``lane_set_for``, and no Redis.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from celery import Celery
from pydantic import ValidationError

from schedproj import LaneTask, configure_app
from schedproj.core.deferrals import Deferral
from schedproj.core.errors import ConfigurationError, LaneDeclarationError, StateError
from schedproj.core.lanes import (
    DeferralReason,
    DeploymentClass,
    Gate,
    GateCondition,
    Lane,
    LaneKind,
    LaneSpec,
    Profile,
)
from schedproj.core.laneset import build_lane_set
from schedproj.core.records import (
    LeaseView,
    Outcome,
    RunRecord,
    SchedRecord,
    decode,
    encode,
)
from schedproj.on_celery.config import lane_set_for
from schedproj.settings import Settings

HEAVY = LaneKind.HEAVY
LIGHT = LaneKind.LIGHT


@dataclass
class FakeTask:
    """What build_lane_set reads from a Celery task: its lane option and its queue option."""

    lane: Any = None
    queue: str | None = None


def tasks(**lanes: Lane) -> dict[str, FakeTask]:
    """``tasks(a=Lane(...))`` -> {"a": FakeTask(Lane(...))}."""
    return {name: FakeTask(lane) for name, lane in lanes.items()}


def declaration_error(mapping: dict[str, Any], routed: Callable[[str], str | None] | None = None,
                      ) -> LaneDeclarationError:
    with pytest.raises(LaneDeclarationError) as info:
        build_lane_set(mapping, routed)
    return info.value


def assert_clear(exc: LaneDeclarationError, lane: str, *fragments: str) -> None:
    message = str(exc)
    assert exc.lane == lane
    assert f"lane {lane!r}" in message
    assert "Fix:" in message
    assert exc.fix and message.endswith(exc.fix)
    for fragment in fragments:
        assert fragment in message


# -- valid declarations ------------------------------------------------------------------------


def test_valid_lane_set() -> None:
    mapping: dict[str, Any] = {
        "rem.summary": FakeTask(Lane(cadence_s=600, order=30, gates=(
            Gate("memory-summary-backfill"),)), queue="heavy"),
        "rem.backfill": FakeTask(Lane(name="memory-summary-backfill", cadence_s=600, order=20,
                                      backlog_driven=True)),
        "rem.golden": FakeTask(Lane(name="golden-path", cadence_s=3600, kind="light",
                                    gates=(Gate("rem.dream", "due-or-running",
                                                "golden-path-dependency-backpressure"),))),
        "rem.dream": FakeTask(Lane(cadence_s=3600, order=40)),
        "rem.backup": FakeTask(Lane(cadence_s=86400, priority0=True, order=90,
                                    deployment="local-only")),
        "not.a.lane": FakeTask(None),
    }
    lane_set = build_lane_set(mapping, lambda name: None)
    assert lane_set.names == ("memory-summary-backfill", "rem.summary", "rem.dream",
                              "rem.backup", "golden-path")
    assert lane_set.spec("golden-path") == LaneSpec(
        name="golden-path", task_name="rem.golden", kind=LIGHT, cadence_s=3600.0,
        gates=(Gate("rem.dream", GateCondition.DUE_OR_RUNNING,
                    DeferralReason.GOLDEN_PATH_DEPENDENCY),),
        order=1000,
    )
    backup = lane_set.spec("rem.backup")
    assert backup.priority0 and backup.heavy and backup.deployment is DeploymentClass.LOCAL_ONLY
    assert lane_set.spec("memory-summary-backfill").backlog_driven
    assert isinstance(lane_set.spec("rem.dream").cadence_s, float)
    assert set(lane_set.options) == set(lane_set.names)
    assert lane_set.options["golden-path"] is mapping["rem.golden"].lane
    with pytest.raises(KeyError):
        lane_set.spec("not.a.lane")


def test_gates_forming_a_diamond_are_not_a_cycle() -> None:
    lane_set = build_lane_set(tasks(
        a=Lane(cadence_s=60),
        b=Lane(cadence_s=60, gates=(Gate("a"),)),
        c=Lane(cadence_s=60, gates=(Gate("a"),)),
        d=Lane(cadence_s=60, gates=(Gate("b"), Gate("c"))),
    ))
    assert lane_set.names == ("a", "b", "c", "d")


def test_correct_queues_accepted() -> None:
    mapping = {"h": FakeTask(Lane(cadence_s=60), queue="heavy"),
               "l": FakeTask(Lane(cadence_s=60, kind=LIGHT), queue="light")}
    routes = {"h": "heavy", "l": "light"}
    assert build_lane_set(mapping, routes.get).names == ("h", "l")


# -- invalid declarations ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "cadence",
    [0, 0.0, -1, -600.0, math.nan, math.inf, -math.inf, None, "600", True, [600]],
    ids=repr,
)
def test_bad_cadence(cadence: Any) -> None:
    exc = declaration_error(tasks(summary=Lane(cadence_s=cadence)))
    assert_clear(exc, "summary", "cadence_s")


def test_bad_cadence_named_by_lane_name_option() -> None:
    exc = declaration_error({"tasks.x": FakeTask(Lane(name="summary", cadence_s=0))})
    assert_clear(exc, "summary", "cadence_s")


def test_missing_cadence() -> None:
    with pytest.raises(LaneDeclarationError) as info:
        lane = Lane(name="summary", kind=HEAVY)  # type: ignore[call-arg]
        build_lane_set({"tasks.summary": FakeTask(lane)})
    assert "summary" in str(info.value)
    assert "cadence_s" in str(info.value) and "Fix:" in str(info.value)


@pytest.mark.parametrize("given", [tasks, lambda **kw: dict(reversed(tasks(**kw).items()))],
                         ids=["a-first", "b-first"])
def test_duplicate_lane_names(given: Callable[..., dict[str, FakeTask]]) -> None:
    exc = declaration_error(given(a=Lane(name="summary", cadence_s=60),
                                  b=Lane(name="summary", cadence_s=600)))
    # Reported the same way whatever the registry's order.
    assert_clear(exc, "summary", "declared twice", "'a'", "'b'")
    assert str(exc).index("'a'") < str(exc).index("'b'")


def test_lane_name_clashing_with_another_task_name() -> None:
    exc = declaration_error(tasks(summary=Lane(cadence_s=60), other=Lane(name="summary",
                                                                          cadence_s=60)))
    assert_clear(exc, "summary", "declared twice")


def test_gate_naming_unknown_lane() -> None:
    exc = declaration_error(tasks(summary=Lane(cadence_s=600, gates=(Gate("backfil"),)),
                                  backfill=Lane(cadence_s=600)))
    assert_clear(exc, "summary", "'backfil'", "backfill")


def test_gate_naming_a_task_that_is_not_a_lane() -> None:
    mapping: dict[str, Any] = {**tasks(summary=Lane(cadence_s=600, gates=(Gate("plain"),))),
                               "plain": FakeTask(None)}
    assert_clear(declaration_error(mapping), "summary", "'plain'")


@pytest.mark.parametrize(
    ("edges", "cycle"),
    [
        pytest.param({"a": ["b"], "b": ["a"]}, ["a", "b"], id="a-b-a"),
        pytest.param({"a": ["b"], "b": ["c"], "c": ["a"]}, ["a", "b", "c"], id="a-b-c-a"),
        pytest.param({"a": ["b"], "b": ["c"], "c": ["d"], "d": ["b"]}, ["b", "c", "d"],
                     id="tail-into-b-c-d-b"),
        pytest.param({"x": [], "p": ["q", "x"], "q": ["x", "p"]}, ["p", "q"],
                     id="cycle-beside-a-dag"),
    ],
)
def test_gate_cycles(edges: dict[str, list[str]], cycle: list[str]) -> None:
    exc = declaration_error(tasks(**{
        name: Lane(cadence_s=60, gates=tuple(Gate(b) for b in blockers))
        for name, blockers in edges.items()
    }))
    assert exc.lane in cycle
    message = str(exc)
    assert "cycle" in message and "Fix:" in message
    for name in cycle:
        assert f"{name} -> " in message or f" -> {name}" in message


def test_gate_on_itself() -> None:
    exc = declaration_error(tasks(a=Lane(cadence_s=60, gates=(Gate("a"),))))
    assert_clear(exc, "a", "itself")


def test_priority0_on_light_lane() -> None:
    exc = declaration_error(tasks(heartbeat=Lane(cadence_s=60, kind=LIGHT, priority0=True)))
    assert_clear(exc, "heartbeat", "priority0")


@pytest.mark.parametrize(
    ("kind", "declared", "routed", "where"),
    [
        pytest.param(HEAVY, "light", None, "queue option", id="heavy-queue-light"),
        pytest.param(HEAVY, "celery", None, "queue option", id="heavy-queue-default"),
        pytest.param(HEAVY, None, "light", "task_routes", id="heavy-routed-light"),
        pytest.param(HEAVY, None, "celery", "task_routes", id="heavy-routed-elsewhere"),
        pytest.param(HEAVY, "heavy", "light", "task_routes", id="heavy-queue-ok-routed-light"),
        pytest.param(LIGHT, "heavy", None, "queue option", id="light-queue-heavy"),
        pytest.param(LIGHT, None, "heavy", "task_routes", id="light-routed-heavy"),
    ],
)
def test_lane_sent_to_the_wrong_queue(kind: LaneKind, declared: str | None,
                                      routed: str | None, where: str) -> None:
    mapping = {"tasks.dream": FakeTask(Lane(name="dream", cadence_s=3600, kind=kind),
                                       queue=declared)}
    exc = declaration_error(mapping, lambda task_name: routed)
    assert_clear(exc, "dream", where, f"queue {declared if where == 'queue option' else routed!r}",
                 f"{kind.value!r}")


@pytest.mark.parametrize(
    ("lane", "fragment"),
    [
        pytest.param(lambda: Lane(cadence_s=60, order="1"), "order", id="order-str"),
        pytest.param(lambda: Lane(cadence_s=60, order=1.5), "order", id="order-float"),
        pytest.param(lambda: Lane(cadence_s=60, gates=("a",)), "Gate", id="gate-not-a-gate"),
        pytest.param(lambda: Lane(cadence_s=60, gates=(Gate("b", max_defer_s=0),)),
                     "max_defer_s", id="max-defer-zero"),
        pytest.param(lambda: Lane(cadence_s=60, due_check=42), "due_check", id="due-check"),
    ],
)
def test_other_bad_options(lane: Callable[[], Lane], fragment: str) -> None:
    mapping = {**tasks(a=lane()), **tasks(b=Lane(cadence_s=60))}
    assert_clear(declaration_error(mapping), "a", fragment)


def test_lane_option_that_is_not_a_lane() -> None:
    exc = declaration_error({"tasks.a": FakeTask({"cadence_s": 60})})
    assert_clear(exc, "tasks.a", "dict")


@pytest.mark.parametrize(("field", "value"), [("kind", "medium"), ("deployment", "edge")])
def test_bad_kind_or_deployment(field: str, value: str) -> None:
    with pytest.raises(LaneDeclarationError) as info:
        Lane(cadence_s=60, name="dream", **{field: value})
    assert_clear(info.value, "dream", value)


@pytest.mark.parametrize(("field", "value"), [("when", "sometimes"), ("reason", "because")])
def test_bad_gate_condition_or_reason(field: str, value: str) -> None:
    with pytest.raises(LaneDeclarationError) as info:
        Gate("dream", **{field: value})
    assert value in str(info.value) and "Fix:" in str(info.value)


# -- tie-breaking never depends on import order ------------------------------------------------

ORDER_LANES = {
    "zeta": Lane(cadence_s=60, order=1),
    "alpha": Lane(cadence_s=60, order=2),
    "mid": Lane(cadence_s=60, order=1),
    "beta": Lane(cadence_s=60),
    "aardvark": Lane(cadence_s=60),
    "heart": Lane(cadence_s=60, kind=LIGHT, order=0),
}


@pytest.mark.parametrize("permutation", list(itertools.islice(
    itertools.permutations(ORDER_LANES), 0, None, 37)))
def test_specs_sorted_by_order_then_name(permutation: tuple[str, ...]) -> None:
    lane_set = build_lane_set({name: FakeTask(ORDER_LANES[name]) for name in permutation})
    assert lane_set.names == ("heart", "mid", "zeta", "alpha", "aardvark", "beta")
    assert [s.order for s in lane_set.specs] == [0, 1, 1, 2, 1000, 1000]
    assert lane_set == build_lane_set({name: FakeTask(lane) for name, lane in
                                       ORDER_LANES.items()})


# -- a real Celery app -------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings come from the environment: start every test from none of ours."""
    for name in list(os.environ):
        if name.startswith("SCHEDPROJ_") or name == "CELERY_BROKER_URL":
            monkeypatch.delenv(name)


@pytest.fixture
def app(clean_env: None) -> Iterator[Celery]:
    """A throwaway app. Its tasks are declared with shared=False: Celery's default (shared)
    would add them to every app finalized later in this process, other tests' apps too."""
    celery_app = Celery("t", broker="memory://", set_as_current=False)
    yield celery_app
    celery_app.close()


def test_lane_set_for_real_celery_app(app: Celery) -> None:
    @app.task(base=LaneTask, shared=False, name="rem.dream", lane=Lane(cadence_s=3600, order=40))
    def dream() -> None: ...

    @app.task(base=LaneTask, shared=False, name="rem.golden", lane=Lane(
        name="golden-path", cadence_s=3600, kind=LIGHT, order=50,
        gates=(Gate("rem.dream", GateCondition.DUE_OR_RUNNING),)))
    def golden() -> None: ...

    @app.task(base=LaneTask, shared=False, name="rem.backup", time_limit=600,
              lane=Lane(cadence_s=86400, priority0=True, order=90))
    def backup() -> None: ...

    @app.task(name="rem.plain", shared=False)
    def plain() -> None: ...

    settings = Settings.load(CELERY_BROKER_URL="redis://127.0.0.1:6379/14")
    configure_app(app, settings)
    assert app.conf.broker_url == "redis://127.0.0.1:6379/14"
    lane_set = lane_set_for(app)
    assert lane_set.names == ("rem.dream", "golden-path", "rem.backup")
    assert lane_set.spec("golden-path").task_name == "rem.golden"
    assert lane_set.spec("rem.backup").priority0
    assert lane_set_for(app) is lane_set  # cached
    # Default time limits applied; an explicit one kept, with a soft limit below it.
    assert app.tasks["rem.dream"].time_limit == settings.heavy_time_limit_s
    assert app.tasks["rem.golden"].time_limit == settings.light_time_limit_s
    assert app.tasks["rem.backup"].time_limit == 600
    for name in ("rem.dream", "rem.golden", "rem.backup"):
        task = app.tasks[name]
        assert 0 < task.soft_time_limit < task.time_limit


@pytest.mark.filterwarnings("ignore::celery.exceptions.CDeprecationWarning")  # task queue=
@pytest.mark.parametrize("how", ["queue-option", "task-routes"])
def test_lane_set_for_rejects_misrouted_heavy_lane(app: Celery, how: str) -> None:
    options: dict[str, Any] = {"queue": "light"} if how == "queue-option" else {}
    if how == "task-routes":
        app.conf.task_routes = {"rem.dream": {"queue": "celery"}}

    @app.task(base=LaneTask, shared=False, name="rem.dream", lane=Lane(cadence_s=3600), **options)
    def dream() -> None: ...

    configure_app(app, Settings.load(CELERY_BROKER_URL="redis://127.0.0.1:6379/14"))
    with pytest.raises(LaneDeclarationError) as info:
        lane_set_for(app)
    assert_clear(info.value, "rem.dream", "'heavy'")


def test_lane_set_for_rejects_bad_declaration_in_real_app(app: Celery) -> None:
    @app.task(base=LaneTask, shared=False, name="rem.summary",
              lane=Lane(cadence_s=600, gates=(Gate("rem.backfill"),)))
    def summary() -> None: ...

    configure_app(app, Settings.load(CELERY_BROKER_URL="redis://127.0.0.1:6379/14"))
    with pytest.raises(LaneDeclarationError) as info:
        lane_set_for(app)
    assert_clear(info.value, "rem.summary", "'rem.backfill'")


# -- settings ----------------------------------------------------------------------------------


def config_error(**overrides: Any) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as info:
        Settings.load(**overrides)
    exc = info.value
    assert not isinstance(exc, ValidationError)
    assert exc.__cause__ is None and exc.__suppress_context__  # no pydantic traceback chained
    return exc


def test_default_settings_load(clean_env: None) -> None:
    settings = Settings.load()
    assert settings.profile is Profile.LOCAL
    assert settings.state_redis_url == settings.broker_url


@pytest.mark.parametrize(
    "overrides",
    [
        {"beat_lock_ttl_s": 8.9},
        {"beat_lock_ttl_s": 15, "beat_max_loop_interval_s": 5.01},
        {"beat_max_loop_interval_s": 60},
    ],
)
def test_beat_lock_ttl_below_three_loop_intervals(clean_env: None,
                                                  overrides: dict[str, float]) -> None:
    message = str(config_error(**overrides))
    assert "SCHEDPROJ_BEAT_LOCK_TTL_S" in message
    assert "3x" in message


def test_beat_lock_ttl_exactly_three_loop_intervals_is_fine(clean_env: None) -> None:
    assert Settings.load(beat_lock_ttl_s=9, beat_max_loop_interval_s=3).beat_lock_ttl_s == 9


@pytest.mark.parametrize(
    "overrides",
    [
        {"heavy_time_limit_s": 3 * 3600},
        {"heavy_time_limit_s": 4 * 3600},
        {"visibility_timeout_s": 3600},
    ],
)
def test_heavy_time_limit_must_be_below_visibility_timeout(clean_env: None,
                                                           overrides: dict[str, float]) -> None:
    message = str(config_error(**overrides))
    assert "SCHEDPROJ_HEAVY_TIME_LIMIT_S" in message
    assert "SCHEDPROJ_VISIBILITY_TIMEOUT_S" in message


@pytest.mark.parametrize(("setting", "value"), [("beat_lock_ttl_s", "abc"),
                                                ("hold_cap_s", "thirty minutes"),
                                                ("lease_ttl_s", [20])])
def test_non_number_setting(clean_env: None, setting: str, value: Any) -> None:
    message = str(config_error(**{setting: value}))
    assert f"SCHEDPROJ_{setting.upper()}" in message
    assert repr(value) in message


def test_non_number_setting_from_environment(clean_env: None,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDPROJ_HOLD_CAP_S", "ten")
    message = str(config_error())
    assert "SCHEDPROJ_HOLD_CAP_S" in message and "'ten'" in message


def test_amqp_broker_needs_redis_url(clean_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    amqp = "amqp://guest@rabbit:5672//"
    assert "SCHEDPROJ_REDIS_URL" in str(config_error(CELERY_BROKER_URL=amqp))
    monkeypatch.setenv("CELERY_BROKER_URL", amqp)
    assert "SCHEDPROJ_REDIS_URL" in str(config_error())
    # On RabbitMQ the heavy time limit must also stay below its consumer_timeout (30 min by
    # default; tests/e2e/test_rabbitmq.py), so the 2 h default is lowered here.
    settings = Settings.load(redis_url="redis://state:6379/2", heavy_time_limit_s=1200)
    assert settings.broker_url == amqp
    assert settings.state_redis_url == "redis://state:6379/2"


@pytest.mark.parametrize(
    "overrides",
    [
        {"CELERY_BROKER_URL": "amqp://guest:s3cret@rabbit:5672//"},
        {"redis_url": "redis://:s3cret@state:6379/2", "beat_lock_ttl_s": "x"},
        {"broker_url": "redis://:s3cret@state:6379/2", "beat_lock_ttl_s": 1},
        {"redis_url": 5, "broker_url": "amqp://guest:s3cret@rabbit:5672//"},
    ],
    ids=["amqp-no-redis", "bad-number", "cross-field", "bad-url-type"],
)
def test_settings_errors_never_echo_passwords(clean_env: None,
                                              overrides: dict[str, Any]) -> None:
    assert "s3cret" not in str(config_error(**overrides))


def test_broker_url_by_field_name(clean_env: None) -> None:
    # Found while writing these tests (the field name was silently ignored); fixed in 940a454.
    assert Settings.load(broker_url="redis://127.0.0.1:6379/14").broker_url.endswith("/14")
    with pytest.raises(ConfigurationError, match="SCHEDPROJ_REDIS_URL"):
        Settings.load(broker_url="amqp://guest@rabbit:5672//")


# -- stored state ------------------------------------------------------------------------------

RECORDS = [
    RunRecord(),
    RunRecord(last_run_at=1.7e9, last_outcome=Outcome.YIELDED, last_reason="hold-cap",
              last_task_id="t-1", backlog=371, runs=12, failures=1, running_task_id="t-2",
              running_since=1.7e9 + 5, running_until=1.7e9 + 9000, fence=42),
    SchedRecord(),
    SchedRecord(inflight_task_id="t-3", inflight_deadline=1.7e9 + 60, last_dispatch_at=1.7e9,
                dispatches=3, paused=True,
                deferral=Deferral("summary", DeferralReason.DEPENDENCY,
                                  "memory-summary-backfill", 1.7e9 - 600)),
    SchedRecord(deferral=Deferral("kb-sync", DeferralReason.LEASE_HELD, None, 1)),
    LeaseView(lane="dream", token="tok", fence=9, granted_at=1.7e9),
    LeaseView(lane="dream", token="tok", fence=9, granted_at=1.7e9, started_at=1.7e9 + 1,
              task_id="t-4"),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_state_round_trip(record: Any) -> None:
    raw = encode(record)
    assert json.loads(raw)["v"] == 1
    assert decode(type(record), raw, "k") == record
    assert decode(type(record), raw.encode(), "k") == record


def state_error(cls: type, raw: str | bytes, key: str = "schedproj:lanes field 'dream|run'",
                ) -> StateError:
    with pytest.raises(StateError) as info:
        decode(cls, raw, key)
    assert info.value.key == key
    assert repr(key) in str(info.value)
    return info.value


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        pytest.param('{"v": 3}', "version 3", id="newer-version"),
        pytest.param('{"v": 0, "backlog": 1}', "version 0", id="older-version"),
        pytest.param('{"backlog": 1}', "version None", id="no-version"),
        pytest.param('{"v": "1"}', "version '1'", id="version-string"),
        pytest.param("not json", "JSON", id="not-json"),
        pytest.param("", "JSON", id="empty"),
        pytest.param(b"\xff\xfe", "JSON", id="not-utf8"),
        pytest.param("[1, 2]", "list", id="array"),
        pytest.param("42", "int", id="number"),
        pytest.param("null", "NoneType", id="null"),
        pytest.param('"text"', "str", id="string"),
        pytest.param('{"v": 1, "backlogg": 3}', "backlogg", id="unknown-field"),
        pytest.param('{"v": 1, "last_run_at": "yesterday"}', "last_run_at", id="time-str"),
        pytest.param('{"v": 1, "backlog": "3"}', "backlog", id="backlog-str"),
        pytest.param('{"v": 1, "backlog": true}', "backlog", id="backlog-bool"),
        pytest.param('{"v": 1, "last_task_id": 7}', "last_task_id", id="task-id-int"),
        pytest.param('{"v": 1, "last_outcome": "exploded"}', "exploded", id="bad-outcome"),
        pytest.param('{"v": 1, "fence": [1]}', "fence", id="fence-list"),
    ],
)
def test_bad_run_record(raw: str | bytes, fragment: str) -> None:
    assert fragment in str(state_error(RunRecord, raw))


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        pytest.param('{"v": 1, "paused": "yes"}', "paused", id="paused-str"),
        pytest.param('{"v": 1, "paused": 1}', "paused", id="paused-int"),
        pytest.param('{"v": 1, "dispatches": "2"}', "dispatches", id="dispatches-str"),
        pytest.param('{"v": 1, "inflight_deadline": {}}', "inflight_deadline",
                     id="deadline-object"),
        pytest.param('{"v": 1, "deferral": "soon"}', "bad field value", id="deferral-str"),
        pytest.param('{"v": 1, "deferral": 5}', "bad field value", id="deferral-int"),
        pytest.param('{"v": 1, "deferral": {"lane": "a", "reason": "nope", "blocker": null, '
                     '"since": 1}}', "nope", id="deferral-bad-reason"),
        pytest.param('{"v": 1, "deferral": {"lane": "a", "reason": "dependency-backpressure", '
                     '"blocker": null, "since": 1, "extra": 2}}', "extra",
                     id="deferral-unknown-field"),
    ],
)
def test_bad_sched_record(raw: str, fragment: str) -> None:
    assert fragment in str(state_error(SchedRecord, raw))


def test_bad_lease_view() -> None:
    assert "lane" in str(state_error(LeaseView, '{"v": 1, "lane": 5, "token": "t", '
                                                 '"fence": 1, "granted_at": 1}'))
    assert "missing" in str(state_error(LeaseView, '{"v": 1, "lane": "dream"}'))


@pytest.mark.parametrize("deferral", ["{}", "[]", '{"lane": "a", "since": 1}'])
def test_deferral_without_reason_is_a_state_error(deferral: str) -> None:
    # A KeyError used to escape decode() here, past store.parse_states, crashing every tick.
    state_error(SchedRecord, f'{{"v": 1, "deferral": {deferral}}}')


@pytest.mark.parametrize(("fld", "value"), [("since", '"yesterday"'), ("lane", "5"),
                                            ("blocker", "[1]")])
def test_deferral_fields_type_checked(fld: str, value: str) -> None:
    # since="yesterday" used to decode, then crash gates.evaluate (now - since) every tick.
    deferral = {"lane": '"summary"', "reason": '"dependency-backpressure"',
                "blocker": '"memory-summary-backfill"', "since": "1.5", fld: value}
    body = ", ".join(f'"{k}": {v}' for k, v in deferral.items())
    assert fld in str(state_error(SchedRecord, f'{{"v": 1, "deferral": {{{body}}}}}'))
