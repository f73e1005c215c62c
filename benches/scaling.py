"""How far the pipeline scales with cores: the serial threads against the parallel work.

    python benches/scaling.py [--only parquet,chat,tfrecord,images] [--output numpy,arrow] [--threads 1,2] [--epochs 2] [--repeats 3] [--scale 1.0]

The harness's workloads (``benches/harness.py``; its data under ``--data``), each read in
batches of 256 (``--batch``) by a ``DataLoader`` with ``num_threads`` = 1 and 2
(``--threads``; on a machine with more cores, ``--threads 1,2,4,8,16`` measures what the
projection below predicts), in fresh processes, for each ``output`` asked for. Each process
reads ``--epochs`` epochs and the figures are its last epoch's (from ``stats()`` before and
after it): a training run's steady state, without the one-off start (a JSON schema
inferred, an index read) that a small dataset's single epoch would spread over its few
batches. numpy output turns strings, bytes and nested values into Python objects, under
the GIL: that conversion is serial wherever it runs. ``output="arrow"`` hands the same
batches over without it. From ``stats()``, per batch:

- parallel: ``decode_seconds`` (decode tasks, summed over threads; with one thread, its
  CPU time) plus ``assemble_seconds`` (joining rows into batches, on threads of their
  own) — the work that more threads share;
- serial, each on a thread of its own: ``pipeline_cpu_seconds`` (the pipeline thread:
  ordering, rebatching), ``shuffle_cpu_seconds`` (a shuffle buffer's thread: its draws)
  and ``consumer_cpu_seconds`` (the consumer in ``next()``: conversion to numpy) — the
  work one thread each does, whatever the thread count.

With the parallel work spread over N cores, a batch takes parallel/N on them; each serial
thread takes its own CPU per batch, beside the others (a queue between each and the next).
Throughput stops growing once parallel/N is below the busiest serial thread's, at
N = parallel / max(serial threads) (the projected saturation core count; the serial
threads' own cores come on top). The serial share is the serial threads' sum over all
the work per batch.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[4])
# As in the harness, imports are not timed: a training script has numpy already, and the
# loader's first batch would import it (about 50 ms of CPU, charged to the consumer).
import numpy
import pyarrow  # the arrow output's batches are its
import shardflow as sf
from harness import wait_until_idle
from scaling import dataset
wait_until_idle()
workload, data, threads, output, batch, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[5], int(sys.argv[6]), int(sys.argv[7])
loader = sf.DataLoader(dataset(workload, data), batch_size=batch, num_threads=threads, output=output)
keys = ("batches", "decode_seconds", "assemble_seconds", "pipeline_cpu_seconds", "shuffle_cpu_seconds", "consumer_cpu_seconds")
for _ in range(epochs):
    before = loader.stats()
    start = time.perf_counter()
    rows = sum(b.num_rows if output == "arrow" else len(next(iter(b.values()))) for b in loader)
    wall = time.perf_counter() - start
s = loader.stats()
d = {k: s[k] - before[k] for k in keys}
print(json.dumps({"rows": rows, "wall": wall, "batches": d["batches"], "decode": d["decode_seconds"],
                  "assemble": d["assemble_seconds"], "pipeline": d["pipeline_cpu_seconds"],
                  "shuffle": d["shuffle_cpu_seconds"], "consumer": d["consumer_cpu_seconds"]}))
"""


def dataset(workload: str, data: str):  # noqa: ANN201
    import shardflow as sf

    root = Path(data)
    if workload == "parquet":
        return sf.dataset(str(root / "part-*.parquet"))
    if workload == "chat":
        return sf.dataset(sorted(str(p) for p in root.glob("chat-*"))).shuffle(seed=7, buffer_size=10_000)
    if workload == "tfrecord":
        features = {"image": sf.FixedLen((), "bytes"), "label": sf.FixedLen((), "int64")}
        return sf.dataset(str(root / "part-*.tfrecord"), features=features)
    if workload == "images":
        return sf.dataset(str(root / "part-*.tar"), columns=["jpg", "cls"],
                          format_options={"decode": {"jpg": "rgb8"}, "resize": 256, "center_crop": 224})
    raise ValueError(workload)


def run(workload: str, data: Path, threads: int, output: str, batch: int, epochs: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, workload, str(data), str(threads), str(HERE), output, str(batch),
                          str(epochs)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="parquet,chat,tfrecord,images")
    parser.add_argument("--output", default="numpy,arrow", help="the loader's output(s)")
    parser.add_argument("--batch", type=int, default=256, help="rows per batch")
    parser.add_argument("--threads", default="1,2", help="the loader's num_threads values")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per process; the last one is measured")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--data", default=str(Path.home() / ".cache/shardflow/bench-data"))
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from harness import prepare

    print("| workload | output | threads | samples/s | decode ms/batch | assemble ms/batch | pipeline ms/batch "
          "| shuffle ms/batch | consumer ms/batch | serial share | saturates at |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    serial_threads = ("pipeline", "shuffle", "consumer")
    for workload in args.only.split(","):
        data = prepare(Path(args.data), workload, args.scale)
        for output, threads in itertools.product(args.output.split(","), map(int, args.threads.split(","))):
            runs = [run(workload, data, threads, output, args.batch, args.epochs) for _ in range(args.repeats)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            per = {k: med[k] / med["batches"] * 1e3 for k in ("decode", "assemble", *serial_threads)}
            parallel = per["decode"] + per["assemble"]
            serial = sum(per[k] for k in serial_threads)
            busiest = max(per[k] for k in serial_threads)
            print(f"| {workload} | {output} | {threads} | {med['rows'] / med['wall']:,.0f} | {per['decode']:.3f} | "
                  f"{per['assemble']:.3f} | {per['pipeline']:.3f} | {per['shuffle']:.3f} | {per['consumer']:.3f} | "
                  f"{serial / (serial + parallel):.1%} | {parallel / busiest:.0f} cores |", flush=True)

if __name__ == "__main__":
    main()
