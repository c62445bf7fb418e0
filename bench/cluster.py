"""Real ``celery worker`` / ``celery beat`` processes for one live scenario, on loopback."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

from schedproj.devtools.processes import Spawned, spawn, stop_all, wait_for

ROOT = Path(__file__).resolve().parent.parent

#: Variables a scenario sets itself; inherited values would leak into the processes.
FOREIGN_PREFIXES = ("SCHEDPROJ_", "CELERY_", "SENTRY_", "BENCH_", "E2E_")


def scenario_env(redis_url: str, scenario: str, prefix: str,
                 extra: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN_PREFIXES)}
    path = [str(ROOT), *filter(None, [env.get("PYTHONPATH")])]
    env.update({
        "CELERY_BROKER_URL": redis_url,
        "SCHEDPROJ_REDIS_URL": redis_url,
        "SCHEDPROJ_KEY_PREFIX": prefix,
        "SCHEDPROJ_LANE_MODULES": "bench.lanes",
        "BENCH_SCENARIO": scenario,
        "PYTHONPATH": os.pathsep.join(path),
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra)
    return env


def cpu_seconds(pgid: int) -> float:
    """User plus system CPU time of every live process in process group ``pgid``."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After the command: state, ppid, pgrp, ... utime (field 14), stime (field 15).
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / ticks


def redis_server_pid(url: str) -> int | None:
    """The pid of the private ``redis-server`` listening on ``url``'s port (ours), if found."""
    port = str(urlsplit(url).port)
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        # redis-server retitles itself "/usr/bin/redis-server 127.0.0.1:PORT".
        if words and "redis-server" in words[0] and (
                words[0].endswith(f":{port}") or port in words):
            return int(cmdline.parent.name)
    return None


def process_cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Proc(Spawned):
    """A benchmark process; also reports the CPU time of its session."""

    def cpu_seconds(self) -> float:
        """CPU time used so far by this process and its children (its own session)."""
        return cpu_seconds(self.popen.pid)


@dataclass
class Cluster:
    """Processes sharing one environment; stopped together (``with Cluster(...) as c``)."""

    env: dict[str, str]
    logdir: Path
    procs: list[Proc] = field(default_factory=list)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop_all()

    def start(self, name: str, *args: str) -> Proc:
        started = spawn(name, [sys.executable, "-m", "celery", *args], self.env,
                        self.logdir / f"{name}.log", cwd=ROOT)
        proc = Proc(started.name, started.popen, started.log)
        self.procs.append(proc)
        return proc

    def _ready(self, proc: Proc, marker: str, what: str) -> Proc:
        try:
            wait_for(lambda: marker in proc.text() or not proc.alive(), 60, what)
        except TimeoutError as exc:
            raise RuntimeError(f"{exc}; its log:\n{proc.text()[-3000:]}") from None
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited at start; its log:\n{proc.text()[-3000:]}")
        return proc

    def worker(self, name: str, queue: str, concurrency: int) -> Proc:
        proc = self.start(name, "-A", "schedproj.app", "worker", "-Q", queue, "-c",
                          str(concurrency), "-n", f"{name}@%h", "--without-gossip",
                          "--without-mingle", "--without-heartbeat", "-l", "info")
        return self._ready(proc, "ready.", f"worker {name} to be ready")

    def fair_beat(self) -> Proc:
        proc = self.start("beat", "-A", "schedproj.app", "beat", "-S", "fair", "-l", "info",
                          "-s", str(self.logdir / "unused-schedule"))
        return self._ready(proc, ": active", "the fair beat to be active")

    def bare_beat(self) -> Proc:
        proc = self.start("bare-beat", "-A", "bench.bare_app", "beat", "-S",
                          "celery.beat:PersistentScheduler", "-l", "info",
                          "-s", str(self.logdir / "celerybeat-schedule"))
        return self._ready(proc, "beat: Starting", "the bare beat to start")

    def check_alive(self) -> None:
        for proc in self.procs:
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited (code {proc.popen.returncode}); its "
                                   f"log:\n{proc.text()[-3000:]}")

    def stop_all(self) -> None:
        stop_all(list(self.procs))
