"""Bad input gives a clear ShardflowError naming the file, or a counted skip; never a crash."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import model as m
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


def _damaged_shards(tmp_path: Path, fmt: str, bad: set[int]) -> list[str]:
    """Shards of ids 0..59 (JSON Lines or WebDataset), the records of ids in `bad`
    unreadable (a line cut short; a class that is not a number)."""
    import tarfile

    paths = []
    for shard in range(3):
        ids = range(20 * shard, 20 * shard + 20)
        if fmt == "jsonl":
            path = tmp_path / f"part-{shard}.jsonl"
            path.write_text("".join(('{"id": %d, "te' % i if i in bad else json.dumps({"id": i, "text": f"row {i}"})) + "\n" for i in ids))
        else:
            path = tmp_path / f"part-{shard}.tar"
            with tarfile.open(path, "w") as tar:
                for i in ids:
                    for field, payload in [("id.txt", str(i).encode()), ("cls", b"bad" if i in bad else str(i % 10).encode())]:
                        info = tarfile.TarInfo(f"s{i:04d}.{field}")
                        info.size = len(payload)
                        tar.addfile(info, io.BytesIO(payload))
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("fmt", ["jsonl", "webdataset"])
def test_skipped_records_keep_their_places_in_every_division(tmp_path: Path, fmt: str) -> None:
    """A skipped record is counted once and leaves its part one row short; the rows after
    it stay in their own part's share (they moved into the part before, and a skipped
    record was counted by every part that decoded its block), and keep their positions,
    so a resume on another world size delivers the rest once."""
    bad = {3, 10, 17, 24, 31, 38, 45, 52, 59}
    paths = _damaged_shards(tmp_path, fmt, bad)
    schema = pa.schema({"id": pa.int64(), "text": pa.string()}) if fmt == "jsonl" else None

    def open_() -> sf.Dataset:
        return sf.dataset(paths, schema=schema, on_error="skip")

    def ids(batch: dict) -> list[int]:
        return [int(i) for i in batch["id"].tolist()] if "id" in batch else [int(v if isinstance(v, str) else bytes(v).decode()) for v in batch["id.txt"]]

    for world, workers in [(1, 1), (2, 1), (2, 2), (3, 2), (4, 1)]:
        div = m.Division(world, workers)
        want = {key: [i for i in part if i not in bad] for key, part in m.contiguous(list(range(60)), div).items()}
        skipped = 0
        for rank, worker in div.keys():
            extra = dict(worker=worker, num_workers=workers) if workers > 1 else {}
            loader = sf.DataLoader(open_(), batch_size=4, rank=rank, world_size=world, **extra)
            got = [i for b in loader for i in ids(b)]
            assert got == want[(rank, worker)], (world, workers, rank, worker)
            skipped += loader.stats()["skipped_records"]
        padding = [i for key in want for i in m.contiguous(list(range(60)), div)[key][len(m.contiguous(list(range(60)), m.Division(world, workers, pad=False))[key]) :]]
        assert skipped == len(bad) + len([i for i in padding if i in bad]), (world, workers)
    # Stopped after 2 batches on 2 ranks, resumed on 3: the rest of the epoch once.
    states, before = [], []
    for rank in range(2):
        loader = sf.DataLoader(open_(), batch_size=4, rank=rank, world_size=2)
        it = iter(loader)
        before += [i for _ in range(2) for i in ids(next(it))]
        states.append(loader.state_dict())
    after = []
    for rank in range(3):
        loader = sf.DataLoader(open_(), batch_size=4, rank=rank, world_size=3)
        loader.load_state_dict(states)
        after += [i for b in loader for i in ids(b)]
    delivered = sorted(before + after)
    assert sorted(set(delivered)) == sorted(set(range(60)) - bad)
    assert len(delivered) - len(set(delivered)) <= 5  # padding of each division, at most a row a rank
