"""The training loop's defaults read every sample exactly once per epoch, in a new
order each epoch, on any number of ranks and workers, and resume where they stopped;
where that cannot be guaranteed they raise. One test (or group) per review finding."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import ids_of, write_id_shards

import shardflow as sf

SIZES = [1000, 999, 1, 1996]  # 3,996 rows, as in the review
TOTAL = sum(SIZES)


@pytest.fixture(scope="module")
def parquet(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_id_shards(tmp_path_factory.mktemp("pq"), SIZES, row_group_size=128)


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_id_shards(tmp_path_factory.mktemp("jsonl"), SIZES, fmt="jsonl")


def read_parts(ds: sf.Dataset, parts: int, **loader_args: object) -> list[list[int]]:
    """What each of `parts` ranks reads, without padding (every row exactly once)."""
    return [
        ids_of(sf.DataLoader(ds, batch_size=64, rank=part, world_size=parts, pad=False, **loader_args))
        for part in range(parts)
    ]


# ---- 2. one shared default seed ---------------------------------------------------


def test_shuffle_without_seed_on_several_ranks_reads_each_row_once(parquet: str) -> None:
    # Each rank builds its own loader (as separate processes do), with no seed given.
    parts = [ids_of(sf.DataLoader(sf.dataset(parquet), batch_size=50, shuffle=True, rank=r, world_size=2)) for r in range(2)]
    assert sorted(parts[0] + parts[1]) == list(range(TOTAL))
    parts = [ids_of(sf.DataLoader(sf.dataset(parquet).shuffle(), batch_size=50, rank=r, world_size=2)) for r in range(2)]
    assert sorted(parts[0] + parts[1]) == list(range(TOTAL))
    # Shuffled all the same, and differently from the file order.
    assert parts[0] != sorted(parts[0])


def test_default_seed_is_zero(parquet: str) -> None:
    def order(**kw: object) -> list[int]:
        return ids_of(sf.DataLoader(sf.dataset(parquet), batch_size=100, shuffle=True, **kw))

    assert order() == order(seed=0) != order(seed=1)
    assert list(sf.dataset(parquet).shuffle()) == list(sf.dataset(parquet).shuffle(seed=0))


# ---- 4. take/skip count rows of the whole dataset ----------------------------------


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
@pytest.mark.parametrize("parts", [1, 2, 4])
def test_take_and_skip_are_global(parquet: str, jsonl: str, fmt: str, parts: int) -> None:
    ds = sf.dataset(parquet if fmt == "parquet" else jsonl)
    got = read_parts(ds.take(1000), parts)
    assert sorted(sum(got, [])) == list(range(1000))
    got = read_parts(ds.skip(3000), parts)
    assert sorted(sum(got, [])) == list(range(3000, TOTAL))
    got = read_parts(ds.skip(10).take(25), parts, shuffle=True, seed=3)
    assert sorted(sum(got, [])) == list(range(10, 35))


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_take_after_a_shuffle_is_the_same_rows_on_any_number_of_parts(parquet: str, jsonl: str, fmt: str) -> None:
    ds = sf.dataset(parquet if fmt == "parquet" else jsonl).shuffle(seed=5, buffer_size=300).take(700)
    one = ids_of(sf.DataLoader(ds, batch_size=64))
    assert len(one) == len(set(one)) == 700
    for parts in (2, 3):
        got = read_parts(ds, parts)
        assert sorted(sum(got, [])) == sorted(one)
        assert max(map(len, got)) - min(map(len, got)) <= 1


def test_lengths_agree_with_what_parts_read(parquet: str) -> None:
    ds = sf.dataset(parquet)
    for view in (ds.take(1000), ds.skip(3000), ds.shuffle(seed=1).take(999), ds.skip(5).take(1001)):
        for parts in (1, 3):
            for drop_last in (False, True):
                for part in range(parts):
                    loader = sf.DataLoader(view, batch_size=32, rank=part, world_size=parts, drop_last=drop_last)
                    assert len(loader) == len(list(loader)), (view, parts, part, drop_last)
    assert len(ds.take(1000)) == 1000 and len(ds.skip(3990)) == 6


def test_take_in_torch_workers_and_ranks(parquet: str) -> None:
    from torch.utils.data import DataLoader as TorchLoader

    from shardflow.torch import IterableDataset

    seen: list[int] = []
    for rank in range(2):
        wrapped = IterableDataset(sf.dataset(parquet).take(1000), batch_size=37, rank=rank, world_size=2)
        for batch in TorchLoader(wrapped, batch_size=None, num_workers=2, multiprocessing_context="fork"):
            seen.extend(batch["id"].tolist())
    assert sorted(seen) == list(range(1000))


# ---- 5. checkpoints resume what they saved ------------------------------------------


def test_set_epoch_after_load_state_dict_keeps_the_position(parquet: str) -> None:
    def loader() -> sf.DataLoader:
        return sf.DataLoader(sf.dataset(parquet), batch_size=64, shuffle=True, seed=2)

    first = loader()
    first.set_epoch(0)
    full = list(first)
    assert len(full) == 63
    saved = None
    again = loader()
    again.set_epoch(0)
    for i, _ in enumerate(again):
        if i == 6:
            saved = again.state_dict()
            break
    assert saved is not None and json.loads(json.dumps(saved)) == saved
    resumed = loader()
    resumed.load_state_dict(saved)
    rest = []
    for epoch in range(saved["epoch"], 2):
        resumed.set_epoch(epoch)  # the README's loop
        batches = list(resumed)
        if epoch == 0:
            rest = batches
    assert len(rest) == 63 - 7
    assert [b["id"].tolist() for b in rest] == [b["id"].tolist() for b in full[7:]]
    # A different epoch starts that epoch afresh.
    other = loader()
    other.load_state_dict(saved)
    other.set_epoch(1)
    assert len(list(other)) == 63


def test_a_state_names_its_dataset_rank_and_drop_last(parquet: str, tmp_path: Path) -> None:
    loader = sf.DataLoader(sf.dataset(parquet), batch_size=64, rank=0, world_size=2)
    state = loader.state_dict()
    other_data = write_id_shards(tmp_path, [10, 20])
    with pytest.raises(ValueError, match="dataset"):
        sf.DataLoader(sf.dataset(other_data), batch_size=64, rank=0, world_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match="dataset"):
        sf.DataLoader(sf.dataset(parquet).take(10), batch_size=64, rank=0, world_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match="dataset"):
        sf.DataLoader(sf.dataset(parquet, columns=["id"]), batch_size=64, rank=0, world_size=2).load_state_dict(state)
    # Another rank's state alone (frameworks checkpoint rank 0's) resumes a rank whose
    # share is as long at the same batch of its own stream: a filter on padded ranks
    # too (its pass makes the shares equal); where shares are not known to be as long
    # (a filter on unpadded ranks decides them as it runs), it is refused.
    kept = sf.dataset(parquet).filter(lambda row: row["id"] % 3 > 0)
    for ds in (sf.dataset(parquet), kept):
        first = sf.DataLoader(ds, batch_size=64, rank=0, world_size=2)
        next(iter(first))
        rank1 = sf.DataLoader(ds, batch_size=64, rank=1, world_size=2)
        whole = [b["id"].tolist() for b in rank1]
        rank1.load_state_dict(first.state_dict())
        assert [b["id"].tolist() for b in rank1] == whole[1:]
    filtered = sf.DataLoader(kept, batch_size=64, rank=0, world_size=2, pad=False)
    next(iter(filtered))
    with pytest.raises(ValueError, match="rank"):
        sf.DataLoader(kept, batch_size=64, rank=1, world_size=2, pad=False).load_state_dict(filtered.state_dict())
    with pytest.raises(ValueError, match="drop_last"):
        sf.DataLoader(sf.dataset(parquet), batch_size=64, rank=0, world_size=2, drop_last=True).load_state_dict(state)
    # Another world size resumes elastically: from this one state when ranks move in
    # lockstep, from every rank's state otherwise.
    sf.DataLoader(sf.dataset(parquet), batch_size=64, rank=0, world_size=3).load_state_dict(state)
    buffered = sf.dataset(parquet).shuffle(seed=1, buffer_size=100)
    mid_epoch = sf.DataLoader(buffered, batch_size=64, rank=0, world_size=2)
    next(iter(mid_epoch))  # (a state of an epoch nothing was delivered of resumes anywhere)
    one = mid_epoch.state_dict()
    with pytest.raises(ValueError, match="every rank's state_dict"):
        sf.DataLoader(buffered, batch_size=64, rank=0, world_size=3).load_state_dict(one)
    # The same dataset, opened again, is the same dataset.
    sf.DataLoader(sf.dataset(parquet), batch_size=64, rank=0, world_size=2).load_state_dict(state)
    # A seed is part of the dataset's ops.
    shuffled = sf.DataLoader(sf.dataset(parquet).shuffle(seed=1), batch_size=64).state_dict()
    with pytest.raises(ValueError, match="dataset"):
        sf.DataLoader(sf.dataset(parquet).shuffle(seed=2), batch_size=64).load_state_dict(shuffled)


def test_a_changed_file_is_another_dataset(tmp_path: Path) -> None:
    pattern = write_id_shards(tmp_path, [100, 50])
    state = sf.DataLoader(sf.dataset(pattern), batch_size=10).state_dict()
    write_id_shards(tmp_path, [100, 60])
    with pytest.raises(ValueError, match="dataset"):
        sf.DataLoader(sf.dataset(pattern), batch_size=10).load_state_dict(state)


# ---- 6. files whose headers differ ---------------------------------------------------


def test_csv_columns_match_by_name(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("first,last\ncid,park\n")
    (tmp_path / "b.csv").write_text("last,first\npark,cid\n")
    rows = list(sf.dataset(str(tmp_path / "*.csv")))
    assert rows == [{"first": "cid", "last": "park"}, {"first": "cid", "last": "park"}]
    import pyarrow.dataset as pads

    assert pads.dataset(str(tmp_path), format="csv").to_table().to_pylist() == rows


def test_csv_missing_and_extra_columns(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("x,y\n1,2\n")
    (tmp_path / "b.csv").write_text("y\n3\n")
    with pytest.raises(sf.SchemaError, match=r"b\.csv.*\"x\""):
        list(sf.dataset(str(tmp_path / "*.csv")))
    rows = list(sf.dataset(str(tmp_path / "*.csv"), format_options={"missing_columns": "null"}))
    assert rows == [{"x": 1, "y": 2}, {"x": None, "y": 3}]
    (tmp_path / "b.csv").write_text("y,x,z\n3,4,5\n")
    assert list(sf.dataset(str(tmp_path / "*.csv"), columns=["x"])) == [{"x": 1}, {"x": 4}]


def test_jsonl_fields_match_by_name(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"first": "cid", "last": "park"}\n')
    (tmp_path / "b.jsonl").write_text('{"last": "park", "first": "cid"}\n')
    assert list(sf.dataset(str(tmp_path / "*.jsonl"))) == [{"first": "cid", "last": "park"}] * 2


# ---- 7. one schema per mapped dataset ------------------------------------------------


def test_map_types_are_inferred_once(parquet: str) -> None:
    ds = sf.dataset(parquet, columns=["id"])

    def half_floats(row: dict) -> dict:
        return {"x": 1 if row["id"] < 2000 else 1.5}

    with pytest.raises(sf.SchemaError, match=r"half_floats.*\"x\".*[Ff]loat64.*[Ii]nt64"):
        list(sf.DataLoader(ds.map(half_floats), batch_size=500))
    # Given a schema, every batch has it.
    typed = ds.map(half_floats, schema=pa.schema([("x", pa.float64())]))
    batches = list(sf.DataLoader(typed, batch_size=500))
    assert {b["x"].dtype for b in batches} == {np.dtype(np.float64)}
    assert sum(b["x"].sum() for b in batches) == 2000 * 1 + (TOTAL - 2000) * 1.5
    # Ints that come after floats are widened to float, losing nothing.
    later_ints = ds.map(lambda row: {"x": 0.5 if row["id"] < 2000 else 7})
    batches = list(sf.DataLoader(later_ints, batch_size=500))
    assert {b["x"].dtype for b in batches} == {np.dtype(np.float64)}
    assert batches[-1]["x"][-1] == 7.0


# ---- 3. the torch adapter's epoch advances in every worker mode ----------------------

TORCH_MODES = [
    pytest.param(0, None, False, id="no-workers"),
    pytest.param(2, "fork", False, id="fork"),
    pytest.param(2, "fork", True, id="fork-persistent"),
    pytest.param(2, "spawn", False, id="spawn"),
    pytest.param(2, "spawn", True, id="spawn-persistent"),
]


@pytest.mark.parametrize(("workers", "context", "persistent"), TORCH_MODES)
def test_torch_epochs_advance(parquet: str, workers: int, context: str | None, persistent: bool) -> None:
    from torch.utils.data import DataLoader as TorchLoader

    from shardflow.torch import IterableDataset

    wrapped = IterableDataset(sf.dataset(parquet), batch_size=100, shuffle=True)
    loader = TorchLoader(
        wrapped, batch_size=None, num_workers=workers, multiprocessing_context=context,
        persistent_workers=persistent,
    )

    def epoch() -> list[int]:
        return [i for batch in loader for i in batch["id"].tolist()]

    orders = [epoch() for _ in range(3)]
    for order in orders:
        assert sorted(order) == list(range(TOTAL))
    assert len({tuple(o) for o in orders}) == 3
    # set_epoch still chooses the epoch, in the workers too.
    wrapped.set_epoch(0)
    assert sorted(epoch()) == sorted(orders[0])
    wrapped.set_epoch(0)
    replay = epoch()
    wrapped.set_epoch(1)
    assert replay != epoch()
    if workers == 0 or not persistent:
        wrapped.set_epoch(0)
        assert epoch() == orders[0]


# ---- 5. the torch adapter's state, as torchdata's StatefulDataLoader uses it -----------


def shardflow_states(state: object) -> Iterator[dict]:
    """Every IterableDataset state nested in a StatefulDataLoader state."""
    if isinstance(state, dict):
        if state.get("format") == "shardflow.torch.IterableDataset/1":
            yield state
            return
        for value in state.values():
            yield from shardflow_states(value)


@pytest.mark.parametrize(("workers", "batch_size"), [(0, 50), (2, 50), (2, None)])
def test_torch_iterable_dataset_resumes_in_stateful_dataloader(parquet: str, workers: int, batch_size: int | None) -> None:
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader

    from shardflow.torch import IterableDataset

    def make() -> StatefulDataLoader:
        wrapped = IterableDataset(sf.dataset(parquet), batch_size=batch_size, shuffle=True, seed=4)
        return StatefulDataLoader(
            wrapped, batch_size=None if batch_size else 40, num_workers=workers,
            multiprocessing_context="fork" if workers else None,
        )

    def as_ids(batch: dict) -> list[int]:
        return batch["id"].tolist() if isinstance(batch["id"], torch.Tensor) else list(batch["id"])

    whole = [as_ids(b) for b in make()]
    assert sorted(i for b in whole for i in b) == list(range(TOTAL))
    first = make()
    before = []
    for step, batch in enumerate(first):
        before.append(as_ids(batch))
        if step == 12:
            state = first.state_dict()
            break
    # The dataset's own states (one per worker) are in it, as plain JSON: torchdata does
    # not fall back on replaying the samples already seen.
    own = list(shardflow_states(state))
    assert len(own) == max(workers, 1)
    assert all(json.loads(json.dumps(s)) == s and s["position"] is not None for s in own)
    resumed = make()
    resumed.load_state_dict(state)
    after = [as_ids(b) for b in resumed]
    assert before + after == whole
