"""torch workers reading S3 data (SeaweedFS) that the parent process listed but never
read, or read before the workers started: forked and spawned, 2 and 4 workers, every
format. The first read in a worker builds its own clients and runtime, and every row
arrives exactly once."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
from conftest import Seaweed
from test_remote import write_formats
from torch.utils.data import DataLoader as TorchLoader

import shardflow as sf
from shardflow.torch import IterableDataset

DIRS = {"webdataset": "tar", "arrow_stream": "arrow"}

# 4 workers on a 2-core machine is the point of some cases, not a mistake.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def write_tfrecord(path: Path, records: list[bytes]) -> None:
    """TFRecord framing: length, masked CRC32C of the length, data, masked CRC32C of the data."""
    with open(path, "wb") as f:
        for data in records:
            length = struct.pack("<Q", len(data))
            f.write(length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data)))


@pytest.fixture(scope="module")
def bucket(tmp_path_factory: pytest.TempPathFactory, seaweed: Seaweed) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("forkfmt")
    written = write_formats(root)
    (root / "tfrecord").mkdir()
    for i in range(3):
        write_tfrecord(root / "tfrecord" / f"part-{i}.tfrecord", [f"record-{i}-{j}".encode() * (j % 7 + 1) for j in range(90)])
    written["tfrecord"] = ([f"part-{i}.tfrecord" for i in range(3)], {"format_options": {"raw": True}})
    seaweed.upload_tree(root, "forked")
    return root, written


FORMATS = ["parquet", "jsonl", "csv", "npy", "npz", "webdataset", "arrow", "arrow_stream", "raw", "tfrecord"]


def plain(value: Any) -> Any:
    """Python values for numpy arrays and scalars alike (samples come as either)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if k != "__url__"}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def canonical(rows: list[dict]) -> list[str]:
    return sorted(repr(plain(row)) for row in rows)


def read_in_workers(ds: sf.Dataset, workers: int, context: str) -> list[dict[str, Any]]:
    loader = TorchLoader(IterableDataset(ds), batch_size=None, num_workers=workers, multiprocessing_context=context)
    return list(loader)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("workers", [2, 4])
@pytest.mark.parametrize("prepared", [False, True], ids=["listed-only", "prepared"])
def test_forked_workers_read_every_row(bucket: tuple[Path, dict], seaweed: Seaweed, fmt: str, workers: int, prepared: bool) -> None:
    root, written = bucket
    names, kwargs = written[fmt]
    folder = DIRS.get(fmt, fmt)
    expected = canonical(list(sf.dataset([str(root / folder / n) for n in names], **kwargs)))
    ds = sf.dataset([f"s3://forked/{folder}/{n}" for n in names], storage_options=seaweed.storage_options(), **kwargs)
    if prepared:
        assert ds.column_names  # footers / headers / schema read in the parent
    got = read_in_workers(ds, workers, "fork")
    assert len(got) == len(expected)
    assert canonical(got) == expected


@pytest.mark.parametrize("fmt", FORMATS)
def test_spawned_workers_read_every_row(bucket: tuple[Path, dict], seaweed: Seaweed, fmt: str) -> None:
    root, written = bucket
    names, kwargs = written[fmt]
    folder = DIRS.get(fmt, fmt)
    expected = canonical(list(sf.dataset([str(root / folder / n) for n in names], **kwargs)))
    ds = sf.dataset([f"s3://forked/{folder}/{n}" for n in names], storage_options=seaweed.storage_options(), **kwargs)
    workers = 4 if fmt == "parquet" else 2
    got = read_in_workers(ds, workers, "spawn")
    assert len(got) == len(expected)
    assert canonical(got) == expected


def test_a_glob_listed_in_the_parent_is_read_by_forked_workers(bucket: tuple[Path, dict], seaweed: Seaweed) -> None:
    root, written = bucket
    ds = sf.dataset("s3://forked/parquet/*.parquet", storage_options=seaweed.storage_options(), on_error="skip")
    got = read_in_workers(ds, 2, "fork")
    assert len(got) == 1500
    assert sorted(int(r["id"]) for r in got) == list(range(1500))
