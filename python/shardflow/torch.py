"""PyTorch adapters. Importing this module imports torch; ``import shardflow`` does not.

- :class:`IterableDataset` wraps a shardflow dataset for ``torch.utils.data.DataLoader``:
  each (rank, worker) reads its own disjoint part and together they read everything
  exactly once per epoch. Give ``batch_size`` to let shardflow batch (then use
  ``torch.utils.data.DataLoader(..., batch_size=None)``), or leave it None to yield
  samples for torch to collate.
- :class:`MapDataset` wraps a dataset with known row counts for torch samplers,
  ``DistributedSampler`` included.
- :func:`padding_free` lays a batch of packed rows out as the variable-length attention
  kernels take it.

Several ranks each get the same number of batches (their shares are padded with the
first rows again, as ``DistributedSampler`` pads, unless ``drop_last=True`` or
``pad=False``), so a DDP step never waits on a rank that ran out. A rank's share is then
cut between its workers, each row once: workers are never padded. To resume on another number of ranks or
workers, collect every worker's state from every rank (:func:`dataset_states` of each
rank's ``StatefulDataLoader.state_dict()``) and pass the list to
:meth:`IterableDataset.load_state_dict` before starting the new loader.
"""

from __future__ import annotations

import bisect
import collections
import logging
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import weakref
from pathlib import Path
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader as _TorchDataLoader
from torch.utils.data import Dataset as _TorchDataset
from torch.utils.data import IterableDataset as _TorchIterableDataset
from torch.utils.data import get_worker_info

import shardflow as sf

__all__ = ["IterableDataset", "MapDataset", "dataset_states", "padding_free"]


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

    def upcoming(self) -> int:
        """The epoch the next pass in this process will read, as far as it is known here."""
        if self._seen is not None and self._seen[0] == os.getpid() and self._seen[1] == self._values[self._SET_VERSION]:
            return self._seen[2] + 1
        return self._values[self._NEXT]

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

    ``divided_by`` says who divides the epoch between processes, where detecting it
    (among the callers, by accelerate's loader classes) is not wanted or cannot work:
    ``"accelerate-dispatch"`` (accelerate's ``DataLoaderDispatcher``, HF Trainer's
    default: process 0 reads every batch), ``"accelerate-shard"`` (its
    ``IterableDatasetShard``, ``dispatch_batches=False``: every process reads everything
    and keeps its slice), or ``"shardflow"`` (this adapter, by ``rank``/``world_size`` or
    torch.distributed). ``None`` (the default) detects it.

    ``trace`` keeps a timeline of each pass (see ``shardflow.DataLoader``); under torch
    workers, each worker writes its own file beside it (``trace.rank0-worker1.json``).
    :meth:`report` says whether training is input-bound.
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
        memory_limit: int | None = None,
        spill_dir: str | None = None,
        spill_bytes: int | None = None,
        divided_by: str | None = None,
        trace: str | os.PathLike[str] | None = None,
    ) -> None:
        if not isinstance(dataset, sf.Dataset):
            raise TypeError("IterableDataset wraps a shardflow.Dataset")
        if divided_by is not None and divided_by not in _DIVIDED_BY:
            raise ValueError(f"divided_by={divided_by!r}: use one of {sorted(_DIVIDED_BY)} or None (detect it)")
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
        # Each worker's loader's own, as sf.DataLoader takes them.
        self.memory_limit = memory_limit
        self.spill_dir = spill_dir
        self.spill_bytes = spill_bytes
        # The timeline's file; under torch workers each worker writes its own beside it
        # (trace.rank0-worker1.json).
        self.trace = trace
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
        # The framework that divides the dataset between its processes, when one does
        # (accelerate's loader class); None: shardflow does.
        self._divided_by: str | None = _DIVIDED_BY[divided_by] if divided_by else None
        self._detect_division = divided_by is None
        # Each worker's report of its last pass (see report()): a folder made here, so that
        # forked and spawned workers alike know it, removed with this object by the
        # process that made it.
        self._reports = tempfile.mkdtemp(prefix="shardflow-reports-")
        weakref.finalize(self, _remove_in, self._reports, os.getpid())
        self._main_loader: sf.DataLoader | None = None
        # Read the shards' metadata (Parquet footers, a JSON sample) here, once: forked
        # workers inherit it instead of each reading every shard's again (on the Hub,
        # files x workers requests against its rate limit).
        dataset._shard_table()

    def set_epoch(self, epoch: int) -> None:
        """Chooses the epoch the next pass reads (trainers call it each epoch); it
        reaches the workers, persistent ones included."""
        self._note_framework()
        self._epoch.set(epoch)

    def __len__(self) -> int:
        """This rank's samples (``batch_size=None``) or batches in the next pass, padding
        included, when the dataset knows them (what ``len()`` of a ``DataLoader`` of the
        rank gives); ``TypeError`` when it does not (after a filter), as torch expects of
        an iterable dataset without a length.

        Asked by a torch ``DataLoader`` with workers, it counts as that loader will
        deliver: each worker's part apart (torch batches each worker's samples on their
        own, so every worker may end on a short batch), so that ``len()`` of the loader
        is the number of batches it yields, which HF Trainer and Lightning count steps by."""
        self._note_framework()
        epoch = self._epoch.upcoming()
        reader = next((o for o in _callers() if isinstance(o, _TorchDataLoader) and o.dataset is self), None)
        workers = reader.num_workers if reader is not None else 0
        if workers == 0:
            return len(self._loader(batch_size=1 if self.batch_size is None else None, epoch=epoch))
        if self.batch_size is not None:
            return sum(len(self._loader(epoch=epoch, part=(w, workers))) for w in range(workers))
        rows = [len(self._loader(batch_size=1, epoch=epoch, part=(w, workers))) for w in range(workers)]
        if reader is None or reader.batch_size is None:
            return sum(rows)
        per_batch = reader.batch_size
        batches = sum(n // per_batch if reader.drop_last else -(-n // per_batch) for n in rows)
        # torch divides this by its batch size (rounding up, or down with drop_last).
        return batches * per_batch

    def _note_framework(self) -> None:
        """Remembers whether a framework divides this dataset between its processes itself
        (see :func:`_framework_division`); workers forked or spawned later inherit it.
        Follows Lightning's epoch, which it never passes to an iterable dataset."""
        if self._divided_by is None and self._detect_division:
            self._divided_by = _framework_division()
        epoch = _lightning_epoch()
        if epoch is not None and epoch != self._epoch.upcoming():
            self._epoch.set(epoch)

    def _loader(
        self, batch_size: int | None = None, epoch: int | None = None, part: tuple[int, int] | None = None,
        traced: bool = False,
    ) -> sf.DataLoader:
        """The loader of this process's part (``part``: of torch worker ``part[0]`` of
        ``part[1]`` instead), reading ``epoch`` when given; ``traced``: keeping the
        timeline asked for (only the loader a pass reads: the others write nothing)."""
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if part is not None:
            worker, workers = part
        if info is not None and worker == 0 and not self.dataset._runs_python():
            _hint_workers_cost()
        if self._divided_by is not None:
            # accelerate reads the whole epoch (on process 0, or on every process,
            # keeping its own slice): shardflow must not divide it as well.
            if self.world_size not in (None, 1):
                raise ValueError(
                    f"accelerate ({self._divided_by}) divides this dataset between its processes "
                    f"itself, so shardflow must read the whole epoch here; leave rank= and "
                    f"world_size= unset (world_size={self.world_size} would lose or repeat rows)"
                )
            rank, world = 0, 1
        else:
            rank, world = _rank_and_world(self.rank, self.world_size)
        # Every (rank, worker) pair is one part of the epoch. Ranks must take the same
        # number of steps, so their shares are padded (by default); the workers of one
        # rank read its share between them, each row once.
        loader = sf.DataLoader(
            self.dataset,
            batch_size=batch_size or self.batch_size or 256,
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
            memory_limit=self.memory_limit,
            spill_dir=self.spill_dir,
            spill_bytes=self.spill_bytes,
            output="torch" if self.batch_size else "numpy",
            trace=self._trace_of(rank, info.id if info is not None else None) if traced else None,
        )
        if epoch is not None:
            loader.set_epoch(epoch)
        return loader

    def __iter__(self) -> Iterator[Any]:
        self._note_framework()
        self._check_batching()
        loader = self._loader(traced=True)
        info = get_worker_info()
        if info is not None:
            # Workers of one torch iteration share its base seed.
            iteration = info.seed - info.id
        else:
            # In the main process every pass is an iteration of its own.
            self._main_loader = loader
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

    def _check_batching(self) -> None:
        """Refuses to batch twice: this adapter's batches read by a torch DataLoader that
        batches again (its ``batch_size`` not None, as HF Trainer's always is), or by
        accelerate's IterableDatasetShard, which slices samples."""
        if not self.batch_size:
            return
        for owner in _callers():
            kind = type(owner).__name__
            if (kind == "_IterableDatasetFetcher" and getattr(owner, "auto_collation", False)) or kind == "IterableDatasetShard":
                raise ValueError(
                    f"shardflow.torch.IterableDataset(batch_size={self.batch_size}) yields whole batches, "
                    f"and the loader reading it ({kind}) batches them again: give the adapter "
                    f"batch_size=None (it yields samples; torch, Trainer or accelerate batch them), or "
                    f"the torch DataLoader batch_size=None"
                )

    def _pass(self, loader: sf.DataLoader, skip: int) -> Iterator[Any]:
        batches = iter(loader)
        # Recent positions, so that a state can be taken some samples (or batches) back
        # (see _ahead): each sample's, or each batch's delivered rows.
        self._recent: collections.deque[Any] = collections.deque(maxlen=_RECENT)
        while True:
            # Handed out sample by sample, a batch is resumed from the state before it.
            before = None if self.batch_size else loader.state_dict()
            batch = next(batches, None)
            if batch is None:
                self._keep_report(loader)
                # The pass has ended, but torch's other workers may still be handing out
                # batches of this epoch: the state is this epoch's, every row delivered,
                # so resuming it gives this worker nothing more of the epoch.
                self._position = _Known({"loader": loader._ended_state_dict(), "samples_out": 0, "ended": True})
                return
            if self.batch_size:
                # While this generator waits at `yield`, the loader stands right after
                # the batch, so its state can be taken then.
                self._position = lambda: {"loader": loader.state_dict(), "samples_out": 0}
                if self._divided_by == "DataLoaderDispatcher":
                    self._recent.append(loader._batch_positions())
                yield batch
                continue
            positions = loader._batch_positions()
            if not self._recent:
                self._recent.append(_Known({"loader": before, "samples_out": skip, "positions": positions}))
            for i in range(skip, batch.num_rows):
                # Recorded before the sample leaves: a state taken after it counts it.
                self._position = _Known({"loader": before, "samples_out": i + 1, "positions": positions})
                self._recent.append(self._position)
                yield batch.row(i)
            skip = 0

    def _trace_of(self, rank: int, worker: int | None) -> str | None:
        """This process's timeline file: the one given, or beside it for a worker."""
        if self.trace is None or worker is None:
            return None if self.trace is None else os.fspath(self.trace)
        path = Path(self.trace)
        return str(path.with_name(f"{path.stem}.rank{rank}-worker{worker}{path.suffix}"))

    def _keep_report(self, loader: sf.DataLoader) -> None:
        """Leaves this worker's report of its pass where :meth:`report` finds it."""
        info = get_worker_info()
        if info is None:
            return
        rank = 0 if self._divided_by is not None else _rank_and_world(self.rank, self.world_size)[0]
        path = Path(self._reports) / f"rank-{rank}-worker-{info.id}.json"
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(loader.report().to_dict()))
        os.replace(temporary, path)

    def report(self) -> sf.Report:
        """Is training input-bound? The :class:`shardflow.Report` of this process's
        last pass: with torch workers, each worker's report of its last whole pass and a
        combined view naming the straggler (``parts``); with none, the loader's own."""
        found = sorted(Path(self._reports).glob("rank-*-worker-*.json"),
                       key=lambda p: [int(n) for n in p.stem.split("-")[1::2]])
        if found:
            reports = [sf.Report.from_dict(json.loads(p.read_text())) for p in found]
            labels = [" ".join(p.stem.split("-")) for p in found]
            return sf.Report.combine(reports, labels=labels)
        if self._main_loader is None:
            raise ValueError("report() describes a pass: iterate the dataset first")
        return self._main_loader.report()

    def _ahead(self) -> int:
        """How many samples (or, batching here, batches) this process's torch loader has
        taken beyond those trained on when a state is asked for: accelerate's batch
        dispatch fetches the next step's batches before the step that saves runs, and
        corrects its own counters for that (``adjust_state_dict_for_prefetch``) but not
        the dataset's state."""
        for owner in _callers():
            if type(owner).__name__ == "DataLoaderDispatcher" and not getattr(owner, "split_batches", True):
                ahead = owner.state.num_processes - 1
                if self.batch_size is None:
                    ahead *= getattr(owner.base_dataloader, "batch_size", None) or 1
                return ahead
        return 0

    def _rewound(self, position: dict[str, Any], back: int) -> dict[str, Any]:
        """``position`` taken ``back`` samples (batches) earlier in this pass."""
        if back == 0:
            return position
        kept = list(self._recent)
        if self.batch_size is None:
            # Every sample's position is kept (sharing the state before its batch); the
            # first is the pass's start.
            if back >= len(kept):
                raise ValueError(f"cannot take this state {back} samples back ({len(kept) - 1} kept)")
            return kept[-1 - back]()
        if back > len(kept):
            raise ValueError(f"cannot take this state {back} batches back ({len(kept)} kept)")
        loader = dict(position["loader"])
        loader["batches_done"] -= back
        dropped = kept[len(kept) - back :]
        if loader.get("consumed") is not None:
            if any(rows is None for rows in dropped):
                loader["consumed"] = None
            else:
                loader["consumed"] = _without(loader["consumed"], [p for rows in dropped for p in rows])
        return {**position, "loader": loader, "ended": False}

    def __getstate__(self) -> dict[str, Any]:
        # Pickled (for spawned workers, or a copy), the position is worked out now.
        state = self.__dict__.copy()
        if self._position is not None:
            state["_position"] = _Known(self._position())
        # The main process's loader is its own (a copy reports on its own passes).
        state["_main_loader"] = None
        return state

    def state_dict(self) -> dict[str, Any]:
        """Where the pass in progress in this process stands (one state per worker
        under torch's workers); plain JSON-serialisable data."""
        if self._position is None:
            return {"format": _STATE_FORMAT, "position": None}
        position = self._position()
        if self._divided_by == "DataLoaderDispatcher":
            position = self._rewound(position, self._ahead())
        return {"format": _STATE_FORMAT, "position": position}

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
                why = "a state saved before its worker read anything cannot be resumed"
                if "accelerate" in sys.modules:
                    # accelerate (1.15 at least) writes every process's loader state to
                    # one dl_state_dict.bin; under its batch dispatch only process 0
                    # reads, so whichever process wrote last decides what resumes.
                    why += (
                        " (accelerate's save_state writes every process's loader state to one "
                        "dl_state_dict.bin, and under its batch dispatch only process 0 reads: "
                        "another process's empty state may have replaced process 0's; after "
                        "save_state and wait_for_everyone, save process 0's again: "
                        "torch.save(loader.state_dict(), <dir>/dl_state_dict.bin))"
                    )
                raise ValueError(why)
        if isinstance(state, list):
            self._resume = [s["position"] for s in states]
        else:
            self._resume = state["position"]
        # Loaded in a worker (as StatefulDataLoader does), the state is that worker's
        # alone. Loaded in the main process, each later iteration forks workers that
        # inherit it again, and only the first of them may resume.
        self._resume_token = self._epoch.new_resume() if get_worker_info() is None else None


#: Positions kept for taking a state back (see IterableDataset._ahead): enough for 64
#: processes' worth of batches of 128 samples.
_RECENT = 1 << 13


def _without(flat: list[int], positions: list[int]) -> list[int]:
    """Flat ``[start, end)`` pairs of rows, less ``positions``."""
    out: list[int] = []
    removed = sorted(set(positions))
    for start, end in zip(flat[::2], flat[1::2]):
        at = start
        for p in removed[bisect.bisect_left(removed, start) : bisect.bisect_left(removed, end)]:
            if p > at:
                out += [at, p]
            at = p + 1
        if at < end:
            out += [at, end]
    return out


def _remove_in(folder: str, owner: int) -> None:
    """Removes `folder` if this is the process that made it (a forked worker's copy of
    the dataset is collected too, and must leave it)."""
    if os.getpid() == owner:
        shutil.rmtree(folder, ignore_errors=True)


def _callers(depth: int = 24) -> Iterator[object]:
    """The objects whose methods are on the call stack above the caller's caller."""
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return
        owner = frame.f_locals.get("self")
        if owner is not None:
            yield owner
        frame = frame.f_back


#: ``divided_by=`` values: the accelerate loader class each stands for (None: shardflow).
_DIVIDED_BY: dict[str, str | None] = {
    "accelerate-dispatch": "DataLoaderDispatcher",
    "accelerate-shard": "IterableDatasetShard",
    "shardflow": None,
}

#: Where the frameworks keep the classes detection looks for among the callers:
#: (module, class names). A framework version that moved them fails loudly here,
#: rather than the detection silently finding nothing (see :func:`_framework_classes`).
_FRAMEWORK_CLASSES = {
    "accelerate": ("accelerate.data_loader", ("DataLoaderDispatcher", "IterableDatasetShard")),
    "lightning": ("lightning.pytorch.loops.fit_loop", ("_FitLoop",)),
    "pytorch_lightning": ("pytorch_lightning.loops.fit_loop", ("_FitLoop",)),
}


def _framework_classes(framework: str) -> tuple[type, ...]:
    """The classes of ``framework`` (imported) that detection looks for, or an error
    naming the framework's version and ``divided_by=`` when this version has moved them."""
    import importlib

    module_name, names = _FRAMEWORK_CLASSES[framework]
    try:
        module = importlib.import_module(module_name)
        return tuple(getattr(module, name) for name in names)
    except (ImportError, AttributeError) as e:
        version = getattr(sys.modules.get(framework), "__version__", "?")
        raise RuntimeError(
            f"shardflow.torch looks for {framework}'s {', '.join(names)} in {module_name} to tell "
            f"whether {framework} divides the data between processes, and {framework} {version} has "
            f"no such class there ({e}); pass IterableDataset(divided_by=...) to say who divides it"
        ) from e


def _framework_division() -> str | None:
    """Which of accelerate's loaders, found among the callers, divides this dataset
    between processes itself: ``DataLoaderDispatcher`` (its default for an iterable
    dataset, and HF Trainer's: process 0 reads every batch and sends each process its
    slice) or ``IterableDatasetShard`` (``dispatch_batches=False``: every process reads
    everything and keeps its slice). Both call the dataset's ``set_epoch`` (and its
    ``__len__``) before they read it."""
    if "accelerate" not in sys.modules:
        return None
    classes = _framework_classes("accelerate")
    for owner in _callers():
        for kind in classes:
            if isinstance(owner, kind):
                return kind.__name__
    return None


def _lightning_epoch() -> int | None:
    """The epoch Lightning's fit loop, found among the callers, is about to train (it
    asks the loader's length, then makes its iterator, when an epoch's data is set up:
    at the start, and on resuming)."""
    loops = tuple(c for f in ("lightning", "pytorch_lightning") if f in sys.modules for c in _framework_classes(f))
    if not loops:
        return None
    for owner in _callers():
        if isinstance(owner, loops):
            return int(owner.epoch_progress.current.processed)
    return None


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
        dataset draws for. The sampler reading this dataset calls it too: see
        :meth:`_follow_sampler`. Workers see it when they start (forked or spawned), so
        use it with non-persistent workers."""
        self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        self._follow_sampler()
        return len(self.dataset)

    def _follow_sampler(self) -> None:
        """Makes the epoch of the sampler (or accelerate loader) reading this dataset its
        own. HF Trainer and accelerate call the sampler's ``set_epoch``, not the
        dataset's, when the sampler has one (``DistributedSampler``, accelerate's
        ``SeedableRandomSampler``), which left a ``weighted_sample`` drawing the same
        rows every epoch. Samplers ask the dataset's length when they are made and each
        time they are iterated; the one asking (found among the callers by what it holds
        and does: this dataset, and a ``set_epoch``) then also sets this dataset's epoch
        whenever its own is set, before torch starts the epoch's workers."""
        for owner in _callers():
            if owner is self or not (getattr(owner, "data_source", None) is self or getattr(owner, "dataset", None) is self):
                continue
            set_epoch = getattr(owner, "set_epoch", None)
            if callable(set_epoch) and not getattr(set_epoch, "_shardflow_follows", False):

                def follow(epoch: int, _own: Callable[[int], Any] = set_epoch) -> Any:
                    result = _own(epoch)
                    self.set_epoch(epoch)
                    return result

                follow._shardflow_follows = True  # type: ignore[attr-defined]
                owner.set_epoch = follow
                if isinstance(getattr(owner, "epoch", None), int):
                    self.set_epoch(owner.epoch)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        return self.dataset.__getitems__(list(indices))


def padding_free(batch: dict[str, Any] | Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A batch of token rows (packed by ``Dataset.pack``, or not) in the padding-free
    layout of TRL's ``DataCollatorForLanguageModeling(padding_free=True)``, which
    transformers' ``DataCollatorWithFlattening`` also gives, for flash attention's
    variable-length kernels: every row concatenated into ``input_ids`` of shape
    ``[1, total]``; ``position_ids`` restarting at 0 for every sequence (a row's
    ``seq_lengths`` tell its sequences apart, else the row is one); ``labels`` (the rows'
    ``labels``, else ``input_ids`` with -100 where ``assistant_masks`` is 0) with -100 at
    every sequence's first token; ``cu_seq_lens_q``/``_k`` (int32), ``max_length_q``/``_k``
    and ``seq_idx``. No ``attention_mask``: an all-ones mask makes the kernels ignore the
    boundaries. ``batch`` is what ``sf.DataLoader(..., output="torch")`` gives: a list of
    1-D tensors per column (or a 2-D tensor); or a list of rows, each a dict, as a
    torch ``DataLoader`` hands its ``collate_fn`` (so that this is HF Trainer's
    ``data_collator``)."""
    if not isinstance(batch, dict):
        rows_given = list(batch)
        batch = {name: [row[name] for row in rows_given] for name in rows_given[0]} if rows_given else {}

    def rows(name: str) -> list[torch.Tensor]:
        return [torch.as_tensor(row, dtype=torch.int64).reshape(-1) for row in batch[name]]

    input_ids = rows("input_ids")
    if "labels" in batch:
        labels = rows("labels")
    else:
        labels = [ids.clone() for ids in input_ids]
        if "assistant_masks" in batch:
            for row, mask in zip(labels, rows("assistant_masks")):
                row[mask == 0] = -100
    lengths = (
        [n for row in rows("seq_lengths") for n in row.tolist()]
        if "seq_lengths" in batch
        else [len(ids) for ids in input_ids]
    )
    lengths = [n for n in lengths if n > 0]
    flat = torch.cat(input_ids)[None]
    if sum(lengths) != flat.shape[1]:
        raise ValueError(f"the rows hold {flat.shape[1]} tokens but their seq_lengths add up to {sum(lengths)}")
    sizes = torch.tensor(lengths, dtype=torch.int64)
    cu_seq_lens = torch.cat([torch.zeros(1, dtype=torch.int64), sizes.cumsum(0)]).to(torch.int32)
    position_ids = torch.arange(flat.shape[1]) - torch.repeat_interleave(cu_seq_lens[:-1].to(torch.int64), sizes)
    flat_labels = torch.cat(labels)[None]
    flat_labels[position_ids[None] == 0] = -100
    longest = int(sizes.max()) if len(lengths) else 0
    return {
        "input_ids": flat,
        "labels": flat_labels,
        "position_ids": position_ids[None],
        "cu_seq_lens_q": cu_seq_lens,
        "cu_seq_lens_k": cu_seq_lens,
        "max_length_q": longest,
        "max_length_k": longest,
        "seq_idx": torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), sizes)[None],
    }
