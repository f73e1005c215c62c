"""Arrow IPC and CSV equal pyarrow's readers; raw files give one sample per file."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.feather as feather
import pyarrow.ipc as ipc
import pytest

import shardflow as sf


def table(n: int = 1000, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "id": np.arange(seed * n, seed * n + n, dtype=np.int64),
            "x": rng.random(n).astype(np.float32),
            "s": pa.array([None if i % 7 == 0 else f"s{i}" for i in range(n)]),
            "d": pa.array([["a", "b", "c"][i % 3] for i in range(n)]).dictionary_encode(),
            "l": pa.array([[i] * (i % 3) for i in range(n)], pa.list_(pa.int16())),
            "t": pa.FixedSizeListArray.from_arrays(pa.array(rng.random(n * 4)), 4),
        }
    )


def read_all(ds: sf.Dataset) -> pa.Table:
    return pa.Table.from_batches(pa.record_batch(b) for b in sf.DataLoader(ds, batch_size=333, output="arrow"))


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_ipc_file_equals_pyarrow(tmp_path: Path, compression: str | None) -> None:
    paths = []
    for shard in range(3):
        path = tmp_path / f"part-{shard}.arrow"
        t = table(seed=shard)
        options = ipc.IpcWriteOptions(compression=compression)
        with ipc.new_file(path, t.schema, options=options) as writer:
            for batch in t.to_batches(max_chunksize=128):
                writer.write_batch(batch)
        paths.append(path)
    expected = pa.concat_tables(ipc.open_file(p).read_all() for p in paths)
    ds = sf.dataset(str(tmp_path / "part-*.arrow"))
    ours = read_all(ds)
    assert ours.schema == expected.schema
    assert ours.to_pylist() == expected.to_pylist()
    for row, reference in zip(ds.take(2), expected.slice(0, 2).to_pylist()):
        assert row.pop("t").tolist() == reference.pop("t")  # a fixed-size list: an array per sample
        assert row == reference
    # each record batch is a unit: shuffling reorders them, all rows stay
    shuffled = [r["id"] for r in ds.shuffle(seed=1, buffer_size=1)]
    assert shuffled != list(range(3000)) and sorted(shuffled) == list(range(3000))


def test_feather_and_projection(tmp_path: Path) -> None:
    path = tmp_path / "t.feather"
    feather.write_feather(table(), path, chunksize=100)
    ds = sf.dataset(str(path), columns=["s", "id"])
    assert ds.column_names == ["s", "id"]
    assert read_all(ds).to_pylist() == feather.read_table(path, columns=["s", "id"]).to_pylist()


def test_ipc_stream_equals_pyarrow(tmp_path: Path) -> None:
    path = tmp_path / "t.arrows"
    t = table()
    with ipc.new_stream(path, t.schema) as writer:
        for batch in t.to_batches(max_chunksize=64):
            writer.write_batch(batch)
    assert read_all(sf.dataset(str(path))).to_pylist() == ipc.open_stream(path).read_all().to_pylist()


def test_corrupt_ipc(tmp_path: Path) -> None:
    path = tmp_path / "c.arrow"
    feather.write_feather(table(), path, chunksize=100, compression="uncompressed")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(sf.DecodeError, match="c.arrow"):
        list(sf.dataset(str(path)))
    path.write_bytes(b"ARROW1" + bytes(100))
    with pytest.raises(sf.DecodeError, match="c.arrow"):
        list(sf.dataset(str(path)))


def test_csv_written_by_pyarrow_reads_like_pyarrow(tmp_path: Path) -> None:
    n = 500
    t = pa.table(
        {
            "i": pa.array([None if i % 11 == 0 else i - 100 for i in range(n)], pa.int64()),
            "f": pa.array([i / 3 for i in range(n)]),
            "b": pa.array([i % 2 == 0 for i in range(n)]),
            "s": pa.array([f'quote " and, comma\nnewline {i}' if i % 5 == 0 else f"s{i}" for i in range(n)]),
            "e": pa.array(["" if i % 3 == 0 else "x" for i in range(n)]),
            "d": pa.array(np.datetime64("2024-01-01") + np.arange(n).astype("timedelta64[D]")).cast(pa.date32()),
            "ts": pa.array(np.datetime64("2024-01-01T00:00:00") + np.arange(n).astype("timedelta64[s]")),
        }
    )
    path = tmp_path / "t.csv"
    pacsv.write_csv(t, path)
    expected = pacsv.read_csv(path)
    ours = read_all(sf.dataset(str(path)))
    assert ours.schema == expected.schema
    assert ours.to_pylist() == expected.to_pylist()


def test_csv_tokens_quotes_blocks_and_gzip(tmp_path: Path) -> None:
    rows = ['a,b,c,d']
    for i in range(60_000):  # several 4 MiB blocks
        quoted = f'"multi\nline, ""{i}"""' if i % 1000 == 0 else f"plain{i}"
        rows.append(f"{i},{'NA' if i % 9 == 0 else i * 0.5},{quoted},{'null' if i % 4 == 0 else 'text'}")
    text = "\n".join(rows) + "\n"
    plain = tmp_path / "big.csv"
    plain.write_text(text)
    (tmp_path / "big2.csv.gz").write_bytes(gzip.compress(text.encode()))
    expected = pacsv.read_csv(plain).to_pylist()
    assert [r for r in sf.dataset(str(plain))] == expected
    assert [r for r in sf.dataset(str(tmp_path / "big2.csv.gz"))] == expected


def test_csv_bad_value_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    lines = ["n"] + [str(i) for i in range(2000)]
    lines[1500] = "oops"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(sf.DecodeError, match="bad.csv.*line 1.*column \"n\""):
        list(sf.dataset(str(path)))
    assert [r["n"] for r in sf.dataset(str(path), schema={"n": "string"})][1499] == "oops"


def test_raw_files_with_labels(tmp_path: Path) -> None:
    for label in ("cat", "dog"):
        (tmp_path / label).mkdir()
        for i in range(3):
            (tmp_path / label / f"{i}.jpg").write_bytes(f"{label}{i}".encode() * 10)
    ds = sf.dataset(str(tmp_path), format="raw", format_options={"label": True})
    rows = list(ds)
    assert [(r["__key__"], r["label"], r["label_id"]) for r in rows] == [
        (f"{label}/{i}", label, label_id) for label_id, label in enumerate(["cat", "dog"]) for i in range(3)
    ]
    assert rows[4]["bytes"] == b"dog1" * 10
    assert len(ds) == 6
    assert list(sf.dataset(str(tmp_path / "cat"), format="raw"))[0].keys() == {"__key__", "bytes"}
