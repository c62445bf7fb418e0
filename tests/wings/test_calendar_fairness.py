"""Calendar lanes in the simulator (issue 21, item 6 and the fairness proof): a calendar lane's
staleness ratio is the one the picker ranks by (``core.due.staleness``, i.e.
``schedules.calendar_ratio``), ``--json`` lists every run's start, and a mixed set of cron and
cadence heavy lanes at H = 0.9 keeps every lane's worst ratio within 2.5 with beat's defaults.

Pure: virtual time, no Redis; nothing is timed.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner

from schedproj.core.due import staleness
from schedproj.core.records import LaneState, RunRecord
from schedproj.core.schedules import CronFireTimes, nominal_period
from schedproj.sim import Variant, simulate
from schedproj.sim.cli import simulate as simulate_cmd
from schedproj.sim.index import Planning
from schedproj.sim.metrics import summarize
from schedproj.sim.report import run_starts
from schedproj.sim.trace import parse_trace

PASS = Variant.parse("staleness+pass")


def one_cron_lane(**lane: object) -> str:
    return json.dumps({"start": "2027-01-04T00:00:00Z", "horizon_s": 1000, "lanes": [
        {"name": "tenmin", "kind": "heavy", "cron": "*/10 * * * *", "timezone": "UTC",
         "run_s": 120, **lane}]})


def test_a_calendar_lanes_ratio_is_the_one_the_picker_ranks_by() -> None:
    """A lane firing every 10 minutes from virtual 0, runs of 120 s: it runs 0-120 and
    600-720. The picker's ratio at 600 is 1 (a fire time just passed), 1.2 at 720 (its run
    ended a fifth of a period later); the cadence formula (t - last end) / 600 would say 0.8
    and 1.0."""
    scenario = parse_trace(one_cron_lane())
    run = simulate(scenario, PASS, 1)
    trace = run.lanes["tenmin"]
    assert [(s, e) for s, e, _ in trace.runs] == [(0.0, 120.0), (600.0, 720.0)]
    assert trace.starts == [0.0, 600.0]
    # The ratio at each start, as the engine records it, is core.due.staleness.
    spec = scenario.lanes[0].spec
    assert [(lane, t, ratio) for lane, t, ratio, _ in run.starts] == [
        ("tenmin", 0.0, 1.0), ("tenmin", 600.0, 1.0)]
    ran = LaneState(run=RunRecord(last_run_at=120.0))
    assert staleness(spec, ran, 600.0) == 1.0
    lane = summarize(run).lane("tenmin")
    assert lane.max_ratio == pytest.approx(1.2)   # at 120 and at 720
    assert lane.entitled == 2                     # fires at 0 and 600 within 1000 s
    assert lane.achieved == 2


def test_a_calendar_ratio_that_falls_back_at_a_fire_time_is_measured_piece_by_piece() -> None:
    """A never-run lane held back behind a long run misses its previous fire time whatever
    the time (a coalesced fire): its ratio climbs to 2 over a period, then falls back to 1
    at the next fire time. The worst ratio is read at the piece's end, not the segment's."""
    scenario = parse_trace(json.dumps({
        "start": "2027-01-04T00:00:00Z", "horizon_s": 2000, "lanes": [
            {"name": "hog", "kind": "heavy", "cadence_s": 3600, "run_s": 900, "order": 0},
            {"name": "tenmin", "kind": "heavy", "cron": "*/10 * * * *", "timezone": "UTC",
             "run_s": 60, "order": 1}]}))
    run = simulate(scenario, PASS, 1)
    trace = run.lanes["tenmin"]
    assert trace.runs[0][:2] == (900.0, 960.0)
    # At 900 (after the fire at 600) it is 1 + 300 / 600; the first piece peaked at 2 by 600.
    assert next(ratio for lane, _, ratio, _ in run.starts if lane == "tenmin") == 1.5
    assert summarize(run).lane("tenmin").max_ratio == pytest.approx(2.0)


# -- the fairness proof ------------------------------------------------------------------------

#: Heavy demand: Σ run / period over every lane (a calendar lane's nominal period).
H = 0.9
#: (name, schedule: cron or cadence seconds, zone (None: a cadence lane), relative run length).
#: Periods from 10 minutes to a day, six zones; the trace starts on Friday 2027-03-26 12:00
#: UTC and runs three days: Berlin moves to summer time on Sunday at 01:00 UTC (02:30, when
#: the backup fires, does not exist that night: cron's rule runs it at 03:00 CEST), and the
#: weekday lane in Sydney does not fire over the weekend (its period there is 2 days).
#: Relative run lengths are at most a third of the shortest period (runs of fixed length
#: cannot yield; a longer one would hold a 10-minute lane back by itself).
LANES: tuple[tuple[str, str | float, str | None, float], ...] = (
    ("every-10-utc", "*/10 * * * *", "UTC", 60),
    ("quarter-lord-howe", "*/15 * * * *", "Australia/Lord_Howe", 90),
    ("half-hour-berlin", "5,35 * * * *", "Europe/Berlin", 150),
    ("hourly-new-york", "0 * * * *", "America/New_York", 200),
    ("backup-berlin", "30 2 * * *", "Europe/Berlin", 200),
    ("four-hourly-kolkata", "15 */4 * * *", "Asia/Kolkata", 200),
    ("weekday-sydney", "45 * * * 1-5", "Australia/Sydney", 200),
    ("sweep", 600.0, None, 60),
    ("ingest", 900.0, None, 90),
    ("refresh", 1200.0, None, 120),
    ("rollup", 1800.0, None, 180),
    ("compact", 3600.0, None, 200),
)
START = "2027-03-26T12:00:00Z"


def period(schedule: str | float, zone: str | None) -> float:
    if zone is None:
        return float(schedule)
    return nominal_period(CronFireTimes(str(schedule), zone))


def mixed_trace() -> dict[str, object]:
    scale = H / sum(run / period(schedule, zone) for _, schedule, zone, run in LANES)
    lanes = []
    for name, schedule, zone, run in LANES:
        lane: dict[str, object] = {"name": name, "kind": "heavy", "run_s": run * scale,
                                   "jitter": 0.25}
        lane.update({"cadence_s": schedule} if zone is None
                    else {"cron": schedule, "timezone": zone})
        lanes.append(lane)
    # Beat's defaults: tick, hold cap, pressure rule and wake on release are left out.
    return {"name": "calendar-fairness", "start": START, "horizon_s": 3 * 86400.0,
            "lanes": lanes}


def test_the_trace_is_at_the_demand_it_claims() -> None:
    scenario = parse_trace(json.dumps(mixed_trace()))
    demand = sum(m.run_s / m.spec.cadence_s for m in scenario.lanes)
    assert demand == pytest.approx(H)
    assert sum(m.spec.calendar is not None for m in scenario.lanes) == 7
    assert len({m.spec.calendar.text.split()[-1] for m in scenario.lanes
                if m.spec.calendar is not None}) == 6
    assert max(m.run_s for m in scenario.lanes) <= 600 / 2.5


def test_mixed_calendar_and_cadence_lanes_at_h_09_keep_every_ratio_within_2_5(
        tmp_path: Path) -> None:
    """Through ``schedproj simulate --trace FILE --json``: every lane's worst staleness ratio
    (a calendar lane's measured on its own period, as the picker ranks it) is at most 2.5,
    no lane falls behind its schedule, and the run list shows the backup at 03:00 CEST on
    the night Berlin skips 02:30, and once on each local day."""
    path = tmp_path / "calendar-fairness.json"
    path.write_text(json.dumps(mixed_trace()))
    out = CliRunner().invoke(simulate_cmd, ["--trace", str(path), "--variant",
                                            "staleness+pass", "--json"])
    assert out.exit_code == 0, out.output
    (variant,) = json.loads(out.stdout)["variants"]
    worst = {lane["name"]: lane["max_ratio"] for lane in variant["lanes"]}
    assert set(worst) == {name for name, *_ in LANES}
    assert max(worst.values()) <= 2.5, worst
    for lane in variant["lanes"]:   # every lane ran about as often as it is owed
        assert lane["achieved"] >= 0.75 * lane["entitled"], lane
    assert variant["jain"] >= 0.95
    epoch = datetime.fromisoformat(START).timestamp()
    backups = [datetime.fromtimestamp(epoch + run["start_s"], ZoneInfo("Europe/Berlin"))
               for run in variant["runs"] if run["lane"] == "backup-berlin"]
    # Never-run at the start: due for Friday's 02:30 at once; then one run a local day.
    assert [b.date().isoformat() for b in backups[1:]] == [
        "2027-03-27", "2027-03-28", "2027-03-29"]
    spring = backups[2]
    assert (spring.hour, spring.utcoffset()) == (3, datetime(2027, 3, 28, 12, tzinfo=ZoneInfo(
        "Europe/Berlin")).utcoffset())
    assert spring.astimezone(UTC) >= datetime(2027, 3, 28, 1, 0, tzinfo=UTC)
    assert all(b.hour in (2, 3) for b in backups[1:])


def test_the_runs_listed_are_every_start_of_the_engines_run() -> None:
    scenario = parse_trace(json.dumps(mixed_trace()))
    run = simulate(scenario, PASS, 1, planning=Planning.INDEX)
    listed = run_starts(run)
    assert len(listed) == sum(len(t.starts) for t in run.lanes.values())
    assert [r["start_s"] for r in listed] == sorted(r["start_s"] for r in listed)
    heavy = [(lane, t) for lane, t, _, _ in run.starts]
    assert sorted(heavy, key=lambda x: (x[1], x[0])) == [(r["lane"], r["start_s"])
                                                         for r in listed]
    # Every run is counted: those that ended, and one still going at the horizon at most.
    for name, trace in run.lanes.items():
        assert len(trace.starts) - len(trace.runs) in (0, 1), name


def test_index_planning_runs_what_planning_every_lane_runs_with_calendar_lanes() -> None:
    scenario = parse_trace(json.dumps({**mixed_trace(), "horizon_s": 86400.0}))
    full = simulate(scenario, PASS, 1, planning=Planning.FULL)
    index = simulate(scenario, PASS, 1, planning=Planning.INDEX)
    assert index == full
