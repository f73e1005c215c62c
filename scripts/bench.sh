#!/usr/bin/env bash
# The peer table: builds shardflow and installs the peers into a venv of their own
# (${SHARDFLOW_BENCH_VENV:-~/.cache/shardflow/bench-venv}), then runs
# benches/harness.py, which writes benches/results/<machine>.md and a PNG chart.
# Arguments go to the harness (e.g. --repeats 5, --only parquet,chat, --scale 0.5).
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/shardflow/target}"
VENV="${SHARDFLOW_BENCH_VENV:-$HOME/.cache/shardflow/bench-venv}"
if [ ! -x "$VENV/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$VENV"
fi
# The test extra holds every reference reader the harness compares against.
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check ".[test]" "matplotlib>=3.8"
exec "$VENV/bin/python" benches/harness.py "$@"
