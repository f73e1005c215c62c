"""Random access for every format (stream formats through their record index) and the
`datasets` verbs built on it: len, ds[i], select, train_test_split, interleave; exact
resume of select/shard/interleave pipelines in a fresh process; stale indexes."""

from __future__ import annotations

import gzip
import io
import json
import pickle
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardflow as sf
from test_fork_remote import write_tfrecord

FORMATS = ["parquet", "arrow", "jsonl", "jsonl.gz", "csv", "tfrecord", "webdataset", "webdataset.gz", "npy", "npz", "raw"]


def write_shards(root: Path, fmt: str, sizes: list[int], start: int = 0) -> list[str]:
    """Shards of consecutive ids from `start`, written by each format's reference writer."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, n in enumerate(sizes):
        ids = list(range(start, start + n))
        start += n
        table = pa.table({"id": pa.array(ids, pa.int64()), "text": pa.array([f"row {i}" * (i % 5 + 1) for i in ids], pa.string())})
        ext = {"webdataset": "tar", "webdataset.gz": "tar.gz"}.get(fmt, fmt)
        path = root / f"part-{k:03d}.{ext}"
        if fmt == "raw":
            # One file is one sample: a folder of files, numbered so they sort in order.
            path = root / f"part-{k:03d}"
            path.mkdir()
            for i in ids:
                (path / f"{i:06d}.bin").write_bytes(str(i).encode())
            if n == 0:
                continue  # an empty folder is a pattern that matches nothing
        elif fmt == "npy":
            np.save(path, np.array(ids, np.int64))
        elif fmt == "npz":
            np.savez(path, id=np.array(ids, np.int64), sq=np.array(ids, np.int64) ** 2)
        elif fmt == "parquet":
            pq.write_table(table, path, row_group_size=7)
        elif fmt == "arrow":
            feather.write_feather(table, path, chunksize=9)
        elif fmt.startswith("jsonl"):
            lines = "".join(json.dumps(r) + ("\n\n" if r["id"] % 4 == 0 else "\n") for r in table.to_pylist())
            data = lines.encode()
            path.write_bytes(gzip.compress(data) if fmt.endswith(".gz") else data)
        elif fmt == "csv":
            if n == 0:
                path.write_text("id,text\n")
            else:
                pacsv.write_csv(table, path)
        elif fmt == "tfrecord":
            write_tfrecord(path, [json.dumps(r).encode() for r in table.to_pylist()])
        else:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                for i in ids:
                    for field, payload in [("id.txt", str(i).encode()), ("text.txt", f"row {i}".encode())]:
                        info = tarfile.TarInfo(f"s{i:06d}.{field}")
                        info.size = len(payload)
                        tar.addfile(info, io.BytesIO(payload))
            data = buf.getvalue()
            path.write_bytes(gzip.compress(data) if fmt.endswith(".gz") else data)
        paths.append(str(path))
    return paths


def open_format(paths: list[str], fmt: str) -> sf.Dataset:
    if fmt in ("npy", "npz"):
        return sf.dataset(paths, format_options={"mode": "rows"})
    if fmt == "raw":
        return sf.dataset(paths, format="raw")
    if fmt == "tfrecord":
        return sf.dataset(paths, format="tfrecord", format_options={"raw": True})
    if fmt == "csv":
        # Types come from the first file's records, and a first file may be empty.
        return sf.dataset(paths, schema=pa.schema({"id": pa.int64(), "text": pa.string()}))
    return sf.dataset(paths)


def ident(fmt: str, row: dict) -> object:
    """The id a row carries, whatever the format made of it."""
    if fmt == "tfrecord":
        return json.loads(bytes(row["record"]))["id"]
    if fmt == "npy":
        return int(row["array"])
    if fmt == "raw":
        return int(bytes(row["bytes"]).decode())
    if fmt.startswith("webdataset"):
        value = row["id.txt"]
        return int(value if isinstance(value, str) else bytes(value).decode())
    return int(row["id"])


layouts = st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=5)


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=layouts, data=st.data())
def test_len_getitem_and_select_match_iteration(tmp_path_factory: pytest.TempPathFactory, fmt: str, sizes: list[int], data: st.DataObject) -> None:
    if sum(sizes) == 0:
        sizes = sizes + [1]
    paths = write_shards(tmp_path_factory.mktemp("layout"), fmt, sizes)
    ds = open_format(paths, fmt)
    iterated = [ident(fmt, r) for r in ds]
    assert iterated == list(range(sum(sizes)))
    assert len(ds) == len(iterated)
    for i in data.draw(st.lists(st.integers(-len(iterated), len(iterated) - 1), max_size=6)):
        assert ident(fmt, ds[i]) == iterated[i]
    picks = data.draw(st.lists(st.integers(0, len(iterated) - 1), max_size=50))
    assert [ident(fmt, r) for r in ds.select(picks)] == [iterated[i] for i in picks]
    assert [ident(fmt, r) for r in ds.__getitems__(picks)] == [iterated[i] for i in picks]
    test_size = data.draw(st.integers(1, max(1, len(iterated) - 1)))
    if len(iterated) >= 2:
        split = ds.train_test_split(test_size=test_size, seed=data.draw(st.integers(0, 9)))
        train = [ident(fmt, r) for r in split["train"]]
        test = [ident(fmt, r) for r in split["test"]]
        assert len(test) == test_size and sorted(train + test) == iterated


@pytest.mark.parametrize("chain", [
    lambda ds: ds.flat_map(lambda r: [r]).shuffle(seed=0),
    lambda ds: ds.filter(lambda r: r["id"] % 3 > 0).flat_map(lambda r: [r, r]).shuffle(seed=1, buffer_size=7),
    lambda ds: ds.shuffle(seed=2, buffer_size=5).map(lambda r: r).shuffle(seed=3, buffer_size=9).select(range(40)),
])
def test_ops_after_rows_read_into_memory_draw_as_iteration_does(tmp_path: Path, chain: Any) -> None:
    """Random access reads what it cannot address (a flat_map, a shuffle buffer) into
    memory and goes on from there: the shuffles after it draw as when the whole chain
    streams, so ds[i] is the i-th row iterated."""
    ds = chain(sf.dataset(write_shards(tmp_path, "jsonl", [30, 21])))
    iterated = [r["id"] for r in ds]
    assert [ds[i]["id"] for i in range(len(iterated))] == iterated


def test_shuffle_without_buffer_is_a_permutation_new_each_epoch(tmp_path: Path) -> None:
    paths = write_shards(tmp_path, "jsonl", [50, 0, 77, 13])
    ds = sf.dataset(paths).shuffle(seed=3)
    loader = sf.DataLoader(ds, batch_size=10)
    epochs = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        epochs.append([i for b in loader for i in b["id"].tolist()])
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(140))
    assert epochs[0] != epochs[1]
    # Each position is spread over the whole dataset, not a buffer's reach.
    firsts = [next(iter(sf.dataset(paths).shuffle(seed=s)))["id"] for s in range(40)]
    assert max(firsts) > 100


def test_interleave_proportions_and_determinism() -> None:
    a = sf.from_dict({"src": np.zeros(100_000, np.int8), "i": np.arange(100_000)})
    b = sf.from_dict({"src": np.ones(100_000, np.int8), "i": np.arange(100_000)})
    mixed = sf.interleave([a, b], probabilities=[0.7, 0.3], seed=5).take(100_000)
    first = np.concatenate([batch["src"] for batch in sf.DataLoader(mixed, batch_size=4096)])
    again = np.concatenate([batch["src"] for batch in sf.DataLoader(mixed, batch_size=4096)])
    assert len(first) == 100_000
    assert abs((first == 0).mean() - 0.7) < 0.01
    assert np.array_equal(first, again)
    # Rows of each source come in their own order, each once.
    rows = [r["i"] for r in sf.interleave([a.take(50), b.take(50)], seed=1, stopping_strategy="all_exhausted") if r["src"] == 1]
    assert rows[:50] == list(range(50))


def test_interleave_stopping_strategies() -> None:
    small = sf.from_dict({"x": [0, 1, 2]})
    big = sf.from_dict({"x": [10, 11, 12, 13, 14, 15, 16]})
    # As datasets' IterableDataset: the row that runs out `small` ends the mix.
    assert [r["x"] for r in sf.interleave([small, big])] == [0, 10, 1, 11, 2]
    every = [r["x"] for r in sf.interleave([small, big], stopping_strategy="all_exhausted")]
    assert every == [0, 10, 1, 11, 2, 12, 0, 13, 1, 14, 2, 15, 0, 16]


def test_concatenate_unifies_or_names_the_column() -> None:
    ints = sf.from_dict({"a": np.arange(3, dtype=np.int32), "b": ["x", "y", "z"]})
    longs = sf.from_dict({"b": ["w"], "a": np.array([2**40])})
    both = sf.concatenate([ints, longs])
    assert [r["a"] for r in both] == [0, 1, 2, 2**40]
    assert pa.schema(both.schema).field("a").type == pa.int64()
    with pytest.raises(sf.SchemaError, match='"b"'):
        sf.concatenate([ints, sf.from_dict({"a": [1], "b": [1.5]})])
    with pytest.raises(sf.SchemaError, match='"c"'):
        sf.concatenate([ints, sf.from_dict({"a": [1], "b": ["q"], "c": [1]})])


def test_column_verbs_push_down_and_check(tmp_path: Path) -> None:
    paths = write_shards(tmp_path, "parquet", [20, 5])
    ds = sf.dataset(paths)
    only = ds.select_columns(["text"])
    assert only.column_names == ["text"]
    assert repr(only).endswith("ops=[])"), "select_columns on a file source is a projection"
    cast = ds.cast_column("id", pa.float32())
    assert pa.schema(cast.schema).field("id").type == pa.float32()
    assert next(iter(sf.DataLoader(cast, batch_size=4)))["id"].dtype == np.float32
    with pytest.raises(sf.SchemaError, match='"nope"'):
        ds.remove_columns(["nope"])
    with pytest.raises(sf.SchemaError):
        ds.rename_columns({"id": "text"})


RESUME_SCRIPT = r"""
import json, pickle, sys
import shardflow as sf
ds, state, batch_size = pickle.load(open(sys.argv[1], "rb"))
loader = sf.DataLoader(ds, batch_size=batch_size)
loader.load_state_dict(state)
print(json.dumps([b["id"].tolist() for b in loader]))
"""


@pytest.mark.parametrize("pipeline", ["select", "shard", "interleave", "concatenate"])
def test_resume_in_a_fresh_process(tmp_path: Path, pipeline: str) -> None:
    paths = write_shards(tmp_path / "data", "jsonl", [40, 33, 0, 61])
    base = sf.dataset(paths)
    rng = np.random.default_rng(7)
    if pipeline == "select":
        ds = base.select(rng.permutation(134)[:90]).shuffle(seed=2)
    elif pipeline == "shard":
        ds = base.shuffle(seed=4).shard(3, 1, contiguous=False)
    elif pipeline == "interleave":
        ds = sf.interleave([base, base.select(range(50, 90))], probabilities=[0.6, 0.4], seed=9)
    else:
        ds = sf.concatenate([base.take(70), base.skip(100)]).shuffle(seed=1, buffer_size=30)
    loader = sf.DataLoader(ds, batch_size=8)
    full = [b["id"].tolist() for b in loader]
    assert full == [b["id"].tolist() for b in sf.DataLoader(ds, batch_size=8)]
    for stop in sorted({1, int(rng.integers(2, len(full))), len(full) - 1}):
        # A fresh loader: each pass of one loader is the next epoch.
        loader = sf.DataLoader(ds, batch_size=8)
        it = iter(loader)
        head = [next(it)["id"].tolist() for _ in range(stop)]
        state = loader.state_dict()
        del it
        job = tmp_path / "job.pkl"
        job.write_bytes(pickle.dumps((ds, state, 8)))
        out = subprocess.run([sys.executable, "-c", RESUME_SCRIPT, str(job)], capture_output=True, text=True, check=True)
        assert head + json.loads(out.stdout) == full, (pipeline, stop)


def test_a_stale_index_is_rebuilt(tmp_path: Path) -> None:
    paths = write_shards(tmp_path, "jsonl", [10, 6])
    assert sf.dataset(paths).index() == 16
    assert (tmp_path / ".part-001.jsonl.sfindex").exists()
    with open(paths[1], "a") as f:
        f.write(json.dumps({"id": 16, "text": "appended"}) + "\n")
    ds = sf.dataset(paths)
    assert len(ds) == 17
    assert ds[-1]["text"] == "appended"
    assert [r["id"] for r in ds.select(range(14, 17))] == [14, 15, 16]
    # Damaged index files are never trusted either.
    (tmp_path / ".part-000.jsonl.sfindex").write_bytes(b"SFINDEX1 garbage")
    assert len(sf.dataset(paths)) == 17


def test_index_lives_in_cache_dir_when_given(tmp_path: Path) -> None:
    paths = write_shards(tmp_path / "data", "tfrecord", [12])
    cache = tmp_path / "cache"
    ds = sf.dataset(paths, format="tfrecord", format_options={"raw": True}, storage_options={"cache_dir": str(cache)})
    assert ds.index() == 12
    assert list((cache / "index").glob("*.sfindex"))
    assert not list((tmp_path / "data").glob(".*"))


def test_pickled_verbs_rebuild() -> None:
    a = sf.from_dict({"id": np.arange(10)})
    ds = sf.concatenate([a.select([3, 1]), a.skip(8)]).rename_columns({"id": "k"})
    again = pickle.loads(pickle.dumps(ds))
    assert [r["k"] for r in again] == [r["k"] for r in ds] == [3, 1, 8, 9]


def test_remote_indexes_are_kept_in_the_user_cache(tmp_path: Path, seaweed, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    write_shards(tmp_path / "up", "tfrecord", [30, 12])
    seaweed.upload_tree(tmp_path / "up", "indexed")
    monkeypatch.setenv("SHARDFLOW_CACHE_DIR", str(tmp_path / "user-cache"))
    options = {"format_options": {"raw": True}, "storage_options": seaweed.storage_options()}
    assert sf.dataset("s3://indexed/*.tfrecord", **options).index() == 42
    assert len(list((tmp_path / "user-cache" / "index").glob("*.sfindex"))) == 2
    # Another process finds them there: it does not index the shards again (which would
    # write each file anew).
    files = {p: p.stat().st_ino for p in (tmp_path / "user-cache" / "index").glob("*.sfindex")}
    script = "import sys, json, shardflow as sf; print(len(sf.dataset('s3://indexed/*.tfrecord', **json.loads(sys.argv[1]))))"
    out = subprocess.run([sys.executable, "-c", script, json.dumps(options)], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["42"]
    assert {p: p.stat().st_ino for p in files} == files


@pytest.mark.parametrize("name", ["bad.jsonl", "bad.jsonl.gz"])
def test_skipped_records_are_not_read_at_the_wrong_index(tmp_path: Path, name: str) -> None:
    """With on_error="skip", iteration skips a bad line and counts it. Reading by index
    finds a plain file's records by their byte range, so only the bad record is an
    error; a gzip file's records are found by decoding the whole file, where a skipped
    one would shift every row after it, so reading any of them says so instead."""
    text = b'{"id": 0}\n{"id": 1\n{"id": 2}\n'
    (tmp_path / name).write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
    ds = sf.dataset(str(tmp_path / name), on_error="skip")
    loader = sf.DataLoader(ds, batch_size=10)
    assert [int(i) for b in loader for i in b["id"]] == [0, 2]
    assert loader.stats()["skipped_records"] + loader.stats()["skipped_units"] >= 1
    assert len(ds) == 3  # the index counts records, readable or not
    with pytest.raises(sf.DecodeError, match=name.replace(".", r"\.")):
        ds[1]
    if name.endswith(".gz"):
        with pytest.raises(sf.DecodeError, match="cannot be read by index"):
            ds[2]
    else:
        assert ds[2]["id"] == 2
