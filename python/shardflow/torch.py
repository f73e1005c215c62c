"""PyTorch adapters. Importing this module imports torch; ``import shardflow`` does not.

- :class:`IterableDataset` wraps a shardflow dataset for ``torch.utils.data.DataLoader``:
  each (rank, worker) reads its own disjoint part and together they read everything
  exactly once per epoch. Give ``batch_size`` to let shardflow batch (then use
  ``torch.utils.data.DataLoader(..., batch_size=None)``), or leave it None to yield
  samples for torch to collate.
- :class:`MapDataset` wraps a dataset with known row counts for torch samplers,
  ``DistributedSampler`` included.

Several ranks each get the same number of batches (their shares are padded with the
first rows again, as ``DistributedSampler`` pads, unless ``drop_last=True`` or
``pad=False``), so a DDP step never waits on a rank that ran out. A rank's share is then
cut between its workers, each row once: workers are never padded. To resume on another number of ranks or
workers, collect every worker's state from every rank (:func:`dataset_states` of each
rank's ``StatefulDataLoader.state_dict()``) and pass the list to
:meth:`IterableDataset.load_state_dict` before starting the new loader.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset as _TorchDataset
from torch.utils.data import IterableDataset as _TorchIterableDataset
from torch.utils.data import get_worker_info

import shardflow as sf

__all__ = ["IterableDataset", "MapDataset", "dataset_states"]


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


class _SharedEpoch:
    """The epoch each torch iteration reads, kept in shared memory made in the parent so
    that worker processes agree on it whether they are forked, spawned, persistent or
    started afresh each epoch (torch's default).

    Workers started for one iteration of a torch ``DataLoader`` share its base seed
    (``worker_info.seed - worker_info.id``), and each new iteration draws a new one.
    The first worker of an iteration to start claims the next epoch for that seed; the
    others read it. Persistent workers, which outlive an iteration, count on from the
    epoch they last read. ``set_epoch`` in the parent reaches all of them.
    """

    # Slots of the shared array.
    _SEED, _EPOCH, _NEXT, _SET_EPOCH, _SET_VERSION, _RESUME, _RESUME_TAKEN, _RESUMED_BY = range(8)

    def __init__(self, epoch: int) -> None:
        # The spawn context's primitives can also be inherited by forked workers.
        context = multiprocessing.get_context("spawn")
        self._lock = context.Lock()
        self._values = context.RawArray("q", 8)
        self._values[self._SEED] = -1
        self._values[self._NEXT] = epoch
        self._values[self._SET_EPOCH] = epoch
        # What this process last read: (pid, set_epoch version, epoch). A persistent
        # worker counts on from it; a worker forked afresh has the parent's, not its own.
        self._seen: tuple[int, int, int] | None = None

    def set(self, epoch: int) -> None:
        with self._lock:
            self._values[self._NEXT] = epoch
            self._values[self._SET_EPOCH] = epoch
            self._values[self._SET_VERSION] += 1

    def new_resume(self) -> int:
        """A token for a resume loaded in the main process: the first iteration whose
        workers present it (see :meth:`take_resume`) resumes, and later ones do not."""
        with self._lock:
            self._values[self._RESUME] += 1
            self._values[self._RESUME_TAKEN] = 0
            return self._values[self._RESUME]

    def take_resume(self, token: int, base_seed: int) -> bool:
        """Whether the iteration with `base_seed` resumes at the state of `token`:
        every worker of the first iteration to ask does; a later iteration's workers,
        forked again from a main process that still holds the state, do not."""
        with self._lock:
            if self._values[self._RESUME] != token:
                return False
            if not self._values[self._RESUME_TAKEN]:
                self._values[self._RESUME_TAKEN] = 1
                self._values[self._RESUMED_BY] = base_seed
            return self._values[self._RESUMED_BY] == base_seed

    def resume(self, base_seed: int, epoch: int) -> None:
        """Workers resuming a saved state all run its epoch; the next iteration the one after."""
        with self._lock:
            self._values[self._SEED] = base_seed
            self._values[self._EPOCH] = epoch
            self._values[self._NEXT] = epoch + 1
            self._seen = (os.getpid(), self._values[self._SET_VERSION], epoch)

    def claim(self, base_seed: int) -> int:
        """The epoch this worker's next pass reads."""
        with self._lock:
            version = self._values[self._SET_VERSION]
            if self._seen is not None and self._seen[0] == os.getpid():
                _, seen_version, seen_epoch = self._seen
                epoch = self._values[self._SET_EPOCH] if version != seen_version else seen_epoch + 1
            else:
                if self._values[self._SEED] != base_seed:
                    self._values[self._SEED] = base_seed
                    self._values[self._EPOCH] = self._values[self._NEXT]
                    self._values[self._NEXT] += 1
                epoch = self._values[self._EPOCH]
            self._seen = (os.getpid(), version, epoch)
            return epoch

    def __getstate__(self) -> dict[str, Any]:
        if _spawning():
            return {"lock": self._lock, "values": self._values}
        # Pickled outside process start-up (e.g. saved): a fresh counter at its epoch.
        return {"epoch": self._values[self._NEXT]}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "epoch" in state:
            self.__init__(state["epoch"])  # type: ignore[misc]
            return
        self._lock, self._values, self._seen = state["lock"], state["values"], None


class _Known:
    """A position already worked out (unlike the live one, it pickles)."""

    def __init__(self, position: dict[str, Any]) -> None:
        self.position = position

    def __call__(self) -> dict[str, Any]:
        return self.position


_log = logging.getLogger("shardflow")
_workers_hinted = False


def _hint_workers_cost() -> None:
    """Says once per worker process (the first worker's) that torch's workers slow
    shardflow down when they have no Python work to share."""
    global _workers_hinted
    if _workers_hinted:
        return
    _workers_hinted = True
    _log.warning(
        "shardflow: torch DataLoader workers read this dataset, but it runs no Python "
        "map/filter. shardflow already decodes on its own threads, and each worker's "
        "batches are copied to the main process: expect a fraction of the speed of "
        "num_workers=0 (benches/peer_torch.py: 0.3x with 2 workers). Use num_workers=0 "
        "unless a Python transform or collate_fn needs the processes; see the README's "
        "PyTorch section."
    )


def _spawning() -> bool:
    from multiprocessing import context

    return context.get_spawning_popen() is not None


class IterableDataset(_TorchIterableDataset):
    """A ``torch.utils.data.IterableDataset`` over a shardflow dataset.

    The order is a function of (seed, epoch): every rank must use the same ``seed``
    (the default, 0, is shared). The epoch advances by one each pass, for 0 workers,
    for workers started afresh each epoch (torch's default) and for persistent ones,
    forked or spawned; :meth:`set_epoch` chooses it explicitly.

    ``state_dict()`` / ``load_state_dict()`` save and restore the position of the pass
    in progress, in each worker, as torchdata's ``StatefulDataLoader`` expects.
    """

    def __init__(
        self,
        dataset: sf.Dataset,
        batch_size: int | None = None,
        *,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        pad: bool | None = None,
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
        self.pad = pad
        self.rank = rank
        self.world_size = world_size
        self.num_threads = num_threads
        self.prefetch = prefetch
        self._epoch = _SharedEpoch(0)
        # Where the pass in progress in this process stands, worked out when asked: the
        # loader's state before the batch being yielded, and how many of its samples are
        # out. (Taking a loader's state costs about as much as making a batch, and
        # torch's loop asks for it only when saving.)
        self._position: Callable[[], dict[str, Any]] | None = None
        self._resume: dict[str, Any] | list[dict[str, Any]] | None = None
        # Set when the resume was loaded in the main process (see _SharedEpoch.new_resume).
        self._resume_token: int | None = None
        self._main_passes = 0

    def set_epoch(self, epoch: int) -> None:
        self._epoch.set(epoch)

    def _loader(self) -> sf.DataLoader:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is not None and worker == 0 and not self.dataset._runs_python():
            _hint_workers_cost()
        rank, world = _rank_and_world(self.rank, self.world_size)
        # Every (rank, worker) pair is one part of the epoch. Ranks must take the same
        # number of steps, so their shares are padded (by default); the workers of one
        # rank read its share between them, each row once.
        return sf.DataLoader(
            self.dataset,
            batch_size=self.batch_size or 256,
            shuffle=self.shuffle,
            seed=self.seed if self.shuffle else None,
            drop_last=self.drop_last,
            pad=self.pad,
            rank=rank,
            world_size=world,
            worker=worker,
            num_workers=workers,
            num_threads=self.num_threads or (1 if info is not None else None),
            prefetch=self.prefetch,
            output="torch" if self.batch_size else "numpy",
        )

    def __iter__(self) -> Iterator[Any]:
        loader = self._loader()
        info = get_worker_info()
        if info is not None:
            # Workers of one torch iteration share its base seed.
            iteration = info.seed - info.id
        else:
            # In the main process every pass is an iteration of its own.
            self._main_passes += 1
            iteration = -1 - self._main_passes
        skip = 0
        resume, self._resume = self._resume, None
        token, self._resume_token = self._resume_token, None
        if resume is not None and token is not None and not self._epoch.take_resume(token, iteration):
            resume = None  # an earlier iteration of this loader resumed it already
        if resume is not None:
            own = _own_state(loader, resume) if isinstance(resume, list) else resume
            if own is None:
                # Every worker of every rank, saved at one step: the rest of that epoch,
                # divided anew between this run's ranks and workers.
                loader.load_state_dict([_delivered(p) for p in resume])
                epoch = resume[0]["loader"]["epoch"]
            elif info is None and own.get("ended") and not isinstance(resume, list):
                # Saved in the main process after its pass ended (torch's iteration
                # ended with it): the next pass is the next epoch.
                epoch = own["loader"]["epoch"] + 1
                loader.set_epoch(epoch)
            else:
                loader.load_state_dict(own["loader"])
                skip = own["samples_out"]
                epoch = own["loader"]["epoch"]
            self._epoch.resume(iteration, epoch)
        else:
            loader.set_epoch(self._epoch.claim(iteration))
        return self._pass(loader, skip)

    def _pass(self, loader: sf.DataLoader, skip: int) -> Iterator[Any]:
        batches = iter(loader)
        while True:
            # Handed out sample by sample, a batch is resumed from the state before it.
            before = None if self.batch_size else loader.state_dict()
            batch = next(batches, None)
            if batch is None:
                # The pass has ended, but torch's other workers may still be handing out
                # batches of this epoch: the state is this epoch's, every row delivered,
                # so resuming it gives this worker nothing more of the epoch.
                self._position = _Known({"loader": loader._ended_state_dict(), "samples_out": 0, "ended": True})
                return
            if self.batch_size:
                # While this generator waits at `yield`, the loader stands right after
                # the batch, so its state can be taken then.
                self._position = lambda: {"loader": loader.state_dict(), "samples_out": 0}
                yield batch
                continue
            positions = loader._batch_positions()
            for i in range(skip, batch.num_rows):
                # Recorded before the sample leaves: a state taken after it counts it.
                self._position = _Known({"loader": before, "samples_out": i + 1, "positions": positions})
                yield batch.row(i)
            skip = 0

    def __getstate__(self) -> dict[str, Any]:
        # Pickled (for spawned workers, or a copy), the position is worked out now.
        state = self.__dict__.copy()
        if self._position is not None:
            state["_position"] = _Known(self._position())
        return state

    def state_dict(self) -> dict[str, Any]:
        """Where the pass in progress in this process stands (one state per worker
        under torch's workers); plain JSON-serialisable data."""
        return {"format": _STATE_FORMAT, "position": self._position() if self._position else None}

    def load_state_dict(self, state: dict[str, Any] | list[dict[str, Any]]) -> None:
        """The next pass in this process resumes at ``state``'s position: this worker's
        own state (as ``StatefulDataLoader`` passes it), or the list of every worker's
        state from every rank, saved at one step (see :func:`dataset_states`), to resume
        on another number of ranks or workers."""
        states = state if isinstance(state, list) else [state]
        for s in states:
            if s.get("format") != _STATE_FORMAT:
                raise ValueError(f"not a shardflow.torch.IterableDataset state: {s.get('format')!r}")
            if s.get("position") is None:
                raise ValueError("a state saved before its worker read anything cannot be resumed")
        if isinstance(state, list):
            self._resume = [s["position"] for s in states]
        else:
            self._resume = state["position"]
        # Loaded in a worker (as StatefulDataLoader does), the state is that worker's
        # alone. Loaded in the main process, each later iteration forks workers that
        # inherit it again, and only the first of them may resume.
        self._resume_token = self._epoch.new_resume() if get_worker_info() is None else None


def _own_state(loader: sf.DataLoader, resume: list[dict[str, Any]]) -> dict[str, Any] | None:
    """This part's own state among `resume`, when the states divided the epoch as this
    run does: it replays its own stream, and the samples it had handed out of its batch
    in progress are skipped, not repeated. None: the epoch is divided anew."""
    mine = loader.state_dict()

    def division(state: dict[str, Any]) -> tuple[int, int, bool]:
        # Padding divides nothing differently on one rank (world_size counts every
        # rank's workers).
        world, workers = state["world_size"], state.get("workers", 1)
        return world, workers, state["pad"] and world > workers

    if division(resume[0]["loader"]) != division(mine):
        return None
    own = [p for p in resume if p["loader"]["rank"] == mine["rank"]]
    return own[0] if own else None


def _delivered(position: dict[str, Any]) -> dict[str, Any]:
    """A worker's loader state with the samples it handed out of its batch in progress
    counted as delivered."""
    loader = dict(position["loader"])
    positions = position.get("positions")
    if position["samples_out"] and positions is None:
        raise ValueError(
            "a state does not say which samples it handed out (a flat_map or batched map "
            "changed the rows), so its epoch can resume only on the world size that saved it"
        )
    out = positions[: position["samples_out"]] if positions else []
    if out and loader.get("consumed") is not None:
        loader["consumed"] = list(loader["consumed"]) + [v for p in out for v in (p, p + 1)]
    return loader


def dataset_states(loader_state: dict[str, Any]) -> list[dict[str, Any]]:
    """The :class:`IterableDataset` states inside a ``StatefulDataLoader.state_dict()``:
    one per worker (one for ``num_workers=0``), in worker order."""
    snapshot = loader_state.get("_snapshot")
    if snapshot is None:
        return [loader_state["dataset_state"]]
    workers = snapshot["_worker_snapshots"]
    return [workers[f"worker_{i}"]["dataset_state"] for i in range(len(workers))]


_STATE_FORMAT = "shardflow.torch.IterableDataset/1"


class MapDataset(_TorchDataset):
    """A ``torch.utils.data.Dataset`` over a shardflow dataset (every format: stream
    formats through their record index). Works with any sampler, ``DistributedSampler``
    included; ``__getitems__`` lets torch fetch a whole batch of indices in one call,
    decoding each needed part of the data once. Weighted sampling is the dataset verb
    ``weighted_sample``, which a ``DistributedSampler`` then splits between ranks."""

    def __init__(self, dataset: sf.Dataset) -> None:
        if not isinstance(dataset, sf.Dataset):
            raise TypeError("MapDataset wraps a shardflow.Dataset")
        self.dataset = dataset

    def set_epoch(self, epoch: int) -> None:
        """Chooses the epoch that a full ``shuffle`` or a ``weighted_sample`` of the
        dataset draws for; call it with ``DistributedSampler.set_epoch``. Workers see it
        when they start (forked or spawned), so use it with non-persistent workers."""
        self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        return self.dataset.__getitems__(list(indices))
