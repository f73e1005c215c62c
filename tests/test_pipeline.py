"""Order, shape and completeness of what the pipeline delivers."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import ids_of, write_id_shards
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardflow as sf


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(0, 400), min_size=1, max_size=6),
    row_group=st.integers(1, 150),
    batch_size=st.integers(1, 97),
    num_threads=st.sampled_from([1, 2, 8]),
    seed=st.integers(0, 2**32),
    buffer_size=st.integers(1, 500),
    fmt=st.sampled_from(["parquet", "jsonl"]),
    drop_last=st.booleans(),
)
def test_every_row_exactly_once_per_epoch(
    sizes: list[int],
    row_group: int,
    batch_size: int,
    num_threads: int,
    seed: int,
    buffer_size: int,
    fmt: str,
    drop_last: bool,
) -> None:
    total = sum(sizes)
    with tempfile.TemporaryDirectory() as d:
        pattern = write_id_shards(Path(d), sizes, fmt, row_group)
        if total == 0 and fmt == "jsonl":
            return  # nothing to infer a schema from; covered by the Parquet case
        ds = sf.dataset(pattern).shuffle(seed=seed, buffer_size=buffer_size)
        loader = sf.DataLoader(ds, batch_size=batch_size, num_threads=num_threads, drop_last=drop_last)
        for epoch in range(2):
            loader.set_epoch(epoch)
            batches = list(loader)
            sizes_seen = [len(b["id"]) for b in batches]
            assert all(s == batch_size for s in sizes_seen[:-1])
            ids = ids_of(batches)
            if drop_last:
                assert all(s == batch_size for s in sizes_seen)
                assert len(ids) == total - total % batch_size
                assert len(set(ids)) == len(ids)
            else:
                assert sorted(ids) == list(range(total))


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_id_shards(tmp_path_factory.mktemp("ids"), [900, 1, 0, 1500, 733, 2000, 311], row_group_size=97)


def epoch_ids(pattern: str, epoch: int, **kwargs) -> list[int]:
    kwargs.setdefault("batch_size", 64)
    loader = sf.DataLoader(sf.dataset(pattern), **kwargs)
    loader.set_epoch(epoch)
    return ids_of(loader)


def test_same_seed_and_epoch_give_identical_batches_for_any_threads_and_prefetch(shards: str) -> None:
    reference = None
    for num_threads in (1, 2, 8):
        for prefetch in (1, 3, 16):
            loader = sf.DataLoader(
                sf.dataset(shards), batch_size=50, shuffle=True, seed=7, num_threads=num_threads, prefetch=prefetch
            )
            loader.set_epoch(3)
            batches = [b["id"].tolist() for b in loader]
            if reference is None:
                reference = batches
            assert batches == reference, (num_threads, prefetch)
    assert sorted(sum(reference, [])) == list(range(5445))


def test_different_seed_or_epoch_gives_a_different_order(shards: str) -> None:
    base = epoch_ids(shards, 0, shuffle=True, seed=1)
    assert base != list(range(5445))
    assert epoch_ids(shards, 0, shuffle=True, seed=2) != base
    assert epoch_ids(shards, 1, shuffle=True, seed=1) != base
    assert sorted(epoch_ids(shards, 1, shuffle=True, seed=1)) == sorted(base)


def test_shard_order_is_shuffled_not_just_rows(shards: str) -> None:
    # A buffer of one row shuffles nothing by itself: any change is the unit order.
    ds = sf.dataset(shards).shuffle(seed=5, buffer_size=1)
    ids = [r["id"] for r in ds]
    assert ids != sorted(ids)
    # Runs of consecutive ids (row groups) stay intact.
    breaks = sum(1 for a, b in zip(ids, ids[1:]) if b != a + 1)
    assert breaks < 80


def test_epochs_advance_automatically(shards: str) -> None:
    loader = sf.DataLoader(sf.dataset(shards), batch_size=1000, shuffle=True, seed=3)
    first, second = ids_of(loader), ids_of(loader)
    assert loader.epoch == 2
    assert first != second
    loader.set_epoch(0)
    assert ids_of(loader) == first


def test_unshuffled_order_is_shard_order(shards: str) -> None:
    assert epoch_ids(shards, 0) == list(range(5445))
    assert epoch_ids(shards, 5, num_threads=8) == list(range(5445))


def test_batches_cross_shard_boundaries(shards: str) -> None:
    loader = sf.DataLoader(sf.dataset(shards), batch_size=1000)
    sizes = [len(b["id"]) for b in loader]
    assert sizes == [1000] * 5 + [445]
    assert len(loader) == 6
    loader = sf.DataLoader(sf.dataset(shards), batch_size=1000, drop_last=True)
    assert [len(b["id"]) for b in loader] == [1000] * 5
    assert len(loader) == 5


def test_take_skip_filter_map_flat_map(shards: str) -> None:
    ds = sf.dataset(shards)
    assert len(ds.take(10)) == 10 and len(ds.skip(5000)) == 445 and len(ds.skip(10**9)) == 0
    assert [r["id"] for r in ds.skip(1000).take(3)] == [1000, 1001, 1002]
    evens = ds.filter(lambda r: r["id"] % 2 == 0)
    assert [r["id"] for r in evens.take(4)] == [0, 2, 4, 6]
    assert len(evens) == 2723  # the filter run once over the rows, as datasets runs it
    mapped = ds.map(lambda r: {"id": r["id"], "sq": r["id"] ** 2, "name": r["name"].upper()})
    assert len(mapped) == 5445
    # The returned dict is merged into the row (as datasets does).
    assert list(mapped.skip(3).take(1)) == [{"id": 3, "value": 1.5, "name": "ROW-3", "sq": 9}]
    flat = ds.take(3).flat_map(lambda r: [{"id": r["id"], "k": k} for k in range(r["id"])])
    assert [(r["id"], r["k"]) for r in flat] == [(1, 0), (2, 0), (2, 1)]


def test_batched_map_gets_numpy_columns_of_batch_size(shards: str) -> None:
    seen = []

    def double(batch: dict) -> dict:
        seen.append(len(batch["id"]))
        assert isinstance(batch["id"], np.ndarray)
        return {"id": batch["id"], "twice": batch["value"] * 2, "tensor": np.ones((len(batch["id"]), 2, 3), np.float32)}

    ds = sf.dataset(shards).map(double, batched=True, batch_size=300, batch_format="numpy")
    batch = next(iter(sf.DataLoader(ds, batch_size=5445)))
    assert seen[:-1] == [300] * (len(seen) - 1)
    np.testing.assert_array_equal(batch["twice"], np.arange(5445, dtype=np.float32))
    assert batch["tensor"].shape == (5445, 2, 3)
    row = next(iter(ds))
    assert isinstance(row["tensor"], np.ndarray) and row["tensor"].shape == (2, 3)


def test_map_results_infer_types(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(4)))

    def f(r: dict) -> dict:
        i = r["i"]
        return {
            "i": i,
            "f": np.float32(i) / 2,
            "arr": np.arange(i, dtype=np.int16),
            "maybe": None if i == 1 else str(i),
            "nested": {"k": [i] * i, "b": bytes([i])},
        }

    rows = list(sf.dataset(str(path)).map(f))
    assert [r["maybe"] for r in rows] == ["0", None, "2", "3"]
    assert [r["nested"] for r in rows] == [{"k": [i] * i, "b": bytes([i])} for i in range(4)]
    batch = next(iter(sf.DataLoader(sf.dataset(str(path)).map(f), batch_size=4)))
    assert batch["f"].dtype == np.float32
    assert [a.dtype for a in batch["arr"]] == [np.int16] * 4
    assert [a.tolist() for a in batch["arr"]] == [list(range(i)) for i in range(4)]


def test_user_function_errors_propagate_unchanged(shards: str) -> None:
    class Boom(Exception):
        pass

    def explode(r: dict) -> dict:
        if r["id"] == 123:
            raise Boom("at 123")
        return r

    with pytest.raises(Boom, match="at 123"):
        list(sf.dataset(shards).map(explode))
    with pytest.raises(TypeError, match="dict per sample"):
        list(sf.dataset(shards).map(lambda r: 5))


def test_bad_arguments_are_value_errors(shards: str) -> None:
    ds = sf.dataset(shards)
    for call in (
        lambda: sf.DataLoader(ds, batch_size=0),
        lambda: sf.DataLoader(ds, seed=1),
        lambda: sf.DataLoader(ds, output="torch2"),
        lambda: sf.DataLoader(ds, num_threads=0),
        lambda: ds.take(-1),
        lambda: ds.shuffle(buffer_size=0),
        lambda: ds.map(lambda r: r, batch_size=3),
        lambda: sf.dataset(shards, on_error="ignore"),
        lambda: sf.dataset(shards, format="xml"),
    ):
        with pytest.raises(ValueError):
            call()
    with pytest.raises(sf.InvalidArgumentError):
        sf.dataset(shards, format="xml")


def test_state_dict_resumes_exactly(shards: str) -> None:
    def make() -> sf.DataLoader:
        return sf.DataLoader(sf.dataset(shards), batch_size=100, shuffle=True, seed=11)

    loader = make()
    loader.set_epoch(2)
    full = [b["id"].tolist() for b in loader]
    loader.set_epoch(2)
    it = iter(loader)
    head = [next(it)["id"].tolist() for _ in range(17)]
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["epoch"] == 2 and state["batches_done"] == 17
    del it

    resumed = make()
    resumed.load_state_dict(state)
    tail = [b["id"].tolist() for b in resumed]
    assert head + tail == full
    assert resumed.state_dict()["epoch"] == 3 and resumed.state_dict()["batches_done"] == 0

    with pytest.raises(ValueError, match="batch_size"):
        sf.DataLoader(sf.dataset(shards), batch_size=7, shuffle=True).load_state_dict(state)


def test_breaking_off_an_epoch_starts_the_next_one(shards: str) -> None:
    loader = sf.DataLoader(sf.dataset(shards), batch_size=100, shuffle=True, seed=1)
    next(iter(loader))
    assert loader.state_dict()["epoch"] == 0
    assert len(list(loader)) == 55
    assert loader.state_dict()["epoch"] == 2


def test_stats_count_rows_batches_bytes_files_and_time(shards: str) -> None:
    loader = sf.DataLoader(sf.dataset(shards), batch_size=128)
    n = sum(len(b["id"]) for b in loader)
    s = loader.stats()
    assert s["rows"] == n == 5445
    assert s["batches"] == 43
    assert s["files_opened"] == 6  # the empty shard has no row groups to read
    assert s["bytes_read"] > 5445 * 8
    assert s["decode_seconds"] > 0 and s["wait_seconds"] >= 0
    assert s["skipped_records"] == 0 and s["skipped_units"] == 0


def test_arrow_stream_of_dataset_and_loader(shards: str) -> None:
    import pyarrow as pa

    table = pa.RecordBatchReader.from_stream(sf.dataset(shards)).read_all()
    assert table.column("id").to_pylist() == list(range(5445))
    loader = sf.DataLoader(sf.dataset(shards), batch_size=1000)
    reader = pa.RecordBatchReader.from_stream(loader)
    assert [b.num_rows for b in reader] == [1000] * 5 + [445]
    mapped = sf.dataset(shards).take(10).map(lambda r: {"x": r["id"] + 1})
    assert pa.RecordBatchReader.from_stream(mapped).read_all().column("x").to_pylist() == list(range(1, 11))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=5),
    row_group=st.integers(1, 120),
    world=st.integers(1, 4),
    batch_size=st.integers(1, 64),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    fmt=st.sampled_from(["parquet", "jsonl"]),
)
def test_ranks_split_every_epoch_exactly_once(
    sizes: list[int], row_group: int, world: int, batch_size: int, shuffle: bool, drop_last: bool, fmt: str
) -> None:
    total = sum(sizes)
    if fmt == "jsonl" and total == 0:
        return
    with tempfile.TemporaryDirectory() as d:
        pattern = write_id_shards(Path(d), sizes, fmt, row_group)
        per_rank = []
        for rank in range(world):
            loader = sf.DataLoader(
                sf.dataset(pattern), batch_size=batch_size, shuffle=shuffle, seed=3 if shuffle else None,
                drop_last=drop_last, pad=False, rank=rank, world_size=world,
            )
            loader.set_epoch(1)
            batches = list(loader)
            per_rank.append(ids_of(batches))
            assert len(loader) == len(batches)  # lengths are known per rank (JSONL by its index)
        everything = sorted(i for ids in per_rank for i in ids)
        assert len(set(everything)) == len(everything)  # nothing twice
        # Row counts known: contiguous shares, equal (drop_last) or within one row.
        sizes_per_rank = [len(ids) for ids in per_rank]
        if drop_last:
            assert len(set(sizes_per_rank)) == 1
            share = total // world
            assert all(s == share - share % batch_size for s in sizes_per_rank)
        else:
            assert max(sizes_per_rank) - min(sizes_per_rank) <= 1
            assert everything == list(range(total))


def test_rank_arguments_are_checked(shards: str) -> None:
    ds = sf.dataset(shards)
    with pytest.raises(ValueError, match="rank must be in"):
        sf.DataLoader(ds, rank=2, world_size=2)
    with pytest.raises(ValueError, match="together"):
        sf.DataLoader(ds, rank=0)
