"""The README's training loops, written literally, over local files and a real S3
server (SeaweedFS): every sample exactly once per epoch, a new order each epoch, and
no replay after a resume; alone, and as 2 ranks x 2 torch workers."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Seaweed, write_id_shards
from torch.utils.data import DataLoader as TorchLoader

import shardflow as sf
from shardflow.torch import IterableDataset

SIZES = [700, 301, 999, 0, 400]
TOTAL = sum(SIZES)
EPOCHS = 3


@pytest.fixture(scope="module", params=["local", "s3"])
def source(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("loops")
    pattern = write_id_shards(root, SIZES, row_group_size=100)
    if request.param == "local":
        return {"source": pattern}
    seaweed: Seaweed = request.getfixturevalue("seaweed")
    seaweed.upload_tree(root, "loops")
    return {"source": "s3://loops/shard-*.parquet", "storage_options": seaweed.storage_options()}


def ids(batch: dict) -> list[int]:
    return batch["id"].tolist()


def check_epochs(epochs: list[list[int]]) -> None:
    for order in epochs:
        assert sorted(order) == list(range(TOTAL))  # exactly once
    assert len({tuple(order) for order in epochs}) == len(epochs)  # a new order each epoch


def test_epochs_without_set_epoch(source: dict) -> None:
    ds = sf.dataset(**source)
    loader = sf.DataLoader(ds, batch_size=256, shuffle=True, seed=0)
    epochs = []
    for _epoch in range(EPOCHS):
        order: list[int] = []
        for batch in loader:
            order.extend(ids(batch))
        epochs.append(order)
    check_epochs(epochs)


def test_epochs_with_set_epoch(source: dict) -> None:
    ds = sf.dataset(**source)
    loader = sf.DataLoader(ds, batch_size=256, shuffle=True, seed=0, drop_last=True)
    epochs = []
    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        order: list[int] = []
        for batch in loader:
            order.extend(ids(batch))
        epochs.append(order)
    for order in epochs:
        assert len(order) == TOTAL // 256 * 256 == len(set(order))
    assert len({tuple(o) for o in epochs}) == EPOCHS
    # Without drop_last the same epochs, complete.
    loader = sf.DataLoader(ds, batch_size=256, shuffle=True, seed=0)
    full = []
    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        full.append([i for batch in loader for i in ids(batch)])
    check_epochs(full)


def test_resume_through_set_epoch(source: dict) -> None:
    def run(loader: sf.DataLoader, first_epoch: int, stop_at: tuple[int, int] | None = None) -> tuple[list[list[int]], dict | None]:
        seen: list[list[int]] = []
        for epoch in range(first_epoch, EPOCHS):
            loader.set_epoch(epoch)
            for step, batch in enumerate(loader):
                seen.append(ids(batch))
                if (epoch, step) == stop_at:
                    return seen, loader.state_dict()
        return seen, None

    ds = sf.dataset(**source)
    uninterrupted, _ = run(sf.DataLoader(ds, batch_size=100, shuffle=True, seed=0), 0)
    before, state = run(sf.DataLoader(ds, batch_size=100, shuffle=True, seed=0), 0, stop_at=(1, 6))
    assert state is not None and state["epoch"] == 1 and state["batches_done"] == 7
    # A new process would open the dataset again.
    resumed_loader = sf.DataLoader(sf.dataset(**source), batch_size=100, shuffle=True, seed=0)
    resumed_loader.load_state_dict(state)
    after, _ = run(resumed_loader, state["epoch"])
    assert before + after == uninterrupted  # no replay, nothing lost


def test_two_ranks_of_two_torch_workers(source: dict) -> None:
    ds = sf.dataset(**source)
    ranks = [
        TorchLoader(
            IterableDataset(ds, batch_size=64, shuffle=True, rank=rank, world_size=2),
            batch_size=None, num_workers=2, multiprocessing_context="fork",
        )
        for rank in range(2)
    ]
    epochs = []
    for _epoch in range(EPOCHS):
        order: list[int] = []
        for loader in ranks:
            for batch in loader:
                order.extend(ids(batch))
        epochs.append(order)
    check_epochs(epochs)


def test_readme_loop_on_one_process_matches_across_runs(source: dict, tmp_path: Path) -> None:
    # The same seed gives the same order in a new loader (and a new process).
    def epoch_order(epoch: int) -> list[int]:
        loader = sf.DataLoader(sf.dataset(**source), batch_size=256, shuffle=True, seed=0)
        loader.set_epoch(epoch)
        return [i for batch in loader for i in ids(batch)]

    assert epoch_order(2) == epoch_order(2) != epoch_order(1)
