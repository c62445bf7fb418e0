"""The demo as a picture (issue 13): a PNG of the drain, and --compare side by side."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from schedproj.ops.cli import main

ROOT = Path(__file__).resolve().parents[2]


def isolated(name: str) -> bool:
    """Run test ``name`` in a fresh interpreter and return False there: the demo imports the
    REM lanes, shared tasks that would join every Celery app later tests make here."""
    if os.environ.get("SCHEDPROJ_TEST_ISOLATED") == name:
        return False
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          f"{__file__}::{name}"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "SCHEDPROJ_TEST_ISOLATED": name}, timeout=120)
    assert out.returncode == 0, out.stdout[-4000:]
    return True


def report(policy: str, drained: bool) -> dict[str, Any]:
    from schedproj.devtools import demo

    history = [(t * 0.25, "summary" if t % 3 else "memory-summary-backfill",
                {"memory-summary-backfill": max(0, 240 - 10 * t), "summary": max(0, 24 - t),
                 "dream": 371, "golden-path": 1}) for t in range(40)]
    lanes = demo.LANE_NAMES
    return {"policy": policy, "drained_to_idle": drained, "time_to_idle_s": 10.0 if drained
            else None, "elapsed_s": 10.0, "budget_s": 10.0, "runs": dict.fromkeys(lanes, 1),
            "outcomes": dict.fromkeys(lanes, "completed"),
            "max_staleness_ratio": dict.fromkeys(lanes, 1.5), "lease_busy_fraction": 0.5,
            "deferrals_by_reason": {}, "initial": {"backfill_backlog": 240},
            "final": {"backfill_backlog": 0}, "died": [], "history": history}


def test_plot_drain_writes_a_png_of_one_or_two_runs(tmp_path: Path) -> None:
    if isolated("test_plot_drain_writes_a_png_of_one_or_two_runs"):
        return
    from schedproj.devtools import demo

    for reports in ([report("staleness", True)],
                    [report("staleness", True), report("registry", False)]):
        path = demo.plot_drain(reports, tmp_path / f"{len(reports)}.png")
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size > 20_000


def test_demo_prints_the_picture_and_compare_runs_both_policies(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if isolated("test_demo_prints_the_picture_and_compare_runs_both_policies"):
        return
    from schedproj.devtools import demo

    ran: list[str] = []

    def fake_run(opts: Any) -> dict[str, Any]:
        ran.append(opts.policy.value)
        return report(opts.policy.value, opts.policy.value == "staleness")

    monkeypatch.setattr(demo, "run_demo", fake_run)
    out = CliRunner().invoke(main, ["demo", "--plot", str(tmp_path / "one.png")])
    assert out.exit_code == 0, out.output
    assert f"picture of the drain: {tmp_path / 'one.png'}" in out.output
    assert (tmp_path / "one.png").exists()
    out = CliRunner().invoke(main, ["demo", "--compare", "--budget", "10",
                                    "--plot", str(tmp_path / "both.png")])
    assert out.exit_code == 0, out.output
    assert ran == ["staleness", "staleness", "registry"]
    header = next(line for line in out.output.splitlines() if "policy staleness" in line)
    assert "policy registry" in header  # side by side, one table
    assert "idle in 10.0s" in out.output and "NOT idle after 10.0s" in out.output
    assert (tmp_path / "both.png").exists()
