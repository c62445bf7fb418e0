"""How fast the simulator keeps up: ``python -m bench.simulator`` (no Redis, pure CPU).

Simulates the family scenario (``schedproj simulate --scenario family``: the REM chain and a
lane family at H = 0.9, seed 1) planning the lanes the due index names, as the simulator does
by default, and with ``--full`` also planning every lane at every decision as it did before
(issue 23: 2) — side by side in one process, the CPU time of each, and whether their runs are
identical (they must be). Goals: 1,000 members over 8 h within 10 s; 10,000 lanes over 24 h
within 60 s.

    python -m bench.simulator                                   # 1,000 members, 8 h and 24 h
    python -m bench.simulator --members 1000 --hours 8 --full   # before and after (~3 min)
    python -m bench.simulator --members 10000 --hours 24
    python -m bench.simulator --goals --json bench/results/sim_speed_goals.json  # both goals

Every run prints the load average before and after: the machine may be shared, and CPU time
still grows with the load (caches, frequency).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import time
from pathlib import Path
from typing import Any

from schedproj.sim.engine import SimRun, Simulation
from schedproj.sim.families import family_rem
from schedproj.sim.index import Planning
from schedproj.sim.model import Variant

GOALS_S = {(1000, 8.0): 10.0, (10000, 24.0): 60.0}


class Measured(Simulation):
    """A simulation that counts the lanes its decisions plan."""

    planned = 0

    def _plan_lanes(self, lanes, t):  # type: ignore[no-untyped-def]
        self.planned += len(lanes)
        return super()._plan_lanes(lanes, t)


def measure(members: int, hours: float, planning: Planning,
            profile: int = 0) -> tuple[dict[str, Any], SimRun]:
    """One run: its CPU and wall time, decisions, lanes planned per decision. ``profile``:
    run it under cProfile and print that many functions, by cumulative time, on stderr (the
    profiler about triples the run's time)."""
    scenario = family_rem(members=members, h=0.9, horizon_s=hours * 3600.0)
    sim = Measured(scenario, Variant.parse("staleness+pass"), 1, planning)
    profiler = cProfile.Profile() if profile else None
    cpu, wall = time.process_time(), time.perf_counter()
    if profiler is not None:
        profiler.enable()
    run = sim.run()
    if profiler is not None:
        profiler.disable()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if profiler is not None:
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(profile)
    return {"members": members, "lanes": len(scenario.lanes), "hours": hours,
            "planning": planning.value, "cpu_s": round(cpu, 2), "wall_s": round(wall, 2),
            "decisions": run.decisions, "heavy_starts": len(run.starts),
            "lanes_planned_per_decision": round(sim.planned / max(1, run.decisions), 1),
            "goal_s": GOALS_S.get((members, hours))}, run


def bench(sizes: list[int], hours: list[float], full: bool,
          cases: list[tuple[int, float]] | None = None, profile: int = 0,
          ) -> list[dict[str, Any]]:
    """Every size over every horizon (or the ``cases`` given: (members, hours) each)."""
    rows = []
    for members, h in cases or [(m, h) for m in sizes for h in hours]:
        row, run = measure(members, h, Planning.INDEX, profile)
        if full:
            before, old = measure(members, h, Planning.FULL)
            row["full_cpu_s"] = before["cpu_s"]
            row["full_lanes_planned_per_decision"] = before["lanes_planned_per_decision"]
            row["speed_up"] = round(before["cpu_s"] / max(row["cpu_s"], 1e-9), 1)
            row["identical_runs"] = old == run
        rows.append(row)
        sys.stderr.write(json.dumps(row) + "\n")
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| members | hours | CPU (index) | goal | lanes planned / decision | decisions "
             "| CPU (every lane) | speed-up | identical |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        goal = f"≤ {r['goal_s']:g} s" if r["goal_s"] else "-"
        full = (f"{r['full_cpu_s']:.1f} s ({r['full_lanes_planned_per_decision']:g} lanes)"
                if "full_cpu_s" in r else "-")
        lines.append(f"| {r['members']:,} | {r['hours']:g} | {r['cpu_s']:.1f} s | {goal} | "
                     f"{r['lanes_planned_per_decision']:g} | {r['decisions']:,} | {full} | "
                     f"{r.get('speed_up', '-')} | {r.get('identical_runs', '-')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--members", default="1000", help="comma-separated member counts")
    p.add_argument("--hours", default="8,24", help="comma-separated virtual horizons (hours)")
    p.add_argument("--full", action="store_true",
                   help="also plan every lane (as before the due index; slow) and compare")
    p.add_argument("--goals", action="store_true",
                   help="run the two goals' cases (1,000 members over 8 h, 10,000 over 24 h)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="profile each run (cProfile) and print its top N functions by "
                        "cumulative time on stderr; its times are then the profiler's")
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args(argv)
    load = [round(x, 2) for x in os.getloadavg()]
    rows = bench([int(m) for m in args.members.split(",")],
                 [float(h) for h in args.hours.split(",")], args.full,
                 sorted(GOALS_S) if args.goals else None, args.profile)
    end = [round(x, 2) for x in os.getloadavg()]
    sys.stdout.write(table(rows) + "\n")
    sys.stdout.write(f"load average (1, 5, 15 min): {load} at the start, {end} at the end\n")
    if args.json is not None:
        args.json.write_text(json.dumps({"load_average_at_start": load,
                                         "load_average_at_end": end,
                                         "rows": rows}, indent=2) + "\n")
    return 0 if all(r.get("identical_runs", True) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
