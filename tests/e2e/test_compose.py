"""The compose deployment (``compose/``) and the start scripts it shares with bare metal.

The compose file is checked as data (against the scripts and the settings), parsed by Compose
v2 itself, and the scripts it runs are run for real: ``workers/heavy.sh``, ``workers/light.sh``
and ``beat/beat.sh`` against the end-to-end Redis database, health-checked with the very
commands the compose file declares, then stopped with SIGTERM. The whole deployment under a
real Docker engine: ``tests/e2e/test_compose_docker.py``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from schedproj import Settings
from tests.conftest import E2E_REDIS_URL
from tests.procs import FAST_SETTINGS, wait_for

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "compose" / "docker-compose.yml"
TEST_OVERRIDE = ROOT / "compose" / "docker-compose.test.yml"
DOCKERFILE = ROOT / "compose" / "Dockerfile"
SCRIPTS = {
    "heavy": ROOT / "workers" / "heavy.sh",
    "light": ROOT / "workers" / "light.sh",
    "beat": ROOT / "beat" / "beat.sh",
}
#: What each script must run after ``celery`` (the public commands of the main README).
PUBLIC_COMMANDS = {
    "heavy": ["-A", "schedproj.app", "worker", "-Q", "heavy", "-c", "1"],
    "light": ["-A", "schedproj.app", "worker", "-Q", "light"],
    "beat": ["-A", "schedproj.app", "beat", "-S", "fair"],
}
PREFIX = "schedproj"
#: Variables the start scripts read that are not settings (the Celery app to run).
NON_SETTING_ENV = frozenset({"SCHEDPROJ_APP"})
#: Compose interpolation: ``$$`` (a literal dollar) or ``${NAME}``, ``${NAME:-x}``, ``${NAME-x}``,
#: ``${NAME:?msg}``, ``${NAME?msg}``, ``${NAME:+x}``; a bare ``$NAME`` is interpolated too.
INTERPOLATION = re.compile(
    r"\$\$|\$\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)")


# -- helpers ---------------------------------------------------------------------------------
def load_compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]  # type: ignore[no-any-return]


def argv(value: str | list[str]) -> list[str]:
    """A compose ``command`` or healthcheck ``test`` as a list of words."""
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def strings(node: object) -> Iterator[str]:
    """Every string value (and mapping key) in a parsed YAML document."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield str(key)
            yield from strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from strings(item)


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's variable interpolation (enough of it for this file)."""
    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group("braced") or m.group("bare")
        op, arg, value = m.group("op") or "", m.group("arg") or "", env.get(name)
        unset = not value if op.startswith(":") else value is None
        kind = op[-1:]
        if kind == "?" and unset:
            raise ValueError(f"required variable {name} is missing a value: {arg}")
        if kind == "-" and unset:
            return arg
        if kind == "+":
            return "" if unset else arg
        return value or ""
    return INTERPOLATION.sub(one, text)


def healthcheck_shell(service: dict[str, Any]) -> str:
    """The shell command of a ``CMD-SHELL`` health check, as the container's shell sees it."""
    test = service["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL", test
    return interpolate(" ".join(test[1:]), {})


def script_argv(script: Path, *extra: str, env: dict[str, str] | None = None,
                tmp: Path) -> tuple[list[str], int, int]:
    """Run a start script with a stand-in ``celery`` that reports its argv and pid; return
    (argv, the stand-in's pid, the script's pid)."""
    fake = tmp / "bin"
    fake.mkdir(exist_ok=True)
    celery = fake / "celery"
    celery.write_text('#!/bin/sh\necho "$$"\nprintf "%s\\n" "$@"\n')
    celery.chmod(0o755)
    full_env = {k: v for k, v in os.environ.items() if k not in {"SCHEDPROJ_APP", "LOGLEVEL"}}
    full_env.update(env or {})
    full_env["PATH"] = f"{fake}{os.pathsep}{os.environ['PATH']}"
    proc = subprocess.Popen([str(script), *extra], env=full_env, stdout=subprocess.PIPE,
                            text=True)
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0, out
    lines = out.splitlines()
    return lines[1:], int(lines[0]), proc.pid


# -- the compose file ------------------------------------------------------------------------
def test_compose_names_exactly_the_five_services(services: dict[str, Any]) -> None:
    """Five services start by default; the pool worker ``gpu`` only with ``--profile pools``."""
    default = {name for name, svc in services.items() if not svc.get("profiles")}
    assert default == {"redis", "beat", "heavy", "light", "flower"}
    assert set(services) - default == {"gpu"}
    assert services["gpu"]["profiles"] == ["pools"]


#: The pool worker's script, and what it runs for ``workers/pool.sh gpu 2``.
POOL_SCRIPT = ROOT / "workers" / "pool.sh"
POOL_COMMAND = ["-A", "schedproj.app", "worker", "-Q", "gpu", "-c", "2", "-n", "gpu@%h"]


def test_a_pool_service_runs_the_pool_script_on_the_pools_queue_with_its_slots(
        services: dict[str, Any], tmp_path: Path) -> None:
    """``workers/pool.sh POOL SLOTS``: ``celery worker -Q POOL -c SLOTS`` (docs/pools.md),
    exec'd, extra arguments passed on; without a pool or slots it says how to call it."""
    assert argv(services["gpu"]["command"]) == ["/app/workers/pool.sh", "gpu", "2"]
    assert os.access(POOL_SCRIPT, os.X_OK) and POOL_SCRIPT.read_text().startswith(
        "#!/usr/bin/env bash\n")
    args, celery_pid, script_pid = script_argv(POOL_SCRIPT, "gpu", "2", "--extra", "x",
                                               tmp=tmp_path)
    assert args[:len(POOL_COMMAND)] == POOL_COMMAND, args
    assert args[-2:] == ["--extra", "x"] and celery_pid == script_pid
    for missing in ([], ["gpu"]):
        proc = subprocess.run([str(POOL_SCRIPT), *missing], capture_output=True, text=True,
                              timeout=10)
        assert proc.returncode != 0 and "usage: workers/pool.sh POOL SLOTS" in proc.stderr
    words = shlex.split(healthcheck_shell(services["gpu"]))
    assert words[:5] == ["celery", "-A", "schedproj.app", "inspect", "ping"]
    assert words[words.index("-d") + 1] == "gpu@${HOSTNAME}", "the node is gpu@%h"


@pytest.mark.parametrize("role", ["heavy", "light", "beat"])
def test_service_runs_its_start_script(services: dict[str, Any], role: str) -> None:
    command = argv(services[role]["command"])
    script = SCRIPTS[role].relative_to(ROOT).as_posix()
    assert len(command) == 1 and command[0].endswith(script), (
        f"{role} should run {script} (the script a bare-metal deploy runs), not {command}")
    assert "entrypoint" not in services[role]


def test_image_holds_the_scripts_where_compose_runs_them(services: dict[str, Any]) -> None:
    text = DOCKERFILE.read_text()
    workdir = re.findall(r"^WORKDIR\s+(\S+)", text, re.M)[-1]
    for role in ("heavy", "light", "beat"):
        (path,) = argv(services[role]["command"])
        rel = SCRIPTS[role].relative_to(ROOT)
        assert path in {f"{workdir}/{rel.as_posix()}", rel.as_posix()}, path
        assert re.search(rf"^COPY\s+{rel.parent.as_posix()}/?\s", text, re.M), (
            f"the Dockerfile does not copy {rel.parent}/")


def test_dockerfile_installs_the_project_as_non_root_without_dev_deps() -> None:
    text = DOCKERFILE.read_text()
    # The base image is a build argument whose default is the public Python image (a machine
    # without Docker Hub passes a local one: scripts/docker_base.sh).
    default = re.search(r"^ARG\s+PYTHON_IMAGE=(\S+)\s*$", text, re.M)
    assert default and default.group(1) == "python:3.11-slim", "ARG PYTHON_IMAGE=python:3.11-slim"
    assert re.findall(r"^FROM\s+(\S+)", text, re.M) == ["${PYTHON_IMAGE}"]
    installs = re.findall(r"pip install[^\n]*", text)
    assert installs, "the project is not installed"
    assert not any("[test]" in line or "-e " in line or "requirements-dev" in line
                   for line in installs), installs
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1] not in {"root", "0", "0:0"}, "the image must not run as root"
    assert "useradd" in text


def test_scripts_are_executable_and_exec_the_public_commands(tmp_path: Path) -> None:
    for role, script in SCRIPTS.items():
        assert os.access(script, os.X_OK), f"{script} is not executable"
        assert script.read_text().startswith("#!/usr/bin/env bash\n")
        args, celery_pid, script_pid = script_argv(script, "--extra", "x", tmp=tmp_path)
        expected = PUBLIC_COMMANDS[role]
        assert args[:len(expected)] == expected, (role, args)
        assert args[-2:] == ["--extra", "x"], f"{script} drops extra arguments: {args}"
        assert celery_pid == script_pid, f"{script} should exec celery (signals reach it)"
    heavy = SCRIPTS["heavy"].read_text()
    assert '-Q heavy -c 1' in heavy and 'celery -A "${SCHEDPROJ_APP:-schedproj.app}"' in heavy


def test_scripts_take_the_app_from_schedproj_app(tmp_path: Path) -> None:
    for script in SCRIPTS.values():
        args, _, _ = script_argv(script, env={"SCHEDPROJ_APP": "my.app"}, tmp=tmp_path)
        assert args[:2] == ["-A", "my.app"]


def node_name(role: str, tmp: Path) -> str:
    args, _, _ = script_argv(SCRIPTS[role], tmp=tmp)
    return args[args.index("-n") + 1]


def test_health_checks_ping_each_node_by_its_name(services: dict[str, Any],
                                                  tmp_path: Path) -> None:
    for name, service in services.items():
        check = service.get("healthcheck")
        assert check and not check.get("disable"), f"{name} has no health check"
        assert argv(check["test"])[0] in {"CMD", "CMD-SHELL"}
    assert argv(services["redis"]["healthcheck"]["test"])[1:] == ["redis-cli", "ping"]
    assert "--enable-remote-control" in script_argv(SCRIPTS["beat"], tmp=tmp_path)[0], (
        "beat answers inspect ping only with remote control on")
    for role in ("heavy", "light", "beat"):
        shell = healthcheck_shell(services[role])
        words = shlex.split(shell)
        assert words[:5] == ["celery", "-A", "schedproj.app", "inspect", "ping"], shell
        node = words[words.index("-d") + 1]
        assert node_name(role, tmp_path) == f"{role}@%h"
        # %h is the host name, which is $HOSTNAME in a container.
        assert node == f"{role}@${{HOSTNAME}}", (
            f"{role}'s health check pings {node}, its node is {role}@%h")
    assert "/healthcheck" in " ".join(argv(services["flower"]["healthcheck"]["test"]))


def test_redis_persists_and_never_evicts(services: dict[str, Any]) -> None:
    redis_svc = services["redis"]
    command = argv(redis_svc["command"])
    assert command[0] == "redis-server"
    pairs = dict(zip(command[1::2], command[2::2], strict=False))
    assert pairs.get("--appendonly") == "yes", command
    assert pairs.get("--maxmemory-policy") == "noeviction", command
    assert any(str(v).endswith(":/data") for v in redis_svc.get("volumes", [])), (
        "the append-only file must live in a volume")


#: Every secret the compose file needs, none with a default (a value for the data checks).
SECRETS = {"REDIS_PASSWORD": "r3dispass", "FLOWER_BASIC_AUTH": "admin:fl0wer",
           "SCHEDPROJ_STATUS_PASSWORD": "st4tus"}


def required(text: str, name: str) -> None:
    """``text`` takes ``name`` from the environment and refuses to start without it."""
    with pytest.raises(ValueError, match=name):
        interpolate(text, {})
    with pytest.raises(ValueError, match=name):
        interpolate(text, {name: ""})


def test_flower_requires_basic_auth_from_the_environment(services: dict[str, Any]) -> None:
    flower = services["flower"]
    command = argv(flower["command"])
    assert command[:4] == ["celery", "-A", "schedproj.app", "flower"]
    # In the command line the password would show in `docker inspect` and `ps`: Flower reads
    # FLOWER_BASIC_AUTH from its environment instead.
    assert not [w for w in command if "auth" in w.lower()], command
    auth = flower["environment"]["FLOWER_BASIC_AUTH"]
    assert re.fullmatch(r"\$\{FLOWER_BASIC_AUTH:\?[^}]+\}", auth), auth
    required(auth, "FLOWER_BASIC_AUTH")
    assert interpolate(auth, {"FLOWER_BASIC_AUTH": "a:b"}) == "a:b"
    assert "--port=5555" in command
    assert any(str(p).endswith("5555:5555") for p in flower.get("ports", []))


def test_no_secret_is_in_a_command_line(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        for part in ("command", "entrypoint"):
            words = " ".join(argv(svc.get(part) or []))
            for secret in SECRETS:
                assert secret not in words, f"{name}'s {part} holds {secret}"


def test_redis_asks_for_a_password_every_client_sends(compose: dict[str, Any],
                                                      services: dict[str, Any]) -> None:
    redis_svc = services["redis"]
    command = argv(redis_svc["command"])
    include = command[command.index("--include") + 1]
    mounted = {c["target"]: c["source"] for c in redis_svc["configs"]}
    content = compose["configs"][mounted[include]]["content"]
    required(content, "REDIS_PASSWORD")
    assert interpolate(content, SECRETS).strip() == "requirepass r3dispass"
    # The health check's redis-cli authenticates (REDISCLI_AUTH) with the same password.
    assert interpolate(redis_svc["environment"]["REDISCLI_AUTH"], SECRETS) == "r3dispass"
    for name in ("beat", "heavy", "light", "flower"):
        url = services[name]["environment"]["CELERY_BROKER_URL"]
        required(url, "REDIS_PASSWORD")
        assert interpolate(url, SECRETS) == "redis://:r3dispass@redis:6379/0"
        Settings.load(broker_url=interpolate(url, SECRETS))  # a URL the settings accept


def test_beat_serves_its_page_with_auth_and_logs_no_error_at_start(
        services: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    from schedproj.telemetry.webserver import credentials

    env = {k: interpolate(v, SECRETS) for k, v in services["beat"]["environment"].items()}
    required(services["beat"]["environment"]["SCHEDPROJ_STATUS_PASSWORD"],
             "SCHEDPROJ_STATUS_PASSWORD")
    settings = Settings.load(
        broker_url=env["CELERY_BROKER_URL"], metrics_host=env["SCHEDPROJ_METRICS_HOST"],
        metrics_port=env["SCHEDPROJ_METRICS_PORT"], status_user=env["SCHEDPROJ_STATUS_USER"],
        status_password=env["SCHEDPROJ_STATUS_PASSWORD"])
    with caplog.at_level(logging.ERROR):
        creds, allowed = credentials(settings)
    assert allowed and creds == ("ops", "st4tus") and not caplog.records


def test_one_beat_and_scalable_heavy_workers(services: dict[str, Any]) -> None:
    beat = services["beat"]
    assert beat.get("deploy", {}).get("replicas", 1) == 1
    assert beat.get("scale", 1) == 1
    for name in ("heavy", "light", "gpu"):
        svc = services[name]
        # A fixed container name or host port would make `--scale heavy=3` fail.
        assert "container_name" not in svc and "ports" not in svc, name
        assert "hostname" not in svc, f"{name} replicas need distinct node names"


def test_environment_of_every_schedproj_service(services: dict[str, Any]) -> None:
    known = {f"SCHEDPROJ_{f.upper()}" for f in Settings.model_fields} | NON_SETTING_ENV
    for name in ("beat", "heavy", "light", "flower", "gpu"):
        env = services[name]["environment"]
        assert isinstance(env, dict), f"{name}: use the mapping form"
        assert interpolate(env["CELERY_BROKER_URL"], SECRETS) == \
            "redis://:r3dispass@redis:6379/0"
        assert interpolate(env["SCHEDPROJ_LANE_MODULES"], {}) == "schedproj.rem.lanes"
        assert interpolate(env["SCHEDPROJ_LANE_MODULES"],
                           {"SCHEDPROJ_LANE_MODULES": "my.lanes"}) == "my.lanes"
        assert interpolate(env.get("SENTRY_DSN", ""), {}) == "", "Sentry is optional"
        # Beat and every worker read the same pools (a lane naming an undeclared pool is a
        # start-up error); none by default.
        assert interpolate(env["SCHEDPROJ_POOLS"], {}) == ""
        assert interpolate(env["SCHEDPROJ_POOLS"], {"SCHEDPROJ_POOLS": "gpu=2"}) == "gpu=2"
        unknown = {k for k in env if k.startswith("SCHEDPROJ_")} - known
        assert not unknown, f"{name}: unknown settings {unknown}"
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"
    metrics = services["beat"]["environment"]
    assert metrics["SCHEDPROJ_METRICS_PORT"] == "9808"
    assert services["beat"]["ports"] == ["127.0.0.1:9808:9808"], "metrics on loopback only"


def test_every_dollar_is_a_valid_interpolation_or_escaped(compose: dict[str, Any]) -> None:
    """A bare ``$HOSTNAME`` in a health check would be filled in from the host's shell by
    compose, not the container's: container-side variables must be written ``$$``."""
    for text in strings(compose):
        rest = INTERPOLATION.sub("", text)
        assert "$" not in rest, f"malformed interpolation in {text!r}"
        for m in INTERPOLATION.finditer(text):
            assert not m.group("bare"), f"unescaped ${m.group('bare')} in {text!r}"


def _compose_version(cli: list[str]) -> str | None:
    try:
        out = subprocess.run([*cli, "version", "--short"], capture_output=True, text=True,
                             timeout=30)
    except OSError:
        return None
    return out.stdout.strip().lstrip("v") if out.returncode == 0 else None


def _compose_cli() -> tuple[list[str] | None, str]:
    """A Compose v2 command, else (None, why). The file is written to the Compose
    Specification (no ``version:`` key, top-level ``name:``), which only Compose v2 reads;
    Debian's docker-compose 1.x rejects it, so a v1 found on the path is passed over."""
    candidates: list[list[str]] = []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    seen = []
    for cli in candidates:
        version = _compose_version(cli)
        if version and version.split(".")[0] == "2":
            return cli, version
        if version:
            seen.append(f"{' '.join(cli)} {version}")
    why = "no Compose v2 (docker compose plugin) is installed; bash scripts/setup.sh installs it"
    return None, why + (f" (found only {', '.join(seen)}, which cannot read the file)"
                        if seen else "")


def test_docker_compose_config_accepts_the_file() -> None:
    """``docker compose config`` only parses and interpolates (no engine needed)."""
    cli, why = _compose_cli()
    if cli is None:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    cmd = [*cli, "-f", str(COMPOSE_FILE), "config", "--quiet"]
    env = {k: v for k, v in os.environ.items() if k not in SECRETS}
    ok = subprocess.run(cmd, env={**env, **SECRETS}, capture_output=True, text=True,
                        timeout=60)
    assert ok.returncode == 0, ok.stderr
    for name in SECRETS:
        without = {**env, **{k: v for k, v in SECRETS.items() if k != name}}
        missing = subprocess.run(cmd, env=without, capture_output=True, text=True, timeout=60)
        assert missing.returncode != 0 and name in missing.stderr


def test_test_override_puts_every_service_on_loopback_of_the_hosts_network() -> None:
    """The merged view ``tests/e2e/test_compose_docker.py`` runs: host networking everywhere (so
    the engine makes no bridge and no network), nothing published, everything on 127.0.0.1."""
    cli, why = _compose_cli()
    if cli is None:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCHEDPROJ_", "FLOWER_"))}
    env.update({**SECRETS, "SCHEDPROJ_TEST_REDIS_PORT": "16391",
                "SCHEDPROJ_TEST_FLOWER_PORT": "15556", "SCHEDPROJ_TEST_METRICS_PORT": "19809"})
    out = subprocess.run([*cli, "-f", str(COMPOSE_FILE), "-f", str(TEST_OVERRIDE),
                          "config", "--format", "json"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    merged = json.loads(out.stdout)
    assert not merged.get("networks"), "no network of the project's own"
    for name, svc in merged["services"].items():
        assert svc.get("network_mode") == "host", name
        assert not svc.get("ports"), f"{name} publishes {svc['ports']}"
        for key, value in (svc.get("environment") or {}).items():
            if str(value).startswith("redis://"):
                assert value == "redis://:r3dispass@127.0.0.1:16391/0", (name, key, value)
    assert "--address=127.0.0.1" in merged["services"]["flower"]["command"]
    assert "--port=15556" in merged["services"]["flower"]["command"]
    beat = merged["services"]["beat"]["environment"]
    assert (beat["SCHEDPROJ_METRICS_HOST"], beat["SCHEDPROJ_METRICS_PORT"]) == (
        "127.0.0.1", "19809")
    redis_cmd = merged["services"]["redis"]["command"]
    assert redis_cmd[redis_cmd.index("--bind") + 1] == "127.0.0.1"
    assert redis_cmd[redis_cmd.index("--appendonly") + 1] == "yes"


# -- the same commands, run for real ---------------------------------------------------------
def _env(scenario: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"SCHEDPROJ_APP", "LOGLEVEL"}}
    env.update(FAST_SETTINGS)
    env.update({
        "CELERY_BROKER_URL": E2E_REDIS_URL,
        "SCHEDPROJ_REDIS_URL": E2E_REDIS_URL,
        "SCHEDPROJ_KEY_PREFIX": PREFIX,
        "SCHEDPROJ_LANE_MODULES": "tests.lanes_e2e",
        "E2E_SCENARIO": scenario,
        "PYTHONPATH": str(ROOT),
        # The venv's celery first, as the image's /usr/local/bin/celery is there.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        # Docker sets HOSTNAME in every container; celery's %h is the same name.
        "HOSTNAME": socket.gethostname(),
    })
    return env


class Started:
    """Processes started in their own sessions, each logging to a file; stopped by SIGTERM to
    the process group, SIGKILL only as a last resort."""

    def __init__(self, logdir: Path, env: dict[str, str]) -> None:
        self.logdir, self.env = logdir, env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        with (self.logdir / f"{name}.log").open("wb") as out:
            proc = subprocess.Popen(args, cwd=ROOT, env=self.env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        path = self.logdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self) -> str:
        return "\n".join(f"--- {n} ---\n{self.log(n)[-3000:]}" for n in self.procs)

    def wait_log(self, name: str, text: str, timeout_s: float) -> None:
        proc = self.procs[name]
        wait_for(lambda: text in self.log(name) or proc.poll() is not None, timeout_s,
                 f"{text!r} in {name}'s log")
        assert proc.poll() is None, f"{name} exited:\n{self.log(name)[-3000:]}"

    def stop(self, timeout_s: float = 15) -> dict[str, int]:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        codes: dict[str, int] = {}
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
                codes[name] = -signal.SIGKILL
        return codes


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[Started]]:
    made: list[Started] = []
    yield made
    for group in made:
        group.stop()


def runs(r: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(x) for x in r.lrange(f"{PREFIX}:e2e:runs", 0, -1)]


@pytest.mark.e2e
@pytest.mark.timeout(60)
def test_compose_commands_run_lanes_on_both_queues_and_answer_health_checks(
        e2e_redis: redis.Redis, tmp_path: Path, services: dict[str, Any],
        started: list[Started]) -> None:
    group = Started(tmp_path, _env("deadline"))
    started.append(group)
    for role in ("heavy", "light", "beat"):
        group.start(role, [str(SCRIPTS[role])])
    group.wait_log("heavy", "ready.", 30)
    group.wait_log("light", "ready.", 30)
    group.wait_log("beat", ": active", 30)

    # Each script exec'd celery: the process compose signals is celery itself.
    for name, proc in group.procs.items():
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert any(part.endswith(b"celery") for part in cmdline), (name, cmdline)

    wait_for(lambda: {"e2e.quick", "e2e.slowlight"} <= {x["lane"] for x in runs(e2e_redis)},
             20, "a heavy and a light lane run")
    heavy = [x for x in runs(e2e_redis) if x["lane"] == "e2e.quick"]
    assert heavy and all(x["fence"] > 0 for x in heavy), "heavy runs hold the lease"
    assert "e2e.quick" in group.log("heavy") and "e2e.slowlight" in group.log("light")

    # The health checks compose runs, verbatim, inside the "container".
    for role in ("heavy", "light", "beat"):
        check = subprocess.run(["sh", "-c", healthcheck_shell(services[role])], cwd=ROOT,
                               env=group.env, capture_output=True, text=True, timeout=20)
        assert check.returncode == 0, (role, check.stdout, check.stderr)
        assert "pong" in check.stdout, (role, check.stdout)
    missing = subprocess.run(
        ["sh", "-c", healthcheck_shell(services["heavy"]).replace("heavy@", "nobody@")],
        cwd=ROOT, env=group.env, capture_output=True, text=True, timeout=20)
    assert missing.returncode != 0, "a health check must fail when its node does not answer"

    codes = group.stop()
    assert codes == {"heavy": 0, "light": 0, "beat": 0}, (codes, group.logs())
    assert "released the beat lock" in group.log("beat")
    assert "Warm shutdown" in group.log("heavy")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, auth: str | None = None) -> int:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.e2e
@pytest.mark.timeout(60)
def test_flower_command_refuses_requests_without_the_password(
        e2e_redis: redis.Redis, tmp_path: Path, services: dict[str, Any],
        started: list[Started]) -> None:
    env = {**_env("deadline"), "FLOWER_BASIC_AUTH": "admin:s3cret"}
    port = _free_port()
    command = [interpolate(word, env) for word in argv(services["flower"]["command"])]
    command = [f"--port={port}" if w == "--port=5555" else
               "--address=127.0.0.1" if w.startswith("--address=") else w for w in command]
    # The password reaches Flower the way compose passes it: its environment, not its argv.
    group = Started(tmp_path, {**env, "FLOWER_BASIC_AUTH": interpolate(
        services["flower"]["environment"]["FLOWER_BASIC_AUTH"], env)})
    started.append(group)
    group.start("flower", [str(Path(sys.executable).parent / command[0]), *command[1:]])
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        with contextlib.suppress(OSError):
            return _get(f"{base}/healthcheck") == 200
        return group.procs["flower"].poll() is not None

    wait_for(up, 30, "flower answers /healthcheck", poll_s=0.2)
    assert group.procs["flower"].poll() is None, group.log("flower")
    assert _get(f"{base}/") == 401
    assert _get(f"{base}/", "admin:wrong") == 401
    assert _get(f"{base}/", "admin:s3cret") == 200
    group.stop()
