"""The documentation site builds with ``mkdocs build --strict`` (a broken link, an unknown anchor,
a page left out of the nav or a reference entry without its words fails it), and its reference
pages, generated from the code at build time, list exactly what the code has: every setting
(and its environment variables), command-line option, metric and lane option, and nothing the
code no longer has. The code side is read here on its own, not through the generator."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
import redis
from pydantic import AliasChoices
from pydantic_settings import BaseSettings

from schedproj.core.families import LaneFamily
from schedproj.core.lanes import Gate, Lane, LaneKind, LaneSpec
from schedproj.devtools.reference import MissingWords, comment_docs, settings_table
from schedproj.ops.cli import main
from schedproj.rem.settings import RemSettings
from schedproj.settings import Settings
from schedproj.store.protocol import Keys
from schedproj.telemetry.metrics import CATALOG, SchedprojCollector

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stdout}{built.stderr}"
    return out


def anchors(site: Path, page: str, kind: str) -> set[str]:
    """The ``<kind>-<name>`` anchors of a built reference page, without the prefix."""
    html = (site / "reference" / page / "index.html").read_text()
    return set(re.findall(rf'id="{kind}-([^"]+)"', html))


def test_the_site_builds_strict_with_every_page_of_the_nav(site: Path) -> None:
    for page in ("tutorial", "adoption", "families", "connect", "deploy", "operate",
                 "simulator", "design", "guarantees", "chaos", "performance", "architecture",
                 "testing", "reference/settings", "reference/cli", "reference/metrics",
                 "reference/lanes"):
        assert (site / page / "index.html").exists(), page
    # Included files and published plots arrive whole.
    assert "SchedprojRunsLost" in (site / "operate" / "index.html").read_text()
    assert "Without Docker Hub: a local base image" in (
        site / "deploy" / "index.html").read_text()
    assert (site / "img" / "bench" / "bench_latency.png").stat().st_size > 0


# -- settings ---------------------------------------------------------------------------------
def env_names(model: type[BaseSettings], prefix: str) -> set[str]:
    names = set()
    for name, info in model.model_fields.items():
        alias = info.validation_alias
        names |= ({str(c) for c in alias.choices} if isinstance(alias, AliasChoices)
                  else {f"{prefix}{name.upper()}"})
    return names


def test_every_setting_and_only_those_is_in_the_reference(site: Path) -> None:
    code = env_names(Settings, "SCHEDPROJ_") | env_names(RemSettings, "SCHEDPROJ_REM_")
    assert {"CELERY_BROKER_URL", "SCHEDPROJ_HOLD_CAP_S", "SENTRY_DSN",
            "SCHEDPROJ_REM_BATCH"} <= code
    assert anchors(site, "settings", "setting") == code


# -- command line -----------------------------------------------------------------------------
def walk(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...],
                                                                       click.Command]]:
    found: list[tuple[tuple[str, ...], click.Command]] = [(path, group)]
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += walk(command, (*path, name))
        else:
            found.append(((*path, name), command))
    return found


def test_every_command_and_option_and_only_those_is_in_the_reference(site: Path) -> None:
    code, commands = set(), set()
    for path, command in walk(main):
        commands.add("-".join(("schedproj", *path)))
        where = "-".join(path) or "schedproj"
        for param in command.params:
            if getattr(param, "hidden", False):
                continue
            name = (max(param.opts, key=len).lstrip("-") if isinstance(param, click.Option)
                    else param.human_readable_name.rstrip(".").lower())
            code.add(f"{where}-{name}")
    assert {"status-json", "clear-lease-stop", "family-add-key", "schedproj-version"} <= code
    assert anchors(site, "cli", "cli") == code
    html = (site / "reference" / "cli" / "index.html").read_text()
    headings = set(re.findall(r'<h2 id="(schedproj[^"]*)"', html))
    assert headings == commands


# -- metrics ----------------------------------------------------------------------------------
def test_every_metric_a_scrape_serves_and_only_those_is_in_the_reference(
        site: Path, client: redis.Redis, keys: Keys) -> None:
    specs = (LaneSpec(name="big", task_name="big", kind=LaneKind.HEAVY, cadence_s=60.0),)
    served = {m.name + ("_total" if m.type == "counter" else "")
              for m in SchedprojCollector(client, keys, Settings(), specs).collect()}
    assert served == {m.exposed for m in CATALOG}
    assert anchors(site, "metrics", "metric") == served


# -- lane options -----------------------------------------------------------------------------
def test_every_lane_option_and_only_those_is_in_the_reference(site: Path) -> None:
    lane = {f.name for f in dataclasses.fields(Lane)}
    family = {f.name for f in dataclasses.fields(LaneFamily)} - lane
    gate = {f.name for f in dataclasses.fields(Gate)}
    assert {"cadence_s", "gates", "due_check"} <= lane and "jitter" in family
    assert anchors(site, "lanes", "option-lane") == lane
    assert anchors(site, "lanes", "option-family") == family
    assert anchors(site, "lanes", "option-gate") == gate


# -- the generator refuses blanks -------------------------------------------------------------
def test_a_setting_without_a_description_stops_the_build() -> None:
    from pydantic import Field

    class Undocumented(BaseSettings):
        documented: int = Field(default=1, description="Says what it does.")
        silent: int = 2

    with pytest.raises(MissingWords, match=r"Undocumented\.silent has no description"):
        list(settings_table(Undocumented, "X_"))


def test_a_lane_option_is_documented_by_the_comment_above_it() -> None:
    docs = comment_docs(Lane)
    assert set(docs) == {f.name for f in dataclasses.fields(Lane)}
    assert "staleness ratio" in docs["cadence_s"]

    @dataclasses.dataclass
    class Options:
        #: Documented.
        first: int = 1
        # A plain comment is not a doc.
        second: int = 2

    assert comment_docs(Options) == {"first": "Documented."}
