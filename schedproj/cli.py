"""The ``schedproj`` command line."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from schedproj.errors import SchedprojError

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
    code = run_all(layout(app_name, light_concurrency=light_concurrency, loglevel=loglevel),
                   env, duration_s=duration_s)
    sys.exit(code)


if __name__ == "__main__":
    main()
