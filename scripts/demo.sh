#!/usr/bin/env bash
# The main job: set up, then run beat + one worker per queue on the example lanes for a while.
# Pass your own options through, e.g. `scripts/demo.sh --for 300`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/schedproj up --lanes schedproj.examples --for "${DEMO_SECONDS:-45}" "$@"
