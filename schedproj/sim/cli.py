"""``schedproj simulate``: register with ``main.add_command(simulate)`` in schedproj/cli.py."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import click

from schedproj.core.errors import SchedprojError

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: str) -> float:
    """Seconds, or a number with a unit: 90, 90s, 30m, 24h, 2d."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-z]*)\s*", value)
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(f"{value!r} is not a duration; write seconds or a number with s, m, "
                         f"h or d (e.g. 24h)")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"{value!r} must be longer than 0")
    return seconds


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def _cadence_range(ctx: click.Context, param: click.Parameter,
                   value: str | None) -> tuple[float, float] | None:
    if value is None:
        return None
    low, sep, high = value.partition(":")
    try:
        if not sep:
            raise ValueError(f"{value!r} is not LOW:HIGH")
        bounds = parse_duration(low), parse_duration(high)
    except ValueError as exc:
        raise click.BadParameter(f"{exc}; write LOW:HIGH, e.g. 1m:24h", ctx=ctx,
                                 param=param) from None
    if bounds[0] > bounds[1]:
        raise click.BadParameter(f"{value!r}: LOW is above HIGH", ctx=ctx, param=param)
    return bounds


def _demands(values: tuple[str, ...]) -> list[float]:
    hs: list[float] = []
    for value in values:
        for part in value.split(","):
            if not part.strip():
                continue
            try:
                h = float(part)
            except ValueError:
                raise click.BadParameter(f"{part!r} is not a number", param_hint="--H") from None
            if not h > 0:
                raise click.BadParameter(f"{part!r} must be > 0", param_hint="--H")
            hs.append(h)
    return hs


def _plannings() -> list[Any]:
    from schedproj.sim.index import Planning

    return list(Planning)


def _progress(wanted: bool | None, runs: int) -> Any:
    """A :class:`~schedproj.sim.progress.Progress` on stderr, or None when not wanted."""
    from schedproj.sim.progress import Progress

    live = sys.stderr.isatty()
    if not (live if wanted is None else wanted):
        return None
    return Progress(sys.stderr, runs, live=live)


def _variant_labels() -> list[str]:
    from schedproj.sim.model import VARIANTS

    return [v.label for v in VARIANTS]


@click.command()
@click.option("--scenario",
              type=click.Choice(["forensic", "random", "mixed", "trace", "family", "pools"]),
              default="forensic", show_default=True,
              help="forensic: the REM chain with the original's backlog; random: random lane "
                   "sets at heavy demand H; mixed: cadences from 1 minute to 24 hours, work "
                   "arriving each period, pressure-aware yielding against the hold cap alone, "
                   "a 120 s cap and the legacy picker; trace: your own lanes from --trace FILE; "
                   "family: a heavy lane family of --members members and the REM chain at "
                   "total heavy demand --H (default 0.9), staleness picker only; pools: a "
                   "4-slot pool with a family of --members members and lanes of other "
                   "cadences (one taking 2 slots) at --H per slot (default 0.9), beside the "
                   "one lease, staleness picker only.")
@click.option("--members", default=1000, show_default=True, type=click.IntRange(1),
              help="Members of the family or pools scenario's lane family.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Trace file (JSON, see docs/simulator.md); implies --scenario trace.")
@click.option("--H", "hs", multiple=True, metavar="H[,H...]",
              help="Heavy demand Σ run_time/cadence of the random sets; repeat or "
                   "comma-separate to sweep (default 0.25,0.5,0.75,0.9,1.2).")
@click.option("--seed", default=1, show_default=True, type=int,
              help="Random seed: the same seed gives the same runs and figures.")
@click.option("--horizon", default=None, callback=_duration, metavar="DURATION",
              help="Virtual time to simulate (default: forensic 24h; random 20 x the longest "
                   "cadence; trace: its horizon_s).")
@click.option("--tick", default=None, callback=_duration, metavar="DURATION",
              help="Beat's poll interval (default 3 s, or the trace's tick_s).")
@click.option("--hold-cap", default=None, callback=_duration, metavar="DURATION",
              help="Heavy hold cap (default 30 min, or the trace's hold_cap_s).")
@click.option("--sets", default=None, type=click.IntRange(1),
              help="Random lane sets per H (default: random 3, mixed 20).")
@click.option("--cadence-range", default=None, callback=_cadence_range, metavar="LOW:HIGH",
              help="Cadences log-uniform over this range, run lengths differing between lanes "
                   "(random: spread sets instead of cadences within a factor 3; mixed: default "
                   "1m:24h).")
@click.option("--pressure/--no-pressure", default=None,
              help="Pressure-aware yielding, on by default in every scenario as in beat "
                   "(SCHEDPROJ_PRESSURE_YIELD); --no-pressure: the hold cap alone. A trace's "
                   "own \"pressure\" rule is used unless a pressure flag is given; mixed "
                   "always compares both.")
@click.option("--pressure-target", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="RATIO", help="Pressure: a waiting lane this stale makes the holder "
                                    "yield (default beat's, 1.5).")
@click.option("--min-hold", default=None, callback=_duration, metavar="DURATION",
              help="Pressure: the least a run holds before pressure can make it yield "
                   "(default beat's, 10s).")
@click.option("--heavy-lanes", default=8, show_default=True, type=click.IntRange(1),
              help="Heavy lanes per random set.")
@click.option("--variant", "variants", multiple=True, type=click.Choice(_variant_labels()),
              help="Only these variants (repeatable; default all four).")
@click.option("--fail-prob", type=click.FloatRange(0, 1, max_open=True), default=None,
              help="Probability that a run step (fixed part or one batch) fails, every lane.")
@click.option("--no-wake", is_flag=True,
              help="A finishing run does not wake beat; the next poll sees it.")
@click.option("--jobs", type=click.IntRange(1), default=None,
              help="Processes for the random sweep (default up to 2).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--progress/--no-progress", default=None,
              help="Say on stderr how far a forensic, trace or family run got and about how "
                   "long it has left (default: when stderr is a terminal). Never on stdout, "
                   "so --json stays clean.")
@click.option("--planning", type=click.Choice([p.value for p in _plannings()]),
              default="index", show_default=True,
              help="Which lanes a decision plans, with the same output either way: index "
                   "(those beat's due index names), full (every lane, as before the index: "
                   "slow) or check (both, compared at every decision: slow). Forensic, trace "
                   "and family scenarios.")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write PNG plots into this directory (needs matplotlib).")
@click.option("--dump-trace", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the forensic/trace scenario as a trace file (a starting point for "
                   "your own).")
def simulate(scenario: str, trace_path: Path | None, hs: tuple[str, ...], seed: int,
             horizon: float | None, tick: float | None, hold_cap: float | None,
             sets: int | None, cadence_range: tuple[float, float] | None,
             pressure: bool | None, pressure_target: float | None, min_hold: float | None,
             heavy_lanes: int, variants: tuple[str, ...], fail_prob: float | None,
             no_wake: bool, jobs: int | None, as_json: bool, plot_dir: Path | None,
             dump_trace: Path | None, members: int, progress: bool | None,
             planning: str) -> None:
    """Simulate the scheduler in virtual time: the project's own pipeline and picker, a model
    of run durations, backlog, yields, gates and failures; four policy variants side by side
    (staleness or legacy registry picker, with or without the light-lane second pass)."""
    from schedproj.sim.model import Variant

    chosen = tuple(Variant.parse(v) for v in variants) if variants else None
    if trace_path is not None:
        scenario = "trace"
    rule = _rule(pressure, pressure_target, min_hold)
    # A trace keeps its own rule unless a pressure flag overrides it.
    own_rule = pressure is None and pressure_target is None and min_hold is None
    if cadence_range is not None and scenario not in ("random", "mixed"):
        raise click.UsageError("--cadence-range applies to --scenario random or mixed")
    if planning != "index" and scenario in ("random", "mixed"):
        raise click.UsageError("--planning applies to --scenario forensic, trace, family or "
                               "pools")
    try:
        if scenario in ("family", "pools"):
            one = _family if scenario == "family" else _pools
            one(members, _demands(hs), seed, horizon, tick, as_json, rule,
                _progress(progress, 1), planning)
            return
        if scenario == "mixed":
            _mixed(_demands(hs), seed, horizon, tick, hold_cap, sets, cadence_range, rule,
                   heavy_lanes, fail_prob, no_wake, jobs, as_json, dump_trace)
        elif scenario == "random":
            if dump_trace is not None:
                raise click.UsageError("--dump-trace works with --scenario forensic, mixed "
                                       "or trace")
            _random(_demands(hs), seed, horizon, tick, hold_cap, sets or 3, heavy_lanes,
                    chosen, fail_prob, no_wake, jobs, as_json, plot_dir, cadence_range, rule)
        else:
            if hs:
                raise click.UsageError("--H applies to --scenario random or mixed")
            _single(scenario, trace_path, seed, horizon, tick, hold_cap, chosen, fail_prob,
                    no_wake, as_json, plot_dir, dump_trace, rule, own_rule,
                    _progress(progress, len(chosen or _variant_labels())), planning)
    except SchedprojError as exc:
        raise click.ClickException(str(exc)) from None


def _family(members: int, hs: list[float], seed: int, horizon: float | None,
            tick: float | None, as_json: bool, rule: Any = None, progress: Any = None,
            planning: str = "index") -> None:
    """The family scenario, staleness picker with the second pass: its metrics and the
    family's report (members' maximal ratios, Jain over members, the REM chain drained)."""
    from dataclasses import asdict

    from schedproj.sim.engine import simulate as run
    from schedproj.sim.families import family_rem, family_report
    from schedproj.sim.metrics import json_dict, summarize
    from schedproj.sim.model import Variant
    from schedproj.sim.report import yielding

    if len(hs) > 1:
        raise click.UsageError("--scenario family takes one --H")
    s = family_rem(members, hs[0] if hs else 0.9, pressure=rule)
    s = s.with_(**_overrides(horizon, tick, None, False))
    simulated = run(s, Variant.parse("staleness+pass"), seed,
                    progress.start() if progress is not None else None, planning)
    if progress is not None:
        progress.done()
    metrics = summarize(simulated)
    report = family_report(metrics, simulated)
    out = {"scenario": s.name, "description": s.description, "params": s.params,
           "pressure": None if rule is None else {"target_ratio": rule.target_ratio,
                                                  "min_hold_s": rule.min_hold_s},
           "seed": seed, "horizon_s": s.horizon_s, "family": asdict(report),
           "verdicts": report.verdicts(),
           "metrics": {k: v for k, v in metrics.as_dict().items() if k != "lanes"}}
    if as_json:
        click.echo(json.dumps(json_dict(out), indent=2))
        return
    click.echo(f"{s.description}\nhorizon {s.horizon_s / 3600:g} h, seed {seed}, "
               f"{yielding(rule)}")
    fairness = "-" if report.jain_members is None else f"{report.jain_members:.4f}"
    click.echo(f"REM chain drained: {report.rem_drained}; members {report.members}: maximal "
               f"staleness ratio {report.member_max_ratio:.2f} ({report.worst_member}), "
               f"{report.members_over_goal} over 2.5; in the second half "
               f"{report.member_max_ratio_second_half:.2f}; Jain over members {fairness}")
    for lane, row in report.rem.items():
        click.echo(f"  {lane}: max ratio {row['max_ratio']:.2f}, runs {row['runs']}, "
                   f"backlog left {row['final_backlog']}")


def _pools(members: int, hs: list[float], seed: int, horizon: float | None,
           tick: float | None, as_json: bool, rule: Any = None, progress: Any = None,
           planning: str = "index") -> None:
    """The pools scenario, staleness picker with the second pass: every pool's figures and
    the report (the members' worst ratio and Jain's index, every other lane's worst ratio)."""
    from dataclasses import asdict

    from schedproj.sim.engine import simulate as run
    from schedproj.sim.metrics import json_dict, summarize
    from schedproj.sim.model import Variant
    from schedproj.sim.pools import pools_report, pools_scenario
    from schedproj.sim.report import yielding

    if len(hs) > 1:
        raise click.UsageError("--scenario pools takes one --H")
    s = pools_scenario(members, hs[0] if hs else 0.9, pressure=rule)
    s = s.with_(**_overrides(horizon, tick, None, False))
    simulated = run(s, Variant.parse("staleness+pass"), seed,
                    progress.start() if progress is not None else None, planning)
    if progress is not None:
        progress.done()
    metrics = summarize(simulated)
    report = pools_report(metrics)
    if as_json:
        out = {"scenario": s.name, "description": s.description, "params": s.params,
               "seed": seed, "horizon_s": s.horizon_s,
               "pools": {name: asdict(p) for name, p in metrics.pools.items()},
               "report": asdict(report), "verdicts": report.verdicts(),
               "metrics": {k: v for k, v in metrics.as_dict().items()
                           if k not in ("lanes", "pools")}}
        click.echo(json.dumps(json_dict(out), indent=2))
        return
    click.echo(f"{s.description}\nhorizon {s.horizon_s / 3600:g} h, seed {seed}, "
               f"{yielding(s.pressure)} (on the lease; a pool's runs yield at the hold cap)")
    for p in metrics.pools.values():
        fairness = "-" if p.jain is None else f"{p.jain:.4f}"
        click.echo(f"  pool {p.pool}: {p.slots} slots, {p.lanes} lanes, {p.runs} runs, "
                   f"utilisation {p.utilisation:.3f}, Jain {fairness}, max ratio "
                   f"{p.max_ratio:.2f} ({p.max_ratio_lane or '-'})")
    fairness = "-" if report.jain_members is None else f"{report.jain_members:.4f}"
    click.echo(f"members {report.members}: maximal staleness ratio "
               f"{report.member_max_ratio:.2f} ({report.worst_member}); Jain over members "
               f"{fairness}")
    for lane, ratio in report.lanes_max_ratio.items():
        click.echo(f"  {lane}: max ratio {ratio:.2f}")


def _rule(pressure: bool | None, target: float | None, min_hold: float | None) -> Any:
    """The pressure rule asked for: beat's default rule (``model.BEAT_PRESSURE``) with
    --pressure-target and --min-hold applied; None with --no-pressure."""
    from schedproj.core.pressure import PressureRule
    from schedproj.sim.model import BEAT_PRESSURE

    if pressure is False:
        return None
    if pressure is None and target is None and min_hold is None:
        return BEAT_PRESSURE
    rule = BEAT_PRESSURE or PressureRule()
    return PressureRule(target_ratio=target if target is not None else rule.target_ratio,
                        min_hold_s=min_hold if min_hold is not None else rule.min_hold_s)


def _overrides(horizon: float | None, tick: float | None, hold_cap: float | None,
               no_wake: bool) -> dict[str, Any]:
    changes: dict[str, Any] = {"horizon_s": horizon, "tick_s": tick, "hold_cap_s": hold_cap,
                               "wake_on_release": False if no_wake else None}
    return {k: v for k, v in changes.items() if v is not None}


def _single(scenario: str, trace_path: Path | None, seed: int, horizon: float | None,
            tick: float | None, hold_cap: float | None, chosen: Any, fail_prob: float | None,
            no_wake: bool, as_json: bool, plot_dir: Path | None,
            dump_trace: Path | None, rule: Any, own_rule: bool, progress: Any = None,
            planning: str = "index") -> None:
    from schedproj.sim.model import VARIANTS
    from schedproj.sim.report import compare, comparison_tables, print_tables
    from schedproj.sim.scenarios import forensic
    from schedproj.sim.trace import load_trace, scenario_to_trace

    if scenario == "trace" and trace_path is None:
        raise click.UsageError("--scenario trace needs --trace FILE")
    s = load_trace(trace_path) if trace_path is not None else forensic()
    if s.pools and chosen is None:
        # The legacy registry policy knows no pools: the staleness variants.
        chosen = tuple(v for v in VARIANTS if v.policy.value == "staleness")
    s = s.with_(**_overrides(horizon, tick, hold_cap, no_wake))
    if not own_rule:
        s = s.with_(pressure=rule)
    if fail_prob is not None:
        s = s.map_lanes(fail_prob=fail_prob)
    if dump_trace is not None:
        dump_trace.write_text(json.dumps(scenario_to_trace(s), indent=2) + "\n",
                              encoding="utf-8")
        click.echo(f"wrote {dump_trace}", err=True)
    c = compare(s, seed, chosen or VARIANTS, progress=progress, planning=planning)
    if as_json:
        # A trace's output lists every run's start (seconds after its ``start``).
        click.echo(json.dumps(c.as_dict(runs=scenario == "trace"), indent=2))
    else:
        print_tables(comparison_tables(c), sys.stdout)
    if plot_dir is not None:
        from schedproj.sim.plot import timeline_plot

        path = timeline_plot(c, plot_dir / f"{s.name}_timeline.png")
        click.echo(f"wrote {path}", err=True)


def _random(hs: list[float], seed: int, horizon: float | None, tick: float | None,
            hold_cap: float | None, sets: int, heavy_lanes: int, chosen: Any,
            fail_prob: float | None, no_wake: bool, jobs: int | None, as_json: bool,
            plot_dir: Path | None, cadence_range: tuple[float, float] | None = None,
            rule: Any = None) -> None:
    from schedproj.sim.model import VARIANTS
    from schedproj.sim.report import print_tables, sweep, sweep_table
    from schedproj.sim.scenarios import DEFAULT_HS

    kwargs: dict[str, Any] = {"n_heavy": heavy_lanes,
                              **_overrides(horizon, tick, hold_cap, no_wake)}
    if fail_prob is not None:
        kwargs["fail_prob"] = fail_prob
    if cadence_range is not None:
        kwargs["cadence_range"] = cadence_range
    kwargs["pressure"] = rule
    sw = sweep(hs or list(DEFAULT_HS), seed=seed, sets=sets, variants=chosen or VARIANTS,
               jobs=jobs, **kwargs)
    if as_json:
        click.echo(json.dumps(sw.as_dict(), indent=2))
    else:
        print_tables([sweep_table(sw)], sys.stdout)
    if plot_dir is not None:
        from schedproj.sim.plot import sweep_plot

        path = sweep_plot(sw, plot_dir / "max_ratio_vs_H.png")
        click.echo(f"wrote {path}", err=True)


def _mixed(hs: list[float], seed: int, horizon: float | None, tick: float | None,
           hold_cap: float | None, sets: int | None,
           cadence_range: tuple[float, float] | None, rule: Any, heavy_lanes: int,
           fail_prob: float | None, no_wake: bool, jobs: int | None, as_json: bool,
           dump_trace: Path | None) -> None:
    from schedproj.core import defaults
    from schedproj.sim.mixed import (
        MIXED_HS,
        MIXED_SETS,
        configs,
        mixed_lanes,
        mixed_sweep,
        mixed_table,
    )
    from schedproj.sim.report import print_tables
    from schedproj.sim.trace import scenario_to_trace

    kwargs: dict[str, Any] = {"n_heavy": heavy_lanes,
                              **_overrides(horizon, tick, None, no_wake)}
    if fail_prob is not None:
        kwargs["fail_prob"] = fail_prob
    if cadence_range is not None:
        kwargs["cadence_range"] = cadence_range
    cap = hold_cap if hold_cap is not None else defaults.HOLD_CAP_S
    cfgs = configs(rule, cap)
    hs = hs or list(MIXED_HS)
    if dump_trace is not None:
        first = mixed_lanes(hs[0], seed=seed, hold_cap_s=cap, pressure=cfgs[0].pressure,
                            **kwargs)
        dump_trace.write_text(json.dumps(scenario_to_trace(first), indent=2) + "\n",
                              encoding="utf-8")
        click.echo(f"wrote {dump_trace} (set 0 at H = {hs[0]:g})", err=True)
    sw = mixed_sweep(hs, seed=seed, sets=sets or MIXED_SETS, cfgs=cfgs, jobs=jobs, **kwargs)
    if as_json:
        click.echo(json.dumps(sw.as_dict(), indent=2))
    else:
        print_tables([mixed_table(sw)], sys.stdout)


__all__ = ["parse_duration", "simulate"]
