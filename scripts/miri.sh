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
# Isolation off: the index tests use temporary files.
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-disable-isolation}"
filters=("$@")
[ "${#filters[@]}" -gt 0 ] || filters=(format::npy format::npz format::example format::tfrecord format::index)
cargo +nightly miri test --lib -- "${filters[@]}"
