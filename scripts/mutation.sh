#!/usr/bin/env bash
# Mutation testing of the pure core (issue 18 item 6) — NOT part of the default test run.
#
#   scripts/mutation.sh [MODULE ...]     e.g. scripts/mutation.sh gates pressure
#
# Copies the working tree to a temporary folder (never mutates this one), runs mutmut 3.8 there
# on the given schedproj/core modules (default: the list below) against the fast pure core
# tests (tests/core), and prints killed/total per module. "Killed" counts mutants a test
# failed on (or timed out on); a mutant no test reaches counts as not killed. The copy is kept
# (its path is printed) so survivors can be read: cd there and `mutmut show <name>`.
# Environment: JOBS (mutmut --max-children, default 1), MUTMUT (default .venv/bin/mutmut).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MUTMUT=${MUTMUT:-$ROOT/.venv/bin/mutmut}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
MODULES=("$@")
if [ ${#MODULES[@]} -eq 0 ]; then
    MODULES=(codec deferrals due dueindex families gates health lanes laneset lifecycle lostruns
             picker pipeline planner pressure records views)
fi
for module in "${MODULES[@]}"; do
    [ -f "$ROOT/schedproj/core/$module.py" ] || { echo "no module schedproj/core/$module.py" >&2; exit 2; }
done
[ -x "$MUTMUT" ] || { echo "mutmut not found: .venv/bin/pip install -e '.[mutation]'" >&2; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/schedproj-mutation.XXXXXX")
rsync -a --exclude .venv --exclude .git --exclude mutants --exclude '*.egg-info' \
    "$ROOT/" "$WORK/"
if grep -q '^\[tool\.mutmut\]' "$WORK/pyproject.toml"; then
    echo "pyproject.toml already has [tool.mutmut]; this script writes its own" >&2; exit 2
fi
only=$(printf '"schedproj/core/%s.py", ' "${MODULES[@]}")
cat >> "$WORK/pyproject.toml" <<EOF

[tool.mutmut]
source_paths = ["schedproj"]
only_mutate = [${only%, }]
pytest_add_cli_args_test_selection = ["tests/core"]
pytest_add_cli_args = ["-p", "no:cacheprovider", "-q"]
EOF
echo "mutating ${MODULES[*]} in $WORK" >&2
(cd "$WORK" && nice -n 10 "$MUTMUT" run --max-children "${JOBS:-1}" >"$WORK/mutmut.log" 2>&1) || {
    tail -c 2000 "$WORK/mutmut.log" >&2; exit 1; }

cd "$WORK" && "$PYTHON" - "${MODULES[@]}" <<'EOF'
"""killed/total per module, from mutmut's result files (exit codes as mutmut reads them)."""
import json
import sys
from pathlib import Path

from mutmut.stats import status_by_exit_code

KILLED = {"killed", "timeout", "caught by type check"}
print(f"{'module':<12} {'killed':>6} {'total':>6} {'%':>6}  survivors")
for module in sys.argv[1:]:
    meta = json.loads(Path(f"mutants/schedproj/core/{module}.py.meta").read_text())
    codes = meta["exit_code_by_key"]
    killed = sum(status_by_exit_code[c] in KILLED for c in codes.values())
    left = sorted(k.removeprefix(f"schedproj.core.{module}.")
                  for k, c in codes.items() if status_by_exit_code[c] not in KILLED)
    pct = 100.0 * killed / len(codes) if codes else 100.0
    print(f"{module:<12} {killed:>6} {len(codes):>6} {pct:>5.1f}%  {' '.join(left)}")
EOF
echo "copy kept at $WORK (mutmut show <name> there; rm -rf it when done)" >&2
