#!/usr/bin/env bash
# The test command: set up, lint, type-check, then the default test suite (everything except
# the long runs marked `slow`; run those with `scripts/test.sh -m slow`), then the core
# end-to-end tests on the oldest supported Celery in a second virtualenv
# (scripts/oldest_celery.sh). With options (e.g. one test file, or `-m slow`) it runs pytest
# once with them, nothing else.
#
# The default run goes in two streams at once: the end-to-end tests (tests/e2e: mostly real
# processes waiting on cadences, little CPU) in the foreground, and the rest of the suite
# followed by the oldest-Celery run in the background. The streams keep apart by Redis
# database (e2e: 13-15, the rest: 9-11, the oldest Celery: 6-8; every test reads its databases
# from TEST_REDIS_URL / TEST_E2E_REDIS_URL), each pytest session makes its own RabbitMQ vhost,
# and every private server or container listens on a free port of its own. Run one after the
# other, the two took 20 minutes here; side by side, about the time of the longer one.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --start-redis
.venv/bin/ruff check schedproj tests bench
.venv/bin/mypy
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -m "not slow" "$@"
fi

redis_host=${TEST_REDIS_HOST:-redis://127.0.0.1:6379}
rest_log=$(mktemp "${TMPDIR:-/tmp}/schedproj-tests-rest.XXXXXX")
(
  status=0
  TEST_REDIS_URL=$redis_host/10 TEST_E2E_REDIS_URL=$redis_host/11 \
    .venv/bin/python -m pytest -m "not slow" --ignore=tests/e2e || status=$?
  TEST_REDIS_URL=$redis_host/7 TEST_E2E_REDIS_URL=$redis_host/8 \
    bash scripts/oldest_celery.sh -q || status=$((status ? status : 1))
  exit "$status"
) > "$rest_log" 2>&1 &
rest=$!
# Should this script be stopped, the background stream stops with it.
trap 'kill "$rest" 2>/dev/null || true' EXIT

e2e_status=0
TEST_REDIS_URL=$redis_host/14 TEST_E2E_REDIS_URL=$redis_host/15 \
  .venv/bin/python -m pytest -m "not slow" tests/e2e || e2e_status=$?
rest_status=0
wait "$rest" || rest_status=$?
trap - EXIT
echo
echo "=== the rest of the suite, then the oldest supported Celery (run beside the e2e tests) ==="
cat "$rest_log"
rm -f "$rest_log"
echo "test.sh: end-to-end tests exit $e2e_status; the rest and the oldest Celery exit $rest_status"
[ "$e2e_status" -eq 0 ] && [ "$rest_status" -eq 0 ]
