"""The ``schedproj`` command line."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from schedproj.core.errors import SchedprojError
from schedproj.core.picker import Policy

DEFAULT_APP = "schedproj.app"


def _load_app(app_name: str, lanes: str | None) -> Any:
    if lanes:
        os.environ["SCHEDPROJ_LANE_MODULES"] = lanes
    sys.path.insert(0, os.getcwd())
    from celery.app.utils import find_app

    app = find_app(app_name)
    if lanes and getattr(app, "main", None) != "schedproj":
        modules = [m.strip() for m in lanes.split(",") if m.strip()]
        ignored = [m for m in modules
                   if m not in (app.conf.include or ()) and m not in sys.modules]
        if ignored:
            raise click.ClickException(
                f"--lanes sets SCHEDPROJ_LANE_MODULES, which only schedproj.app reads; app "
                f"{app.main!r} ({app_name}) does not import {', '.join(ignored)}. Fix: add "
                f"them to its include list (Celery({app.main!r}, include=[...])), or drop "
                "--lanes")
    return app


def _lanes_of(app_name: str, lanes: str | None) -> tuple[Any, Any]:
    """(app, its validated lane set); a ClickException naming the problem, also for an app
    that declares no lanes at all."""
    from schedproj.on_celery.config import lane_set_for, no_lanes_message

    try:
        app = _load_app(app_name, lanes)
        lane_set = lane_set_for(app)
    except SchedprojError as exc:
        raise click.ClickException(str(exc)) from None
    if not lane_set.specs:
        raise click.ClickException(no_lanes_message(app))
    return app, lane_set


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
    import time

    from schedproj.core.lanes import enabled_under, queue_for
    from schedproj.telemetry.status import missed_words, next_fire_words, schedule_words

    app, lane_set = _lanes_of(app_name, lanes)
    profile = app.schedproj_settings.profile
    now = time.time()
    calendars = _calendar_rows(app, lane_set.specs, now)
    rows = [{
        "lane": s.name, "task": s.task_name, "kind": s.kind.value,
        "queue": queue_for(s.kind, s.pool),
        "cadence_s": s.cadence_s, "priority0": s.priority0, "deployment": s.deployment.value,
        "enabled": enabled_under(profile, s.deployment), "order": s.order,
        "backlog_driven": s.backlog_driven,
        "gates": [f"{g.when.value}:{g.blocker}" for g in s.gates],
        **calendars.get(s.name, _NO_CALENDAR),
    } for s in lane_set.specs]
    entry_rows = _entry_rows(app)
    if as_json:
        click.echo(json.dumps({"profile": profile.value, "lanes": rows, "entries": entry_rows},
                              indent=2))
        return
    columns = ("lane", "kind", "queue", "cadence / schedule", "next fire", "missed",
               "priority0", "deployment", "enabled", "order", "gates")
    table = Table(title=f"lanes (profile {profile.value})")
    for col in columns:
        table.add_column(col, no_wrap=col in ("lane", "cadence / schedule", "next fire"))
    for row in rows:
        cells = {**row, "gates": ", ".join(row["gates"]) or "-",
                 "cadence / schedule": schedule_words(row),
                 "next fire": next_fire_words(now, row), "missed": missed_words(row)}
        table.add_row(*(str(cells[c]) for c in columns))
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(table)
    if entry_rows:
        entries = Table(title=f"schedule entries ({len(entry_rows)})")
        for col in ("entry", "task", "schedule", "source", "next due"):
            entries.add_column(col, no_wrap=col == "entry")
        for r in entry_rows:
            entries.add_row(r["entry"], r["task"], r["schedule"], r["source"],
                            _when(r["next_due_at"]))
        console.print(entries)


#: What ``schedproj lanes --json`` says of a cadence lane's calendar fields.
_NO_CALENDAR: dict[str, Any] = {
    "schedule": None, "timezone": None, "catchup_window_s": None, "next_fire_at": None,
    "next_fire_local": None, "next_fire_utc": None, "missed": None}


def _calendar_rows(app: Any, specs: Any, now: float) -> dict[str, dict[str, Any]]:
    """Each calendar lane's schedule in words, zone, catch-up window, next fire (in its zone
    and in UTC, from the app's own schedule objects, so a custom Celery schedule's too) and
    the fire times it missed (from Redis; None when Redis is unreachable)."""
    import redis as redis_lib

    from schedproj.core.health import calendar_fields
    from schedproj.core.records import LaneState
    from schedproj.on_celery.runtime import runtime_for
    from schedproj.store.lane_store import parse_states
    from schedproj.store.protocol import run_field, sched_field
    from schedproj.telemetry.status import when_in

    calendar = [s for s in specs if s.calendar is not None]
    if not calendar:
        return {}
    try:
        rt = runtime_for(app)
        fields = [f(s.name) for s in calendar for f in (run_field, sched_field)]
        values = rt.store.client.hmget(rt.keys.lanes, fields)
        states, _ = parse_states({k: str(v) for k, v in zip(fields, values, strict=True)
                                  if v is not None}, rt.keys.lanes)
        reached = True
    except redis_lib.RedisError:
        states, reached = {}, False
    rows = {}
    for spec in calendar:
        shown = calendar_fields(spec, states.get(spec.name, LaneState()), now)
        at, zone = shown["next_fire_at"], shown["timezone"]
        rows[spec.name] = {
            "schedule": shown["schedule"], "timezone": zone,
            "catchup_window_s": spec.catchup_window_s, "next_fire_at": at,
            "next_fire_local": None if at is None else
            when_in(at, zone).isoformat(timespec="seconds"),
            "next_fire_utc": None if at is None else
            when_in(at, None).isoformat(timespec="seconds"),
            "missed": shown["missed"] if reached else None,
            "missed_in_a_row": shown["missed_in_a_row"] if reached else None}
    return rows


def _entry_rows(app: Any) -> list[dict[str, Any]]:
    """The app's beat_schedule entries and the runtime entries, with the next due time the
    active beat last indexed (None when no beat ran them yet or Redis is unreachable)."""
    import redis as redis_lib

    from schedproj.on_celery.entries import code_entries
    from schedproj.on_celery.runtime import runtime_for
    from schedproj.telemetry.entries_view import read_entries

    try:
        rt = runtime_for(app)
        indexed = {r["name"]: r for r in read_entries(rt.store.client, rt.keys).rows()}
    except redis_lib.RedisError:
        indexed = {}
    rows = [{"entry": e.name, "task": e.task, "schedule": e.schedule_key, "source": "code",
             "next_due_at": indexed.get(e.name, {}).get("next_due_at")}
            for e in code_entries(app).values()]
    rows += [{"entry": r["name"], "task": r["task"], "schedule": r["schedule"],
              "source": r["source"], "next_due_at": r["next_due_at"]}
             for name, r in indexed.items() if r["source"] != "code"]
    return sorted(rows, key=lambda r: r["entry"])


@main.command()
@click.option("-A", "--app", "app_name", default=DEFAULT_APP, show_default=True,
              help="Celery app the processes load.")
@click.option("--lanes", help="Comma-separated lane modules (sets SCHEDPROJ_LANE_MODULES).")
@click.option("--light-concurrency", default=2, show_default=True, type=click.IntRange(1),
              help="Concurrency of the light worker (the heavy worker is always -c 1).")
@click.option("--loglevel", default="info", show_default=True,
              help="Log level of beat and both workers.")
@click.option("--for", "duration_s", type=click.FloatRange(min=0.1), default=None,
              help="Stop after this many seconds (default: until Ctrl-C).")
@click.option("--restart/--no-restart", default=True, show_default=True,
              help="Start a process that exits again (backoff 1 s doubling to 30 s), or "
                   "stop them all.")
def up(app_name: str, lanes: str | None, light_concurrency: int, loglevel: str,
       duration_s: float | None, restart: bool) -> None:
    """Start beat (-S fair), a heavy worker (-c 1) and a light worker for APP, locally; a
    process that exits is started again, its exit code logged."""
    from schedproj.devtools.processes import layout, run_all

    _lanes_of(app_name, lanes)  # fail here, once and clearly, not in three child processes
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    specs = layout(app_name, light_concurrency=light_concurrency, loglevel=loglevel)
    with _redis_for(env) as url:
        if url is not None:
            env["CELERY_BROKER_URL"] = env["SCHEDPROJ_REDIS_URL"] = url
        code = run_all(specs, env, duration_s=duration_s, restart=restart)
    sys.exit(code)


@contextlib.contextmanager
def _redis_for(env: dict[str, str]) -> Iterator[str | None]:
    """None when a Redis is configured or answers at the default; else a private one's URL."""
    from schedproj.devtools import embedded, redis_server
    from schedproj.settings import Settings

    if env.get("CELERY_BROKER_URL") or env.get("SCHEDPROJ_REDIS_URL"):
        yield None
        return
    default = str(Settings.model_fields["broker_url"].default)
    if redis_server.answers(default):
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
@click.option("--long-sessions", type=click.IntRange(min=0), default=24, show_default=True,
              help="Seeded sessions over the context window (they need per-turn backfill).")
@click.option("--short-sessions", type=click.IntRange(min=0), default=150, show_default=True,
              help="Seeded sessions waiting for a summary.")
@click.option("--redis-url", help="Use this Redis (default: CELERY_BROKER_URL, a local one, "
              "or a private one started for the demo).")
@click.option("--default-url", default="redis://127.0.0.1:6379/0", hidden=True,
              help="The local Redis tried before a private one is started (tests).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--compare", is_flag=True, help="Run the staleness policy, then the legacy "
              "registry policy, on the same seed and budget; print both reports side by side.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Where to write the PNG of the drain (default: a file in the temp folder).")
def demo(policy: str, scale: float, budget_s: float, hold_cap_s: float, latency_s: float,
         long_sessions: int, short_sessions: int, redis_url: str | None, default_url: str,
         as_json: bool, compare: bool, plot_path: str | None) -> None:
    """Seed the original's forensic backlog and watch the REM chain drain to idle; write a
    PNG of the drain (lease timeline and each lane's backlog) and print its path."""
    from dataclasses import replace

    from schedproj.devtools.demo import (
        DemoOptions,
        default_plot_path,
        plot_drain,
        render_compare,
        render_report,
        run_demo,
    )

    opts = DemoOptions(scale=scale, policy=Policy(policy), budget_s=budget_s,
                       hold_cap_s=hold_cap_s, latency_s=latency_s, long_sessions=long_sessions,
                       short_sessions=short_sessions, redis_url=redis_url,
                       default_url=default_url, live=not as_json)
    policies = [Policy.STALENESS, Policy.REGISTRY] if compare else [Policy(policy)]
    try:
        reports = [run_demo(replace(opts, policy=p)) for p in policies]
    except SchedprojError as exc:
        raise click.ClickException(str(exc)) from None
    picture = plot_drain(reports, plot_path or default_plot_path(
        "compare" if compare else policy))
    for report in reports:
        report.pop("history", None)
        report["plot"] = str(picture)
    if as_json:
        click.echo(json.dumps(reports if compare else reports[0], indent=2))
    else:
        for report in [] if compare else reports:
            render_report(report, sys.stdout)
        if compare:
            render_compare(reports, sys.stdout)
        click.echo(f"picture of the drain: {picture}")
    sys.exit(1 if any(r["died"] for r in reports) else 0)


def _state_handles() -> tuple[Any, Any, Any]:
    """(settings, Redis client, keys) from the environment; no app code needed."""
    from schedproj.settings import Settings
    from schedproj.store.connection import connect
    from schedproj.store.protocol import Keys

    try:
        settings = Settings.load()
    except SchedprojError as exc:
        raise click.ClickException(str(exc)) from None
    return (settings, connect(settings.state_redis_url, tls=settings.redis_tls),
            Keys(settings.key_prefix))


@main.command()
def init() -> None:
    """Declare a new deployment, so the first heavy grant needs no state-loss quarantine.

    Beat cannot tell a first start from a Redis that lost its state, so by default it waits
    one quarantine (4/3 of the lease TTL) before granting the first heavy lease. On a Redis
    that holds no schedproj state yet, this says there is nothing to wait for; it refuses
    once any lane state, a lease or an epoch exists (run it before the first beat: after a
    beat ran, and after Redis lost state, the quarantine must run its course)."""
    import redis as redis_lib

    from schedproj.store.connection import mask
    from schedproj.store.lane_store import LaneStore

    settings, client, keys = _state_handles()
    try:
        fresh = LaneStore(client, keys).declare_fresh()
    except redis_lib.RedisError as exc:
        raise click.ClickException(
            f"cannot reach {mask(settings.state_redis_url)} (SCHEDPROJ_REDIS_URL or "
            f"CELERY_BROKER_URL): {exc}") from None
    if not fresh:
        raise click.ClickException(
            f"prefix {keys.prefix!r} already holds lane state, a lease or a beat's epoch: not "
            "a new deployment (or Redis lost its state), so the quarantine stays (it protects "
            "runs that may still hold a lease; it ends on its own)")
    click.echo(f"declared a new deployment under prefix {keys.prefix!r}")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.option("--watch", "watch_s", type=click.FloatRange(min=0.2), default=None,
              help="Refresh every N seconds until Ctrl-C.")
@click.option("--family", "family", default=None, metavar="NAME",
              help="List the members of lane family NAME instead of the lanes (families "
                   "are shown folded otherwise).")
def status(as_json: bool, watch_s: float | None, family: str | None) -> None:
    """Lanes, lease, deferral chain, watchdog, active beat and schedule entries — read from
    Redis only."""
    import redis as redis_lib
    from rich.live import Live

    from schedproj.store.connection import describe_failure
    from schedproj.telemetry.entries_view import read_entries
    from schedproj.telemetry.observe import observe
    from schedproj.telemetry.status import as_json as status_json
    from schedproj.telemetry.status import entries_table, printable, render

    settings, client, keys = _state_handles()

    def snapshot() -> tuple[Any, Any]:
        try:
            obs = observe(client, keys)
        except redis_lib.RedisError as exc:
            which = "SCHEDPROJ_REDIS_URL" if settings.redis_url else "CELERY_BROKER_URL"
            line, _ = describe_failure(settings.state_redis_url, exc, which)
            raise click.ClickException(f"cannot read {line}") from None
        if family is not None and family not in obs.families:
            known = printable(", ".join(sorted(obs.families))) or "none"
            raise click.ClickException(f"no lane family {family!r}. Fix: name one of the "
                                       f"families the last beat declared ({known})")
        return obs, obs.health(starvation_threshold_s=settings.starvation_threshold_s,
                               hold_cap_s=settings.hold_cap_s, profile=settings.profile)

    def entries() -> Any:
        with _reaching(settings):
            return read_entries(client, keys)

    if as_json:
        obs, health = snapshot()
        view = entries()
        click.echo(json.dumps({**status_json(obs, health, family), "entries": view.rows(),
                               "entry_problems": list(view.problems)}, indent=2, default=str))
        return
    console = Console(width=None if sys.stdout.isatty() else 160)

    def page() -> Any:
        from rich.console import Group

        return Group(render(*snapshot(), family=family), entries_table(entries()))

    if watch_s is None:
        console.print(page())
        return
    import time

    with Live(page(), console=console, refresh_per_second=4) as live:
        try:
            while True:
                time.sleep(watch_s)
                live.update(page())
        except KeyboardInterrupt:
            pass


@contextlib.contextmanager
def _reaching(settings: Any) -> Iterator[None]:
    """Redis errors as one line naming the URL (masked), the setting and the fix."""
    import redis as redis_lib

    from schedproj.store.connection import describe_failure

    try:
        yield
    except redis_lib.RedisError as exc:
        which = "SCHEDPROJ_REDIS_URL" if settings.redis_url else "CELERY_BROKER_URL"
        line, fatal = describe_failure(settings.state_redis_url, exc, which)
        raise click.ClickException(
            f"cannot use {line}" if fatal else f"cannot reach {line}. Fix: start Redis there "
            f"or point {which} at the one beat uses") from None


def _known_lane(client: Any, keys: Any, lane: str) -> None:
    from schedproj.core.errors import StateError
    from schedproj.core.laneset import specs_from_registry
    from schedproj.store.protocol import run_field, sched_field

    raw = client.get(keys.published_lanes)
    if raw is None:
        return  # no beat yet: cannot check, accept
    try:
        specs, published = specs_from_registry(raw, keys.published_lanes)
    except StateError as exc:
        raise click.ClickException(str(exc)) from None
    names = sorted(s.name for s in specs)
    if lane in names:
        return
    from schedproj.core.families import split_member

    member = split_member(lane)
    families = [f.get("name") for f in published.get("families", [])]
    if member is not None and member[0] in families:
        if client.sismember(keys.family(member[0]), member[1]):
            return
        raise click.ClickException(
            f"{member[1]!r} is not a member of family {member[0]!r}. Fix: `schedproj family "
            f"add {member[0]} {member[1]}`, or `schedproj family list {member[0]}`")
    if client.hexists(keys.lanes, run_field(lane)) or client.hexists(keys.lanes,
                                                                   sched_field(lane)):
        raise click.ClickException(
            f"lane {lane!r} has state under prefix {keys.prefix!r}, but the last beat to run "
            f"there declares other lanes ({', '.join(names) or 'none'}): two apps share the "
            "prefix. Fix: start this app's beat, or give each app its own SCHEDPROJ_KEY_PREFIX")
    raise click.ClickException(f"no lane {lane!r}; the lanes are: {', '.join(names) or 'none'}")


def _is_entry(client: Any, keys: Any, name: str) -> bool:
    """A schedule entry the active beat published, or a runtime entry (maybe not yet read)."""
    return bool(client.hexists(keys.entries_info, name) or client.hexists(keys.entry_defs, name))


@main.group()
def entry() -> None:
    """Add, change, remove and list schedule entries at runtime (no deploy): a task sent every
    N seconds, on a cron expression, or once at an instant, beside the app's beat_schedule.
    The active beat picks a change up at its next tick."""


@entry.command(name="add")
@click.argument("name")
@click.argument("task")
@click.option("--every", "every_s", type=float, default=None, metavar="SECONDS",
              help="Send every SECONDS.")
@click.option("--cron", default=None, metavar="'M H DoM Mon DoW'",
              help="Send on this crontab (five fields), in --timezone (default: the app's), "
                   "with cron's DST rules.")
@click.option("--at", "at_text", default=None, metavar="INSTANT",
              help="Send once at this instant, ISO 8601 with an offset "
                   "(2027-03-28T02:30:00+01:00, or Z for UTC); the entry is then spent.")
@click.option("--timezone", default=None, metavar="ZONE",
              help="The IANA time zone of --cron (default: the app's timezone).")
@click.option("--catchup-window", "catchup_window_s", type=float, default=None,
              metavar="SECONDS",
              help="For --cron or --at: a run that would start more than SECONDS after its "
                   "fire time is skipped and counted as missed (default: run late, once).")
@click.option("--args", "args_json", default="[]", show_default=True,
              help="Positional arguments, a JSON list.")
@click.option("--kwargs", "kwargs_json", default="{}", show_default=True,
              help="Keyword arguments, a JSON object.")
@click.option("--queue", default=None, help="Queue to send to (default: the app's routing).")
@click.option("--options", "options_json", default="{}", show_default=True,
              help="Other message options, a JSON object (priority, expires, headers ...).")
@click.option("-A", "--app", "app_name", default=None,
              help="Check the task name against this app (else it is not checked).")
def entry_add(name: str, task: str, every_s: float | None, cron: str | None,
              at_text: str | None, timezone: str | None, catchup_window_s: float | None,
              args_json: str, kwargs_json: str, queue: str | None, options_json: str,
              app_name: str | None) -> None:
    """Add schedule entry NAME sending TASK, or change it if added at runtime before."""
    from schedproj.ops.runtime_entries import define

    def parsed(option: str, text: str) -> Any:
        try:
            return json.loads(text)
        except ValueError as exc:
            raise click.ClickException(f"{option} is not JSON ({exc}): {text!r}") from None

    at = _instant_option(at_text)
    settings, client, keys = _state_handles()
    app = _load_app(app_name, None) if app_name else None
    with _reaching(settings):
        try:
            added = define(client, keys, name, task, every=every_s, cron=cron, at=at,
                           timezone=timezone, catchup_window_s=catchup_window_s,
                           args=parsed("--args", args_json),
                           kwargs=parsed("--kwargs", kwargs_json), queue=queue,
                           options=parsed("--options", options_json), app=app)
        except SchedprojError as exc:
            raise click.ClickException(str(exc)) from None
    for warning in added.warnings:
        click.echo(f"warning: {warning}", err=True)
    if app is None:
        click.echo("note: task name not checked (pass -A APP to check it)", err=True)
    click.echo(f"{'changed' if added.replaced else 'added'} schedule entry {name}: {task} "
               f"{_entry_when(added.definition)}")


def _instant_option(text: str | None) -> Any:
    """``--at``'s ISO 8601 instant (an offset required: a wall time alone is ambiguous)."""
    import datetime as dt

    if text is None:
        return None
    try:
        at = dt.datetime.fromisoformat(text)
    except ValueError:
        raise click.ClickException(f"--at {text!r} is not an ISO 8601 instant; write e.g. "
                                   "2027-03-28T02:30:00+01:00 (or Z for UTC)") from None
    if at.tzinfo is None:
        raise click.ClickException(f"--at {text!r} has no offset; add one "
                                   "(2027-03-28T02:30:00+01:00) or Z for UTC")
    return at


def _entry_when(d: Any) -> str:
    if d.every_s is not None:
        return f"every {d.every_s:g}s"
    window = f", catch-up window {d.catchup_window_s:g}s" if d.catchup_window_s else ""
    if d.at is not None:
        return f"once at {_when(d.at)}{window}"
    zone = f" in {d.timezone}" if d.timezone else ""
    return f"cron '{d.cron}'{zone}{window}"


@entry.command(name="remove")
@click.argument("name")
def entry_remove(name: str) -> None:
    """Remove runtime schedule entry NAME (its state goes at beat's next tick)."""
    from schedproj.ops.runtime_entries import undefine

    settings, client, keys = _state_handles()
    with _reaching(settings):
        if not undefine(client, keys, name):
            raise click.ClickException(
                f"no runtime schedule entry {name!r} (entries of the app's beat_schedule are "
                "removed in the code); `schedproj entry list` shows them")
    click.echo(f"removed schedule entry {name}")


@entry.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print the entries as JSON.")
def entry_list(as_json: bool) -> None:
    """List every schedule entry the active beat runs (beat_schedule and runtime) with its last
    run and next due time, and runtime entries beat has not read yet. A one-off entry that ran
    shows as spent."""
    from schedproj.telemetry.entries_view import read_entries

    settings, client, keys = _state_handles()
    with _reaching(settings):
        rows = read_entries(client, keys).rows()
    for r in rows:
        # A one-off instant (its schedule is ``<at ...>``) is spent once it ran.
        r["spent"] = str(r["schedule"]).startswith("<at ") and r["runs"] > 0
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"schedule entries ({len(rows)})")
    for col in ("name", "task", "schedule", "source", "last run", "next due", "runs", "paused"):
        table.add_column(col, no_wrap=col == "name")
    for r in rows:
        table.add_row(r["name"], r["task"], r["schedule"], r["source"],
                      _when(r["last_run_at"]),
                      "spent (one-off, ran)" if r["spent"] else _when(r["next_due_at"]),
                      str(r["runs"]), "yes" if r["paused"] else "")
    Console(width=None if sys.stdout.isatty() else 160).print(table)


def _when(at: float | None) -> str:
    import datetime as dt

    if at is None:
        return "-"
    return dt.datetime.fromtimestamp(at, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class _Refused(click.ClickException):
    """Refused until the operator acts (exit code 2, as a usage error)."""

    exit_code = 2


@main.command()
@click.option("-A", "--app", "app_name", default=DEFAULT_APP, show_default=True,
              help="The Celery app whose beat_schedule `-S fair` runs (module or "
                   "module:attribute).")
@click.option("--from-file", "from_file", default=None, metavar="PATH",
              help="Import from the file of Celery's PersistentScheduler (`celery beat -s`; "
                   "by default celerybeat-schedule where beat started).")
@click.option("--from-redbeat", is_flag=True, help="Import from celery-redbeat's keys.")
@click.option("--redbeat-url", default=None, metavar="URL",
              help="The Redis redbeat used (default: the app's redbeat_redis_url, else its "
                   "broker).")
@click.option("--redbeat-prefix", default=None, metavar="PREFIX",
              help="redbeat's key prefix (default: the app's redbeat_key_prefix, else "
                   "'redbeat:').")
@click.option("--dry-run", is_flag=True, help="Show what would be imported; write nothing.")
@click.option("--force", is_flag=True,
              help="Replace state schedproj already holds for an entry, and write even while "
                   "a `-S fair` beat runs.")
def migrate(app_name: str, from_file: str | None, from_redbeat: bool, redbeat_url: str | None,
            redbeat_prefix: str | None, dry_run: bool, force: bool) -> None:
    """Import each entry's last run and run count from the old beat (Celery's
    celerybeat-schedule file, or celery-redbeat's keys) into schedproj, so the first
    `celery beat -S fair` neither re-runs nor misses an entry. Stop the old beat first."""
    from schedproj.on_celery.runtime import settings_for
    from schedproj.ops import migrate as mig
    from schedproj.store.connection import connect
    from schedproj.store.protocol import Keys

    if bool(from_file) == from_redbeat:
        raise click.UsageError("name one source: --from-file PATH or --from-redbeat")
    if (redbeat_url or redbeat_prefix) and not from_redbeat:
        raise click.UsageError("--redbeat-url and --redbeat-prefix go with --from-redbeat")
    app = _load_app(app_name, None)
    settings = settings_for(app)
    client, keys = connect(settings.state_redis_url, tls=settings.redis_tls), \
        Keys(settings.key_prefix)
    reserved = _lane_names(app)
    with _reaching(settings):
        try:
            targets = mig.target_entries(app, client, keys, reserved)
        except Exception as exc:  # the app's beat_schedule, as Celery parses it
            raise click.ClickException(f"cannot read the beat_schedule of {app_name}: "
                                       f"{exc}") from None
        old, notes = _old_schedule(app, targets, from_file, redbeat_url, redbeat_prefix)
        if mig.beat_lock_ttl(client, keys) is not None:
            notes.append("a `-S fair` beat is running (it holds the beat lock): "
                         + ("migrate writes into it (--force)" if force else
                            "migrate refuses to write unless --force"))
        plan = _migrate_plan(client, keys, old, targets, reserved, force, dry_run)
    _print_migration(app, keys, old, plan, targets, notes, dry_run)


def _lane_names(app: Any) -> tuple[str, ...]:
    from schedproj.on_celery.config import lane_set_for

    try:
        return lane_set_for(app).names
    except SchedprojError as exc:
        raise click.ClickException(str(exc)) from None


def _old_schedule(app: Any, targets: Any, from_file: str | None, url: str | None,
                  prefix: str | None) -> tuple[Any, list[str]]:
    """(the old schedule as read, notes for the operator)."""
    import redis as redis_lib

    from schedproj.ops import migrate as mig
    from schedproj.store.connection import connect, mask

    try:
        if from_file is not None:
            old = mig.read_beat_file(from_file)
            return old, mig.file_notes(old, app)
        url = url or app.conf.get("redbeat_redis_url") or app.conf.broker_url
        prefix = prefix or app.conf.get("redbeat_key_prefix") or mig.REDBEAT_PREFIX
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
            raise click.UsageError(f"redbeat's Redis is not known ({url!r} is not a Redis "
                                   "URL): pass --redbeat-url redis://HOST:PORT/DB")
        source = connect(url)
        try:
            old = mig.read_redbeat(source, prefix, targets)
            notes = [f"redbeat's lock {prefix}:lock is held: a redbeat beat may still run. "
                     "Stop it: what it sends after this import is not in it"] \
                if source.exists(f"{prefix}:lock") else []
        except redis_lib.RedisError as exc:
            raise click.ClickException(f"cannot read redbeat's keys at {mask(url)}: {exc}. "
                                       "Fix: --redbeat-url naming the Redis redbeat "
                                       "used") from None
        finally:
            source.close()
        return old, notes
    except mig.MigrationError as exc:
        raise click.ClickException(str(exc)) from None


def _migrate_plan(client: Any, keys: Any, old: Any, targets: Any, reserved: tuple[str, ...],
                  force: bool, dry_run: bool) -> Any:
    """Plan, and unless a dry run write, again from a fresh read if a state moved between."""
    from schedproj.ops import migrate as mig

    schedule_keys = {name: e.schedule_key for name, e in targets.items()}
    for attempt in range(3):
        stored = mig.stored_states(client, keys, schedule_keys)
        plan = mig.plan_migration(old, schedule_keys, stored, force=force, reserved=reserved,
                                  where=keys.entries)
        if dry_run:
            return plan
        try:
            mig.write_migration(client, keys, plan, force=force)
            return plan
        except mig.BeatActive as exc:
            raise _Refused(str(exc)) from None
        except mig.StateMoved as exc:
            if attempt == 2:
                raise click.ClickException(f"{exc}. Nothing was written; run migrate "
                                           "again") from None
    raise AssertionError("unreachable")


def _print_migration(app: Any, keys: Any, old: Any, plan: Any, targets: Any,
                     notes: list[str], dry_run: bool) -> None:
    console = Console(width=None if sys.stdout.isatty() else 160)
    for note in notes:
        click.echo(f"note: {note}")
    if plan.imports:
        console.print(_imported_table(app, old, plan, targets, dry_run))
    else:
        click.echo(f"nothing to import from the {old.source}")
    if plan.skipped:
        skipped = Table(title=f"skipped ({len(plan.skipped)})")
        skipped.add_column("entry", no_wrap=True)
        skipped.add_column("why")
        for skip in plan.skipped:
            skipped.add_row(skip.name, skip.why)
        console.print(skipped)
    if dry_run:
        click.echo("dry run: nothing written")
    elif plan.imports:
        click.echo(f"wrote {len(plan.imports)} entry states under prefix {keys.prefix!r}; "
                   "start `celery beat -S fair` and check `schedproj status`")


def _imported_table(app: Any, old: Any, plan: Any, targets: Any, dry_run: bool) -> Table:
    """Each imported entry: its last run and run count, and when -S fair sends it next."""
    import datetime as dt
    import time

    def local(at: float) -> str:
        return dt.datetime.fromtimestamp(at, tz=app.timezone).isoformat(sep=" ",
                                                                        timespec="seconds")

    def next_send(name: str, last: float) -> str:
        try:
            due, next_s = targets[name].timing.check(last)
        except Exception as exc:  # a user's schedule: whatever it raises is its error
            return f"? ({type(exc).__name__}: {exc})"
        return "at the first tick (due)" if due else local(time.time() + next_s)

    verb = "would import" if dry_run else "imported"
    table = Table(title=f"{verb} from the {old.source} ({len(plan.imports)})")
    for col in ("entry", "last run", "runs", "next send under -S fair", "note"):
        table.add_column(col, no_wrap=col == "entry")
    for imp in plan.imports:
        last = imp.state.last_run_at
        table.add_row(imp.name, local(last) if last > 0 else "never",
                      str(imp.state.total_run_count), next_send(imp.name, last), imp.note)
    return table


@main.group()
def family() -> None:
    """Add, remove and list the members of a lane family (one keyed lane per tenant, repo
    or shard). Keys: 1 to 128 characters out of letters, digits and . _ - : / @ + =."""


def _families(client: Any, keys: Any, compact_records: bool = False) -> Any:
    """A FamilyStore that knows the families the last beat declared (if one ran); a member
    it adds gets its first record in the compact format with ``compact_records``."""
    from schedproj.core.errors import StateError
    from schedproj.core.laneset import specs_from_registry
    from schedproj.store.families import FamilyStore

    raw = client.get(keys.published_lanes)
    if raw is None:
        return FamilyStore(client, keys, compact_records=compact_records)
    try:
        _, published = specs_from_registry(raw, keys.published_lanes)
    except StateError as exc:
        raise click.ClickException(str(exc)) from None
    return FamilyStore(client, keys, [f.get("name") for f in published.get("families", [])],
                       compact_records=compact_records)


@family.command(name="add")
@click.argument("family_name", metavar="FAMILY")
@click.argument("keys_", metavar="KEY...", nargs=-1, required=True)
def family_add(family_name: str, keys_: tuple[str, ...]) -> None:
    """Add members (each due for a first run at once)."""
    settings, client, keys = _state_handles()
    with _reaching(settings):
        try:
            added = _families(client, keys, settings.compact_records).add(family_name, keys_)
        except SchedprojError as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(f"{family_name}: {added} added, {len(set(keys_)) - added} already members")


@family.command(name="remove")
@click.argument("family_name", metavar="FAMILY")
@click.argument("keys_", metavar="KEY...", nargs=-1, required=True)
def family_remove(family_name: str, keys_: tuple[str, ...]) -> None:
    """Remove members and their state (a run in progress finishes; nothing is kept)."""
    settings, client, keys = _state_handles()
    with _reaching(settings):
        try:
            removed = _families(client, keys).remove(family_name, keys_)
        except SchedprojError as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(f"{family_name}: {removed} removed, {len(set(keys_)) - removed} were not members")


@family.command(name="list")
@click.argument("family_name", metavar="FAMILY")
def family_list(family_name: str) -> None:
    """Print the member keys, one a line."""
    settings, client, keys = _state_handles()
    with _reaching(settings):
        try:
            members = _families(client, keys).members(family_name)
        except SchedprojError as exc:
            raise click.ClickException(str(exc)) from None
    for key in members:
        click.echo(key)


@main.command()
@click.argument("lane")
def pause(lane: str) -> None:
    """Stop dispatching LANE (or sending schedule entry LANE) until resumed (a run in
    progress finishes)."""
    settings, client, keys = _state_handles()
    from schedproj.store.entry_store import EntryStore
    from schedproj.store.lane_store import LaneStore

    with _reaching(settings):
        if _is_entry(client, keys, lane):
            EntryStore(client, keys).pause(lane)
            click.echo(f"paused schedule entry {lane}")
            return
        _known_lane(client, keys, lane)
        LaneStore(client, keys).pause(lane)
    click.echo(f"paused {lane}")


@main.command()
@click.argument("lane")
def resume(lane: str) -> None:
    """Dispatch LANE (or send schedule entry LANE) again when it is due."""
    settings, client, keys = _state_handles()
    from schedproj.store.entry_store import EntryStore
    from schedproj.store.lane_store import LaneStore

    with _reaching(settings):
        if _is_entry(client, keys, lane):
            done = EntryStore(client, keys).resume(lane)
            click.echo(f"resumed schedule entry {lane}" if done else f"{lane} was not paused")
            return
        removed = LaneStore(client, keys).resume(lane)
        if not removed:
            _known_lane(client, keys, lane)
    click.echo(f"resumed {lane}" if removed else f"{lane} was not paused")


@main.command(name="run")
@click.argument("lane")
def run_now(lane: str) -> None:
    """Make LANE due now; beat dispatches it when it wins (a heavy lane still needs the
    lease). For a schedule entry: send it at beat's next tick (it counts as a run)."""
    settings, client, keys = _state_handles()
    from schedproj.store.entry_store import EntryStore
    from schedproj.store.lane_store import LaneStore

    with _reaching(settings):
        if _is_entry(client, keys, lane):
            EntryStore(client, keys).run_now(lane)
            click.echo(f"schedule entry {lane} will be sent at beat's next tick")
            return
        _known_lane(client, keys, lane)
        LaneStore(client, keys).run_now(lane)
    click.echo(f"{lane} will run at the next tick it can (heavy lanes wait for the lease)")


@main.command()
@click.option("--to", "target", type=click.Choice(["long", "compact"]), required=True,
              help="long: the format every release reads (before rolling back below the "
              "release that introduced the compact one); compact: the short-key format.")
@click.option("--dry-run", is_flag=True, help="Count the records to rewrite; write nothing.")
def records(target: str, dry_run: bool) -> None:
    """Rewrite every lane's run and sched records in one format (SCHEDPROJ_COMPACT_RECORDS).
    Run --to long after turning the setting off everywhere and before rolling back below the
    release that introduced it; a record its writer changed meanwhile is left (run again)."""
    settings, client, keys = _state_handles()
    from schedproj.store.record_rewrite import rewrite_records

    if target == "long" and settings.compact_records and not dry_run:
        raise click.ClickException(
            "SCHEDPROJ_COMPACT_RECORDS is on here: turn it off on beat and every worker (and "
            "here) first, or their writes keep making compact records")
    with _reaching(settings):
        counts = rewrite_records(client, keys, compact=target == "compact", dry_run=dry_run)
    verb = "would be rewritten" if dry_run else "rewritten"
    click.echo(f"{counts.rewritten} records {verb} in the {target} format, {counts.already} "
               f"already in it, {counts.changed} changed meanwhile by their writer (run again), "
               f"{len(counts.unreadable)} unreadable (left untouched)")
    for problem in counts.unreadable:
        click.echo(f"  {problem}", err=True)
    if counts.changed or counts.unreadable:
        raise SystemExit(1)


@main.command(name="clear-lease")
@click.option("-A", "--app", "app_name", default=DEFAULT_APP, show_default=True,
              help="Celery app used to reach the holder's worker.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=3.0,
              show_default=True, help="How long to wait for the holder's worker to answer.")
@click.option("--stop", "how", flag_value="stop",
              help="Ask the holder to yield at its next checkpoint; wait until it has.")
@click.option("--terminate", "how", flag_value="terminate",
              help="Revoke the holder with terminate on its worker (confirmed by the worker); "
                   "wait until its lease expired.")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=60.0,
              show_default=True, help="How long --stop/--terminate wait for the lease to free.")
@click.option("--pool", default="heavy", show_default=True,
              help="The pool whose slot to clear (heavy: the default pool, the heavy lease).")
@click.option("--slot", type=click.IntRange(min=0), default=0, show_default=True,
              help="The slot of the pool to clear (0-based; schedproj status lists them).")
def clear_lease(app_name: str, timeout_s: float, how: str | None, wait_s: float, pool: str,
                slot: int) -> None:
    """Free the heavy lease, or a slot of a pool (--pool P --slot I), never while its holder
    may still run: a run not started yet is cleared at once; a started one only when its own
    worker says it no longer runs it (--stop and --terminate ask the holder to end first)."""
    from schedproj.ops.lease_clearing import LeaseClearer, Refused
    from schedproj.store.lease import HeavyLease

    settings, client, keys = _state_handles()
    with _reaching(settings):
        _check_slot(client, keys, pool, slot)
        lease = HeavyLease(client, keys.slot(pool, slot))
        default = (pool, slot) == ("heavy", 0)
        what = "the lease" if default else f"slot {slot} of pool {pool}"
        current = lease.read()
        if current is None:
            click.echo(f"{what} is free")
            return
        app = _load_app(app_name, None)
        clearer = LeaseClearer(lease=lease, control=app.control, timeout_s=timeout_s,
                               wait_s=wait_s, say=click.echo, lease_ttl_s=settings.lease_ttl_s,
                               what=what,
                               target="" if default else f" --pool {pool} --slot {slot}")
        try:
            said = getattr(clearer, how or "clear")(current)
        except Refused as exc:
            raise click.ClickException(str(exc)) from None
        client.lpush(keys.wake, "clear-lease")
    click.echo(said)


def _check_slot(client: Any, keys: Any, pool: str, slot: int) -> None:
    """``--pool``/``--slot`` name a slot the last beat declared; else an error naming the
    declared pools and the fix."""
    from schedproj.telemetry.observe import pools_of_registry, read_pools

    pools = {"heavy": 1, **read_pools(pools_of_registry(client.get(keys.published_lanes), keys),
                                      keys, [])}
    if (pool not in pools or slot >= pools[pool]) and pool != "heavy" and client.exists(
            keys.slot(pool, slot).lease):
        # A slot past a shrunk pool, or of a pool a deploy removed, that a run still holds:
        # beat still counts it, and its holder may hang; it is cleared by the same rules.
        return
    declared = ", ".join(f"{name} ({count} slot{'s' if count > 1 else ''})"
                         for name, count in pools.items())
    if pool not in pools:
        raise click.ClickException(
            f"--pool {pool}: no such pool; the last beat declared {declared}. Fix: name one "
            "of them, or, if the pool is new, restart beat with it declared "
            f"(SCHEDPROJ_POOLS='{pool}=2' or configure_app(app, pools=[Pool({pool!r}, "
            "slots=2)]))")
    if slot >= pools[pool]:
        raise click.ClickException(
            f"--slot {slot}: pool {pool} has {pools[pool]} slot"
            f"{'s' if pools[pool] > 1 else ''} (0 to {pools[pool] - 1}); the last beat "
            f"declared {declared}. Fix: --slot 0 to {pools[pool] - 1} (schedproj status "
            "lists each pool's busy slots)")


@main.command()
@click.option("--duration", "duration_s", type=click.FloatRange(min=20), default=None,
              help="How long to run at least (seconds; default 120, the long profile 600).")
@click.option("--heavy-workers", type=click.IntRange(min=2), default=3, show_default=True,
              help="Heavy workers in the fleet (the faults kill and pause them).")
@click.option("--fault-every", "fault_every_s", type=click.FloatRange(min=2), default=4.0,
              show_default=True, help="Seconds between injected faults.")
@click.option("--sentinel", is_flag=True, default=None,
              help="State and lease on a real Sentinel set (master, replica, three "
                   "sentinels), with failovers to a lagging replica among the faults.")
@click.option("--min-faults", default=None, metavar="KIND=N,...",
              help="Run on until each count is met, e.g. state-loss=100,failover=20,"
                   "freeze-beat=20 (state-loss: every Redis restart without persistence).")
@click.option("--max-duration", "max_duration_s", type=click.FloatRange(min=20), default=None,
              help="Stop at this many seconds even if --min-faults are not met.")
@click.option("--profile", type=click.Choice(["long"]), default=None,
              help="long: on a Sentinel set until state-loss=100,failover=20,freeze-beat=20 "
                   "(at least 600 s, at most 5400 s; 30-60 minutes).")
@click.option("--dump", "dump_to", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Write the journal, dispatch log, ledger and fault times "
                                 "here as JSON.")
@click.option("--members", type=click.IntRange(min=0), default=100, show_default=True,
              help="Members of the light lane family that runs next to the ordinary lanes "
                   "(given by a members hook, so they come back after a state loss).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def chaos(duration_s: float | None, heavy_workers: int, fault_every_s: float,
          sentinel: bool | None, min_faults: str | None, max_duration_s: float | None,
          profile: str | None, dump_to: Path | None, members: int, as_json: bool) -> None:
    """Break workers, beats and Redis on purpose and audit what ran (private Redis)."""
    from schedproj.chaos.driver import LONG_PROFILE, run_chaos
    from schedproj.chaos.faults import parse_min_faults
    from schedproj.chaos.report import render

    preset: dict[str, Any] = dict(LONG_PROFILE) if profile == "long" else {}
    try:
        report = run_chaos(
            duration_s if duration_s is not None else preset.get("duration_s", 120.0),
            heavy_workers, fault_every_s,
            sentinel=sentinel if sentinel is not None else preset.get("sentinel", False),
            min_faults=parse_min_faults(min_faults) if min_faults is not None
            else preset.get("min_faults"),
            max_duration_s=max_duration_s if max_duration_s is not None
            else preset.get("max_duration_s"), dump_to=dump_to, members=members)
    except SchedprojError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        render(report, sys.stdout)
    failed = report["overlaps"] or report["duplicates"] or report["lost_runs"] \
        or report["stale_starts"] or not report["ledger_monotone"] or report["os_overlaps"] \
        or report["stale_beat_starts"] or report["worker_exits"] \
        or not report["min_faults_met"]
    sys.exit(1 if failed else 0)


def _register_simulator() -> None:
    from schedproj.sim.cli import simulate

    main.add_command(simulate)


_register_simulator()


if __name__ == "__main__":
    main()
