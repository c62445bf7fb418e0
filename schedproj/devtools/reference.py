"""The documentation's reference pages, made from the code they describe.

Settings from :class:`schedproj.settings.Settings` (and the REM lanes' ``RemSettings``), the
command line from its click commands, metrics from the exporter's catalog, lane options from
the :class:`~schedproj.core.lanes.Lane` dataclasses and their ``#:`` comments, the status JSON
from its catalog (:data:`schedproj.telemetry.status_fields.CATALOG`). The docs build
(``docs/hooks.py``) calls :func:`pages` every time, so the reference cannot drift from the code;
anything without its words (a setting without a description, a lane option without a ``#:``
comment, a command-line option without help) stops the build instead of leaving a blank.

Every entry carries an anchor (``setting-<VARIABLE>``, ``cli-<command>-<param>``,
``metric-<name>``, ``option-lane-<option>``, ``option-family-<option>``,
``option-gate-<option>``), which ``tests/test_docs.py`` reads back from the built site, and
``status-<key path>``, which ``tests/telemetry/test_status_reference.py`` checks.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import inspect
import re
import types
import typing
from collections.abc import Collection, Iterator
from typing import Any

import click
from pydantic import AliasChoices
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

#: What a table cell shows for "no value" (an en dash).
NONE = "\u2013"


class MissingWords(Exception):
    """Something the reference lists has no description in the code."""


# -- small renderers --------------------------------------------------------------------------
def cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def code(value: object) -> str:
    return f"`{value}`"


def anchor(kind: str, name: str) -> str:
    return f'<a id="{kind}-{name}"></a>'


def type_name(annotation: Any) -> str:
    """A reader's name for a field's type: ``number``, ``one of `a`, `b```, ``text``."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        parts = [a for a in typing.get_args(annotation) if a is not type(None)]
        return " or ".join(type_name(a) for a in parts)
    if origin is typing.Literal:
        return "one of " + ", ".join(code(v) for v in typing.get_args(annotation))
    if origin is tuple:
        return "tuple of " + type_name(typing.get_args(annotation)[0])
    if origin is collections.abc.Callable:
        return "function"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(code(m.value) for m in annotation)
    names = {bool: "true/false", int: "integer", float: "number", str: "text"}
    if annotation in names:
        return names[annotation]
    name = getattr(annotation, "__name__", str(annotation))
    return {"SecretStr": "secret text"}.get(name, name)


def default_text(value: object) -> str:
    if value is None or value == "":
        return NONE
    if isinstance(value, bool):
        return code(str(value).lower())
    if isinstance(value, enum.Enum):
        return code(value.value)
    if isinstance(value, tuple) and not value:
        return "none"
    return code(value)


# -- settings -----------------------------------------------------------------------------------
def env_names(name: str, info: FieldInfo, prefix: str) -> list[str]:
    """The environment variables a settings field is read from, first the one to use."""
    alias = info.validation_alias
    if isinstance(alias, AliasChoices):
        return [str(choice) for choice in alias.choices]
    return [f"{prefix}{name.upper()}"]


def limits(info: FieldInfo) -> str:
    """The field's bounds as a reader writes them (``> 0``, ``≤ 65535``)."""
    words = {"gt": "> {}", "ge": "≥ {}", "lt": "< {}", "le": "≤ {}", "min_length": "not empty"}
    found = []
    for item in info.metadata:
        for attr, form in words.items():
            value = getattr(item, attr, None)
            if value is not None:
                found.append(form.format(value))
    return ", ".join(found)


def settings_table(model: type[BaseSettings], prefix: str) -> Iterator[str]:
    yield "| variable | type | default | meaning |"
    yield "| --- | --- | --- | --- |"
    for name, info in model.model_fields.items():
        if not info.description:
            raise MissingWords(f"{model.__name__}.{name} has no description: add "
                               "Field(description=...) so the settings reference can say "
                               "what it does")
        envs = env_names(name, info, prefix)
        first = "".join(anchor("setting", env) for env in envs)
        names = ", ".join(code(env) for env in envs)
        kind = type_name(info.annotation)
        bounds = limits(info)
        yield (f"| {first}{names} | {cell(kind)}{', ' + bounds if bounds else ''} | "
               f"{default_text(info.default)} | {cell(info.description)} |")


def settings_page() -> str:
    from schedproj.rem.settings import ENV_PREFIX as REM_PREFIX
    from schedproj.rem.settings import RemSettings
    from schedproj.settings import NON_SETTING_ENV, Settings

    return "\n".join([
        "# Settings",
        "",
        "Every setting is an environment variable, read once per process into one validated",
        "object, `schedproj.settings.Settings` (this page is generated from it at each docs",
        "build). A bad value stops beat or the worker at start with one line naming the",
        "variable and the fix; an unknown `SCHEDPROJ_*` variable is logged with the name you",
        "probably meant. Durations are in seconds. Not settings, though they share the",
        "prefix: " + ", ".join(code(n) for n in sorted(NON_SETTING_ENV)) +
        " (read by the start scripts in `workers/` and `beat/`: the Celery app they load).",
        "",
        "How to point these at Redis with TLS, a Sentinel set or RabbitMQ:",
        "[Connect Redis and the broker](../connect.md).",
        "",
        *settings_table(Settings, "SCHEDPROJ_"),
        "",
        "## The REM reference lanes",
        "",
        "Read by the REM lanes only (`schedproj.rem.settings.RemSettings`, variables",
        f"`{REM_PREFIX}*`), on first use in each process.",
        "",
        *settings_table(RemSettings, REM_PREFIX),
        "",
    ])


# -- command line -------------------------------------------------------------------------------
def commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], click.Command]]:
    """Every command under ``group`` with its path (the group itself first), in name order."""
    yield path, group
    for name in sorted(group.commands):
        command = group.commands[name]
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))
        else:
            yield (*path, name), command


def param_type(param: click.Parameter) -> str:
    if isinstance(param, click.Option) and param.is_flag:
        return "flag"
    kind = param.type
    if isinstance(kind, click.Choice):
        return "one of " + ", ".join(code(c) for c in kind.choices)
    if isinstance(kind, click.types._NumberRangeBase):
        base = "integer" if isinstance(kind, click.IntRange) else "number"
        return f"{base}, {kind._describe_range()}"
    text = {"integer": "integer", "float": "number", "text": "text", "boolean": "true/false",
            "path": "path", "filename": "file"}.get(kind.name, kind.name)
    return f"{text}, repeatable" if getattr(param, "multiple", False) else text


def param_default(param: click.Parameter) -> str:
    value = param.default
    if isinstance(param, click.Option) and param.is_flag and not param.secondary_opts:
        return "on" if value is True else "off"
    if value is None or type(value).__name__ == "Sentinel" or callable(value):
        return NONE
    if isinstance(param, click.Option) and param.secondary_opts:
        return code(param.opts[0] if value else param.secondary_opts[0])
    if isinstance(value, list | tuple):
        return NONE if not value else ", ".join(code(v) for v in value)
    return code(value)


def shown(command: click.Command) -> list[click.Parameter]:
    """The parameters a user sees (hidden ones are for tests and tools)."""
    return [p for p in command.params if not getattr(p, "hidden", False)]


def param_id(path: tuple[str, ...], param: click.Parameter) -> str:
    """``cli-<command path>-<the option's long name, or the argument's name>``."""
    where = "-".join(path) or "schedproj"
    if isinstance(param, click.Option):
        return f"{where}-{max(param.opts, key=len).lstrip('-')}"
    return f"{where}-{param.human_readable_name.rstrip('.').lower()}"


def cli_rows(path: tuple[str, ...], command: click.Command) -> Iterator[str]:
    yield "| option | type | default | meaning |"
    yield "| --- | --- | --- | --- |"
    for param in shown(command):
        if isinstance(param, click.Option):
            if not param.help:
                raise MissingWords(f"schedproj {' '.join(path)} {param.opts[0]} has no help: "
                                   "add help=... so the CLI reference can say what it does")
            names = " / ".join(code(o) for o in (*param.opts, *param.secondary_opts))
            meaning = param.help
        else:
            names = code(param.human_readable_name)
            meaning = "argument" + (" (one or more)" if param.nargs == -1 else "")
        yield (f"| {anchor('cli', param_id(path, param))}{names} | {cell(param_type(param))} | "
               f"{param_default(param)} | {cell(meaning)} |")


def cli_page() -> str:
    from schedproj.ops.cli import main

    lines = ["# Command line", "",
             "`schedproj` is installed with the package (`[project.scripts]`). This page is",
             "generated from its click commands at each docs build; `schedproj COMMAND --help`",
             "prints the same. Options that change what the command reads (the app, the lanes,",
             "Redis) fall back on the [settings](settings.md).", ""]
    for path, command in commands(main):
        title = " ".join(("schedproj", *path))
        ctx = click.Context(command, info_name=title)
        usage = " ".join(command.collect_usage_pieces(ctx))
        lines += [f"## {title}", "", "```", f"{title} {usage}".rstrip(), "```", ""]
        if command.help:
            lines += [inspect.cleandoc(command.help).replace("\b\n", ""), ""]
        if shown(command):
            lines += [*cli_rows(path, command), ""]
    return "\n".join(lines)


# -- metrics ------------------------------------------------------------------------------------
def metrics_page() -> str:
    from schedproj.telemetry.metrics import CATALOG

    rows = ["| metric | type | labels | meaning |", "| --- | --- | --- | --- |"]
    for m in CATALOG:
        if not m.help:
            raise MissingWords(f"metric {m.name} has no help text in the catalog")
        labels = ", ".join(code(label) for label in m.labels) or NONE
        rows.append(f"| {anchor('metric', m.exposed)}{code(m.exposed)} | {m.kind} | {labels} | "
                    f"{cell(m.help)} |")
    return "\n".join([
        "# Metrics", "",
        "Beat serves these on `/metrics` when `SCHEDPROJ_METRICS_PORT` is set (bound to",
        "`SCHEDPROJ_METRICS_HOST`, loopback by default). Every figure is read from Redis at",
        "scrape time, so they survive restarts and a standby beat serves the same numbers as the",
        "active one. Family members are folded into per-family series (`schedproj_family_*`,",
        "and counters summed under the family's name) unless",
        "`SCHEDPROJ_METRICS_PER_MEMBER=true`. Generated from the exporter's catalog",
        "(`schedproj.telemetry.metrics.CATALOG`), which the collector builds every series from.",
        "Alert rules and a dashboard over them: [Operate](../operate.md#alerts-and-dashboards).",
        "", *rows, ""])


# -- lane options -------------------------------------------------------------------------------
FIELD_LINE = re.compile(r"^\s+(?P<name>[A-Za-z_]\w*)\s*[:=]")


def comment_docs(cls: type) -> dict[str, str]:
    """The ``#:`` comment block right above each field or member in ``cls``'s own source."""
    docs: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(cls).splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        match = FIELD_LINE.match(line)
        if match and pending:
            docs[match["name"]] = rst_to_markdown(" ".join(pending))
        pending = [] if not stripped.startswith("#") else pending
    return docs


def rst_to_markdown(text: str) -> str:
    """The code comments' reStructuredText roles and literals as Markdown code."""
    return re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")


def option_rows(cls: type, kind: str, own_only: bool = False) -> Iterator[str]:
    docs = comment_docs(cls)
    hints = typing.get_type_hints(cls)
    inherited = {f.name for base in cls.__mro__[1:] if dataclasses.is_dataclass(base)
                 for f in dataclasses.fields(base)}
    yield "| option | type | default | meaning |"
    yield "| --- | --- | --- | --- |"
    for f in dataclasses.fields(cls):
        if own_only and f.name in inherited:
            continue
        if f.name not in docs:
            raise MissingWords(f"{cls.__name__}.{f.name} has no #: comment above it: add one "
                               "so the lane options reference can say what it does")
        default = f.default if f.default is not dataclasses.MISSING else None
        shown_default = "required" if f.name in ("cadence_s", "blocker") else \
            default_text(default)
        yield (f"| {anchor(kind, f.name)}{code(f.name)} | {cell(type_name(hints[f.name]))} | "
               f"{shown_default} | {cell(docs[f.name])} |")


def enum_rows(cls: type[enum.Enum]) -> Iterator[str]:
    docs = comment_docs(cls)
    yield "| value | meaning |"
    yield "| --- | --- |"
    for member in cls:
        yield f"| {code(member.value)} | {cell(docs.get(member.name, ''))} |"


def lanes_page() -> str:
    from schedproj.core.families import LaneFamily
    from schedproj.core.lanes import (
        DeferralReason,
        DeploymentClass,
        Gate,
        GateCondition,
        Lane,
        LaneKind,
    )

    return "\n".join([
        "# Lane options", "",
        "A lane is a Celery task declared with `base=LaneTask` and a `lane=` option. This page is",
        "generated from the option classes at each docs build. Declarations are checked when",
        "the app, beat or a worker starts; a problem names the lane and the fix",
        "(`schedproj lanes` prints the lanes or the problem).", "",
        "```python",
        "from schedproj import Gate, Lane, LaneKind, LaneTask",
        "",
        '@app.task(base=LaneTask, bind=True, name="summary",',
        "          lane=Lane(cadence_s=600, kind=LaneKind.HEAVY, order=20,",
        '                    gates=(Gate("memory-summary-backfill"),)))',
        "def summary(self): ...",
        "```", "",
        "## `Lane`", "", *option_rows(Lane, "option-lane"), "",
        "## `LaneFamily`", "",
        "`schedproj.core.families.LaneFamily`: one task, many keyed members (see",
        "[Lane families](../families.md)). Every `Lane` option applies to each member, and:", "",
        *option_rows(LaneFamily, "option-family", own_only=True), "",
        "## `Gate`", "",
        "A soft gate: defer the lane while its blocker is busy; it only defers, never blocks.",
        "", *option_rows(Gate, "option-gate"), "",
        "## Values", "",
        "### `LaneKind`", "", *enum_rows(LaneKind), "",
        "### `DeploymentClass`", "", *enum_rows(DeploymentClass), "",
        "### `GateCondition`", "", *enum_rows(GateCondition), "",
        "### Deferral reasons (`DeferralReason`)", "",
        "Stored with each deferral and shown by `schedproj status`, the status page and the",
        "`reason` label of the metrics.", "", *enum_rows(DeferralReason), "",
    ])


# -- status JSON --------------------------------------------------------------------------------
def status_anchor(path: str) -> str:
    """A key path's anchor: ``lanes[].next_fire_utc`` -> ``lanes-next_fire_utc``,
    ``errors.<lane>`` -> ``errors-lane``."""
    return re.sub(r"[^A-Za-z0-9_]+", "-", path).strip("-")


def status_rows(fields: list[Any], sections: Collection[str] = ()) -> Iterator[str]:
    """The catalog's rows; a key whose own keys have a section below links to it."""
    from schedproj.telemetry.status_fields import Source

    yield "| key | type | meaning |"
    yield "| --- | --- | --- |"
    for f in fields:
        if not f.meaning:
            raise MissingWords(f"status JSON field {f.path} has no meaning in the catalog")
        notes = [f"Only when {f.only_when}."] if f.only_when else []
        notes += [f"Only in `{f.source.value}`."] if f.source is not Source.BOTH else []
        notes += [f"Its keys: [below](#{f.path})."] if f.path in sections else []
        yield (f"| {anchor('status', status_anchor(f.path))}{code(f.path)} | {cell(f.type)} | "
               f"{cell(' '.join([f.meaning, *notes]))} |")


def status_page() -> str:
    from schedproj.telemetry.status_fields import CATALOG

    top = [f for f in CATALOG if "." not in f.path and "[]" not in f.path]
    parts = {f.path: [g for g in CATALOG if g.path.startswith((f"{f.path}.", f"{f.path}[]."))]
             for f in top}
    lines = [
        "# Status JSON", "",
        "`schedproj status --json` prints, and the status page serves on `/api/status`, one",
        "JSON object: the deployment as the status table shows it, read from Redis only. This",
        "page is generated from the catalog of its keys",
        "(`schedproj.telemetry.status_fields.CATALOG`), which a test checks against real status",
        "JSON both ways. Times are epoch seconds (UTC), durations seconds; a key listed here is",
        "always there (wherever its parent is) unless its meaning says when. A path `a[].b` is",
        "key `b` of each object in list `a`; `errors.<lane>` stands for every key of a map",
        "whose keys are data.", "",
        "The two differ only in the schedule entries: the command lists them all and their",
        "unreadable keys in `entry_problems`; `/api/status` lists the earliest due first, up",
        "to a cap, with `entries_total`, and adds their problems to `problems`. With",
        "`--family NAME` the command's `lanes` are that family's members.",
        "See also: [schedproj status](cli.md#schedproj-status),",
        "[Operate](../operate.md).", "",
        "## Top level", "", *status_rows(top, {p for p, rows in parts.items() if rows}), ""]
    for f in top:
        if parts[f.path]:
            lines += [f"## `{f.path}`", "", *status_rows(parts[f.path]), ""]
    return "\n".join(lines)


def pages() -> dict[str, str]:
    """Each generated page's path inside the docs, and its Markdown."""
    return {"reference/settings.md": settings_page(), "reference/cli.md": cli_page(),
            "reference/metrics.md": metrics_page(), "reference/lanes.md": lanes_page(),
            "reference/status.md": status_page()}


__all__ = ["MissingWords", "comment_docs", "pages"]
