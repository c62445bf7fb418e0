"""The status page beat serves next to /metrics: its rendering (pure), its server (auth,
routes), and the page in a real headless Chromium against live beat and workers."""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry

from schedproj.settings import Settings
from schedproj.store.protocol import Keys
from schedproj.telemetry import statuspage
from schedproj.telemetry.metrics import SchedprojCollector
from schedproj.telemetry.webserver import StatusServer, start

ROOT = Path(__file__).resolve().parents[2]
#: Screenshots land here (CI keeps the folder as an artifact); build/ is ignored by git.
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS_DIR", ROOT / "build" / "test-artifacts"))

NOW = 10_000.0
JOURNAL = [
    {"ev": "start", "lane": "backlog", "task": "a", "fence": 1, "t": NOW - 600},
    {"ev": "end", "lane": "backlog", "task": "a", "fence": 1, "t": NOW - 500,
     "outcome": "yielded"},
    {"ev": "start", "lane": "starved", "task": "b", "fence": 2, "t": NOW - 490},
    {"ev": "end", "lane": "starved", "task": "b", "fence": 2, "t": NOW - 480,
     "outcome": "completed"},
    {"ev": "start", "lane": "backlog", "task": "c", "fence": 3, "t": NOW - 400},
    {"ev": "lost", "lane": "backlog", "task": "c", "fence": 3, "t": NOW - 300},
    {"ev": "start", "lane": "light", "task": "d", "fence": 0, "t": NOW - 100},
    {"ev": "end", "lane": "light", "task": "d", "fence": 0, "t": NOW - 99,
     "outcome": "completed"},
    {"ev": "start", "lane": "backlog", "task": "e", "fence": 4, "t": NOW - 20},
    {"ev": "start", "lane": "old", "task": "f", "fence": 5, "t": NOW - 9000},
    {"ev": "end", "lane": "old", "task": "f", "fence": 5, "t": NOW - 8000,
     "outcome": "completed"},
    {"ev": "garbage"},
]


def lane(name: str, kind: str = "heavy", **over: Any) -> dict[str, Any]:
    return {"name": name, "kind": kind, "queue": kind, "cadence_s": 100.0,
            "last_run_at": None, "ratio": 1.5, "state": "due", "deferral_reason": None,
            "deferral_blocker": None, "deferred_for_s": None, "backlog": 0,
            "last_outcome": None, "last_reason": None, "runs": 0, "failures": 0, **over}


STATUS = {
    "now": NOW, "posture": "healthy", "lease": {"holder": "backlog", "held_s": 20.0,
                                                "fence": 4},
    "lease_over_cap": False, "chain_depth": 1, "chain": ["summary", "backfill"],
    "lanes": [lane("backlog", state="running", backlog=7),
              lane("starved", state="deferred", deferral_reason="gate",
                   deferral_blocker="backlog", deferred_for_s=30.0),
              lane("light", kind="light", ratio=None, state="idle")],
    "beat": {"host": "h1", "pid": "42", "since": str(NOW - 60), "lock_held": True},
    "watchdog": {"posture": "healthy", "stalled": False, "assessed_at": NOW - 5},
    "errors": {}, "problems": [], "undeclared_lanes": [],
}


def test_journal_pairs_runs_marks_lost_and_running_and_keeps_the_window() -> None:
    bars = {b.task: b for b in statuspage.runs_from_journal(JOURNAL, NOW)}
    assert set(bars) == {"a", "b", "c", "d", "e"}  # f ended before the hour
    assert bars["a"].outcome == "yielded" and bars["a"].end == NOW - 500
    assert bars["c"].lost and bars["c"].end == NOW - 300
    assert bars["e"].outcome == "running" and bars["e"].end is None
    assert not bars["d"].heavy and bars["b"].heavy


def test_ratio_is_a_sawtooth_reset_at_each_run_end() -> None:
    bars = statuspage.runs_from_journal(JOURNAL, NOW)
    series = statuspage.ratio_series(bars, [lane("starved", last_run_at=NOW - 3000)], NOW)
    points = series["starved"]
    assert points[0] == (NOW - 3600, pytest.approx(-6.0)) or points[0][0] == NOW - 3000 \
        or points[0][1] >= 0
    # Just before the end at NOW-480 the ratio is (3000-480)/100; then 0; now 4.8.
    assert (NOW - 480, pytest.approx(25.2)) in points
    assert (NOW - 480, 0.0) in points
    assert points[-1] == (NOW, pytest.approx(4.8))


def test_timeline_svg_has_a_row_per_lane_and_marks_yields_and_lost_runs() -> None:
    bars = statuspage.runs_from_journal(JOURNAL, NOW)
    svg = statuspage.timeline_svg(bars, STATUS["lanes"], NOW)
    assert svg.count('class="run ') == 5
    assert 'data-outcome="yielded"' in svg and 'class="yield-mark"' in svg
    assert 'data-outcome="lost"' in svg and 'class="lost-mark"' in svg
    assert 'data-outcome="running"' in svg
    assert ">backlog</text>" in svg and ">light</text>" in svg


def test_page_has_the_table_facts_and_both_charts() -> None:
    page = statuspage.render_page(STATUS, JOURNAL, refresh_s=3)
    assert page.count("<tr data-lane=") == 3
    assert "gate / backlog / 30s" in page
    assert "summary ← backfill" in page
    assert "h1 pid 42 (active" in page
    assert 'id="timeline"' in page and 'id="ratios"' in page
    assert "setInterval(refresh, 3000)" in page
    data = statuspage.api_timeline(STATUS, JOURNAL)
    assert {r["task"] for r in data["runs"]} == {"a", "b", "c", "d", "e"}
    json.dumps(data, allow_nan=False)


def pooled(status: dict[str, Any]) -> dict[str, Any]:
    """STATUS with a pool gpu of two slots beside the default pool (as status --json has it)."""
    def holder(slot: int, lane: str) -> dict[str, Any]:
        return {"slot": slot, "holder": lane, "fence": 9, "granted_at": NOW - 30,
                "started_at": NOW - 29, "held_s": 29.0}
    return {**status,
            "lanes": [*status["lanes"], lane("embed", queue="gpu"), lane("both", queue="gpu")],
            "pools": [{"pool": "heavy", "slots": 1, "busy": 1, "holders": [holder(0, "backlog")],
                       "waiting": 0, "waiters": []},
                      {"pool": "gpu", "slots": 2, "busy": 1, "holders": [holder(1, "embed")],
                       "waiting": 1, "waiters": ["both"]}]}


POOL_JOURNAL = [
    {"ev": "start", "lane": "both", "task": "g1", "fence": 7, "t": NOW - 200, "pool": "gpu",
     "slots": [0, 1]},
    {"ev": "end", "lane": "both", "task": "g1", "fence": 7, "t": NOW - 150,
     "outcome": "completed"},
    {"ev": "start", "lane": "embed", "task": "g2", "fence": 9, "t": NOW - 29, "pool": "gpu",
     "slots": [1]},
    # A pool run journaled before runs named their slots: not drawn on a slot row.
    {"ev": "start", "lane": "embed", "task": "g0", "fence": 6, "t": NOW - 900},
    {"ev": "end", "lane": "embed", "task": "g0", "fence": 6, "t": NOW - 800,
     "outcome": "completed"},
]


def test_each_pool_has_a_timeline_with_a_row_per_slot() -> None:
    status = pooled(STATUS)
    page = statuspage.render_page(status, JOURNAL + POOL_JOURNAL, refresh_s=3)
    assert 'id="pool-heavy"' in page and 'id="pool-gpu"' in page
    assert ">gpu slot 0</text>" in page and ">gpu slot 1</text>" in page
    assert ">gpu slot 2</text>" not in page and ">heavy slot 0</text>" in page
    bars = statuspage.runs_from_journal(JOURNAL + POOL_JOURNAL, NOW)
    gpu = statuspage.pool_timeline_svg(status["pools"][1], bars, status["lanes"], NOW)
    drawn = sorted((slot, task) for task, slot in
                   re.findall(r'data-task="(\w+)" data-outcome="\w+" data-slot="(\d)"', gpu))
    assert drawn == [("0", "g1"), ("1", "g1"), ("1", "g2")]  # the two-slot run on both rows
    heavy = statuspage.pool_timeline_svg(status["pools"][0], bars, status["lanes"], NOW)
    assert heavy.count('class="run ') == 4   # the default pool's heavy runs (a, b, c, e)
    assert "gpu: 1/2 slots busy: slot 1 embed for 29s, fence 9; 1 waiting (both)" in \
        " ".join(f"{k}: {v}" for k, v in statuspage.facts(status)).replace("pool ", "")


def test_without_pools_beyond_the_default_the_page_is_as_before() -> None:
    plain = statuspage.render_page(STATUS, JOURNAL, refresh_s=3)
    only_default = {**STATUS, "pools": [{"pool": "heavy", "slots": 1, "busy": 1,
                                        "holders": [], "waiting": 0, "waiters": []}]}
    assert statuspage.render_page(only_default, JOURNAL, refresh_s=3) == plain
    assert "pool-" not in plain and "slot 0" not in plain


# -- the server -------------------------------------------------------------------------------

@pytest.fixture
def serve(client: redis.Redis, key_prefix: str) -> Iterator[Any]:
    servers: list[StatusServer] = []

    def make(**settings: Any) -> str:
        s = Settings(metrics_port=0, key_prefix=key_prefix, **settings)
        registry = CollectorRegistry()
        registry.register(SchedprojCollector(client, Keys(key_prefix), s, ()))
        server = start(registry, client, Keys(key_prefix), s, ())
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield make
    for server in servers:
        server.shutdown()
        server.server_close()


def get(url: str, auth: tuple[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if auth:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_loopback_serves_metrics_page_and_json(serve: Any) -> None:
    base = serve()
    code, body = get(f"{base}/metrics")
    assert code == 200 and "schedproj_state_up" in body
    code, body = get(f"{base}/")
    assert code == 200 and 'id="lanes"' in body
    code, body = get(f"{base}/api/status")
    assert code == 200 and "posture" in json.loads(body)
    code, body = get(f"{base}/api/timeline")
    assert code == 200 and json.loads(body)["runs"] == []
    assert get(f"{base}/nosuch")[0] == 404


def test_beyond_loopback_without_credentials_refuses_the_page(
        serve: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="schedproj.telemetry.webserver"):
        base = serve(metrics_host="0.0.0.0")
    assert "SCHEDPROJ_STATUS_USER and SCHEDPROJ_STATUS_PASSWORD" in caplog.text
    assert get(f"{base}/metrics")[0] == 200  # scrapes go on as before
    code, body = get(f"{base}/")
    assert code == 403 and "SCHEDPROJ_STATUS_PASSWORD" in body
    assert get(f"{base}/api/status")[0] == 403


def test_beyond_loopback_with_credentials_needs_basic_auth(serve: Any) -> None:
    base = serve(metrics_host="0.0.0.0", status_user="ops", status_password="s3cret")
    assert get(f"{base}/")[0] == 401
    assert get(f"{base}/api/status", ("ops", "wrong"))[0] == 401
    assert get(f"{base}/", ("ops", "s3cret"))[0] == 200
    assert get(f"{base}/api/timeline", ("ops", "s3cret"))[0] == 200
    assert "s3cret" not in repr(Settings(status_password="s3cret"))


# -- in a real browser ------------------------------------------------------------------------

def _browser() -> Any:
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        if os.environ.get("CI"):
            pytest.fail("chromium and chromium-driver are required under CI (scripts/setup.sh)")
        pytest.skip("no chromium/chromedriver (apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or ""
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,1300", "--disable-gpu"):
        options.add_argument(arg)
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    return webdriver.Chrome(options=options, service=service)


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_status_page_in_chromium_against_a_live_scheduler(e2e_redis: redis.Redis,
                                                          tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    from tests.conftest import E2E_REDIS_URL
    from tests.ops.test_errors_name_the_fix import free_port
    from tests.procs import FAST_SETTINGS, Cluster

    port = free_port()
    env = {**os.environ, **FAST_SETTINGS, "CELERY_BROKER_URL": E2E_REDIS_URL,
           "SCHEDPROJ_REDIS_URL": E2E_REDIS_URL, "SCHEDPROJ_KEY_PREFIX": "schedproj",
           "E2E_SCENARIO": "fairness", "SCHEDPROJ_METRICS_PORT": str(port),
           "PYTHONPATH": str(ROOT)}
    e2e_redis.set("schedproj:e2e:backlog", 40)
    cluster = Cluster(env=env, logdir=tmp_path)
    browser = None
    try:
        cluster.worker("heavy", "heavy")
        cluster.worker("light", "light", concurrency=2)
        cluster.beat("beat")
        journal = Keys("schedproj").journal

        def heavy_ends() -> set[str]:
            return {json.loads(x)["lane"] for x in e2e_redis.lrange(journal, 0, -1)
                    if json.loads(x)["ev"] == "end" and json.loads(x)["fence"] > 0}

        deadline = time.monotonic() + 60
        while heavy_ends() != {"e2e.backlog", "e2e.starved"} and time.monotonic() < deadline:
            time.sleep(0.5)
        assert heavy_ends() == {"e2e.backlog", "e2e.starved"}
        browser = _browser()
        before = _status(env)  # the page is rendered after this and read before the next
        browser.get(f"http://127.0.0.1:{port}/")
        _check_page(browser, By, env, before)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "status-page.png"
        assert browser.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
    finally:
        if browser is not None:
            browser.quit()
        cluster.stop_all()


READ_PAGE = """
const text = (el) => (el ? el.innerText : "");
return {
  rows: [...document.querySelectorAll("#lanes tbody tr")].map((r) => ({
    lane: r.getAttribute("data-lane"),
    cells: [...r.querySelectorAll("td")].map((c) => c.innerText.trim())})),
  runs: [...document.querySelectorAll("#timeline g.run")].map((r) => ({
    lane: r.getAttribute("data-lane"), outcome: r.getAttribute("data-outcome")})),
  polylines: document.querySelectorAll("#ratios polyline").length,
  facts: text(document.getElementById("facts")),
  stamp: text(document.querySelector(".stamp")),
};
"""
READ_STAMP = 'const s = document.querySelector(".stamp"); return s ? s.innerText : "";'


def _status(env: dict[str, str]) -> dict[str, Any]:
    result = json.loads(subprocess.run(
        [sys.executable, "-m", "schedproj.ops.cli", "status", "--json"], env=env, cwd=ROOT,
        capture_output=True, text=True, check=True).stdout)
    assert isinstance(result, dict)
    return result


def _check_page(browser: Any, by: Any, env: dict[str, str], before: dict[str, Any]) -> None:
    # One read of the whole page in the browser: it refreshes itself, and elements found in one
    # call may be replaced before the next.
    page = browser.execute_script(READ_PAGE)
    status = _status(env)
    runs_before = {x["name"]: x["runs"] for x in before["lanes"]}
    page_rows = {r["lane"]: r["cells"] for r in page["rows"]}
    assert set(page_rows) == {x["name"] for x in status["lanes"]}
    for lane in status["lanes"]:
        cells = page_rows[lane["name"]]
        assert cells[:4] == statuspage.lane_cells(lane, status["now"])[:4]
        # The page was rendered (and maybe refreshed) between the two status reads.
        assert runs_before[lane["name"]] <= int(cells[10]) <= lane["runs"]
    drawn = {(r["lane"], r["outcome"]) for r in page["runs"]}
    assert {lane for lane, _ in drawn} >= {"e2e.backlog", "e2e.starved", "e2e.light"}
    assert ("e2e.backlog", "yielded") in drawn  # 40 items at 0.1 s each, hold cap 1.5 s
    assert page["polylines"] > 0
    facts = page["facts"]
    assert "active beat" in facts and "watchdog" in facts and "deferral chain" in facts
    # The page refreshes itself: the timestamp moves on.
    stamp = page["stamp"]
    deadline = time.monotonic() + 15
    while browser.execute_script(READ_STAMP) == stamp:
        assert time.monotonic() < deadline, "the page did not refresh"
        time.sleep(0.5)


READ_POOLS = """
return {
  slots: [...document.querySelectorAll("svg.pool text.lane")].map((t) => t.textContent),
  runs: [...document.querySelectorAll("#pool-gpu g.run")].map((r) => ({
    lane: r.getAttribute("data-lane"), slot: r.getAttribute("data-slot")})),
  heavy: document.querySelectorAll("#pool-heavy g.run").length,
  facts: document.getElementById("facts") ? document.getElementById("facts").innerText : "",
};
"""


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_a_second_pools_slots_in_chromium_against_a_live_scheduler(
        e2e_redis: redis.Redis, tmp_path: Path) -> None:
    """A pool gpu of two slots beside the default pool (tests/pools_e2e.py's lanes): the page
    draws a timeline per pool, a row per slot, with the runs each slot carried."""
    from tests.conftest import E2E_REDIS_URL
    from tests.ops.test_errors_name_the_fix import free_port
    from tests.procs import FAST_SETTINGS, Cluster, wait_for

    port = free_port()
    locks = tmp_path / "locks"
    locks.mkdir()
    env = {**os.environ, **FAST_SETTINGS, "CELERY_BROKER_URL": E2E_REDIS_URL,
           "SCHEDPROJ_REDIS_URL": E2E_REDIS_URL, "SCHEDPROJ_KEY_PREFIX": "schedproj",
           "SCHEDPROJ_LANE_MODULES": "tests.pools_e2e", "SCHEDPROJ_POOLS": "gpu=2",
           "E2E_LOCK_DIR": str(locks), "SCHEDPROJ_METRICS_PORT": str(port),
           "PYTHONPATH": str(ROOT)}
    cluster = Cluster(env=env, logdir=tmp_path)
    browser = None
    try:
        workers = [cluster.start(name, "worker", "-Q", queue, "-c", "1", "-n", f"{name}@%h",
                                 "--without-gossip", "--without-mingle", "--without-heartbeat",
                                 "-l", "info")
                   for name, queue in (("gpu0", "gpu"), ("gpu1", "gpu"), ("heavy0", "heavy"))]
        for proc in workers:
            wait_for(lambda p=proc: "ready." in p.text() or not p.alive(), 40, "a worker ready")
            assert proc.alive(), proc.text()
        cluster.beat("beat")
        journal = Keys("schedproj").journal

        def slots_run() -> set[int]:
            entries = [json.loads(x) for x in e2e_redis.lrange(journal, 0, -1)]
            return {s for e in entries if e["ev"] == "start" and e.get("pool") == "gpu"
                    for s in e["slots"]}
        wait_for(lambda: slots_run() == {0, 1}, 30, "runs on both gpu slots")
        browser = _browser()
        browser.get(f"http://127.0.0.1:{port}/")
        page = browser.execute_script(READ_POOLS)
        assert page["slots"] == ["heavy slot 0", "gpu slot 0", "gpu slot 1"], page
        assert {r["slot"] for r in page["runs"]} == {"0", "1"}, page
        assert {r["lane"] for r in page["runs"]} <= {*(f"e2e.gpu.{n}" for n in range(4)),
                                                     "e2e.gpu.both"}, page
        assert page["heavy"] > 0, page
        assert "pool gpu" in page["facts"] and "slots busy" in page["facts"], page
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(ARTIFACTS / "status-page-pools.png"))
    finally:
        if browser is not None:
            browser.quit()
        cluster.stop_all()
