"""The compose deployment, built and run under a real Docker engine.

``compose/docker-compose.yml`` with the test-only override ``compose/docker-compose.test.yml``
(every service on the host's network, on loopback ports picked here). The default run: build
the image, ``up --wait`` with every service healthy (Redis with its append-only file, beat, one
heavy worker, light, a pool gpu=2's worker, Flower behind basic auth), beat's first start logs
no ERROR, lanes run on both queues on their own workers, the pool's lanes on its worker with
two at once and never three, Flower's API answers only with the password, beat serves its
metrics, and ``down -v`` leaves nothing behind. Marked ``slow`` (``.venv/bin/python -m pytest
tests/e2e/test_compose_docker.py -m slow``; docs/testing.md): heavy scaled to 3, the container
whose worker holds the lease is killed and the lease moves within its TTL with no two heavy
runs overlapping, and beat's container is killed and its restart policy brings it back and
dispatching resumes.

The engine: one that answers, else ``scripts/docker_engine.sh`` starts dockerd with
``--iptables=false --bridge=none`` (and stops it at the end). Without Docker Hub the base image
is built locally (``scripts/docker_base.sh``: debootstrap + docker import, cached by Docker).
The tests skip, saying why, only where no engine can be started at all.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import io
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tarfile
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from schedproj.devtools import processes

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "schedproj.json"
COMPOSE_FILES = [ROOT / "compose" / "docker-compose.yml",
                 ROOT / "compose" / "docker-compose.test.yml"]
#: What compose/Dockerfile copies from the repository root (the staged build context).
CONTEXT = ["pyproject.toml", "README.md", "schedproj", "workers", "beat", "compose/Dockerfile"]
#: One tag per run (runs may share an engine), removed at the end.
IMAGE = f"schedproj:compose-test-{os.getpid()}"
LEASE_TTL_S = 5.0
#: Heavy workers the deployment starts with (the default run), and after the slow tests scale
#: it out (to see the lease move between replicas).
HEAVY_AT_START = 1
HEAVY_REPLICAS = 3
#: Seconds `down` gives a container to stop: only what it leaves behind is tested.
STOP_TIMEOUT_S = "3"
FLOWER_AUTH = "admin:compose-test-secret"
#: Redis asks every client for it; beat's status page asks for the other.
REDIS_PASSWORD = "composeTestRedis1"
STATUS_PASSWORD = "compose-test-status"
PREFIX = "schedproj"
#: The heavy lanes of the default pool (the single lease); e2e.gpu0-2 are the pool gpu's.
LEASE_LANES = {"e2e.long"}

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


#: The project's polling helper, at a pace that suits `docker inspect` and HTTP probes.
wait_for: Callable[..., Any] = functools.partial(processes.wait_for, poll_s=0.1)


def run(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 120,
        check: bool = True, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, env=env, capture_output=True, timeout=timeout, input=stdin,
                          cwd=ROOT)
    out = proc.stdout.decode(errors="replace")
    err = proc.stderr.decode(errors="replace")
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}:\n{out[-3000:]}\n"
                             f"{err[-3000:]}")
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def dependencies_image(base: str, figures: dict[str, float]) -> str:
    """``base`` with the project's runtime dependencies installed, kept between runs (tagged
    by a hash of the base image and the dependency list, as the base image is kept): the
    Dockerfile's ``pip install`` of the project then finds them installed and builds only the
    project, instead of downloading and installing every dependency again each run (it
    copies the sources before installing, so every change of them re-ran it: 56 s of the
    default run). The image the deployment runs is still built by compose/Dockerfile whole."""
    t0 = time.monotonic()
    with open(ROOT / "pyproject.toml", "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    base_id = run(["docker", "image", "inspect", "-f", "{{.Id}}", base]).stdout.strip()
    key = hashlib.sha256("\n".join([base_id, *deps]).encode()).hexdigest()[:16]
    tag = f"schedproj-test-deps:{key}"
    if run(["docker", "image", "inspect", tag], check=False).returncode == 0:
        figures["dependencies image (cached)"] = time.monotonic() - t0
        return tag
    dockerfile = (f"FROM {base}\nENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1\n"
                  f"RUN pip install {' '.join(json.dumps(d) for d in deps)}\n")
    run(["docker", "build", "--network", "host", "-t", tag, "-"],
        env={**os.environ, "DOCKER_BUILDKIT": "0"}, stdin=dockerfile.encode(), timeout=900)
    figures["dependencies image (built)"] = time.monotonic() - t0
    return tag


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(url: str, auth: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def host_interfaces() -> set[str]:
    """The host's interfaces a Docker engine or Compose would add (bridges and veth pairs).
    Others come and go with other tests (a partition test's veth pair has its own names)."""
    if not os.path.isdir("/sys/class/net"):
        return set()
    return {name for name in os.listdir("/sys/class/net")
            if name.startswith(("docker", "br-", "veth"))}


# -- the engine, the images, the deployment ------------------------------------------------
@pytest.fixture(scope="module")
def engine(request: pytest.FixtureRequest) -> Iterator[None]:
    """An answering Docker engine; one that scripts/docker_engine.sh started is stopped
    afterwards by the last run using it, someone else's never."""
    started = run(["bash", "scripts/docker_engine.sh", "start"], check=False, timeout=90)
    if started.returncode == 3:
        pytest.skip(f"no Docker engine can be started here: {started.stderr.strip()}")
    assert started.returncode == 0, started.stderr
    try:
        yield
    finally:
        if started.stdout.strip() in {"started", "joined"}:
            run(["bash", "scripts/docker_engine.sh", "stop"], check=False, timeout=60)


def compose_cli() -> list[str]:
    """Compose v2 (the file uses the Compose Specification and !reset): the docker CLI
    plugin, which scripts/setup.sh installs."""
    found = run(["docker", "compose", "version", "--short"], check=False, timeout=30)
    assert found.returncode == 0 and found.stdout.strip().lstrip("v").startswith("2"), (
        "Compose v2 is needed (`docker compose`); bash scripts/setup.sh installs it: "
        f"{found.stdout}{found.stderr}")
    return ["docker", "compose"]


def build_context() -> bytes:
    """The files compose/Dockerfile copies, as a tar (no .venv, caches or tests)."""
    buf = io.BytesIO()

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        name = Path(info.name).name
        return None if name == "__pycache__" or name.endswith(".pyc") else info

    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for rel in CONTEXT:
            tar.add(ROOT / rel, arcname=rel, filter=keep)
    return buf.getvalue()


@dataclass
class Deployment:
    project: str
    env: dict[str, str]
    redis_port: int
    flower_port: int
    metrics_port: int
    figures: dict[str, float] = field(default_factory=dict)
    interfaces_before: set[str] = field(default_factory=set)

    def compose(self, *args: str, timeout: float = 120,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        files = [w for f in COMPOSE_FILES for w in ("-f", str(f))]
        return run([*compose_cli(), *files, "-p", self.project, *args], env=self.env,
                   timeout=timeout, check=check)

    def containers(self, service: str | None = None) -> list[dict[str, Any]]:
        out = self.compose("ps", "--all", "--format", "json", *([service] if service else []))
        rows = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
        return [r for r in rows if isinstance(r, dict)]

    def inspect(self, container: str) -> dict[str, Any]:
        data = json.loads(run(["docker", "inspect", container]).stdout)
        return data[0]  # type: ignore[no-any-return]

    def redis(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.redis_port, decode_responses=True,
                           socket_timeout=5, password=REDIS_PASSWORD)

    def diagnostics(self) -> str:
        ps = self.compose("ps", "--all", check=False).stdout
        logs = self.compose("logs", "--no-color", "--tail", "40", check=False, timeout=60)
        return f"{ps}\n{logs.stdout[-8000:]}"


def labelled(kind: str, project: str) -> list[str]:
    """Ids of the project's containers / networks / volumes, by compose's label."""
    args = ["docker", kind, "ls", "-q", "--filter", f"label=com.docker.compose.project={project}"]
    if kind == "container":
        args.insert(3, "--all")
    return run(args).stdout.split()


@pytest.fixture(scope="module")
def deployment(engine: None, request: pytest.FixtureRequest) -> Iterator[Deployment]:
    compose_cli()
    interfaces = host_interfaces()
    figures: dict[str, float] = {}

    base = os.environ.get("SCHEDPROJ_TEST_BASE_IMAGE")
    if not base:
        t0 = time.monotonic()
        made = run(["bash", "scripts/docker_base.sh"], timeout=900)
        base = made.stdout.split()[-1]
        cached = "up to date" in made.stderr
        figures[f"base image ({'cached' if cached else 'debootstrap + import'})"] = (
            time.monotonic() - t0)
    base = dependencies_image(base, figures)
    t0 = time.monotonic()
    # The classic builder: BuildKit would fetch the Dockerfile frontend from Docker Hub.
    run(["docker", "build", "--network", "host", "--build-arg", f"PYTHON_IMAGE={base}",
         "-f", "compose/Dockerfile", "-t", IMAGE, "-"],
        env={**os.environ, "DOCKER_BUILDKIT": "0"}, stdin=build_context(), timeout=900)
    figures["image build"] = time.monotonic() - t0

    ports = {"redis": free_port(), "flower": free_port(), "metrics": free_port()}
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SCHEDPROJ_", "COMPOSE_", "FLOWER_"))}
    env.update({
        "FLOWER_BASIC_AUTH": FLOWER_AUTH,
        "REDIS_PASSWORD": REDIS_PASSWORD,
        "SCHEDPROJ_STATUS_PASSWORD": STATUS_PASSWORD,
        "SCHEDPROJ_TEST_IMAGE": IMAGE,
        "SCHEDPROJ_TEST_BASE_IMAGE": base,
        "SCHEDPROJ_TEST_REDIS_PORT": str(ports["redis"]),
        "SCHEDPROJ_TEST_FLOWER_PORT": str(ports["flower"]),
        "SCHEDPROJ_TEST_METRICS_PORT": str(ports["metrics"]),
        "SCHEDPROJ_TEST_LEASE_TTL_S": str(LEASE_TTL_S),
        # The gpu service (a pool's worker) starts only with this profile.
        "COMPOSE_PROFILES": "pools",
    })
    dep = Deployment(project=f"schedproj-test-{os.getpid()}", env=env,
                     redis_port=ports["redis"], flower_port=ports["flower"],
                     metrics_port=ports["metrics"], figures=figures,
                     interfaces_before=interfaces)
    t0 = time.monotonic()
    up = dep.compose("up", "-d", "--no-build", "--wait", "--wait-timeout", "240",
                     "--scale", f"heavy={HEAVY_AT_START}", timeout=300, check=False)
    figures["up --wait until every service is healthy"] = time.monotonic() - t0
    try:
        assert up.returncode == 0, f"{up.stderr[-3000:]}\n{dep.diagnostics()}"
        yield dep
    finally:
        dep.compose("down", "-v", "--timeout", STOP_TIMEOUT_S, timeout=180, check=False)
        run(["docker", "rmi", IMAGE], check=False)
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            print()
            for name, seconds in figures.items():
                print(f"compose figures: {name}: {seconds:.2f} s")


@pytest.fixture(scope="module")
def scaled_out(deployment: Deployment) -> Deployment:
    """The deployment with heavy scaled to ``HEAVY_REPLICAS`` (the slow tests')."""
    t0 = time.monotonic()
    up = deployment.compose("up", "-d", "--no-build", "--wait", "--wait-timeout", "240",
                            "--scale", f"heavy={HEAVY_REPLICAS}", timeout=300, check=False)
    deployment.figures[f"scale heavy to {HEAVY_REPLICAS}, every replica healthy"] = (
        time.monotonic() - t0)
    assert up.returncode == 0, f"{up.stderr[-3000:]}\n{deployment.diagnostics()}"
    return deployment


def flower_workers(deployment: Deployment, heavy: int) -> set[str]:
    """The workers Flower lists, once it lists ``heavy`` heavy ones and the light one."""
    base = f"http://127.0.0.1:{deployment.flower_port}"

    def workers() -> set[str] | None:
        status, body = http(f"{base}/api/workers?refresh=1", FLOWER_AUTH)
        assert status == 200, status
        names = set(json.loads(body))
        listed = {n for n in names if n.startswith("heavy-")}
        return names if len(listed) == heavy and any(
            n.startswith("light@") for n in names) else None

    return wait_for(workers, 60, f"Flower to list {heavy} heavy workers and the light one",
                    poll_s=2)


# -- helpers over the deployment's Redis ----------------------------------------------------
def journal(r: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(x) for x in r.lrange(f"{PREFIX}:journal", 0, -1)]


def lease(r: redis.Redis) -> dict[str, Any] | None:
    raw = r.get(f"{PREFIX}:lease")
    return json.loads(raw) if raw else None


def heavy_intervals(entries: list[dict[str, Any]],
                    cut: dict[int, float]) -> list[tuple[float, float, int]]:
    """(start, end, fence) of every run under the heavy lease (the pool gpu's runs have
    fences of their own slots); a run with no end ends at ``cut[fence]`` (its container was
    killed then) or is still running."""
    starts = {(e["task"], e["fence"]): e["t"] for e in entries
              if e["ev"] == "start" and e["fence"] > 0 and e["lane"] in LEASE_LANES}
    ends = {(e["task"], e["fence"]): e["t"] for e in entries
            if e["ev"] == "end" and e["fence"] > 0 and e["lane"] in LEASE_LANES}
    return sorted((t, ends.get(key, cut.get(key[1], float("inf"))), key[1])
                  for key, t in starts.items())


def assert_no_overlap(intervals: list[tuple[float, float, int]]) -> None:
    for (s1, e1, f1), (s2, _e2, f2) in itertools.pairwise(intervals):
        assert e1 <= s2, f"heavy runs overlap: fence {f1} [{s1}, {e1}] and fence {f2} from {s2}"
        assert f2 > f1, f"fences must increase: {f1} then {f2}"


def container_of(node: str) -> str:
    """heavy-<container id>@<host> (the override names each replica after its container)."""
    name = node.split("@", 1)[0]
    assert name.startswith("heavy-"), node
    return name.removeprefix("heavy-")


# -- the tests --------------------------------------------------------------------------------
def test_every_service_is_up_and_healthy_on_the_hosts_loopback(deployment: Deployment) -> None:
    rows = deployment.containers()
    by_service: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_service.setdefault(row["Service"], []).append(row)
    assert {s: len(v) for s, v in by_service.items()} == {
        "redis": 1, "beat": 1, "heavy": HEAVY_AT_START, "light": 1, "gpu": 1, "flower": 1}
    for row in rows:
        assert row["State"] == "running" and row["Health"] == "healthy", row
        config = deployment.inspect(row["ID"])["HostConfig"]
        assert config["NetworkMode"] == "host", row["Name"]
    # Host networking: compose made no network, and the host has no new interface.
    assert labelled("network", deployment.project) == []
    assert host_interfaces() == deployment.interfaces_before


def test_no_secret_in_a_command_line_and_beat_starts_without_an_error(
        deployment: Deployment) -> None:
    secrets = (REDIS_PASSWORD, STATUS_PASSWORD, FLOWER_AUTH.split(":", 1)[1])
    for row in deployment.containers():
        info = deployment.inspect(row["ID"])
        shown = json.dumps([info.get("Path"), info.get("Args"), info["Config"].get("Cmd"),
                            info["Config"].get("Entrypoint")])
        assert not [s for s in secrets if s in shown], f"{row['Name']}: {shown}"
    logs = deployment.compose("logs", "--no-color", "beat", timeout=60).stdout
    # Nothing at start is an error, the status page included. The first start on an empty
    # Redis (beat cannot tell it from a loss of everything) is a warning naming the command
    # that skips its wait.
    errors = [line for line in logs.splitlines() if ": ERROR/" in line]
    assert not errors and "status page refused" not in logs, errors
    first = [line for line in logs.splitlines() if "first start or state loss:" in line]
    assert len(first) == 1 and ": WARNING/" in first[0], first
    assert "`schedproj init`" in first[0], first
    assert deployment.redis().ping()  # with the password; without it Redis refuses
    anonymous = redis.Redis(host="127.0.0.1", port=deployment.redis_port, socket_timeout=5)
    with pytest.raises(redis.AuthenticationError):
        anonymous.ping()


def test_redis_keeps_an_append_only_file_and_never_evicts(deployment: Deployment) -> None:
    r = deployment.redis()
    assert r.config_get("appendonly") == {"appendonly": "yes"}
    assert r.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    files = deployment.compose("exec", "-T", "redis", "sh", "-c",
                               "ls /data/appendonlydir").stdout.split()
    assert any(f.endswith(".aof") for f in files), files
    assert labelled("volume", deployment.project), "the AOF lives in a named volume"


def test_lanes_run_on_both_queues_on_their_own_workers(deployment: Deployment) -> None:
    r = deployment.redis()

    def ended() -> set[str]:
        return {e["lane"] for e in journal(r) if e["ev"] == "end"}

    wait_for(lambda: {"e2e.long", "e2e.pulse"} <= ended(), 60,
             "a heavy (e2e.long) and a light (e2e.pulse) run to end", poll_s=0.5)
    heavy = [e for e in journal(r) if e["lane"] == "e2e.long"]
    assert heavy and all(e["fence"] > 0 for e in heavy), "heavy runs hold the lease"
    assert all(e["fence"] == 0 for e in journal(r) if e["lane"] == "e2e.pulse")

    # Which worker ran what, from Flower (workers send task events).
    base = f"http://127.0.0.1:{deployment.flower_port}"

    def workers_by_lane() -> dict[str, set[str]]:
        status, body = http(f"{base}/api/tasks?limit=500", FLOWER_AUTH)
        assert status == 200, status
        seen: dict[str, set[str]] = {}
        for task in json.loads(body).values():
            if task.get("name") and task.get("worker"):
                seen.setdefault(task["name"], set()).add(task["worker"])
        return seen

    seen = wait_for(lambda: (lambda s: s if {"e2e.long", "e2e.pulse"} <= set(s) else None)(
        workers_by_lane()), 30, "Flower to show both lanes' workers", poll_s=1)
    assert all(w.startswith("heavy-") for w in seen["e2e.long"]), seen
    assert all(w.startswith("light@") for w in seen["e2e.pulse"]), seen


def test_a_pools_lanes_run_on_its_worker_two_at_once_never_three(
        deployment: Deployment) -> None:
    """The gpu service (workers/pool.sh gpu 2, profile "pools") serves the pool gpu=2: its
    three lanes, each due every second and running 1.5 s, run on it, two at a time at most
    (the intervals the lanes record themselves, not what schedproj says), and both slots
    are used at once."""
    r = deployment.redis()
    lanes = {f"e2e.gpu{n}" for n in range(3)}

    def gpu_runs() -> list[dict[str, Any]] | None:
        runs = [json.loads(x) for x in r.lrange(f"{PREFIX}:e2e:runs", 0, -1)]
        runs = [x for x in runs if x["lane"] in lanes]
        return runs if len(runs) >= 6 and {x["lane"] for x in runs} == lanes else None

    runs = wait_for(gpu_runs, 60, "six runs of the pool's three lanes", poll_s=0.5)
    assert all(x["fence"] > 0 for x in runs), "a pool run holds a slot's fence"
    events = sorted([(x["start"], 1) for x in runs] + [(x["end"], -1) for x in runs])
    held = most = 0
    for _, change in events:  # an end sorts before a start at the same instant
        held += change
        most = max(most, held)
    assert most == 2, f"the pool has 2 slots; at most {most} runs at once: {runs}"
    heavy = [e for e in journal(r) if e["lane"] == "e2e.long" and e["ev"] == "start"]
    assert heavy, "the default pool's heavy lane runs beside the pool"

    base = f"http://127.0.0.1:{deployment.flower_port}"

    def gpu_workers() -> set[str] | None:
        status, body = http(f"{base}/api/tasks?limit=500", FLOWER_AUTH)
        assert status == 200, status
        seen = {t["worker"] for t in json.loads(body).values()
                if t.get("name") in lanes and t.get("worker")}
        return seen or None

    seen = wait_for(gpu_workers, 30, "Flower to show the pool lanes' worker", poll_s=1)
    assert all(w.startswith("gpu@") for w in seen), seen


def test_flower_api_answers_with_the_password_and_refuses_without(
        deployment: Deployment) -> None:
    base = f"http://127.0.0.1:{deployment.flower_port}"
    assert http(f"{base}/api/workers")[0] == 401
    assert http(f"{base}/api/workers", "admin:wrong")[0] == 401
    assert http(f"{base}/")[0] == 401
    flower_workers(deployment, HEAVY_AT_START)


def test_beat_serves_metrics_the_dashboard_shows(deployment: Deployment) -> None:
    status, body = http(f"http://127.0.0.1:{deployment.metrics_port}/metrics")
    assert status == 200
    text = body.decode()
    assert "schedproj_state_up 1.0" in text
    served = set(re.findall(r"^(schedproj_[a-z0-9_]+)[{ ]", text, re.M))
    for name in ("schedproj_lease_fence", "schedproj_deferral_chain_depth",
                 "schedproj_posture", "schedproj_dispatches_total"):
        assert name in served, name
    # Every series the real beat serves has a panel (deploy/grafana/schedproj.json).
    shown = set(re.findall(r"schedproj_[a-z0-9_]+", DASHBOARD.read_text()))
    assert served - shown == set(), f"served but not on the dashboard: {served - shown}"
    # And the exposition passes Prometheus's own linter, where promtool is installed.
    if shutil.which("promtool"):
        lint = run(["promtool", "check", "metrics"], stdin=body, check=False)
        assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.slow
def test_heavy_scales_out_each_replica_its_own_worker(scaled_out: Deployment) -> None:
    rows = scaled_out.containers("heavy")
    assert len(rows) == HEAVY_REPLICAS
    assert all(row["State"] == "running" and row["Health"] == "healthy" for row in rows), rows
    # On the host's network every replica has the host's name: each is named after its
    # container, so Flower (and the lease's holder) tells them apart.
    names = flower_workers(scaled_out, HEAVY_REPLICAS)
    heavy = {n.split("@")[0] for n in names if n.startswith("heavy-")}
    assert heavy == {f"heavy-{row['ID'][:12]}" for row in rows}, (heavy, rows)


@pytest.mark.slow
def test_killing_the_lease_holders_container_moves_the_lease_within_its_ttl(
        scaled_out: Deployment) -> None:
    deployment = scaled_out
    r = deployment.redis()
    heavy_ids = {row["ID"][:12] for row in deployment.containers("heavy")}
    held = wait_for(lambda: (lambda x: x if x and x.get("started_at") else None)(lease(r)),
                    60, "a heavy run to hold the lease", poll_s=0.05)
    victim = container_of(held["node"])
    assert victim in heavy_ids, (held, heavy_ids)

    killed_at = time.time()
    run(["docker", "kill", victim])
    freed_s = moved_s = None
    deadline = time.monotonic() + LEASE_TTL_S + 30
    new: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        now = lease(r)
        if freed_s is None and (now is None or now["fence"] != held["fence"]):
            freed_s = time.time() - killed_at
        if now and now["fence"] != held["fence"] and now.get("started_at"):
            moved_s, new = time.time() - killed_at, now
            break
        time.sleep(0.02)
    deployment.figures["lease free after the holder's container is killed"] = freed_s or -1
    deployment.figures["lease held by another replica after the kill"] = moved_s or -1
    assert freed_s is not None and freed_s <= LEASE_TTL_S + 0.5, (
        f"the lease was freed {freed_s} s after the kill (TTL {LEASE_TTL_S} s)")
    assert new is not None and moved_s is not None, "no other replica took the lease"
    assert moved_s <= LEASE_TTL_S + 3, f"the lease moved after {moved_s} s"
    assert new["fence"] > held["fence"]
    successor = container_of(new["node"])
    assert successor != victim and successor in heavy_ids

    # The killed run never ended; no two heavy runs overlapped (the killed one ends at the
    # kill), in the journal and in the lanes' own run records.
    entries = journal(r)
    assert not [e for e in entries if e["ev"] == "end" and e["fence"] == held["fence"]
                and e["lane"] in LEASE_LANES]
    assert_no_overlap(heavy_intervals(entries, {held["fence"]: killed_at}))
    records = sorted((x["start"], x["end"], x["fence"]) for x in
                     map(json.loads, r.lrange(f"{PREFIX}:e2e:runs", 0, -1))
                     if x["lane"] == "e2e.long")
    assert_no_overlap(records)
    # The successor's run goes on to its end under the new fence.
    wait_for(lambda: any(e["ev"] == "end" and e["fence"] == new["fence"]
                         and e["lane"] in LEASE_LANES for e in journal(r)),
             30, "the successor's run to end", poll_s=0.2)
    assert_no_overlap(heavy_intervals(journal(r), {held["fence"]: killed_at}))


@pytest.mark.slow
def test_killing_beats_container_restarts_it_and_dispatching_resumes(
        deployment: Deployment) -> None:
    r = deployment.redis()
    (row,) = deployment.containers("beat")
    before = deployment.inspect(row["ID"])
    assert before["HostConfig"]["RestartPolicy"]["Name"] == "unless-stopped"
    info_before = r.hgetall(f"{PREFIX}:beat:info")
    assert info_before, "an active beat is recorded"
    # A crash: SIGKILL to the container's first process, from the host. (`docker kill` is a
    # manual stop, which restart policies honour by leaving the container down.)
    killed_at = time.time()
    os.kill(int(before["State"]["Pid"]), signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        now = deployment.inspect(row["ID"])
        return now if now["RestartCount"] > before["RestartCount"] and (
            now["State"]["Running"]) else None

    wait_for(restarted, 60, "beat's container to be restarted by its policy", poll_s=0.2)
    deployment.figures["beat container back after SIGKILL"] = time.time() - killed_at

    def dispatched_after() -> bool:
        info = r.hgetall(f"{PREFIX}:beat:info")
        if not info or info.get("token") == info_before.get("token"):
            return False
        return any(entry["t"] > killed_at and entry.get("beat") == info["token"][:8]
                   for entry in map(json.loads, r.lrange(f"{PREFIX}:dispatch-log", -50, -1)))

    wait_for(dispatched_after, 60, "the restarted beat to dispatch again", poll_s=0.2)
    deployment.figures["dispatching again after beat's SIGKILL"] = time.time() - killed_at
    wait_for(lambda: deployment.inspect(row["ID"])["State"].get("Health", {}).get("Status")
             == "healthy", 90, "beat healthy again", poll_s=1)


def test_down_v_leaves_no_container_network_or_volume(deployment: Deployment) -> None:
    deployment.compose("down", "-v", "--timeout", STOP_TIMEOUT_S, timeout=180)
    for kind in ("container", "network", "volume"):
        assert labelled(kind, deployment.project) == [], f"{kind}s left by down -v"
    assert host_interfaces() == deployment.interfaces_before
    with pytest.raises(redis.ConnectionError):
        deployment.redis().ping()
