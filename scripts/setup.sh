#!/usr/bin/env bash
# Prepare a fresh machine: a virtualenv with schedproj and its test tools, and the
# redis-server binary (Debian package) if it is missing. With --start-redis, also start a
# Redis on SETUP_REDIS_HOST:SETUP_REDIS_PORT unless one already answers there.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -U pip
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test,bench]"

if ! command -v redis-server >/dev/null 2>&1; then
  echo "setup: installing redis-server (Debian package)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server
fi

[ "${1:-}" = "--start-redis" ] || exit 0
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
