"""Fails when a dependency would be compiled with other features for `cargo test` than
for the Python extension (maturin's build, `--features python`).

Cargo unifies features per build: dev-dependencies (criterion, tempfile) add features
to shared crates only when tests are built, and numpy adds some only to the extension.
Either difference makes `cargo test` recompile arrow, parquet and rayon after the
extension's build; Cargo.toml pins the union instead, and this keeps it pinned.
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict


def features(*args: str) -> dict[str, set[str]]:
    out = subprocess.run(
        ["cargo", "tree", "--locked", "--prefix", "none", "--format", "{p}|{f}", *args],
        check=True, capture_output=True, text=True,
    ).stdout
    found: dict[str, set[str]] = defaultdict(set)
    for line in out.splitlines():
        package, _, feats = line.removesuffix(" (*)").partition("|")
        # The root package's own features differ on purpose (`python`).
        if package.startswith("shardflow "):
            continue
        found[package.removesuffix(" (proc-macro)")].update(f for f in feats.split(",") if f)
    return found


def main() -> int:
    extension = features("--edges", "normal,build", "--features", "python")
    tests = features("--edges", "normal,build,dev")
    differ = sorted(p for p in extension.keys() & tests.keys() if extension[p] != tests[p])
    for package in differ:
        print(
            f"{package}: extension only {sorted(extension[package] - tests[package])}, "
            f"cargo test only {sorted(tests[package] - extension[package])}",
            file=sys.stderr,
        )
    if differ:
        print("pin the union of these features in Cargo.toml's [dependencies]", file=sys.stderr)
        return 1
    print(f"{len(extension.keys() & tests.keys())} shared dependencies, one feature set")
    return 0


if __name__ == "__main__":
    sys.exit(main())
