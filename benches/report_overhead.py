"""What the input-bound report's counters and the timeline cost, on the harness's
Parquet and TFRecord workloads, side by side in one run.

    python benches/report_overhead.py --baseline /path/to/older/python [--repeats 5]

``--baseline`` is a folder holding an older build's ``shardflow`` package (its
``_native*.so`` beside its ``.py`` files): the loader before the report's counters. The
runs alternate, each in a fresh process: the baseline, this checkout, and this checkout
with ``trace=`` on. Each reads three epochs and keeps the last two's rate; medians of
the repeats are printed with their ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

RUN = """
import json, sys, time
import shardflow as sf
data, workload, trace = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if workload == "parquet":
    ds = sf.dataset(data + "/parquet/*.parquet")
else:
    ds = sf.dataset(data + "/tfrecord/part-*.tfrecord",
                    features={"image": sf.FixedLen((), "bytes"), "label": sf.FixedLen((), "int64")})
extra = {"trace": data + "/trace.json"} if trace else {}
loader = sf.DataLoader(ds, batch_size=256, **extra)
rates = []
for epoch in range(3):
    start = time.perf_counter()
    rows = sum(len(b["label"]) for b in loader)
    rates.append(rows / (time.perf_counter() - start))
print(json.dumps(sum(rates[1:]) / 2))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline", required=True, help="a folder with an older build's shardflow package")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from harness import make_parquet, make_tfrecord

    here = str(HERE.parent / "python")
    variants = {"baseline": (args.baseline, "0"), "report counters": (here, "0"), "trace on": (here, "1")}
    with tempfile.TemporaryDirectory() as data:
        (Path(data) / "parquet").mkdir()
        (Path(data) / "tfrecord").mkdir()
        make_parquet(Path(data) / "parquet", 1.0)
        make_tfrecord(Path(data) / "tfrecord", 1.0)
        rates: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.repeats):
            for workload in ("parquet", "tfrecord"):
                for name, (path, trace) in variants.items():
                    env = dict(os.environ, PYTHONPATH=path)
                    out = subprocess.run([sys.executable, "-c", RUN, data, workload, trace], env=env,
                                         capture_output=True, text=True, check=True)
                    rates.setdefault((workload, name), []).append(json.loads(out.stdout))
        for workload in ("parquet", "tfrecord"):
            base = statistics.median(rates[(workload, "baseline")])
            for name in variants:
                median = statistics.median(rates[(workload, name)])
                print(f"{workload:<9} {name:<16} {median:>12,.0f} samples/s  {median / base:.3f}x the baseline")


if __name__ == "__main__":
    main()
