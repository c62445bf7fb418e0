"""A lane whose task does not carry out the lane protocol is a declaration error (issue 10,
found #5): named with the lane and the fix at app, worker and beat start and in `schedproj
lanes`. Before, a heavy lane declared without ``base=LaneTask`` was accepted and ran without
the lease (or logged a traceback on every tick).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, Task

from schedproj import Lane, LaneKind, LaneTask, configure_app
from schedproj.core.errors import LaneDeclarationError
from schedproj.on_celery.config import lane_set_for, validate_or_exit
from schedproj.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
#: Nothing listens here: a process that starts anyway only retries, it touches no Redis.
NOWHERE_URL = "redis://127.0.0.1:9/0"


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> Iterator[Celery]:
    for name in list(os.environ):
        if name.startswith("SCHEDPROJ_") or name == "CELERY_BROKER_URL":
            monkeypatch.delenv(name)
    celery_app = Celery("t", broker="memory://", set_as_current=False)
    yield celery_app
    celery_app.close()


def configured(app: Celery) -> Celery:
    return configure_app(app, Settings.load(CELERY_BROKER_URL="redis://127.0.0.1:6379/14"))


def assert_names_lane_and_fix(exc: LaneDeclarationError, lane: str, fix: str) -> None:
    message = str(exc)
    assert exc.lane == lane and f"lane {lane!r}" in message
    assert "Fix:" in message and fix in exc.fix


@pytest.mark.parametrize("kind", [LaneKind.HEAVY, LaneKind.LIGHT])
def test_lane_without_lanetask_base_is_refused(app: Celery, kind: LaneKind) -> None:
    @app.task(shared=False, name="t.plain", lane=Lane(cadence_s=60, kind=kind))
    def plain(**kwargs: Any) -> None: ...

    with pytest.raises(LaneDeclarationError) as info:
        lane_set_for(configured(app))
    assert_names_lane_and_fix(info.value, "t.plain", "base=schedproj.LaneTask")
    assert "lease" in info.value.problem


def test_lane_named_by_option_is_named_in_the_error(app: Celery) -> None:
    @app.task(shared=False, name="t.task", lane=Lane(name="nightly", cadence_s=60))
    def task() -> None: ...

    with pytest.raises(LaneDeclarationError) as info:
        lane_set_for(configured(app))
    assert_names_lane_and_fix(info.value, "nightly", "LaneTask")
    assert "'t.task'" in info.value.problem


def test_other_task_base_is_refused(app: Celery) -> None:
    class MyTask(Task):  # type: ignore[misc]
        abstract = True

    @app.task(shared=False, base=MyTask, name="t.mine", lane=Lane(cadence_s=60))
    def mine() -> None: ...

    with pytest.raises(LaneDeclarationError) as info:
        lane_set_for(configured(app))
    assert_names_lane_and_fix(info.value, "t.mine", "LaneTask")


def test_lanetask_subclass_skipping_the_protocol_is_refused(app: Celery) -> None:
    class Bypass(LaneTask):
        abstract = True

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return self.run(*args, **kwargs)

    @app.task(shared=False, base=Bypass, name="t.bypass", lane=Lane(cadence_s=60))
    def bypass() -> None: ...

    with pytest.raises(LaneDeclarationError) as info:
        lane_set_for(configured(app))
    assert_names_lane_and_fix(info.value, "t.bypass", "super().__call__")


def test_lanetask_and_subclasses_keeping_the_protocol_are_accepted(app: Celery) -> None:
    class Wrapped(LaneTask):
        abstract = True

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return super().__call__(*args, **kwargs)

    @app.task(shared=False, base=LaneTask, name="t.a", lane=Lane(cadence_s=60))
    def a() -> None: ...

    @app.task(shared=False, base=Wrapped, name="t.b", lane=Lane(cadence_s=60, kind="light"))
    def b() -> None: ...

    @app.task(shared=False, name="t.not-a-lane")
    def not_a_lane() -> None: ...

    # (Shared tasks other test modules declared may join this app too: look at ours.)
    names = lane_set_for(configured(app)).names
    assert "t.a" in names and "t.b" in names and "t.not-a-lane" not in names


def test_validate_or_exit_names_the_lane(app: Celery, capsys: pytest.CaptureFixture[str]) -> None:
    @app.task(shared=False, name="t.plain", lane=Lane(cadence_s=60))
    def plain() -> None: ...

    with pytest.raises(SystemExit) as info:
        validate_or_exit(configured(app), "worker")
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "cannot start worker" in err and "'t.plain'" in err and "LaneTask" in err


BAD_MODULE = textwrap.dedent("""
    from celery import shared_task
    from schedproj import Lane

    @shared_task(name="bad.heavy", lane=Lane(cadence_s=60))
    def heavy(**kwargs):
        return None
""")


@pytest.fixture
def bad_module(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "bad_lanes_mod.py").write_text(BAD_MODULE)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SCHEDPROJ_") and k != "CELERY_BROKER_URL"}
    return {**env, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
            "SCHEDPROJ_LANE_MODULES": "bad_lanes_mod", "CELERY_BROKER_URL": NOWHERE_URL,
            "SCHEDPROJ_REDIS_URL": NOWHERE_URL}


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run to exit; a process that started instead of refusing is stopped and fails the test."""
    try:
        return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=45)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(args[-4:])} started instead of refusing the lane")


def test_schedproj_lanes_reports_the_lane(bad_module: dict[str, str]) -> None:
    out = run([sys.executable, "-m", "schedproj.ops.cli", "lanes", "--lanes", "bad_lanes_mod"],
              bad_module)
    assert out.returncode != 0
    assert "'bad.heavy'" in out.stderr and "LaneTask" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("role", [["worker", "-Q", "heavy", "-c", "1", "-P", "solo"],
                                  ["beat", "-S", "fair"]])
def test_worker_and_beat_refuse_to_start(bad_module: dict[str, str], role: list[str]) -> None:
    out = run([sys.executable, "-m", "celery", "-A", "schedproj.app", *role], bad_module)
    assert out.returncode != 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "'bad.heavy'" in out.stderr and "LaneTask" in out.stderr
