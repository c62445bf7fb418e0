"""Run beat and one worker per queue as child processes: the everyday local layout.

Used by ``schedproj up`` and ``schedproj demo``. Children run the public commands, so what
works here works under a process supervisor or compose too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from schedproj import defaults


@dataclass(frozen=True)
class ProcessSpec:
    label: str
    argv: tuple[str, ...]


def layout(app: str, *, light_concurrency: int, loglevel: str) -> list[ProcessSpec]:
    """The three processes of a deployment: heavy worker (-c 1), light worker, fair beat."""
    celery = (sys.executable, "-m", "celery", "-A", app)
    common = ("--without-gossip", "--without-mingle", "-l", loglevel)
    return [
        ProcessSpec("heavy", (*celery, "worker", "-Q", defaults.HEAVY_QUEUE, "-c", "1",
                              "-n", "heavy@%h", *common)),
        ProcessSpec("light", (*celery, "worker", "-Q", defaults.LIGHT_QUEUE, "-c",
                              str(light_concurrency), "-n", "light@%h", *common)),
        ProcessSpec("beat", (*celery, "beat", "-S", "fair", "-l", loglevel)),
    ]


@dataclass
class Spawned:
    """A child started in its own session, so a signal reaches a prefork worker's pool too."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path | None = None

    def text(self) -> str:
        """What the child has written to its log so far."""
        if self.log is None or not self.log.exists():
            return ""
        return self.log.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def alive(self) -> bool:
        return self.popen.poll() is None


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str,
             poll_s: float = 0.02) -> object:
    """Poll until ``predicate()`` is truthy and return it; TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(poll_s)


def spawn(name: str, argv: list[str], env: Mapping[str, str], log: Path,
          cwd: Path | None = None) -> Spawned:
    """Start ``argv`` in a new session, stdout and stderr to ``log``."""
    with log.open("wb") as out:
        popen = subprocess.Popen(argv, env=dict(env), cwd=cwd, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    return Spawned(name, popen, log)


def stop_all(children: list[Spawned], timeout_s: float = 10.0) -> None:
    """SIGTERM every live child (resuming any that are stopped), then SIGKILL stragglers."""
    for child in children:
        if child.alive():
            child.signal(signal.SIGCONT)
            child.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for child in children:
        try:
            child.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.signal(signal.SIGKILL)
            child.popen.wait(timeout=5)


def _pump(label: str, stream: IO[bytes], out: IO[str]) -> None:
    for raw in iter(stream.readline, b""):
        out.write(f"[{label:5}] {raw.decode(errors='replace')}")
        out.flush()


@dataclass
class ProcessGroup:
    """Child processes started together, their output relayed with a label, stopped together."""

    specs: list[ProcessSpec]
    env: Mapping[str, str]
    out: IO[str] = field(default_factory=lambda: sys.stdout)
    children: list[tuple[ProcessSpec, subprocess.Popen[bytes]]] = field(default_factory=list)

    def start(self) -> None:
        for spec in self.specs:
            popen = subprocess.Popen(spec.argv, env=dict(self.env), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
            assert popen.stdout is not None
            threading.Thread(target=_pump, args=(spec.label, popen.stdout, self.out),
                             daemon=True).start()
            self.children.append((spec, popen))

    def dead(self) -> list[tuple[str, int]]:
        """(label, exit code) of every child that has exited."""
        return [(s.label, p.returncode) for s, p in self.children if p.poll() is not None]

    def stop(self, timeout_s: float = 15.0) -> None:
        for _, popen in self.children:
            if popen.poll() is None:
                os.killpg(popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for _, popen in self.children:
            try:
                popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(popen.pid, signal.SIGKILL)
                popen.wait()


def run_all(specs: list[ProcessSpec], env: Mapping[str, str], *,
            duration_s: float | None = None, out: IO[str] = sys.stdout) -> int:
    """Start every process and wait: 0 after ``duration_s`` or Ctrl-C/SIGTERM, 1 if a process
    died on its own (the others are stopped too)."""
    group = ProcessGroup(specs, env, out)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    code = 0
    try:
        group.start()
        deadline = None if duration_s is None else time.monotonic() + duration_s
        while not stop.is_set():
            dead = group.dead()
            if dead:
                for label, rc in dead:
                    out.write(f"schedproj: {label} exited with code {rc}; stopping the others\n")
                code = 1
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            stop.wait(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        group.stop()
    return code
