"""Counts the requests a 2-rank x 4-worker torch run makes to a Hub (the local one of
tests/hubserver.py) over a 50-file Parquet repo: shardflow's `load_dataset` against
`datasets.load_dataset(streaming=True)` with `split_dataset_by_node`, on the same server.

    python scripts/hub-requests.py            # prints one JSON line per loader
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from hubserver import HubServer  # noqa: E402

TOKEN = "hf_requests_token"
RUNS = {
    "shardflow": (
        "import sys, torch, shardflow as sf\n"
        "from shardflow.torch import IterableDataset\n"
        "rank = int(sys.argv[1])\n"
        "ds = sf.load_dataset('org/many', split='train')\n"
        "it = IterableDataset(ds, batch_size=8, shuffle=True, seed=1, rank=rank, world_size=2)\n"
        "loader = torch.utils.data.DataLoader(it, batch_size=None, num_workers=4)\n"
        "print(sum(len(b['id']) for b in loader))\n"
    ),
    "datasets-streaming": (
        "import sys, torch, datasets\n"
        "from datasets.distributed import split_dataset_by_node\n"
        "rank = int(sys.argv[1])\n"
        "ds = datasets.load_dataset('org/many', split='train', streaming=True)\n"
        "ds = split_dataset_by_node(ds, rank=rank, world_size=2)\n"
        "loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=4)\n"
        "print(sum(len(b['id']) for b in loader))\n"
    ),
}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "many"
        for i in range(50):
            path = root / f"data/train-{i:05d}-of-00050.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({"id": list(range(8 * i, 8 * i + 8))}), path)
        server = HubServer({"org/many": {"main": root}}, token=TOKEN, page_size=1000)
        try:
            for name, code in RUNS.items():
                server.reset_counts()
                env = {**os.environ, "HF_ENDPOINT": server.url, "HF_TOKEN": TOKEN,
                       "HF_HOME": str(Path(tmp) / f"home-{name}"), "HF_HUB_DISABLE_TELEMETRY": "1"}
                ranks = [subprocess.Popen([sys.executable, "-c", code, str(r)], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True) for r in range(2)]
                rows = []
                for run in ranks:
                    out, err = run.communicate(timeout=600)
                    if run.returncode != 0:
                        raise SystemExit(f"{name} failed:\n{err[-3000:]}")
                    rows.append(int(out.split()[-1]))
                listing = {k: v for k, v in server.counts.items() if k in ("info", "tree", "paths-info")}
                print(json.dumps({"loader": name, "rows_per_rank": rows, "listing_requests": listing,
                                  "all_requests": dict(server.counts)}))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
