"""The package as users get it: the sdist and wheel built, the wheel installed into a fresh
virtualenv outside the checkout, and an outside app run against it.

The app declares one heavy and one light lane with ``configure_app``; ``celery -A thatapp
worker`` and ``celery -A thatapp beat -S fair`` (the ``fair`` entry point) run them, and the
``schedproj`` command of the installed package lists the lanes, declares the deployment and
reads the status. Every process runs from a directory outside the checkout with no
PYTHONPATH, so schedproj (and its Lua scripts) can only come from the installed wheel.

The wheel goes in with ``--no-deps``: its dependencies are the ones this suite tested (all but
the checkout's own schedproj), made visible to the new environment by a ``.pth`` line.
Resolving them again from an index would take over a minute and test pip rather than the
package; ``pip check`` proves the wheel's declared requirements are met by them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import E2E_REDIS_URL

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]

APP = '''
from celery import Celery

from schedproj import Lane, LaneKind, LaneTask, configure_app

app = Celery("thatapp")
configure_app(app)


@app.task(base=LaneTask, bind=True, name="thatapp.crunch",
          lane=Lane(cadence_s=1, kind=LaneKind.HEAVY))
def crunch(self):
    return None


@app.task(base=LaneTask, bind=True, name="thatapp.tidy",
          lane=Lane(cadence_s=1, kind=LaneKind.LIGHT))
def tidy(self):
    return None
'''


#: Where the new environment finds schedproj, its Lua scripts and the `fair` entry point.
WHERE_FROM = """
import importlib.metadata as m, importlib.resources as r, json, schedproj
(fair,) = m.entry_points(group="celery.beat_schedulers", name="fair")
print(json.dumps({"package": schedproj.__file__, "version": schedproj.__version__,
                  "metadata_version": m.version("schedproj"),
                  "lua": str(r.files("schedproj.store") / "lua" / "lease_acquire.lua"),
                  "fair": str(fair.dist.locate_file(""))}))
"""


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 120) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{args}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done.stdout


def build(out: Path) -> tuple[Path, Path]:
    """(sdist, wheel) of the checkout; the wheel is built from the sdist, so both must carry
    the Lua scripts."""
    run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], cwd=out.parent,
        timeout=150)
    (sdist,), (wheel,) = out.glob("schedproj-*.tar.gz"), out.glob("schedproj-*.whl")
    return sdist, wheel


def suite_dependencies(where: Path) -> Path:
    """A directory of links to this suite's installed packages, all but schedproj itself (the
    checkout's editable install), so schedproj, its metadata and its entry points can only
    come from the wheel."""
    deps = where.parent / "tested-dependencies"
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if "schedproj" not in entry.name and not entry.name.endswith(".pth"):
            (deps / entry.name).symlink_to(entry)
    return deps


def fresh_venv(where: Path, wheel: Path) -> Path:
    """A new virtualenv with the wheel installed; returns its bin directory."""
    run([sys.executable, "-m", "venv", "--without-pip", str(where)], cwd=where.parent)
    python = where / "bin" / "python"
    purelib = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                  cwd=where.parent).strip()
    (Path(purelib) / "tested_dependencies.pth").write_text(f"{suite_dependencies(where)}\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    run([*pip, "install", "-q", "--no-deps", str(wheel)], cwd=where.parent)
    run([*pip, "check"], cwd=where.parent)
    return where / "bin"


@pytest.fixture
def outside_env(tmp_path: Path, e2e_redis: redis.Redis) -> Iterator[tuple[Path, Path, dict]]:
    sdist, wheel = build(tmp_path / "dist")
    assert sdist.stat().st_size > 0
    bin_dir = fresh_venv(tmp_path / "venv", wheel)
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "thatapp.py").write_text(textwrap.dedent(APP))
    e2e_redis.flushdb()  # the fixture declared its own prefix fresh: `schedproj init` does it here
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SCHEDPROJ_", "CELERY_")) and k != "PYTHONPATH"}
    env.update({"CELERY_BROKER_URL": E2E_REDIS_URL, "SCHEDPROJ_KEY_PREFIX": "thatapp",
                "SCHEDPROJ_LEASE_TTL_S": "2", "SCHEDPROJ_BEAT_MAX_LOOP_INTERVAL_S": "0.5",
                "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"})
    yield bin_dir, app_dir, env


def lane_runs(bin_dir: Path, app_dir: Path, env: dict[str, str]) -> dict[str, int]:
    status = json.loads(run([str(bin_dir / "schedproj"), "status", "--json"], app_dir, env))
    return {lane["name"]: lane["runs"] for lane in status["lanes"]}


def test_an_outside_app_runs_its_lanes_on_the_installed_wheel(
        outside_env: tuple[Path, Path, dict[str, str]]) -> None:
    bin_dir, app_dir, env = outside_env
    where = json.loads(run([str(bin_dir / "python"), "-c", WHERE_FROM], app_dir, env))
    for found in (where["package"], where["lua"], where["fair"]):
        assert found.startswith(str(bin_dir.parent)) and str(ROOT) not in found, where
    assert where["version"] == where["metadata_version"] != "0+unknown", where
    lanes = json.loads(run([str(bin_dir / "schedproj"), "lanes", "-A", "thatapp", "--json"],
                           app_dir, env))
    assert {(row["task"], row["queue"]) for row in lanes["lanes"]} == {
        ("thatapp.crunch", "heavy"), ("thatapp.tidy", "light")}, lanes
    run([str(bin_dir / "schedproj"), "init"], app_dir, env)
    # Celery's own console script lives with the tested dependencies: run it by the new
    # environment's interpreter, which finds schedproj (and its `fair` entry point) in the wheel.
    celery = [str(bin_dir / "python"), "-m", "celery"]
    log = (app_dir / "processes.log").open("w")
    procs = [subprocess.Popen([*celery, "-A", "thatapp", *args, "--loglevel", "warning"],
                              cwd=app_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
             for args in (["worker", "-Q", "heavy,light", "-c", "2"], ["beat", "-S", "fair"])]
    try:
        runs: dict[str, int] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            runs = lane_runs(bin_dir, app_dir, env)
            if len(runs) == 2 and all(n > 0 for n in runs.values()):
                break
            assert all(p.poll() is None for p in procs), \
                (app_dir / "processes.log").read_text()[-4000:]
            time.sleep(1)
        assert len(runs) == 2 and all(n > 0 for n in runs.values()), runs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
