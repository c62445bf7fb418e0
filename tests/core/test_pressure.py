"""Pressure-aware yielding (issue 14): the pure rule, what beat measures, and the simulator's
figures on mixed cadences. No Redis, no clock: every instant is given."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from schedproj.core.deferrals import Deferral
from schedproj.core.errors import StateError
from schedproj.core.lanes import DeferralReason, Gate, GateCondition, LaneKind, LaneSpec
from schedproj.core.pipeline import decide
from schedproj.core.pressure import (
    HOLD_CAP,
    PRESSURE,
    Pressure,
    PressureRule,
    PressureYield,
    changed,
    decode,
    decode_yield,
    encode,
    encode_yield,
    measure,
    yield_reason,
    yielded,
)
from schedproj.core.records import LaneState, LeaseView, RunRecord, SchedRecord
from schedproj.sim import compare, forensic
from schedproj.sim.cli import simulate as simulate_cmd
from schedproj.sim.mixed import configs, mixed_lanes, mixed_sweep
from schedproj.sim.trace import parse_trace, scenario_to_trace

RULE = PressureRule(target_ratio=2.0, min_hold_s=10.0)


def press(*, last: float | None = 0.0, cadence: float = 60.0, p0: bool = False,
          fence: int = 7) -> Pressure:
    return Pressure(lane="short", cadence_s=cadence, last_run_at=last, priority0=p0,
                    fence=fence, at=0.0)


def test_the_hold_cap_yields_whatever_the_pressure() -> None:
    assert yield_reason(held_s=1800, hold_cap_s=1800, pressure=None, rule=None,
                        now=0) == HOLD_CAP
    assert yield_reason(held_s=1799, hold_cap_s=1800, pressure=None, rule=RULE,
                        now=0) is None


def test_pressure_yields_once_the_ratio_reaches_the_target_after_the_minimum_hold() -> None:
    p = press(last=0.0, cadence=60.0)
    # Ratio 2.0 at t = 120: the target; before it, or before the minimum hold, nothing.
    assert yield_reason(held_s=30, hold_cap_s=1800, pressure=p, rule=RULE, now=119) is None
    assert yield_reason(held_s=30, hold_cap_s=1800, pressure=p, rule=RULE, now=120) == PRESSURE
    assert yield_reason(held_s=9, hold_cap_s=1800, pressure=p, rule=RULE, now=500) is None
    # Off: never for pressure.
    assert yield_reason(held_s=30, hold_cap_s=1800, pressure=p, rule=None, now=500) is None


def test_priority0_and_never_run_press_at_once_and_other_holds_do_not() -> None:
    assert yield_reason(held_s=10, hold_cap_s=None, pressure=press(p0=True, last=99.0),
                        rule=RULE, now=100) == PRESSURE
    assert yield_reason(held_s=10, hold_cap_s=None, pressure=press(last=None), rule=RULE,
                        now=1) == PRESSURE
    assert yield_reason(held_s=60, hold_cap_s=None, pressure=press(fence=3), rule=RULE,
                        now=500, fence=4) is None


def _spec(name: str, cadence: float, order: int, **kw: object) -> LaneSpec:
    return LaneSpec(name=name, task_name=name, kind=LaneKind.HEAVY, cadence_s=cadence,
                    order=order, **kw)  # type: ignore[arg-type]


def test_measure_names_the_lane_the_picker_would_choose_and_skips_gated_lanes() -> None:
    lanes = [_spec("long", 86400, 1), _spec("a", 60, 2), _spec("b", 600, 3),
             _spec("gated", 60, 4, gates=(Gate("long"),))]
    states = {"long": LaneState(run=RunRecord(last_run_at=0.0, backlog=50)),
              "a": LaneState(run=RunRecord(last_run_at=0.0)),
              "b": LaneState(run=RunRecord(last_run_at=-1200.0)),
              "gated": LaneState(run=RunRecord(last_run_at=-6000.0))}
    lease = LeaseView(lane="long", token="t", fence=5, granted_at=0.0, started_at=0.0)
    now = 240.0
    decision = decide(lanes, states, lease, now)
    p = measure(decision, states, lease, now)
    # a: ratio 4; b: (240 + 1200)/600 = 2.4; gated (ratio 100) waits on long anyway.
    assert p is not None and (p.lane, p.fence, p.last_run_at) == ("a", 5, 0.0)
    assert p.ratio(now) == pytest.approx(4.0)
    assert measure(decide(lanes, states, None, now), states, None, now) is None


def test_the_published_record_round_trips_and_garbage_is_reported() -> None:
    for p in (press(last=None), press(last=1234.5, cadence=600.0, p0=True, fence=42),
              replace(press(last=-7.25), at=99.5)):
        assert decode(encode(p), "k") == p
    assert decode(encode(None), "k") is None and decode(None, "k") is None
    for garbage, problem in [
            ('{"v": 1, "lane": "x"}', "pressure record missing or bad field ('cadence_s')"),
            ('{"v": 1, "lane": "x", "cadence_s": "soon", "at": 1}', "bad field"),
            ('{"v": 1, "lane": "x", "cadence_s": 60}', "bad field ('at')"),
            ("nope", "not valid JSON"),
            (encode(press()).replace('"v":1', '"v":2'), "version")]:
        with pytest.raises(StateError) as caught:
            decode(garbage, "sp:pressure")
        assert caught.value.key == "sp:pressure", garbage
        assert problem in caught.value.problem, (garbage, caught.value.problem)


# -- measure evaluates gates exactly as decide does ------------------------------------------

HOLDER_LEASE = LeaseView(lane="holder", token="t", fence=9, granted_at=0.0, started_at=0.0)


def test_measure_leaves_out_a_lane_a_family_gate_holds_back() -> None:
    """The bug of issue 18: ``measure`` saw no family views, so it named ``consumer`` (ratio
    100, gated on the family ``fam``) while ``decide``, once the lease is free, defers it
    behind ``fam[a]`` (ratio 1.08) and picks ``fam[a]``: the holder yielded for nothing."""
    member = replace(_spec("fam[a]", 100.0, 2), family="fam")
    consumer = _spec("consumer", 1.0, 3, gates=(Gate("fam", GateCondition.DUE_OR_RUNNING),))
    lanes = [_spec("holder", 60.0, 1), member, consumer]
    now = 1000.0
    states = {"holder": LaneState(run=RunRecord(last_run_at=now - 600.0)),
              "fam[a]": LaneState(run=RunRecord(last_run_at=now - 108.0)),
              "consumer": LaneState(run=RunRecord(last_run_at=now - 100.0))}
    p = measure(decide(lanes, states, HOLDER_LEASE, now), states, HOLDER_LEASE, now)
    assert p is not None and p.lane == "fam[a]"
    assert p.ratio(now) == pytest.approx(1.08)
    # What the holder yields for is what beat picks once the lease is free.
    freed = {**states, "holder": LaneState(run=RunRecord(last_run_at=now))}
    assert decide(lanes, freed, None, now).winner == p.lane


def test_measure_leaves_out_a_lane_a_paused_running_blocker_holds_back() -> None:
    """A paused light blocker whose run is still going holds its (heavy) consumer back in
    ``decide``; ``measure`` sees the same blocker views, so it does not name the consumer."""
    producer = LaneSpec(name="producer", task_name="producer", kind=LaneKind.LIGHT,
                        cadence_s=3600.0, order=2)
    consumer = _spec("consumer", 60.0, 3,
                     gates=(Gate("producer", GateCondition.DUE_OR_RUNNING),))
    lanes = [_spec("holder", 60.0, 1), producer, consumer, _spec("other", 60.0, 4)]
    now = 1000.0
    running = LaneState(
        run=RunRecord(last_run_at=now - 10.0, last_task_id="old", running_task_id="run-1",
                      running_since=now - 5.0, running_until=now + 20.0),
        sched=SchedRecord(paused=True))
    states = {"holder": LaneState(run=RunRecord(last_run_at=now - 60.0)),
              "producer": running,
              "consumer": LaneState(run=RunRecord(last_run_at=now - 6000.0)),
              "other": LaneState(run=RunRecord(last_run_at=now - 120.0))}
    p = measure(decide(lanes, states, HOLDER_LEASE, now), states, HOLDER_LEASE, now)
    assert p is not None and p.lane == "other"
    assert (p.last_run_at, p.cadence_s, p.fence, p.at) == (now - 120.0, 60.0, 9, now)


def test_a_published_record_with_only_the_old_fields_reads_with_their_defaults() -> None:
    old = '{"v": 1, "lane": "x", "cadence_s": 60, "at": 5}'
    assert decode(old, "k") == Pressure(lane="x", cadence_s=60.0, last_run_at=None,
                                        priority0=False, fence=0, at=5.0)


@pytest.mark.parametrize(("old", "new", "says_more"), [
    (None, None, False),
    (None, press(), True),
    (press(), None, True),
    (replace(press(), at=100.0), replace(press(), at=500.0), False),
    (press(), press(), False),
    (press(), replace(press(), lane="other"), True),
    (press(), press(last=10.0), True),
    (press(), press(last=None), True),
    (press(), press(cadence=600.0), True),
    (press(), press(p0=True), True),
    (press(), press(fence=8), True),
], ids=["nobody", "appears", "goes", "looked-again", "same", "other-lane", "ran-since",
        "never-ran", "other-cadence", "priority0", "other-hold"])
def test_pressure_is_republished_only_when_it_says_something_new(
        old: Pressure | None, new: Pressure | None, says_more: bool) -> None:
    assert changed(old, new) is says_more


def test_a_priority0_lane_presses_at_once_and_others_from_the_target_ratio() -> None:
    rule = PressureRule(target_ratio=1.5, min_hold_s=0.0)
    assert press(p0=True, last=100.0).presses(100.0, rule)
    assert not press(last=0.0, cadence=60.0).presses(89.0, rule)
    assert press(last=0.0, cadence=60.0).presses(90.0, rule)
    assert press(last=None).ratio(0.0) == math.inf


def test_pressure_yields_from_the_minimum_hold_on_the_hold_it_was_published_for() -> None:
    p = press(last=0.0, fence=7)
    kw = {"hold_cap_s": None, "pressure": p, "rule": RULE, "now": 500.0}
    assert yield_reason(held_s=10.0, fence=7, **kw) == PRESSURE  # type: ignore[arg-type]
    assert yield_reason(held_s=9.99, fence=7, **kw) is None  # type: ignore[arg-type]
    assert yield_reason(held_s=60.0, fence=0, **kw) == PRESSURE  # type: ignore[arg-type]
    assert yield_reason(held_s=60.0, fence=8, **kw) is None  # type: ignore[arg-type]
    # A record that names no hold (an older beat's) counts for any.
    assert yield_reason(held_s=60.0, hold_cap_s=None, pressure=press(last=0.0, fence=0),
                        rule=RULE, now=500.0, fence=8) == PRESSURE
    assert yield_reason(held_s=60.0, hold_cap_s=None, pressure=None, rule=RULE,
                        now=500.0) is None
    # The hold cap wins over a pressure that does not press yet.
    assert yield_reason(held_s=1800.0, hold_cap_s=1800.0, pressure=press(last=499.0),
                        rule=RULE, now=500.0) == HOLD_CAP


def test_a_pressure_yield_is_recorded_with_a_finite_ratio_and_round_trips() -> None:
    record = yielded(lane="long", task_id="r-1", fence=7, held_s=42.5, now=300.0,
                     pressure=press(last=0.0, cadence=60.0))
    assert record == PressureYield(lane="long", task_id="r-1", fence=7, held_s=42.5, at=300.0,
                                   pressing="short", ratio=5.0)
    assert decode_yield(encode_yield(record), "k") == record
    never = yielded(lane="long", task_id="r-2", fence=8, held_s=11.0, now=300.0,
                    pressure=press(last=None))
    assert never.ratio == 1e9 and decode_yield(encode_yield(never), "k") == never
    assert decode_yield(None, "k") is None


@pytest.mark.parametrize(("garbage", "problem"), [
    ('{"v": 1, "lane": "long"}', "pressure yield record missing or bad field ('task_id')"),
    ('{"v": 1, "lane": "a", "task_id": "t", "fence": "x", "held_s": 1, "at": 1, '
     '"pressing": "b", "ratio": 1}', "pressure yield record missing or bad field"),
    ("[1, 2]", ""),
    ('{"v": 9, "lane": "a"}', "version"),
])
def test_a_garbled_yield_record_is_reported_naming_its_key(garbage: str, problem: str) -> None:
    with pytest.raises(StateError) as caught:
        decode_yield(garbage, "sp:last-yield")
    assert caught.value.key == "sp:last-yield"
    assert problem in caught.value.problem


def test_nobody_pressing_is_published_as_a_null_lane() -> None:
    assert json.loads(encode(None)) == {"v": 1, "lane": None}


def test_by_default_a_run_holds_10_s_and_a_lane_presses_from_ratio_1_5() -> None:
    rule = PressureRule()
    p = press(last=0.0, cadence=100.0)
    assert yield_reason(held_s=9.9, hold_cap_s=None, pressure=p, rule=rule, now=1000.0) is None
    assert yield_reason(held_s=10.0, hold_cap_s=None, pressure=p, rule=rule,
                        now=149.0) is None
    assert yield_reason(held_s=10.0, hold_cap_s=None, pressure=p, rule=rule,
                        now=150.0) == PRESSURE


def test_the_yield_reasons_keep_the_spelling_stored_in_run_records() -> None:
    # Stored as a yielded run's last_reason (the worker writes "hold-cap" itself too) and
    # read back by status, the simulator's counts and older releases.
    assert (HOLD_CAP, PRESSURE) == ("hold-cap", "pressure")


def test_measure_names_a_waiting_lane_that_has_no_record_yet() -> None:
    lanes = [_spec("holder", 60, 1), _spec("new", 600, 2), _spec("old", 60, 3)]
    now = 5000.0
    states = {"holder": LaneState(run=RunRecord(last_run_at=now)),
              "old": LaneState(run=RunRecord(last_run_at=0.0))}
    p = measure(decide(lanes, states, HOLDER_LEASE, now), states, HOLDER_LEASE, now)
    assert p is not None and (p.lane, p.last_run_at, p.cadence_s) == ("new", None, 600.0)


def test_measure_counts_a_lane_whose_bounded_gate_lets_it_go_once_the_lease_is_free() -> None:
    """The gate on ``producer`` has deferred ``gated`` for its whole bound: once the lease is
    free, decide lets ``gated`` go, so it presses now."""
    bounded = Gate("producer", GateCondition.DUE_OR_RUNNING, max_defer_s=600)
    lanes = [_spec("holder", 60, 1), _spec("producer", 600, 2),
             _spec("gated", 60, 3, gates=(bounded,))]
    now = 10_000.0
    states = {"holder": LaneState(run=RunRecord(last_run_at=now)),
              "producer": LaneState(run=RunRecord(last_run_at=now - 700)),
              "gated": LaneState(run=RunRecord(last_run_at=0.0), sched=SchedRecord(
                  deferral=Deferral("gated", DeferralReason.LEASE_HELD, "holder", now - 900,
                                    gate_blocker="producer")))}
    p = measure(decide(lanes, states, HOLDER_LEASE, now), states, HOLDER_LEASE, now)
    assert p is not None and p.lane == "gated"
    freed = {**states, "holder": LaneState(run=RunRecord(last_run_at=now))}
    assert decide(lanes, freed, None, now).winner == "gated"
    # 599 s into the bound it is still held back: the producer presses instead.
    young = {**states, "gated": LaneState(run=RunRecord(last_run_at=0.0), sched=SchedRecord(
        deferral=Deferral("gated", DeferralReason.DEPENDENCY, "producer", now - 599)))}
    p = measure(decide(lanes, young, HOLDER_LEASE, now), young, HOLDER_LEASE, now)
    assert p is not None and p.lane == "producer"


def test_measure_publishes_a_new_family_member_as_run_one_interval_before_it_was_added(
        ) -> None:
    member = replace(_spec("fam[k]", 600, 2), family="fam", due_ratio=1.2)
    lanes = [_spec("holder", 60, 1), member]
    now = 10_000.0
    states = {"holder": LaneState(run=RunRecord(last_run_at=now)),
              "fam[k]": LaneState(run=RunRecord(since=now - 100))}
    p = measure(decide(lanes, states, HOLDER_LEASE, now), states, HOLDER_LEASE, now)
    assert p is not None and (p.lane, p.last_run_at) == ("fam[k]", now - 100 - 720)


def test_a_yield_records_ratios_above_a_billion_as_a_billion() -> None:
    record = yielded(lane="l", task_id="t", fence=1, held_s=1.0, now=1e9 + 0.5,
                     pressure=press(last=0.0, cadence=1.0))
    assert record.ratio == 1e9


def test_measure_names_nobody_when_no_heavy_lane_waits() -> None:
    lanes = [_spec("holder", 60, 1), _spec("fresh", 600, 2),
             LaneSpec(name="light", task_name="light", kind=LaneKind.LIGHT, cadence_s=60,
                      order=3)]
    now = 1000.0
    states = {"holder": LaneState(run=RunRecord(last_run_at=0.0)),
              "fresh": LaneState(run=RunRecord(last_run_at=now - 10)),
              "light": LaneState(run=RunRecord(last_run_at=0.0))}
    # The holder is due itself and light is due: neither presses on the lease.
    assert measure(decide(lanes, states, HOLDER_LEASE, now), states, HOLDER_LEASE,
                   now) is None


def test_measure_names_a_waiting_priority0_lane_over_a_staler_one() -> None:
    lanes = [_spec("holder", 60, 1), _spec("stale", 60, 2),
             _spec("backup", 86400, 3, priority0=True)]
    now = 100_000.0
    states = {"holder": LaneState(run=RunRecord(last_run_at=now)),
              "stale": LaneState(run=RunRecord(last_run_at=0.0)),
              "backup": LaneState(run=RunRecord(last_run_at=now - 90_000))}
    p = measure(decide(lanes, states, HOLDER_LEASE, now), states, HOLDER_LEASE, now)
    assert p == Pressure(lane="backup", cadence_s=86400.0, last_run_at=now - 90_000,
                         priority0=True, fence=9, at=now)


def test_measure_publishes_the_last_run_capped_for_a_skewed_worker_clock() -> None:
    """A worker clock an hour ahead wrote a future last run; what is published is the one
    the picker ranks with (last dispatch + cadence), so the holder sees the true pressure."""
    lanes = [_spec("holder", 60, 1), _spec("skewed", 60, 2)]
    now = 10_000.0
    states = {"holder": LaneState(run=RunRecord(last_run_at=now)),
              "skewed": LaneState(run=RunRecord(last_run_at=now + 3600),
                                  sched=SchedRecord(last_dispatch_at=now - 600))}
    p = measure(decide(lanes, states, HOLDER_LEASE, now), states, HOLDER_LEASE, now)
    assert p is not None and (p.lane, p.last_run_at) == ("skewed", now - 540)


def test_measure_under_the_legacy_policy_ignores_the_gates_the_original_lacked() -> None:
    lanes = [_spec("holder", 60, 1), _spec("producer", 600, 2),
             _spec("gated", 60, 3, gates=(Gate("producer", GateCondition.DUE_OR_RUNNING),))]
    now = 10_000.0
    states = {"holder": LaneState(run=RunRecord(last_run_at=now)),
              "producer": LaneState(run=RunRecord(last_run_at=now - 700)),
              "gated": LaneState(run=RunRecord(last_run_at=0.0))}
    decision = decide(lanes, states, HOLDER_LEASE, now)
    p = measure(decision, states, HOLDER_LEASE, now)
    assert p is not None and p.lane == "producer"
    legacy = measure(decision, states, HOLDER_LEASE, now, legacy=True)
    assert legacy is not None and legacy.lane == "gated"


# -- the simulator ------------------------------------------------------------------------------

def test_mixed_sets_span_the_range_and_carry_the_requested_demand() -> None:
    s = mixed_lanes(0.9, seed=3, index=1)
    cadences = [m.spec.cadence_s for m in s.lanes]
    assert all(60 <= c <= 86400 for c in cadences)
    per_period = {m.name: m.run_s + m.item_s * next(a.items for a in s.arrivals
                                                     if a.lane == m.name) for m in s.lanes}
    assert sum(per_period[m.name] / m.spec.cadence_s for m in s.lanes) == pytest.approx(0.9)
    assert s == mixed_lanes(0.9, seed=3, index=1)  # deterministic


def test_pressure_keeps_mixed_cadences_fresh_with_fewer_yields_than_a_short_cap() -> None:
    sw = mixed_sweep([0.9], seed=1, sets=2, jobs=1)
    rows = {r["config"]: r for r in sw.rows()}
    new, old, short = rows["pressure"], rows["cap-1800s"], rows["cap-120s"]
    assert new["start_ratio_max"] <= 2.5 and new["max_ratio_max"] <= 2.5
    assert old["max_ratio_max"] > 2 * new["max_ratio_max"]
    assert new["pressure_yields"] + new["cap_yields"] < short["cap_yields"]
    assert new["idle_yields"] == 0


def test_forensic_with_pressure_still_drains_near_the_bound() -> None:
    c = compare(forensic(horizon_s=8 * 3600).with_(pressure=PressureRule()), seed=1)
    m = c.get("staleness+pass")
    assert m.drained and m.drain_over_lb is not None and m.drain_over_lb <= 1.05
    assert m.falsifier == 0
    # The legacy variants model the original system: no pressure yields there.
    assert all(y[2] != PRESSURE for y in c.runs["registry+pass"].yields)


def test_trace_form_carries_the_pressure_rule_and_arrivals() -> None:
    s = mixed_lanes(0.5, seed=2, pressure=PressureRule(1.5, 10.0)).with_(horizon_s=7200.0)
    again = parse_trace(json.dumps(scenario_to_trace(s)))
    assert again.pressure == s.pressure and again.arrivals == s.arrivals
    assert [m.spec.cadence_s for m in again.lanes] == [m.spec.cadence_s for m in s.lanes]


def test_configs_compare_pressure_the_cap_alone_a_short_cap_and_legacy() -> None:
    assert [c.label for c in configs()] == ["pressure", "cap-1800s", "cap-120s", "legacy"]


def test_cli_mixed_and_spread_random(tmp_path: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(simulate_cmd, ["--scenario", "mixed", "--H", "0.5", "--sets", "1",
                                       "--horizon", "6h", "--json", "--jobs", "1",
                                       "--dump-trace", str(tmp_path / "m.json")])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert {r["config"] for r in data["rows"]} == {c.label for c in configs()}
    assert json.loads((tmp_path / "m.json").read_text())["pressure"]["target_ratio"] == 1.5
    out = runner.invoke(simulate_cmd, ["--scenario", "random", "--H", "0.5", "--sets", "1",
                                       "--cadence-range", "1m:2h", "--horizon", "4h",
                                       "--jobs", "1", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["params"]["cadence_range"] == [60.0, 7200.0]
    bad = runner.invoke(simulate_cmd, ["--scenario", "mixed", "--cadence-range", "2h:1m"])
    assert bad.exit_code != 0 and "LOW is above HIGH" in bad.output
    assert math.isfinite(data["rows"][0]["busy_fraction_mean"])
