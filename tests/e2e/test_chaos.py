"""The chaos run (real workers, beats and a private Redis under repeated faults), audited.

The default run is short: every fault kind once, on a Sentinel set so a failover to a lagging
replica is among them, with a pool of two slots (a weighted lane, a lane of two slots) beside
the heavy lease. ``pytest -m slow tests/e2e/test_chaos.py`` (or ``schedproj chaos --profile
long``) runs the long one: at least 100 state losses, 20 failovers and 20 beat freezes. Each
run is audited twice from one run: the lanes' promises, and the app's own beat_schedule entries
(each due time sent once, within the bounds of docs/entries.md).
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
    # The pool gpu (two slots) ran beside the lease through every fault kind: never more runs
    # than slots, by each slot's fenced ledger and by the OS slot files (both counted above in
    # os_overlaps; here the pool's share). Its weighted lane and its lane of two slots ran.
    assert report["pool_overlaps"] == 0, report["details"]["pool_overlaps"]
    assert report["pool_os_overlaps"] == 0, report["details"]["os_overlaps"]
    assert report["pool_ledgers_monotone"]
    runs = report["pool_lane_runs"]
    assert all(runs.get(lane, 0) >= 1 for lane in ("chaos.g1", "chaos.g2", "chaos.g3")), runs
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


def check_entries(report: dict) -> None:
    """The app's beat_schedule ran beside the lanes through every fault kind, each due time
    once: none sent twice, none missed beyond the bounds docs/entries.md gives (a failover, a
    state loss, a beat killed between a claim and its publish; schedproj/chaos/audit.py:
    ``audit_entries``)."""
    found = report["details"]["entries"]
    assert report["entry_sends"] > 20 and report["entry_runs"] > 20, report
    assert report["entry_duplicates"] == 0, found
    assert report["entry_missed"] == 0, found
    out = io.StringIO()
    render(report, out)
    assert "entry due times sent twice (must be 0)" in out.getvalue()




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


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """The short run, once for the tests that audit it. On a failure, the journal, ledger,
    entry journals and fault times are in its folder for a closer look, and every beat's and
    worker's log in its "logs"."""
    where = tmp_path_factory.mktemp("chaos")
    return run_chaos(duration_s=60, heavy_workers=3, fault_every_s=3.0, sentinel=True,
                     min_faults=dict.fromkeys(fault_kinds(sentinel=True), 1),
                     max_duration_s=160, dump_to=where / "chaos-dump.json",
                     logs_to=where / "logs"), where


@pytest.fixture(scope="module")
def long_run() -> dict:
    """The README's run: ``schedproj chaos --profile long --json``."""
    return run_chaos(heavy_workers=3, fault_every_s=4.0, **LONG_PROFILE)


@pytest.mark.timeout(300)
def test_short_chaos_run_keeps_every_promise(short_run: tuple[dict, Path]) -> None:
    report, where = short_run
    check(report)
    # Every fault kind was injected (check() says so): Redis restarted, frozen and failed
    # over under the workers. What the design expects is one log line, never a traceback.
    assert list((where / "logs").glob("heavy*.log")), "the run's logs were not kept"
    assert expected_tracebacks(where / "logs") == {}


@pytest.mark.timeout(300)
def test_short_chaos_run_sends_each_entry_due_time_once(short_run: tuple[dict, Path]) -> None:
    check_entries(short_run[0])


@pytest.mark.slow
@pytest.mark.timeout(6000)
def test_long_chaos_run_keeps_every_promise(long_run: dict) -> None:
    check(long_run)
    assert long_run["state_loss_faults"] >= 100
    assert long_run["faults"]["failover"] >= 20 and long_run["faults"]["freeze-beat"] >= 20


@pytest.mark.slow
@pytest.mark.timeout(6000)
def test_long_chaos_run_sends_each_entry_due_time_once(long_run: dict) -> None:
    check_entries(long_run)
