"""Datasets over records already in memory (`from_arrow`, `from_dict`, `from_list`), and
the rule they test hardest: a batch never lets a consumer write into memory that
outlives it (the user's table, what the next read returns)."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

import shardflow as sf


def table(n: int = 1000) -> pa.Table:
    ids = np.arange(n, dtype=np.int64)
    image = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(n * 4, dtype=np.float32)), 4)
    return pa.table({"id": ids, "x": ids.astype(np.float64), "image": image, "name": [f"n{i}" for i in ids]})


def test_from_arrow_reads_the_table(tmp_path: object) -> None:
    t = table()
    ds = sf.from_arrow(t)
    assert len(ds) == 1000 and ds.column_names == ["id", "x", "image", "name"]
    rows = list(ds)
    assert [r["id"] for r in rows] == t.column("id").to_pylist()
    assert rows[3]["name"] == "n3" and rows[3]["image"].tolist() == [12.0, 13.0, 14.0, 15.0]
    assert ds[-1]["id"] == 999
    batches = list(sf.DataLoader(ds, batch_size=64, shuffle=True, seed=1))
    assert sorted(i for b in batches for i in b["id"].tolist()) == list(range(1000))
    assert batches[0]["image"].shape == (64, 4)


@pytest.mark.parametrize("make", [
    pytest.param(lambda t: t, id="table"),
    pytest.param(lambda t: t.to_batches(max_chunksize=100)[0], id="record-batch"),
    pytest.param(lambda t: pa.RecordBatchReader.from_batches(t.schema, t.to_batches(max_chunksize=300)), id="reader"),
    pytest.param(lambda t: pl.from_arrow(t.select(["id", "x", "name"])), id="polars"),
])
def test_from_arrow_takes_any_arrow_exporter(make: object) -> None:
    t = table()
    ds = sf.from_arrow(make(t))  # type: ignore[operator]
    ids = [r["id"] for r in ds]
    assert ids == list(range(len(ids))) and len(ids) in (100, 1000)


def test_writing_into_a_batch_changes_neither_the_table_nor_later_reads() -> None:
    t = table()
    before = t.to_pydict()
    loader = sf.DataLoader(sf.from_arrow(t), batch_size=100)
    for batch in loader:
        batch["x"] /= 255  # the README's kind of in-place step
        batch["image"][:] = -1
    assert t.to_pydict() == before
    again = next(iter(loader))
    np.testing.assert_array_equal(again["x"], np.arange(100, dtype=np.float64))
    # Random access too.
    ds = sf.from_arrow(t)
    row = ds[5]
    row["image"][:] = 0
    assert ds[5]["image"].tolist() == [20.0, 21.0, 22.0, 23.0]


def test_torch_output_gives_writable_tensors_without_warnings() -> None:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batch = next(iter(sf.DataLoader(sf.from_arrow(table()), batch_size=10, output="torch")))
    assert isinstance(batch["x"], torch.Tensor)
    batch["x"].mul_(2)


def test_from_dict_and_from_list() -> None:
    ds = sf.from_dict({"a": np.arange(5), "b": ["p", "q", "r", "s", "t"]})
    assert list(ds) == [{"a": i, "b": c} for i, c in enumerate("pqrst")]
    assert len(ds.take(2)) == 2
    rows = [{"a": i, "v": [i] * i} for i in range(4)]
    back = list(sf.from_list(rows))
    assert [r["a"] for r in back] == [0, 1, 2, 3] and [list(r["v"]) for r in back] == [r["v"] for r in rows]


def test_in_memory_datasets_pickle_and_fingerprint_their_values() -> None:
    ds = sf.from_arrow(table()).shuffle(seed=2, buffer_size=50)
    clone = pickle.loads(pickle.dumps(ds))
    assert [r["id"] for r in clone] == [r["id"] for r in ds]
    state = sf.DataLoader(sf.from_arrow(table()), batch_size=10).state_dict()
    sf.DataLoader(sf.from_arrow(table()), batch_size=10).load_state_dict(state)
    other = table().set_column(1, "x", pa.array(np.zeros(1000)))
    with pytest.raises(ValueError, match="dataset"):
        sf.DataLoader(sf.from_arrow(other), batch_size=10).load_state_dict(state)


def test_not_arrow_data_is_refused() -> None:
    with pytest.raises(TypeError, match="__arrow_c_stream__"):
        sf.from_arrow([1, 2, 3])
    with pytest.raises(TypeError, match="single column"):
        sf.from_arrow(pa.array([1, 2, 3]))
