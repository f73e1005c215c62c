#!/usr/bin/env bash
# Builds the release wheel (scripts/build-wheel.sh: sdist, then the fat-LTO manylinux_2_17
# wheel from it, audited) and runs tests/test_wheel.py on it: its tags, and a fresh venv
# with no Rust on PATH that installs it, runs the demo and reads from S3. Run it before a
# release; scripts/test.sh runs the same tests on a wheel of its own (faster) build.
set -euo pipefail
cd "$(dirname "$0")/.."
export SHARDFLOW_WHEEL_DIR="${SHARDFLOW_WHEEL_DIR:-dist}"
bash scripts/build-wheel.sh
PYTHON="${PYTHON:-$HOME/.cache/shardflow/test-venv/bin/python}"
[ -x "$PYTHON" ] || { echo "no test venv at $PYTHON: run scripts/test.sh once first" >&2; exit 1; }
SHARDFLOW_RELEASE_WHEEL=1 "$PYTHON" -m pytest tests/test_wheel.py "$@"
