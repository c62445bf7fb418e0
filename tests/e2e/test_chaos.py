"""The chaos run (real workers, beats and a private Redis under repeated faults), audited.

The default run is short: every fault kind once, on a Sentinel set so a failover to a lagging
replica is among them. ``pytest -m slow tests/e2e/test_chaos.py`` (or ``schedproj chaos --profile
long``) runs the long one: at least 100 state losses, 20 failovers and 20 beat freezes.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

from schedproj.chaos.driver import LONG_PROFILE, run_chaos
from schedproj.chaos.faults import fault_kinds
from schedproj.chaos.report import render

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


@pytest.mark.timeout(300)
def test_short_chaos_run_keeps_every_promise(tmp_path: Path) -> None:
    # On a failure, the journal, ledger and fault times are in tmp_path for a closer look.
    check(run_chaos(duration_s=60, heavy_workers=3, fault_every_s=3.0, sentinel=True,
                    min_faults=dict.fromkeys(fault_kinds(sentinel=True), 1),
                    max_duration_s=160, dump_to=tmp_path / "chaos-dump.json"))


@pytest.mark.slow
@pytest.mark.timeout(6000)
def test_long_chaos_run_keeps_every_promise() -> None:
    """The README's run: ``schedproj chaos --profile long --json``."""
    report = run_chaos(heavy_workers=3, fault_every_s=4.0, **LONG_PROFILE)
    check(report)
    assert report["state_loss_faults"] >= 100
    assert report["faults"]["failover"] >= 20 and report["faults"]["freeze-beat"] >= 20
