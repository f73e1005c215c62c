"""What equal ranks behind a filter cost (issue 49): rank 0 of 2 reading a filtered
Parquet dataset (pyarrow's defaults: snappy) for 3 epochs, with the default padding (the
filter's pass over the rows, once per process, then each rank reads its share of the
kept rows) and with pad=False (each rank filters its own share as it runs; ranks may
differ). Medians of 3 runs, each in a fresh process so the pass is not remembered.

    python benches/filter_ranks.py [--rows 2000000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUN = """
import json, sys, time
import numpy as np
import shardflow as sf
def keep(batch):
    return batch["id"] % 2 == 0
ds = sf.dataset({path!r}).filter(keep, batched=True, batch_format="numpy")
loader = sf.DataLoader(ds, batch_size=1024, shuffle=True, seed=0, rank=0, world_size=2, pad={pad})
times, rows = [], []
for epoch in range(3):
    loader.set_epoch(epoch)
    start = time.perf_counter()
    rows.append(sum(len(b["id"]) for b in loader))
    times.append(time.perf_counter() - start)
print(json.dumps({{"times": times, "rows": rows}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    args = parser.parse_args()
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "data.parquet")
        rng = np.random.default_rng(0)
        pq.write_table(pa.table({"id": np.arange(args.rows), "x": rng.random(args.rows)}), path)
        for pad in ("True", "False"):
            runs = [json.loads(subprocess.run([sys.executable, "-c", RUN.format(path=path, pad=pad)], capture_output=True, text=True, check=True).stdout) for _ in range(3)]
            first = statistics.median(r["times"][0] for r in runs)
            later = statistics.median(t for r in runs for t in r["times"][1:])
            print(f"pad={pad:5}  rows/epoch {runs[0]['rows']}  first epoch {first:.3f} s  later epochs {later:.3f} s")


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"({time.perf_counter() - start:.0f} s)")
