#!/usr/bin/env bash
# Miri (nightly) over the Rust unit tests of the code that builds Arrow buffers from
# untrusted bytes: the NPY/NPZ readers (zero-copy buffers over file bytes, alignment),
# tf.train.Example decoding, TFRecord framing and the record index. (The disk cache's
# tests are left out: Miri cannot set a file's times. One NPZ test is ignored under
# Miri: zlib-rs's drop trips it, upstream issue trifectatechfoundation/zlib-rs#491.)
# The `unsafe` blocks themselves are in src/python (numpy views, the Arrow C data
# interface) and call into CPython, which Miri cannot run; see the README's "Unsafe
# code" section for how those are checked instead.
#
#   bash scripts/miri.sh [TEST_FILTER ...]
set -euo pipefail
cd "$(dirname "$0")/.."
installed="$(rustup +nightly component list --installed)"
grep -q '^miri' <<<"$installed" && grep -q '^rust-src' <<<"$installed" \
    || rustup component add --toolchain nightly miri rust-src
export CARGO_TARGET_DIR="${MIRI_TARGET_DIR:-$HOME/.cache/shardflow/miri-target}"
# libhdf5's build needs cmake: scripts/test.sh's venv has pip's.
venv="${SHARDFLOW_TEST_VENV:-$HOME/.cache/shardflow/test-venv}"
command -v cmake >/dev/null || export PATH="$venv/bin:$PATH"
# Isolation off: the index tests use temporary files.
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-disable-isolation}"
filters=("$@")
if [ "${#filters[@]}" -eq 0 ]; then
    cargo +nightly miri test --lib -- format::npy format::npz format::example format::tfrecord format::index
    # The map that decodes cells on the pool (src/format/cells.rs, `map_on_pool`) lends
    # its function to the pool's threads with an unsafe lifetime. Under Tree Borrows: the
    # pool's crossbeam-epoch breaks Stacked Borrows' rules, not this code
    # (crossbeam-rs/crossbeam#545); the global pool's threads outlive the tests.
    MIRIFLAGS="$MIRIFLAGS -Zmiri-tree-borrows -Zmiri-permissive-provenance -Zmiri-ignore-leaks" \
        cargo +nightly miri test --lib -- format::cells
else
    cargo +nightly miri test --lib -- "${filters[@]}"
fi
