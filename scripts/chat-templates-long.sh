#!/usr/bin/env bash
# Renders every TRL chat template on many more generated conversations than CI does
# (SHARDFLOW_CHAT_EXAMPLES per template, default 2,000), comparing with transformers, and
# prints the counts. Expects shardflow and the test dependencies installed (scripts/test.sh
# does both). Extra arguments go to pytest (e.g. -k qwen).
#
#   bash scripts/chat-templates-long.sh           # 2,000 conversations per template
#   bash scripts/chat-templates-long.sh 5000 -x
set -euo pipefail
cd "$(dirname "$0")/.."
EXAMPLES="${1:-2000}"
shift || true
PYTHON="${PYTHON:-${SHARDFLOW_TEST_VENV:-$HOME/.cache/shardflow/test-venv}/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
start=$SECONDS
SHARDFLOW_CHAT_EXAMPLES="$EXAMPLES" "$PYTHON" -m pytest tests/test_chat_template.py -p no:cacheprovider \
    --timeout=0 -q "$@"
echo "== $EXAMPLES conversations per template in $((SECONDS - start)) s"
