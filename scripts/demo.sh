#!/usr/bin/env bash
# The main job: install what the demo needs (`setup.sh --demo`: the package and a Redis
# server binary, no test tools), then `schedproj demo` — the original's forensic backlog
# drained to idle by real beat and worker processes. Options pass through, e.g.
# `scripts/demo.sh --policy registry` or `scripts/demo.sh --json`. Uses the Redis at
# CELERY_BROKER_URL, else a local one (database 11), else a private one it starts itself and
# declares a new deployment (no state-loss quarantine: nothing ever ran on it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --demo
exec .venv/bin/schedproj demo "$@"
