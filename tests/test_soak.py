"""Soak under faults: several formats read at once from a real S3 server (SeaweedFS)
behind a proxy that adds 20 ms to every request and answers 5% with 503 SlowDown, resets
1% mid-body and cuts 1% short. Epoch after epoch every row comes exactly once, and the
memory, open files and threads of the loaders' process (one of their own) stay flat. Also: a sleeping consumer holds
the pipeline back, `break` and Ctrl-C stop work that is mid-request within a second, and
a server that stops answering is a clear timeout error, not a hang.

The soak runs SHARDFLOW_SOAK_SECONDS (default 60); `bash scripts/soak.sh` runs it for
30 minutes."""

from __future__ import annotations

import gzip
import io
import json
import os
import signal
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import webdataset as wds
from conftest import Seaweed, wait_for
from faultproxy import FaultProxy

import shardflow as sf

SOAK_SECONDS = float(os.environ.get("SHARDFLOW_SOAK_SECONDS", "60"))
ROWS = 3_000  # per format


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def threads_named(prefix: str) -> int:
    count = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                count += f.read().startswith(prefix)
        except (FileNotFoundError, ProcessLookupError):
            # The thread exited after listdir: before open (ENOENT) or between open and read (ESRCH).
            pass
    return count


@pytest.fixture(scope="module")
def soak_bucket(seaweed: Seaweed) -> str:
    """The same ids 0..ROWS in four formats, several shards each, under s3://soak/<fmt>/."""
    client = seaweed.client()
    client.create_bucket(Bucket="soak")
    rng = np.random.default_rng(3)
    ids = np.arange(ROWS)
    text = [f"row {i} " + "x" * int(rng.integers(0, 200)) for i in ids]

    def put(key: str, body: bytes) -> None:
        client.put_object(Bucket="soak", Key=key, Body=body)

    for shard, part in enumerate(np.array_split(ids, 3)):
        sink = io.BytesIO()
        pq.write_table(pa.table({"id": part, "text": [text[i] for i in part]}), sink, row_group_size=250)
        put(f"parquet/{shard}.parquet", sink.getvalue())
        lines = "".join(json.dumps({"id": int(i), "text": text[i]}) + "\n" for i in part).encode()
        put(f"jsonl/{shard}.jsonl.gz" if shard % 2 else f"jsonl/{shard}.jsonl", gzip.compress(lines) if shard % 2 else lines)
        sink = io.BytesIO()
        pacsv.write_csv(pa.table({"id": part, "text": [text[i] for i in part]}), sink)
        put(f"csv/{shard}.csv", sink.getvalue())
        sink = io.BytesIO()
        with wds.TarWriter(sink) as w:
            for i in part:
                w.write({"__key__": f"{i:06d}", "cls": int(i), "txt": text[i]})
        put(f"tar/{shard}.tar", sink.getvalue())
    return "soak"


# The soak's loaders, in a process of their own: the test's process also runs the fault
# proxy (15,000 requests a minute through Python threads) and holds what earlier tests
# left (Ray's threads, imported libraries), and its RSS once grew 93 MiB over a run that
# the loaders alone kept within 4-35 MiB.
SOAK = """
import json, sys, threading
import shardflow as sf
options, rows, seconds = json.loads(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
formats = {"parquet": {}, "jsonl": {}, "csv": {}, "tar": {"format": "webdataset"}}
errors, epochs = [], dict.fromkeys(formats, 0)
stop = threading.Event()

def soak(fmt):
    try:
        ds = sf.dataset(f"s3://soak/{fmt}/", storage_options=options, **formats[fmt])
        # A streaming shuffle for the stream formats, a full one for Parquet.
        ds = ds.shuffle(seed=5) if fmt == "parquet" else ds.shuffle(seed=5, buffer_size=500)
        loader = sf.DataLoader(ds, batch_size=128, num_threads=2)
        previous = None
        while not stop.is_set():
            seen = [int(i) for batch in loader for i in batch["cls" if fmt == "tar" else "id"]]
            assert sorted(seen) == list(range(rows)), f"{fmt}: epoch {epochs[fmt]} not exactly once"
            assert seen != previous, f"{fmt}: the order did not change between epochs"
            previous = seen
            epochs[fmt] += 1
    except BaseException as e:  # reported by the parent
        errors.append(repr(e))
        stop.set()

workers = [threading.Thread(target=soak, args=(fmt,), daemon=True) for fmt in formats]
for w in workers:
    w.start()
print("started", flush=True)
stop.wait(seconds)
stop.set()
for w in workers:
    w.join(timeout=120)
print(json.dumps({"epochs": epochs, "errors": errors, "alive": sum(w.is_alive() for w in workers)}))
"""


def test_soak_epochs_exactly_once_with_flat_resources(soak_bucket: str, seaweed: Seaweed, proxy: FaultProxy,
                                                    tmp_path: Path) -> None:
    import subprocess
    import sys

    proxy.set_faults(latency=0.02, slow_down=0.05, reset=0.01, truncate=0.01, seed=11)
    options = seaweed.storage_options(proxy.url, retry_base_seconds=0.01, retry_max_seconds=0.2, max_attempts=8)
    # Its stderr goes to a file: a pipe nobody reads while sampling could fill and stall it.
    log = open(tmp_path / "soak.log", "w+")  # noqa: SIM115 (closed below)
    child = subprocess.Popen([sys.executable, "-c", SOAK, json.dumps(options), str(ROWS), str(SOAK_SECONDS)],
                             stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "started", log.read()
        samples: list[tuple[int, int, int]] = []
        deadline = time.monotonic() + SOAK_SECONDS
        while time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.5)
            samples.append((rss_bytes(child.pid), open_fds(child.pid), threads_of(child.pid)))
        out, _ = child.communicate(timeout=180)
    finally:
        child.kill()
        log.seek(0)
        err = log.read()
        log.close()
    assert child.returncode == 0, err[-3000:]
    result = json.loads(out.splitlines()[-1])
    epochs = result["epochs"]
    assert not result["errors"], result["errors"][0]
    assert result["alive"] == 0
    assert min(epochs.values()) >= 3, epochs
    # Flat: the last quarter of the run against the second (the first is warm-up: the
    # runtime, the connection pools, the allocator's first pages).
    quarter = max(len(samples) // 4, 1)
    early, late = samples[quarter : 2 * quarter], samples[-quarter:]
    rss_early = statistics.median(s[0] for s in early)
    rss_late = statistics.median(s[0] for s in late)
    # The whole series (MiB, every half second) on failure: a jump and a ramp have
    # different causes.
    series = [s[0] >> 20 for s in samples]
    assert rss_late - rss_early < 64 << 20, f"RSS {rss_early >> 20} -> {rss_late >> 20} MiB; {epochs}; MiB: {series}"
    assert max(s[1] for s in late) <= max(s[1] for s in early) + 16, (early, late)
    assert max(s[2] for s in late) <= max(s[2] for s in early) + 4, (early, late)
    stats_retries = proxy.counts.total()
    print(f"soak: {SOAK_SECONDS:.0f}s, epochs {epochs}, requests {stats_retries}, "
          f"RSS {rss_early / 2**20:.0f} -> {rss_late / 2**20:.0f} MiB")


@pytest.fixture(scope="module")
def many_small(seaweed: Seaweed) -> int:
    client = seaweed.client()
    client.create_bucket(Bucket="soak-small")
    for i in range(400):
        client.put_object(Bucket="soak-small", Key=f"o/{i:04d}.bin", Body=i.to_bytes(4, "little") * 2048)
    return 400


def test_a_sleeping_consumer_holds_the_pipeline_back(many_small: int, seaweed: Seaweed, proxy: FaultProxy) -> None:
    options = seaweed.storage_options(proxy.url)
    ds = sf.dataset("s3://soak-small/o/", format="raw", storage_options=options)
    proxy.reset_counts()
    it = iter(sf.DataLoader(ds, batch_size=4, prefetch=2, num_threads=1))
    next(it)
    # Read-ahead is bounded (prefetched batches plus the units open for fetching), far
    # short of the 400 objects, and it stops growing while the consumer sleeps.
    counts: list[int] = []

    def settled() -> bool:  # no new request for a second
        counts.append(proxy.gets("/soak-small/o/"))
        time.sleep(0.25)
        return len(counts) > 4 and len(set(counts[-5:])) == 1

    assert wait_for(settled, timeout=60), counts
    ahead = counts[-1]
    time.sleep(1.5)
    assert proxy.gets("/soak-small/o/") == ahead
    assert 8 < ahead < 200, ahead
    seen = 4 + sum(len(b["bytes"]) for b in it)
    assert seen == many_small


def run_until_stopped(ds: sf.Dataset, stop: str) -> float:
    """Reads `ds` while the proxy holds every request for 3 s, and stops the consumer
    while requests are in flight: by leaving the loop after the first batch ("break"),
    or by Ctrl-C while it waits for that batch ("sigint"). Returns the seconds from the
    stop until the pipeline and decode threads are gone."""
    it = iter(sf.DataLoader(ds, batch_size=4, num_threads=2))
    if stop == "break":
        next(it)  # the fetches for the next batches are under way, held by the proxy
        started = time.monotonic()
        del it
    else:
        sent: list[float] = []

        def interrupt() -> None:
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)

        threading.Timer(0.5, interrupt).start()
        # Python only raises KeyboardInterrupt if SIGINT has its default handler.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            with pytest.raises(KeyboardInterrupt):
                next(it)
            started = sent[0]
            del it
        finally:
            signal.signal(signal.SIGINT, previous)
    assert wait_for(lambda: threads_named("shardflow-pipe") + threads_named("shardflow-deco") == 0, timeout=10)
    return time.monotonic() - started


@pytest.mark.parametrize("stop", ["break", "sigint"])
def test_stopping_mid_request_ends_background_work_within_a_second(
    many_small: int, seaweed: Seaweed, proxy: FaultProxy, stop: str
) -> None:
    proxy.set_faults(latency=3.0)
    options = seaweed.storage_options(proxy.url)
    ds = sf.dataset("s3://soak-small/o/", format="raw", storage_options=options)
    assert run_until_stopped(ds, stop) < 1.0


def test_a_silent_server_is_a_timeout_error_not_a_hang(many_small: int, seaweed: Seaweed, proxy: FaultProxy) -> None:
    options = seaweed.storage_options(
        proxy.url, timeout_seconds=1, max_attempts=2, retry_base_seconds=0.01, retry_max_seconds=0.05
    )
    ds = sf.dataset("s3://soak-small/o/000*.bin", format="raw", storage_options=options)  # listed before the blackhole
    proxy.set_faults(blackhole=1.0)
    started = time.monotonic()
    with pytest.raises(sf.ReadError) as info:
        list(sf.DataLoader(ds, batch_size=10))
    elapsed = time.monotonic() - started
    # Two attempts of at most a second each, plus backoff: bounded, and said plainly.
    assert elapsed < 10, elapsed
    message = str(info.value)
    assert "s3://soak-small/o/000" in message and "after 2 attempts" in message, message
    assert "no response within 1s" in message, message
