"""The chaos run (real workers, beats and a private Redis under repeated faults), audited.

The default run is short: every fault kind once, on a Sentinel set so a failover to a lagging
replica is among them. ``pytest -m slow tests/e2e/test_chaos.py`` (or ``schedproj chaos --profile
long``) runs the long one: at least 100 state losses, 20 failovers and 20 beat freezes.
"""

from __future__ import annotations

import builtins
import importlib
import io
import re
import shutil
from pathlib import Path

import pytest

from schedproj.chaos.driver import LONG_PROFILE, run_chaos
from schedproj.chaos.faults import fault_kinds
from schedproj.chaos.report import render
from schedproj.core.errors import LeaseLost
from schedproj.on_celery.expected import EXPECTED_REDIS_FAILURES

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(shutil.which("redis-server") is None,
                                 reason="needs the redis-server binary")]


def check(report: dict) -> None:
    assert report["overlaps"] == 0, report["details"]
    assert report["duplicates"] == 0, report["details"]
    assert report["lost_runs"] == 0, report["details"]
    assert report["stale_starts"] == 0, report["details"]
    assert report["os_overlaps"] == 0, report["details"]
    assert report["stale_beat_starts"] == 0, report["details"]
    assert report["worker_exits"] == 0, report["details"]
    assert report["unended_unrecorded"] == 0, ("a killed run was not recorded lost",
                                               report["details"], report["faults"])
    assert report["recorded_lost"] >= 1, report["faults"]
    assert report["ledger_monotone"]
    assert report["heavy_runs"] > 10
    # The light family of 100 members ran next to the ordinary lanes, every member (its
    # members hook gives the set back after each state loss); gaps are audited per member.
    assert report["family_members"] >= 100
    assert report["members_that_ran"] == report["family_members"], report["member_runs"]
    for kind in fault_kinds(sentinel=True):
        assert report["faults"].get(kind, 0) >= 1, f"no {kind} fault was injected"
    assert report["min_faults_met"], report["faults"]
    # The derived keys were damaged mid-run (both of them) and no lane waited past its bound
    # beyond the heal time (``lost_runs`` above counts such gaps).
    damaged = {k.partition(":")[0] for k in report["derived_damage"]}
    assert damaged == {"due", "changed"}, report["derived_damage"]
    assert report["failovers_to_a_lagging_replica"] >= 1, report["failover_methods"]
    assert report["lease_recovery_after_kill_s"]["max"] < 2.0 + 3.0
    assert report["beat_failover_s"]["max"] < 3.0 + 3.0
    assert report["paused_writer_fenced"], "the paused holder's late write was not refused"
    out = io.StringIO()
    render(report, out)
    assert "overlaps (must be 0)" in out.getvalue()


#: Outcomes the design expects and handles (Redis restarting, frozen, failing over; a fenced
#: write refused): logged as one line, never with a traceback.
EXPECTED = (*EXPECTED_REDIS_FAILURES, LeaseLost)
#: The last line of a traceback: the exception's (qualified) type, then its message.
RAISED = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::|$)")


def exception_type(qualified: str) -> type | None:
    """The class a traceback's last line names (``redis.exceptions.TimeoutError``,
    ``ConnectionRefusedError``), or None when it cannot be imported."""
    module, _, name = qualified.rpartition(".")
    try:
        found = getattr(importlib.import_module(module) if module else builtins, name)
    except (ImportError, AttributeError):
        return None
    return found if isinstance(found, type) else None


def tracebacks(log: str) -> list[str]:
    """The exception type ending each traceback in ``log`` (one per exception of a chain)."""
    lines, raised = log.splitlines(), []
    for i, line in enumerate(lines):
        if not line.startswith("Traceback (most recent call last):"):
            continue
        j = i + 1
        while j < len(lines) and (lines[j].startswith((" ", "\t")) or not lines[j]):
            j += 1
        match = RAISED.match(lines[j]) if j < len(lines) else None
        raised.append(match["type"] if match else "?")
    return raised


def expected_tracebacks(logs: Path) -> dict[str, list[str]]:
    """Per log file, the tracebacks whose exception the design expects (should be none)."""
    found = {}
    for log in sorted(logs.glob("*.log")):
        types = [t for t in tracebacks(log.read_text(errors="replace"))
                 if (cls := exception_type(t)) is not None and issubclass(cls, EXPECTED)]
        if types:
            found[log.name] = types
    return found


def test_the_traceback_reader_finds_expected_types(tmp_path: Path) -> None:
    """The reader the chaos test relies on: it finds a chained Redis time-out and a fenced
    write, and passes a bug and Celery's own shutdown."""
    (tmp_path / "heavy1.log").write_text(
        "[2026-12-03 19:37:51,729: WARNING/ForkPoolWorker-1] lane a: cannot renew\n"
        "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
        "TimeoutError: timed out\n\nDuring handling of the above exception, another "
        "exception occurred:\n\nTraceback (most recent call last):\n  File \"y.py\"\n"
        "redis.exceptions.TimeoutError: Timeout reading from socket\n"
        "Traceback (most recent call last):\n  File \"z.py\"\n"
        "schedproj.core.errors.LeaseLost: a: write refused\n"
        "Traceback (most recent call last):\n  File \"z.py\"\nKeyError: 'bug'\n"
        "Traceback (most recent call last):\n  File \"w.py\"\n"
        "billiard.exceptions.WorkerLostError: Worker exited prematurely\n")
    assert expected_tracebacks(tmp_path) == {"heavy1.log": [
        "TimeoutError", "redis.exceptions.TimeoutError", "schedproj.core.errors.LeaseLost"]}


@pytest.mark.timeout(300)
def test_short_chaos_run_keeps_every_promise(tmp_path: Path) -> None:
    # On a failure, the journal, ledger and fault times are in tmp_path for a closer look,
    # and every beat's and worker's log in tmp_path / "logs".
    check(run_chaos(duration_s=60, heavy_workers=3, fault_every_s=3.0, sentinel=True,
                    min_faults=dict.fromkeys(fault_kinds(sentinel=True), 1),
                    max_duration_s=160, dump_to=tmp_path / "chaos-dump.json",
                    logs_to=tmp_path / "logs"))
    # Every fault kind was injected (check() says so): Redis restarted, frozen and failed
    # over under the workers. What the design expects is one log line, never a traceback.
    assert list((tmp_path / "logs").glob("heavy*.log")), "the run's logs were not kept"
    assert expected_tracebacks(tmp_path / "logs") == {}


@pytest.mark.slow
@pytest.mark.timeout(6000)
def test_long_chaos_run_keeps_every_promise() -> None:
    """The README's run: ``schedproj chaos --profile long --json``."""
    report = run_chaos(heavy_workers=3, fault_every_s=4.0, **LONG_PROFILE)
    check(report)
    assert report["state_loss_faults"] >= 100
    assert report["faults"]["failover"] >= 20 and report["faults"]["freeze-beat"] >= 20
