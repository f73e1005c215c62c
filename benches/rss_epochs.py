"""RSS across shuffled epochs: does memory stay flat?

    python benches/rss_epochs.py [--rows 200000] [--epochs 30]

Writes ROWS rows (a 784-byte image, a label and a caption) as 8 Parquet files, then,
in a fresh process, runs EPOCHS epochs of
``DataLoader(ds.shuffle(seed=0), batch_size=256)`` with default settings and prints the
RSS after each epoch, the growth from epoch 1 to the last, and the peak. With
``--env MALLOC_ARENA_MAX=2`` (or any other variable) the child runs with it set."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import sys
import shardflow as sf
source, epochs = sys.argv[1], int(sys.argv[2])

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e6

loader = sf.DataLoader(sf.dataset(source).shuffle(seed=0), batch_size=256)
for epoch in range(epochs):
    rows = 0
    for batch in loader:
        rows += len(batch["label"])
    print(epoch + 1, rows, f"{rss_mb():.0f}", flush=True)
# VmHWM, not ru_maxrss: the latter starts from the parent's RSS, which fork passes on.
peak_kb = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print("peak", peak_kb * 1024 / 1e6)
"""


def write(directory: Path, rows: int) -> str:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    files = 8
    per_file = rows // files
    for f in range(files):
        ids = np.arange(f * per_file, (f + 1) * per_file)
        images = pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(0, 256, per_file * 784, dtype=np.uint8)), 784)
        captions = pa.array([f"a picture of item {i} in class {i % 10}" for i in ids])
        table = pa.table({"image": images, "label": ids % 10, "caption": captions})
        pq.write_table(table, directory / f"part-{f:02d}.parquet", row_group_size=10_000)
    return str(directory / "part-*.parquet")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the child")
    args = parser.parse_args()
    env = dict(os.environ, **dict(e.split("=", 1) for e in args.env))
    with tempfile.TemporaryDirectory() as directory:
        source = write(Path(directory), args.rows)
        out = subprocess.run([sys.executable, "-c", CHILD, source, str(args.epochs)], env=env,
                             check=True, capture_output=True, text=True).stdout.split("\n")
    rss = []
    for line in out:
        parts = line.split()
        if len(parts) == 3:
            assert int(parts[1]) == args.rows
            rss.append(float(parts[2]))
        elif parts and parts[0] == "peak":
            peak = float(parts[1])
    print(f"{args.rows:,} rows, {args.epochs} epochs; RSS MB after each epoch:")
    print(" ".join(f"{r:.0f}" for r in rss))
    print(f"epoch 1 {rss[0]:.0f} MB -> epoch {len(rss)} {rss[-1]:.0f} MB (growth {rss[-1] - rss[0]:+.0f} MB); peak {peak:.0f} MB")


if __name__ == "__main__":
    main()
