"""``schedproj up`` restarts a process that exits, with backoff, logging its exit code; the
compose deployment restarts its workers too.

Real processes: ``schedproj up`` on a private Redis runs beat and both workers; the heavy
worker's main process is SIGKILLed (``kill -9``); ``up`` says how it exited, starts it again,
and heavy lanes run again on the new worker.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import yaml

from schedproj.devtools.embedded import private_redis
from schedproj.devtools.processes import (
    RESTART_MAX_S,
    RESTART_MIN_S,
    ProcessGroup,
    ProcessSpec,
    Restarter,
    wait_until,
)
from tests.procs import FAST_SETTINGS

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "compose" / "docker-compose.yml"


def children_of(pid: int) -> dict[int, str]:
    """{pid: command line} of the processes whose parent is ``pid``."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            out[int(entry.name)] = cmdline
    return out


def heavy_worker(up: subprocess.Popen[bytes]) -> int | None:
    return next((p for p, cmd in children_of(up.pid).items() if "-Q heavy" in cmd), None)


@pytest.mark.e2e
@pytest.mark.timeout(150)
def test_up_restarts_a_worker_killed_with_sigkill(tmp_path: Path) -> None:
    log = tmp_path / "up.log"
    with private_redis() as url:
        prefix = f"up-{os.getpid()}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDPROJ_")}
        env.update(FAST_SETTINGS, CELERY_BROKER_URL=url, SCHEDPROJ_REDIS_URL=url,
                   SCHEDPROJ_KEY_PREFIX=prefix, E2E_SCENARIO="fairness")
        with log.open("wb") as out:
            up = subprocess.Popen([sys.executable, "-m", "schedproj.ops.cli", "up", "--for",
                                   "90"], cwd=ROOT, env=env, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        try:
            runs = redis.Redis.from_url(url, decode_responses=True)
            key = f"{prefix}:e2e:runs"

            def heavy_runs_since(t: float) -> int:
                return sum(1 for x in runs.lrange(key, 0, -1)
                           if json.loads(x)["fence"] > 0 and json.loads(x)["start"] > t)

            assert wait_until(lambda: heavy_runs_since(0) > 0, 40), log.read_text()
            first = heavy_worker(up)
            assert first is not None
            os.kill(first, signal.SIGKILL)
            killed_at = time.time()
            assert wait_until(lambda: (p := heavy_worker(up)) is not None and p != first, 20), \
                log.read_text()
            # `up` writes its "restarted" line just after the new process exists, so the
            # test waits for the line rather than reading the log the instant the pid shows.
            assert wait_until(lambda: "heavy restarted (pid" in log.read_text(), 10), \
                log.read_text()
            text = log.read_text()
            assert re.search(rf"heavy \(pid {first}\) exited with signal 9 \(SIGKILL\) after "
                             rf"[\d.]+s; restarting in {RESTART_MIN_S:.1f}s", text), text
            # The new heavy worker is a working one: heavy lanes run on it.
            assert wait_until(lambda: heavy_runs_since(killed_at + 1.0) > 0, 40), \
                log.read_text()
            assert up.poll() is None, "up itself stays up"
        finally:
            up.send_signal(signal.SIGTERM)
            up.wait(timeout=30)
    assert up.returncode == 0, log.read_text()


def test_restart_backoff_doubles_while_a_child_keeps_exiting_and_is_capped(
        tmp_path: Path) -> None:
    """A child that exits at once: restarted after 1 s, 2 s, 4 s ... never faster, each exit
    logged with its code; up to 30 s between tries."""
    out = io.StringIO()
    group = ProcessGroup([ProcessSpec("light", (sys.executable, "-c",
                                                "import sys; sys.exit(3)"))], os.environ, out)
    group.start()
    restarter = Restarter(group, out)
    try:
        assert wait_until(lambda: group.dead() != [], 10)
        t = time.monotonic()
        restarter.check(t)
        assert restarter.due[0] == pytest.approx(t + RESTART_MIN_S)
        restarter.check(t + RESTART_MIN_S)
        assert restarter.restarts == 1
        assert wait_until(lambda: group.dead() != [], 10)
        restarter.check(t + RESTART_MIN_S + 0.1)
        assert restarter.due[0] == pytest.approx(t + 0.1 + 3 * RESTART_MIN_S)
        restarter.backoff[0] = RESTART_MAX_S * 4
        restarter.due.clear()
        restarter.check(t + 10)
        assert restarter.backoff[0] == RESTART_MAX_S
    finally:
        group.stop(timeout_s=5)
    assert "light (pid" in out.getvalue() and "exited with code 3" in out.getvalue()


def test_compose_restarts_every_schedproj_process() -> None:
    """Each schedproj service of the compose file (beat, heavy and light workers) and Redis
    carries a restart policy, so a worker that exits is started again."""
    services = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    for name in ("beat", "heavy", "light", "redis"):
        assert services[name].get("restart") in ("unless-stopped", "always", "on-failure"), \
            f"compose service {name} has no restart policy"


def test_spawned_children_die_with_a_parent_killed_outright(tmp_path: Path) -> None:
    """A chaos driver or `schedproj up` SIGKILLed must leave no orphaned workers and beats
    behind (before, a killed chaos driver left a fleet taking leases on its own)."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        "from pathlib import Path\n"
        "from schedproj.devtools.processes import spawn\n"
        f"c = spawn('sleeper', [sys.executable, '-c', 'import time; time.sleep(120)'], {{}}, "
        f"Path({str(tmp_path / 'child.log')!r}))\n"
        "print(c.popen.pid, flush=True)\n"
        "time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    os.kill(child, 0)  # alive
    parent.kill()
    parent.wait(5)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        with open(f"/proc/{child}/stat") as f:
            if f.read().rpartition(")")[2].split()[:1] == ["Z"]:
                return  # dead, not yet reaped (by init)
        time.sleep(0.1)
    os.kill(child, signal.SIGKILL)
    pytest.fail("the spawned child outlived its killed parent")
