"""The layout is the architecture: the core is pure, layers import only downwards, no function
is long, and the simulator's figures are exactly what they were before the layout moved."""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import schedproj
import schedproj.core

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "schedproj"
REFERENCE = Path(__file__).resolve().parent / "reference"

#: Third-party packages the pure core must never load, not even through the package root.
IMPURE = ("celery", "kombu", "billiard", "redis", "pydantic", "pydantic_settings",
          "sentry_sdk")

#: Which layer may import which (a layer may always import itself). Strictly downwards, with no
#: allowance: core < store < settings < telemetry < on_celery < ops, then the wings (rem, sim)
#: and the tools (devtools < chaos) above the library; nothing in the library imports them.
ALLOWED = {
    "core": {"core"},
    "store": {"core", "store"},
    "settings": {"core", "store", "settings"},
    "telemetry": {"core", "store", "settings", "telemetry"},
    "on_celery": {"core", "store", "settings", "telemetry", "on_celery"},
    "ops": {"core", "store", "settings", "telemetry", "on_celery", "ops"},
    "rem": {"core", "store", "settings", "on_celery", "rem"},
    "sim": {"core", "rem", "sim"},
    "devtools": {"core", "store", "settings", "telemetry", "on_celery", "ops", "rem", "sim",
                 "devtools"},
    "chaos": {"core", "store", "settings", "telemetry", "on_celery", "devtools", "chaos"},
}
#: The command line sits on top of everything: its commands reach into the wings (demo,
#: simulate, chaos), each lazily inside the command that needs it.
TOP = frozenset({"schedproj.ops.cli"})


def core_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(schedproj.core.__path__,
                                                        "schedproj.core."))


def test_every_core_module_loads_nothing_impure() -> None:
    modules = core_modules()
    assert {"schedproj.core.planner", "schedproj.core.lifecycle",
            "schedproj.core.pipeline", "schedproj.core.picker"} <= set(modules)
    probe = (f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
             f"print(','.join(sorted(p for p in {IMPURE!r} if p in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "", f"the core loaded {out.stdout.strip()}"


def test_the_public_declaration_names_load_without_celery() -> None:
    probe = ("import sys\nfrom schedproj import Gate, Lane, LaneKind, Policy, Profile\n"
             f"print(','.join(sorted(p for p in {IMPURE!r} if p in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == ""


def test_the_lazy_public_names_resolve() -> None:
    for name in schedproj.__all__:
        assert getattr(schedproj, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        _ = schedproj.nosuch  # type: ignore[attr-defined]


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "schedproj" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in ALLOWED else None


def _imports(source: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def upward_imports(modules: dict[str, str]) -> list[str]:
    """Every import in ``modules`` (dotted name -> source) that its layer may not make."""
    wrong = []
    for module, source in sorted(modules.items()):
        layer = _layer(module)
        if layer is None or module in TOP:
            continue
        for target in sorted(_imports(source)):
            other = _layer(target)
            if other is not None and other not in ALLOWED[layer]:
                wrong.append(f"{module} imports {target}")
    return wrong


def test_layers_import_only_what_they_may() -> None:
    sources = {".".join(path.relative_to(ROOT).with_suffix("").parts): path.read_text()
               for path in PACKAGE.rglob("*.py")}
    wrong = upward_imports(sources)
    assert not wrong, "\n".join(wrong)


def test_the_check_catches_an_upward_import() -> None:
    """The scan is not vacuous: a core module importing the Celery side, the Celery side
    importing ops (the old start-up hook allowance) and devtools importing chaos are reported;
    the same imports made downwards are not."""
    wrong = upward_imports({
        "schedproj.core.probe": "from schedproj.on_celery import beat\n",
        "schedproj.on_celery.probe": "def f():\n    import schedproj.ops.apps\n",
        "schedproj.devtools.probe": "from schedproj.chaos.audit import x\n",
        "schedproj.chaos.probe": "from schedproj.devtools import processes\n",
        "schedproj.ops.probe": "from schedproj.on_celery import beat\n",
    })
    assert wrong == ["schedproj.core.probe imports schedproj.on_celery",
                     "schedproj.core.probe imports schedproj.on_celery.beat",
                     "schedproj.devtools.probe imports schedproj.chaos.audit",
                     "schedproj.devtools.probe imports schedproj.chaos.audit.x",
                     "schedproj.on_celery.probe imports schedproj.ops.apps"]


def test_the_layers_form_an_order() -> None:
    """No two layers may import each other, directly or through others: the relation without
    each layer's own entry has a topological order."""
    pending = {layer: set(others) - {layer} for layer, others in ALLOWED.items()}
    order: list[str] = []
    while pending:
        ready = sorted(layer for layer, needs in pending.items() if needs <= set(order))
        assert ready, f"a cycle among {sorted(pending)}"
        order += ready
        for layer in ready:
            del pending[layer]


def _documented_layers() -> dict[str, set[str]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    table: dict[str, set[str]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0].strip("`") in ALLOWED:
            names = {n.strip().strip("`") for n in cells[1].split(",")} - {"—", ""}
            table[cells[0].strip("`")] = names
    return table


def test_docs_architecture_states_the_rule_this_test_enforces() -> None:
    expected = {layer: set(others) - {layer} for layer, others in ALLOWED.items()}
    assert _documented_layers() == expected


def test_no_function_is_longer_than_sixty_lines() -> None:
    long = []
    for path in sorted([*PACKAGE.rglob("*.py"), *(ROOT / "bench").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > 60:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} {length}")
    assert not long, "\n".join(long)


@pytest.mark.parametrize(("args", "reference"), [
    (["--scenario", "forensic", "--seed", "1"], "sim_forensic_seed1.json"),
    (["--scenario", "random", "--H", "0.5,0.9,1.2", "--seed", "1"], "sim_random_seed1.json"),
])
def test_the_simulator_output_is_what_it_was_before_the_layout_moved(
        args: list[str], reference: str) -> None:
    # In a fresh interpreter: the forensic scenario imports the REM lanes, whose shared tasks
    # would otherwise join every Celery app later tests create.
    out = subprocess.run([sys.executable, "-m", "schedproj.ops.cli", "simulate", *args,
                          "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == json.loads((REFERENCE / reference).read_text())
