"""The chaos run (real workers, beats and a private Redis under repeated faults), audited.

The default run is short; ``pytest -m slow tests/test_chaos.py`` (or ``schedproj chaos
--duration 600``) runs the long one.
"""

from __future__ import annotations

import io
import shutil

import pytest

from schedproj.chaos.driver import FAULTS, render, run_chaos

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(shutil.which("redis-server") is None,
                                 reason="needs the redis-server binary")]


def check(report: dict) -> None:
    assert report["overlaps"] == 0, report["details"]
    assert report["duplicates"] == 0, report["details"]
    assert report["lost_runs"] == 0, report["details"]
    assert report["stale_starts"] == 0, report["details"]
    assert report["ledger_monotone"]
    assert report["heavy_runs"] > 10
    for kind in FAULTS:
        assert report["faults"].get(kind, 0) >= 1, f"no {kind} fault was injected"
    assert report["lease_recovery_after_kill_s"]["max"] < 2.0 + 3.0
    assert report["beat_failover_s"]["max"] < 3.0 + 3.0
    assert report["paused_writer_fenced"], "the paused holder's late write was not refused"
    out = io.StringIO()
    render(report, out)
    assert "overlaps (must be 0)" in out.getvalue()


@pytest.mark.timeout(180)
def test_short_chaos_run_keeps_every_promise() -> None:
    check(run_chaos(duration_s=40, heavy_workers=3, fault_every_s=4.0))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_long_chaos_run_keeps_every_promise() -> None:
    check(run_chaos(duration_s=300, heavy_workers=3, fault_every_s=5.0))
