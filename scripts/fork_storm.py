"""Forks PyTorch DataLoader workers over and over while other threads of the process
run shardflow pipelines whose map function is Python (so shardflow's threads keep
entering the interpreter). Before the fork gate (src/python/fork.rs) a child hung
inside os.fork() about once in a few hundred iterations here: CPython's thread-list
lock, copied taken (gh-112275). A hung worker makes torch's `timeout=` raise.

Usage: python scripts/fork_storm.py [ITERATIONS] [THREADS]   (scripts/stress-fork.sh runs it)
"""

from __future__ import annotations

import logging
import sys
import threading
import time

import numpy as np
from torch.utils.data import DataLoader as TorchLoader

import shardflow as sf
from shardflow.torch import IterableDataset


def plus_one(row: dict) -> dict:
    return {"id": row["id"] + 1}


def main() -> int:
    iterations = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    stop = threading.Event()
    # The workers' "no Python work to share" hint, once per worker, would fill the output.
    logging.getLogger("shardflow").setLevel(logging.ERROR)

    def background() -> None:
        mapped = sf.from_dict({"id": np.arange(200)}).map(plus_one)
        turn = 0
        while not stop.is_set():
            for j, _ in enumerate(sf.DataLoader(mapped, batch_size=16, num_threads=1)):
                if j == turn % 3:
                    break  # abandoned: its pipeline thread winds down in the background
            turn += 1

    workers = [threading.Thread(target=background, daemon=True) for _ in range(threads)]
    for worker in workers:
        worker.start()
    ds = IterableDataset(sf.from_dict({"id": np.arange(1000)}), batch_size=64)
    start = time.monotonic()
    try:
        for i in range(iterations):
            loader = TorchLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=60)
            rows = sorted(int(x) for batch in loader for x in batch["id"])
            if rows != list(range(1000)):
                print(f"iteration {i}: wrong rows", file=sys.stderr)
                return 1
    finally:
        stop.set()
    print(f"{iterations} iterations ({2 * iterations} forked workers) in {time.monotonic() - start:.0f} s, none hung")
    return 0


if __name__ == "__main__":
    sys.exit(main())
