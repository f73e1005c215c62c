"""Peak RSS while writing large shards: the writer encodes shards as streams, so its
memory does not grow with the shard size.

    python benches/write_memory.py [--gb 2] [--memory-limit-mb 512] [--repeats 1]

Writes GB of random bytes (256 KiB rows, incompressible) as the Parquet source of
``benches/memory_rss.py``, then, in a fresh process each, writes all of it as ONE shard
(``max_bytes_per_shard`` above its size) as Parquet and as WebDataset. Reported: each
process's peak RSS above its RSS before the write (median over repeats) and the shard
size, against the bound: what the read side takes (measured: a plain ``DataLoader``
pass over the same source with half of ``memory_limit``, which ``write`` gives its
pipeline) plus the writers' half of ``memory_limit`` plus, per writer thread, a Parquet
row group (32 MiB) and a 1 MiB file buffer.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from memory_rss import write as make_source

CHILD = """
import json, shutil, sys, time
import shardflow as sf

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

source, dest, what, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ds = sf.dataset(source)
# A first small pass loads what any pass needs (modules, code, threads); the peak is
# taken from after it (ru_maxrss would start from the parent's, which fork passes on).
work = ds.select(range(4))
if what == "loader":
    sum(len(b["id"]) for b in sf.DataLoader(work, batch_size=32, memory_limit=limit))
else:
    work.write(dest, what)
    shutil.rmtree(dest)
open("/proc/self/clear_refs", "w").write("5")
before = status("VmRSS")
start = time.perf_counter()
if what == "loader":
    rows = sum(len(b["id"]) for b in sf.DataLoader(ds, batch_size=32, memory_limit=limit))
    size = 0
else:
    manifest = ds.write(dest, what, max_bytes_per_shard=1 << 50, memory_limit=limit, num_threads=2)
    assert len(manifest["shards"]) == 1, manifest["shards"]
    rows, size = manifest["rows"], manifest["bytes"]
seconds = time.perf_counter() - start
peak = status("VmHWM")
print(json.dumps({"rows": rows, "bytes": size, "growth": peak - before, "seconds": seconds}))
"""


def run(source: str, dest: Path, what: str, limit: int) -> dict:
    shutil.rmtree(dest, ignore_errors=True)
    out = subprocess.run([sys.executable, "-c", CHILD, source, str(dest), what, str(limit)],
                         check=True, capture_output=True, text=True).stdout
    shutil.rmtree(dest, ignore_errors=True)
    return json.loads(out.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gb", type=float, default=2.0)
    parser.add_argument("--memory-limit-mb", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    limit = args.memory_limit_mb << 20
    threads = 2
    with tempfile.TemporaryDirectory() as tmp:
        rows = int(args.gb * (1 << 30)) // (256 << 10)
        rows -= rows % 10
        source = make_source(Path(tmp), rows, 256)

        def median_of(what: str, memory_limit: int) -> tuple[float, float, int]:
            runs = [run(source, Path(tmp) / "out", what, memory_limit) for _ in range(args.repeats)]
            return (statistics.median(r["growth"] for r in runs), statistics.median(r["seconds"] for r in runs),
                    runs[0]["bytes"])

        read_side, _, _ = median_of("loader", limit // 2)
        writers = limit // 2 + threads * (33 << 20)
        bound = read_side + writers
        print(f"{rows:,} rows of 256 KiB ({rows * 256 / 1024**2:.2f} GiB); memory_limit {args.memory_limit_mb} MiB, "
              f"{threads} writer threads")
        print(f"bound {bound / 2**20:,.0f} MiB = read side {read_side / 2**20:,.0f} MiB (a DataLoader pass at "
              f"memory_limit/2) + writers {writers / 2**20:,.0f} MiB")
        for what in ["parquet", "webdataset"]:
            growth, seconds, size = median_of(what, limit)
            print(f"{what:<11} one {size / 2**30:.2f} GiB shard: peak RSS +{growth / 2**20:,.0f} MiB "
                  f"({growth / bound:.2f} of the bound), {seconds:.1f} s")


if __name__ == "__main__":
    main()
