"""Issue 13's findings, met as a new user adopting schedproj in their own ``Celery("myops")``
app: every process and command, on any failure, prints one or two lines naming the thing
(setting, lane, URL with credentials masked) and the fix; tracebacks only for bugs."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import Celery
from click.testing import CliRunner
from rich.console import Console

from schedproj.core.health import LaneHealth
from schedproj.core.lanes import LaneKind, LaneSpec
from schedproj.core.laneset import registry_json
from schedproj.core.records import RunRecord, encode
from schedproj.devtools.processes import ProcessGroup, ProcessSpec
from schedproj.ops.cli import main
from schedproj.settings import Settings
from schedproj.store.protocol import Keys, run_field

ROOT = Path(__file__).resolve().parents[2]

MYOPS = """
from celery import Celery
from schedproj import configure_app
app = Celery("myops")
configure_app(app)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_app(where: Path, source: str, name: str | None = None) -> str:
    """A user's app module in ``where``, under a fresh name (in-process imports are cached)."""
    name = name or f"myops_{uuid.uuid4().hex[:8]}"
    (where / f"{name}.py").write_text(textwrap.dedent(source))
    return name


def child_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SCHEDPROJ_", "CELERY_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    env.update(extra)
    return env


def celery(tmp_path: Path, env: dict[str, str], *args: str,
           run_for_s: float | None = None) -> tuple[int, str]:
    """Run ``celery ARGS`` in ``tmp_path``: (exit code, output); stopped after run_for_s."""
    proc = subprocess.Popen([sys.executable, "-m", "celery", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True)
    try:
        out, _ = proc.communicate(timeout=run_for_s if run_for_s else 60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    return proc.returncode, out


# -- 1. no lanes: the fix that applies to the user's own app ---------------------------------

def test_lanes_of_an_app_without_lanes_fails_naming_the_fix(tmp_path: Path) -> None:
    # A fresh interpreter: shared tasks other tests imported would join any app made here.
    name = write_app(tmp_path, MYOPS)
    result = subprocess.run([sys.executable, "-m", "schedproj.ops.cli", "lanes", "-A", name],
                            cwd=tmp_path, env=child_env(tmp_path), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode != 0, result.stdout
    assert "declares no lanes" in result.stderr
    assert "include=" in result.stderr  # the fix for an own app: its include list
    assert len(result.stderr.strip().splitlines()) <= 2


def test_lanes_option_ignored_by_an_own_app_is_an_error(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SCHEDPROJ_LANE_MODULES", "")  # --lanes sets it: restored afterwards
    name = write_app(tmp_path, MYOPS)
    result = CliRunner().invoke(main, ["up", "-A", name, "--lanes", "my.lanes", "--for", "1"])
    assert result.exit_code != 0
    assert "only schedproj.app reads" in result.output and "my.lanes" in result.output


def test_beat_no_lanes_message_fits_the_app() -> None:
    from schedproj.on_celery.config import configure_app, no_lanes_message

    own = configure_app(Celery("myops"), Settings())
    assert "SCHEDPROJ_LANE_MODULES and --lanes are read only by schedproj.app" in \
        no_lanes_message(own)
    assert "Celery('myops', include=" in no_lanes_message(own)
    assert "set SCHEDPROJ_LANE_MODULES" in no_lanes_message(Celery("schedproj"))


# -- 2. Redis down: one line naming the URL (masked) and the setting -------------------------

def test_beat_with_nothing_listening_says_so_in_a_few_lines(tmp_path: Path) -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    name = write_app(tmp_path, MYOPS)
    _, out = celery(tmp_path, child_env(tmp_path, CELERY_BROKER_URL=url),
                       "-A", name, "beat", "-S", "fair", "-l", "info", run_for_s=8)
    lines = out.strip().splitlines()
    assert len(lines) < 25, out[-3000:]
    assert "Traceback" not in out
    assert "hunter2" not in out
    failure = [line for line in lines if "cannot reach" in line]
    assert failure, out
    assert "ERROR" in failure[0] and "CELERY_BROKER_URL" in failure[0] and "Fix:" in failure[0]


def test_pause_with_redis_down_prints_one_clean_line() -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    for args in (["pause", "x"], ["resume", "x"], ["run", "x"]):
        result = CliRunner().invoke(main, args, env={"CELERY_BROKER_URL": url})
        assert result.exit_code == 1, (args, result.output, result.exception)
        assert len(result.output.strip().splitlines()) == 1, result.output
        assert "CELERY_BROKER_URL" in result.output and "Fix:" in result.output
        assert "hunter2" not in result.output and "Traceback" not in result.output


# -- 3. a bad setting under celery's own commands --------------------------------------------

@pytest.mark.parametrize("app", ["schedproj.app", "own"])
def test_bad_setting_under_celery_names_it_and_the_fix(tmp_path: Path, app: str) -> None:
    if app == "own":
        app = write_app(tmp_path, MYOPS)
    code, out = celery(tmp_path, child_env(tmp_path, SCHEDPROJ_LEASE_TTL_S="abc"),
                       "-A", app, "beat", "-S", "fair")
    assert code == 2, out
    assert "Traceback" not in out and "Unable to load celery application" not in out
    assert len(out.strip().splitlines()) <= 3, out
    assert "SCHEDPROJ_LEASE_TTL_S" in out
    assert "Fix: unset SCHEDPROJ_LEASE_TTL_S (default 20.0)" in out


# -- 4. start-up check failures are errors, not warnings --------------------------------------

def test_beat_logs_a_failed_start_up_check_at_error(tmp_path: Path) -> None:
    name = write_app(tmp_path, """
        from celery import Celery
        from schedproj import Lane, LaneKind, LaneTask, configure_app
        app = Celery("badops")
        configure_app(app)

        @app.task(base=LaneTask, bind=True, name="too-long", time_limit=10**6,
                  lane=Lane(cadence_s=60, kind=LaneKind.HEAVY))
        def too_long(self):
            pass
        """)
    code, out = celery(tmp_path, child_env(tmp_path), "-A", name, "beat", "-S", "fair",
                       "-l", "info")
    assert code == 2, out
    line = next(x for x in out.splitlines() if "cannot start beat" in x)
    assert "ERROR" in line and "WARNING" not in line, line
    assert "too-long" in line


# -- 5. a standby beat says so ----------------------------------------------------------------

def test_standby_beat_says_once_what_it_waits_for(caplog: pytest.LogCaptureFixture) -> None:
    from schedproj.on_celery.beat import FairScheduler

    beat = FairScheduler.__new__(FairScheduler)
    beat.active, beat.token = False, "abcdef0123456789"
    beat.settings = Settings(beat_lock_ttl_s=3, beat_max_loop_interval_s=0.5)
    with caplog.at_level(logging.INFO, logger="schedproj.beat"):
        for _ in range(5):
            beat._go_standby("beat lock held by another beat (12345678)")
    said = [r for r in caplog.records if "standing by" in r.getMessage()]
    assert len(said) == 1
    assert "12345678" in said[0].getMessage() and "3s" in said[0].getMessage()


# -- 6. stopping `up` lets pool children finish ----------------------------------------------

CHILD = """
import os, signal, subprocess, sys, time
marker = sys.argv[1]
grandchild = subprocess.Popen([sys.executable, "-c", '''
import signal, sys, time
marker = sys.argv[1]
signal.signal(signal.SIGTERM, lambda *_: (open(marker, "a").write("killed mid-run\\\\n"),
                                          sys.exit(1)))
time.sleep(1.0)
open(marker, "a").write("finished\\\\n")
''', marker])
def warm(*_):
    grandchild.wait()   # a warm shutdown: wait for the running task
    sys.exit(0)
signal.signal(signal.SIGTERM, warm)
print("ready", flush=True)
time.sleep(60)
"""


def test_process_group_stop_lets_pool_children_finish(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    out = open(os.devnull, "w")  # noqa: SIM115
    group = ProcessGroup([ProcessSpec("light", (sys.executable, str(script), str(marker)))],
                         os.environ, out)
    group.start()
    time.sleep(0.5)
    group.stop(timeout_s=10)
    out.close()
    assert marker.read_text() == "finished\n"


# -- 7. resume, lanes of another app, paused-and-running, the blocker column ------------------

@pytest.fixture
def published(client: redis.Redis, key_prefix: str) -> Keys:
    """A beat of another app published its lanes ('other'); lane 'job' has state here."""
    keys = Keys(key_prefix)
    specs = SimpleNamespace(specs=(LaneSpec("other", "other", LaneKind.LIGHT, 60.0),))
    client.set(keys.published_lanes, registry_json(specs, Settings()))
    client.hset(keys.lanes, run_field("job"), encode(RunRecord(last_run_at=time.time(),
                                                               runs=1)))
    return keys


def env_for(redis_url: str, keys: Keys) -> dict[str, str]:
    return {"CELERY_BROKER_URL": redis_url, "SCHEDPROJ_KEY_PREFIX": keys.prefix}


def test_resume_of_an_unknown_lane_fails(published: Keys, redis_url: str) -> None:
    result = CliRunner().invoke(main, ["resume", "nosuch"], env=env_for(redis_url, published))
    assert result.exit_code == 1
    assert "no lane 'nosuch'" in result.output and "other" in result.output


def test_lane_of_another_app_on_the_same_prefix_is_explained(published: Keys,
                                                             redis_url: str) -> None:
    env = env_for(redis_url, published)
    result = CliRunner().invoke(main, ["run", "job"], env=env)
    assert result.exit_code == 1
    assert "SCHEDPROJ_KEY_PREFIX" in result.output and "'job'" in result.output
    status = CliRunner().invoke(main, ["status", "--json"], env=env)
    assert json.loads(status.output)["undeclared_lanes"] == ["job"]
    text = CliRunner().invoke(main, ["status"], env=env)
    assert "job" in text.output and "SCHEDPROJ_KEY_PREFIX" in text.output


def lane_health(**over: Any) -> LaneHealth:
    base: dict[str, Any] = dict(
        name="summary", kind="heavy", queue="heavy", deployment="shared", enabled=True,
        paused=False, cadence_s=600.0, last_run_at=None, ratio=1.5, due=True, in_flight=False,
        backlog=0, last_outcome=None, last_reason=None, runs=0, failures=0, dispatches=0,
        deferral_reason=None, deferral_blocker=None, deferred_for_s=None)
    return LaneHealth(**{**base, **over})


def test_a_paused_lane_still_running_says_both() -> None:
    from schedproj.telemetry.status import lane_state_word

    assert lane_state_word(lane_health(paused=True, in_flight=True)) == "paused, running"
    assert lane_state_word(lane_health(paused=True)) == "paused"


def test_the_blocker_is_never_cut_off() -> None:
    from schedproj.telemetry.status import _lane_table

    blocker = "memory-summary-backfill-for-the-long-sessions"
    lanes = (lane_health(deferral_reason="gate", deferral_blocker=blocker, deferred_for_s=42.0,
                         last_outcome="failed", last_reason="x" * 50),
             lane_health(name="golden-path-scoring-of-the-graph", kind="light"))
    health = SimpleNamespace(lanes=lanes, posture=SimpleNamespace(value="healthy"))
    console = Console(width=160, record=True)
    console.print(_lane_table(SimpleNamespace(now=time.time()), health))
    assert f"gate / {blocker} / 42s" in console.export_text()


# -- 8. two lane declarations on one task name -----------------------------------------------

def test_duplicate_lane_task_name_is_warned(caplog: pytest.LogCaptureFixture) -> None:
    from schedproj import Lane, LaneTask
    from schedproj.on_celery.config import configure_app

    app = configure_app(Celery(f"dup{uuid.uuid4().hex[:6]}"), Settings())

    def first(self: LaneTask) -> None: ...

    def second(self: LaneTask) -> None: ...

    with caplog.at_level(logging.WARNING, logger="schedproj.on_celery.config"):
        for fun in (first, second):
            app.task(base=LaneTask, bind=True, name="dup.job", shared=False,
                     lane=Lane(cadence_s=60, kind=LaneKind.LIGHT))(fun)
        app.finalize()
        assert "dup.job" in app.tasks
    said = [r.getMessage() for r in caplog.records if "declared twice" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert "first" in said[0] and "second" in said[0] and "name=" in said[0]
