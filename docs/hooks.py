"""MkDocs hooks: the reference pages, generated from the code at every build.

`schedproj.devtools.reference` writes the settings, command-line, metrics, lane-option and
status-JSON pages from `Settings`, the click commands, the metric catalog, the `Lane` classes
and the status field catalog (`schedproj.telemetry.status_fields`); they
exist only in the built site, so they cannot go stale. The benchmark plots live with their
results in bench/results/ and are published beside the performance page.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

from schedproj.devtools.reference import pages

ROOT = Path(__file__).resolve().parents[1]
#: Plots the benchmark writes next to its results, shown on the performance page.
BENCH_PLOTS = ("bench_latency.png", "bench_tick_cost.png")


def on_files(files: Files, config: Any) -> Files:
    for uri, markdown in pages().items():
        files.append(File.generated(config, uri, content=markdown))
    for name in BENCH_PLOTS:
        files.append(File.generated(config, f"img/bench/{name}",
                                    abs_src_path=str(ROOT / "bench" / "results" / name)))
    return files
