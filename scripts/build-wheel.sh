#!/usr/bin/env bash
# Builds what users install, into $SHARDFLOW_WHEEL_DIR (default: dist/):
#   - the sdist, shardflow-<version>.tar.gz;
#   - from that sdist (which proves that it builds), the wheel:
#     shardflow-<version>-cp311-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl,
#     one file for every CPython >= 3.11 on any x86_64 Linux with glibc 2.17 or later.
# zig links it against glibc 2.17's symbols, so no manylinux container is needed; the
# `dist` profile (Cargo.toml) strips it and builds it with LTO. The wheel is then checked
# three ways: maturin's own manylinux audit, `auditwheel show`, and a look at the
# extension's ELF sections (no debug info, no symbol table).
#
# Needs a Rust toolchain and Python >= 3.11; the build tools (maturin, ziglang,
# auditwheel) are installed, at fixed versions, into a venv of their own.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/shardflow/target}"
PYTHON="${PYTHON:-python3}"
OUT="${SHARDFLOW_WHEEL_DIR:-dist}"
TOOLS="${SHARDFLOW_WHEEL_TOOLS:-$HOME/.cache/shardflow/wheel-tools}"
PLATFORM=manylinux_2_17_x86_64

if [ ! -x "$TOOLS/bin/python" ]; then
    "$PYTHON" -m venv "$TOOLS"
fi
"$TOOLS/bin/python" -m pip install --quiet --disable-pip-version-check \
    maturin==1.16.0 ziglang==0.17.1 auditwheel==6.8.2 cmake==4.4.5
# maturin runs zig as `python -m ziglang`, with the first python on PATH. Its `ar`
# wrapper, which cmake runs for libhdf5's static library, looks for a `zig` binary on
# PATH instead: the one the ziglang package ships.
ZIG_DIR="$("$TOOLS/bin/python" -c 'import os, ziglang; print(os.path.dirname(ziglang.__file__))')"
export PATH="$TOOLS/bin:$ZIG_DIR:$PATH"

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)"
mkdir -p "$OUT"
rm -f "$OUT"/shardflow-"$version"-*.whl "$OUT/shardflow-$version.tar.gz"

echo "== building the sdist, then the wheel from it (profile dist: LTO, stripped)"
start=$SECONDS
maturin sdist --out "$OUT"
unpacked="$(mktemp -d)"
trap 'rm -rf "$unpacked"' EXIT
# --touch: the sdist's files carry one fixed, old mtime (a reproducible archive), and
# cargo, which compares mtimes, would take an earlier build of other sources as current.
tar -xzf "$OUT/shardflow-$version.tar.gz" -C "$unpacked" --touch
maturin build --manifest-path "$unpacked/shardflow-$version/Cargo.toml" --profile dist \
    --zig --compatibility manylinux_2_17 --auditwheel check --interpreter "$PYTHON" --out "$OUT"
build_seconds=$((SECONDS - start))
# maturin gives the wheel both spellings of the tag, the legacy alias first:
# manylinux2014_x86_64.manylinux_2_17_x86_64.
wheel="$(ls "$OUT"/shardflow-"$version"-cp311-abi3-*"$PLATFORM".whl)"

echo "== checking the wheel"
report="$(auditwheel show "$wheel")"
echo "$report"
# auditwheel names the most portable tag that the wheel's symbol versions and libraries
# allow (it wraps its lines): that must be the tag the wheel carries.
if ! echo "$report" | tr -s ' \n' ' ' | grep -q "consistent with the following platform tag: \"$PLATFORM\""; then
    echo "auditwheel does not find $wheel consistent with $PLATFORM" >&2
    exit 1
fi
"$TOOLS/bin/python" - "$wheel" <<'EOF'
"""The extension carries no debug info and no symbol table (the dist profile strips it)."""
import io
import sys
import zipfile

from elftools.elf.elffile import ELFFile

with zipfile.ZipFile(sys.argv[1]) as wheel:
    (name,) = [n for n in wheel.namelist() if n.endswith(".so")]
    data = wheel.read(name)
sections = [s.name for s in ELFFile(io.BytesIO(data)).iter_sections()]
extra = [s for s in sections if s.startswith(".debug") or s == ".symtab"]
if extra:
    sys.exit(f"{name} is not stripped: it has {extra}")
print(f"{name}: {len(data) / 2**20:.1f} MiB, stripped")
EOF
echo "wheel: $wheel ($(du -m "$wheel" | cut -f1) MB), built in ${build_seconds} s"
echo "sdist: $OUT/shardflow-$version.tar.gz"
