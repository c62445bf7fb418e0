#!/usr/bin/env bash
# The test command: set up, lint, type-check, then the default test suite (everything except
# the long runs marked `slow`; run those with `scripts/test.sh -m slow`), then the core
# end-to-end tests on the oldest supported Celery in a second virtualenv
# (scripts/oldest_celery.sh; skipped when options are given, e.g. to run one test file).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --start-redis
.venv/bin/ruff check schedproj tests bench
.venv/bin/mypy
.venv/bin/python -m pytest -m "not slow" "$@"
if [ "$#" -eq 0 ]; then
  bash scripts/oldest_celery.sh -q
fi
