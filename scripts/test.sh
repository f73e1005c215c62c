#!/usr/bin/env bash
# Installs everything the tests need into a virtual environment made from the `test`
# extra alone, builds the crate once (one profile, one feature set: see Cargo.toml), and
# runs the whole suite: Rust unit and integration tests, the Python tests (among them, a
# wheel from that same build installed into a fresh venv), and a check that the type
# stubs match the extension. Prints the wall time of each stage at the end, and exits
# non-zero on any failure.
#
# The release wheel (fat LTO, manylinux_2_17 through zig) is scripts/build-wheel.sh's,
# checked by scripts/release-check.sh; it is not rebuilt on every test run.
set -euo pipefail
cd "$(dirname "$0")/.."

# Build outputs and the test venv live outside the clone so later runs (and CI) reuse them.
CACHE="$HOME/.cache/shardflow"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
VENV="${SHARDFLOW_TEST_VENV:-$CACHE/test-venv}"

timings=()
stage_name=""
stage_start=$SECONDS
stage() {
    if [ -n "$stage_name" ]; then
        timings+=("$(printf '%6d s  %s' $((SECONDS - stage_start)) "$stage_name")")
    fi
    stage_name="$1"
    stage_start=$SECONDS
    [ -n "$1" ] && echo "== $1"
    return 0
}
report() {
    status=$?
    stage ""
    echo "== stage times (wall)"
    printf '%s\n' "${timings[@]}"
    printf '%6d s  total\n' "$SECONDS"
    exit $status
}
trap report EXIT

stage "real test data: Debian's Fashion-MNIST"
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get install -y -q dataset-fashion-mnist >/dev/null \
        || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q dataset-fashion-mnist >/dev/null; }
fi

stage "test venv ($VENV): build tools, then shardflow (editable, release) and the test extra"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PYTHON="$VENV/bin/python"
export PATH="$VENV/bin:$PATH"  # the venv's cmake (libhdf5's build) and console scripts
export PIP_DISABLE_PIP_VERSION_CHECK=1
# The build requirements from pyproject.toml, installed here and used without isolation,
# so the editable install and the test wheel below run the same maturin over the same
# cargo build.
mapfile -t build_requires < <("$PYTHON" -c \
    'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")')
"$PYTHON" -m pip install --quiet "${build_requires[@]}"
"$PYTHON" -m pip install --quiet --no-build-isolation --editable ".[test]"

stage "the venv holds every test dependency"
"$PYTHON" -m pip check
"$PYTHON" scripts/check_test_imports.py

stage "one feature set for the extension's build and cargo test's"
"$PYTHON" scripts/check_features.py

stage "a wheel from the same release build (tests/test_wheel.py installs it into a fresh venv)"
export SHARDFLOW_WHEEL_DIR="${SHARDFLOW_WHEEL_DIR:-$CACHE/wheels}"
rm -f "$SHARDFLOW_WHEEL_DIR"/shardflow-*.whl
"$PYTHON" -m maturin build --release --locked --interpreter "$PYTHON" --out "$SHARDFLOW_WHEEL_DIR"

stage "Rust tests, examples and benches (built, not run)"
cargo test --release --locked
cargo test --release --locked --examples
cargo bench --locked --no-run --quiet

stage "Rust API documentation"
# Warnings (a missing doc comment, a broken link) fail the build.
RUSTDOCFLAGS="-D warnings" cargo doc --release --locked --no-deps

stage "Python tests"
# The tensorflow and torch wheels abort when loaded into one process (both register
# the same LLVM options), so the TensorFlow tests run in a process of their own.
"$PYTHON" -m pytest tests --ignore=tests/tensorflow "$@"

stage "Python tests: TensorFlow"
"$PYTHON" -m pytest tests/tensorflow "$@"

stage "type stubs match the extension"
"$PYTHON" -m mypy.stubtest shardflow._native
