#!/usr/bin/env bash
# Runs the model-based tests (tests/test_model.py) with many more generated examples than
# CI does: SHARDFLOW_MODEL_EXAMPLES in all (default 20,000, shared among the file's tests
# as in CI), no per-test timeout, and prints how many examples ran. Expects shardflow and
# the test dependencies installed (scripts/test.sh does both). Extra arguments go to
# pytest (e.g. -k loader, or --hypothesis-seed=1).
#
#   bash scripts/model-long.sh            # 20,000 examples
#   bash scripts/model-long.sh 100000 -x
set -euo pipefail
cd "$(dirname "$0")/.."
EXAMPLES="${1:-20000}"
shift || true
PYTHON="${PYTHON:-${SHARDFLOW_TEST_VENV:-$HOME/.cache/shardflow/test-venv}/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
LOG="$(mktemp -t model-long.XXXXXX.log)"
echo "== tests/test_model.py with SHARDFLOW_MODEL_EXAMPLES=$EXAMPLES (log: $LOG)"
start=$SECONDS
status=0
SHARDFLOW_MODEL_EXAMPLES="$EXAMPLES" "$PYTHON" -m pytest tests/test_model.py -p no:cacheprovider \
    --timeout=0 --hypothesis-show-statistics -ra "$@" 2>&1 | tee "$LOG" || status=$?
# Hypothesis' statistics, per test and phase: "- N passing, M failing, and K invalid test cases".
read -r passing failing invalid < <(grep -aE '[0-9]+ passing.*[0-9]+ failing.*[0-9]+ invalid' "$LOG" |
    sed -E 's/[^0-9]+/ /g' | awk '{p += $1; f += $2; i += $3} END {print p + 0, f + 0, i + 0}')
echo "== $passing passing, $failing failing and $invalid invalid generated examples in $((SECONDS - start)) s (pytest exit status $status)"
exit "$status"
