"""Memory stays flat across epochs: many shuffled epochs in a fresh process, with the
default settings, and the RSS of the late epochs is no higher than that of the early
ones (beyond a bound that a real leak soon crosses)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROWS = 30_000
EPOCHS = 100
# RSS is compared between the first and the last WINDOW epochs (after the first).
WINDOW = 20

CHILD = """
import json, os, sys, time
import shardflow as sf

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e6

def epoch_threads():
    # The process's threads but the interpreter's and the shared I/O runtime's.
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return sorted(n for n in names if n.startswith("shardflow") and n != "shardflow-io")

def threads_left():
    # A joined thread may stay listed for a moment: the kernel wakes the join before it
    # has taken the thread off the list. One that outlives its epoch stays.
    deadline = time.monotonic() + 2
    while (left := epoch_threads()) and time.monotonic() < deadline:
        time.sleep(0.001)
    return left

source, epochs, shuffle = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ds = sf.dataset(source)
ds = ds.shuffle(seed=0) if shuffle == "full" else ds.shuffle(seed=0, buffer_size=10_000)
loader = sf.DataLoader(ds, batch_size=256)
after = []
for epoch in range(epochs):
    rows = sum(len(b["label"]) for b in loader)
    after.append((rows, rss_mb(), threads_left()))
print(json.dumps(after))
"""


def write(directory: Path) -> str:
    rng = np.random.default_rng(0)
    files = 6
    per_file = ROWS // files
    for f in range(files):
        ids = np.arange(f * per_file, (f + 1) * per_file)
        images = pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(0, 256, per_file * 784, dtype=np.uint8)), 784)
        captions = pa.array([f"a picture of item {i} in class {i % 10}" for i in ids])
        pq.write_table(pa.table({"image": images, "label": ids % 10, "caption": captions}),
                       directory / f"part-{f}.parquet", row_group_size=2_500)
    return str(directory / "part-*.parquet")


def epochs_rss(source: str, shuffle: str) -> list[float]:
    # mimalloc keeps freed pages for a second before it returns them, so RSS moves by
    # tens of MB with timing; returning them at once makes RSS follow the live bytes.
    env = dict(os.environ, MIMALLOC_PURGE_DELAY="0")
    out = subprocess.run([sys.executable, "-c", CHILD, source, str(EPOCHS), shuffle],
                         check=True, capture_output=True, text=True, timeout=240, env=env).stdout
    after = json.loads(out)
    assert all(rows == ROWS for rows, _, _ in after)
    # An epoch's threads are joined before its end is seen (their heaps go with them, so
    # RSS read then is not a race with their exit), and none outlives its epoch.
    assert all(threads == [] for _, _, threads in after), [t for _, _, t in after if t][:3]
    return [rss for _, rss, _ in after]


def test_rss_is_flat_across_shuffled_epochs(tmp_path: Path) -> None:
    source = write(tmp_path)
    dataset_mb = ROWS * 830 / 1e6
    for shuffle in ("full", "buffer"):
        rss = epochs_rss(source, shuffle)
        # After the first epoch (caches, autotuned depths), RSS moves within a band of
        # a few MB from epoch to epoch (300-epoch runs stay within it). A leak grows
        # without bound instead. The medians of two windows EPOCHS - WINDOW - 1 epochs apart may
        # differ by half the data: keeping one row in 160 of every epoch would cross that.
        early = statistics.median(rss[1:WINDOW + 1])
        late = statistics.median(rss[-WINDOW:])
        assert late - early < dataset_mb / 2, (shuffle, [round(r) for r in rss])
