"""What operators see of calendar lanes (issue 21): the schedule in words, the next fire time in
the lane's zone and in UTC, the fire times missed — in ``schedproj status`` (plain and JSON),
``schedproj lanes``, the status page and ``/metrics`` — and the watchdog's starvation signal
for a heavy calendar lane that keeps missing its window."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis
from rich.console import Console

from schedproj import Lane, LaneKind
from schedproj.core.health import MISSED_IN_A_ROW, Posture, assess, missed_in_a_row
from schedproj.core.lanes import LaneSpec, Profile
from schedproj.core.laneset import build_lane_set, registry_json
from schedproj.core.records import LaneState, LeaseView, RunRecord, SchedRecord, encode
from schedproj.core.schedules import CronFireTimes, OpaqueFireTimes, nominal_period
from schedproj.ops.watchdog import step
from schedproj.settings import Settings
from schedproj.store.protocol import Keys
from schedproj.telemetry import statuspage
from schedproj.telemetry.metrics import SchedprojCollector
from schedproj.telemetry.observe import observe
from schedproj.telemetry.status import as_json, render
from tests.conftest import REDIS_URL

ROOT = Path(__file__).resolve().parents[2]


def at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


#: Friday 4 December 2026, noon UTC: Berlin is on CET (UTC+1), so 02:30 there is 01:30 UTC.
NOW = at("2026-12-04T12:00:00+00:00")
BERLIN = CronFireTimes("30 2 * * *", "Europe/Berlin")
NEXT_FIRE = at("2026-12-05T01:30:00+00:00")


def fire(day: int) -> float:
    """The backup's fire time on ``day`` December 2026."""
    return at(f"2026-12-{day:02d}T01:30:00+00:00")


def calendar(name: str, kind: LaneKind = LaneKind.HEAVY) -> LaneSpec:
    return LaneSpec(name=name, task_name=name, kind=kind, cadence_s=nominal_period(BERLIN),
                    calendar=BERLIN, catchup_window_s=600.0)


def state(last_run: float | None, missed_through: float | None = None,
          missed: int | None = None) -> LaneState:
    return LaneState(run=RunRecord(last_run_at=last_run, runs=0 if last_run is None else 1),
                     sched=SchedRecord(missed_through=missed_through, missed=missed))


def health_of(specs: list[LaneSpec], states: dict[str, LaneState],
              lease: LeaseView | None = None) -> Any:
    return assess(specs, states, lease, NOW, Profile.LOCAL, starvation_threshold_s=3600,
                  hold_cap_s=1800)


# -- the pure gauges -------------------------------------------------------------------------

def test_a_calendar_lane_reports_its_schedule_zone_next_fire_and_misses() -> None:
    cadence = LaneSpec(name="sweep", task_name="sweep", kind=LaneKind.LIGHT, cadence_s=600.0)
    health = health_of([calendar("backup"), cadence],
                       {"backup": state(fire(3) + 300, fire(1), 4)})
    rows = {h.name: h for h in health.lanes}
    backup, sweep = rows["backup"], rows["sweep"]
    assert backup.schedule == "crontab 30 2 * * * Europe/Berlin"
    assert backup.timezone == "Europe/Berlin"
    assert backup.next_fire_at == NEXT_FIRE
    assert (backup.missed, backup.missed_through, backup.missed_in_a_row) == (4, fire(1), 0)
    assert (sweep.schedule, sweep.timezone, sweep.next_fire_at, sweep.missed) == (
        None, None, None, 0)
    assert health.missing == () and health.posture is Posture.HEALTHY


def test_missed_in_a_row_counts_the_fire_times_missed_since_the_last_run() -> None:
    spec = calendar("backup")
    # Ran for the 1st; missed the 2nd, 3rd and 4th: three in a row, counted up to the cap.
    assert missed_in_a_row(spec, state(fire(1) + 60, fire(4), 3), NOW) == MISSED_IN_A_ROW
    assert missed_in_a_row(spec, state(fire(1) + 60, fire(4), 3), NOW, cap=10) == 3
    # Ran for the 3rd, missed the 4th: one; ran after its latest miss: none.
    assert missed_in_a_row(spec, state(fire(3) + 60, fire(4), 7), NOW) == 1
    assert missed_in_a_row(spec, state(fire(4) + 700, fire(3), 7), NOW) == 0
    # Never ran: every miss it recorded was in a row.
    assert missed_in_a_row(spec, state(None, fire(4), 2), NOW) == 2
    assert missed_in_a_row(spec, state(None, fire(4), 1), NOW) == 1
    # Nothing missed, or a cadence lane.
    assert missed_in_a_row(spec, state(fire(3) + 60), NOW) == 0
    cadence = LaneSpec(name="c", task_name="c", kind=LaneKind.HEAVY, cadence_s=60.0)
    assert missed_in_a_row(cadence, state(fire(1), fire(4), 3), NOW) == 0
    # A schedule whose fire times cannot be walked here: one, while a miss is newer.
    opaque = LaneSpec(name="o", task_name="o", kind=LaneKind.HEAVY, cadence_s=300.0,
                      calendar=OpaqueFireTimes("celery <custom>"), catchup_window_s=60.0)
    assert missed_in_a_row(opaque, state(fire(1), fire(4), 3), NOW) == 1


def test_a_heavy_calendar_lane_missing_its_fire_times_in_a_row_degrades_the_posture() -> None:
    specs = [calendar("backup"), calendar("report"), calendar("light", LaneKind.LIGHT)]
    states = {"backup": state(fire(1) + 60, fire(3), 2),   # the 2nd and 3rd: two in a row
              "report": state(fire(2) + 60, fire(3), 9),   # only the 3rd since its last run
              "light": state(fire(1) + 60, fire(3), 2)}    # light: never behind heavy work
    health = health_of(specs, states)
    assert health.missing == ("backup",)
    assert health.posture is Posture.DEGRADED and health.stalled
    assert not health.starving and not health.undispatched and not health.lease_over_cap
    latch, event = step(None, health)
    assert event == "fired" and latch.reasons == ("missed-fires:backup",)
    # Running now (it holds the lease): not missing; once it ran, healthy again.
    lease = LeaseView(lane="backup", token="t", fence=3, granted_at=NOW - 5,
                      started_at=NOW - 4)
    assert health_of(specs, states, lease).missing == ()
    states["backup"] = state(NOW - 10, fire(3), 2)
    calm = health_of(specs, states)
    assert calm.missing == () and calm.posture is Posture.HEALTHY
    assert step(latch, calm)[1] == "cleared"


# -- against Redis: status, the page, metrics ------------------------------------------------

class FakeTask:
    def __init__(self, lane: Lane) -> None:
        self.lane, self.queue = lane, None


#: When beat next looks at the custom-schedule lane (its due index score).
CUSTOM_LOOK = NOW + 240.0


def write_deployment(client: redis.Redis, keys: Keys) -> None:
    """A registry with a Berlin calendar lane, a lane whose schedule only its code computes
    (stored as its text) and a cadence lane; the calendar lane missed four fire times."""
    lanes = build_lane_set({
        "x.backup": FakeTask(Lane(schedule="30 2 * * *", timezone="Europe/Berlin",
                                  catchup_window_s=600)),
        "x.sweep": FakeTask(Lane(cadence_s=60, kind=LaneKind.LIGHT))})
    registry = json.loads(registry_json(lanes, Settings()))
    custom = {**registry["lanes"][0], "name": "x.custom", "task_name": "x.custom",
              "calendar": "celery <every five minutes>", "cadence_s": 300.0}
    registry["lanes"].append(custom)
    client.set(keys.published_lanes, json.dumps(registry))
    client.hset(keys.lanes, mapping={
        "x.backup|run": encode(RunRecord(last_run_at=fire(1) + 60, runs=5)),
        "x.backup|sched": encode(SchedRecord(last_dispatch_at=fire(1), dispatches=5,
                                             missed_through=fire(3), missed=4)),
        "x.sweep|run": encode(RunRecord(last_run_at=NOW - 10, runs=9))})
    client.zadd(keys.due, {"x.custom": CUSTOM_LOOK, "x.sweep": NOW + 50})


def test_status_json_and_text_show_schedule_next_fire_and_misses(client: redis.Redis,
                                                                 keys: Keys) -> None:
    write_deployment(client, keys)
    obs = observe(client, keys, now=NOW)
    health = obs.health()
    data = json.loads(json.dumps(as_json(obs, health)))
    lanes = {lane["name"]: lane for lane in data["lanes"]}
    backup, custom, sweep = lanes["x.backup"], lanes["x.custom"], lanes["x.sweep"]
    assert backup["schedule"] == "crontab 30 2 * * * Europe/Berlin"
    assert backup["timezone"] == "Europe/Berlin"
    assert backup["next_fire_at"] == NEXT_FIRE
    assert backup["next_fire_local"] == "2026-12-05T02:30:00+01:00"
    assert backup["next_fire_utc"] == "2026-12-05T01:30:00+00:00"
    assert backup["next_fire_from"] == "schedule"
    assert (backup["missed"], backup["missed_in_a_row"]) == (4, 2)
    # Fire times only its code computes: the text, and the due index's next look.
    assert custom["schedule"] == "celery <every five minutes>"
    assert custom["next_fire_at"] == CUSTOM_LOOK and custom["next_fire_from"] == "due index"
    assert sweep["schedule"] is None and sweep["next_fire_at"] is None
    assert sweep["cadence_s"] == 60.0
    # The heavy calendar lane missed its last two fire times: named, and the posture says so.
    assert data["missing"] == ["x.backup"] and data["posture"] == "degraded"

    console = Console(width=250, record=True)
    console.print(render(obs, health))
    text = console.export_text()
    assert "crontab 30 2 * * * Europe/Berlin" in text
    assert "in 13.5h — Sat 05 Dec 02:30 CET (01:30 UTC)" in text
    assert "4 (the last 2 in a row)" in text
    assert "(due index)" in text
    assert "MISSED FIRE TIMES" in text and "x.backup (missed 4 in all" in text
    assert "│ 60s " in text   # the cadence lane's cadence, as before


def test_the_status_page_shows_them_too(client: redis.Redis, keys: Keys) -> None:
    write_deployment(client, keys)
    obs = observe(client, keys, now=NOW)
    status = json.loads(json.dumps(as_json(obs, obs.health())))
    rows = {lane["name"]: statuspage.lane_cells(lane, NOW) for lane in status["lanes"]}
    columns = statuspage.TABLE_COLUMNS
    backup = dict(zip(columns, rows["x.backup"], strict=True))
    assert backup["cadence / schedule"] == "crontab 30 2 * * * Europe/Berlin"
    assert backup["next fire"] == "in 13.5h — Sat 05 Dec 02:30 CET (01:30 UTC)"
    assert backup["missed"] == "4 (the last 2 in a row)"
    sweep = dict(zip(columns, rows["x.sweep"], strict=True))
    assert (sweep["cadence / schedule"], sweep["next fire"], sweep["missed"]) == (
        "60s", "-", "-")
    page = statuspage.render_page(status, [])
    assert "crontab 30 2 * * * Europe/Berlin" in page
    assert "MISSED FIRE TIMES" in page


def test_metrics_export_each_calendar_lanes_next_fire(client: redis.Redis,
                                                      keys: Keys) -> None:
    write_deployment(client, keys)
    specs = observe(client, keys, now=NOW).specs
    served = {m.name: m for m in SchedprojCollector(client, keys, Settings(), specs).collect()}
    fires = {s.labels["lane"]: s.value
             for s in served["schedproj_lane_next_fire_timestamp_seconds"].samples}
    # Cadence lanes have no series; the custom schedule's is the due index's next look.
    assert set(fires) == {"x.backup", "x.custom"}
    assert fires["x.custom"] == CUSTOM_LOOK
    # Computed at scrape time: the first fire after now.
    now = datetime.now(UTC).timestamp()
    assert now < fires["x.backup"] <= BERLIN.next_fire(now)
    missed = {s.labels["lane"]: s.value for s in served["schedproj_missed_runs"].samples}
    assert missed == {}   # the counter is beat's (HINCRBY at each miss), not the record's


# -- the command line ------------------------------------------------------------------------

def cli(*args: str, prefix: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SCHEDPROJ_REDIS_URL": REDIS_URL,
           "SCHEDPROJ_KEY_PREFIX": prefix}
    return subprocess.run([sys.executable, "-m", "schedproj.ops.cli", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)


def test_status_command_shows_calendar_lanes(client: redis.Redis, keys: Keys) -> None:
    write_deployment(client, keys)
    out = cli("status", "--json", prefix=keys.prefix)
    assert out.returncode == 0, out.stderr
    lanes = {lane["name"]: lane for lane in json.loads(out.stdout)["lanes"]}
    backup = lanes["x.backup"]
    assert backup["schedule"] == "crontab 30 2 * * * Europe/Berlin" and backup["missed"] == 4
    local = datetime.fromisoformat(backup["next_fire_local"])
    assert (local.hour, local.minute) == (2, 30) and local.timestamp() == backup["next_fire_at"]
    assert datetime.fromisoformat(backup["next_fire_utc"]).utcoffset().total_seconds() == 0
    text = cli("status", prefix=keys.prefix)
    assert text.returncode == 0, text.stderr
    assert "crontab 30 2 * * * Europe/Berlin" in text.stdout and "CET" in text.stdout


def test_lanes_command_shows_schedule_next_fire_and_misses(client: redis.Redis,
                                                           keys: Keys) -> None:
    client.hset(keys.lanes, mapping={
        "cal.backup|sched": encode(SchedRecord(missed_through=NOW - 86400, missed=3))})
    out = cli("lanes", "--lanes", "tests.telemetry.calendar_lanes", "--json", prefix=keys.prefix)
    assert out.returncode == 0, out.stderr
    lanes = {lane["lane"]: lane for lane in json.loads(out.stdout)["lanes"]}
    backup, poll, sweep = lanes["cal.backup"], lanes["cal.poll"], lanes["cal.sweep"]
    assert backup["schedule"] == "crontab 30 2 * * * Europe/Berlin"
    assert backup["timezone"] == "Europe/Berlin" and backup["catchup_window_s"] == 600
    assert backup["missed"] == 3
    local = datetime.fromisoformat(backup["next_fire_local"])
    utc = datetime.fromisoformat(backup["next_fire_utc"])
    assert (local.hour, local.minute) == (2, 30) and local == utc
    assert backup["next_fire_at"] == BERLIN.next_fire(backup["next_fire_at"] - 86400)
    # A custom Celery schedule: `lanes` has the app's code, so its next fire is known.
    assert poll["schedule"].startswith("celery <every five minutes>")
    assert poll["next_fire_at"] is not None and poll["missed"] == 0
    assert sweep["schedule"] is None and sweep["cadence_s"] == 600
    text = cli("lanes", "--lanes", "tests.telemetry.calendar_lanes", prefix=keys.prefix)
    assert text.returncode == 0, text.stderr
    assert "crontab 30 2 * * * Europe/Berlin" in text.stdout
    assert "02:30 CE" in text.stdout   # CET or CEST, whenever the test runs


def test_a_calendar_familys_members_show_its_schedule(client: redis.Redis, keys: Keys) -> None:
    """A family's schedule is stored in the registry as its words, like a lane's, and its
    members (read from the registry, not the code) show it and their own next fire."""
    from schedproj.core.families import LaneFamily

    lanes = build_lane_set({"x.tenants": FakeTask(LaneFamily(
        schedule="0 9 * * mon-fri", timezone="America/New_York", catchup_window_s=900))})
    client.set(keys.published_lanes, registry_json(lanes, Settings()))
    client.hset(keys.lanes, "x.tenants[acme]|run", encode(RunRecord(since=NOW - 86400 * 3)))
    client.sadd(keys.families, "x.tenants")
    client.sadd(keys.family("x.tenants"), "acme")
    obs = observe(client, keys, now=NOW)
    assert obs.problems == [] and obs.families["x.tenants"].calendar is not None
    status = json.loads(json.dumps(as_json(obs, obs.health(), family="x.tenants")))
    (member,) = status["lanes"]
    assert member["name"] == "x.tenants[acme]"
    assert member["schedule"] == "crontab 0 9 * * mon-fri America/New_York"
    # Friday noon UTC is 07:00 in New York: the next fire is 09:00 that morning (14:00 UTC).
    assert member["next_fire_local"] == "2026-12-04T09:00:00-05:00"
    assert member["next_fire_utc"] == "2026-12-04T14:00:00+00:00"
    # Folded, the family shows its schedule too.
    folded = json.loads(json.dumps(as_json(obs, obs.health())))
    (row,) = folded["families"]
    assert row["family"] == "x.tenants"
    assert row["schedule"] == "crontab 0 9 * * mon-fri America/New_York"
    console = Console(width=250, record=True)
    console.print(render(obs, obs.health()))
    assert "crontab 0 9 * * mon-fri America/New_York" in console.export_text()
