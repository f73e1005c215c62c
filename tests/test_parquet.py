"""Parquet read through shardflow equals pyarrow's reader, for every common type and codec."""

from __future__ import annotations

import datetime
import decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardflow as sf

N = 257


def all_types_table(n: int = N) -> pa.Table:
    rng = np.random.default_rng(42)
    nulls = rng.random(n) < 0.1

    def with_nulls(values: list) -> list:
        return [None if m else v for v, m in zip(values, nulls)]

    ints = rng.integers(-1000, 1000, n)
    ts_us = rng.integers(0, 2_000_000_000_000_000, n)
    strings = [f"s{i}-{'é' * (i % 4)}🙂" for i in range(n)]
    return pa.table(
        {
            "i8": pa.array(rng.integers(-128, 128, n), pa.int8()),
            "i16": pa.array(rng.integers(-(2**15), 2**15, n), pa.int16()),
            "i32": pa.array(rng.integers(-(2**31), 2**31, n), pa.int32()),
            "i64": pa.array(rng.integers(-(2**62), 2**62, n), pa.int64()),
            "u8": pa.array(rng.integers(0, 256, n), pa.uint8()),
            "u16": pa.array(rng.integers(0, 2**16, n), pa.uint16()),
            "u32": pa.array(rng.integers(0, 2**32, n), pa.uint32()),
            "u64": pa.array(rng.integers(0, 2**63, n, dtype=np.uint64) * 2, pa.uint64()),
            "f16": pa.array(rng.random(n).astype(np.float16)),
            "f32": pa.array(rng.random(n).astype(np.float32)),
            "f64": pa.array(rng.standard_normal(n)),
            "f64_null": pa.array(with_nulls(rng.standard_normal(n).tolist()), pa.float64()),
            "i64_null": pa.array(with_nulls(ints.tolist()), pa.int64()),
            "bool": pa.array(with_nulls((ints % 2 == 0).tolist()), pa.bool_()),
            "str": pa.array(with_nulls(strings), pa.string()),
            "large_str": pa.array(strings, pa.large_string()),
            "bin": pa.array(with_nulls([s.encode() * 3 for s in strings]), pa.binary()),
            "fixed_bin": pa.array([i.to_bytes(4, "little", signed=True) for i in ints.tolist()], pa.binary(4)),
            "ts_ms": pa.array(ts_us // 1000, pa.timestamp("ms")),
            "ts_us_utc": pa.array(with_nulls(ts_us.tolist()), pa.timestamp("us", tz="UTC")),
            "ts_us_paris": pa.array(ts_us, pa.timestamp("us", tz="Europe/Paris")),
            "ts_ns": pa.array(ts_us * 1000, pa.timestamp("ns")),
            "date": pa.array(with_nulls((ts_us // 86_400_000_000).astype(np.int32).tolist()), pa.date32()),
            "time": pa.array(rng.integers(0, 86_400_000_000, n), pa.time64("us")),
            "duration": pa.array(ints, pa.duration("ms")),
            "decimal": pa.array([decimal.Decimal(int(i)) / 1000 for i in ints], pa.decimal128(12, 3)),
            "dict": pa.array([["red", "green", "blue"][i % 3] for i in range(n)]).dictionary_encode(),
            "list_i32": pa.array(
                with_nulls([list(range(i % 5)) for i in range(n)]), pa.list_(pa.int32())
            ),
            "list_list_str": pa.array(
                [[[f"{i}"] * (i % 2), []] for i in range(n)], pa.list_(pa.list_(pa.string()))
            ),
            "struct": pa.array(
                with_nulls([{"a": i, "b": f"x{i}", "c": [float(i)]} for i in range(n)]),
                pa.struct([("a", pa.int64()), ("b", pa.string()), ("c", pa.list_(pa.float64()))]),
            ),
            "list_struct": pa.array(
                [[{"x": float(i), "y": None}] * (i % 3) for i in range(n)],
                pa.list_(pa.struct([("x", pa.float64()), ("y", pa.int16())])),
            ),
            "map": pa.array(
                [[(f"k{j}", j) for j in range(i % 3)] for i in range(n)], pa.map_(pa.string(), pa.int32())
            ),
            "fixed_list": pa.FixedSizeListArray.from_arrays(pa.array(rng.random(n * 3).astype(np.float32)), 3),
            "large_list_struct": pa.array(
                with_nulls([[{"role": "user", "content": f"m{i}-{j}"} for j in range(i % 4)] for i in range(n)]),
                pa.large_list(pa.struct([("role", pa.string()), ("content", pa.string())])),
            ),
            "list_map": pa.array(
                [[[(f"k{j}", j)] * (j % 2) for j in range(i % 3)] for i in range(n)],
                pa.list_(pa.map_(pa.string(), pa.int32())),
            ),
            "fixed_list_str": pa.array([[f"a{i}", f"b{i}"] for i in range(n)], pa.list_(pa.string(), 2)),
        }
    )


def read_arrow(ds: sf.Dataset, batch_size: int = 64) -> pa.Table:
    batches = [pa.record_batch(b) for b in sf.DataLoader(ds, batch_size=batch_size, output="arrow")]
    return pa.Table.from_batches(batches)


@pytest.mark.parametrize("codec", ["none", "snappy", "zstd", "gzip", "lz4", "brotli"])
def test_every_type_equals_pyarrow(tmp_path: Path, codec: str) -> None:
    path = tmp_path / f"types-{codec}.parquet"
    pq.write_table(all_types_table(), path, compression=codec, row_group_size=50)
    expected = pq.read_table(path)
    ds = sf.dataset(str(path))
    assert len(ds) == N
    assert ds.column_names == expected.column_names

    ours = read_arrow(ds)
    assert ours.num_rows == N
    for name in expected.column_names:
        assert ours.schema.field(name).type == expected.schema.field(name).type, name
        assert ours.column(name).to_pylist() == expected.column(name).to_pylist(), name

    # One dict per sample, with pyarrow's Python values, except that fixed-size lists of
    # numbers are tensors: an array per sample.
    rows = list(ds)
    for row, reference in zip(rows, expected.to_pylist()):
        assert isinstance(row["fixed_list"], np.ndarray) and row["fixed_list"].dtype == np.float32
        assert row.pop("fixed_list").tolist() == reference.pop("fixed_list")
        assert row == reference


def test_numpy_batches_equal_pyarrow_to_numpy(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    table = all_types_table()
    pq.write_table(table, path, row_group_size=40)
    batches = list(sf.DataLoader(sf.dataset(str(path)), batch_size=N))
    assert len(batches) == 1
    batch = batches[0]
    assert isinstance(batch, dict)
    for name in ["i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "f32", "f64", "ts_ms", "ts_ns", "duration"]:
        expected = table.column(name).to_numpy()
        assert batch[name].dtype == expected.dtype, name
        np.testing.assert_array_equal(batch[name], expected, err_msg=name)
    # floats with nulls: NaN where null
    np.testing.assert_array_equal(batch["f64_null"], table.column("f64_null").to_numpy(zero_copy_only=False))
    # ints with nulls keep exact values, None for nulls
    assert batch["i64_null"].tolist() == table.column("i64_null").to_pylist()
    assert batch["str"].tolist() == table.column("str").to_pylist()
    assert batch["bin"].tolist() == table.column("bin").to_pylist()
    assert batch["dict"].tolist() == table.column("dict").to_pylist()
    # fixed-size lists are (rows, size) arrays; ragged lists are arrays per row
    np.testing.assert_array_equal(batch["fixed_list"], np.stack(table.column("fixed_list").to_numpy(zero_copy_only=False)))
    assert [None if v is None else v.tolist() for v in batch["list_i32"]] == table.column("list_i32").to_pylist()
    # structs without nulls are dicts of columns; with nulls, objects per row
    assert batch["struct"].tolist() == table.column("struct").to_pylist()
    assert batch["date"].dtype == np.dtype("datetime64[D]")
    assert [None if np.isnat(d) else d.astype(datetime.date) for d in batch["date"]] == table.column("date").to_pylist()


def test_projection_reads_only_requested_columns_in_requested_order(tmp_path: Path) -> None:
    path = tmp_path / "wide.parquet"
    n = 20_000
    rng = np.random.default_rng(1)
    pq.write_table(
        pa.table({f"c{i}": rng.random(n) for i in range(20)}), path, row_group_size=5_000, compression="none"
    )
    full = sf.DataLoader(sf.dataset(str(path)), batch_size=4096)
    for _ in full:
        pass
    ds = sf.dataset(str(path), columns=["c7", "c2"])
    assert ds.column_names == ["c7", "c2"]
    loader = sf.DataLoader(ds, batch_size=4096)
    got = {"c7": [], "c2": []}
    for batch in loader:
        assert list(batch) == ["c7", "c2"]
        for k in got:
            got[k].append(batch[k])
    expected = pq.read_table(path, columns=["c7", "c2"])
    for k in got:
        np.testing.assert_array_equal(np.concatenate(got[k]), expected.column(k).to_numpy())
    # Two of twenty equally sized columns: about a tenth of the bytes.
    assert loader.stats()["bytes_read"] < full.stats()["bytes_read"] * 0.15
    assert loader.stats()["units"] == 4  # one per row group


def test_unknown_column_is_a_schema_error(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"a": [1]}), path)
    with pytest.raises(sf.SchemaError, match='no column "zz"') as info:
        len(sf.dataset(str(path), columns=["zz"]))
    assert info.value.url == str(path)


def test_files_with_different_columns_are_rejected(tmp_path: Path) -> None:
    pq.write_table(pa.table({"a": [1]}), tmp_path / "1.parquet")
    pq.write_table(pa.table({"a": ["x"]}), tmp_path / "2.parquet")
    with pytest.raises(sf.SchemaError, match="2.parquet"):
        list(sf.dataset(str(tmp_path / "*.parquet")))


def test_empty_row_groups_and_files(tmp_path: Path) -> None:
    pq.write_table(pa.table({"a": pa.array([], pa.int64())}), tmp_path / "0.parquet")
    pq.write_table(pa.table({"a": [1, 2, 3]}), tmp_path / "1.parquet", row_group_size=1)
    ds = sf.dataset(str(tmp_path / "*.parquet"))
    assert len(ds) == 3
    assert [r["a"] for r in ds] == [1, 2, 3]


@pytest.mark.parametrize(
    "options",
    [
        {"version": "1.0", "use_dictionary": False},
        {"version": "2.4", "data_page_version": "2.0"},
        {"version": "2.6", "use_dictionary": True, "write_statistics": False},
        {"use_byte_stream_split": ["f32", "f64"], "use_dictionary": ["str"]},
        {"data_page_size": 1024, "row_group_size": 7},
    ],
)
def test_format_versions_and_encodings(tmp_path: Path, options: dict) -> None:
    table = all_types_table().select(["i32", "f32", "f64", "str", "list_i32", "struct", "ts_us_utc"])
    path = tmp_path / "v.parquet"
    pq.write_table(table, path, **options)
    assert list(sf.dataset(str(path))) == pq.read_table(path).to_pylist()


def test_empty_file_with_untyped_columns_does_not_veto_the_schema(tmp_path: Path) -> None:
    pq.write_table(pa.table({"a": [1, 2], "b": ["x", "y"]}), tmp_path / "1.parquet")
    pq.write_table(pa.table({"a": pa.array([], pa.int64()), "b": pa.array([])}), tmp_path / "2.parquet")
    assert pa.array([]).type == pa.null()
    ds = sf.dataset(str(tmp_path / "*.parquet"))
    assert list(ds) == [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]


def test_a_pickled_dataset_carries_its_files_footers_and_no_more(tmp_path: Path) -> None:
    """After its footers are read, a pickled dataset carries them (for spawned workers:
    tests/test_hub.py counts the requests it saves), each the file's footer and offset
    index, not the 64 KiB read that found it; rebuilt in a fresh process from them, it
    reads the same rows."""
    import pickle
    import subprocess
    import sys

    paths = []
    for i in range(20):
        path = tmp_path / f"part-{i:02d}.parquet"
        pq.write_table(pa.table({"id": np.arange(i * 5000, (i + 1) * 5000), "x": np.random.default_rng(i).random(5000)}), path, row_group_size=1000)
        paths.append(str(path))
    ds = sf.dataset(paths)
    bare = len(pickle.dumps(ds))
    assert len(ds) == 100_000  # reads every footer
    carried = len(pickle.dumps(ds)) - bare
    footers = sum(int.from_bytes(Path(p).read_bytes()[-8:-4], "little") + 8 for p in paths)
    assert footers < carried < 2 * footers + 20 * 1024, (carried, footers)
    code = (
        "import pickle, sys, numpy as np, shardflow as sf\n"
        "ds = pickle.loads(sys.stdin.buffer.read())\n"
        "print(int(np.concatenate([b['id'] for b in sf.DataLoader(ds, batch_size=4096)]).sum()))"
    )
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(ds), capture_output=True, check=True)
    assert int(out.stdout) == sum(range(100_000))
