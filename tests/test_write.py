"""`Dataset.write`: every output format reads back equal to its source, through
shardflow and through the format's reference reader; the manifest gives `len()` and
rank splits without a pass over the data; writes are atomic, locally and on S3."""

from __future__ import annotations

import gc
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import shardflow as sf

from conftest import wait_for


def table(n: int, seed: int = 0) -> pa.Table:
    """Columns every format can hold, named by WebDataset's conventions."""
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "cls": pa.array(rng.integers(-(2**40), 2**40, n), pa.int64()),
            "txt": pa.array([f"row {i} ü{'x' * (i % 5)}" for i in range(n)]),
            "score": pa.array(rng.standard_normal(n).astype(np.float32)),
        }
    )


def rows_of(ds: sf.Dataset) -> list[dict]:
    return [dict(r) for r in ds]


def manifest_of(path: Path) -> dict:
    return json.loads((path / "_shardflow.json").read_text())


# ---- round trips per format, checked by the reference readers ----------------------------

tables = st.integers(0, 60).flatmap(
    lambda n: st.tuples(
        st.just(n),
        st.lists(st.integers(-(2**63), 2**63 - 1), min_size=n, max_size=n),
        st.lists(st.text(max_size=8), min_size=n, max_size=n),
        st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=n, max_size=n),
        st.lists(st.binary(min_size=1, max_size=12), min_size=n, max_size=n),
    )
)
shard_rows = st.one_of(st.none(), st.integers(1, 25))

PROPERTY = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def source_table(n: int, ints: list, texts: list, floats: list, blobs: list) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "big": pa.array(ints, pa.int64()),
            "text": pa.array(texts, pa.string()),
            "x": pa.array(floats, pa.float32()),
            "blob": pa.array(blobs, pa.binary()),
        }
    )


def check_manifest(dest: Path, n: int, max_rows: int | None) -> list[dict]:
    manifest = manifest_of(dest)
    shards = manifest["shards"]
    assert manifest["rows"] == n == sum(s["rows"] for s in shards)
    assert [s["path"].split(".")[0] for s in shards] == [f"part-{i:05d}" for i in range(len(shards))]
    for s in shards:
        assert (dest / s["path"]).stat().st_size == s["bytes"]
        if max_rows is not None:
            assert s["rows"] <= max_rows
    # Full shards except the last: the cut follows the limit, not the batches.
    if max_rows is not None and shards:
        assert all(s["rows"] == max_rows for s in shards[:-1])
    return shards


@PROPERTY
@given(data=tables, max_rows=shard_rows)
def test_parquet_round_trip(tmp_path_factory: pytest.TempPathFactory, data: tuple, max_rows: int | None) -> None:
    source = source_table(*data)
    dest = tmp_path_factory.mktemp("pq")
    sf.from_arrow(source).write(dest, "parquet", max_rows_per_shard=max_rows, overwrite=True)
    check_manifest(dest, source.num_rows, max_rows)
    if source.num_rows:
        # pyarrow reads the directory (it skips `_`-prefixed files, as we do).
        assert pq.read_table(dest).sort_by("id").equals(source)
        assert pa.table(sf.dataset(dest)).equals(source)


@PROPERTY
@given(data=tables, max_rows=shard_rows, gzip=st.booleans())
def test_jsonl_round_trip(tmp_path_factory: pytest.TempPathFactory, data: tuple, max_rows: int | None, gzip: bool) -> None:
    source = source_table(*data).drop_columns(["blob"]).replace_schema_metadata(None)
    source = source.set_column(3, "x", source["x"].cast(pa.float64()))
    dest = tmp_path_factory.mktemp("jsonl")
    sf.from_arrow(source).write(dest, "jsonl", max_rows_per_shard=max_rows, compression="gzip" if gzip else None, overwrite=True)
    shards = check_manifest(dest, source.num_rows, max_rows)
    import gzip as gz

    lines = []
    for s in shards:
        raw = (dest / s["path"]).read_bytes()
        assert s["path"].endswith(".jsonl.gz" if gzip else ".jsonl")
        lines += (gz.decompress(raw) if gzip else raw).decode().split("\n")[:-1]
    assert [json.loads(line) for line in lines] == source.to_pylist()
    if source.num_rows:
        assert rows_of(sf.dataset(dest)) == source.to_pylist()


@PROPERTY
@given(data=tables, max_rows=shard_rows)
def test_npz_round_trip(tmp_path_factory: pytest.TempPathFactory, data: tuple, max_rows: int | None) -> None:
    n, ints, texts, floats, blobs = data
    assume(n > 0)  # from_dict cannot type an empty column
    source = source_table(n, ints, [t.rstrip("\0") for t in texts], floats, [b.rstrip(b"\0") or b"x" for b in blobs])
    images = np.arange(n * 6, dtype=np.uint8).reshape(n, 2, 3)
    ds = sf.from_dict({**{c: source[c].to_numpy(zero_copy_only=False) for c in source.column_names}, "image": images})
    dest = tmp_path_factory.mktemp("npz")
    ds.write(dest, "npz", max_rows_per_shard=max_rows, compression="deflate", overwrite=True)
    shards = check_manifest(dest, n, max_rows)
    loaded = [np.load(dest / s["path"]) for s in shards]
    for column in ["id", "big", "x"]:
        np.testing.assert_array_equal(np.concatenate([z[column] for z in loaded]), source[column].to_numpy())
    assert [t for z in loaded for t in z["text"].tolist()] == source["text"].to_pylist()
    assert [b for z in loaded for b in z["blob"].tolist()] == source["blob"].to_pylist()
    np.testing.assert_array_equal(np.concatenate([z["image"] for z in loaded]), images)
    assert loaded[0]["image"].dtype == np.uint8 and loaded[0]["big"].dtype == np.int64
    # The manifest reads the shards back in rows mode.
    batch = next(iter(sf.DataLoader(sf.dataset(dest), batch_size=n)))
    np.testing.assert_array_equal(batch["image"], images)
    np.testing.assert_array_equal(batch["big"], source["big"].to_numpy())


def test_webdataset_round_trip_through_webdataset(tmp_path: Path) -> None:
    import webdataset as wds

    n = 50
    rng = np.random.default_rng(1)
    jpgs = [rng.bytes(int(rng.integers(1, 3000))) for _ in range(n)]
    arrays = rng.standard_normal((n, 3, 4)).astype(np.float32)
    source = sf.from_dict(
        {
            "__key__": [f"shard/s{i:04d}" for i in range(n)],
            "jpg": jpgs,
            "cls": np.arange(n) % 7,
            "txt": [f"caption {i}" for i in range(n)],
            "json": [json.dumps({"i": i}) for i in range(n)],
            "feat.npy": arrays,
        }
    )
    manifest = source.write(tmp_path, "webdataset", max_rows_per_shard=16)
    assert [s["rows"] for s in manifest["shards"]] == [16, 16, 16, 2]
    urls = [str(tmp_path / s["path"]) for s in manifest["shards"]]
    assert all(u.endswith(".tar") for u in urls)
    with warnings.catch_warnings():
        # webdataset leaves its last shard's file to the garbage collector.
        warnings.simplefilter("ignore", ResourceWarning)
        samples = list(wds.WebDataset(urls, shardshuffle=False))
        gc.collect()
    assert [s["__key__"] for s in samples] == [f"shard/s{i:04d}" for i in range(n)]
    for i, s in enumerate(samples):
        assert s["jpg"] == jpgs[i]
        assert int(s["cls"]) == i % 7
        assert s["txt"].decode() == f"caption {i}"
        assert json.loads(s["json"]) == {"i": i}
        np.testing.assert_array_equal(np.load(io.BytesIO(s["feat.npy"])), arrays[i])
    back = rows_of(sf.dataset(tmp_path))
    assert [r["__key__"] for r in back] == [f"shard/s{i:04d}" for i in range(n)]
    assert [r["jpg"] for r in back] == jpgs
    assert [r["cls"] for r in back] == [i % 7 for i in range(n)]
    assert [r["txt"] for r in back] == [f"caption {i}" for i in range(n)]
    # Members are plain files: mode 0644, as tar lists them.
    with tarfile.open(urls[0]) as tar:
        member = tar.getmembers()[0]
        assert member.name == "shard/s0000.jpg" and member.mode == 0o644
        plain = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    # gzip wraps the same archive.
    zipped = source.write(tmp_path / "gz", "webdataset", max_rows_per_shard=16, compression="gzip")
    assert zipped["compression"] == "gzip" and zipped["shards"][0]["path"] == "part-00000.tar.gz"
    with tarfile.open(tmp_path / "gz" / "part-00000.tar.gz", "r:gz") as tar:
        assert {m.name: tar.extractfile(m).read() for m in tar.getmembers()} == plain
    assert [r["jpg"] for r in sf.dataset(tmp_path / "gz")] == jpgs


def test_webdataset_keys_default_to_the_row_number(tmp_path: Path) -> None:
    sf.from_dict({"cls": np.arange(12)}).write(tmp_path, "webdataset", max_rows_per_shard=5)
    keys = [r["__key__"] for r in sf.dataset(tmp_path)]
    assert keys == [f"{i:09d}" for i in range(12)]
    with pytest.raises(sf.InvalidArgumentError, match="first dot"):
        sf.from_dict({"__key__": ["a.b"], "cls": [1]}).write(tmp_path / "bad", "webdataset")


def test_tfrecord_round_trip(tmp_path: Path) -> None:
    # tf.data's reading of these shards is in tests/tensorflow/test_write_tfrecord.py.
    n = 40
    source = sf.from_dict(
        {
            "label": np.arange(n, dtype=np.int64) - 20,
            "weight": np.linspace(0, 1, n, dtype=np.float32),
            "name": [f"n{i}".encode() for i in range(n)],
            "vec": np.arange(n * 3, dtype=np.int64).reshape(n, 3),
        }
    )
    manifest = source.write(tmp_path, "tfrecord", max_rows_per_shard=15, compression="gzip")
    assert [s["path"] for s in manifest["shards"]] == [f"part-{i:05d}.tfrecord.gz" for i in range(3)]
    features = {
        "label": sf.FixedLen([], "int64"),
        "weight": sf.FixedLen([], "float32"),
        "name": sf.FixedLen([], "bytes"),
        "vec": sf.FixedLen([3], "int64"),
    }
    batch = next(iter(sf.DataLoader(sf.dataset(tmp_path, features=features), batch_size=n)))
    np.testing.assert_array_equal(batch["label"], np.arange(n) - 20)
    np.testing.assert_array_equal(batch["weight"], np.linspace(0, 1, n, dtype=np.float32))
    assert list(batch["name"]) == [f"n{i}".encode() for i in range(n)]
    np.testing.assert_array_equal(batch["vec"], np.arange(n * 3).reshape(n, 3))


# ---- what gets written -------------------------------------------------------------------

def test_mapped_filtered_interleaved_and_shuffled_datasets_write_their_rows(tmp_path: Path) -> None:
    a = sf.from_arrow(table(100, seed=1)).map(lambda r: {**r, "cls": r["cls"] % 10})
    b = sf.from_arrow(table(100, seed=2)).filter(lambda r: r["cls"] % 2 == 0)
    mixed = sf.interleave([a, b], seed=3).shuffle(seed=4)
    expected = rows_of(mixed)
    mixed.write(tmp_path / "mixed", "parquet", max_rows_per_shard=30)
    assert pq.read_table(tmp_path / "mixed").to_pylist() == expected
    # The same dataset writes the same bytes.
    mixed.write(tmp_path / "again", "parquet", max_rows_per_shard=30)
    digest = lambda d: sorted(hashlib.sha256(p.read_bytes()).hexdigest() for p in d.iterdir())  # noqa: E731
    assert digest(tmp_path / "mixed") == digest(tmp_path / "again")


def test_an_empty_dataset_writes_an_empty_manifest(tmp_path: Path) -> None:
    empty = sf.from_arrow(table(10)).take(0)
    manifest = empty.write(tmp_path, "parquet", compression="zstd")
    assert manifest["shards"] == [] and manifest["rows"] == 0 and manifest["compression"] == "zstd"
    with pytest.raises(sf.NotFoundError, match="lists no shards"):
        sf.dataset(tmp_path)


def test_shards_are_cut_by_bytes(tmp_path: Path) -> None:
    rows = 1000
    ds = sf.from_dict({"data": np.zeros((rows, 1000), np.uint8)})  # 1000 bytes a row
    manifest = ds.write(tmp_path, "npz", max_bytes_per_shard=64_000)
    counts = [s["rows"] for s in manifest["shards"]]
    assert sum(counts) == rows and max(counts) == 64 and len(counts) == 16
    assert all(abs(s["bytes"] - 64_000 * s["rows"] / 64) < 2_000 for s in manifest["shards"])


def test_types_a_format_cannot_hold_are_refused_before_writing(tmp_path: Path) -> None:
    with pytest.raises(sf.InvalidArgumentError, match=r'"blob".*jsonl'):
        sf.from_dict({"blob": [b"x"]}).write(tmp_path / "j", "jsonl")
    with pytest.raises(sf.InvalidArgumentError, match="ragged|numpy"):
        sf.from_list([{"v": [1, 2]}, {"v": [3]}]).write(tmp_path / "n", "npz")
    with pytest.raises(sf.InvalidArgumentError, match="holds nulls"):
        sf.from_list([{"v": 1}, {"v": None}]).write(tmp_path / "n2", "npz")
    with pytest.raises(sf.InvalidArgumentError, match=r'"x" holds inf or NaN'):
        sf.from_dict({"x": [1.0, float("inf")]}).write(tmp_path / "j", "jsonl")
    with pytest.raises(sf.InvalidArgumentError, match="compression"):
        sf.from_dict({"v": [1]}).write(tmp_path / "c", "jsonl", compression="zstd")
    with pytest.raises(sf.InvalidArgumentError, match="cannot write format"):
        sf.from_dict({"v": [1]}).write(tmp_path / "c", "csv")
    with pytest.raises(ValueError, match="max_rows_per_shard"):
        sf.from_dict({"v": [1]}).write(tmp_path / "c", max_rows_per_shard=0)
    assert not (tmp_path / "j").exists() and not (tmp_path / "c").exists()


def test_existing_destination_needs_overwrite_and_stale_shards_go(tmp_path: Path) -> None:
    ds = sf.from_arrow(table(100))
    ds.write(tmp_path, "parquet", max_rows_per_shard=10)
    assert len(list(tmp_path.glob("part-*.parquet"))) == 10
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(sf.AlreadyExistsError) as caught:
        ds.write(tmp_path, "parquet")
    assert isinstance(caught.value, FileExistsError)
    ds.write(tmp_path, "parquet", max_rows_per_shard=40, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "_shardflow.json", "notes.txt", "part-00000.parquet", "part-00001.parquet", "part-00002.parquet",
    ]
    assert len(sf.dataset(tmp_path)) == 100
    with pytest.raises(sf.InvalidArgumentError, match="inside it"):
        sf.dataset(tmp_path).write(tmp_path, "jsonl", overwrite=True)
    assert len(sf.dataset(tmp_path)) == 100


def test_progress_is_reported_and_its_exception_stops_the_write(tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    sf.from_arrow(table(5000)).write(tmp_path / "ok", "jsonl", max_rows_per_shard=1000, progress=lambda r, b: seen.append((r, b)))
    assert seen[-1][0] == 5000 and seen[-1][1] == sum(p.stat().st_size for p in (tmp_path / "ok").glob("part-*"))
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(seen, seen[1:]))

    def stop(rows: int, _: int) -> None:
        if rows >= 2000:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sf.from_arrow(table(5000)).write(tmp_path / "stopped", "jsonl", max_rows_per_shard=1000, progress=stop)
    assert not (tmp_path / "stopped" / "_shardflow.json").exists()


# ---- the manifest on the way back in -------------------------------------------------------

def test_manifest_gives_len_and_exact_rank_splits_without_indexing(tmp_path: Path) -> None:
    n = 1003
    sf.from_arrow(table(n)).write(tmp_path, "jsonl", max_rows_per_shard=100)
    ds = sf.dataset(tmp_path)
    assert ds.format == "jsonl"
    assert [t["rows"] for t in ds._shard_table()] == [100] * 10 + [3]
    # Without the manifest the same files know no row counts until indexed.
    plain = sf.dataset(str(tmp_path / "part-*.jsonl"))
    assert [t["rows"] for t in plain._shard_table()] == [None] * 11
    assert len(ds) == n
    seen = []
    for rank in range(4):
        loader = sf.DataLoader(ds, batch_size=50, rank=rank, world_size=4, drop_last=True, shuffle=True, seed=5)
        ids = [txt for batch in loader for txt in batch["txt"]]
        assert len(ids) == n // 4  # equal shares; the remainder (3 rows) left out evenly
        seen += ids
    assert len(set(seen)) == len(seen) == n // 4 * 4


def test_a_manifest_that_lies_is_caught(tmp_path: Path) -> None:
    sf.from_arrow(table(30)).write(tmp_path, "jsonl", max_rows_per_shard=10)
    manifest = manifest_of(tmp_path)
    manifest["shards"][1]["rows"] = 11
    (tmp_path / "_shardflow.json").write_text(json.dumps(manifest))
    with pytest.raises(sf.DecodeError, match=r"part-00001\.jsonl.*10 rows where .* promised 11"):
        list(sf.dataset(tmp_path))
    # A shard that changed size after the write: the manifest no longer describes it.
    (tmp_path / "part-00002.jsonl").write_text('{"cls": 1}\n')
    with pytest.raises(sf.SchemaError, match="changed after it was written"):
        sf.dataset(tmp_path)
    (tmp_path / "part-00002.jsonl").unlink()
    with pytest.raises(sf.NotFoundError, match="part-00002"):
        sf.dataset(tmp_path)
    (tmp_path / "_shardflow.json").write_text("{not json")
    with pytest.raises(sf.DecodeError, match="_shardflow.json"):
        sf.dataset(tmp_path)


# ---- atomicity -----------------------------------------------------------------------------

KILLED_WRITER = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import shardflow as sf

    def slow(batch):
        time.sleep(0.05)
        return batch

    ds = sf.from_dict({"x": np.arange(200_000), "pad": np.zeros((200_000, 64), np.uint8)}).map(slow, batched=True, batch_size=2000, batch_format="numpy")
    ds.write(sys.argv[1], "parquet", max_rows_per_shard=4000, num_threads=2)
    """
)


def test_a_killed_writer_leaves_no_shard_that_looks_complete(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(dest)])
    try:
        assert wait_for(lambda: len(list(dest.glob("part-*.parquet"))) >= 3, timeout=60)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert not (dest / "_shardflow.json").exists()
    names = [p.name for p in dest.iterdir()]
    complete = [n for n in names if not n.startswith(".")]
    assert complete and all(n.startswith("part-") and n.endswith(".parquet") for n in complete)
    for name in complete:  # every shard under its final name is whole
        shard = pq.read_table(dest / name)
        assert shard.num_rows == 4000
        index = int(name[5:10])
        assert shard["x"].to_pylist() == list(range(index * 4000, (index + 1) * 4000))
    assert all(n.startswith(".part-") and ".tmp-" in n for n in names if n.startswith("."))
    # Writing again replaces everything, the killed writer's temporaries included.
    sf.from_dict({"x": np.arange(10)}).write(dest, "parquet", overwrite=True)
    assert sorted(p.name for p in dest.iterdir()) == ["_shardflow.json", "part-00000.parquet"]


# ---- bounded memory ------------------------------------------------------------------------

SHARD_WRITER = textwrap.dedent(
    """
    import json, shutil, sys
    import shardflow as sf

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

    source, dest, fmt, shard_bytes = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    ds = sf.dataset(source)
    # A first small write loads what any write needs (modules, code, threads).
    ds.select(range(4)).write(dest, fmt)
    shutil.rmtree(dest)
    # The peak from here on (ru_maxrss would start from the parent's, which fork passes on).
    open("/proc/self/clear_refs", "w").write("5")
    before = status("VmRSS")
    manifest = ds.write(dest, fmt, max_bytes_per_shard=shard_bytes, memory_limit=32 << 20, num_threads=2)
    peak = status("VmHWM")
    print(json.dumps({"shards": len(manifest["shards"]), "growth": peak - before}))
    """
)


@pytest.fixture(scope="module")
def big_rows(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bytes]]:
    """300 MiB of incompressible rows (256 KiB each) in one Parquet file."""
    rng = np.random.default_rng(7)
    blobs = [rng.bytes(256 << 10) for _ in range(1200)]
    path = tmp_path_factory.mktemp("big") / "rows.parquet"
    pq.write_table(pa.table({"id": np.arange(1200), "blob": blobs}), path, row_group_size=4, compression="none")
    return path, blobs


@pytest.mark.parametrize("fmt", ["parquet", "webdataset"])
def test_a_shard_larger_than_memory_limit_is_written_in_bounded_memory(big_rows: tuple[Path, list[bytes]], fmt: str, tmp_path: Path) -> None:
    # The writer held a shard's batches and then the whole encoded shard: one 300 MiB
    # shard took 600 MiB more than 8 MiB shards did. Encoded as a stream, one shard costs
    # what small ones cost, give or take a Parquet row group (32 MiB) per writer thread.
    source, blobs = big_rows

    def growth(shard_bytes: int) -> tuple[int, int]:
        dest = tmp_path / f"out-{shard_bytes}"
        out = subprocess.run([sys.executable, "-c", SHARD_WRITER, str(source), str(dest), fmt, str(shard_bytes)],
                             check=True, capture_output=True, text=True).stdout
        result = json.loads(out.splitlines()[-1])
        return result["shards"], result["growth"]

    small_shards, small = growth(8 << 20)
    one_shard, one = growth(1 << 40)
    assert small_shards > 30 and one_shard == 1
    assert one - small < 100 << 20, f"peak RSS grew {one >> 20} MiB for one 300 MiB shard, {small >> 20} MiB for 8 MiB shards"
    dest = tmp_path / f"out-{1 << 40}"
    if fmt == "parquet":
        written = pq.read_table(dest / "part-00000.parquet")
        assert written["id"].to_pylist() == list(range(1200)) and written["blob"].to_pylist() == blobs
    else:
        import webdataset as wds

        with warnings.catch_warnings():
            # webdataset leaves its last shard's file to the garbage collector.
            warnings.simplefilter("ignore", ResourceWarning)
            samples = list(wds.WebDataset(str(dest / "part-00000.tar"), shardshuffle=False))
            gc.collect()
        assert [int(s["id"]) for s in samples] == list(range(1200)) and [s["blob"] for s in samples] == blobs


def test_a_write_that_fails_inside_a_streamed_shard_leaves_nothing_under_its_name(tmp_path: Path) -> None:
    # Row 3,000's key repeats row 2,999's: the shard's first rows are already in its
    # temporary file (streamed) when the error comes; the temporary goes, no part file
    # appears, and the directory the write made goes too.
    keys = [f"k{i}" for i in range(5000)]
    keys[3000] = keys[2999]
    ds = sf.from_dict({"__key__": keys, "txt": [f"row {i}" for i in range(5000)]})
    with pytest.raises(sf.ShardflowError, match="k2999"):
        ds.write(tmp_path / "out", "webdataset", max_rows_per_shard=10_000, num_threads=1)
    assert not (tmp_path / "out").exists()
    # Into a directory that was there, the same: nothing of the write is left.
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("mine")
    with pytest.raises(sf.ShardflowError, match="k2999"):
        ds.write(tmp_path / "kept", "webdataset", max_rows_per_shard=10_000, overwrite=True)
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["notes.txt"]


# ---- S3 ------------------------------------------------------------------------------------

def test_write_to_s3_small_and_multipart(seaweed) -> None:  # noqa: ANN001
    client = seaweed.client()
    client.create_bucket(Bucket="written")
    options = seaweed.storage_options()
    source = table(3000)
    source = source.set_column(2, "score", source["score"].cast(pa.float64()))  # JSON numbers read back as float64
    manifest = sf.from_arrow(source).write("s3://written/small/", "jsonl", max_rows_per_shard=1000, storage_options=options)
    assert [s["rows"] for s in manifest["shards"]] == [1000] * 3
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket="written", Prefix="small/")["Contents"])
    assert keys == ["small/_shardflow.json"] + [f"small/part-{i:05d}.jsonl" for i in range(3)]
    ds = sf.dataset("s3://written/small", storage_options=options)
    assert [t["rows"] for t in ds._shard_table()] == [1000] * 3 and len(ds) == 3000
    assert rows_of(ds) == json.loads(json.dumps(source.to_pylist()))

    # One 40 MB shard goes up in 16 MiB parts.
    rng = np.random.default_rng(0)
    blobs = [rng.bytes(400_000) for _ in range(100)]
    big = sf.from_dict({"cls": np.arange(100), "bin": blobs})
    manifest = big.write("s3://written/big", "webdataset", max_bytes_per_shard=1 << 30, storage_options=options)
    assert len(manifest["shards"]) == 1 and manifest["shards"][0]["bytes"] > 40_000_000
    head = client.head_object(Bucket="written", Key="big/part-00000.tar")
    assert head["ContentLength"] == manifest["shards"][0]["bytes"]
    assert head["ETag"].strip('"').endswith("-3")  # a multipart object of 3 parts
    assert [r["bin"] for r in sf.dataset("s3://written/big/", storage_options=options)] == blobs
    assert not client.list_multipart_uploads(Bucket="written").get("Uploads")

    # Refused 36 MB into a streamed shard (two parts sent): the upload is aborted, and
    # no object is left.
    keys = [f"k{i}" for i in range(100)]
    keys[90] = keys[89]
    with pytest.raises(sf.ShardflowError, match="k89"):
        sf.from_dict({"__key__": keys, "bin": blobs}).write("s3://written/failed", "webdataset", max_bytes_per_shard=1 << 30, storage_options=options)
    assert not client.list_objects_v2(Bucket="written", Prefix="failed/").get("Contents")
    assert not client.list_multipart_uploads(Bucket="written").get("Uploads")

    with pytest.raises(sf.AlreadyExistsError, match="s3://written/small"):
        sf.from_arrow(source).write("s3://written/small", "jsonl", storage_options=options)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "webdataset", "tfrecord", "npz"])
def test_every_format_round_trips_through_s3(seaweed, fmt: str) -> None:  # noqa: ANN001
    client = seaweed.client()
    if "every" not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket="every")
    options = seaweed.storage_options()
    n = 500
    source = sf.from_dict({"cls": np.arange(n) * 3, "txt": [f"row {i}" for i in range(n)]})
    manifest = source.write(f"s3://every/{fmt}", fmt, max_rows_per_shard=200, compression="gzip" if fmt == "jsonl" else None, storage_options=options)
    assert [s["rows"] for s in manifest["shards"]] == [200, 200, 100]
    ds = sf.dataset(f"s3://every/{fmt}/", storage_options=options)
    if fmt == "tfrecord":  # Examples carry no types: say them
        ds = sf.dataset(f"s3://every/{fmt}/", storage_options=options, features={"cls": sf.FixedLen([], "int64"), "txt": sf.FixedLen([], "bytes")})
    assert len(ds) == n
    rows = list(ds)
    assert [int(r["cls"]) for r in rows] == list(range(0, 3 * n, 3))
    texts = [r["txt"].decode() if isinstance(r["txt"], bytes) else str(r["txt"]) for r in rows]
    assert texts == [f"row {i}" for i in range(n)]
