"""Run beat and one worker per queue as child processes: the everyday local layout.

Used by ``schedproj up`` and ``schedproj demo``. Children run the public commands, so what
works here works under a process supervisor or compose too.
"""

from __future__ import annotations

import contextlib
import ctypes
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

from schedproj.core import defaults


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
    """Poll until ``predicate()`` is truthy and return it; TimeoutError naming ``what``.

    The one polling loop of the project and its tests (:func:`wait_until` asks it too)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(poll_s)


def wait_until(predicate: Callable[[], object], timeout_s: float, poll_s: float = 0.02) -> bool:
    """Poll until ``predicate()`` is truthy: True, or False once ``timeout_s`` has passed."""
    try:
        wait_for(predicate, timeout_s, "a condition", poll_s)
    except TimeoutError:
        return False
    return True


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGKILL it when the process that spawned it dies, so
    a supervisor or chaos driver killed outright leaves no orphaned workers and beats behind
    (they would go on taking leases from a fleet nobody watches)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: children outlive a killed parent, as before


_PR_SET_PDEATHSIG = 1


def spawn(name: str, argv: list[str], env: Mapping[str, str], log: Path,
          cwd: Path | None = None) -> Spawned:
    """Start ``argv`` in a new session, stdout and stderr to ``log``; it dies with us."""
    with log.open("wb") as out:
        popen = subprocess.Popen(argv, env=dict(env), cwd=cwd, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True,
                                 preexec_fn=_die_with_parent)
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


#: Restart backoff of ``schedproj up``: the first restart waits this long, each quick exit
#: after it doubles the wait, up to the cap; a child that ran this long resets it.
RESTART_MIN_S = 1.0
RESTART_MAX_S = 30.0
STABLE_S = 60.0


@dataclass
class ProcessGroup:
    """Child processes started together, their output relayed with a label, stopped together."""

    specs: list[ProcessSpec]
    env: Mapping[str, str]
    out: IO[str] = field(default_factory=lambda: sys.stdout)
    children: list[tuple[ProcessSpec, subprocess.Popen[bytes]]] = field(default_factory=list)
    #: When each child (same index) was last started (monotonic seconds).
    started_at: list[float] = field(default_factory=list)

    def _popen(self, spec: ProcessSpec) -> subprocess.Popen[bytes]:
        popen = subprocess.Popen(spec.argv, env=dict(self.env), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, start_new_session=True,
                                 preexec_fn=_die_with_parent)
        assert popen.stdout is not None
        threading.Thread(target=_pump, args=(spec.label, popen.stdout, self.out),
                         daemon=True).start()
        return popen

    def start(self) -> None:
        for spec in self.specs:
            self.children.append((spec, self._popen(spec)))
            self.started_at.append(time.monotonic())

    def restart(self, index: int) -> subprocess.Popen[bytes]:
        """Start child ``index`` again (after it exited); its pool's leftovers get SIGKILL."""
        spec, old = self.children[index]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(old.pid, signal.SIGKILL)  # orphaned pool children of a killed worker
        popen = self._popen(spec)
        self.children[index] = (spec, popen)
        self.started_at[index] = time.monotonic()
        return popen

    def dead(self) -> list[tuple[str, int]]:
        """(label, exit code) of every child that has exited."""
        return [(s.label, p.returncode) for s, p in self.children if p.poll() is not None]

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM each child's main process only: a Celery worker then shuts down warmly,
        letting its pool children finish their runs (SIGTERM to the whole process group
        would kill them mid-run, a WorkerLostError). Stragglers' groups get SIGKILL."""
        for _, popen in self.children:
            if popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for _, popen in self.children:
            try:
                popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait()


def describe_exit(rc: int) -> str:
    """``code 1`` or ``signal 9 (SIGKILL)`` for a Popen return code."""
    if rc < 0:
        try:
            return f"signal {-rc} ({signal.Signals(-rc).name})"
        except ValueError:
            return f"signal {-rc}"
    return f"code {rc}"


@dataclass
class Restarter:
    """Restarts exited children with backoff, as a process supervisor would."""

    group: ProcessGroup
    out: IO[str]
    #: Next wait per child index, and when a pending restart is due.
    backoff: dict[int, float] = field(default_factory=dict)
    due: dict[int, float] = field(default_factory=dict)
    restarts: int = 0

    def check(self, now: float) -> None:
        for i, (spec, popen) in enumerate(self.group.children):
            if popen.poll() is None or i in self.due:
                continue
            ran = now - self.group.started_at[i]
            wait = RESTART_MIN_S if ran >= STABLE_S else self.backoff.get(i, RESTART_MIN_S)
            self.backoff[i] = min(wait * 2, RESTART_MAX_S)
            self.due[i] = now + wait
            self.out.write(f"schedproj: {spec.label} (pid {popen.pid}) exited with "
                           f"{describe_exit(popen.returncode)} after {ran:.1f}s; restarting "
                           f"in {wait:.1f}s\n")
            self.out.flush()
        for i, when in list(self.due.items()):
            if now >= when:
                del self.due[i]
                popen = self.group.restart(i)
                self.restarts += 1
                self.out.write(f"schedproj: {self.group.children[i][0].label} restarted "
                               f"(pid {popen.pid})\n")
                self.out.flush()


def run_all(specs: list[ProcessSpec], env: Mapping[str, str], *,
            duration_s: float | None = None, out: IO[str] = sys.stdout,
            restart: bool = True) -> int:
    """Start every process and wait: 0 after ``duration_s`` or Ctrl-C/SIGTERM.

    A process that exits on its own is started again (``restart``) after a backoff of
    1 s doubling to 30 s while it keeps exiting within a minute, its exit code logged; without
    ``restart`` the others are stopped too and the answer is 1."""
    group = ProcessGroup(specs, env, out)
    restarter = Restarter(group, out)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    code = 0
    try:
        group.start()
        deadline = None if duration_s is None else time.monotonic() + duration_s
        while not stop.is_set():
            if restart:
                restarter.check(time.monotonic())
            elif dead := group.dead():
                for label, rc in dead:
                    out.write(f"schedproj: {label} exited with {describe_exit(rc)}; "
                              "stopping the others\n")
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
