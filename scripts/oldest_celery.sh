#!/usr/bin/env bash
# The core end-to-end tests on the oldest Celery schedproj supports (pyproject.toml: celery>=5.5,
# redis>=5.0), in a second virtualenv (.venv-oldest, kept between runs): real beat and worker
# processes of Celery 5.5.0 with redis-py 5.0.0, on the Redis broker. The newest versions are
# tested by the whole suite in .venv. scripts/test.sh runs this after the main suite; options
# pass through to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OLDEST_CELERY=5.5.0
OLDEST_REDIS=5.0.0
venv=.venv-oldest
marker="$venv/.celery-$OLDEST_CELERY-redis-$OLDEST_REDIS"
if [ ! -f "$marker" ]; then
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  constraints=$(mktemp)
  trap 'rm -f "$constraints"' EXIT
  printf 'celery==%s\nredis==%s\n' "$OLDEST_CELERY" "$OLDEST_REDIS" > "$constraints"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-compile \
    -c "$constraints" ".[test]" 2>&1 | grep -v "^WARNING: Location" || true
  "$venv/bin/python" - "$OLDEST_CELERY" "$OLDEST_REDIS" <<'PY'
import sys
from importlib.metadata import version
got = (version("celery"), version("redis"))
assert got == (sys.argv[1], sys.argv[2]), f"the oldest venv holds celery/redis {got}"
PY
  touch "$marker"
fi
echo "oldest supported: celery $("$venv/bin/python" -c 'import celery; print(celery.__version__)'), kombu $("$venv/bin/python" -c 'import kombu; print(kombu.__version__)'), redis-py $("$venv/bin/python" -c 'import redis; print(redis.__version__)')"
# The checkout's code (PYTHONPATH wins over the copy installed for its entry points and deps).
exec env PYTHONPATH="$PWD" "$venv/bin/python" -m pytest -p no:cacheprovider -m "not slow" \
  -k "redis" tests/e2e/test_heavy_and_light_lanes.py "$@"
