"""Shared helpers for the Python tests."""

from __future__ import annotations

import gzip
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from faultproxy import FaultProxy
from servers import S3_KEY, S3_SECRET, Seaweed  # noqa: F401 (re-exported for tests)


FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `slow` run only with SHARDFLOW_SLOW_TESTS=1."""
    if os.environ.get("SHARDFLOW_SLOW_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="slow; run with SHARDFLOW_SLOW_TESTS=1 (scripts/slow-tests.sh)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def read_idx(path: Path) -> np.ndarray:
    """The IDX format: big-endian magic (dtype, rank), then the dimensions."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    rank = data[3]
    dims = np.frombuffer(data, ">u4", count=rank, offset=4)
    return np.frombuffer(data, np.uint8, offset=4 + 4 * rank).reshape(tuple(int(d) for d in dims))


def thread_count() -> int:
    """OS threads in this process (Python's threading module only sees its own)."""
    return len(os.listdir("/proc/self/task"))


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def id_table(start: int, n: int) -> pa.Table:
    """Rows with a unique integer id and a payload derived from it."""
    ids = np.arange(start, start + n, dtype=np.int64)
    names = pa.array([f"row-{i}" for i in ids], pa.string())
    return pa.table({"id": ids, "value": (ids * 0.5).astype(np.float32), "name": names})


def write_id_shards(
    directory: Path,
    sizes: list[int],
    fmt: str = "parquet",
    row_group_size: int = 64,
) -> str:
    """Writes shards holding consecutive ids; returns a glob matching them."""
    start = 0
    for i, n in enumerate(sizes):
        table = id_table(start, n)
        path = directory / f"shard-{i:03d}.{fmt}"
        if fmt == "parquet":
            pq.write_table(table, path, row_group_size=max(1, row_group_size))
        else:
            with open(path, "w") as f:
                for row in table.to_pylist():
                    f.write(json.dumps(row) + "\n")
        start += n
    return str(directory / f"shard-*.{fmt}")


def ids_of(batches: Any) -> list[int]:
    out: list[int] = []
    for b in batches:
        out.extend(np.asarray(b["id"]).tolist())
    return out


@pytest.fixture
def id_shards(tmp_path: Path) -> Callable[..., str]:
    def make(sizes: list[int], fmt: str = "parquet", row_group_size: int = 64) -> str:
        return write_id_shards(tmp_path, sizes, fmt, row_group_size)

    return make


# ---- a real S3 server: SeaweedFS, started and stopped by the test session ----------


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    server = Seaweed(tmp_path_factory.mktemp("seaweed"))
    yield server
    server.stop()


@pytest.fixture
def proxy(seaweed: Seaweed) -> Iterator[FaultProxy]:
    """A fault proxy in front of the session's SeaweedFS (no faults until set)."""
    p = FaultProxy("127.0.0.1", seaweed.ports["s3"])
    yield p
    p.close()
