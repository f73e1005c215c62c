#!/usr/bin/env bash
# Runs the tests marked `slow` (skipped by scripts/test.sh): Arrow columns past 2 GiB
# of bytes. They take a minute or two and about 8.5 GB of memory. Expects shardflow and the
# test dependencies installed (scripts/test.sh does both).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
SHARDFLOW_SLOW_TESTS=1 "$PYTHON" -m pytest tests --ignore=tests/tensorflow -m slow "$@"
