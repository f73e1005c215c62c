"""Background work is bounded, stops when the consumer leaves, and leaks no threads."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import thread_count, wait_for

import shardflow as sf


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = tmp_path_factory.mktemp("large")
    rows = 400_000
    for shard in range(4):
        ids = np.arange(shard * rows, (shard + 1) * rows, dtype=np.int64)
        table = pa.table({"id": ids, "x": np.random.default_rng(shard).random((rows,)), "pad": ids.astype(str)})
        pq.write_table(table, directory / f"s{shard}.parquet", row_group_size=20_000)
    return str(directory / "*.parquet")


def settled_thread_count() -> int:
    """Thread count once idle I/O threads from earlier work have timed out."""
    previous = -1
    while (current := thread_count()) != previous:
        previous = current
        time.sleep(0.7)
    return current


def test_break_returns_promptly_and_threads_return_to_baseline(large: str) -> None:
    # Warm up: the process-wide I/O runtime is created once and stays; that is not a leak.
    next(iter(sf.DataLoader(sf.dataset(large).take(10), batch_size=10)))
    baseline = settled_thread_count()

    loader = sf.DataLoader(sf.dataset(large), batch_size=256, shuffle=True, seed=0, num_threads=4)
    start = time.monotonic()
    for batch in loader:
        assert len(batch["id"]) == 256
        break
    assert time.monotonic() - start < 5
    assert thread_count() > baseline  # decode threads were running
    left = time.monotonic()
    assert wait_for(lambda: thread_count() <= baseline, timeout=2.0), (thread_count(), baseline)
    assert time.monotonic() - left < 2.0

    # The same after an exception inside the loop.
    with pytest.raises(RuntimeError):
        for _ in sf.DataLoader(sf.dataset(large), batch_size=256, num_threads=4):
            raise RuntimeError("user code failed")
    assert wait_for(lambda: thread_count() <= baseline, timeout=2.0)


def test_ctrl_c_interrupts_a_waiting_consumer(large: str) -> None:
    def slow(batch: dict) -> dict:
        time.sleep(3)
        return batch

    loader = sf.DataLoader(sf.dataset(large).map(slow, batched=True, batch_size=100), batch_size=100)
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        next(iter(loader))
    assert time.monotonic() - start < 1.5


def test_slow_consumer_bounds_the_work_done_ahead(large: str) -> None:
    processed = []

    def count(batch: dict) -> dict:
        processed.append(len(batch["id"]))
        return batch

    ds = sf.dataset(large).map(count, batched=True, batch_size=1000)
    it = iter(sf.DataLoader(ds, batch_size=1000, prefetch=2))
    next(it)
    time.sleep(1.0)
    # One batch consumed, two buffered, one waiting to be sent, one in the user function.
    assert sum(processed) <= 6 * 1000, sum(processed)
    next(it)
    time.sleep(0.3)
    assert sum(processed) <= 7 * 1000
    del it


def test_dropping_a_dataset_iterator_stops_it(large: str) -> None:
    baseline = settled_thread_count()
    it = iter(sf.dataset(large))
    assert next(it)["id"] in range(1_600_000)
    del it
    assert wait_for(lambda: thread_count() <= baseline, timeout=2.0)
