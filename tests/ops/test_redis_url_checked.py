"""A malformed Redis URL stops every process at start with one line naming the variable and the
fix, the password masked — not a traceback in status nor a CRITICAL crash in beat."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from schedproj.core.errors import ConfigurationError
from schedproj.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
BAD = {
    "redis://user:s3cret@host:notaport/0": "port",
    "reddis://user:s3cret@host:6379/0": "scheme",
    "redis://user:s3cret@host:6379/zero": "database",
    "redis+sentinel://:s3cret@host:1,other:notaport/mymaster": "sentinel",
    "redis://user:s3cret@host:99999/0": "port",
}


@pytest.mark.parametrize("url", sorted(BAD))
@pytest.mark.parametrize("field", ["redis_url", "audit_redis_url"])
def test_settings_refuse_a_malformed_redis_url(url: str, field: str) -> None:
    with pytest.raises(ConfigurationError) as bad:
        Settings.load(**{field: url})
    text = str(bad.value)
    assert f"SCHEDPROJ_{field.upper()}" in text and "Fix:" in text
    assert "s3cret" not in text


def test_a_malformed_broker_url_names_celery_broker_url() -> None:
    with pytest.raises(ConfigurationError) as bad:
        Settings.load(broker_url="redis://u:s3cret@host:notaport/0")
    assert "CELERY_BROKER_URL" in str(bad.value) and "s3cret" not in str(bad.value)
    # Other brokers' URLs are Celery's business, not checked here.
    Settings.load(broker_url="amqp://guest:guest@localhost:5672//",
                  redis_url="redis://127.0.0.1:6379/0", rabbitmq_consumer_timeout_s=0)


def test_well_formed_urls_load() -> None:
    for url in ("redis://127.0.0.1:6379/0", "rediss://u:p@h:6380/1", "redis://h",
                "unix:///tmp/redis.sock?db=2", "redis+sentinel://a:26379,b/mymaster/0"):
        assert Settings.load(redis_url=url).redis_url == url


@pytest.mark.parametrize("command", [["-m", "schedproj.ops.cli", "status"],
                                     ["-m", "celery", "-A", "schedproj.app", "beat"]])
def test_each_process_says_one_line_and_stops(command: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "SCHEDPROJ_REDIS_URL": "redis://u:s3cret@host:notaport/0"}
    out = subprocess.run([sys.executable, *command], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "SCHEDPROJ_REDIS_URL" in text and "Traceback" not in text, text[-3000:]
    assert "s3cret" not in text and "CRITICAL" not in text
