#!/usr/bin/env bash
# The test command: set up, lint, type-check, then the default test suite (everything except
# the long runs marked `slow`; run those with `scripts/test.sh -m slow`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --start-redis
.venv/bin/ruff check schedproj tests bench
.venv/bin/mypy
exec .venv/bin/python -m pytest -m "not slow" "$@"
