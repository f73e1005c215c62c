#!/usr/bin/env bash
# The zero-copy tests (numpy views of Arrow buffers, the Arrow C data interface) against
# a debug build of the extension (debug assertions and overflow checks on) under
# CPython's debug allocator (PYTHONMALLOC=debug), which checks every Python allocation
# for overruns, double frees and use after free. The build goes into a venv of its own
# (~/.cache/shardflow/debug-venv) that sees this machine's other packages.
#
#   bash scripts/debug-zero-copy.sh [PYTEST_ARGS ...]
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
venv="$HOME/.cache/shardflow/debug-venv"
[ -x "$venv/bin/python" ] || python3 -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install --quiet --ignore-installed "maturin>=1.9,<2"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/shardflow/target}"
wheels="$(mktemp -d)"
"$venv/bin/maturin" build --profile dev --out "$wheels" --interpreter "$venv/bin/python"
"$venv/bin/python" -m pip install --quiet --force-reinstall --no-deps "$wheels"/*.whl
rm -rf "$wheels"
# Run from outside the checkout, so that the installed debug build is the one imported.
cd /tmp
"$venv/bin/python" -c "import shardflow, sys; assert shardflow.__file__.startswith('$venv'), shardflow.__file__"
PYTHONMALLOC=debug PYTHONFAULTHANDLER=1 "$venv/bin/python" -m pytest "$repo/tests/test_zero_copy.py" \
    -p no:cacheprovider --rootdir "$repo" "$@"
