"""The app's crontab entries and runtime one-off entries are judged by the calendar rules calendar
lanes follow (issue 21): cron's DST rules in the entry's zone, missed fire times coalesced into
one run, Celery's ``beat_cron_starting_deadline`` (or the entry's ``catchup_window_s``) as a
catch-up window past which a fire time is recorded as missed and skipped.

In virtual time, through the code beat runs each tick: the entries as beat holds them
(:func:`beat_schedule_table`, :func:`runtime_entry`) judged by :func:`plan_entries`, the plan's
writes applied to the states and the next looks kept as the due index keeps them. The expected
fire instants are computed separately here, from ``zoneinfo`` alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.schedules import crontab
from hypothesis import given, settings
from hypothesis import strategies as st

from schedproj.core.entries import RECHECK_S, EntryDefinition, EntryState, plan_entries
from schedproj.core.errors import ConfigurationError
from schedproj.on_celery.entries import (
    OneOffSchedule,
    beat_schedule_table,
    cron_deadline,
    runtime_entry,
)

BERLIN = ZoneInfo("Europe/Berlin")


def app_of(beat_schedule: dict[str, Any], **conf: Any) -> Celery:
    app = Celery(set_as_current=False)
    app.conf.update(beat_schedule=beat_schedule, **conf)
    return app


@dataclass
class VirtualBeat:
    """Beat's entries step in virtual time: the due index (next look per entry), the stored
    states, and the sends, judged by :func:`plan_entries` exactly as ``BeatEntries`` does."""

    entries: Any
    now: float
    states: dict[str, str | None] = field(default_factory=dict)
    looks: dict[str, float] = field(default_factory=dict)
    sent: list[tuple[str, float]] = field(default_factory=list)
    missed: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.entries:
            self.states.setdefault(name, None)
            self.looks[name] = self.now   # a beat taking over looks at every entry at once

    def tick(self) -> None:
        looked = [n for n, at in self.looks.items() if at <= self.now]
        timings = {n: self.entries[n] for n in looked}
        plan = plan_entries(looked, {n: self.states[n] for n in looked}, timings,
                            {n: t.schedule_key for n, t in timings.items()}, self.now,
                            max_look_s=RECHECK_S)
        assert not plan.errors, plan.errors
        for change in (*plan.starts, *plan.records, *plan.claims):
            assert change.expected == self.states[change.name]
            self.states[change.name] = change.state.encode()
            self.looks[change.name] = change.next_look
        self.looks.update(plan.looks)
        self.sent += [(c.name, self.now) for c in plan.claims]
        for name, (_, count) in plan.missed.items():
            self.missed[name] = self.missed.get(name, 0) + count

    def run_until(self, end: float) -> None:
        """Tick at each next look, as beat sleeps until the due index's head."""
        while True:
            self.tick()
            head = min(self.looks.values())
            if head > end:
                return
            self.now = max(head, self.now)

    def state(self, name: str) -> EntryState:
        raw = self.states[name]
        assert raw is not None
        return EntryState.decode(raw, name)


def fixed_wall_time_instants(zone: ZoneInfo, days: list[date], hour: int,
                             minute: int) -> list[float]:
    """Cron's rule for a fixed hour, computed from zoneinfo alone: a wall time that exists
    fires at its first occurrence (fold 0); one the clock skips fires at the first instant
    after the gap (the instant whose local time is the first at or after it)."""
    out = []
    for day in days:
        wall = datetime(day.year, day.month, day.day, hour, minute, tzinfo=zone)
        instant = wall.replace(fold=0).timestamp()
        back = datetime.fromtimestamp(instant, zone).replace(tzinfo=None)
        if back != wall.replace(tzinfo=None):   # in a gap: the first instant after it
            t = int(instant) - 7200
            while datetime.fromtimestamp(t, zone).replace(tzinfo=None) < wall.replace(
                    tzinfo=None):
                t += 60
            instant = float(t)
        out.append(instant)
    return out


def local_days(first: date, count: int) -> list[date]:
    return [first + timedelta(days=i) for i in range(count)]


@pytest.mark.parametrize("first_day", [date(2027, 3, 26), date(2027, 10, 29)],
                         ids=["spring-forward-2027-03-28", "fall-back-2027-10-31"])
def test_a_fixed_hour_crontab_entry_fires_once_per_local_day_across_a_berlin_change(
        first_day: date) -> None:
    """``crontab(hour=2, minute=30)`` in Europe/Berlin: on 2027-03-28 02:30 does not exist
    and it fires at 03:00 CEST (the first instant after the gap); on 2027-10-31 02:30 comes
    twice and it fires at the first one only. Once per local day, never twice, never missed."""
    app = app_of({"backup": {"task": "t", "schedule": crontab(hour=2, minute=30)}},
                 timezone="Europe/Berlin")
    days = local_days(first_day, 5)
    start = datetime(first_day.year, first_day.month, first_day.day, tzinfo=BERLIN).timestamp()
    beat = VirtualBeat(beat_schedule_table(app), now=start)
    beat.run_until(start + 5 * 86400 - 3600)
    expected = fixed_wall_time_instants(BERLIN, days, 2, 30)
    ran = [at for _, at in beat.sent]
    assert len(ran) == len(expected), (ran, expected)
    for at, fire in zip(ran, expected, strict=True):
        assert fire <= at < fire + 1.0, (datetime.fromtimestamp(at, BERLIN), fire)
    assert len({datetime.fromtimestamp(at, BERLIN).date() for at in ran}) == len(ran)
    change = datetime.fromtimestamp(ran[2], BERLIN)
    if first_day.month == 3:
        assert (change.hour, change.minute) == (3, 0), "not the first instant after the gap"
    else:
        assert (change.hour, change.minute, change.fold) == (2, 30, 0), "not the first 02:30"


def test_a_wildcard_hour_crontab_entry_fires_by_real_elapsed_time() -> None:
    """``crontab(minute=30)`` (every hour at :30) in Berlin: the repeated hour of 2027-10-31
    runs twice, the skipped hour of 2027-03-28 not at all: 25 and 23 runs those days."""
    app = app_of({"hourly": {"task": "t", "schedule": crontab(minute=30)}},
                 timezone="Europe/Berlin")
    for day, runs in ((date(2027, 3, 28), 23), (date(2027, 10, 31), 25)):
        start = datetime(day.year, day.month, day.day, tzinfo=BERLIN).timestamp()
        end = datetime.combine(day + timedelta(days=1), datetime.min.time(),
                               BERLIN).timestamp()
        beat = VirtualBeat(beat_schedule_table(app), now=start - 1)
        beat.run_until(end - 1)
        ran = [at for _, at in beat.sent]
        assert len(ran) == runs
        assert all(math.isclose(at % 3600, 1800, abs_tol=1.0) for at in ran)


def test_an_entry_may_name_its_own_zone_and_its_options_do_not_travel() -> None:
    """``options={"schedproj": {"timezone": ...}}`` moves the entry's crontab to that zone;
    the key is not part of the message's options."""
    spec = {"task": "t", "schedule": crontab(hour=9, minute=0),
            "options": {"queue": "reports", "schedproj": {"timezone": "America/New_York"}}}
    table = beat_schedule_table(app_of({"report": spec}, timezone="Europe/Berlin"))
    entry = table["report"]
    assert entry.options == {"queue": "reports"}
    assert entry.calendar is not None and entry.calendar.times.text.endswith("America/New_York")
    # Sentry Crons builds its monitor from the message's schedule: it names the entry's zone.
    assert str(entry.sent_schedule().tz) == "America/New_York"
    # What operators read (status, entry list) names the zone the entry chose.
    assert entry.shown_schedule() == f"{entry.base_key} in America/New_York"
    plain = beat_schedule_table(app_of({"p": {"task": "t", "schedule": crontab(minute=0)}},
                                       timezone="Europe/Berlin"))["p"]
    assert plain.calendar is not None and plain.sent_schedule() is plain.schedule
    # 2027-01-15 09:00 New York is 14:00 UTC.
    start = datetime(2027, 1, 15, 12, tzinfo=UTC).timestamp()
    beat = VirtualBeat(table, now=start)
    beat.run_until(start + 6 * 3600)
    assert [datetime.fromtimestamp(at, UTC).hour for _, at in beat.sent] == [14]


def test_missed_fire_times_coalesce_into_one_run_by_default() -> None:
    """Beat down from 10:00:05 to 13:05 for an hourly crontab: one run at 13:05, then 14:00."""
    app = app_of({"hourly": {"task": "t", "schedule": crontab(minute=0)}}, timezone="UTC")
    table = beat_schedule_table(app)
    ten = datetime(2027, 5, 3, 10, tzinfo=UTC).timestamp()
    beat = VirtualBeat(table, now=ten + 3 * 3600 + 300)
    beat.states["hourly"] = EntryState(ten + 5, 4, table["hourly"].schedule_key).encode()
    beat.run_until(ten + 4 * 3600 + 60)
    assert [at - ten for _, at in beat.sent] == [3 * 3600 + 300, 4 * 3600]
    assert not beat.missed and beat.state("hourly").total_run_count == 6


def test_beat_cron_starting_deadline_skips_and_records_late_fire_times() -> None:
    """With ``beat_cron_starting_deadline = 30``, the same downtime sends nothing at 13:05: the
    three fire times 11:00, 12:00 and 13:00 are missed (recorded once, in the state), and the
    entry waits for 14:00, which runs."""
    app = app_of({"hourly": {"task": "t", "schedule": crontab(minute=0)}}, timezone="UTC",
                 beat_cron_starting_deadline=30)
    table = beat_schedule_table(app)
    ten = datetime(2027, 5, 3, 10, tzinfo=UTC).timestamp()
    beat = VirtualBeat(table, now=ten + 3 * 3600 + 300)
    beat.states["hourly"] = EntryState(ten + 5, 4, table["hourly"].schedule_key).encode()
    beat.tick()
    assert not beat.sent and beat.missed == {"hourly": 3}
    state = beat.state("hourly")
    assert state.missed == 3 and state.missed_through == ten + 3 * 3600
    assert beat.looks["hourly"] == ten + 4 * 3600, "it waits for its next fire time"
    beat.now += 60
    beat.looks["hourly"] = beat.now   # looked at again (an operator's mark): nothing recounted
    beat.tick()
    assert beat.missed == {"hourly": 3} and not beat.sent
    beat.run_until(ten + 4 * 3600 + 60)
    assert [at - ten for _, at in beat.sent] == [4 * 3600]
    assert beat.state("hourly").missed == 3 and beat.state("hourly").total_run_count == 5


def test_a_fire_time_within_the_deadline_still_runs_and_an_entry_window_overrides_it() -> None:
    ten = datetime(2027, 5, 3, 10, tzinfo=UTC).timestamp()
    own = {"task": "t", "schedule": crontab(minute=0),
           "options": {"schedproj": {"catchup_window_s": 4 * 3600}}}
    app = app_of({"app-deadline": {"task": "t", "schedule": crontab(minute=0)},
                  "own-window": own}, timezone="UTC", beat_cron_starting_deadline=30)
    table = beat_schedule_table(app)
    beat = VirtualBeat(table, now=ten + 3 * 3600 + 20)   # 13:00:20: within 30 s of 13:00
    for name in table:
        beat.states[name] = EntryState(ten + 5, 1, table[name].schedule_key).encode()
    beat.tick()
    assert sorted(name for name, _ in beat.sent) == ["app-deadline", "own-window"]
    # 11:00 and 12:00 are missed under the app's deadline; the entry's own window kept them.
    assert beat.missed == {"app-deadline": 2}


def test_a_bad_own_option_is_an_error_of_that_entry_alone() -> None:
    app = app_of({"bad": {"task": "t", "schedule": crontab(minute=0),
                          "options": {"schedproj": {"timezone": "Mars/Olympus"}}},
                  "good": {"task": "t", "schedule": crontab(minute=0)}}, timezone="UTC")
    table = beat_schedule_table(app)
    now = datetime(2027, 5, 3, 10, 0, 1, tzinfo=UTC).timestamp()
    plan = plan_entries(["bad", "good"], {"bad": None, "good": None}, table,
                        {n: table[n].schedule_key for n in table}, now)
    assert set(plan.errors) == {"bad"} and "Mars/Olympus" in plan.errors["bad"]
    assert {s.name for s in plan.starts} == {"bad", "good"}


def test_the_deadline_setting_must_be_seconds() -> None:
    assert cron_deadline(app_of({}).conf) is None
    assert cron_deadline(app_of({}, beat_cron_starting_deadline=5).conf) == 5.0
    with pytest.raises(ConfigurationError, match="number of seconds"):
        cron_deadline(app_of({}, beat_cron_starting_deadline="soon").conf)


def one_off(at: float, **extra: Any) -> Any:
    app = app_of({}, timezone="UTC")
    raw = EntryDefinition.build(task="t", at=at, **extra).encode()
    return runtime_entry("once", raw, app, "defs")


def test_a_one_off_entry_runs_once_at_its_instant_then_is_spent() -> None:
    at = datetime(2027, 3, 28, 1, 30, tzinfo=UTC).timestamp()
    entry = one_off(at)
    assert isinstance(entry.schedule, OneOffSchedule)
    assert entry.schedule_key == "<at 2027-03-28T01:30:00+00:00>"
    beat = VirtualBeat({"once": entry}, now=at - 7200)
    beat.run_until(at + 3 * 86400)
    assert [t for _, t in beat.sent] == [pytest.approx(at, abs=0.2)]
    # A beat started later (a restart, a takeover) judges the stored state: spent.
    again = VirtualBeat({"once": one_off(at)}, now=at + 5 * 86400,
                        states=dict(beat.states))
    again.run_until(at + 6 * 86400)
    assert not again.sent


def test_a_one_off_first_read_after_its_instant_runs_late_once_or_is_missed() -> None:
    """Beat read the definition only after the instant (it was down): it still runs, once —
    unless the entry's catch-up window has passed, then it is recorded as missed."""
    at = datetime(2027, 3, 28, 1, 30, tzinfo=UTC).timestamp()
    late = VirtualBeat({"once": one_off(at)}, now=at + 600)
    late.run_until(at + 86400)
    assert [t for _, t in late.sent] == [at + 600]
    missed = VirtualBeat({"once": one_off(at, catchup_window_s=60)}, now=at + 600)
    missed.run_until(at + 86400)
    assert not missed.sent and missed.missed == {"once": 1}


def test_runtime_cron_entries_take_their_zone_and_window() -> None:
    app = app_of({}, timezone="UTC", beat_cron_starting_deadline=30)
    raw = EntryDefinition.build(task="t", cron="30 2 * * *", timezone="Europe/Berlin").encode()
    entry = runtime_entry("nightly", raw, app, "defs")
    assert entry.calendar is not None
    assert entry.calendar.times.text == "crontab 30 2 * * * Europe/Berlin"
    assert entry.calendar.catchup_window_s == 30.0, "Celery's deadline holds for crontabs"
    assert entry.shown_schedule().endswith("* * * (m/h/dM/MY/d)> in Europe/Berlin")
    own = EntryDefinition.build(task="t", cron="30 2 * * *", catchup_window_s=600).encode()
    windowed = runtime_entry("n", own, app, "defs")
    assert windowed.calendar is not None and windowed.calendar.catchup_window_s == 600.0
    assert windowed.shown_schedule() == f"{windowed.base_key} catch-up 600s"


def test_runtime_definitions_with_calendar_fields_are_checked_with_the_fix() -> None:
    d = EntryDefinition.build(task="t", at=1.8e9, catchup_window_s=60)
    assert EntryDefinition.decode(d.encode(), "k") == d
    old = EntryDefinition.build(task="t", every_s=5)
    assert "at" not in old.encode() and "timezone" not in old.encode()
    for kwargs, says in [
        ({"task": "t", "at": 1.8e9, "cron": "* * * * *"}, "exactly one schedule"),
        ({"task": "t", "every_s": 5, "timezone": "UTC"}, "cron or one-off"),
        ({"task": "t", "at": 1.8e9, "timezone": "UTC"}, "carries its own offset"),
        ({"task": "t", "cron": "0 3 * * *", "timezone": "Mars/Olympus"}, "Mars/Olympus"),
        ({"task": "t", "at": -1}, "epoch seconds"),
        ({"task": "t", "at": 1.8e9, "catchup_window_s": 0}, "positive number"),
    ]:
        with pytest.raises(ValueError, match=says):
            EntryDefinition.build(**kwargs)


@settings(max_examples=40, deadline=None)
@given(down_from=st.floats(0, 600), down_for=st.floats(0, 900),
       window=st.one_of(st.none(), st.floats(1, 400)))
def test_after_any_downtime_each_fire_time_is_run_or_missed_exactly_once(
        down_from: float, down_for: float, window: float | None) -> None:
    """A minutely crontab entry (with or without a catch-up window), beat down for a while:
    each fire time up to the last run is served by the first run at or after it, coalesced
    with the others that run serves — unless that run came more than the window after it: then
    it is counted missed, once. No run without a fire time of its own."""
    options = {} if window is None else {"options": {"schedproj": {"catchup_window_s": window}}}
    app = app_of({"m": {"task": "t", "schedule": crontab(), **options}}, timezone="UTC")
    table = beat_schedule_table(app)
    t0 = datetime(2027, 5, 3, 10, 0, 7, tzinfo=UTC).timestamp()
    beat = VirtualBeat(table, now=t0)
    beat.run_until(t0 + down_from)
    back = VirtualBeat(table, now=t0 + down_from + down_for, states=dict(beat.states),
                       sent=list(beat.sent), missed=dict(beat.missed))
    back.run_until(t0 + down_from + down_for + 300)
    runs = [at for _, at in back.sent]
    fires = [float(f) for f in range(int(t0 // 60 + 1) * 60, int(runs[-1]) + 1, 60)]
    limit = math.inf if window is None else window
    late = [f for f in fires if min(r for r in runs if r >= f) - f > limit]
    assert back.missed.get("m", 0) == len(late), (runs, back.missed, fires)
    served = [max(f for f in fires if f <= r) for r in runs]
    assert len(set(served)) == len(served), "two runs for one fire time"
    assert all(r - f <= limit for r, f in zip(runs, served, strict=True)), "ran past its window"
