"""The PyTorch adapters, end to end with torch's own DataLoader, workers and samplers."""

from __future__ import annotations

import logging
import pickle
import sys
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import FASHION_MNIST, read_idx, write_id_shards
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import DistributedSampler

import shardflow as sf
import shardflow.torch
from shardflow.torch import IterableDataset, MapDataset


@pytest.fixture(scope="module")
def ids(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_id_shards(tmp_path_factory.mktemp("ids"), [500, 333, 0, 711, 256], row_group_size=90)


TOTAL = 500 + 333 + 711 + 256


def read_ids(loader: TorchLoader) -> list[int]:
    out: list[int] = []
    for batch in loader:
        out.extend(batch["id"].tolist())
    return out


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_row_once_across_workers_and_ranks(ids: str, workers: int, shuffle: bool) -> None:
    for world in (1, 2, 3):
        seen: list[int] = []
        for rank in range(world):
            ds = IterableDataset(sf.dataset(ids), batch_size=37, shuffle=shuffle, rank=rank, world_size=world)
            loader = TorchLoader(ds, batch_size=None, num_workers=workers, multiprocessing_context="fork" if workers else None)
            got = read_ids(loader)
            assert all(isinstance(i, int) for i in got[:3])
            seen.extend(got)
        assert sorted(seen) == list(range(TOTAL)), (world, workers, shuffle)
        if shuffle:
            assert seen != sorted(seen)


def test_samples_for_torch_to_collate(ids: str) -> None:
    ds = IterableDataset(sf.dataset(ids, columns=["id", "value"]))
    loader = TorchLoader(ds, batch_size=64, num_workers=2, multiprocessing_context="fork")
    batches = list(loader)
    assert isinstance(batches[0]["id"], torch.Tensor) and batches[0]["id"].dtype == torch.int64
    assert sorted(torch.cat([b["id"] for b in batches]).tolist()) == list(range(TOTAL))


def test_spawn_and_persistent_workers_across_epochs(ids: str) -> None:
    ds = IterableDataset(sf.dataset(ids), batch_size=50, shuffle=True, seed=9)
    loader = TorchLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn", persistent_workers=True)
    first, second = read_ids(loader), read_ids(loader)
    assert sorted(first) == sorted(second) == list(range(TOTAL))
    assert first != second  # the epoch advanced in the workers


def test_datasets_pickle_as_their_recipe(ids: str) -> None:
    ds = sf.dataset(ids, columns=["id", "name"]).shuffle(buffer_size=50).skip(3).take(100)
    clone = pickle.loads(pickle.dumps(ds))
    assert list(clone) == list(ds)
    assert repr(clone) == repr(ds)


def test_map_dataset_with_distributed_sampler(tmp_path: Path) -> None:
    pattern = write_id_shards(tmp_path, [300, 200, 100], row_group_size=64)
    ds = sf.dataset(pattern)
    mapped = MapDataset(ds)
    assert len(mapped) == 600 and mapped[599]["id"] == 599 and mapped[-1]["id"] == 599
    with pytest.raises(IndexError):
        mapped[600]
    seen: list[int] = []
    for rank in range(2):
        sampler = DistributedSampler(mapped, num_replicas=2, rank=rank, shuffle=True, seed=1)
        sampler.set_epoch(3)
        loader = TorchLoader(mapped, sampler=sampler, batch_size=32, num_workers=2, multiprocessing_context="fork")
        rank_ids = [i for b in loader for i in b["id"].tolist()]
        assert rank_ids == [int(i) for i in sampler]  # the sampler's order, exactly
        seen.extend(rank_ids)
    assert sorted(seen) == list(range(600))


def test_map_dataset_indexes_stream_formats_and_what_ops_decide(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    assert sf.dataset(str(tmp_path / "a.jsonl"))[-1] == {"a": 2}
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "a.parquet")
    assert sf.dataset(str(tmp_path / "a.parquet")).filter(lambda r: r["a"] > 1)[0] == {"a": 2}
    fanned = MapDataset(sf.dataset(str(tmp_path / "a.parquet")).flat_map(lambda r: [r, {"a": -r["a"]}]))
    assert len(fanned) == 4 and fanned[3] == {"a": -2}
    assert sf.dataset(str(tmp_path / "a.parquet")).map(lambda r: {"b": r["a"] * 10})[1] == {"a": 2, "b": 20}


def test_torch_output_shares_the_arrow_buffers(tmp_path: Path) -> None:
    path = tmp_path / "z.parquet"
    pq.write_table(pa.table({"x": np.arange(1000, dtype=np.int64)}), path, row_group_size=1000)
    batches = list(sf.DataLoader(sf.dataset(str(path)), batch_size=100, output="torch"))
    tensors = [b["x"] for b in batches]
    # One decoded column, sliced: each batch's tensor starts where the previous ended,
    # inside the same Arrow buffer. A copy would put them in separate allocations.
    for a, b in zip(tensors, tensors[1:]):
        assert b.data_ptr() == a.data_ptr() + 100 * 8
    assert torch.cat(tensors).tolist() == list(range(1000))
    numpy_batch = next(iter(sf.DataLoader(sf.dataset(str(path)), batch_size=100)))
    tensor = torch.from_numpy(numpy_batch["x"])
    assert tensor.data_ptr() == numpy_batch["x"].base.address


def test_pin_memory_pins_with_cuda_and_is_a_noted_no_op_without(ids: str) -> None:
    # Runs on machines with and without a GPU, checking what each should do.
    if torch.cuda.is_available():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = sf.DataLoader(sf.dataset(ids), batch_size=10, output="torch", pin_memory=True)
        assert not [w for w in caught if "pin_memory" in str(w.message)]
        batch = next(iter(loader))
        assert batch["id"].is_pinned()
        assert batch["id"].tolist() == list(range(10))
    else:
        with pytest.warns(UserWarning, match="no CUDA device"):
            loader = sf.DataLoader(sf.dataset(ids), batch_size=10, output="torch", pin_memory=True)
        assert not next(iter(loader))["id"].is_pinned()
    unpinned = sf.DataLoader(sf.dataset(ids), batch_size=10, output="torch")
    assert not next(iter(unpinned))["id"].is_pinned()
    with pytest.raises(ValueError, match="output=\"torch\""):
        sf.DataLoader(sf.dataset(ids), pin_memory=True)


@pytest.fixture(scope="module")
def fashion_parquet(tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = tmp_path_factory.mktemp("fmnist")
    images = read_idx(FASHION_MNIST / "t10k-images-idx3-ubyte.gz")
    labels = read_idx(FASHION_MNIST / "t10k-labels-idx1-ubyte.gz").astype(np.int64)
    for part in range(4):
        rows = slice(part * 2500, (part + 1) * 2500)
        flat = pa.array(images[rows].reshape(-1))
        table = pa.table({"image": pa.FixedSizeListArray.from_arrays(flat, 784), "label": labels[rows]})
        pq.write_table(table, directory / f"train-{part}.parquet", row_group_size=500)
    return str(directory / "train-*.parquet")


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_training_an_epoch_lowers_the_loss(fashion_parquet: str, context: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    ds = IterableDataset(sf.dataset(fashion_parquet), batch_size=64, shuffle=True, seed=0, drop_last=True)
    loader = TorchLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context)
    losses = []
    for batch in loader:
        x = batch["image"].float() / 255.0
        loss = torch.nn.functional.cross_entropy(model(x), batch["label"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert len(losses) == 2 * (5000 // 64)  # each worker's share, full batches only
    assert np.mean(losses[-20:]) < 0.6 * np.mean(losses[:20])


def double(row: dict) -> dict:
    return {"id": row["id"] * 2}


@pytest.mark.parametrize("transform", [False, True])
def test_workers_without_python_work_get_a_hint_once(
    ids: str, transform: bool, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Forked workers inherit this process's "already said" flag; tests that run worker
    # code in this process (test_scale_out simulates workers) set it.
    monkeypatch.setattr(shardflow.torch, "_workers_hinted", False)
    ds = sf.dataset(ids, columns=["id"])
    if transform:
        ds = ds.map(double)
    loader = TorchLoader(IterableDataset(ds, batch_size=64), batch_size=None, num_workers=2, multiprocessing_context="fork")
    # The hint goes to the "shardflow" logger; under pytest the root logger's handler is
    # pytest's own, which a forked worker cannot report back, so print it here.
    handler = logging.StreamHandler(sys.stderr)
    logging.getLogger("shardflow").addHandler(handler)
    try:
        for _ in range(2):
            assert sorted(read_ids(loader)) == [i * (2 if transform else 1) for i in range(TOTAL)]
    finally:
        logging.getLogger("shardflow").removeHandler(handler)
    hints = capfd.readouterr().err.count("torch DataLoader workers read this dataset, but it runs no Python")
    # Workers started afresh each epoch are new processes: once per epoch at most.
    assert hints == (0 if transform else 2)
    # In the main process (0 workers) there is nothing to say.
    read_ids(TorchLoader(IterableDataset(sf.dataset(ids), batch_size=64), batch_size=None))
    assert "torch DataLoader workers" not in capfd.readouterr().err


def test_state_is_taken_when_asked_and_survives_pickling(ids: str) -> None:
    ds = IterableDataset(sf.dataset(ids, columns=["id"]), batch_size=100)
    batches = iter(ds)
    seen = [next(batches)["id"].tolist() for _ in range(3)]
    state = ds.state_dict()
    assert state == pickle.loads(pickle.dumps(ds)).state_dict()
    # The state taken between batches resumes right after the third.
    resumed = IterableDataset(sf.dataset(ids, columns=["id"]), batch_size=100)
    resumed.load_state_dict(state)
    rest = [i for b in resumed for i in b["id"].tolist()]
    assert sorted(sum(seen, []) + rest) == list(range(TOTAL))


@pytest.mark.parametrize(
    ("framework", "supported"), [("accelerate", (1, 0)), ("lightning", (2, 4))]
)
def test_framework_classes_are_where_detection_looks(framework: str, supported: tuple[int, int]) -> None:
    """For the installed version of each supported framework (pyproject's ranges): the
    classes the adapter finds among its callers are where it looks for them."""
    module = pytest.importorskip(framework)
    version = tuple(int(p) for p in module.__version__.split(".")[:2])
    assert version >= supported, f"{framework} {module.__version__} is older than pyproject allows"
    classes = shardflow.torch._framework_classes(framework)
    assert classes and all(isinstance(c, type) for c in classes)


def test_a_framework_that_moved_its_classes_fails_loudly(ids: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("accelerate")
    monkeypatch.setitem(shardflow.torch._FRAMEWORK_CLASSES, "accelerate", ("accelerate.data_loader", ("Renamed",)))
    adapter = IterableDataset(sf.dataset(ids))
    with pytest.raises(RuntimeError, match=r"accelerate .* no such class .*divided_by="):
        adapter.set_epoch(0)
    # Said explicitly, nothing is looked for.
    for said in ("shardflow", "accelerate-dispatch"):
        IterableDataset(sf.dataset(ids), divided_by=said).set_epoch(0)


def test_divided_by_says_who_divides_the_epoch(ids: str, monkeypatch: pytest.MonkeyPatch) -> None:
    everything = sorted(i for b in IterableDataset(sf.dataset(ids), batch_size=7) for i in b["id"].tolist())
    monkeypatch.setattr(shardflow.torch, "_framework_division", lambda: pytest.fail("detected despite divided_by="))
    # accelerate divides: this process reads the whole epoch, and a world_size would
    # divide it twice.
    whole = IterableDataset(sf.dataset(ids), batch_size=7, divided_by="accelerate-shard")
    assert sorted(i for b in whole for i in b["id"].tolist()) == everything
    with pytest.raises(ValueError, match="accelerate .* divides this dataset"):
        list(IterableDataset(sf.dataset(ids), batch_size=7, world_size=2, rank=0, divided_by="accelerate-dispatch"))
    # shardflow divides, by rank and world_size.
    halves = [IterableDataset(sf.dataset(ids), batch_size=7, rank=r, world_size=2, divided_by="shardflow") for r in (0, 1)]
    got = [i for h in halves for b in h for i in b["id"].tolist()]
    assert sorted(set(got)) == everything and len(got) <= len(everything) + 1
    with pytest.raises(ValueError, match="divided_by='accelerate'"):
        IterableDataset(sf.dataset(ids), divided_by="accelerate")
