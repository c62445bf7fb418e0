"""Redis with TLS and an ACL user, for real: a private redis-server that speaks only TLS
(``--tls-port``, ``--port 0``) with certificates made here and one password-protected ACL user
(the default user off) carries the broker, the lane state and the lease for real ``celery
beat -S fair`` and heavy and light workers, reached by ``rediss://user:password@...`` with the
CA from ``SCHEDPROJ_REDIS_SSL_CA_CERTS``.

A wrong password, a CA that did not sign the server's certificate, or a plain ``redis://`` URL
against the TLS port: beat, a worker and ``schedproj status`` each say so in one line naming
the setting, with the password masked. The password never reaches a log, the status output, an
error or a Sentry event (tests/sentry_capture.py records what sentry-sdk would send).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from schedproj.devtools.processes import Spawned, spawn
from schedproj.store.connection import connect
from tests.conftest import REDIS_URL, _redis_or_skip, declare_fresh
from tests.procs import FAST_SETTINGS, ROOT, Cluster, wait_for
from tests.sentry_capture import ENV_KEY, ENV_URL, read_captured
from tests.tls_redis import Certs, TlsRedis, make_certs, start_tls_redis

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

USER = "sched"
#: Distinctive, so a leak anywhere is found by a plain substring search.
PASSWORD = "pw-" + uuid.uuid4().hex[:20]
SENTRY_DSN = "http://e2e0tls0public0key@127.0.0.1:9/1"
SCHEDPROJ = str(Path(sys.executable).parent / "schedproj")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    srv = start_tls_redis(tmp_path_factory.mktemp("tls-redis"), USER, PASSWORD)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A CA that did not sign the server's certificate."""
    return make_certs(tmp_path_factory.mktemp("other-ca"), "other")


@pytest.fixture
def capture() -> Iterator[tuple[redis.Redis, str]]:
    """Where the processes' Sentry envelopes go: a list on the plain test Redis."""
    client = _redis_or_skip(REDIS_URL)
    key = f"t-tls-sentry-{uuid.uuid4().hex[:8]}"
    yield client, key
    client.delete(key)
    client.close()


def env_for(server: TlsRedis, capture_key: str, prefix: str, **extra: str) -> dict[str, str]:
    import os

    env = dict(os.environ)
    env.update(FAST_SETTINGS)
    env.update({
        "CELERY_BROKER_URL": server.url(),
        "SCHEDPROJ_REDIS_URL": server.url(),
        "SCHEDPROJ_REDIS_SSL_CA_CERTS": str(server.certs.ca),
        "SCHEDPROJ_KEY_PREFIX": prefix,
        "SCHEDPROJ_LANE_MODULES": "tests.lanes_tls",
        "SENTRY_DSN": SENTRY_DSN,
        ENV_KEY: capture_key,
        ENV_URL: REDIS_URL,
        "PYTHONPATH": str(ROOT),
    })
    env.update(extra)
    return env


def status(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCHEDPROJ, "status"], env={**env, "COLUMNS": "200"},
                          capture_output=True, text=True, timeout=60)


def assert_no_password(where: str, text: str) -> None:
    assert PASSWORD not in text, f"the Redis password leaked into {where}"


def test_beat_and_workers_run_both_queues_over_tls_with_an_acl_user(
        server: TlsRedis, capture: tuple[redis.Redis, str], tmp_path: Path) -> None:
    sentry_redis, key = capture
    prefix = f"tls-{uuid.uuid4().hex[:8]}"
    state = connect(server.url(), tls={"ssl_ca_certs": str(server.certs.ca)})
    declare_fresh(state, prefix)
    cluster = Cluster(env=env_for(server, key, prefix), logdir=tmp_path)
    try:
        cluster.worker("heavy1", "heavy")
        cluster.worker("light1", "light", concurrency=2)
        cluster.beat("beat1")

        def runs() -> list[dict[str, object]]:
            return [json.loads(x) for x in state.lrange(f"{prefix}:tls:runs", 0, -1)]

        def ran(lane: str) -> int:
            return sum(1 for r in runs() if r["lane"] == lane)

        wait_for(lambda: ran("tls.heavy") >= 2 and ran("tls.light") >= 2
                 and ran("tls.broken") >= 1, 40, "heavy and light lanes ran over TLS")
        queues = {r["lane"]: r["queue"] for r in runs()}
        assert queues["tls.heavy"] == "heavy" and queues["tls.light"] == "light"
        # The lease lives on the TLS server too: every heavy run carried a fence from it.
        assert all(int(str(r["fence"])) > 0 for r in runs() if r["lane"] != "tls.light")
        wait_for(lambda: any(r["type"] == "event"
                             for r in read_captured(sentry_redis, key)), 20,
                 "the failing lane's Sentry event")

        shown = status(cluster.env)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert "tls.heavy" in shown.stdout and "tls.light" in shown.stdout
        assert_no_password("schedproj status", shown.stdout + shown.stderr)
    finally:
        cluster.stop_all()
        state.close()
    for proc in cluster.procs:
        assert_no_password(f"the log of {proc.name}", proc.text())
    captured = read_captured(sentry_redis, key)
    events = [r["payload"] for r in captured if r["type"] == "event"]
    assert any("TlsLaneBroke" in json.dumps(e) for e in events), events
    assert_no_password("a Sentry envelope", json.dumps(captured))


#: (case, what to change, the setting the line must name, a phrase it must hold)
BAD_CONFIGS = {
    "wrong-password": ("SCHEDPROJ_REDIS_URL", "refused the credentials"),
    "wrong-ca": ("SCHEDPROJ_REDIS_SSL_CA_CERTS", "not trusted"),
    "plain-url": ("SCHEDPROJ_REDIS_URL", "use rediss://"),
    "broker-password": ("CELERY_BROKER_URL", "refused the credentials"),
}


def bad_env(case: str, server: TlsRedis, other_ca: Certs, key: str) -> dict[str, str]:
    env = env_for(server, key, f"tls-bad-{uuid.uuid4().hex[:6]}")
    if case == "wrong-password":
        env["CELERY_BROKER_URL"] = env["SCHEDPROJ_REDIS_URL"] = server.url(password="wrong-pw")
    elif case == "wrong-ca":
        env["SCHEDPROJ_REDIS_SSL_CA_CERTS"] = str(other_ca.ca)
    elif case == "plain-url":
        env["CELERY_BROKER_URL"] = env["SCHEDPROJ_REDIS_URL"] = server.url(scheme="redis")
    else:  # the state Redis is right, the broker's password is not
        env["CELERY_BROKER_URL"] = server.url(password="wrong-pw")
    return env


def one_failure_line(text: str, process: str) -> str:
    lines = [line for line in text.splitlines() if f"cannot start {process}" in line]
    assert len(lines) == 1, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    return lines[0]


def test_rediss_url_against_a_plain_port_says_so(redis_client: redis.Redis) -> None:
    """The other way round: TLS asked of a plain Redis (the test Redis) times out in the
    handshake; the line says the port is plain."""
    from schedproj.store.connection import describe_failure

    port = redis_client.connection_pool.connection_kwargs["port"]
    url = f"rediss://{USER}:{PASSWORD}@127.0.0.1:{port}/14"
    with pytest.raises(redis.RedisError) as info:
        connect(url, socket_timeout_s=2.0).ping()
    line, fatal = describe_failure(url, info.value, "SCHEDPROJ_REDIS_URL")
    assert fatal and "does not speak TLS" in line and "use redis://" in line, line
    assert_no_password("the line", line)


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_misconfigured_tls_redis_is_one_line_naming_the_setting(
        case: str, server: TlsRedis, other_ca: Certs, capture: tuple[redis.Redis, str],
        tmp_path: Path) -> None:
    sentry_redis, key = capture
    setting, phrase = BAD_CONFIGS[case]
    env = bad_env(case, server, other_ca, key)
    base = [sys.executable, "-m", "celery", "-A", "schedproj.app"]
    procs: dict[str, Spawned] = {
        "beat": spawn("beat", [*base, "beat", "-S", "fair", "-l", "info"], env,
                      tmp_path / "beat.log", cwd=ROOT),
        "worker": spawn("worker", [*base, "worker", "-Q", "heavy", "-c", "1", "-n",
                                   "heavy1@%h", "--without-gossip", "--without-mingle",
                                   "--without-heartbeat", "-l", "info"], env,
                        tmp_path / "worker.log", cwd=ROOT),
    }
    try:
        shown = None if case == "broker-password" else status(env)
        for name, proc in procs.items():
            wait_for(lambda p=proc: not p.alive(), 60, f"{name} to exit")  # type: ignore[misc]
            assert proc.popen.returncode == 2, proc.text()[-3000:]
            line = one_failure_line(proc.text(), name)
            assert setting in line and phrase in line and "Fix:" in line, line
            assert_no_password(f"the {name} output", proc.text())
            assert "wrong-pw" not in proc.text(), proc.text()[-2000:]
    finally:
        for proc in procs.values():
            if proc.alive():
                proc.popen.kill()
                proc.popen.wait()
    if shown is not None:
        out = shown.stdout + shown.stderr
        assert shown.returncode == 1, out
        assert len(out.strip().splitlines()) == 1, out
        assert setting in out and phrase in out and "Traceback" not in out, out
        assert_no_password("schedproj status", out)
        assert "wrong-pw" not in out, out
    assert_no_password("a Sentry envelope", json.dumps(read_captured(sentry_redis, key)))
