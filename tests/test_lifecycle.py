"""Background work is bounded, stops when the consumer leaves, and leaks no threads.

No test here asserts a wall-clock time: each waits for an event, or polls with a
deadline generous enough for a loaded machine."""

from __future__ import annotations

import os
import signal
import threading
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


# Long enough for the runtime's idle threads to time out, and for a loaded machine.
DEADLINE = 60.0


def settled_thread_count() -> int:
    """Thread count once idle I/O threads from earlier work have timed out: the count
    that holds still while it is polled for 0.7 s."""
    counts = [thread_count()]

    def steady() -> bool:
        counts.append(thread_count())
        return len(counts) > 35 and len(set(counts[-35:])) == 1

    assert wait_for(steady, timeout=DEADLINE)
    return counts[-1]


def test_break_returns_promptly_and_threads_return_to_baseline(large: str) -> None:
    # Warm up: the process-wide I/O runtime is created once and stays; that is not a leak.
    next(iter(sf.DataLoader(sf.dataset(large).take(10), batch_size=10)))
    baseline = settled_thread_count()

    loader = sf.DataLoader(sf.dataset(large), batch_size=256, shuffle=True, seed=0, num_threads=4)
    for batch in loader:
        assert len(batch["id"]) == 256
        break
    assert thread_count() > baseline  # decode threads were running
    # The first batch came from a part of the data, not after reading all 80 row groups.
    assert loader.stats()["units"] < 80, loader.stats()
    assert wait_for(lambda: thread_count() <= baseline, timeout=DEADLINE), (thread_count(), baseline)

    # The same after an exception inside the loop.
    with pytest.raises(RuntimeError):
        for _ in sf.DataLoader(sf.dataset(large), batch_size=256, num_threads=4):
            raise RuntimeError("user code failed")
    assert wait_for(lambda: thread_count() <= baseline, timeout=DEADLINE)


def test_ctrl_c_interrupts_a_waiting_consumer(large: str) -> None:
    # The user function holds its batch until the test ends, so an interrupt that gets
    # through cannot have waited for a batch. It sends the interrupt itself, so the
    # consumer is already waiting in `next()` by then.
    release = threading.Event()

    def stuck(batch: dict) -> dict:
        os.kill(os.getpid(), signal.SIGINT)
        release.wait(DEADLINE)
        return batch

    loader = sf.DataLoader(sf.dataset(large).map(stuck, batched=True, batch_size=100, batch_format="numpy"), batch_size=100)
    # Python only turns SIGINT into KeyboardInterrupt if SIGINT was not ignored when it
    # started, and a shell starting a background job ignores it: install the handler an
    # interactive session has, whatever started the tests.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            next(iter(loader))
        assert not release.is_set()
    finally:
        signal.signal(signal.SIGINT, previous)
        release.set()


def test_slow_consumer_bounds_the_work_done_ahead(large: str) -> None:
    processed = []

    def count(batch: dict) -> dict:
        processed.append(len(batch["id"]))
        return batch

    ds = sf.dataset(large).map(count, batched=True, batch_size=1000, batch_format="numpy")
    it = iter(sf.DataLoader(ds, batch_size=1000, prefetch=2))
    # At rest: one batch consumed, two buffered, one waiting to be sent. Wait until the
    # pipeline has run that far ahead, then watch it go no further than one more in the
    # user function. (A slow machine can only make the second wait pass, never fail.)
    next(it)
    assert wait_for(lambda: sum(processed) >= 4 * 1000, timeout=DEADLINE), sum(processed)
    assert not wait_for(lambda: sum(processed) > 5 * 1000, timeout=1.0), sum(processed)
    next(it)
    assert wait_for(lambda: sum(processed) >= 5 * 1000, timeout=DEADLINE), sum(processed)
    assert not wait_for(lambda: sum(processed) > 6 * 1000, timeout=1.0), sum(processed)
    del it


def test_dropping_a_dataset_iterator_stops_it(large: str) -> None:
    baseline = settled_thread_count()
    it = iter(sf.dataset(large))
    assert next(it)["id"] in range(1_600_000)
    del it
    assert wait_for(lambda: thread_count() <= baseline, timeout=DEADLINE)
