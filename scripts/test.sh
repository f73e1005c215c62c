#!/usr/bin/env bash
# Installs everything the tests need and builds the wheel, then runs the whole suite:
# Rust unit and integration tests, the Python tests (among them, the wheel installed
# into a fresh venv), and a check that the type stubs match the extension. Exits
# non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

# Build outputs live outside the clone so later runs (and CI) reuse them.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/shardflow/target}"
PYTHON="${PYTHON:-python3}"

echo "== real test data: Debian's Fashion-MNIST"
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get install -y -q dataset-fashion-mnist >/dev/null \
        || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q dataset-fashion-mnist >/dev/null; }
fi

echo "== installing shardflow (editable, release build) and test dependencies"
"$PYTHON" -m pip install --quiet --editable ".[test]"
# The test extra's cmake (which builds libhdf5 for `cargo test`) and console scripts.
export PATH="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"

echo "== building the wheel users install (the Python tests install it into a fresh venv)"
export SHARDFLOW_WHEEL_DIR="${SHARDFLOW_WHEEL_DIR:-$HOME/.cache/shardflow/wheels}"
bash scripts/build-wheel.sh

echo "== Rust tests, the example and the API documentation"
cargo test --release --locked
cargo test --release --locked --examples
cargo bench --locked --no-run --quiet
# Warnings (a missing doc comment, a broken link) fail the build.
RUSTDOCFLAGS="-D warnings" cargo doc --locked --no-deps

echo "== Python tests"
# The tensorflow and torch wheels abort when loaded into one process (both register
# the same LLVM options), so the TensorFlow tests run in a process of their own.
"$PYTHON" -m pytest tests --ignore=tests/tensorflow "$@"
"$PYTHON" -m pytest tests/tensorflow "$@"

echo "== type stubs match the extension"
"$PYTHON" -m mypy.stubtest shardflow._native
