"""PyTorch adapters. Importing this module imports torch; ``import shardflow`` does not.

- :class:`IterableDataset` wraps a shardflow dataset for ``torch.utils.data.DataLoader``:
  each (rank, worker) reads its own disjoint part and together they read everything
  exactly once per epoch. Give ``batch_size`` to let shardflow batch (then use
  ``torch.utils.data.DataLoader(..., batch_size=None)``), or leave it None to yield
  samples for torch to collate.
- :class:`MapDataset` wraps a dataset with known row counts for torch samplers,
  ``DistributedSampler`` included.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset as _TorchDataset
from torch.utils.data import IterableDataset as _TorchIterableDataset
from torch.utils.data import get_worker_info

import shardflow as sf

__all__ = ["IterableDataset", "MapDataset"]


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit arguments, else torch.distributed when initialised, else the RANK and
    WORLD_SIZE environment variables (as torchrun sets them), else a single process."""
    if rank is not None or world_size is not None:
        if rank is None or world_size is None:
            raise ValueError("give rank= and world_size= together")
        return rank, world_size
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return 0, 1


class IterableDataset(_TorchIterableDataset):
    """A ``torch.utils.data.IterableDataset`` over a shardflow dataset.

    The order is a function of (seed, epoch): every rank must use the same ``seed``
    (the default, 0, is shared). The epoch advances by one each time the dataset is
    iterated, in every worker alike, so persistent workers stay in step;
    :meth:`set_epoch` chooses it explicitly.
    """

    def __init__(
        self,
        dataset: sf.Dataset,
        batch_size: int | None = None,
        *,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        num_threads: int | None = None,
        prefetch: int | None = None,
    ) -> None:
        if not isinstance(dataset, sf.Dataset):
            raise TypeError("IterableDataset wraps a shardflow.Dataset")
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.num_threads = num_threads
        self.prefetch = prefetch
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _loader(self) -> sf.DataLoader:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rank, world = _rank_and_world(self.rank, self.world_size)
        # Every (rank, worker) pair is one part of the epoch.
        loader = sf.DataLoader(
            self.dataset,
            batch_size=self.batch_size or 256,
            shuffle=self.shuffle,
            seed=self.seed if self.shuffle else None,
            drop_last=self.drop_last,
            rank=rank * workers + worker,
            world_size=world * workers,
            num_threads=self.num_threads or (1 if info is not None else None),
            prefetch=self.prefetch,
            output="torch" if self.batch_size else "numpy",
        )
        loader.set_epoch(self.epoch)
        self.epoch += 1
        return loader

    def __iter__(self) -> Iterator[Any]:
        loader = self._loader()
        if self.batch_size:
            yield from loader
            return
        for batch in loader:
            columns = list(batch.items())
            for i in range(batch.num_rows):
                yield {name: values[i] for name, values in columns}


class MapDataset(_TorchDataset):
    """A ``torch.utils.data.Dataset`` over a shardflow dataset with known row counts
    (Parquet, NPY/NPZ in rows mode, Arrow files, raw files). Works with any sampler;
    ``__getitems__`` lets torch fetch a whole batch of indices in one call, decoding
    each needed part of the data once."""

    def __init__(self, dataset: sf.Dataset) -> None:
        if not isinstance(dataset, sf.Dataset):
            raise TypeError("MapDataset wraps a shardflow.Dataset")
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        return self.dataset.__getitems__(list(indices))
