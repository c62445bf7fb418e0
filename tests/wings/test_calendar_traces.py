"""Simulator traces with calendar lanes (issue 21, item 6): ``cron``, ``timezone`` and
``catchup_window_s`` on a lane and a ``start`` instant for virtual time zero; fire times come
from the same code as beat's, shifted to virtual time."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from schedproj.core.calendar import next_fire
from schedproj.core.due import due_at
from schedproj.core.records import LaneState, RunRecord
from schedproj.core.schedules import ShiftedFireTimes
from schedproj.sim.trace import DEFAULT_START, TraceError, parse_trace, scenario_to_trace

START = "2027-03-27T00:00:00Z"
EPOCH = datetime(2027, 3, 27, tzinfo=UTC).timestamp()


def trace(**top: object) -> str:
    lanes = top.pop("lanes", [
        {"name": "backup", "kind": "heavy", "cron": "30 2 * * *",
         "timezone": "Europe/Berlin", "run_s": 600, "catchup_window_s": 3600},
        {"name": "sweep", "kind": "heavy", "cadence_s": 600, "run_s": 60}])
    return json.dumps({"start": START, "lanes": lanes, **top})


def test_a_cron_lane_fires_in_virtual_time_at_beats_fire_times() -> None:
    scenario = parse_trace(trace())
    backup = next(m.spec for m in scenario.lanes if m.spec.name == "backup")
    assert isinstance(backup.calendar, ShiftedFireTimes)
    assert backup.catchup_window_s == 3600
    # The night of the change: 02:30 does not exist in Berlin on 2027-03-28; it fires at 03:00
    # CEST (01:00 UTC), virtual time = seconds after the start.
    real = next_fire("30 2 * * *", "Europe/Berlin", EPOCH + 86400)
    assert real == datetime(2027, 3, 28, 1, 0, tzinfo=UTC).timestamp()
    assert backup.calendar.next_fire(86400) == real - EPOCH
    ran = LaneState(run=RunRecord(last_run_at=86400.0))
    assert due_at(backup, ran, 86400.0 + 60) == real - EPOCH
    assert backup.cadence_s == 86400    # the schedule's own period, not the shifted clock's


def test_a_calendar_trace_reads_back_to_the_same_scenario() -> None:
    scenario = parse_trace(trace())
    written = scenario_to_trace(scenario)
    assert written["start"] == "2027-03-27T00:00:00+00:00"
    backup = next(lane for lane in written["lanes"] if lane["name"] == "backup")
    assert backup["cron"] == "30 2 * * *" and backup["timezone"] == "Europe/Berlin"
    assert "cadence_s" not in backup
    assert parse_trace(json.dumps(written)).lanes == scenario.lanes


def test_without_a_start_virtual_zero_is_the_documented_monday() -> None:
    scenario = parse_trace(json.dumps({"lanes": [
        {"name": "m", "kind": "light", "cron": "0 9 * * mon", "run_s": 1}]}))
    assert scenario.params["start"] == datetime.fromisoformat(DEFAULT_START).timestamp()
    assert datetime.fromisoformat(DEFAULT_START).weekday() == 0
    spec = scenario.lanes[0].spec
    assert spec.calendar is not None and spec.calendar.next_fire(0) == 9 * 3600


@pytest.mark.parametrize(("lanes", "top", "words"), [
    ([{"name": "x", "kind": "heavy", "cron": "* * * * *", "cadence_s": 5, "run_s": 1}], {},
     "lanes[0] (x): has both cadence_s and cron"),
    ([{"name": "x", "kind": "heavy", "cadence_s": 5, "timezone": "UTC", "run_s": 1}], {},
     "timezone and catchup_window_s apply to calendar lanes only"),
    ([{"name": "x", "kind": "heavy", "cron": "61 * * * *", "run_s": 1}], {},
     "lanes[0] (x)"),
    ([{"name": "x", "kind": "heavy", "cron": "0 * * * *", "timezone": "Nowhere/Else",
       "run_s": 1}], {}, "unknown time zone"),
    ([{"name": "x", "kind": "heavy", "cron": "0 * * * *", "run_s": 1}],
     {"start": "2027-03-27T00:00:00"}, "start: must be an instant with its zone"),
])
def test_calendar_trace_errors_name_the_field_and_the_fix(lanes: list, top: dict,
                                                          words: str) -> None:
    with pytest.raises(TraceError) as caught:
        parse_trace(trace(lanes=lanes, **top))
    assert words in str(caught.value) and "Fix:" in str(caught.value)
