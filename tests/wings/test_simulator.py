"""The scheduling simulator (``schedproj simulate``): pure, no Redis, virtual time.

Everything is asserted on the simulator's output (runs, lease holds, metrics), never on wall
clock timing.
"""

from __future__ import annotations

import inspect
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from schedproj.core import picker, pipeline
from schedproj.core import planner as dispatch
from schedproj.core.deferrals import LEASE_WAITS
from schedproj.core.lanes import DeferralReason, Gate, GateCondition, LaneKind, LaneSpec
from schedproj.core.picker import Policy
from schedproj.core.pressure import PressureRule
from schedproj.rem.seed import seed_forensic
from schedproj.sim import (
    VARIANTS,
    Arrival,
    Comparison,
    LaneModel,
    Scenario,
    SimError,
    TraceError,
    Variant,
    compare,
    engine,
    forensic,
    jain,
    lower_bound,
    parse_trace,
    percentile,
    random_lanes,
    scenario_to_trace,
    scenarios,
    simulate,
    summarize,
    sweep,
)
from schedproj.sim.cli import parse_duration
from schedproj.sim.cli import simulate as simulate_cmd
from schedproj.sim.metrics import ratio_max, ratio_time_quantile

#: The forensic scenario reads the REM lanes' declarations through their shared tasks.
pytestmark = pytest.mark.usefixtures("rem_lanes_resolvable")

HOUR = 3600.0
STALENESS_PASS = Variant(Policy.STALENESS, True)
STALENESS_NOPASS = Variant(Policy.STALENESS, False)
REGISTRY_PASS = Variant(Policy.REGISTRY, True)
REGISTRY_NOPASS = Variant(Policy.REGISTRY, False)
HEAVY, LIGHT = LaneKind.HEAVY, LaneKind.LIGHT


def spec(name: str, kind: LaneKind, cadence: float, order: int, **kw: object) -> LaneSpec:
    return LaneSpec(name=name, task_name=f"t.{name}", kind=kind, cadence_s=cadence,
                    order=order, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def forensic_8h() -> Comparison:
    """All four variants on the forensic backlog, 8 virtual hours, seed 1."""
    return compare(forensic(horizon_s=8 * HOUR), seed=1)


# -- it is the project's own core that runs ------------------------------------------------------

def test_the_engine_drives_the_projects_planner_lifecycle_and_picker() -> None:
    # The simulator and FairScheduler call one tick planner; the simulator and LaneTask one
    # run lifecycle: neither keeps a copy of tick sequencing or record updates.
    from schedproj.core import lifecycle
    from schedproj.on_celery import beat, task

    used = vars(engine)
    assert used["plan_tick"] is dispatch.plan_tick is vars(beat)["plan_tick"]
    assert used["lifecycle"] is lifecycle is vars(task)["lifecycle"]
    assert used["pick"] is picker.pick
    assert "decide" not in used and "sched_changes" not in used
    assert vars(dispatch)["decide"] is pipeline.decide


def test_forensic_lanes_are_the_rem_declarations_and_the_demo_backlog() -> None:
    s = forensic()
    specs = {m.name: m.spec for m in s.lanes}
    from schedproj.rem.lanes import CADENCES_S, SUMMARY_GATE_MAX_DEFER_S

    assert {n: sp.cadence_s for n, sp in specs.items()} == CADENCES_S
    (gate,) = specs["summary"].gates
    assert (gate.blocker, gate.when, gate.max_defer_s, gate.in_legacy) == (
        "memory-summary-backfill", GateCondition.DUE_AND_BEHIND, SUMMARY_GATE_MAX_DEFER_S, False)
    (gate,) = specs["golden-path"].gates
    assert (gate.blocker, gate.when, gate.in_legacy) == ("dream", GateCondition.DUE_OR_RUNNING,
                                                         True)
    defaults = {k: p.default for k, p in inspect.signature(seed_forensic).parameters.items()}
    assert defaults["long_sessions"] == scenarios.LONG_SESSIONS
    assert defaults["long_turns"] == scenarios.LONG_TURNS
    assert defaults["short_sessions"] == scenarios.SHORT_SESSIONS
    assert defaults["undigested"] == scenarios.UNDIGESTED
    assert s.lane("memory-summary-backfill").initial_items == 1440
    assert s.lane("summary").initial_items == 174
    assert s.lane("dream").initial_items == 371


# -- determinism ---------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", [STALENESS_PASS, REGISTRY_NOPASS], ids=lambda v: v.label)
def test_deterministic_for_a_seed(variant: Variant) -> None:
    s = forensic(horizon_s=6 * HOUR, fail_prob=0.02)
    a, b = simulate(s, variant, seed=7), simulate(s, variant, seed=7)
    assert a.lease == b.lease
    assert summarize(a).as_dict() == summarize(b).as_dict()
    other = simulate(s, variant, seed=8)
    assert other.lease != a.lease  # the seed matters (jittered durations, failures)


def test_random_sets_and_sweeps_are_deterministic_for_a_seed() -> None:
    assert random_lanes(0.9, seed=3, index=1) == random_lanes(0.9, seed=3, index=1)
    assert random_lanes(0.9, seed=3, index=1) != random_lanes(0.9, seed=4, index=1)
    kw = {"hs": (0.5, 1.2), "seed": 5, "sets": 2, "variants": (STALENESS_PASS,),
          "periods": 6.0}
    one = sweep(jobs=1, **kw)  # type: ignore[arg-type]
    two = sweep(jobs=2, **kw)  # type: ignore[arg-type]
    assert one.as_dict() == two.as_dict()


# -- the forensic backlog: staleness drains it, the legacy picker starves dream -----------------

def test_staleness_policy_drains_the_forensic_backlog(forensic_8h: Comparison) -> None:
    c = forensic_8h
    for label in ("staleness+pass", "staleness-nopass"):
        m = c.get(label)
        assert m.drained, label
        assert m.drain_s is not None and m.drain_s >= m.lower_bound_s
        # Close to the lower bound: little is lost to the order of the work.
        assert m.drain_over_lb is not None and m.drain_over_lb < 1.2
        for lane in ("memory-summary-backfill", "summary", "dream", "golden-path"):
            lm = m.lane(lane)
            assert lm.final_backlog == 0, (label, lane)
            assert lm.runs > 0, (label, lane)
        assert m.lane("memory-summary-backfill").items_done == 1440
        assert m.lane("summary").items_done == 174
        assert m.lane("dream").items_done == 371 + 174
        assert m.lane("memory-summary-backfill").yields > 0  # the hold cap made it yield


def test_legacy_policy_starves_dream_on_the_forensic_backlog(forensic_8h: Comparison) -> None:
    c = forensic_8h
    horizon = 8 * HOUR
    for label in ("registry+pass", "registry-nopass"):
        m = c.get(label)
        assert not m.drained, label
        dream = m.lane("dream")
        assert dream.runs == 0 and dream.items_done == 0
        assert dream.final_backlog >= 371
        assert dream.longest_starvation_s == pytest.approx(horizon)
        assert m.lane("memory-summary-backfill").runs == 0
        assert m.lane("golden-path").runs == 0  # gated on dream, which is always due
        summary = m.lane("summary")
        assert summary.runs > 100  # re-fires on the long sessions it must skip
        assert summary.final_backlog == 24
        assert m.max_ratio > 3 * c.get("staleness+pass").max_ratio
        fair = c.get("staleness+pass").jain
        assert m.jain is not None and fair is not None and m.jain < fair


# -- the light-lane second pass --------------------------------------------------------------------

def _light_delays(run: engine.SimRun) -> list[float]:
    return [d for t in run.lanes.values() if not t.spec.heavy for d in t.light_delays]


@pytest.mark.parametrize("wake", [True, False], ids=["wake", "no-wake"])
def test_with_the_second_pass_no_light_lane_waits_behind_heavy_work(wake: bool) -> None:
    for s in (forensic(horizon_s=8 * HOUR), random_lanes(0.9, seed=2)):
        s = s.with_(wake_on_release=wake)
        run = simulate(s, STALENESS_PASS, seed=1)
        m = summarize(run)
        assert m.falsifier == 0 and m.falsifier_episodes == 0
        delays = _light_delays(run)
        assert delays and max(delays) <= s.tick_s + 1e-9
        assert m.light_delay_p99_s is not None and m.light_delay_p99_s <= s.tick_s + 1e-9


def test_without_the_second_pass_the_falsifier_fires(forensic_8h: Comparison) -> None:
    m = forensic_8h.get("staleness-nopass")
    assert m.falsifier > 0
    assert m.lane("golden-path").falsifier > 0  # golden-path waited behind a heavy winner


# -- hand-checked tiny case: schedule, lower bound, Jain's index ---------------------------------

def tiny(g_run_s: float = 7.0) -> Scenario:
    """a: 4 items of 5 s in batches of 2 after 10 s start-up, feeding b (2 s an item) and the
    light lane g; every lane last ran 100 s before 0."""
    return Scenario(name="tiny", horizon_s=1500.0, lanes=(
        LaneModel(spec("a", HEAVY, 1000, 1), run_s=10, item_s=5, batch=2, backlog=4,
                  feeds=("b", "g"), last_run_ago_s=100),
        LaneModel(spec("b", HEAVY, 500, 2), run_s=10, item_s=2, batch=2, last_run_ago_s=100),
        LaneModel(spec("g", LIGHT, 1000, 3), run_s=g_run_s, last_run_ago_s=100),
    ))


def test_tiny_case_schedule_bound_and_fairness_by_hand() -> None:
    s = tiny()
    # Lower bound: a = 10 + 4*5 = 30, b = 10 + 4*2 = 18 -> 48 of heavy work; g must follow
    # a's last item: 30 + 7 = 37 < 48.
    lb = lower_bound(s)
    assert (lb.heavy_work_s, lb.critical_path_s, lb.total_s) == (48.0, 37.0, 48.0)
    assert lb.critical_path == ("a", "g")
    run = simulate(s, STALENESS_PASS)
    # a drains (its backlog makes it due), then b (4 items fed by a); afterwards each lane
    # runs on its cadence, which counts from the end of its last run.
    assert run.lease == [("a", 0.0, 30.0), ("b", 30.0, 48.0), ("b", 548.0, 558.0),
                         ("a", 1030.0, 1040.0), ("b", 1058.0, 1068.0)]
    # g is dirtied by a's first batch at 20 s and goes at the next poll (21 s: the poll grid
    # runs from the decision at 3 s), again when a finishes at 30 s, then on its cadence.
    assert [r[0] for r in run.lanes["g"].runs] == [21.0, 30.0, 1037.0]
    assert run.lanes["g"].light_delays == [1.0, 0.0, 0.0]
    m = summarize(run)
    assert m.drain_s == 48.0 and m.drain_over_lb == 1.0
    # Jain over a and b: achieved/entitled = 2/(1500/1000) = 4/3 and 3/(1500/500) = 1:
    # (7/3)^2 / (2 * (16/9 + 1)) = 49/50.
    assert (m.lane("a").achieved, m.lane("b").achieved) == (2, 3)
    assert m.jain == pytest.approx(0.98)
    assert m.busy_fraction == 1.0


def test_tiny_case_critical_path_bound() -> None:
    lb = lower_bound(tiny(g_run_s=20.0))  # g's run now outlasts b's work: 30 + 20 = 50 > 48
    assert (lb.heavy_work_s, lb.critical_path_s, lb.total_s) == (48.0, 50.0, 50.0)
    m = summarize(simulate(tiny(g_run_s=20.0), STALENESS_PASS))
    assert m.drain_s is not None and m.drain_s >= 50.0


def test_forensic_lower_bound_is_all_heavy_work_plus_golden_path() -> None:
    s = forensic().map_lanes(jitter=0.0)
    lb = lower_bound(s)
    heavy = 1440 * 4.0 + 174 * 12.0 + (371 + 174) * 5.0 + 3 * 20.0
    assert lb.heavy_work_s == pytest.approx(heavy)
    assert lb.total_s == pytest.approx(heavy + 30.0)
    assert lb.critical_path == ("memory-summary-backfill", "summary", "dream", "golden-path")


def test_release_bound_with_arrivals() -> None:
    s = Scenario(name="arrivals", horizon_s=4000.0, lanes=(
        LaneModel(spec("a", HEAVY, 10_000, 1), run_s=0, item_s=10, backlog=1,
                  last_run_ago_s=0),), arrivals=(Arrival(1001.0, "a", 5),))
    lb = lower_bound(s)
    assert lb.release_s == 1051.0 and lb.total_s == 1051.0
    run = simulate(s, STALENESS_PASS)
    # The arrival is seen by the next poll: every 3 s from the last decision (at 10 s).
    assert run.lease == [("a", 0.0, 10.0), ("a", 1003.0, 1053.0)]
    assert summarize(run).drain_s == 1053.0


def test_jain_percentile_and_staleness_quantiles() -> None:
    assert jain([1.0, 1.0, 1.0]) == 1.0
    assert jain([1.0, 0.0]) == 0.5
    assert jain([3.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert jain([]) is None
    assert percentile([5, 1, 4, 2, 3], 50) == 3
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile([7.0], 99) == 7.0
    # Ratio rising 0 -> 1 over [0, 100] (cadence 100): max 1, time-weighted p99 0.99.
    seg = [(0.0, 0.0, 100.0)]
    assert ratio_max(seg, 100.0) == 1.0
    assert ratio_time_quantile(seg, 100.0, 100.0, 0.99) == pytest.approx(0.99)
    # Half the time at 0 (no segment): p50 is 0, p99 is 0.98.
    assert ratio_time_quantile(seg, 100.0, 200.0, 0.5) == 0.0
    assert ratio_time_quantile(seg, 100.0, 200.0, 0.99) == pytest.approx(0.98)


# -- model behaviour -----------------------------------------------------------------------------

def test_failures_are_recorded_and_a_failed_backup_is_retried() -> None:
    after, window = 900.0, 3600.0
    lane = LaneModel(spec("bk", HEAVY, 86400, 0, priority0=True, retry_after_failure_s=after,
                          retry_window_s=window), run_s=60, fail_prob=0.5,
                     last_run_ago_s=86400)
    s = Scenario(name="retry", horizon_s=3 * HOUR, lanes=(lane,))
    retries = cut_off = 0
    for seed in range(1, 11):
        runs = simulate(s, STALENESS_PASS, seed=seed).lanes["bk"].runs
        # A success is next due a day later: every run but the last ended failed, one streak
        # that began when the first run ended.
        streak_start = runs[0][1]
        for (_, end, outcome), nxt in itertools.pairwise(runs):
            assert outcome == "failed"
            # Retried 15 min after the failure, as soon as a poll sees it ...
            assert end + after <= nxt[0] <= end + after + s.tick_s
            # ... and only while the streak is inside the retry window.
            assert end + after - streak_start <= window
            retries += 1
        _, end, outcome = runs[-1]
        if outcome == "failed":
            # Not retried after it: its retry fell outside the window (or past the horizon).
            outside = end + after - streak_start > window
            assert outside or end + after > s.horizon_s
            cut_off += outside
    assert retries > 0
    assert cut_off > 0, "no seed's failing streak reached the end of its retry window"
    f = forensic(horizon_s=6 * HOUR, fail_prob=0.1)
    run = simulate(f, STALENESS_PASS, seed=1)
    assert sum(o == "failed" for t in run.lanes.values() for _, _, o in t.runs) > 3


def test_random_set_has_the_requested_heavy_demand() -> None:
    for h in (0.25, 0.9, 1.2):
        s = random_lanes(h, seed=1, n_heavy=6)
        heavy = [m for m in s.lanes if m.spec.heavy]
        assert len(heavy) == 6
        assert sum(m.run_s / m.spec.cadence_s for m in heavy) == pytest.approx(h)


def test_overload_staleness_bounded_registry_starves() -> None:
    s = random_lanes(2.0, seed=1)
    st = summarize(simulate(s, STALENESS_PASS))
    reg = summarize(simulate(s, REGISTRY_PASS))
    assert st.max_ratio <= 2 * 2.0  # within 2H
    assert reg.max_ratio > 3 * st.max_ratio  # the last lanes in declared order starve


def test_scenario_validation_names_the_lane() -> None:
    with pytest.raises(SimError, match=r"lane 'b'.*gate names unknown lane 'zz'"):
        Scenario(name="x", lanes=(
            LaneModel(spec("b", HEAVY, 60, 1, gates=(Gate("zz"),)), run_s=1),))
    with pytest.raises(SimError, match="cycle"):
        Scenario(name="x", lanes=(
            LaneModel(spec("a", HEAVY, 60, 1), run_s=1, feeds=("b",)),
            LaneModel(spec("b", HEAVY, 60, 2), run_s=1, feeds=("a",))))
    with pytest.raises(SimError, match="light lane has backlog"):
        Scenario(name="x", lanes=(LaneModel(spec("l", LIGHT, 60, 1), run_s=1, backlog=3),))


# -- trace files ---------------------------------------------------------------------------------

TRACE = {
    "name": "mine", "tick_s": 2, "hold_cap_s": 600, "horizon_s": 7200,
    "lanes": [
        {"name": "ingest", "kind": "heavy", "cadence_s": 300, "run_s": 5, "item_s": 2,
         "batch": 10, "backlog": 40, "feeds": ["index", "report"], "last_run_ago_s": 60},
        {"name": "index", "kind": "heavy", "cadence_s": 600, "run_s": 5, "item_s": 1,
         "backlog_driven": True},
        {"name": "backup", "kind": "heavy", "cadence_s": 3600, "run_s": 30, "priority0": True,
         "order": 0, "last_run_ago_s": 3000},
        {"name": "report", "kind": "light", "cadence_s": 900, "run_s": 3,
         "gates": [{"blocker": "index", "when": "due-or-running",
                    "reason": "dependency-backpressure"}]},
    ],
    "arrivals": [{"at_s": 1800, "lane": "ingest", "items": 25}],
}


def test_trace_file_runs_and_round_trips(tmp_path: Path) -> None:
    s = parse_trace(json.dumps(TRACE))
    assert s.name == "mine" and s.tick_s == 2.0 and len(s.arrivals) == 1
    c = compare(s, seed=1)
    m = c.get("staleness+pass")
    assert m.drained and m.lane("index").items_done == 65
    assert m.falsifier == 0
    again = parse_trace(json.dumps(scenario_to_trace(s)))
    assert again == s
    f = forensic(horizon_s=4 * HOUR)
    back = parse_trace(json.dumps(scenario_to_trace(f)))
    first = summarize(simulate(f, STALENESS_PASS)).as_dict()
    assert summarize(simulate(back, STALENESS_PASS)).as_dict() == first


@pytest.mark.parametrize(("patch", "message"), [
    (lambda t: t["lanes"][0].pop("cadence_s"), r"lanes\[0\] \(ingest\)\.cadence_s: missing"),
    (lambda t: t["lanes"][1].update(cadense_s=5), r"lanes\[1\] \(index\)\.cadense_s: unknown"),
    (lambda t: t["lanes"][2].update(kind="medium"), r"lanes\[2\] \(backup\)\.kind: 'medium'"),
    (lambda t: t["lanes"][0].update(run_s=-1), r"lanes\[0\] \(ingest\)\.run_s: must be >= 0"),
    (lambda t: t["lanes"][3]["gates"][0].update(blocker="nope"),
     r"lanes\[3\].*gate names unknown lane 'nope'"),
    (lambda t: t["lanes"][3].update(priority0=True), r"lanes\[3\].*priority0 is set on a light"),
    (lambda t: t["arrivals"][0].update(lane="report"), r"arrival at 1800.0s names 'report'"),
    (lambda t: t.update(profile="moon"), r"profile: 'moon' is not one of"),
    (lambda t: t["lanes"][0].update(feeds="index"), r"lanes\[0\] \(ingest\)\.feeds: expected"),
])
def test_trace_errors_name_the_field(patch: object, message: str) -> None:
    t = json.loads(json.dumps(TRACE))
    patch(t)  # type: ignore[operator]
    with pytest.raises(TraceError, match=message):
        parse_trace(json.dumps(t), source="mine.json")


def test_trace_syntax_error_names_line_and_column() -> None:
    with pytest.raises(TraceError, match=r"mine.json: line 3 column 1: not valid JSON"):
        parse_trace('{"lanes": [\n  {"name": "a"},\n]}', source="mine.json")


# -- command line --------------------------------------------------------------------------------

def test_cli_forensic_json_and_dump(tmp_path: Path) -> None:
    out = tmp_path / "forensic.json"
    r = CliRunner().invoke(simulate_cmd, ["--horizon", "4h", "--json", "--variant",
                                          "staleness+pass", "--variant", "registry+pass",
                                          "--dump-trace", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert [v["variant"] for v in data["variants"]] == ["staleness+pass", "registry+pass"]
    assert data["variants"][0]["drained"] and not data["variants"][1]["drained"]
    r2 = CliRunner().invoke(simulate_cmd, ["--trace", str(out), "--variant", "staleness+pass"])
    assert r2.exit_code == 0, r2.output
    assert "staleness+pass" in r2.stdout


def test_cli_random_sweep_table_and_errors() -> None:
    r = CliRunner().invoke(simulate_cmd, ["--scenario", "random", "--H", "0.5,1.2", "--sets",
                                          "1", "--horizon", "3h", "--jobs", "1"])
    assert r.exit_code == 0, r.output
    assert "2·H" in r.stdout and "staleness+pass" in r.stdout
    bad = CliRunner().invoke(simulate_cmd, ["--scenario", "random", "--H", "zero"])
    assert bad.exit_code != 0 and "'zero' is not a number" in bad.output
    bad = CliRunner().invoke(simulate_cmd, ["--scenario", "trace"])
    assert bad.exit_code != 0 and "--trace FILE" in bad.output
    assert parse_duration("90m") == 5400.0 and parse_duration("2") == 2.0
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("2 weeks")


def test_cli_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    r = CliRunner().invoke(simulate_cmd, ["--scenario", "random", "--H", "0.5", "--H", "1.2",
                                          "--sets", "1", "--horizon", "2h", "--jobs", "1",
                                          "--plot", str(tmp_path)])
    assert r.exit_code == 0, r.output
    png = tmp_path / "max_ratio_vs_H.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = CliRunner().invoke(simulate_cmd, ["--horizon", "4h", "--plot", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "forensic_timeline.png").stat().st_size > 10_000


def test_variants_cover_both_policies_with_and_without_the_pass() -> None:
    assert {(v.policy, v.second_pass) for v in VARIANTS} == {
        (p, b) for p in (Policy.STALENESS, Policy.REGISTRY) for b in (True, False)}
    assert Variant.parse("registry-nopass") == REGISTRY_NOPASS
    with pytest.raises(SimError, match="unknown variant"):
        Variant.parse("fifo")
    assert DeferralReason.LEASE_HELD in LEASE_WAITS
    assert STALENESS_NOPASS.label == "staleness-nopass"


# -- lane families (issue 11) ----------------------------------------------------------------------

def test_a_trace_family_expands_into_members_and_dumps_back_folded() -> None:
    from schedproj.sim.trace import parse_trace, scenario_to_trace

    text = json.dumps({"name": "fam", "horizon_s": 3600, "lanes": [
        {"name": "plain", "kind": "heavy", "cadence_s": 600, "run_s": 30},
        {"name": "sync", "kind": "heavy", "cadence_s": 1800, "run_s": 10,
         "family": {"members": ["a", "b", "c"], "jitter": 0.2, "stagger": True}},
        {"name": "report", "kind": "light", "cadence_s": 300, "run_s": 5,
         "gates": [{"blocker": "sync"}]}]})
    s = parse_trace(text)
    names = [m.name for m in s.lanes]
    assert names == ["plain", "sync[a]", "sync[b]", "sync[c]", "report"]
    members = [m for m in s.lanes if m.spec.family == "sync"]
    assert len({m.spec.due_ratio for m in members}) == 3, "jitter is per key"
    assert len({m.last_run_ago_s for m in members}) == 3, "stagger spreads last runs"
    dumped = scenario_to_trace(s)
    (fam,) = [lane for lane in dumped["lanes"] if "family" in lane]
    assert fam["name"] == "sync" and fam["family"]["members"] == ["a", "b", "c"]
    assert fam["family"]["jitter"] == pytest.approx(0.2)
    bad = json.loads(text)
    bad["lanes"][1]["family"]["members"] = ["ok", "not ok"]
    with pytest.raises(SimError, match=r"lanes\[1\] \(sync\)\.family\.members\[1\]"):
        parse_trace(json.dumps(bad))


def test_the_family_scenario_reports_members_and_the_rem_chain() -> None:
    from schedproj.sim.engine import simulate
    from schedproj.sim.families import family_rem, family_report
    from schedproj.sim.metrics import summarize
    from schedproj.sim.model import Variant

    s = family_rem(members=40, h=0.9, horizon_s=4 * 3600.0)
    run = simulate(s, Variant.parse("staleness+pass"), 1)
    report = family_report(summarize(run), run)
    assert report.members == 40 and report.worst_member is not None
    assert report.jain_members is not None and 0 < report.jain_members <= 1
    assert set(report.rem) >= {"summary", "dream", "memory-summary-backfill"}
    assert set(report.verdicts()) == {"rem_chain_drained", "member_max_ratio_at_most_2.5",
                                      "jain_members_at_least_0.95"}


def test_the_family_scenario_yields_to_pressure_as_beat_does_by_default() -> None:
    """Beat yields to pressure by default, so the family scenario does: with it the members
    stay far less stale while the REM chain's backlog drains than with the hold cap alone."""
    from schedproj.sim.engine import simulate
    from schedproj.sim.families import MAX_RATIO_GOAL, family_rem, family_report
    from schedproj.sim.metrics import summarize
    from schedproj.sim.model import Variant

    reports = {}
    for name, kwargs in (("default", {}), ("hold cap alone", {"pressure": None})):
        s = family_rem(members=100, h=0.9, horizon_s=8 * 3600.0, **kwargs)
        run = simulate(s, Variant.parse("staleness+pass"), 1)
        reports[name] = family_report(summarize(run), run)
    assert family_rem(members=10).pressure is not None
    assert reports["default"].rem_drained
    assert reports["default"].member_max_ratio <= MAX_RATIO_GOAL
    assert reports["hold cap alone"].member_max_ratio > MAX_RATIO_GOAL


def test_a_long_simulation_reports_its_progress() -> None:
    from schedproj.sim.engine import simulate
    from schedproj.sim.families import family_rem
    from schedproj.sim.model import Variant

    seen: list[tuple[float, float]] = []
    s = family_rem(members=10, h=0.9, horizon_s=2 * 3600.0)
    simulate(s, Variant.parse("staleness+pass"), 1, lambda done, h: seen.append((done, h)))
    done = [d for d, _ in seen]
    assert len(done) >= 15 and done == sorted(done)
    assert all(h == s.horizon_s and 0 < d <= h for d, h in seen)


# -- the simulator's defaults are beat's ----------------------------------------------------------

MINIMAL_TRACE = {"lanes": [{"name": "a", "kind": "heavy", "cadence_s": 60, "run_s": 1}]}


def _beat_defaults() -> dict[str, Any]:
    from schedproj.settings import Settings

    return {name: f.default for name, f in Settings.model_fields.items()}


def _beat_rule() -> PressureRule | None:
    beat = _beat_defaults()
    if not beat["pressure_yield"]:
        return None
    return PressureRule(target_ratio=beat["pressure_target_ratio"],
                        min_hold_s=beat["pressure_min_hold_s"])


def test_every_scenario_starts_from_beats_settings_defaults() -> None:
    """A simulation predicts the configuration users run: every knob the simulator shares
    with beat (hold cap, pressure yielding and its threshold and minimum hold, poll interval,
    wake on release, profile, picker policy, lease TTL, start deadline, time limits) starts
    at beat's settings default, in every scenario."""
    from schedproj.core import defaults
    from schedproj.sim.families import family_rem
    from schedproj.sim.mixed import mixed_lanes

    beat, rule = _beat_defaults(), _beat_rule()
    assert rule is not None  # beat yields to pressure by default
    built = {"forensic": forensic(), "random": random_lanes(0.9),
             "spread": random_lanes(0.9, cadence_range=(60.0, 3600.0)),
             "mixed": mixed_lanes(0.9), "family": family_rem(members=2),
             "trace": parse_trace(json.dumps(MINIMAL_TRACE))}
    built["plain"] = Scenario(name="plain", lanes=built["trace"].lanes)
    for name, s in built.items():
        assert s.pressure == rule, name
        assert s.hold_cap_s == beat["hold_cap_s"], name
        assert s.tick_s == beat["beat_max_loop_interval_s"], name
        assert s.wake_on_release is beat["wake_on_release"], name
        assert s.profile is beat["profile"], name
    assert VARIANTS[0].policy is beat["policy"] and VARIANTS[0].second_pass
    # The engine reads lease and run timing from the module beat's settings default to.
    assert vars(engine)["defaults"] is defaults
    assert (beat["lease_ttl_s"], beat["start_deadline_s"], beat["heavy_time_limit_s"],
            beat["light_time_limit_s"]) == (defaults.LEASE_TTL_S, defaults.START_DEADLINE_S,
                                            defaults.HEAVY_TIME_LIMIT_S,
                                            defaults.LIGHT_TIME_LIMIT_S)


def test_a_trace_lane_gets_the_lane_declarations_defaults() -> None:
    """Due ratio, retry policy, deployment, order...: a trace lane that names none of them is
    the lane a bare ``Lane(...)`` declaration gives beat; and the due rules (due ratio, skew
    cap, retry window) are beat's own functions, not copies."""
    from types import SimpleNamespace

    from schedproj.core import due
    from schedproj.core.lanes import Lane
    from schedproj.core.laneset import build_lane_set

    (traced,) = parse_trace(json.dumps(MINIMAL_TRACE)).specs
    declared = build_lane_set({"trace.a": SimpleNamespace(
        lane=Lane(name="a", kind=LaneKind.HEAVY, cadence_s=60))}).specs
    assert (traced,) == declared
    used = vars(engine)
    assert used["due_at"] is due.due_at and used["retry_at"] is due.retry_at
    assert used["effective_last_run"] is due.effective_last_run


@pytest.mark.parametrize(("args", "where"), [
    (["--scenario", "forensic", "--horizon", "1h", "--variant", "staleness+pass"],
     ("scenario", "pressure")),
    (["--scenario", "random", "--H", "0.9", "--sets", "1", "--horizon", "1h", "--jobs", "1",
      "--variant", "staleness+pass"], ("params", "pressure")),
    (["--scenario", "family", "--members", "2", "--horizon", "1h"], ("pressure",)),
    (["--trace", "TRACE", "--variant", "staleness+pass"], ("scenario", "pressure")),
], ids=["forensic", "random", "family", "trace"])
def test_the_command_runs_beats_pressure_rule_unless_told_not_to(
        args: list[str], where: tuple[str, ...], tmp_path: Path) -> None:
    trace = tmp_path / "mine.json"
    trace.write_text(json.dumps({**MINIMAL_TRACE, "horizon_s": 3600}))
    args = [str(trace) if a == "TRACE" else a for a in args]

    def pressure_of(extra: list[str]) -> Any:
        r = CliRunner().invoke(simulate_cmd, [*args, *extra, "--json"])
        assert r.exit_code == 0, r.output
        found = json.loads(r.stdout)
        for key in where:
            found = found[key]
        return found

    rule = _beat_rule()
    assert rule is not None
    beats = {"target_ratio": rule.target_ratio, "min_hold_s": rule.min_hold_s}
    assert pressure_of([]) == beats
    assert pressure_of(["--pressure"]) == beats  # still accepted
    assert pressure_of(["--no-pressure"]) is None
    assert pressure_of(["--pressure-target", "2"]) == {**beats, "target_ratio": 2.0}
