"""WebDataset tar shards read through shardflow group and decode like the webdataset library."""

from __future__ import annotations

import gc
import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds

import shardflow as sf


# webdataset's own reader leaves its tar files to the garbage collector.
tolerate_wds_leaks = pytest.mark.filterwarnings(
    "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"
)


def write_shard(path: Path, start: int, n: int) -> None:
    with wds.TarWriter(str(path)) as sink:
        for i in range(start, start + n):
            sample = {
                "__key__": f"v1.2/part-{i % 3}/sample{i:05d}",
                "txt": f"caption {i} «ü»",
                "cls": i % 7,
                "npy": np.arange(i % 5 + 1, dtype=np.float32) * i,
                "seg.png": bytes([i % 256]) * (i % 11),
                "jpg": os.urandom(16),
            }
            if i % 4:
                sample["json"] = {"id": i, "tags": ["a"] * (i % 3), "score": i / 8}
            sink.write(sample)


def reference_samples(paths: list[Path]) -> list[dict]:
    """webdataset's raw samples, decoded by the rules shardflow applies."""
    out = []
    for raw in wds.WebDataset([str(p) for p in paths], shardshuffle=False):
        sample = {}
        for key, value in raw.items():
            ext = key.rsplit(".", 1)[-1]
            if key == "__local_path__":
                continue  # webdataset bookkeeping, not data
            if key in ("__key__", "__url__"):
                sample[key] = value
            elif ext == "json":
                sample[key] = json.loads(value)
            elif ext in ("txt", "text"):
                sample[key] = value.decode()
            elif ext in ("cls", "index"):
                sample[key] = int(value)
            elif ext == "npy":
                sample[key] = np.load(io.BytesIO(value))
            else:
                sample[key] = value
        out.append(sample)
    return out


def same(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


@tolerate_wds_leaks
def test_samples_equal_webdataset(tmp_path: Path) -> None:
    paths = [tmp_path / f"shard-{i:03d}.tar" for i in range(3)]
    for i, path in enumerate(paths):
        write_shard(path, i * 40, 40)
    expected = reference_samples(paths)
    ours = list(sf.dataset(str(tmp_path / "shard-{000..002}.tar")))
    assert len(ours) == len(expected) == 120
    for mine, theirs in zip(ours, expected):
        # Fields a sample lacks are None here; webdataset leaves them out.
        assert {k for k, v in mine.items() if v is not None} == set(theirs), theirs["__key__"]
        for key, value in theirs.items():
            assert same(mine[key], value), (theirs["__key__"], key)
    assert ours[0]["__key__"] == "v1.2/part-0/sample00000" and "seg.png" in ours[0]
    gc.collect()  # close what webdataset left open while its leaks are tolerated


def test_batches_stack_arrays_and_keep_objects(tmp_path: Path) -> None:
    write_shard(tmp_path / "a.tar", 0, 30)
    loader = sf.DataLoader(sf.dataset(str(tmp_path / "a.tar"), columns=["__key__", "cls", "json", "npy"]), batch_size=30)
    batch = next(iter(loader))
    assert list(batch) == ["__key__", "cls", "json", "npy"]
    assert batch["cls"].dtype == np.int64 and batch["cls"].tolist() == [i % 7 for i in range(30)]
    assert batch["json"][1] == {"id": 1, "tags": ["a"], "score": 0.125} and batch["json"][0] is None
    assert batch["npy"].dtype == object and batch["npy"][4].tolist() == [0.0, 4.0, 8.0, 12.0, 16.0]


def test_gzipped_shards_stream(tmp_path: Path) -> None:
    import gzip

    write_shard(tmp_path / "a.tar", 0, 25)
    (tmp_path / "a.tar.gz").write_bytes(gzip.compress((tmp_path / "a.tar").read_bytes()))
    (tmp_path / "a.tar").unlink()
    assert [r["cls"] for r in sf.dataset(str(tmp_path / "a.tar.gz"))] == [i % 7 for i in range(25)]


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


@tolerate_wds_leaks
def test_repeated_field_in_a_sample_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "dup.tar"
    with tarfile.open(path, "w") as tar:
        add_member(tar, "s1.txt", b"one")
        add_member(tar, "s1.TXT", b"again")  # fields are lower-cased, as webdataset does
    with pytest.raises(sf.DecodeError, match="dup.tar.*\"s1\" has two \"txt\" members"):
        list(sf.dataset(str(path)))
    with pytest.raises(ValueError, match="duplicate"):
        list(wds.WebDataset(str(path), shardshuffle=False))
    gc.collect()  # close what webdataset left open while its leaks are tolerated


def test_parent_paths_in_member_names_stay_inside_the_stream(tmp_path: Path) -> None:
    path = tmp_path / "evil.tar"
    with tarfile.open(path, "w") as tar:
        add_member(tar, "../escape.txt", b"outside?")
        add_member(tar, "/abs/x.txt", b"absolute")
        add_member(tar, "ok.txt", b"fine")
    before = set(os.listdir(tmp_path.parent))
    rows = list(sf.dataset(str(path)))
    assert [(r["__key__"], r["txt"]) for r in rows] == [("../escape", "outside?"), ("/abs/x", "absolute"), ("ok", "fine")]
    assert set(os.listdir(tmp_path.parent)) == before
    # Only the data and its record index (list() asks len(), which indexes the tar).
    assert sorted(os.listdir(tmp_path)) == [".evil.tar.sfindex", "evil.tar"]


@pytest.mark.parametrize("where", ["first header", "first data", "last data"])
def test_truncated_tar(tmp_path: Path, where: str) -> None:
    path = tmp_path / "t.tar"
    write_shard(path, 0, 10)
    with tarfile.open(path) as tar:
        members = tar.getmembers()
    cut = {
        "first header": 100,
        "first data": members[0].offset_data + 3,
        "last data": members[-1].offset_data + members[-1].size // 2,
    }[where]
    path.write_bytes(path.read_bytes()[:cut])
    with pytest.raises(sf.DecodeError, match="t.tar"):
        list(sf.DataLoader(sf.dataset(str(path), columns=["__key__", "txt"]), batch_size=4))


def test_bad_member_content_is_named_or_skipped(tmp_path: Path) -> None:
    path = tmp_path / "bad.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(5):
            add_member(tar, f"s{i}.cls", b"not a number" if i == 2 else str(i).encode())
    with pytest.raises(sf.DecodeError, match="sample \"s2\": cls is not an integer"):
        list(sf.dataset(str(path)))
    loader = sf.DataLoader(sf.dataset(str(path), on_error="skip"), batch_size=10)
    assert next(iter(loader))["cls"].tolist() == [0, 1, 3, 4]
    assert loader.stats()["skipped_records"] == 1
