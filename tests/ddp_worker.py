"""One rank of the DDP test (tests/test_ddp.py): iterates `shardflow.torch.IterableDataset`
through torchdata's StatefulDataLoader with 2 workers and calls `all_reduce` every step,
as a training loop does. A rank that ran out of batches early would leave the others
waiting in `all_reduce`. Started by the test as a plain process with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set, as torchrun sets them.

    python ddp_worker.py SPEC_JSON
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader

import shardflow as sf
from shardflow.torch import IterableDataset, dataset_states


def batch_ids(fmt: str, batch: dict) -> list[int]:
    if fmt == "tfrecord":
        return [json.loads(bytes(r))["id"] for r in batch["record"]]
    return [int(i) for i in batch["id"].tolist()]


def main() -> None:
    spec = json.loads(sys.argv[1])
    out = Path(spec["out"])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    fmt = spec["fmt"]
    options = {"format_options": {"raw": True}} if fmt == "tfrecord" else {}
    ds = sf.dataset(spec["paths"], **options).shuffle(seed=0, buffer_size=50)
    source = IterableDataset(ds, batch_size=spec["batch_size"])
    if spec.get("resume"):
        source.load_state_dict(json.loads(Path(spec["resume"]).read_text()))
    loader = StatefulDataLoader(source, batch_size=None, num_workers=2)
    keys: list[int] = []
    steps = 0
    for batch in loader:
        keys += batch_ids(fmt, batch)
        steps += 1
        total = torch.tensor([float(len(batch_ids(fmt, batch)))])
        dist.all_reduce(total)  # every rank must reach every step
        if spec.get("stop_at") == steps:
            # A checkpoint at this step, then wait to be killed mid-epoch.
            states = dataset_states(loader.state_dict())
            (out / f"state-{rank}.json").write_text(json.dumps(states))
            (out / f"keys-{rank}.json").write_text(json.dumps(keys))
            (out / f"ready-{rank}").write_text("")
            while True:
                time.sleep(1)
    (out / f"keys-{rank}.json").write_text(json.dumps(keys))
    (out / f"steps-{rank}.json").write_text(json.dumps(steps))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
