#!/usr/bin/env bash
# The long soak: tests/test_soak.py's epochs under faults for SECONDS (default 1800,
# 30 minutes) instead of CI's 60, then its other checks.
#
#   bash scripts/soak.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-1800}"
SHARDFLOW_SOAK_SECONDS="$seconds" python3 -m pytest tests/test_soak.py -s \
    --timeout="$((seconds + 600))" -p no:cacheprovider
