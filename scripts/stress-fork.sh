#!/usr/bin/env bash
# With every core busy (stress-ng, from Debian's package): runs the forked-torch-workers
# training loop test (2 ranks x 2 workers, local and S3) N times in a row (default 50),
# each in a fresh pytest process, then scripts/fork_storm.py (torch workers forked while
# shardflow's threads run Python maps), which hung in 2 of 3 runs before the fix. Stops at
# the first failure or hang (pytest-timeout's 300 s; torch's timeout= in the storm).
# Usage: scripts/stress-fork.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-50}"
PYTHON="${PYTHON:-$HOME/.cache/shardflow/test-venv/bin/python}"
export PATH="$(dirname "$PYTHON"):$PATH"  # the venv's weed (SeaweedFS), as scripts/test.sh has it
command -v stress-ng >/dev/null || apt-get install -y -q stress-ng >/dev/null \
    || { apt-get update -q >/dev/null && apt-get install -y -q stress-ng >/dev/null; }
stress-ng --cpu "$(nproc)" --timeout 0 >/dev/null 2>&1 &
load=$!
trap 'kill "$load" 2>/dev/null; wait "$load" 2>/dev/null || true' EXIT
start=$SECONDS
for i in $(seq 1 "$runs"); do
    "$PYTHON" -m pytest -q -p no:cacheprovider \
        tests/test_training_loops.py -k two_ranks_of_two_torch_workers \
        > "/tmp/stress-fork-$$.log" 2>&1 || { cat "/tmp/stress-fork-$$.log"; echo "run $i of $runs failed"; exit 1; }
    echo "run $i: $(tail -n 1 "/tmp/stress-fork-$$.log")"
done
rm -f "/tmp/stress-fork-$$.log"
echo "$runs runs passed under load in $((SECONDS - start)) s"
"$PYTHON" scripts/fork_storm.py 400 3
