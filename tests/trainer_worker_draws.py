"""The weighted draws of tests/trainer_worker.py's mode "weighted", as one reader reads
them in each epoch (without importing the worker, which reads its spec at import)."""

from __future__ import annotations

import shardflow as sf

#: As trainer_worker.WEIGHTED_SEED.
WEIGHTED_SEED = 7


def weighted(path: str) -> sf.Dataset:
    ds = sf.dataset(path).rename_column("id", "row_id")
    return ds.weighted_sample([1.0 + i % 5 for i in range(len(ds))], seed=WEIGHTED_SEED)


def draw(path: str, epoch: int) -> list[int]:
    loader = sf.DataLoader(weighted(path), batch_size=4096)
    loader.set_epoch(epoch)
    return [int(i) for b in loader for i in b["row_id"].tolist()]
