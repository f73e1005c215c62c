"""Time to the first batch from local Parquet, in fresh processes (imports excluded):
from ``sf.dataset(glob)`` to the first batch of ``DataLoader(..., batch_size=256)``.

    python benches/first_batch.py [--rows 200000] [--repeats 7]

Rows are a 784-byte image, a label and a caption in 8 files of 10,000-row row groups
(the workload of ``benches/rss_epochs.py``). Reported: median ms, unshuffled, with the
streaming shuffle (``shuffle(seed, buffer_size=10_000)``) and with the full shuffle
(``shuffle(seed)``).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rss_epochs import write

CHILD = """
import sys, time
import numpy  # imported by any training script; shardflow imports it on first use
import shardflow as sf
source, mode = sys.argv[1], sys.argv[2]
start = time.perf_counter()
ds = sf.dataset(source)
if mode == "buffer":
    ds = ds.shuffle(seed=0, buffer_size=10_000)
elif mode == "full":
    ds = ds.shuffle(seed=0)
batch = next(iter(sf.DataLoader(ds, batch_size=256)))
assert len(batch["label"]) == 256
print((time.perf_counter() - start) * 1000)
"""

MODES = ("unshuffled", "buffer", "full")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as directory:
        source = write(Path(directory), args.rows)
        for _ in range(args.repeats):
            for mode in MODES:  # interleaved, so drift hits all alike
                out = subprocess.run([sys.executable, "-c", CHILD, source, mode], check=True, capture_output=True, text=True)
                times[mode].append(float(out.stdout))
    for mode in MODES:
        print(f"{mode:12s} first batch median {statistics.median(times[mode]):6.1f} ms  (min {min(times[mode]):.1f})")


if __name__ == "__main__":
    main()
