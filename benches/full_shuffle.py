"""A full-permutation shuffle (``ds.shuffle(seed)``, HF's ``Dataset.shuffle``) over large
rows: peak RSS and epoch time, against the same data unshuffled and buffer-shuffled.

    python benches/full_shuffle.py [--rows 3000 6000 12000] [--row-kb 256] [--repeats 1]
        [--layout pyarrow|hf] [--compression none|snappy|zstd]

The setup of issue 30: ROWS rows of ROW_KB random bytes as 10 Parquet files with
100-row row groups (``benches/memory_rss.py``'s writer, pyarrow's defaults, uncompressed
unless ``--compression`` says; or, with ``--layout hf``, as HF ``datasets`` writes
Parquet), one epoch of ``DataLoader(ds, batch_size=32)`` per fresh process. Peak RSS is
the process's VmHWM.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from memory_rss import write

# How HF `datasets` writes Parquet (`Dataset.to_parquet`, Hub conversions): an offset index,
# and pages cut by content (about 1 MiB) rather than one page per column chunk.
HF_LAYOUT = {"use_dictionary": False, "write_page_index": True, "use_content_defined_chunking": True}

CHILD = """
import sys, time
import shardflow as sf
source, how = sys.argv[1], sys.argv[2]
ds = sf.dataset(source)
if how == "full":
    ds = ds.shuffle(seed=0)
elif how == "buffer":
    ds = ds.shuffle(seed=0, buffer_size=1000)
start = time.perf_counter()
rows = sum(len(b["id"]) for b in sf.DataLoader(ds, batch_size=32))
seconds = time.perf_counter() - start
peak_kb = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(rows, seconds, peak_kb << 10)
"""


def epoch(source: str, how: str) -> tuple[int, float, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, source, how], check=True, capture_output=True, text=True).stdout.split()
    return int(out[0]), float(out[1]), int(out[2])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[3000, 6000, 12000])
    parser.add_argument("--row-kb", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--layout", choices=["pyarrow", "hf"], default="pyarrow",
                        help="pyarrow's defaults (a dictionary page per column chunk, no page index) "
                        "or HF datasets' (an offset index, pages of about 1 MiB)")
    parser.add_argument("--compression", default="none",
                        help="the column chunks' codec: uncompressed, a row's value is read where it is; "
                        "compressed, each visit to a row group decodes its dictionary page whole")
    args = parser.parse_args()
    print("| data | full shuffle: peak RSS | time | unshuffled: peak RSS | time | buffer shuffle: peak RSS | time |")
    print("|---|---|---|---|---|---|---|")
    for rows in args.rows:
        with tempfile.TemporaryDirectory() as tmp:
            layout = HF_LAYOUT if args.layout == "hf" else {}
            source = write(Path(tmp), rows, args.row_kb, compression=args.compression, **layout)
            cells = []
            for how in ("full", "none", "buffer"):
                runs = [epoch(source, how) for _ in range(args.repeats)]
                assert all(r[0] == rows for r in runs), runs
                cells += [f"{statistics.median(r[2] for r in runs) / 2**20:,.0f} MiB",
                          f"{statistics.median(r[1] for r in runs):.1f} s"]
            print(f"| {rows * args.row_kb / 2**20:.2f} GiB ({rows:,} rows) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
