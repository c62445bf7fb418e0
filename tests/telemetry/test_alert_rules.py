"""Prometheus alerting rules and the Grafana dashboard (``deploy/``).

``promtool check rules`` and ``promtool test rules`` on synthetic series: each alert fires when
it should and stays quiet when it should not (``deploy/prometheus/alerts_test.yml``). The rules
and the dashboard may name only metrics beat exports — the exporter's catalog
(``schedproj.telemetry.metrics.CATALOG``; tests/telemetry/test_metric_catalog.py holds it equal to
what a scrape serves) — or ``schedproj_lost_runs_total``, the documented name of
the lost-runs counter (and, on the dashboard, the pressure series about to be exported).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from schedproj.telemetry.metrics import CATALOG

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "schedproj.json"
#: Runs that started and never ended (their worker died). Documented here in case the exporter
#: has not shipped it yet.
LOST_RUNS = "schedproj_lost_runs_total"
#: Names the dashboard may show before the exporter serves them: the lost-runs counter and the
#: pressure series (status shows them; the exporter serves them once the dashboard has panels).
PENDING = frozenset({LOST_RUNS, "schedproj_pressure_ratio", "schedproj_pressure_yields_total",
                     "schedproj_last_pressure_yield_timestamp_seconds"})
METRIC = re.compile(r"\bschedproj_[a-z0-9_]+\b")
#: What the issue asks an alert for, and the rule that answers.
REQUIRED_ALERTS = {
    "the deferral chain is not draining": "SchedprojChainNotDraining",
    "the lease is held past the hold cap": "SchedprojLeaseOverHoldCap",
    "the watchdog is degraded": "SchedprojWatchdogDegraded",
    "no active beat": "SchedprojNoActiveBeat",
    "beat's metrics are absent": "SchedprojBeatMetricsAbsent",
    "a lane is starving": "SchedprojLaneStarving",
    "stale-token refusals are rising": "SchedprojStaleTokenRefusalsRising",
    "runs are lost": "SchedprojRunsLost",
}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    if tool is None:
        why = "promtool is not installed (Debian package prometheus; bash scripts/setup.sh)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=120,
                          cwd=RULES.parent)


# -- the names beat exports -----------------------------------------------------------------
def exported_metrics() -> set[str]:
    """Every metric name the exporter can serve, as Prometheus sees it (counters with
    ``_total``): the exporter's catalog, which its collector builds every family from."""
    return {m.exposed for m in CATALOG}


@pytest.fixture(scope="module")
def exported() -> set[str]:
    names = exported_metrics()
    # A floor, so a change in how the exporter is written fails here, not silently.
    core = {"schedproj_state_up", "schedproj_lease_held_seconds", "schedproj_lease_fence",
            "schedproj_lease_over_hold_cap", "schedproj_deferral_chain_depth",
            "schedproj_posture", "schedproj_lane_staleness_ratio", "schedproj_lane_runs_total",
            "schedproj_dispatches_total", "schedproj_deferrals_total",
            "schedproj_stale_token_refusals_total", "schedproj_lease_acquisitions_total"}
    assert core <= names, f"could not read the exported metric names: missing {core - names}"
    return names


def rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(RULES.read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def walk(node: object) -> Iterator[tuple[str, object]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield str(key), value
            yield from walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from walk(item)


def dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL text in the dashboard: panel targets and template variable queries."""
    found = [v for k, v in walk(dashboard.get("panels", [])) if k == "expr"]
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var.get("query")
            found.append(query.get("query") if isinstance(query, dict) else query)
            found.append(var.get("definition", ""))
    return [str(q) for q in found if q]


# -- promtool ------------------------------------------------------------------------------------
def test_promtool_checks_the_rules() -> None:
    out = promtool("check", "rules", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules())} rules found" in out.stdout + out.stderr


def test_promtool_unit_tests_pass() -> None:
    out = promtool("test", "rules", str(RULE_TESTS))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr


def test_every_alert_is_tested_firing_and_quiet() -> None:
    names = {rule["alert"] for rule in rules()}
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert names - fires == set(), f"never shown firing: {sorted(names - fires)}"
    assert names - quiet == set(), f"never shown quiet: {sorted(names - quiet)}"
    assert (fires | quiet) <= names, f"tests of unknown alerts: {sorted((fires | quiet) - names)}"


def test_the_issues_alerts_exist_with_a_severity_and_a_summary() -> None:
    by_name = {rule["alert"]: rule for rule in rules()}
    for what, name in REQUIRED_ALERTS.items():
        assert name in by_name, f"no alert for: {what}"
    for rule in by_name.values():
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    assert LOST_RUNS in by_name["SchedprojRunsLost"]["expr"]
    assert "absent(schedproj_state_up)" in by_name["SchedprojBeatMetricsAbsent"]["expr"]


def test_rules_name_only_exported_metrics(exported: set[str]) -> None:
    for rule in rules():
        used = set(METRIC.findall(rule["expr"]))
        assert used, rule["alert"]
        unknown = used - exported - {LOST_RUNS}
        assert not unknown, f"{rule['alert']} names metrics beat does not export: {unknown}"


# -- the dashboard ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


def test_dashboard_names_only_exported_metrics(dashboard: dict[str, Any],
                                               exported: set[str]) -> None:
    queries = dashboard_queries(dashboard)
    assert queries
    used = {name for q in queries for name in METRIC.findall(q)}
    unknown = used - exported - PENDING
    assert not unknown, f"the dashboard names metrics beat does not export: {sorted(unknown)}"
    # Nothing else either: every selector in the dashboard is a schedproj metric.
    for query in queries:
        bare = re.sub(r'"[^"]*"|\{[^}]*\}|\[[^\]]*\]|\b(by|without|on|ignoring)\s*\([^)]*\)',
                      "", query)
        words = set(re.findall(r"\b[a-z_][a-z0-9_]*\b", bare))
        functions = {"max", "sum", "min", "avg", "count", "rate", "increase", "label_values",
                     "time", "lane", "and", "or", "unless", "bool", "changes"}
        assert words - functions - used == set(), f"unexpected names in {query!r}"


def test_dashboard_shows_every_exported_metric(dashboard: dict[str, Any],
                                               exported: set[str]) -> None:
    used = {name for q in dashboard_queries(dashboard) for name in METRIC.findall(q)}
    assert exported - used == set(), f"no panel for {sorted(exported - used)}"
    assert used >= PENDING, f"no panel for {sorted(PENDING - used)}"


def test_dashboard_is_importable(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 30
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "lane"} <= variables
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            for var in re.findall(r"\$(\w+)", target["expr"]):
                assert var in variables, f"{panel['title']}: unknown variable ${var}"
