"""Autotune: with the defaults a loader adapts how far it reads ahead, how many decode
tasks it queues and how many batches wait for the consumer, within `memory_limit`;
`stats()` says what it chose and where the time went. Values the user gives stay."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import Seaweed, write_id_shards
from faultproxy import FaultProxy

import shardflow as sf

OBJECTS = 240
OBJECT_BYTES = 16 * 1024


def cores() -> int:
    return len(os.sched_getaffinity(0))


@pytest.fixture(scope="module")
def small_objects(seaweed: Seaweed) -> str:
    client = seaweed.client()
    client.create_bucket(Bucket="autotune")

    def put(i: int) -> None:
        client.put_object(Bucket="autotune", Key=f"obj/{i:05d}.bin", Body=i.to_bytes(4, "little") * (OBJECT_BYTES // 4))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, range(OBJECTS)))
    return "s3://autotune/obj/"


def read_ids(loader: sf.DataLoader) -> list[int]:
    return sorted(int.from_bytes(data[:4], "little") for batch in loader for data in batch["bytes"])


def test_stats_split_the_time_and_report_the_depths(tmp_path: Path) -> None:
    pattern = write_id_shards(tmp_path, [3000] * 4)
    loader = sf.DataLoader(sf.dataset(pattern), batch_size=100)
    assert sum(len(b["id"]) for b in loader) == 12_000
    stats = loader.stats()
    assert stats["num_threads"] == cores()
    assert stats["memory_limit"] == 512 << 20
    # The consumer waits at least for the first batch (start-up, not counted as a wait
    # that deepens the queue).
    assert stats["wait_seconds"] > 0
    assert 2 + stats["consumer_waits"] >= stats["prefetch"] >= 2
    assert stats["read_ahead"] >= 2 * cores() and stats["decode_tasks"] >= cores()
    for key in ("fetch_wait_seconds", "decode_wait_seconds", "decode_seconds"):
        assert stats[key] >= 0
    assert stats["decode_seconds"] > 0

    given = sf.DataLoader(sf.dataset(pattern), batch_size=100, num_threads=1, prefetch=3)
    assert sum(len(b["id"]) for b in given) == 12_000
    stats = given.stats()
    assert (stats["num_threads"], stats["prefetch"], stats["read_ahead"], stats["decode_tasks"]) == (1, 3, 2, 2)
    with pytest.raises(ValueError, match="memory_limit"):
        sf.DataLoader(sf.dataset(pattern), memory_limit=0)


def test_the_serial_path_reports_its_cpu_and_not_its_waits(tmp_path: Path) -> None:
    # The pipeline thread's, the shuffle buffer's thread's and the consumer's CPU time
    # (what more decode threads do not shorten; benches/scaling.py projects from them): a
    # slow map makes the consumer wait most of the epoch, and waiting costs it no CPU.
    pattern = write_id_shards(tmp_path, [500] * 4)

    def slow(row: dict) -> dict:
        time.sleep(0.0005)
        return row

    loader = sf.DataLoader(sf.dataset(pattern).shuffle(seed=1, buffer_size=1000).map(slow), batch_size=50)
    start = time.perf_counter()
    assert sum(len(b["id"]) for b in loader) == 2000
    wall = time.perf_counter() - start
    stats = loader.stats()
    assert 0 < stats["pipeline_cpu_seconds"] <= wall
    assert 0 < stats["shuffle_cpu_seconds"] <= wall
    assert 0 < stats["consumer_cpu_seconds"] <= wall
    assert stats["wait_seconds"] > wall / 2
    assert stats["consumer_cpu_seconds"] < stats["wait_seconds"] / 4

    # With arrow output the consumer's clock is read at one call in 8 (the first, then
    # every 8th, each counting for the calls since): still there, and still not its waits.
    arrow = sf.DataLoader(sf.dataset(pattern).shuffle(seed=1, buffer_size=1000).map(slow), batch_size=50, output="arrow")
    start = time.perf_counter()
    assert sum(b.num_rows for b in arrow) == 2000
    wall = time.perf_counter() - start
    stats = arrow.stats()
    assert 0 < stats["consumer_cpu_seconds"] < min(wall, stats["wait_seconds"] / 4)


def test_batches_made_on_batch_threads_come_in_the_seeds_order(tmp_path: Path) -> None:
    # Re-batching across units (row groups of 64, batches of 50) and the shuffle buffer's
    # gathers and compactions run on batch threads, several batches at once: the order is
    # the seed's whatever the thread count, every row once per epoch, and the copying is
    # counted apart from the serial path.
    pattern = write_id_shards(tmp_path, [700, 300, 900, 100] * 2)

    def two_epochs(threads: int) -> tuple[list[list[int]], dict]:
        loader = sf.DataLoader(sf.dataset(pattern).shuffle(seed=3, buffer_size=1500), batch_size=50,
                               num_threads=threads)
        epochs = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            epochs.append([i for b in loader for i in b["id"].tolist()])
        return epochs, loader.stats()

    one, _ = two_epochs(1)
    three, stats = two_epochs(3)
    assert one == three
    assert [sorted(e) for e in one] == [list(range(4000))] * 2
    assert one[0] != one[1] and one[0] != sorted(one[0])
    assert stats["assemble_seconds"] > 0


def test_a_consumer_slower_than_the_pipeline_deepens_nothing(tmp_path: Path) -> None:
    pattern = write_id_shards(tmp_path, [500] * 8)
    loader = sf.DataLoader(sf.dataset(pattern), batch_size=50)
    it = iter(loader)
    next(it)
    time.sleep(0.5)  # everything is decoded and queued by now
    started = loader.stats()
    for _ in it:
        time.sleep(0.02)
    stats = loader.stats()
    # After the start-up, the consumer found a batch ready every time (but perhaps at
    # the end of the epoch, after the last batch): nothing deepened.
    assert stats["consumer_waits"] <= 1 and stats["prefetch"] <= 3
    for depth in ("read_ahead", "decode_tasks"):
        assert stats[depth] == started[depth]


def test_a_slow_store_is_read_further_ahead_within_the_memory_limit(
    small_objects: str, seaweed: Seaweed, proxy: FaultProxy
) -> None:
    proxy.set_faults(latency=0.03)
    options = seaweed.storage_options(proxy.url)
    ds = sf.dataset(small_objects, format="raw", storage_options=options)
    start = 2 * cores()

    loader = sf.DataLoader(ds, batch_size=10)
    proxy.reset_counts()
    assert read_ids(loader) == list(range(OBJECTS))
    stats = loader.stats()
    # Each object waits 30 ms at the proxy: the pipeline waited for bytes while the
    # consumer waited for batches, so it fetched further ahead than it started.
    assert stats["fetch_wait_seconds"] > 0
    assert stats["read_ahead"] > start, stats
    assert proxy.max_in_flight > start, proxy.max_in_flight
    # The next epoch starts from the depth reached.
    reached = stats["read_ahead"]
    proxy.reset_counts()
    assert read_ids(loader) == list(range(OBJECTS))
    assert loader.stats()["read_ahead"] >= reached
    assert proxy.max_in_flight > start

    # Half of the memory limit is for units read ahead: 4 objects here, however the
    # depth grows. (Counted by the loader: the proxy may still count a request whose
    # bytes the client already has, so its in-flight count can run one or more ahead.)
    limited = sf.DataLoader(ds, batch_size=10, memory_limit=8 * OBJECT_BYTES)
    assert read_ids(limited) == list(range(OBJECTS))
    stats = limited.stats()
    assert stats["read_ahead"] > start
    assert stats["read_ahead_peak_bytes"] == 4 * OBJECT_BYTES
    assert loader.stats()["read_ahead_peak_bytes"] > 4 * OBJECT_BYTES

    # A fixed num_threads fixes the depths: no growth however long the waits.
    fixed = sf.DataLoader(ds, batch_size=10, num_threads=1)
    assert read_ids(fixed) == list(range(OBJECTS))
    assert fixed.stats()["read_ahead"] == 128 and fixed.stats()["decode_tasks"] == 2
