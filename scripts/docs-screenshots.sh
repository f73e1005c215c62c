#!/usr/bin/env bash
# Builds the documentation site and looks at it in a real browser: headless Chromium
# (Debian's `chromium`, installed if missing) takes screenshots of the home page and one
# guide, served over HTTP from 127.0.0.1, into docs/screenshots/ (or $1).
#
#   bash scripts/docs-screenshots.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-docs/screenshots}"
PYTHON="${PYTHON:-${SHARDFLOW_TEST_VENV:-$HOME/.cache/shardflow/test-venv}/bin/python}"

if ! command -v chromium >/dev/null; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get install -y -q chromium >/dev/null
fi

SITE="$(mktemp -d)"
NO_MKDOCS_2_WARNING=1 TF_CPP_MIN_LOG_LEVEL=3 "$PYTHON" -m mkdocs build --strict --quiet --site-dir "$SITE"
PORT="$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$PYTHON" -m http.server "$PORT" --bind 127.0.0.1 --directory "$SITE" >/dev/null 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null; rm -rf "$SITE"' EXIT
for _ in $(seq 50); do
    curl -sf "http://127.0.0.1:$PORT/" >/dev/null && break
    sleep 0.1
done

mkdir -p "$OUT"
shoot() {  # shoot PAGE NAME
    chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1000 \
        --screenshot="$OUT/$2.png" "http://127.0.0.1:$PORT/$1" >/dev/null 2>&1
    echo "$OUT/$2.png"
}
shoot "" home
shoot "pytorch-tensorflow/" pytorch-guide
