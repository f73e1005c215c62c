"""`sf.dataset(..., decoded_cache=dir)`: units decoded once, mapped from local disk after.

Every read through the cache is compared with pyarrow's read of the files and with the
same dataset read without the cache, row for row and in order: through full shuffles on
2 ranks x 2 forked torch workers for 2 epochs, a resume in a fresh process, a changed
file, a damaged or half-written cache entry, and a format the cache does not keep.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardflow as sf


def _table(start: int, n: int) -> pa.Table:
    return pa.table({
        "id": pa.array(range(start, start + n), pa.int64()),
        "tokens": pa.array([list(range(i % 37)) for i in range(start, start + n)], pa.list_(pa.int64())),
        "text": pa.array([f"row {i} " * (i % 5) for i in range(start, start + n)]),
        "score": pa.array([None if i % 7 == 0 else i / 3 for i in range(start, start + n)], pa.float64()),
        "blob": pa.array([_short_blob(i) for i in range(start, start + n)], pa.binary()),
    })


def _short_blob(i: int) -> bytes | None:
    """Null, or up to 160 bytes: inside an Arrow view (12 bytes or less) or pointing out of it."""
    return None if i % 9 == 0 else str(i).encode() * (i % 41)


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    """Three Parquet files as pyarrow writes them (snappy), row groups of 50 rows."""
    paths = []
    for k in range(3):
        path = tmp_path / f"part-{k}.parquet"
        pq.write_table(_table(k * 170, 170), path, row_group_size=50)
        paths.append(str(path))
    return paths


def _rows(ds: sf.Dataset) -> list[dict[str, Any]]:
    return [dict(row) for row in ds.to_arrow().to_pylist()]


def _entries(cache: Path) -> dict[str, float]:
    return {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} if cache.exists() else {}


def test_rows_are_pyarrows_and_later_reads_map_the_kept_units(files: list[str], tmp_path: Path) -> None:
    cache = tmp_path / "decoded"
    reference = pa.concat_tables(pq.read_table(p) for p in files).to_pylist()
    assert _rows(sf.dataset(files, decoded_cache=str(cache))) == reference
    # One entry per unit (row group): 4 per file.
    kept = _entries(cache)
    assert len(kept) == 12 and all(name.endswith(".arrow") for name in kept)
    # A new dataset, a full shuffle and a projection later: the same entries, read not rewritten.
    again = sf.dataset(files, decoded_cache=str(cache))
    assert _rows(again) == reference
    shuffled = [r["id"] for r in again.shuffle(seed=3)]
    assert shuffled == [r["id"] for r in sf.dataset(files).shuffle(seed=3)]
    assert _entries(cache) == kept
    # Another reading (columns) is another entry: rows never come from a different reading.
    narrow = sf.dataset(files, columns=["id", "text"], decoded_cache=str(cache))
    assert _rows(narrow) == pa.concat_tables(pq.read_table(p, columns=["id", "text"]) for p in files).to_pylist()
    assert len(_entries(cache)) == 24


def test_a_changed_file_is_read_anew(files: list[str], tmp_path: Path) -> None:
    cache = tmp_path / "decoded"
    assert [r["id"] for r in sf.dataset(files, decoded_cache=str(cache))][:3] == [0, 1, 2]
    pq.write_table(_table(10_000, 120), files[0], row_group_size=50)
    stat = os.stat(files[0])
    os.utime(files[0], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    reference = pa.concat_tables(pq.read_table(p) for p in files).to_pylist()
    assert _rows(sf.dataset(files, decoded_cache=str(cache))) == reference


def test_a_damaged_entry_is_decoded_again_and_leftovers_are_removed(files: list[str], tmp_path: Path) -> None:
    cache = tmp_path / "decoded"
    reference = _rows(sf.dataset(files))
    assert _rows(sf.dataset(files, decoded_cache=str(cache))) == reference
    kept = sorted(cache.iterdir())
    whole = kept[0].stat().st_size
    with open(kept[0], "r+b") as f:  # cut short, as a disk error or a copy would leave it
        f.truncate(whole // 2)
    with open(kept[1], "r+b") as f:  # its footer overwritten
        f.seek(-40, os.SEEK_END)
        f.write(b"\xff" * 30)
    # A temporary file of a process that is gone (killed mid-write).
    (cache / "tmp-2147483646-0123.arrow").write_bytes(b"half")
    assert _rows(sf.dataset(files, decoded_cache=str(cache))) == reference
    assert kept[0].stat().st_size == whole
    assert not (cache / "tmp-2147483646-0123.arrow").exists()
    assert len(list(cache.iterdir())) == 12


def test_streamed_formats_are_read_as_before(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(f'{{"id": {i}, "text": "t{i}"}}\n' for i in range(300)))
    cache = tmp_path / "decoded"
    ds = sf.dataset(str(path), decoded_cache=str(cache))
    assert [r["id"] for r in ds] == list(range(300))
    assert _entries(cache) == {}


def test_arrow_files_and_the_default_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "rows.arrow"
    table = _table(0, 90)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=40)
    monkeypatch.setenv("SHARDFLOW_CACHE_DIR", str(tmp_path / "home"))
    assert _rows(sf.dataset(str(path), decoded_cache=True)) == table.to_pylist()
    assert len(list((tmp_path / "home" / "decoded").iterdir())) == 3
    assert _rows(sf.dataset(str(path), decoded_cache=True)) == table.to_pylist()
    with pytest.raises(TypeError):
        sf.dataset(str(path), decoded_cache=3)


def test_wide_rows_are_kept_in_few_batches(tmp_path: Path) -> None:
    """A unit the decoder hands over a few rows at a time (1 MiB values) is kept as
    batches of up to 32 MiB: every later read of it decodes two messages, not forty.
    The kept file reads back, with pyarrow's IPC reader, as pyarrow's read of the row
    group, and a full shuffle through it gives the rows it gives without the cache."""
    path = tmp_path / "wide.parquet"
    table = pa.table({"id": pa.array(range(60), pa.int64()),
                      "image": pa.array([os.urandom(1 << 20) for _ in range(60)], pa.binary())})
    pq.write_table(table, path, row_group_size=40)
    cache = tmp_path / "decoded"
    assert [r["id"] for r in sf.dataset(str(path), decoded_cache=str(cache))] == list(range(60))
    parquet = pq.ParquetFile(path)
    kept = {}
    for entry in cache.iterdir():
        reader = pa.ipc.open_file(str(entry))
        kept[reader.num_record_batches] = reader.read_all()
    # Row groups of 40 and 20 rows: 40 MiB in two batches, 20 MiB in one.
    assert sorted(kept) == [1, 2]
    assert kept[2].equals(parquet.read_row_group(0)) and kept[1].equals(parquet.read_row_group(1))
    warm = sf.dataset(str(path), decoded_cache=str(cache)).shuffle(seed=5)
    cold = sf.dataset(str(path)).shuffle(seed=5)
    assert [(r["id"], r["image"]) for r in warm] == [(r["id"], r["image"]) for r in cold]


#: One rank's loader over 2 forked torch workers, resumed from the states on stdin in a
#: fresh process; prints the ids of the rest of its epoch.
RESUME = """
import pickle, sys
import shardflow as sf
from shardflow.torch import IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader
ds = sf.dataset({files!r}, decoded_cache={cache!r}).shuffle(seed=1)
adapter = IterableDataset(ds, batch_size=8, shuffle=True, seed=4, rank={rank}, world_size=2)
loader = StatefulDataLoader(adapter, batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=120)
loader.load_state_dict(pickle.load(sys.stdin.buffer))
sys.stdout.buffer.write(pickle.dumps([list(zip(b["id"].tolist(), b["blob"])) for b in loader]))
"""


def test_full_shuffle_on_ranks_workers_epochs_and_a_resume(files: list[str], tmp_path: Path) -> None:
    """A full shuffle then the adapter's shuffle buffer, 2 ranks x 2 forked torch workers,
    2 epochs: through the cache (cold, then warm) the same batches as without it; a state
    saved mid-epoch 1 resumes in a fresh process to the rest of the uncached epoch."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from shardflow.torch import IterableDataset

    cache = str(tmp_path / "decoded")

    def loader(rank: int, cached: bool) -> StatefulDataLoader:
        ds = sf.dataset(files, decoded_cache=cache if cached else None).shuffle(seed=1)
        adapter = IterableDataset(ds, batch_size=8, shuffle=True, seed=4, rank=rank, world_size=2)
        return StatefulDataLoader(adapter, batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=120)

    def epochs(rank: int, cached: bool) -> list[list[list[tuple[int, bytes | None]]]]:
        made = loader(rank, cached)
        return [[list(zip(b["id"].tolist(), b["blob"])) for b in made] for _ in range(2)]

    plain = [epochs(rank, cached=False) for rank in range(2)]
    for epoch in range(2):
        rows = [row for rank in range(2) for batch in plain[rank][epoch] for row in batch]
        assert all(blob == _short_blob(i) for i, blob in rows)
        ids = sorted(i for i, _ in rows)
        assert ids[: 3 * 170] == list(range(3 * 170)) and len(plain[0][epoch]) == len(plain[1][epoch])
    assert plain[0][0] != plain[0][1]
    assert [epochs(rank, cached=True) for rank in range(2)] == plain  # cold: written as read
    assert len(list(Path(cache).iterdir())) == 12
    assert [epochs(rank, cached=True) for rank in range(2)] == plain  # warm: mapped
    for rank in range(2):
        first = loader(rank, cached=True)
        for _ in first:  # epoch 0
            pass
        batches = iter(first)
        before = [list(zip(b["id"].tolist(), b["blob"])) for b in (next(batches) for _ in range(5))]
        state = first.state_dict()
        script = RESUME.format(files=files, cache=cache, rank=rank)
        out = subprocess.run([sys.executable, "-c", script], input=pickle.dumps(state), capture_output=True, timeout=300)
        assert out.returncode == 0, out.stderr.decode()[-3000:]
        assert before + pickle.loads(out.stdout) == plain[rank][1], rank


def _blob(i: int) -> bytes | None:
    """Row i's binary value: nulls, empty and short values (kept inside an Arrow view),
    and values of 100-350 KB."""
    if i % 11 == 0:
        return None
    if i % 13 == 0:
        return b""
    if i % 3 == 0:
        return bytes([i % 251]) * (i % 12)
    return (i.to_bytes(4, "little") * 62_500)[: 100_000 + (i * 7919) % 250_000]


def test_binary_values_of_a_shuffle_are_the_files_bytes_in_every_output(tmp_path: Path) -> None:
    """Shuffled rows of a decoded copy reach numpy and torch batches with their binary
    values left where they lie until each becomes a `bytes` (copied on several threads
    in a batch of more than 4 MiB of them, as the 48-row batches here); Arrow output and
    a numpy batch's `to_pyarrow()` keep the column's type. 2 ranks, 2 epochs, a resume:
    the same rows and order as Arrow output, each value pyarrow's."""
    paths = []
    for k in range(2):
        ids = range(k * 60, k * 60 + 60)
        table = pa.table({"id": pa.array(ids, pa.int64()), "blob": pa.array([_blob(i) for i in ids], pa.binary())})
        paths.append(str(tmp_path / f"part-{k}.parquet"))
        pq.write_table(table, paths[-1], row_group_size=20)
    reference = {row["id"]: row["blob"] for p in paths for row in pq.read_table(p).to_pylist()}
    cache = str(tmp_path / "decoded")
    ds = sf.dataset(paths, decoded_cache=cache).shuffle(seed=3)

    def epochs(rank: int, output: str) -> list[list[tuple[int, bytes | None]]]:
        loader = sf.DataLoader(ds, batch_size=48, rank=rank, world_size=2, output=output)
        out = []
        for _ in range(2):
            batches = []
            for b in loader:
                if output == "arrow":
                    b = b.to_pyarrow()
                    assert b.schema.field("blob").type == pa.binary()
                    batches.append(list(zip(b["id"].to_pylist(), b["blob"].to_pylist())))
                else:
                    if output == "numpy":
                        assert b.to_pyarrow().schema.field("blob").type == pa.binary()
                        assert b.to_pyarrow()["blob"].to_pylist() == list(b["blob"])
                    batches.append(list(zip((int(i) for i in b["id"]), b["blob"])))
            out.append(batches)
        return out

    cold = [epochs(rank, "numpy") for rank in range(2)]  # writes the decoded copy
    assert len(list(Path(cache).iterdir())) == 6
    for rank in range(2):
        arrow = epochs(rank, "arrow")
        assert epochs(rank, "numpy") == cold[rank] == arrow
        assert epochs(rank, "torch") == arrow
    for epoch in range(2):
        rows = [row for rank in range(2) for batch in cold[rank][epoch] for row in batch]
        assert sorted(i for i, _ in rows) == sorted(reference) and all(v == reference[i] for i, v in rows)
    assert [i for i, _ in cold[0][0][0]] != [i for i, _ in cold[0][1][0]]
    # A state saved after 1 batch of epoch 1 resumes to the rest of it.
    first = sf.DataLoader(ds, batch_size=48, rank=1, world_size=2)
    for _ in first:
        pass
    batches = iter(first)
    next(batches)
    resumed = sf.DataLoader(ds, batch_size=48, rank=1, world_size=2)
    resumed.load_state_dict(first.state_dict())
    rest = [list(zip((int(i) for i in b["id"]), b["blob"])) for b in resumed]
    assert rest == cold[1][1][1:]


def test_kept_batches_hold_one_mapping_of_each_unit(tmp_path: Path) -> None:
    """Batches whose binary values point into the decoded copy hold its units' mappings;
    a caller keeping every batch of 3 epochs holds each unit's file mapped once, not once
    per batch that reads from it (toward the system's limit on mappings)."""
    path = tmp_path / "part.parquet"
    pq.write_table(pa.table({"id": range(200), "blob": [bytes([i % 256]) * 2000 for i in range(200)]}),
                   path, row_group_size=5)
    cache = tmp_path / "decoded"
    ds = sf.dataset(str(path), decoded_cache=str(cache)).shuffle(seed=0)
    for _ in sf.DataLoader(ds, batch_size=10):  # writes the copy: 40 units
        pass
    loader = sf.DataLoader(ds, batch_size=10)
    kept = [b for _ in range(3) for b in loader]
    assert sorted(int(i) for b in kept for i in b["id"]) == sorted(list(range(200)) * 3)
    assert all(bytes(v) == bytes([int(i) % 256]) * 2000 for b in kept for i, v in zip(b["id"], b["blob"]))
    mapped = [line for line in Path("/proc/self/maps").read_text().splitlines() if str(cache) in line]
    assert 0 < len(mapped) <= 40, len(mapped)
    del kept
