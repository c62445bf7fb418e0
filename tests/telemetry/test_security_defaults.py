"""Security defaults: JSON only, credentials never printed, endpoints on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from celery import Celery

from schedproj import Settings, configure_app
from schedproj.devtools.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_json_only_everywhere() -> None:
    app = configure_app(Celery("sec", set_as_current=False), Settings.load())
    conf = app.conf
    assert conf.accept_content == ["json"] and conf.result_accept_content == ["json"]
    assert conf.task_serializer == conf.result_serializer == conf.event_serializer == "json"


def test_status_never_prints_the_redis_password() -> None:
    url = f"redis://admin:s3cret-pw@127.0.0.1:{free_port()}/0"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDPROJ_")}
    env.update({"SCHEDPROJ_REDIS_URL": url, "CELERY_BROKER_URL": url,
                "PYTHONPATH": str(ROOT)})
    out = subprocess.run([sys.executable, "-m", "schedproj.ops.cli", "status"], env=env,
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode != 0
    assert "s3cret-pw" not in out.stdout + out.stderr
    assert "admin:***@127.0.0.1" in out.stderr


def test_http_endpoints_default_to_loopback() -> None:
    settings = Settings.load()
    assert settings.metrics_host == "127.0.0.1" and settings.metrics_port is None
    assert not settings.sentry_send_default_pii
