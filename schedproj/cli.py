"""The ``schedproj`` command line."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from schedproj.errors import SchedprojError
from schedproj.picker import Policy

DEFAULT_APP = "schedproj.app"


def _load_app(app_name: str, lanes: str | None) -> Any:
    if lanes:
        os.environ["SCHEDPROJ_LANE_MODULES"] = lanes
    sys.path.insert(0, os.getcwd())
    from celery.app.utils import find_app

    return find_app(app_name)


@click.group()
@click.version_option(package_name="schedproj")
def main() -> None:
    """schedproj: a fair Celery Beat scheduler for periodic maintenance lanes."""


@main.command()
@click.option("-A", "--app", "app_name", default=DEFAULT_APP, show_default=True,
              help="Celery app to load (module or module:attribute).")
@click.option("--lanes", help="Comma-separated lane modules (sets SCHEDPROJ_LANE_MODULES).")
@click.option("--json", "as_json", is_flag=True, help="Print the lanes as JSON.")
def lanes(app_name: str, lanes: str | None, as_json: bool) -> None:
    """List the declared lanes and their options; exit non-zero naming the problem if invalid."""
    from schedproj.config import lane_set_for
    from schedproj.pipeline import enabled_under
    from schedproj.registry import queue_for

    try:
        app = _load_app(app_name, lanes)
        lane_set = lane_set_for(app)
    except SchedprojError as exc:
        raise click.ClickException(str(exc)) from None
    profile = app.schedproj_settings.profile
    rows = [{
        "lane": s.name, "task": s.task_name, "kind": s.kind.value, "queue": queue_for(s.kind),
        "cadence_s": s.cadence_s, "priority0": s.priority0, "deployment": s.deployment.value,
        "enabled": enabled_under(profile, s.deployment), "order": s.order,
        "backlog_driven": s.backlog_driven,
        "gates": [f"{g.when.value}:{g.blocker}" for g in s.gates],
    } for s in lane_set.specs]
    if as_json:
        click.echo(json.dumps({"profile": profile.value, "lanes": rows}, indent=2))
        return
    columns = ("lane", "kind", "queue", "cadence_s", "priority0", "deployment", "enabled",
               "order", "gates")
    table = Table(title=f"lanes (profile {profile.value})")
    for col in columns:
        table.add_column(col, no_wrap=col == "lane")
    for row in rows:
        cells = {**row, "gates": ", ".join(row["gates"]) or "-"}  # type: ignore[arg-type]
        table.add_row(*(str(cells[c]) for c in columns))
    Console(width=None if sys.stdout.isatty() else 160).print(table)


@main.command()
@click.option("-A", "--app", "app_name", default=DEFAULT_APP, show_default=True,
              help="Celery app the processes load.")
@click.option("--lanes", help="Comma-separated lane modules (sets SCHEDPROJ_LANE_MODULES).")
@click.option("--light-concurrency", default=2, show_default=True, type=click.IntRange(1))
@click.option("--loglevel", default="info", show_default=True)
@click.option("--for", "duration_s", type=click.FloatRange(min=0.1), default=None,
              help="Stop after this many seconds (default: until Ctrl-C).")
def up(app_name: str, lanes: str | None, light_concurrency: int, loglevel: str,
       duration_s: float | None) -> None:
    """Start beat (-S fair), a heavy worker (-c 1) and a light worker for APP, locally."""
    from schedproj.config import lane_set_for
    from schedproj.processes import layout, run_all

    try:
        # Fail here, once and clearly, rather than in three child processes.
        lane_set_for(_load_app(app_name, lanes))
    except SchedprojError as exc:
        raise click.ClickException(str(exc)) from None
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    specs = layout(app_name, light_concurrency=light_concurrency, loglevel=loglevel)
    with _redis_for(env) as url:
        if url is not None:
            env["CELERY_BROKER_URL"] = env["SCHEDPROJ_REDIS_URL"] = url
        code = run_all(specs, env, duration_s=duration_s)
    sys.exit(code)


@contextlib.contextmanager
def _redis_for(env: dict[str, str]) -> Iterator[str | None]:
    """None when a Redis is configured or answers at the default; else a private one's URL."""
    from schedproj import embedded
    from schedproj.settings import Settings

    if env.get("CELERY_BROKER_URL") or env.get("SCHEDPROJ_REDIS_URL"):
        yield None
        return
    default = str(Settings.model_fields["broker_url"].default)
    if embedded.answers(default):
        yield None
        return
    click.echo(f"schedproj: nothing answers at {default}; starting a private Redis", err=True)
    with embedded.private_redis() as url:
        yield url


@main.command()
@click.option("--policy", type=click.Choice([p.value for p in Policy]), default="staleness",
              show_default=True, help="'registry' runs the legacy picker, to compare.")
@click.option("--scale", type=click.FloatRange(min=1e-5), default=0.005, show_default=True,
              help="Multiplies the REM cadences (0.005: ten minutes become 3 s).")
@click.option("--budget", "budget_s", type=click.FloatRange(min=1), default=300.0,
              show_default=True, help="Give up after this many seconds.")
@click.option("--hold-cap", "hold_cap_s", type=click.FloatRange(min=0.1), default=3.0,
              show_default=True, help="Heavy hold cap for the demo (seconds).")
@click.option("--latency", "latency_s", type=click.FloatRange(min=0), default=0.01,
              show_default=True, help="Simulated model latency per summarizer call (s).")
@click.option("--long-sessions", type=click.IntRange(min=0), default=24, show_default=True)
@click.option("--short-sessions", type=click.IntRange(min=0), default=150, show_default=True)
@click.option("--redis-url", help="Use this Redis (default: CELERY_BROKER_URL, a local one, "
              "or a private one started for the demo).")
@click.option("--default-url", default="redis://127.0.0.1:6379/0", hidden=True)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def demo(policy: str, scale: float, budget_s: float, hold_cap_s: float, latency_s: float,
         long_sessions: int, short_sessions: int, redis_url: str | None, default_url: str,
         as_json: bool) -> None:
    """Seed the original's forensic backlog and watch the REM chain drain to idle."""
    from schedproj.demo import DemoOptions, render_report, run_demo

    opts = DemoOptions(scale=scale, policy=Policy(policy), budget_s=budget_s,
                       hold_cap_s=hold_cap_s, latency_s=latency_s, long_sessions=long_sessions,
                       short_sessions=short_sessions, redis_url=redis_url,
                       default_url=default_url, live=not as_json)
    try:
        report = run_demo(opts)
    except SchedprojError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        render_report(report, sys.stdout)
    sys.exit(1 if report["died"] else 0)


def _state_handles() -> tuple[Any, Any, Any]:
    """(settings, Redis client, keys) from the environment; no app code needed."""
    from schedproj.keys import Keys
    from schedproj.redis_conn import connect
    from schedproj.settings import Settings

    try:
        settings = Settings.load()
    except SchedprojError as exc:
        raise click.ClickException(str(exc)) from None
    return settings, connect(settings.state_redis_url), Keys(settings.key_prefix)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.option("--watch", "watch_s", type=click.FloatRange(min=0.2), default=None,
              help="Refresh every N seconds until Ctrl-C.")
def status(as_json: bool, watch_s: float | None) -> None:
    """Lanes, lease, deferral chain, watchdog and active beat — read from Redis only."""
    import redis as redis_lib
    from rich.live import Live

    from schedproj.observe import observe
    from schedproj.redis_conn import mask
    from schedproj.status import as_json as status_json
    from schedproj.status import render

    settings, client, keys = _state_handles()

    def snapshot() -> Any:
        try:
            obs = observe(client, keys)
        except redis_lib.RedisError as exc:
            raise click.ClickException(
                f"cannot read {mask(settings.state_redis_url)}: {exc}") from None
        return obs, obs.health(starvation_threshold_s=settings.starvation_threshold_s,
                               hold_cap_s=settings.hold_cap_s, profile=settings.profile)

    if as_json:
        obs, health = snapshot()
        click.echo(json.dumps(status_json(obs, health), indent=2, default=str))
        return
    console = Console(width=None if sys.stdout.isatty() else 160)
    if watch_s is None:
        console.print(render(*snapshot()))
        return
    import time

    with Live(render(*snapshot()), console=console, refresh_per_second=4) as live:
        try:
            while True:
                time.sleep(watch_s)
                live.update(render(*snapshot()))
        except KeyboardInterrupt:
            pass


def _known_lane(client: Any, keys: Any, lane: str) -> None:
    from schedproj.registry import specs_from_registry

    raw = client.get(keys.registry)
    if raw is None:
        return  # no beat yet: cannot check, accept
    specs, _ = specs_from_registry(raw, keys.registry)
    names = sorted(s.name for s in specs)
    if lane not in names:
        raise click.ClickException(f"no lane {lane!r}; the lanes are: {', '.join(names)}")


@main.command()
@click.argument("lane")
def pause(lane: str) -> None:
    """Stop dispatching LANE until resumed (a run in progress finishes)."""
    _, client, keys = _state_handles()
    _known_lane(client, keys, lane)
    client.sadd(keys.paused, lane)
    click.echo(f"paused {lane}")


@main.command()
@click.argument("lane")
def resume(lane: str) -> None:
    """Dispatch LANE again when it is due."""
    _, client, keys = _state_handles()
    removed = client.srem(keys.paused, lane)
    click.echo(f"resumed {lane}" if removed else f"{lane} was not paused")


@main.command(name="run")
@click.argument("lane")
def run_now(lane: str) -> None:
    """Make LANE due now; beat dispatches it when it wins (a heavy lane still needs the
    lease)."""
    _, client, keys = _state_handles()
    _known_lane(client, keys, lane)
    client.sadd(keys.run_now, lane)
    click.echo(f"{lane} will run at the next tick it can (heavy lanes wait for the lease)")


@main.command(name="clear-lease")
@click.option("-A", "--app", "app_name", default=DEFAULT_APP, show_default=True,
              help="Celery app used to ask the workers whether the holder still runs.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=3.0,
              show_default=True, help="How long to wait for workers' replies.")
def clear_lease(app_name: str, timeout_s: float) -> None:
    """Free the heavy lease, only when its holder is provably gone: no worker reports its
    task as active or reserved. A live holder is never cut off."""
    from schedproj.lease import HeavyLease

    settings, client, keys = _state_handles()
    lease = HeavyLease(client, keys)
    current = lease.read()
    if current is None:
        click.echo("the lease is free")
        return
    app = _load_app(app_name, None)
    inspect = app.control.inspect(timeout=timeout_s)
    replies = [inspect.active() or {}, inspect.reserved() or {}]
    if not any(replies):
        raise click.ClickException(
            "no worker answered; cannot prove the holder is gone. The lease frees itself "
            f"within {settings.lease_ttl_s:g}s of its holder dying; retry once workers answer")
    for reply in replies:
        for worker, tasks in reply.items():
            if any(t.get("id") == current.task_id for t in tasks):
                raise click.ClickException(
                    f"worker {worker} is running the holder ({current.lane}, task "
                    f"{current.task_id}); not clearing. Stop it first: celery -A {app_name} "
                    f"control revoke --terminate {current.task_id}")
    if lease.release(current.token):
        client.lpush(keys.wake, "clear-lease")
        click.echo(f"cleared the lease held by {current.lane} (fence {current.fence}); its "
                   "late writes are refused by the fencing number")
    else:
        click.echo("the lease changed meanwhile; nothing cleared")



@main.command()
@click.option("--duration", "duration_s", type=click.FloatRange(min=20), default=120.0,
              show_default=True, help="How long to run (seconds).")
@click.option("--heavy-workers", type=click.IntRange(min=2), default=3, show_default=True)
@click.option("--fault-every", "fault_every_s", type=click.FloatRange(min=2), default=4.0,
              show_default=True, help="Seconds between injected faults.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def chaos(duration_s: float, heavy_workers: int, fault_every_s: float, as_json: bool) -> None:
    """Break workers, beats and Redis on purpose and audit what ran (private Redis)."""
    from schedproj.chaos.driver import render, run_chaos

    try:
        report = run_chaos(duration_s, heavy_workers, fault_every_s)
    except SchedprojError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        render(report, sys.stdout)
    failed = report["overlaps"] or report["duplicates"] or report["lost_runs"] \
        or report["stale_starts"] or not report["ledger_monotone"]
    sys.exit(1 if failed else 0)



def _register_simulator() -> None:
    from schedproj.sim.cli import simulate

    main.add_command(simulate)


_register_simulator()


if __name__ == "__main__":
    main()
