"""configure_app keeps an adopted app's own configuration (promise 11, docs/adoption.md).

An app configured in code the usual way keeps its broker, result backend, default queue,
routes, transport options and time zone; its ordinary tasks route to its own queue and keep
their results (one real worker round trip); lanes still route to ``heavy`` and ``light`` with
their own per-task options. Every row of the docs' tables has a test here, and the app-wide
rows are exactly what configure_app writes.
"""

from __future__ import annotations

import copy
import importlib
import logging
import os
import re
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import pytest
from celery import Celery
from kombu.transport import redis as kombu_redis

from schedproj import Lane, LaneKind, LaneTask, Settings, configure_app
from schedproj.core.errors import ConfigurationError, LaneDeclarationError
from schedproj.on_celery import config
from schedproj.on_celery.config import lane_set_for, route_lane
from tests.conftest import REDIS_URL

ROOT = Path(__file__).resolve().parents[2]
ADOPTION = ROOT / "docs" / "adoption.md"
_SERVER = urlsplit(REDIS_URL)
#: The app's own broker and result backend: databases of the test Redis, named in code.
APP_BROKER = f"redis://{_SERVER.hostname}:{_SERVER.port}/12"
APP_BACKEND = f"redis://{_SERVER.hostname}:{_SERVER.port}/11"


@pytest.fixture(autouse=True)
def _no_schedproj_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a team's app runs: no CELERY_BROKER_URL, no SCHEDPROJ_* variable."""
    for name in list(os.environ):
        if name.startswith("SCHEDPROJ_") or name == "CELERY_BROKER_URL":
            monkeypatch.delenv(name)


def usual_app(**conf: Any) -> Celery:
    """An app configured in code the usual way, with ordinary tasks and two lanes."""
    app = Celery(f"shop{uuid.uuid4().hex[:6]}", broker=APP_BROKER, backend=APP_BACKEND,
                 set_as_current=False)
    app.conf.update({
        "task_default_queue": "shop", "timezone": "Europe/Berlin",
        "task_routes": {"shop.reports.*": {"queue": "reports"}},
        "broker_transport_options": {"global_keyprefix": "shop:", "queue_order_strategy":
                                     "priority", "visibility_timeout": 86400},
        **conf})

    @app.task(name="shop.add", shared=False)
    def add(a: int, b: int) -> int:
        return a + b

    @app.task(name="shop.reports.daily", shared=False)
    def daily() -> str:
        return "report"

    @app.task(base=LaneTask, name="shop.lanes.heavy", shared=False,
              lane=Lane(kind=LaneKind.HEAVY, cadence_s=600))
    def heavy() -> None:
        return None

    @app.task(base=LaneTask, name="shop.lanes.light", shared=False,
              lane=Lane(kind=LaneKind.LIGHT, cadence_s=60))
    def light() -> None:
        return None

    return app


def queue_of(app: Celery, task_name: str) -> str:
    route = app.amqp.router.route({}, task_name, (), {}, app.tasks[task_name])
    return str(route["queue"].name)


def conf_snapshot(app: Celery) -> dict[str, Any]:
    return {key: copy.deepcopy(app.conf[key]) for key in app.conf}


def written_by_configure_app(app: Celery, settings: Settings) -> set[str]:
    before = conf_snapshot(app)
    configure_app(app, settings)
    after = conf_snapshot(app)
    return {key for key in after if before.get(key) != after[key]}


def docs_rows(heading: str) -> list[list[str]]:
    """The rows of the first table after ``heading`` in docs/adoption.md, cells stripped."""
    text = ADOPTION.read_text().split(heading, 1)[1]
    lines = [line for line in text.split("\n\n## ", 1)[0].splitlines()
             if line.startswith("| ") and not line.startswith("| ---")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[1:]]


def touched_rows() -> dict[str, str]:
    """Setting -> scope, from the table of what configure_app touches."""
    rows = {}
    for cells in docs_rows("## What configure_app touches"):
        for name in re.findall(r"`([^`]+)`", cells[0]) or [cells[0]]:
            rows[name] = cells[1]
    return rows


# -- the app keeps its configuration -----------------------------------------------------------
def test_an_app_configured_in_code_keeps_every_setting() -> None:
    app = configure_app(usual_app(), Settings.load())
    conf = app.conf
    assert conf.broker_url == APP_BROKER and conf.result_backend == APP_BACKEND
    assert conf.task_default_queue == "shop" and conf.timezone == "Europe/Berlin"
    assert conf.broker_transport_options == {
        "global_keyprefix": "shop:", "queue_order_strategy": "priority",
        "visibility_timeout": 86400}
    assert conf.task_routes[0] == {"shop.reports.*": {"queue": "reports"}}
    assert not conf.task_ignore_result and not conf.task_acks_late
    assert conf.worker_prefetch_multiplier == 4 and not conf.task_send_sent_event
    assert conf.broker_transport is None
    # Lane state and checks follow the app's broker and its longer visibility timeout.
    assert app.schedproj_settings.broker_url == APP_BROKER
    assert app.schedproj_settings.state_redis_url == APP_BROKER
    assert app.schedproj_settings.visibility_timeout_s == 86400


def test_ordinary_tasks_route_to_the_apps_own_queues_and_keep_results() -> None:
    app = configure_app(usual_app(), Settings.load())
    lane_set_for(app)
    assert queue_of(app, "shop.add") == "shop"
    assert queue_of(app, "shop.reports.daily") == "reports"
    add = app.tasks["shop.add"]
    assert not add.ignore_result and not add.acks_late and not add.reject_on_worker_lost


def test_lanes_route_to_heavy_and_light_and_keep_their_options() -> None:
    # The app's own serializer for its tasks is pickle: lanes stay JSON, per task.
    app = configure_app(usual_app(task_serializer="pickle"), Settings.load())
    lanes = lane_set_for(app)
    assert sorted(lanes.names) == ["shop.lanes.heavy", "shop.lanes.light"]
    assert queue_of(app, "shop.lanes.heavy") == "heavy"
    assert queue_of(app, "shop.lanes.light") == "light"
    for name in ("shop.lanes.heavy", "shop.lanes.light"):
        task = app.tasks[name]
        assert (task.serializer, task.acks_late, task.reject_on_worker_lost,
                task.ignore_result) == ("json", True, True, True)
    assert app.tasks["shop.add"].serializer == "pickle"


def test_the_environment_overrides_the_broker_only_when_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert configure_app(usual_app(), Settings.load()).conf.broker_url == APP_BROKER
    other = f"redis://{_SERVER.hostname}:{_SERVER.port}/10"
    monkeypatch.setenv("SCHEDPROJ_BROKER_URL", other)
    app = configure_app(usual_app(), Settings.load())
    assert app.conf.broker_url == other == app.schedproj_settings.broker_url


def test_the_apps_broker_must_fit_the_settings() -> None:
    app = Celery("amqpapp", broker="amqp://guest@localhost//", set_as_current=False)
    with pytest.raises(ConfigurationError, match="SCHEDPROJ_REDIS_URL") as caught:
        configure_app(app, Settings.load())
    assert "app.conf.broker_url" in str(caught.value)


# -- the table of what configure_app touches ---------------------------------------------------
def test_the_app_wide_rows_are_exactly_what_configure_app_writes() -> None:
    bare = written_by_configure_app(Celery("bare", set_as_current=False), Settings())
    tls = written_by_configure_app(Celery("tls", set_as_current=False),
                                   Settings(broker_url="rediss://127.0.0.1:6380/0"))
    app_wide = {name for name, scope in touched_rows().items() if scope == "app-wide"}
    assert bare | tls == app_wide
    # The usual app: lane routing added, Celery's default scheduler and content lists stated;
    # nothing it set itself is written.
    app = usual_app()
    accepted = list(app.conf.accept_content)
    assert written_by_configure_app(app, Settings.load()) == {
        "task_routes", "beat_scheduler", "accept_content", "result_accept_content"}
    assert app.conf.accept_content == app.conf.result_accept_content == accepted


def test_broker_url_is_set_only_when_the_app_names_none() -> None:
    assert configure_app(Celery("nobroker", set_as_current=False),
                         Settings.load()).conf.broker_url == "redis://127.0.0.1:6379/0"
    assert configure_app(usual_app(), Settings.load()).conf.broker_url == APP_BROKER


def test_accept_content_is_kept_and_stated_for_results() -> None:
    app = configure_app(usual_app(accept_content=["json", "msgpack"]), Settings.load())
    assert app.conf.accept_content == ["json", "msgpack"]
    assert app.conf.result_accept_content == ["json", "msgpack"]
    own = configure_app(usual_app(result_accept_content=["json"]), Settings.load())
    assert own.conf.result_accept_content == ["json"]


def test_lane_routing_comes_after_the_apps_routes_which_may_not_take_a_lane() -> None:
    app = configure_app(usual_app(), Settings.load())
    assert app.conf.task_routes[-1] is route_lane
    greedy = configure_app(usual_app(task_routes={"shop.*": {"queue": "shop"}}),
                           Settings.load())
    with pytest.raises(LaneDeclarationError, match="task_routes sends it to queue 'shop'"):
        lane_set_for(greedy)


def test_only_the_visibility_timeout_is_ours_and_only_raised(
        caplog: pytest.LogCaptureFixture) -> None:
    ours = Settings.load().visibility_timeout_s
    short = usual_app(broker_transport_options={"global_keyprefix": "shop:",
                                                "visibility_timeout": 60})
    with caplog.at_level(logging.WARNING, logger=config.__name__):
        configure_app(short, Settings.load())
    assert short.conf.broker_transport_options == {"global_keyprefix": "shop:",
                                                   "visibility_timeout": int(ours)}
    assert "broker_transport_options['visibility_timeout']=60s" in caplog.text
    assert "SCHEDPROJ_VISIBILITY_TIMEOUT_S" in caplog.text
    unset = configure_app(Celery("unset", set_as_current=False), Settings.load())
    assert unset.conf.broker_transport_options == {"visibility_timeout": int(ours)}
    rabbit = Celery("rabbit", broker="amqp://guest@localhost//", set_as_current=False)
    configure_app(rabbit, Settings.load(redis_url=REDIS_URL, rabbitmq_consumer_timeout_s=0))
    assert rabbit.conf.broker_transport_options == {}


def test_beat_scheduler_is_set_only_over_celerys_default(
        caplog: pytest.LogCaptureFixture) -> None:
    app = configure_app(usual_app(), Settings.load())
    assert app.conf.beat_scheduler == config.FAIR_SCHEDULER
    with caplog.at_level(logging.WARNING, logger=config.__name__):
        own = configure_app(usual_app(beat_scheduler="redbeat.RedBeatScheduler"),
                            Settings.load())
    assert own.conf.beat_scheduler == "redbeat.RedBeatScheduler"
    assert "beat -S fair" in caplog.text


def test_broker_tls_is_filled_in_only_where_the_app_has_none() -> None:
    settings = Settings(broker_url="rediss://127.0.0.1:6380/0")
    app = configure_app(Celery("tls", set_as_current=False), settings)
    assert app.conf.broker_use_ssl == app.conf.redis_backend_use_ssl == settings.broker_ssl()
    mine = {"ssl_cert_reqs": "none"}
    own = Celery("owntls", set_as_current=False)
    own.conf.update(broker_use_ssl=mine, redis_backend_use_ssl=mine)
    configure_app(own, settings)
    assert own.conf.broker_use_ssl == own.conf.redis_backend_use_ssl == mine


@pytest.mark.parametrize(("option", "value"), [
    ("serializer", "pickle"), ("acks_late", False), ("reject_on_worker_lost", False)])
def test_a_lane_task_keeps_the_lane_options(option: str, value: object) -> None:
    app = configure_app(usual_app(), Settings.load())

    @app.task(base=LaneTask, name="shop.lanes.odd", shared=False,
              lane=Lane(kind=LaneKind.LIGHT, cadence_s=60), **{option: value})
    def odd() -> None:
        return None

    with pytest.raises(LaneDeclarationError, match=f"{option}={value!r}"):
        lane_set_for(app)


def test_a_lane_without_a_result_leaves_the_backend_alone() -> None:
    app = configure_app(usual_app(), Settings.load())
    assert app.tasks["shop.lanes.light"].ignore_result
    assert not app.tasks["shop.add"].ignore_result


def test_lane_time_limits_are_filled_in_per_lane_task() -> None:
    app = configure_app(usual_app(), Settings.load())
    lane_set_for(app)
    settings = app.schedproj_settings
    assert app.tasks["shop.lanes.heavy"].time_limit == settings.heavy_time_limit_s
    assert app.tasks["shop.lanes.light"].time_limit == settings.light_time_limit_s
    assert app.tasks["shop.lanes.heavy"].soft_time_limit < settings.heavy_time_limit_s
    assert app.tasks["shop.add"].time_limit is None


def test_a_worker_consuming_heavy_takes_one_message_at_a_time(
        caplog: pytest.LogCaptureFixture) -> None:
    app = configure_app(usual_app(), Settings.load())
    app.amqp.queues.select(["heavy", "light"])
    worker = SimpleNamespace(prefetch_multiplier=4)
    with caplog.at_level(logging.WARNING, logger=config.__name__):
        config.check_lane_worker(app, worker)
    assert worker.prefetch_multiplier == 1 and "--prefetch-multiplier 1" in caplog.text
    assert app.conf.worker_prefetch_multiplier == 4
    own = configure_app(usual_app(), Settings.load())
    own.amqp.queues.select(["shop", "light"])
    their_worker = SimpleNamespace(prefetch_multiplier=4)
    config.check_lane_worker(own, their_worker)
    assert their_worker.prefetch_multiplier == 4


def test_the_broker_channel_is_swapped_and_the_url_stays_the_users() -> None:
    """kombu's Redis channel class is swapped; the transport and the URL shown stay."""
    app = configure_app(Celery("masked", broker="redis://:s3cret@127.0.0.1:6407/12",
                               set_as_current=False), Settings.load())
    assert kombu_redis.Transport.Channel is config._BrokerChannel
    assert app.conf.broker_transport is None
    with app.connection_for_write() as conn:
        assert conn.as_uri() == "redis://:**@127.0.0.1:6407/12"


def test_every_row_of_the_table_is_named_by_a_test() -> None:
    source = Path(__file__).read_text()
    for name in touched_rows():
        assert (name in source or name.replace("_", " ") in source
                or name.split(".")[-1] in source), name


# -- contradictions ----------------------------------------------------------------------------
def test_a_lane_worker_accepting_pickle_is_refused() -> None:
    app = configure_app(usual_app(accept_content=["json", "pickle"]), Settings.load())
    app.amqp.queues.select(["light"])
    with pytest.raises(ConfigurationError, match=r"accept_content .* 'pickle' .*'light'"):
        config.check_lane_worker(app, SimpleNamespace(prefetch_multiplier=1))
    other = configure_app(usual_app(accept_content=["json", "pickle"]), Settings.load())
    other.amqp.queues.select(["shop"])
    config.check_lane_worker(other, SimpleNamespace(prefetch_multiplier=1))


def test_a_heavy_time_limit_beyond_the_visibility_timeout_is_refused() -> None:
    app = configure_app(usual_app(broker_transport_options={}), Settings.load())

    @app.task(base=LaneTask, name="shop.lanes.long", shared=False, time_limit=1e7,
              lane=Lane(kind=LaneKind.HEAVY, cadence_s=86400))
    def long() -> None:
        return None

    with pytest.raises(LaneDeclarationError, match="time_limit"):
        lane_set_for(app)


def test_beat_refuses_task_always_eager(capsys: pytest.CaptureFixture[str]) -> None:
    app = configure_app(usual_app(task_always_eager=True), Settings.load())
    with pytest.raises(SystemExit) as exited:
        config.validate_or_exit(app, "beat")
    assert exited.value.code == 2
    assert "task_always_eager" in capsys.readouterr().err
    assert config.validate_or_exit(app, "worker").names


def test_the_heavy_queue_as_default_queue_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="task_default_queue is 'heavy'"):
        configure_app(usual_app(task_default_queue="heavy"), Settings.load())


def test_lane_queues_that_cannot_exist_are_refused() -> None:
    from kombu import Queue

    with pytest.raises(ConfigurationError, match=r"task_create_missing_queues .*\['heavy'"):
        configure_app(usual_app(task_create_missing_queues=False,
                                task_queues=[Queue("shop"), Queue("light")]), Settings.load())


def test_the_contradictions_table_has_a_test_per_row() -> None:
    source = Path(__file__).read_text()
    for cells in docs_rows("## When your settings contradict a guarantee"):
        names = re.findall(r"`([^`=\[ ]+)", cells[0]) or ["task_routes"]
        assert any(name in source for name in names), cells[0]


# -- one real round trip -----------------------------------------------------------------------
APP_MODULE = """
    import os
    from celery import Celery
    import schedproj

    app = Celery("shop", broker=os.environ["SHOP_BROKER"], backend=os.environ["SHOP_BACKEND"])
    app.conf.update(task_default_queue=os.environ["SHOP_QUEUE"], timezone="Europe/Berlin",
                    broker_transport_options={"global_keyprefix": os.environ["SHOP_PREFIX"]})

    @app.task(name="shop.add")
    def add(a, b):
        return a + b

    schedproj.configure_app(app)
"""


@pytest.fixture
def shop_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"shopapp_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(APP_MODULE))
    suffix = uuid.uuid4().hex[:6]
    for key, value in (("SHOP_BROKER", APP_BROKER), ("SHOP_BACKEND", APP_BACKEND),
                       ("SHOP_QUEUE", f"shop-{suffix}"), ("SHOP_PREFIX", f"shop{suffix}:")):
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_a_real_worker_on_the_apps_own_queue_runs_an_ordinary_task(
        shop_module: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", shop_module, "worker", "-Q",
             os.environ["SHOP_QUEUE"], "-P", "solo", "-c", "1", "--without-mingle",
             "--without-gossip", "-l", "INFO"], env=env, cwd=tmp_path, stdout=out,
            stderr=subprocess.STDOUT)
    try:
        shop = importlib.import_module(shop_module)
        result = shop.add.delay(2, 3)
        assert result.get(timeout=60) == 5
        assert shop.app.AsyncResult(result.id).result == 5  # read back from the backend
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    time.sleep(0.1)
    banner = log.read_text()
    # Celery's banner masks the password field even when there is none.
    assert f"transport:   redis://:**@{_SERVER.hostname}:{_SERVER.port}/12" in banner, banner
    assert "BrokerTransport" not in banner


def test_a_real_lane_worker_accepting_pickle_exits_naming_both(
        shop_module: str, tmp_path: Path) -> None:
    module = tmp_path / f"{shop_module}.py"
    module.write_text(module.read_text() + "app.conf.accept_content = ['json', 'pickle']\n")
    # C_FORCE_ROOT: Celery itself refuses pickle under root before schedproj is asked.
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "C_FORCE_ROOT": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "celery", "-A", shop_module, "worker", "-Q", "light", "-P",
         "solo", "--without-mingle", "--without-gossip"], env=env, cwd=tmp_path,
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert ("cannot start worker: accept_content ['json', 'pickle'] accepts 'pickle' on a "
            "worker consuming lane queue(s) ['light']") in out.stderr
