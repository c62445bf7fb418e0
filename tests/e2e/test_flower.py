"""Flower sees both queues' workers and every lane's runs, and only behind its basic auth.

Real processes: Flower on loopback (``celery -A schedproj.app flower --basic-auth=...``), then a
heavy and a light worker and ``beat -S fair`` on the ``deadline`` scenario (a heavy lane and a
light lane, cadences of a second), all sharing one environment; checked through Flower's HTTP API.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.conftest import E2E_REDIS_URL
from tests.procs import FAST_SETTINGS, Cluster, Proc, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

USER, PASSWORD = "flower-user", "flower-e2e-pass"
HEAVY_TASK, LIGHT_TASK = "e2e.quick", "e2e.slowlight"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str, auth: tuple[str, str] | None = (USER, PASSWORD)) -> tuple[int, Any]:
    """GET ``url``: (status, decoded JSON body or text); (0, error) if nothing answers."""
    headers = {}
    if auth is not None:
        pair = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        headers["Authorization"] = f"Basic {pair}"
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            body = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body


def _cluster(tmp_path: Path) -> Cluster:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SENTRY_", "SCHEDPROJ_"))}
    env.update(FAST_SETTINGS)
    env.update({
        "CELERY_BROKER_URL": E2E_REDIS_URL,
        "SCHEDPROJ_REDIS_URL": E2E_REDIS_URL,
        "SCHEDPROJ_KEY_PREFIX": "schedproj",
        "E2E_SCENARIO": "deadline",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    })
    return Cluster(env=env, logdir=tmp_path)


def _worker(c: Cluster, name: str, queue: str, *extra: str) -> Proc:
    """A worker started as workers/heavy.sh and workers/light.sh start them (heartbeats on,
    so Flower also sees it online from its events)."""
    proc = c.start(name, "worker", "-Q", queue, *extra, "-n", f"{name}@%h",
                   "--without-gossip", "--without-mingle", "-l", "info")
    wait_for(lambda: "ready." in proc.text() or not proc.alive(), 30, f"{name} ready")
    assert proc.alive(), proc.text()
    return proc


def _by_prefix(workers: dict[str, Any], prefix: str) -> dict[str, Any] | None:
    return next((info for name, info in workers.items() if name.startswith(prefix)), None)


def test_flower_sees_both_queues_behind_basic_auth(e2e_redis: redis.Redis,
                                                   tmp_path: Path) -> None:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    c = _cluster(tmp_path)
    try:
        flower = c.start("flower", "flower", "--address=127.0.0.1", f"--port={port}",
                         f"--basic-auth={USER}:{PASSWORD}", "--persistent=False")
        wait_for(lambda: _get(f"{base}/healthcheck", auth=None)[0] == 200
                 or not flower.alive(), 30, "Flower answering on loopback")
        assert flower.alive(), flower.text()

        # Behind auth: no credentials or wrong ones are refused, the UI too.
        for path in ("/api/workers", "/api/tasks", "/"):
            assert _get(base + path, auth=None)[0] == 401, path
        assert _get(f"{base}/api/workers", auth=(USER, "wrong"))[0] == 401

        _worker(c, "heavy1", "heavy", "-c", "1")
        _worker(c, "light1", "light", "-c", "2")
        c.beat("beat1")

        def workers() -> dict[str, Any] | None:
            status, body = _get(f"{base}/api/workers?refresh=1")
            if status != 200 or not isinstance(body, dict):
                return None
            seen = _by_prefix(body, "heavy1@") and _by_prefix(body, "light1@")
            return body if seen else None

        found = wait_for(workers, 20, "both workers in /api/workers", poll_s=0.5)
        assert isinstance(found, dict)
        for prefix, queue in (("heavy1@", "heavy"), ("light1@", "light")):
            info = _by_prefix(found, prefix)
            assert info is not None
            assert [q["name"] for q in info["active_queues"]] == [queue], info["active_queues"]
            assert HEAVY_TASK in info["registered"] and LIGHT_TASK in info["registered"]

        def tasks() -> dict[str, Any] | None:
            status, body = _get(f"{base}/api/tasks")
            if status != 200 or not isinstance(body, dict):
                return None
            done = {(t.get("name"), (t.get("worker") or "").split("@")[0])
                    for t in body.values() if t.get("state") == "SUCCESS"}
            return body if {(HEAVY_TASK, "heavy1"), (LIGHT_TASK, "light1")} <= done else None

        seen = wait_for(tasks, 30, "both lanes' runs in /api/tasks", poll_s=0.5)
        assert isinstance(seen, dict)
        # Each lane ran on its own queue's worker only.
        for task in seen.values():
            worker = (task.get("worker") or "").split("@")[0]
            if task.get("name") == HEAVY_TASK and worker:
                assert worker == "heavy1", task
            if task.get("name") == LIGHT_TASK and worker:
                assert worker == "light1", task

        # Flower's own events view of the workers: online (heartbeats).
        status, alive = _get(f"{base}/api/workers?status=1")
        assert status == 200
        assert {n.split("@")[0] for n, up in alive.items() if up} >= {"heavy1", "light1"}
        assert PASSWORD not in flower.text()
    finally:
        c.stop_all()
