"""The simulator plans the lanes beat's due index names (``schedproj.sim.index``), not every
lane, and that changes no output: on every reference scenario, under every variant, the run
(every lane's runs, starvation and dispatch delays, the lease holds, yields, starts, deferral
counts, decisions) is the run of planning every lane at every decision, as before the index.

Pure: no Redis, virtual time; nothing is timed (the speed is in ``bench/simulator.py``).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from schedproj.core.picker import Policy
from schedproj.sim import VARIANTS, Scenario, SimRun, Simulation, Variant, forensic, simulate
from schedproj.sim.cli import simulate as simulate_cmd
from schedproj.sim.families import family_rem
from schedproj.sim.index import LaneIndex, Planning, Rank
from schedproj.sim.mixed import mixed_lanes
from schedproj.sim.model import BEAT_PRESSURE, SimError
from schedproj.sim.progress import Progress
from schedproj.sim.scenarios import random_lanes
from schedproj.sim.trace import parse_trace

#: The forensic scenario reads the REM lanes' declarations through their shared tasks.
pytestmark = pytest.mark.usefixtures("rem_lanes_resolvable")

HOUR = 3600.0

#: A trace with what the index must get right: a family of one cadence and lanes of others,
#: priority 0, feeds and a backlog-driven lane, a gate on a lane and one on a family, a light
#: lane that runs longer than its start deadline, arrivals, failures, and calendar lanes.
TRACE = {
    "name": "index", "tick_s": 3, "hold_cap_s": 900, "horizon_s": 2 * HOUR,
    "lanes": [
        {"name": "sync", "kind": "heavy", "cadence_s": 600, "run_s": 4, "last_run_ago_s": 300,
         "fail_prob": 0.05, "family": {"members": 20, "jitter": 0.2, "stagger": True}},
        {"name": "ingest", "kind": "heavy", "cadence_s": 300, "run_s": 5, "item_s": 2,
         "batch": 10, "backlog": 40, "feeds": ["index", "report"], "last_run_ago_s": 60},
        {"name": "index", "kind": "heavy", "cadence_s": 600, "run_s": 5, "item_s": 1,
         "backlog_driven": True},
        {"name": "backup", "kind": "heavy", "cadence_s": 3600, "run_s": 30, "priority0": True,
         "order": 0, "last_run_ago_s": 3000},
        {"name": "slow-light", "kind": "light", "cadence_s": 400, "run_s": 90},
        {"name": "report", "kind": "light", "cadence_s": 900, "run_s": 3,
         "gates": [{"blocker": "index", "when": "due-or-running",
                    "reason": "dependency-backpressure"}]},
        {"name": "audit", "kind": "light", "cadence_s": 1200, "run_s": 2,
         "gates": [{"blocker": "sync", "when": "due-or-running",
                    "reason": "dependency-backpressure", "max_defer_s": 600}]},
        {"name": "nightly", "kind": "heavy", "cron": "*/20 * * * *", "timezone": "UTC",
         "run_s": 40},
        {"name": "digest", "kind": "light", "cron": "5,35 * * * *", "timezone": "Europe/Berlin",
         "run_s": 2},
    ],
    "arrivals": [{"at_s": 1800, "lane": "ingest", "items": 25},
                 {"at_s": 5400, "lane": "ingest", "items": 60}],
}


def reference_scenarios() -> dict[str, Scenario]:
    """The scenarios whose output is recorded (tests/reference: forensic, and the random
    sweep at H 0.5, 0.9, 1.2 over its three sets, as ``schedproj simulate`` builds them) and
    the other built-in ones: failures, the mixed cadences, a lane family, a trace."""
    out = {"forensic": forensic(),
           "forensic-failures": forensic(horizon_s=12 * HOUR, fail_prob=0.05)}
    for h in (0.5, 0.9, 1.2):
        for i in range(3):
            out[f"random-H{h}-{i}"] = random_lanes(h, seed="1", index=i, n_heavy=8,
                                                   pressure=BEAT_PRESSURE)
    out["spread-H0.9"] = random_lanes(0.9, seed="1", cadence_range=(60.0, 24 * HOUR))
    out["mixed-H0.9"] = mixed_lanes(0.9)
    out["mixed-H1.2-no-pressure"] = mixed_lanes(1.2, index=1, pressure=None)
    out["family-60"] = family_rem(members=60, h=0.9, horizon_s=8 * HOUR)
    out["trace"] = parse_trace(json.dumps(TRACE))
    return out


SCENARIOS = reference_scenarios()


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_index_planning_runs_what_planning_every_lane_runs(name: str) -> None:
    scenario = SCENARIOS[name]
    variants = VARIANTS if not name.startswith(("family", "mixed")) else (
        Variant(Policy.STALENESS, True), Variant(Policy.REGISTRY, True))
    for variant in variants:
        full = simulate(scenario, variant, "1", planning=Planning.FULL)
        index = simulate(scenario, variant, "1", planning=Planning.INDEX)
        assert full.decisions > 10 and full.lease  # a run with something to compare
        assert_same_run(index, full, f"{name} {variant.label}")


def assert_same_run(index: SimRun, full: SimRun, what: str) -> None:
    """Field by field first (a readable failure), then the whole run."""
    assert index.decisions == full.decisions, what
    assert index.lease == full.lease, what
    assert index.starts == full.starts, what
    assert index.yields == full.yields, what
    for lane, trace in full.lanes.items():
        assert index.lanes[lane] == trace, f"{what}: lane {lane}"
    assert index == full, what


def test_every_decision_of_a_thousand_members_plans_the_same_as_every_lane() -> None:
    """Planning.CHECK plans both ways at every decision and raises at the first difference
    (what is sent, the records written, the deferrals logged, the pressure published, when
    beat next wakes)."""
    scenario = family_rem(members=1000, h=0.9, horizon_s=1200.0)
    run = simulate(scenario, Variant(Policy.STALENESS, True), 1, planning=Planning.CHECK)
    assert run.decisions > 500 and len(run.starts) > 50 and run.yields


class Counting(Simulation):
    """A simulation that counts the lanes each decision plans, and those waiting unplanned."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.planned: list[int] = []
        self.waiting: list[int] = []

    def _plan_lanes(self, lanes, t):  # type: ignore[no-untyped-def]
        self.planned.append(len(lanes))
        self.waiting.append(len(self.index.waiting))
        return super()._plan_lanes(lanes, t)


def test_a_thousand_member_family_plans_only_the_lanes_the_index_names() -> None:
    """Hundreds of members wait for the lease at any moment; a decision plans the few that
    changed, fell due or lead the waiting ones, so the cost follows the work, not N."""
    scenario = family_rem(members=1000, h=0.9, horizon_s=2 * HOUR)
    index = Counting(scenario, Variant(Policy.STALENESS, True), 1)
    index.run()
    first, *rest = index.planned
    assert first == len(scenario.lanes)  # the first decision files every lane
    assert len(rest) > 3000
    assert sum(rest) / len(rest) < 20, sum(rest) / len(rest)
    assert max(rest) < 200
    # Not for want of due lanes: hundreds wait for the lease, unplanned.
    assert max(index.waiting) > 300


def test_full_planning_plans_every_lane() -> None:
    scenario = family_rem(members=50, h=0.9, horizon_s=HOUR)
    full = Counting(scenario, Variant(Policy.STALENESS, True), 1, planning=Planning.FULL)
    full.run()
    assert set(full.planned) == {len(scenario.lanes)}


def test_check_planning_reports_a_difference() -> None:
    """The check can fail: an index that forgets a waiting lane's leaders decides otherwise
    (the pick at a hand-off, the pressure during a hold)."""
    class Forgetful(LaneIndex):
        def leaders(self, now: float) -> list[str]:
            return []

    scenario = family_rem(members=100, h=0.9, horizon_s=HOUR)
    sim = Simulation(scenario, Variant(Policy.STALENESS, True), 1, planning=Planning.CHECK)
    forgetful = Forgetful(by_order=False)
    forgetful.dirty = sim.index.dirty
    sim.index = forgetful
    for rt in sim.enabled:
        rt.notify = forgetful.dirty.add
    with pytest.raises(SimError, match="differs from planning every lane"):
        sim.run()


# -- the index on its own -------------------------------------------------------------------

def rank(name: str, last: float | None, cadence: float = 100.0, order: int = 50,
         tier: int = 1) -> Rank:
    return Rank(tier=tier, cadence_s=cadence, last=last, order=order, name=name)


def test_leaders_are_the_stalest_of_each_cadence_at_the_time_asked() -> None:
    index = LaneIndex(by_order=False)
    now = 1000.0
    index.file("a", 0.0, None, now, rank("a", 500.0, cadence=100.0))    # ratio 5 at 1000
    index.file("b", 0.0, None, now, rank("b", 400.0, cadence=100.0))    # ratio 6
    index.file("c", 0.0, None, now, rank("c", 0.0, cadence=400.0))      # ratio 2.5
    assert index.leaders(now) == ["b"]
    # A long cadence's lane far staler leads now, and is overtaken later: a ratio grows
    # by 1/cadence a second, so the short cadence's lane catches up.
    index.file("d", 0.0, None, now, rank("d", -20_000.0, cadence=400.0))  # ratio 52.5
    assert index.leaders(now) == ["d"]
    assert index.leaders(60_000.0) == ["b"]  # b: 596; d: 200
    # A lane filed again (it changed) or gone from the waiting set is no leader.
    index.file("b", 2000.0, 2000.0, now)
    assert index.leaders(now) == ["d"] and "b" not in index.waiting
    index.file("d", 0.0, None, now)  # due, but planned every decision
    assert index.leaders(now) == ["a"] and "d" in index.active


def test_leaders_include_ties_never_run_lanes_and_priority_zero_first() -> None:
    index = LaneIndex(by_order=False)
    now = 1000.0
    index.file("x", 0.0, None, now, rank("x", 500.0, order=2))
    index.file("y", 0.0, None, now, rank("y", 500.0, order=1))
    assert sorted(index.leaders(now)) == ["x", "y"]  # the planner breaks the tie by order
    index.file("never", 0.0, None, now, rank("never", None))
    assert index.leaders(now) == ["never"]
    index.file("p0", 0.0, None, now, rank("p0", 999.0, tier=0))
    assert index.leaders(now) == ["p0"]
    legacy = LaneIndex(by_order=True)
    legacy.file("late", 0.0, None, now, rank("late", 0.0, order=9))
    legacy.file("first", 0.0, None, now, rank("first", 999.0, order=1))
    assert legacy.leaders(now) == ["first"]


def test_looks_and_wakes() -> None:
    index = LaneIndex(by_order=False)
    index.file("soon", 50.0, 50.0, 10.0)
    index.file("flying", 30.0, None, 10.0)  # in flight: looked at, but wakes nobody
    index.file("never", float("inf"), float("inf"), 10.0)
    assert index.next_wake() == 50.0 and not index.active
    index.advance(30.0)
    assert index.active == {"flying"}
    index.advance(50.0)
    assert index.active == {"flying", "soon"} and index.next_wake() is None
    index.file("soon", 80.0, 90.0, 50.0)
    assert index.next_wake() == 90.0 and index.active == {"flying"}


# -- progress and the time left -------------------------------------------------------------

class Clock:
    """Wall time the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_estimates_the_time_left_from_the_pace_so_far() -> None:
    clock, out = Clock(), io.StringIO()
    progress = Progress(out, runs=2, live=False, clock=clock)
    update = progress.start("staleness+pass")
    clock.now += 10
    update(2 * HOUR, 8 * HOUR)  # a quarter of the first of two runs in 10 s: 70 s to go
    assert out.getvalue() == ("run 1 of 2 (staleness+pass): simulated 2.0 of 8 virtual hours "
                              "(12 %) in 10 s, about 1 min 10 s left\n")
    clock.now += 1
    update(3 * HOUR, 8 * HOUR)  # too soon for another line off a terminal
    assert out.getvalue().count("\n") == 1
    update = progress.start("registry+pass")
    clock.now += 69
    update(4 * HOUR, 8 * HOUR)
    assert out.getvalue().splitlines()[-1].endswith("(75 %) in 1 min 20 s, about 27 s left")
    progress.done()
    assert out.getvalue().splitlines()[-1] == "simulated 2 runs in 1 min 20 s"


def test_progress_on_a_terminal_redraws_one_line() -> None:
    clock, out = Clock(), io.StringIO()
    progress = Progress(out, live=True, clock=clock)
    update = progress.start()
    update(0.0, HOUR)
    clock.now += 1
    update(0.5 * HOUR, HOUR)
    progress.done()
    text = out.getvalue()
    assert text.startswith("\rsimulated 0.0 of 1 virtual hours (0 %) in 0 s, estimating")
    assert "\rsimulated 0.5 of 1 virtual hours (50 %) in 1 s, about 1 s left" in text
    last = text.split("\r")[-1]
    assert last.rstrip(" \n") == "simulated 1 run in 1 s" and text.count("\n") == 1
    assert len(last) - 1 >= len(text.split("\r")[2])  # pads over the longer line before it


def test_the_command_says_its_progress_on_stderr_only_and_plans_either_way() -> None:
    args = ["--scenario", "family", "--members", "30", "--horizon", "2h", "--json"]
    said = CliRunner().invoke(simulate_cmd, [*args, "--progress"])
    quiet = CliRunner().invoke(simulate_cmd, [*args, "--no-progress"])
    full = CliRunner().invoke(simulate_cmd, [*args, "--no-progress", "--planning", "full"])
    assert said.exit_code == quiet.exit_code == full.exit_code == 0, said.output
    assert "simulated 1 run in" in said.stderr and "virtual hours" in said.stderr
    assert quiet.stderr == "" and "simulated" not in said.stdout
    assert json.loads(said.stdout) == json.loads(quiet.stdout) == json.loads(full.stdout)
    bad = CliRunner().invoke(simulate_cmd, ["--scenario", "random", "--planning", "full"])
    assert bad.exit_code == 2 and "--planning applies to" in bad.output


def test_the_thousand_member_family_output_is_the_one_recorded_before_the_index() -> None:
    """``schedproj simulate --scenario family --members 1000 --H 0.9 --horizon 8h --json``,
    recorded planning every lane (bench/results/sim_family_1000.json, 3 min 40 s of CPU):
    the same output, planning the due index's lanes."""
    reference = Path(__file__).parents[1] / "reference" / "sim_family_1000_8h_seed1.json"
    out = CliRunner().invoke(simulate_cmd, ["--scenario", "family", "--members", "1000",
                                            "--H", "0.9", "--horizon", "8h", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == json.loads(reference.read_text())


def test_the_simulator_bench_runs_both_plannings_and_finds_them_identical(
        tmp_path: Path) -> None:
    from bench import simulator as bench_simulator

    out = tmp_path / "sim.json"
    assert bench_simulator.main(["--members", "20", "--hours", "1", "--full",
                                 "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["identical_runs"] is True and row["lanes"] == 26
    assert row["full_lanes_planned_per_decision"] == 26
    assert row["lanes_planned_per_decision"] < 26 and row["decisions"] > 0


class Resting(Simulation):
    """A simulation that counts, at each decision planned from the index, the gated lanes
    left resting and whether the lease's holder was left out."""

    rested = 0
    holder_left_out = 0

    def _plan_lanes(self, lanes, t):  # type: ignore[no-untyped-def]
        if lanes is not self.rts:  # (Planning.CHECK also plans every lane)
            names = {rt.name for rt in lanes}
            self.rested += len(self.resting.keys() - names)
            self.holder_left_out += self.lease is not None and self.lease.lane not in names
        return super()._plan_lanes(lanes, t)


@pytest.mark.parametrize("name", ["trace", "forensic", "family-60"])
def test_resting_gated_lanes_and_the_holder_are_left_out_deciding_the_same(name: str) -> None:
    """A due gated lane its gate defers (or, heavy, waiting for the lease behind a gate that
    blocks) is planned again only when its plan could change — it or a blocker moved, the
    lease was taken or freed, the gate's max_defer_s ran out — and the lease's holder is not
    planned (a gated lane planned brings it as a blocker): Planning.CHECK plans every lane
    beside at every decision and raises at the first difference."""
    sim = Resting(SCENARIOS[name], Variant(Policy.STALENESS, True), 1,
                  planning=Planning.CHECK)
    sim.run()
    assert sim.rested > 0 and sim.holder_left_out > 0, (sim.rested, sim.holder_left_out)


def test_kept_leaders_are_the_leaders_found_afresh() -> None:
    """Each group's leader is kept between calls while lanes join and leave (compared with a
    newcomer, dropped when it leaves): at every instant it names what an index holding the
    same waiting lanes, never asked before, names — near-ties and never-run lanes included."""
    import random
    rnd = random.Random(7)
    kept = LaneIndex(by_order=False)
    filed: dict[str, Rank] = {}
    now = 1000.0
    for step in range(3000):
        now += rnd.choice([0.0, 0.5, 30.0, 1e-7])
        name = f"l{rnd.randrange(40)}"
        if name in filed and rnd.random() < 0.4:
            kept.file(name, now + 100.0, None, now)  # leaves: not due
            del filed[name]
        else:
            # Lasts a hair apart, fixed while the ratios grow: ties begin as time passes.
            last = (None if rnd.random() < 0.02 else
                    rnd.choice([now - rnd.choice([1.0, 1.0 + 1e-12, 50.0]),
                                900.0 + rnd.choice([0.0, 1e-12, 1e-6, 1e-5, 3e-5])]))
            filed[name] = rank(name, last, cadence=rnd.choice([100.0, 200.0]))
            kept.file(name, now, None, now, filed[name])
        fresh = LaneIndex(by_order=False)
        for lane, r in filed.items():
            fresh.file(lane, now, None, now, r)
        assert sorted(kept.leaders(now)) == sorted(fresh.leaders(now)), step
