"""Bad input gives a clear ShardflowError naming the file, or a counted skip; never a crash."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardflow as sf


def good_parquet(path: Path, rows: int = 2000, codec: str = "snappy") -> pa.Table:
    table = pa.table(
        {
            "id": np.arange(rows, dtype=np.int64),
            "text": [f"text {i}" * (i % 7) for i in range(rows)],
            "vec": pa.array([[float(i)] * (i % 4) for i in range(rows)], pa.list_(pa.float32())),
        }
    )
    pq.write_table(table, path, row_group_size=500, compression=codec)
    return table


def test_error_hierarchy_matches_builtins() -> None:
    assert issubclass(sf.NotFoundError, FileNotFoundError)
    assert issubclass(sf.AccessDeniedError, PermissionError)
    assert issubclass(sf.InvalidArgumentError, ValueError)
    for cls in (sf.NotFoundError, sf.DecodeError, sf.SchemaError, sf.ReadError, sf.InternalError):
        assert issubclass(cls, sf.ShardflowError)


def test_missing_file_and_empty_glob(tmp_path: Path) -> None:
    missing = tmp_path / "nope.parquet"
    with pytest.raises(FileNotFoundError) as info:
        sf.dataset(str(missing))
    assert str(missing) in str(info.value) and info.value.url == str(missing)
    pattern = str(tmp_path / "train-*.parquet")
    with pytest.raises(sf.NotFoundError, match="train-\\*.parquet"):
        sf.dataset(pattern)
    with pytest.raises(FileNotFoundError, match="shard-002"):
        (tmp_path / "shard-001.parquet").write_bytes(b"")
        sf.dataset(str(tmp_path / "shard-{001..002}.parquet"))


@pytest.mark.parametrize("keep", [0, 3, 11, 500, -8, -1])
def test_truncated_parquet(tmp_path: Path, keep: int) -> None:
    path = tmp_path / "t.parquet"
    good_parquet(path)
    data = path.read_bytes()
    path.write_bytes(data[:keep] if keep >= 0 else data[:keep])
    with pytest.raises(sf.DecodeError) as info:
        list(sf.dataset(str(path)))
    assert str(path) in str(info.value)


def test_random_bytes_named_parquet(tmp_path: Path) -> None:
    path = tmp_path / "noise.parquet"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 100_000, dtype=np.uint8).tobytes())
    with pytest.raises(sf.DecodeError, match="noise.parquet.*Parquet"):
        len(sf.dataset(str(path)))


def test_corrupt_row_group_names_it_and_can_be_skipped(tmp_path: Path) -> None:
    path = tmp_path / "c.parquet"
    good_parquet(path, codec="zstd")
    meta = pq.ParquetFile(path).metadata
    column = meta.row_group(2).column(0)
    start = column.data_page_offset
    data = bytearray(path.read_bytes())
    # Overwrite the row group's first data page (header and body) with garbage.
    data[start : start + 64] = bytes(range(64))
    path.write_bytes(bytes(data))
    with pytest.raises(sf.DecodeError, match="row group 2") as info:
        list(sf.dataset(str(path)))
    assert info.value.position == "row group 2"

    loader = sf.DataLoader(sf.dataset(str(path), on_error="skip"), batch_size=100)
    ids = [i for b in loader for i in b["id"].tolist()]
    assert ids == list(range(0, 1000)) + list(range(1500, 2000))
    assert loader.stats()["skipped_units"] == 1


def test_unreadable_file_can_be_skipped(tmp_path: Path) -> None:
    good_parquet(tmp_path / "a.parquet", rows=10)
    (tmp_path / "b.parquet").write_bytes(b"PAR1 not really")
    good_parquet(tmp_path / "c.parquet", rows=10)
    with pytest.raises(sf.DecodeError, match="b.parquet"):
        list(sf.dataset(str(tmp_path / "*.parquet")))
    loader = sf.DataLoader(sf.dataset(str(tmp_path / "*.parquet"), on_error="skip"), batch_size=100)
    assert [b["id"].tolist() for b in loader] == [list(range(10)) * 2]
    assert loader.stats()["skipped_units"] == 1


def test_corrupt_gzip_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "z.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for i in range(50_000):
            f.write(json.dumps({"i": i, "s": "abc" * (i % 10)}) + "\n")
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 100] = b"\x00" * 100
    path.write_bytes(bytes(data))
    with pytest.raises(sf.DecodeError, match="z.jsonl.gz"):
        list(sf.dataset(str(path)))
    truncated = tmp_path / "t.jsonl.gz"
    truncated.write_bytes(bytes(data[:middle]))
    with pytest.raises(sf.DecodeError, match="t.jsonl.gz"):
        list(sf.dataset(str(truncated)))


@pytest.mark.parametrize("codec", ["none", "snappy", "zstd", "gzip", "lz4"])
def test_random_corruption_never_crashes(tmp_path: Path, codec: str) -> None:
    """Flip bytes anywhere in a valid file: each read either raises a ShardflowError
    or returns rows (Parquet has no checksums by default, so some flips go unseen)."""
    path = tmp_path / "f.parquet"
    good_parquet(path, rows=600, codec=codec)
    original = path.read_bytes()
    rng = np.random.default_rng(len(codec))
    outcomes = {"error": 0, "read": 0}
    for trial in range(150):
        data = bytearray(original)
        for _ in range(int(rng.integers(1, 8))):
            pos = int(rng.integers(0, len(data)))
            data[pos] = int(rng.integers(0, 256))
        corrupt = tmp_path / f"f{trial}.parquet"
        corrupt.write_bytes(bytes(data))
        try:
            rows = sum(len(b["id"]) for b in sf.DataLoader(sf.dataset(str(corrupt)), batch_size=256))
            outcomes["read"] += 1
            assert rows <= 600
        except sf.ShardflowError as e:
            assert str(corrupt) in str(e)
            outcomes["error"] += 1
        corrupt.unlink()
    assert outcomes["error"] > 0
