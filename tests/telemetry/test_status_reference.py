"""The status JSON reference (``reference/status.md``) cannot drift: real status JSON — from
``schedproj status --json`` and the status page's ``/api/status``, after real beat ticks against
real Redis — has exactly the keys the catalog (``schedproj.telemetry.status_fields.CATALOG``)
lists, with the types it gives them, and the generated page lists every one of them.

The deployment: heavy and light lanes, a Berlin calendar lane, a lane family, a gate (a deferral
chain), a due-check that raises (a lane error), the watchdog lane, one ``beat_schedule`` entry;
beat's ticks grant the lease and publish the pressure on it. Only the last pressure yield is
written here, as a worker's checkpoint writes it (``keepalive``): a yield needs a running
heavy run."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from schedproj import Gate, Lane, LaneKind, LaneTask, Settings
from schedproj.core.families import LaneFamily
from schedproj.core.pressure import Pressure, encode_yield, yielded
from schedproj.devtools.reference import pages
from schedproj.on_celery.beat import FairScheduler
from schedproj.ops import watchdog
from schedproj.ops.cli import main
from schedproj.store.families import FamilyStore
from schedproj.store.protocol import Keys
from schedproj.telemetry.entries_view import read_entries
from schedproj.telemetry.observe import observe
from schedproj.telemetry.status import as_json
from schedproj.telemetry.status_fields import (
    CATALOG,
    LANE_STATES,
    Source,
    disagreements,
    key_paths,
)
from schedproj.telemetry.webserver import start
from tests.conftest import REDIS_URL, make_app

ROOT = Path(__file__).resolve().parents[2]
FAMILY = "s.repos"


def nothing(*args: Any) -> None:
    """The lanes' work: none (no worker runs here)."""


def declare(app: Celery) -> None:
    def lane(name: str, **options: Any) -> None:
        app.task(shared=False, base=LaneTask, name=name, lane=Lane(**options))(nothing)

    def broken_check() -> int:
        raise RuntimeError("the backlog query timed out")

    lane("s.heavy", cadence_s=600, kind=LaneKind.HEAVY, order=1)
    lane("s.heavy-too", cadence_s=900, kind=LaneKind.HEAVY, order=3)
    lane("s.backup", schedule="30 2 * * *", timezone="Europe/Berlin", catchup_window_s=600,
         kind=LaneKind.HEAVY, order=2)
    lane("s.light", cadence_s=60, kind=LaneKind.LIGHT, gates=(Gate("s.heavy"),))
    lane("s.counted", cadence_s=60, kind=LaneKind.LIGHT, backlog_driven=True,
         due_check=broken_check)
    app.task(shared=False, base=LaneTask, name=FAMILY,
             lane=LaneFamily(cadence_s=1800, kind=LaneKind.HEAVY, order=5))(nothing)
    lane("s.embed", cadence_s=600, kind=LaneKind.HEAVY, pool="gpu", order=6)
    lane("s.retrain", cadence_s=900, kind=LaneKind.HEAVY, pool="gpu", slots=2, order=7)
    app.task(shared=False, name="s.report")(nothing)
    app.conf.beat_schedule = {"nightly-report": {"task": "s.report", "schedule": 300.0}}
    watchdog.register(app)


@pytest.fixture
def deployment(key_prefix: str, broker: redis.Redis, client: redis.Redis) -> Iterator[Celery]:
    """Beat's state after two ticks, the watchdog's latch and a pressure yield."""
    keys = Keys(key_prefix)
    app = make_app(key_prefix, declare, beat_max_loop_interval_s=0.2, beat_lock_ttl_s=5.0,
                   pools="gpu=2")
    FamilyStore(client, keys).add(FAMILY, ["r0", "r1", "r2"])
    first = FairScheduler(app=app)
    first.tick()   # a heavy lane is granted the lease; the others wait behind it
    first.close()
    # A beat taking over publishes the pressure on the held lease (the beat that granted it
    # does not yet: the lanes it deferred in the granting tick are skipped afterwards).
    sched = FairScheduler(app=app)
    sched.tick()
    app.tasks["schedproj.watchdog"].run()
    now = time.time()
    pressing = Pressure(lane="s.backup", cadence_s=86400.0, last_run_at=None, priority0=False,
                        fence=1, at=now - 5)
    record = yielded(lane="s.heavy", task_id="t-1", fence=1, held_s=42.0, now=now - 3,
                     pressure=pressing)
    client.hset(keys.pressure, "last-yield", encode_yield(record))
    client.hincrby(keys.pressure, "yields", 1)
    yield app
    sched.close()


def cli_status(monkeypatch: pytest.MonkeyPatch, prefix: str, *args: str) -> dict[str, Any]:
    monkeypatch.setenv("SCHEDPROJ_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("SCHEDPROJ_KEY_PREFIX", prefix)
    result = CliRunner().invoke(main, ["status", "--json", *args])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.output))


def api_status(client: redis.Redis, prefix: str) -> dict[str, Any]:
    settings = Settings(metrics_port=0, key_prefix=prefix)
    server = start(CollectorRegistry(), client, Keys(prefix), settings, ())
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/api/status"
        with urllib.request.urlopen(url, timeout=10) as response:
            return dict(json.loads(response.read()))
    finally:
        server.shutdown()
        server.server_close()


def later_status(client: redis.Redis, prefix: str, hours: float) -> dict[str, Any]:
    """The same state read ``hours`` later (beat stopped meanwhile): lanes undispatched."""
    keys = Keys(prefix)
    obs = observe(client, keys, now=time.time() + hours * 3600)
    view = read_entries(client, keys)
    data = {**as_json(obs, obs.health()), "entries": view.rows(),
            "entry_problems": list(view.problems)}
    return dict(json.loads(json.dumps(data, default=str)))


def test_real_status_json_has_exactly_the_catalogs_keys_and_types(
        deployment: Celery, key_prefix: str, client: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    outputs = {
        "status --json": (Source.CLI, cli_status(monkeypatch, key_prefix)),
        "status --json --family": (Source.CLI, cli_status(monkeypatch, key_prefix,
                                                          "--family", FAMILY)),
        "/api/status": (Source.API, api_status(client, key_prefix)),
        "status --json, 3 h later": (Source.CLI, later_status(client, key_prefix, 3)),
    }
    # The state is what the test means it to be: both kinds, the calendar lane with its next
    # fire, a family, a held lease, pressure, an error, an entry, the watchdog.
    cli = outputs["status --json"][1]
    lanes = {lane["name"]: lane for lane in cli["lanes"]}
    assert {"s.heavy", "s.backup", "s.light", "s.counted"} <= set(lanes)
    assert lanes["s.backup"]["timezone"] == "Europe/Berlin"
    assert lanes["s.backup"]["next_fire_local"].endswith(("+01:00", "+02:00"))
    assert cli["lease"] is not None and cli["pressure"]["current"] is not None
    assert cli["families"][0]["members"] == 3 and "s.counted" in cli["errors"]
    assert [e["name"] for e in cli["entries"]] == ["nightly-report"]
    assert cli["watchdog"] is not None and cli["chain_depth"] >= 1
    assert outputs["status --json, 3 h later"][1]["undispatched"]
    # The pool: one gpu slot held by the one-slot lane, the two-slot lane waiting for both.
    pools = {p["pool"]: p for p in cli["pools"]}
    assert list(pools) == ["heavy", "gpu"]
    assert pools["heavy"]["busy"] == 1 and pools["heavy"]["holders"][0]["holder"] == \
        cli["lease"]["holder"]
    gpu = pools["gpu"]
    assert (gpu["slots"], gpu["busy"]) == (2, 1)
    assert [(h["slot"], h["holder"]) for h in gpu["holders"]] == [(0, "s.embed")]
    assert gpu["waiters"] == ["s.retrain"] and gpu["waiting"] == 1
    assert lanes["s.embed"]["queue"] == "gpu" and lanes["s.embed"]["state"] == "running"

    for name, (source, data) in outputs.items():
        problems = disagreements(data, source)
        assert not problems, f"{name}: " + "; ".join(problems)
        assert {lane["state"] for lane in data["lanes"]} <= set(LANE_STATES), name
    seen = {path for _, data in outputs.values() for path, _ in key_paths(data)}
    never = [f.path for f in CATALOG if f.path not in seen]
    assert not never, f"catalog paths no real status JSON has: {never}"


def test_status_text_shows_each_pool_and_its_holders(
        deployment: Celery, key_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDPROJ_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("SCHEDPROJ_KEY_PREFIX", key_prefix)
    result = CliRunner().invoke(main, ["status"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "pool heavy: 1/1 slots busy" in result.output
    assert re.search(r"pool gpu: 1/2 slots busy; 1 waiting \(s\.retrain\)", result.output)
    assert re.search(r"slot 0: s\.embed \(granted, not started\) for \d+s, fence \d+",
                     result.output)


def test_the_check_finds_an_unknown_key_a_wrong_type_and_the_other_sources_key() -> None:
    data = {"now": "soon", "lanes": [{"name": "a", "surprise": 1}],
            "errors": {"a": "boom"}, "entries_total": 3}
    assert disagreements(data, Source.CLI) == [
        "now: 'soon' is not number", "lanes[].surprise: not in the catalog",
        "entries_total: the catalog gives it to /api/status only"]
    assert dict(key_paths({"errors": {"a": "boom"}})) == {"errors": {"a": "boom"},
                                                          "errors.<lane>": "boom"}


def test_the_reference_page_lists_every_catalog_path_once() -> None:
    page = pages()["reference/status.md"]
    ids = re.findall(r'<a id="(status-[^"]+)"></a>', page)
    assert len(ids) == len(set(ids)) == len(CATALOG)
    for field in CATALOG:
        assert f"`{field.path}`" in page
    assert "Status JSON: reference/status.md" in (ROOT / "mkdocs.yml").read_text()
