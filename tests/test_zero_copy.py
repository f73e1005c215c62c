"""Numeric columns reach numpy and pyarrow without being copied."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import shardflow as sf


def write(tmp_path: Path) -> str:
    n = 10_000
    images = np.arange(n * 12, dtype=np.float32) % 251
    table = pa.table(
        {
            "x": np.arange(n, dtype=np.int64),
            "y": np.linspace(0, 1, n, dtype=np.float32),
            "image": pa.FixedSizeListArray.from_arrays(pa.FixedSizeListArray.from_arrays(pa.array(images), 4), 3),
            "ragged": pa.array([list(range(i % 5)) for i in range(n)], pa.list_(pa.int32())),
        }
    )
    path = tmp_path / "z.parquet"
    pq.write_table(table, path, row_group_size=n)
    return str(path)


def test_numpy_columns_view_the_arrow_buffers(tmp_path: Path) -> None:
    batch = next(iter(sf.DataLoader(sf.dataset(write(tmp_path)), batch_size=1000)))
    for name in ("x", "y", "image"):
        column = batch[name]
        # The array's base is the Arrow buffer's owner and starts at its address.
        assert type(column.base).__name__ == "_ArrowBuffer", name
        assert column.base.address == column.ctypes.data, name
    assert batch["image"].shape == (1000, 3, 4)
    np.testing.assert_array_equal(batch["image"][7], (np.arange(84, 96, dtype=np.float32) % 251).reshape(3, 4))
    # Ragged lists: per-row views into one shared values buffer.
    rows = batch["ragged"]
    assert np.shares_memory(rows[3], rows[4]) is False  # disjoint slices ...
    assert rows[3].base is rows[4].base  # ... of the same array


def test_pyarrow_reads_the_same_memory_as_numpy(tmp_path: Path) -> None:
    batch = next(iter(sf.DataLoader(sf.dataset(write(tmp_path)), batch_size=1000)))
    arrow = pa.RecordBatch._import_from_c_capsule(*batch.__arrow_c_array__())
    assert arrow.num_rows == 1000
    assert batch.to_pyarrow().equals(arrow)
    for name in ("x", "y"):
        from_arrow = arrow.column(name).to_numpy(zero_copy_only=True)
        assert np.shares_memory(from_arrow, batch[name]), name
        assert from_arrow.ctypes.data == batch[name].ctypes.data
    assert arrow.column("image").type == pa.list_(pa.list_(pa.float32(), 4), 3)


def test_arrow_output_to_numpy_is_a_view(tmp_path: Path) -> None:
    batch = next(iter(sf.DataLoader(sf.dataset(write(tmp_path)), batch_size=500, output="arrow")))
    a, b = batch.to_numpy()["x"], batch.to_numpy()["x"]
    assert np.shares_memory(a, b)
    assert np.shares_memory(pa.record_batch(batch).column("x").to_numpy(), a)


def test_views_outlive_their_loader_iterator_and_gc(tmp_path: Path) -> None:
    import gc

    loader = sf.DataLoader(sf.dataset(write(tmp_path)), batch_size=100)
    it = iter(loader)
    kept = [next(it) for _ in range(100)]
    views = {name: [b[name] for b in kept] for name in ("x", "y", "image")}
    ragged = [row for b in kept for row in b["ragged"]]
    del loader, it, kept
    gc.collect()
    # Memory freed since would be handed out again now: fill it with other values.
    churn = [np.full(4096, 7, np.int64) for _ in range(2000)]
    del churn
    gc.collect()
    np.testing.assert_array_equal(np.concatenate(views["x"]), np.arange(10_000))
    np.testing.assert_array_equal(np.concatenate(views["y"]), np.linspace(0, 1, 10_000, dtype=np.float32))
    images = np.arange(10_000 * 12, dtype=np.float32) % 251
    np.testing.assert_array_equal(np.concatenate(views["image"]).reshape(-1), images)
    assert [r.tolist() for r in ragged[:12]] == [list(range(i % 5)) for i in range(12)]
    assert all(len(r) == i % 5 for i, r in enumerate(ragged))


def test_assembled_batches_keep_their_values_while_later_ones_reuse_memory(tmp_path: Path) -> None:
    """Batches assembled across row groups write their tensor columns into buffers that
    come back for later batches once released: a batch still held (a numpy view, a torch
    tensor) keeps its values, epoch after epoch, while dropped ones are written over."""
    import torch

    n = 1_000
    # 12 KiB images and 4 KiB blobs, so that batches of 100 are large enough to pool.
    images = (np.arange(n * 64 * 64 * 3, dtype=np.int64) % 251).astype(np.uint8).reshape(n, 64, 64, 3)
    blobs = [bytes([i % 256]) * 4096 for i in range(n)]
    flat = pa.array(images.reshape(-1))
    for side in (3, 64, 64):
        flat = pa.FixedSizeListArray.from_arrays(flat, side)
    table = pa.table({"x": np.arange(n, dtype=np.int64), "image": flat, "blob": pa.array(blobs, pa.large_binary())})
    path = tmp_path / "z.parquet"
    pq.write_table(table, path, row_group_size=37)
    ds = sf.dataset(str(path))
    held = []
    for shuffle, output in [(False, "numpy"), (True, "numpy"), (True, "torch")]:
        loader = sf.DataLoader(ds, batch_size=100, output=output, **({"shuffle": True, "seed": 1} if shuffle else {}))
        for epoch in range(2):
            loader.set_epoch(epoch)
            for i, batch in enumerate(loader):
                image = batch["image"].numpy() if output == "torch" else batch["image"]
                np.testing.assert_array_equal(image, images[np.asarray(batch["x"])])
                assert list(batch["blob"]) == [blobs[row] for row in np.asarray(batch["x"])]
                if i % 3 == 0:
                    held.append((batch["x"], batch["image"]))
    gc_and_churn = [np.full(100 * 64 * 64 * 3, 255, np.uint8) for _ in range(50)]
    del gc_and_churn
    assert len(held) == 3 * 2 * 4
    for x, image in held:
        if isinstance(image, torch.Tensor):
            x, image = x.numpy(), image.numpy()
        np.testing.assert_array_equal(image, images[x])


def test_zero_copy_under_the_debug_allocator(tmp_path: Path) -> None:
    """This file's tests again, in a process whose allocator checks every Python
    allocation (PYTHONMALLOC=debug): a view that freed, overran or double-freed Python
    memory makes that process fail."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONMALLOC="debug", PYTHONFAULTHANDLER="1")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider",
         "-k", "not debug_allocator", "--basetemp", str(tmp_path / "t")],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert " passed" in done.stdout


def test_polars_reads_datasets_and_loaders_without_copying(tmp_path: Path) -> None:
    import polars as pl

    path = write(tmp_path)
    frame = pl.DataFrame(sf.dataset(path, columns=["x", "y"]))
    # polars.from_arrow reads any Arrow stream as one struct Series; unnesting it
    # gives the same frame.
    assert pl.from_arrow(sf.dataset(path, columns=["x", "y"])).struct.unnest().equals(frame)
    reference = pq.read_table(path, columns=["x", "y"])
    assert frame["x"].to_list() == reference.column("x").to_pylist()
    np.testing.assert_array_equal(frame["y"].to_numpy(), reference.column("y").to_numpy())
    # A loader's batches arrive through the stream interface; polars keeps the buffers
    # it is handed, so its numpy view of a column points into shardflow's memory.
    batch = next(iter(sf.DataLoader(sf.dataset(path, columns=["x"]), batch_size=1000)))
    series = pl.DataFrame(batch)["x"]
    assert series.to_numpy().ctypes.data == batch["x"].ctypes.data
