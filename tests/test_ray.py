"""Ray Data: `shardflow.ray.read` / `ds.to_ray()` read every format and source through a
`ray.data.Datasource` whose read tasks take shardflow's work units, on a local Ray
runtime started and stopped by this module."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardflow as sf
from conftest import Seaweed
from test_random_access import ident, open_format, write_shards

ray = pytest.importorskip("ray")
import shardflow.ray as sfray  # noqa: E402

# Ray warns about its own deprecated settings from inside its code.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray")


@pytest.fixture(scope="module", autouse=True)
def runtime() -> Any:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


def ids_of(fmt: str, rows: list[dict]) -> list[int]:
    return sorted(ident(fmt, r) for r in rows)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv", "tfrecord", "webdataset", "npz"])
def test_rows_equal_a_local_read(tmp_path: Path, fmt: str) -> None:
    paths = write_shards(tmp_path, fmt, [40, 0, 73, 15])
    local = open_format(paths, fmt)
    rows = local.to_ray(override_num_blocks=3).take_all()
    assert ids_of(fmt, rows) == list(range(128))
    # What each read task says before it runs: its rows and files.
    tasks = sfray.ShardflowDatasource(local).get_read_tasks(3)
    assert sum(t.metadata.num_rows for t in tasks) == 128
    assert all(set(t.metadata.input_files) <= set(local.shards) for t in tasks)


def test_read_from_s3_with_projection(tmp_path: Path, seaweed: Seaweed) -> None:
    write_shards(tmp_path / "up", "parquet", [500, 300])
    seaweed.upload_tree(tmp_path / "up", "raydata")
    ds = sfray.read("s3://raydata/*.parquet", storage_options=seaweed.storage_options())
    assert ds.count() == 800
    projected = ds.select_columns(["id"])
    assert projected.schema().names == ["id"]
    assert sorted(r["id"] for r in projected.take_all()) == list(range(800))


def test_iter_torch_batches(tmp_path: Path) -> None:
    paths = write_shards(tmp_path, "jsonl", [100, 28])
    ds = sf.dataset(paths).select_columns(["id"]).to_ray()
    seen = []
    for batch in ds.iter_torch_batches(batch_size=32):
        assert batch["id"].dtype.is_floating_point is False
        seen += batch["id"].tolist()
    assert sorted(seen) == list(range(128))


def test_streaming_split_gives_each_row_to_one_consumer(tmp_path: Path) -> None:
    paths = write_shards(tmp_path, "parquet", [61, 39, 100])
    splits = sfray.read(paths).streaming_split(2, equal=True)
    got: list[list[int]] = [[], []]

    def consume(i: int) -> None:
        for batch in splits[i].iter_batches(batch_size=16):
            got[i] += np.asarray(batch["id"]).tolist()

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(got[0]) == len(got[1]) == 100
    assert sorted(got[0] + got[1]) == list(range(200))


def test_import_shardflow_does_not_import_ray() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import sys, shardflow as sf; sf.dataset; print('ray' in sys.modules)"],
        capture_output=True, text=True, check=True,
    )
    assert out.stdout.strip() == "False"
