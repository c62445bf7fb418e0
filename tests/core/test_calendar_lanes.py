"""Calendar lanes (issue 21): declared with ``schedule=``, due at their fire times through the
same due code beat and the simulator use, ranked on their own period, missed fire times
coalesced or, with a catch-up window, skipped and counted once."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from celery.schedules import crontab, schedule, solar

from schedproj.core.calendar import next_fire, previous_fire
from schedproj.core.due import NEVER, due_at, staleness
from schedproj.core.errors import LaneDeclarationError
from schedproj.core.families import LaneFamily
from schedproj.core.lanes import Lane, LaneKind, LaneSpec, Profile
from schedproj.core.laneset import build_lane_set, registry_json, specs_from_registry
from schedproj.core.picker import Policy
from schedproj.core.planner import TickInput, plan_tick
from schedproj.core.records import LaneState, RunRecord, SchedRecord, decode, encode
from schedproj.core.schedules import (
    MISSED_COUNT_CAP,
    CronFireTimes,
    OneOffFireTimes,
    OpaqueFireTimes,
    calendar_due_at,
    calendar_ratio,
    from_text,
    missed_fires,
    nominal_period,
)
from schedproj.core.views import view_lane
from schedproj.on_celery.calendars import EstimatedFireTimes, app_timezone, celery_fire_times
from tests.core.test_calendar import ZONES, Rules, utc, windows


class _Task:
    def __init__(self, lane: Lane) -> None:
        self.lane = lane


def lanes(timezone: str = "UTC", **declared: Lane) -> dict[str, LaneSpec]:
    built = build_lane_set({n: _Task(lane) for n, lane in declared.items()},
                           timezone=timezone, converter=celery_fire_times)
    return {s.name: s for s in built.specs}


def ran(at: float | None, **sched: object) -> LaneState:
    return LaneState(run=RunRecord(last_run_at=at, runs=0 if at is None else 1),
                     sched=SchedRecord(**sched))  # type: ignore[arg-type]


BACKUP = Lane(schedule="30 2 * * *", timezone="Europe/Berlin", kind=LaneKind.HEAVY)
# 2027-01-10 02:30 Berlin (CET, +1) is 01:30 UTC.
FIRE = utc("2027-01-10T01:30:00")
DAY = 86400.0


# -- declaring ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("lane", "words"), [
    (Lane(schedule="30 2 * * *", cadence_s=60), "both cadence_s and schedule"),
    (Lane(schedule="30 2 * * *", backlog_driven=True), "backlog-driven lane has a calendar"),
    (Lane(schedule="30 2 * * *", catchup_window_s=-1), "catchup_window_s must be"),
    (Lane(schedule="30 2 * * *", catchup_window_s=True), "catchup_window_s must be"),
    (Lane(cadence_s=60, timezone="Europe/Berlin"), "without a schedule"),
    (Lane(cadence_s=60, catchup_window_s=30), "without a schedule"),
    (Lane(schedule="30 25 * * *"), "hour"),
    (Lane(schedule="30 2 * *"), "has 4 fields"),
    (Lane(schedule="30 2 * * *", timezone="Mars/Olympus"), "unknown time zone"),
    (Lane(schedule=object()), "not a schedule schedproj can read"),
])
def test_a_bad_calendar_declaration_names_the_lane_and_the_fix(lane: Lane, words: str) -> None:
    with pytest.raises(LaneDeclarationError) as caught:
        lanes(nightly=lane)
    assert "nightly" in str(caught.value) and words in str(caught.value)
    assert "Fix" in str(caught.value) or "fix" in str(caught.value).lower()


def test_the_zone_is_the_lanes_own_else_the_apps() -> None:
    specs = lanes("America/New_York", own=BACKUP, apps=Lane(schedule="30 2 * * *"))
    assert specs["own"].calendar == CronFireTimes("30 2 * * *", "Europe/Berlin")
    assert specs["apps"].calendar == CronFireTimes("30 2 * * *", "America/New_York")
    assert specs["own"].calendar is not None and specs["own"].calendar.text == (
        "crontab 30 2 * * * Europe/Berlin")


def test_a_celery_crontab_is_read_by_schedprojs_calendar_not_celerys() -> None:
    specs = lanes(a=Lane(schedule=crontab(minute=30, hour=2), timezone="Europe/Berlin"),
                  b=BACKUP, c=Lane(schedule=crontab(minute="*/15", hour="8-17",
                                                    day_of_week="mon-fri")))
    assert specs["a"].calendar == specs["b"].calendar
    assert isinstance(specs["c"].calendar, CronFireTimes)
    assert specs["c"].calendar.schedule.hours == frozenset(range(8, 18))


def test_other_celery_schedules_fire_when_celery_says() -> None:
    every = schedule(run_every=timedelta(minutes=10))
    specs = lanes(interval=Lane(schedule=every),
                  sunrise=Lane(schedule=solar("sunrise", 52.52, 13.40)))
    interval = specs["interval"].calendar
    assert isinstance(interval, EstimatedFireTimes)
    now = datetime.now(UTC).timestamp()
    assert interval.next_fire(now - 60) == pytest.approx(now + 540, abs=1)
    # An interval has no grid: any instant one interval before the next fire will do.
    assert now - 600 <= interval.previous_fire(now) <= now
    assert specs["interval"].cadence_s == pytest.approx(600, abs=1)
    sunrise = specs["sunrise"].calendar
    assert sunrise is not None
    first = sunrise.next_fire(now)
    # Celery's own answer, to the second: Berlin's next sunrise after now.
    expected = now + solar("sunrise", 52.52, 13.40).remaining_estimate(
        datetime.fromtimestamp(now, UTC)).total_seconds()
    assert first == pytest.approx(expected, abs=2)
    assert 0 < first - now <= DAY + 600
    assert sunrise.previous_fire(first + 60) == pytest.approx(first, abs=2)
    assert 23 * 3600 < specs["sunrise"].cadence_s < 25 * 3600


def test_the_registry_carries_the_calendar_as_text() -> None:
    built = build_lane_set({"backup": _Task(BACKUP),
                            "report": _Task(Lane(schedule="0 9 * * mon-fri",
                                                 catchup_window_s=600, kind=LaneKind.LIGHT)),
                            "sweep": _Task(Lane(cadence_s=600))})

    class _Settings:
        profile = Profile.LOCAL
        hold_cap_s = 1800.0
        starvation_threshold_s = 3600.0

    specs, _ = specs_from_registry(registry_json(built, _Settings()), "registry")
    assert specs == built.specs
    back = {s.name: s for s in specs}
    assert back["report"].calendar == CronFireTimes("0 9 * * 1-5", "UTC")
    assert back["report"].catchup_window_s == 600
    assert back["sweep"].calendar is None
    # A cadence lane's registry entry reads as before calendars existed.
    assert '"calendar"' not in registry_json(build_lane_set({"sweep": _Task(Lane(cadence_s=6))}),
                                             _Settings())


def test_texts_read_back() -> None:
    assert from_text("crontab */5 * * * * Asia/Kolkata") == CronFireTimes("*/5 * * * *",
                                                                          "Asia/Kolkata")
    assert from_text("at 1800000000.0") == OneOffFireTimes(1800000000.0)
    opaque = from_text("celery <solar: sunrise at latitude 1, longitude 2>")
    assert isinstance(opaque, OpaqueFireTimes)
    assert opaque.next_fire(0) == math.inf and opaque.previous_fire(0) == -math.inf
    # A text this host cannot compute (an unknown zone) reads as opaque, not as an error.
    assert from_text("crontab 0 9 * * * Mars/Olympus") == OpaqueFireTimes(
        "crontab 0 9 * * * Mars/Olympus")
    assert isinstance(from_text("at soon"), OpaqueFireTimes)


def test_the_apps_time_zone_follows_celerys_settings() -> None:
    assert app_timezone({"timezone": "Asia/Tokyo"}) == "Asia/Tokyo"
    assert app_timezone({"timezone": None, "enable_utc": True}) == "UTC"
    assert app_timezone({}) == "UTC"


def test_the_nominal_period_is_the_shortest_gap_between_fires() -> None:
    assert nominal_period(CronFireTimes("30 2 * * *", "Europe/Berlin")) == DAY
    assert nominal_period(CronFireTimes("*/15 * * * *", "UTC")) == 900
    assert nominal_period(CronFireTimes("0 9 * * mon-fri", "UTC")) == DAY
    assert nominal_period(OneOffFireTimes(1.0)) == DAY   # fires once: no gap


# -- due and ratio -----------------------------------------------------------------------------

def test_due_at_the_first_fire_time_after_the_last_run() -> None:
    spec = lanes(backup=BACKUP)["backup"]
    state = ran(FIRE + 120)           # ran yesterday... the run ended two minutes after
    assert due_at(spec, state, FIRE + 3600) == FIRE + DAY
    assert not view_lane(spec, state, None, FIRE + DAY - 1).due
    assert view_lane(spec, state, None, FIRE + DAY).due
    # Waiting, the due time does not move (the due index is not rewritten each tick).
    assert due_at(spec, state, FIRE + DAY + 5000) == FIRE + DAY


def test_the_ratio_is_measured_on_the_lanes_own_period() -> None:
    times = CronFireTimes("30 2 * * *", "Europe/Berlin")
    assert calendar_ratio(times, FIRE, FIRE) == 0.0
    assert calendar_ratio(times, FIRE, FIRE + DAY / 2) == pytest.approx(0.5)
    assert calendar_ratio(times, FIRE, FIRE + DAY) == pytest.approx(1.0)
    assert calendar_ratio(times, FIRE, FIRE + DAY + 1) == pytest.approx(1.0, abs=1e-4)
    assert calendar_ratio(times, FIRE, FIRE + 2 * DAY - 1) == pytest.approx(2.0, abs=1e-4)
    # The same for a lane on every 15 minutes: the ratio is in its own periods.
    quarter = CronFireTimes("*/15 * * * *", "UTC")
    assert calendar_ratio(quarter, FIRE, FIRE + 900 + 450) == pytest.approx(1.5)
    # A lane that never ran has missed its previous fire time.
    assert calendar_ratio(quarter, None, FIRE + 300) == pytest.approx(1 + 300 / 900)


def test_the_ratio_across_a_change_uses_the_real_length_of_that_period() -> None:
    # Berlin, 2027-03-28: 02:30 does not exist; it fires at 03:00 CEST (01:00 UTC), 23 h after
    # the day before's 01:30 UTC, and the next day at 00:30 UTC (23.5 h later).
    times = CronFireTimes("30 2 * * *", "Europe/Berlin")
    before = utc("2027-03-27T01:30:00")
    gap = utc("2027-03-28T01:00:00")
    after = utc("2027-03-29T00:30:00")
    assert times.next_fire(before) == gap and times.next_fire(gap) == after
    mid = gap + (after - gap) / 2
    assert calendar_ratio(times, before, mid) == pytest.approx(1.5)


def test_staleness_is_the_one_ratio_views_and_the_picker_see() -> None:
    spec = lanes(backup=BACKUP)["backup"]
    state = ran(FIRE + 60)
    now = FIRE + DAY + DAY / 4
    assert view_lane(spec, state, None, now).ratio == staleness(spec, state, now)
    assert staleness(spec, state, now) == pytest.approx(1.25, abs=1e-3)


def test_heavy_calendar_and_cadence_lanes_compete_by_the_same_picker() -> None:
    specs = lanes(backup=BACKUP, sweep=Lane(cadence_s=DAY, kind=LaneKind.HEAVY))
    now = FIRE + DAY + DAY / 2          # backup's fire passed half a period ago: 1.5
    states = {"backup": ran(FIRE + 60), "sweep": ran(now - 1.4 * DAY)}
    plan = plan_tick(list(specs.values()), TickInput(states=states, lease=None), now,
                     profile=Profile.LOCAL, policy=Policy.STALENESS, start_deadline_s=60,
                     task_id=lambda lane: f"{lane}-1")
    assert plan.decision.winner == "backup"
    states["sweep"] = ran(now - 1.6 * DAY)
    plan = plan_tick(list(specs.values()), TickInput(states=states, lease=None), now,
                     profile=Profile.LOCAL, policy=Policy.STALENESS, start_deadline_s=60,
                     task_id=lambda lane: f"{lane}-1")
    assert plan.decision.winner == "sweep"


# -- coalescing and the catch-up window --------------------------------------------------------

MINUTELY = Lane(schedule=crontab(minute="*"), timezone="Asia/Kolkata", kind=LaneKind.LIGHT)
T0 = utc("2027-06-01T10:00:00")      # a fire time of the minutely schedule


def test_fire_times_missed_while_down_coalesce_into_one_run() -> None:
    spec = lanes(m=MINUTELY)["m"]
    state = ran(T0 + 1)                          # ran for 10:00
    now = T0 + 3 * 60 + 20                       # down for three minutes
    assert due_at(spec, state, now) == T0 + 60   # one run, for all of them
    plan = plan_tick([spec], TickInput(states={"m": state}, lease=None), now,
                     profile=Profile.LOCAL, policy=Policy.STALENESS, start_deadline_s=60,
                     task_id=lambda lane: "m-1")
    assert list(plan.sends) == ["m"] and plan.misses == ()
    assert plan.changes["m"].missed is None


def test_with_a_window_the_late_fires_are_missed_counted_once_and_the_lane_waits() -> None:
    spec = lanes(m=Lane(schedule="* * * * *", catchup_window_s=30, kind=LaneKind.LIGHT))["m"]
    state = ran(T0 + 1)
    now = T0 + 3 * 60 + 45       # 10:01, 10:02 and 10:03 are more than 30 s late
    assert due_at(spec, state, now) == T0 + 4 * 60
    plan = plan_tick([spec], TickInput(states={"m": state}, lease=None), now,
                     profile=Profile.LOCAL, policy=Policy.STALENESS, start_deadline_s=60,
                     task_id=lambda lane: "m-1")
    assert plan.sends == {}
    [miss] = plan.misses
    assert (miss.lane, miss.through, miss.count, miss.window_s) == ("m", T0 + 180, 3, 30)
    sched = plan.changes["m"]
    assert (sched.missed_through, sched.missed) == (T0 + 180, 3)
    # The next tick counts nothing again.
    again = plan_tick([spec], TickInput(states={"m": LaneState(state.run, sched)}, lease=None),
                      now + 5, profile=Profile.LOCAL, policy=Policy.STALENESS,
                      start_deadline_s=60, task_id=lambda lane: "m-2")
    assert again.misses == () and again.sends == {}
    # Within the window of the latest fire: it runs, and the ones before it are missed.
    late = T0 + 3 * 60 + 10
    plan = plan_tick([spec], TickInput(states={"m": state}, lease=None), late,
                     profile=Profile.LOCAL, policy=Policy.STALENESS, start_deadline_s=60,
                     task_id=lambda lane: "m-1")
    assert list(plan.sends) == ["m"]
    assert [(m.through, m.count) for m in plan.misses] == [(T0 + 120, 2)]


def test_missed_fields_round_trip_and_are_left_out_while_unset() -> None:
    sched = SchedRecord(missed_through=T0, missed=4)
    assert decode(SchedRecord, encode(sched), "k") == sched
    assert "missed" not in encode(SchedRecord())


def test_a_lane_that_never_ran_runs_at_once_unless_its_window_passed() -> None:
    coalesce = CronFireTimes("0 9 * * *", "UTC")
    now = utc("2027-06-01T14:00:00")
    assert calendar_due_at(coalesce, None, now) == utc("2027-06-01T09:00:00")
    assert calendar_due_at(coalesce, None, now, catchup_window_s=600) == utc(
        "2027-06-02T09:00:00")
    assert missed_fires(coalesce, None, None, now, 600) == (utc("2027-06-01T09:00:00"), 1)


def test_the_missed_count_stops_at_its_cap_and_records_through_the_latest() -> None:
    times = CronFireTimes("* * * * *", "UTC")
    now = T0 + 5 * DAY
    through, count = missed_fires(times, T0, None, now, 30) or (0.0, 0)
    assert count == MISSED_COUNT_CAP
    assert through == now - 60      # every minute up to the last one past its window
    assert missed_fires(times, T0, through, now, 30) is None


def test_a_one_off_instant_runs_once() -> None:
    once = OneOffFireTimes(T0)
    assert calendar_due_at(once, None, T0 - 10) == T0
    assert calendar_due_at(once, None, T0 + 10) == T0
    assert calendar_due_at(once, T0 + 1, T0 + 10) == math.inf
    assert calendar_due_at(once, None, T0 + 100, catchup_window_s=30) == math.inf
    assert missed_fires(once, None, None, T0 + 100, 30) == (T0, 1)


# -- families ----------------------------------------------------------------------------------

def test_calendar_family_members_spread_after_the_fire_within_the_jitter() -> None:
    built = build_lane_set({"sync": _Task(LaneFamily(schedule="0 * * * *", jitter=0.2))})
    members = [built.spec(f"sync[repo-{i}]") for i in range(200)]
    hour = utc("2027-06-01T10:00:00")
    dues = [due_at(m, ran(hour - 3600 + 30), hour - 1) for m in members]
    assert all(hour <= d <= hour + 0.2 * 3600 for d in dues)
    assert max(dues) - min(dues) > 0.1 * 3600      # they do spread


# -- the proof: every DST change of two years, through the due code ---------------------------

EXPRESSIONS = ("30 2 * * *", "0 3 * * *", "59 1 * * *", "0 2 * * *", "0 0 * * *",
               "* 2 * * *", "30 * * * *", "*/20 * * * *")


@pytest.mark.parametrize("expression", EXPRESSIONS)
@pytest.mark.parametrize("zone", ZONES)
def test_a_calendar_lane_runs_at_each_fire_time_of_the_rules_once(zone: str,
                                                                  expression: str) -> None:
    """Beat's loop in virtual time around every offset change of 2026-2027: look at the lane
    when the due index says (``due_at``), run it when its view says due, record the run's end
    a few seconds later. The starts are exactly the independent rules' fire times."""
    spec = lanes(zone, lane=Lane(schedule=expression, kind=LaneKind.LIGHT))["lane"]
    rules = Rules(expression)
    for start, end in windows(zone):
        expected = rules.fires(zone, start, end)
        state, now, starts = ran(start), start, []
        while True:
            look = due_at(spec, state, now)
            assert look != NEVER and look > now - 1e-9
            if look > end:
                break
            now = look
            assert view_lane(spec, state, None, now).due
            assert not view_lane(spec, state, None, now - 0.5).due or now - 0.5 < start
            starts.append(now)
            state = ran(now + 7)          # the run took seven seconds
            now += 7
        assert starts == expected, (zone, expression)


def test_the_proof_helpers_agree_with_the_calendar() -> None:
    # The loop above starts from a last run at ``start``: the first due is the rules' first
    # fire after it, which is the calendar's too.
    zone, expression = "Europe/Berlin", "30 2 * * *"
    for start, end in windows(zone):
        assert next_fire(expression, zone, start) == Rules(expression).fires(zone, start, end)[0]
        assert previous_fire(expression, zone, end) == Rules(expression).fires(
            zone, start, end)[-1]


# -- state loss ----------------------------------------------------------------------------------

def test_after_a_state_loss_a_calendar_lane_not_due_runs_at_its_next_fire_not_again() -> None:
    """Promise 12 across Redis state loss: a calendar lane beat did not remember as due had
    run for its latest fire time; put back at that time, it is due at the next one only."""
    from schedproj.core.lifecycle import ESTIMATED_AFTER_LOSS, rebuilt

    spec = lanes(backup=BACKUP)["backup"]
    lost_at = FIRE + 3 * 3600                     # three hours after 02:30's run
    record = rebuilt(None, lane="backup", cadence_s=spec.cadence_s, lost_at=lost_at,
                     calendar=spec.calendar)
    assert record.last_run_at == FIRE and record.last_reason == ESTIMATED_AFTER_LOSS
    state = LaneState(run=record)
    assert not view_lane(spec, state, None, lost_at + 60).due
    assert due_at(spec, state, lost_at + 60) == FIRE + DAY
    # Remembered (due) lanes are put back as they were.
    kept = RunRecord(last_run_at=FIRE - DAY)
    assert rebuilt(kept, lane="backup", cadence_s=spec.cadence_s, lost_at=lost_at,
                   calendar=spec.calendar) is kept


def test_a_fire_time_passed_while_a_run_was_under_way_is_not_swallowed() -> None:
    """Daily at 02:30 Berlin. A run sent two minutes before it (``schedproj run``, or a lane
    late behind the lease) ended three seconds after it. Counted from its end, that run served
    02:30: the lane waited a day, with nothing missed nor alarmed. It is due for 02:30 now;
    a run sent at 02:30 (its worker's clock a second behind beat's) is not due again."""
    spec = lanes(b=BACKUP)["b"]
    early = LaneState(run=RunRecord(last_run_at=FIRE + 3, runs=1),
                      sched=SchedRecord(last_dispatch_at=FIRE - 120))
    assert due_at(spec, early, FIRE + 10) == FIRE
    on_time = LaneState(run=RunRecord(last_run_at=FIRE + 2, runs=1),
                        sched=SchedRecord(last_dispatch_at=FIRE + 0.01))
    assert due_at(spec, on_time, FIRE + 10) == FIRE + DAY
