"""Shared helpers for the Python tests."""

from __future__ import annotations

import gzip
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest


FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


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

S3_KEY, S3_SECRET = "shardflow-test-key", "shardflow-test-secret-Zq81"


def _free_port_pair() -> int:
    """A port P with P and P + 10000 free (SeaweedFS puts gRPC at +10000)."""
    import socket

    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair")


class Seaweed:
    def __init__(self, directory: Path) -> None:
        import subprocess

        self.ports = {name: _free_port_pair() for name in ("master", "volume", "filer", "s3")}
        args = [
            "weed", "mini", f"-dir={directory}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false", "-admin.ui=false", "-webdav=false",
        ]
        for name, port in self.ports.items():
            args += [f"-{name}.port={port}", f"-{name}.port.grpc={port + 10000}"]
        env = dict(os.environ, AWS_ACCESS_KEY_ID=S3_KEY, AWS_SECRET_ACCESS_KEY=S3_SECRET)
        self.log = open(directory / "weed.log", "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(args, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.s3_url = f"http://127.0.0.1:{self.ports['s3']}"
        self.filer_url = f"http://127.0.0.1:{self.ports['filer']}"
        self._wait_ready()

    def client(self, endpoint: str | None = None):  # noqa: ANN201
        import boto3

        return boto3.client(
            "s3", endpoint_url=endpoint or self.s3_url, aws_access_key_id=S3_KEY,
            aws_secret_access_key=S3_SECRET, region_name="us-east-1",
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 90
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}")
            try:
                self.client().list_buckets()
                return
            except Exception as e:  # noqa: BLE001 (any failure means: not ready yet)
                last = e
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"SeaweedFS did not start: {last}")

    def storage_options(self, endpoint: str | None = None, **extra: object) -> dict:
        return {
            "endpoint_url": endpoint or self.s3_url, "access_key_id": S3_KEY,
            "secret_access_key": S3_SECRET, "region": "us-east-1", **extra,
        }

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except Exception:  # noqa: BLE001
            self.process.kill()
            self.process.wait()
        self.log.close()


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    server = Seaweed(tmp_path_factory.mktemp("seaweed"))
    yield server
    server.stop()
