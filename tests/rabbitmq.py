"""RabbitMQ as the broker in tests: a private vhost per test session on the local server.

The server at 127.0.0.1:5672 (``.ci/run`` starts it when nothing answers) may have other
users, so a session makes its own vhost with ``rabbitmqctl add_vhost`` and deletes it at the
end; each test starts from empty ``heavy`` and ``light`` queues in it. ``TEST_AMQP_URL`` names
a vhost to use as it is instead (no rabbitmqctl needed; the tests delete and re-declare its
``heavy`` and ``light`` queues).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

#: The server the session's vhost is made on (guest may log in from loopback only).
SERVER_URL = "amqp://guest:guest@127.0.0.1:5672"
#: A heavy hard time limit below RabbitMQ's default consumer_timeout (30 min), as a RabbitMQ
#: deployment with that default must configure it.
HEAVY_TIME_LIMIT_S = "1200"


@dataclass(frozen=True)
class Broker:
    """The broker an end-to-end test runs on, and what its processes' environment needs."""

    kind: str  # "redis" or "amqp"
    url: str
    env: dict[str, str] = field(default_factory=dict)


def problem(url: str) -> str | None:
    """Why nothing usable answers at ``url``, or None."""
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=5)
    except Exception as exc:  # kombu raises many kinds; any of them means "not usable"
        return f"{type(exc).__name__}: {exc}"
    return None


def rabbitmqctl(*args: str) -> str:
    binary = shutil.which("rabbitmqctl")
    if binary is None:
        raise RuntimeError("rabbitmqctl is not installed (set TEST_AMQP_URL to use a vhost "
                           "made elsewhere)")
    done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {done.stderr.strip() or done.stdout}")
    return done.stdout


@functools.cache
def server_consumer_timeout_s() -> float | None:
    """The server's consumer_timeout in seconds, as ``rabbitmqctl eval`` reports it (None when
    it cannot be read; 0 when the server has it disabled)."""
    try:
        out = rabbitmqctl("eval", "application:get_env(rabbit, consumer_timeout).")
    except (RuntimeError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"\{ok,\s*(\d+)\}", out)
    if found:
        return int(found.group(1)) / 1000.0
    return 0.0 if out.strip() in ("undefined", "{ok,false}", "{ok,undefined}") else None


def session_vhost() -> Iterator[str]:
    """The broker URL of a fresh vhost for this session; deleted afterwards."""
    given = os.environ.get("TEST_AMQP_URL")
    if given:
        yield given
        return
    vhost = f"schedproj-test-{uuid.uuid4().hex[:10]}"
    rabbitmqctl("add_vhost", vhost)
    try:
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield f"{SERVER_URL}/{vhost}"
    finally:
        rabbitmqctl("delete_vhost", vhost)


def empty_queues(url: str, names: tuple[str, ...] = ("heavy", "light")) -> None:
    """Delete the named queues (with whatever an earlier test left in them)."""
    from kombu import Connection

    with Connection(url, connect_timeout=5) as conn:
        channel = conn.channel()
        try:
            for name in names:
                channel.queue_delete(name)
        finally:
            channel.close()


def queue_depth(url: str, name: str) -> int:
    """Messages ready in queue ``name`` (0 if it does not exist yet)."""
    from amqp.exceptions import NotFound
    from kombu import Connection

    with Connection(url, connect_timeout=5) as conn:
        channel = conn.channel()
        try:
            _, depth, _ = channel.queue_declare(name, passive=True)
            return int(depth)
        except NotFound:
            return 0
        finally:
            if channel.is_open:
                channel.close()


def amqp_env(url: str) -> dict[str, str]:
    """What a process running on the RabbitMQ broker at ``url`` needs in its environment:
    the broker URL and a heavy time limit below the server's consumer_timeout."""
    env = {"CELERY_BROKER_URL": url, "SCHEDPROJ_HEAVY_TIME_LIMIT_S": HEAVY_TIME_LIMIT_S}
    timeout = server_consumer_timeout_s()
    if timeout is not None:
        env["SCHEDPROJ_RABBITMQ_CONSUMER_TIMEOUT_S"] = f"{timeout:g}"
        if 0 < timeout <= float(HEAVY_TIME_LIMIT_S):
            env["SCHEDPROJ_HEAVY_TIME_LIMIT_S"] = f"{timeout / 2:g}"
            env["SCHEDPROJ_LIGHT_TIME_LIMIT_S"] = f"{timeout / 2:g}"
    return env
