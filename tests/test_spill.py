"""The full shuffle's plans (issue 53): rows read where they lie, units kept in memory,
units read ahead, and the external two-pass shuffle that spills to local disk. Whichever
the data and budget choose, the rows and their order are those `(seed, epoch)` defines:
each plan is held to the same order on 2 ranks x 2 workers, over epochs, through a resume
in a fresh process and forked torch workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import wait_for

import shardflow as sf

ROWS = 1200
ROW_BYTES = 4000
SMALL = 2 << 20  # a memory_limit a quarter of the data (1.2 of 4.8 MB) outgrows


def blob(i: int) -> bytes:
    return np.random.default_rng(i).integers(0, 256, ROW_BYTES, dtype=np.uint8).tobytes()


def write(root: Path, row_group_size: int = 50, **options: object) -> str:
    """The same rows in 3 files, as pyarrow writes them with `options`."""
    root.mkdir(parents=True, exist_ok=True)
    per_file = ROWS // 3
    for f in range(3):
        ids = list(range(f * per_file, (f + 1) * per_file))
        table = pa.table({"id": pa.array(ids, pa.int64()), "blob": [blob(i) for i in ids]})
        pq.write_table(table, root / f"part-{f}.parquet", row_group_size=row_group_size, **options)
    return str(root / "*.parquet")


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("plans")
    return {
        # pyarrow's dictionary page, uncompressed and over 1 MiB: each value is read where
        # it lies.
        "plain": write(root / "plain", row_group_size=400, compression="none"),
        "snappy": write(root / "snappy"),  # pyarrow's defaults
        "zstd": write(root / "zstd", compression="zstd"),
        # As HF `datasets` writes it: an offset index, plain pages (here of 12 rows). A row
        # read alone fetches its page, 12 times its bytes: reading each part's quarter of
        # the rows where they lie would read the files 3 times over.
        "paged": write(root / "paged", compression="none", use_dictionary=False, write_page_index=True,
                       data_page_size=12 * ROW_BYTES, write_batch_size=4),
        # The same with a page per row: a row read alone fetches its own bytes.
        "row pages": write(root / "row-pages", compression="none", use_dictionary=False, write_page_index=True,
                           data_page_size=1, write_batch_size=1),
    }


# Each plan: the layout it reads and the loader options that choose it.
PLANS = {
    "in_place": ("plain", {"memory_limit": SMALL}),
    "in_memory": ("snappy", {"memory_limit": 1 << 30}),
    "read_ahead": ("snappy", {"memory_limit": 1 << 20, "spill_bytes": 0}),
    # Spilling off, and the data not far past the limit: gathers through the unit cache.
    "gather": ("snappy", {"memory_limit": SMALL, "spill_bytes": 0}),
    "spill": ("snappy", {"memory_limit": SMALL}),
    "spill (zstd)": ("zstd", {"memory_limit": SMALL}),
    "spill (pages of 12 rows)": ("paged", {"memory_limit": SMALL}),
    "in_place (a page per row)": ("row pages", {"memory_limit": SMALL}),
    # The units kept decoded (`decoded_cache=`, written by an earlier read): rows taken
    # from the mapped copies, nothing read from the Parquet files.
    "in_place (decoded_cache)": ("snappy", {"memory_limit": SMALL, "decoded_cache": True}),
}


def part(source: str, rank: int, worker: int, epoch: int, decoded_cache: str | None = None, batch_size: int = 16,
         **options: object) -> sf.DataLoader:
    loader = sf.DataLoader(
        sf.dataset(source, decoded_cache=decoded_cache).shuffle(seed=7), batch_size=batch_size, rank=rank, world_size=2,
        worker=worker, num_workers=2, **options,
    )
    loader.set_epoch(epoch)
    return loader


def read(loader: sf.DataLoader) -> list[int]:
    ids = []
    for batch in loader:
        for i, b in zip(batch["id"].tolist(), batch["blob"]):
            assert bytes(b) == blob(i), i
            ids.append(i)
    return ids


def test_every_plan_gives_the_same_order_on_2_ranks_x_2_workers_over_epochs(
        layouts: dict[str, str], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    # The reference: the dataset's own permutation, read whole, dealt to the parts.
    orders: dict[str, list[list[int]]] = {}
    for plan, (layout, options) in PLANS.items():
        orders[plan] = []
        if options.get("decoded_cache"):
            decoded = str(tmp_path_factory.mktemp("decoded"))
            options = {**options, "decoded_cache": decoded}
            # Written by a read in order; the shuffles after it map what it kept.
            assert sorted(r["id"] for r in sf.dataset(layouts[layout], decoded_cache=decoded)) == list(range(ROWS))
        for epoch in range(2):
            for rank in range(2):
                for worker in range(2):
                    loader = part(layouts[layout], rank, worker, epoch, spill_dir=str(tmp_path), **options)
                    orders[plan].append(read(loader))
                    assert loader.stats()["read_plan"] == plan.split()[0], (plan, loader.stats()["read_plan"])
                    if plan.startswith("spill"):
                        assert loader.stats()["spilled_bytes"] >= ROWS // 4 * ROW_BYTES
                    if "decoded_cache" in options:
                        assert loader.stats()["bytes_read"] == 0
    reference = orders.pop("in_place")
    for plan, order in orders.items():
        assert order == reference, plan
    for epoch in range(2):
        parts = reference[4 * epoch : 4 * epoch + 4]
        seen = [i for p in parts for i in p]
        assert sorted(seen) == list(range(ROWS)), epoch  # every row once: 1200 divides evenly
    assert reference[:4] != reference[4:]
    # The whole epoch in one part is the dataset's permutation.
    whole = sf.DataLoader(sf.dataset(layouts["snappy"]).shuffle(seed=7), batch_size=64, memory_limit=SMALL, spill_dir=str(tmp_path))
    permutation = [r["id"] for r in sf.dataset(layouts["plain"], columns=["id"]).shuffle(seed=7)]
    assert [i for b in whole for i in b["id"].tolist()] == permutation
    assert whole.stats()["read_plan"] == "spill"
    # Batches just over a gather's bytes (200 rows of 4 KB against 512 KiB) are a gather
    # each, not joined from two.
    wide = sf.DataLoader(sf.dataset(layouts["snappy"]).shuffle(seed=7), batch_size=200, memory_limit=SMALL, spill_dir=str(tmp_path))
    batches = [b["id"].tolist() for b in wide]
    assert [len(b) for b in batches] == [200] * (ROWS // 200)
    assert [i for b in batches for i in b] == permutation
    assert wide.stats()["read_plan"] == "spill"
    assert list(tmp_path.iterdir()) == []  # the bucket files never had names


def test_pages_of_several_rows_spill_where_reading_in_place_would_read_the_files_over(tmp_path: Path) -> None:
    """Pages of 4 rows with an offset index: a reader's full shuffle would fetch each row's
    page, the files 4 times over, so it spills (each byte read once); a select of a tenth
    of the rows reads their pages where they lie, a fraction of the files."""
    source = write(tmp_path / "paged", compression="none", use_dictionary=False, write_page_index=True,
                   data_page_size=4 * ROW_BYTES, write_batch_size=4)
    stored = sum(p.stat().st_size for p in (tmp_path / "paged").glob("*.parquet"))
    permutation = [r["id"] for r in sf.dataset(source, columns=["id"]).shuffle(seed=3)]
    full = sf.DataLoader(sf.dataset(source).shuffle(seed=3), batch_size=32, memory_limit=SMALL,
                         spill_dir=str(tmp_path / "spill"))
    assert read(full) == permutation
    assert full.stats()["read_plan"] == "spill"
    assert full.stats()["bytes_read"] < 1.3 * stored
    wanted = permutation[: ROWS // 10]
    sparse = sf.DataLoader(sf.dataset(source).select(wanted), batch_size=32, memory_limit=SMALL,
                           spill_dir=str(tmp_path / "spill"))
    assert read(sparse) == wanted
    assert sparse.stats()["read_plan"] != "spill"
    assert sparse.stats()["bytes_read"] < 0.6 * stored


def test_batches_of_one_gather_each_keep_every_parts_order(layouts: dict[str, str], tmp_path: Path) -> None:
    """Batches just over a gather's bytes (200 rows of 4 KB against 512 KiB) are one gather
    each under the spill: on 2 ranks x 2 workers over 2 epochs, each part's rows are the
    ones the values-in-place plan gives it, in the same order and batches."""
    for epoch in range(2):
        for rank in range(2):
            for worker in range(2):
                spilled = part(layouts["snappy"], rank, worker, epoch, batch_size=200, memory_limit=SMALL, spill_dir=str(tmp_path))
                in_place = part(layouts["plain"], rank, worker, epoch, batch_size=200, memory_limit=SMALL)
                got = [b["id"].tolist() for b in spilled]
                assert spilled.stats()["read_plan"] == "spill"
                assert got == [b["id"].tolist() for b in in_place], (epoch, rank, worker)
                assert [len(b) for b in got] == [200, 100]
    assert list(tmp_path.iterdir()) == []


def test_a_spill_reads_each_unit_once(layouts: dict[str, str], tmp_path: Path) -> None:
    stored = sum(p.stat().st_size for p in Path(layouts["snappy"]).parent.glob("*.parquet"))
    loader = sf.DataLoader(sf.dataset(layouts["snappy"]).shuffle(seed=1), batch_size=32, memory_limit=SMALL, spill_dir=str(tmp_path))
    assert sorted(read(loader)) == list(range(ROWS))
    stats = loader.stats()
    assert stats["read_plan"] == "spill"
    # Read once (the footers besides), where reading ahead reads it many times.
    assert stats["bytes_read"] < 1.2 * stored, stats["bytes_read"] / stored
    ahead = sf.DataLoader(sf.dataset(layouts["snappy"]).shuffle(seed=1), batch_size=32, memory_limit=SMALL, spill_bytes=0)
    assert sorted(read(ahead)) == list(range(ROWS))
    assert ahead.stats()["bytes_read"] > 2 * stored


WIDE = 96 << 10


def wide_blob(i: int) -> bytes:
    return np.random.default_rng(i).bytes(WIDE)


def test_wide_rows_in_row_groups_larger_than_the_budget_keep_the_order(tmp_path: Path) -> None:
    """Rows of 96 KiB, each written to its bucket where it was decoded, from files of one
    row group each, every one larger than the whole memory budget (read page by page, never
    held whole): the order `(seed, epoch)` defines on 2 ranks x 2 workers over 2 epochs,
    each file read once."""
    root = tmp_path / "wide"
    root.mkdir()
    rows, per_file = 240, 80
    for f in range(rows // per_file):
        ids = list(range(f * per_file, (f + 1) * per_file))
        table = pa.table({"id": pa.array(ids, pa.int64()), "blob": [wide_blob(i) for i in ids]})
        pq.write_table(table, root / f"part-{f}.parquet", row_group_size=per_file)
    source = str(root / "*.parquet")
    stored = sum(p.stat().st_size for p in root.glob("*.parquet"))
    assert stored / 3 > SMALL
    for epoch in range(2):
        seen = []
        for rank in range(2):
            for worker in range(2):
                spilled = part(source, rank, worker, epoch, memory_limit=SMALL, spill_dir=str(tmp_path / "spill"))
                got = [(i, bytes(b)) for batch in spilled for i, b in zip(batch["id"].tolist(), batch["blob"])]
                assert spilled.stats()["read_plan"] == "spill"
                assert spilled.stats()["bytes_read"] < 1.2 * stored
                assert all(b == wide_blob(i) for i, b in got)
                kept = part(source, rank, worker, epoch, memory_limit=1 << 30)
                assert [i for i, _ in got] == [i for b in kept for i in b["id"].tolist()], (epoch, rank, worker)
                assert kept.stats()["read_plan"] == "in_memory"
                seen += [i for i, _ in got]
        assert sorted(seen) == list(range(rows))
    assert list((tmp_path / "spill").iterdir()) == []


def test_a_spill_without_room_falls_back_to_reading_ahead_with_a_warning(layouts: dict[str, str], tmp_path: Path) -> None:
    reference = read(part(layouts["plain"], 1, 0, 0))
    loader = part(layouts["snappy"], 1, 0, 0, memory_limit=1 << 20, spill_dir=str(tmp_path), spill_bytes=100_000)
    with pytest.warns(UserWarning, match="could not spill .*spill_bytes"):
        assert read(loader) == reference
    assert loader.stats()["read_plan"] == "read_ahead"
    # Pages of a few rows: the first batches were read from their pages before the spill
    # gave up; the rows after them are read by gathers, none twice or lost.
    paged = part(layouts["paged"], 1, 0, 0, memory_limit=1 << 20, spill_dir=str(tmp_path), spill_bytes=100_000)
    with pytest.warns(UserWarning, match="could not spill .*spill_bytes"):
        assert read(paged) == reference
    # A directory that cannot be made: the same.
    blocked = tmp_path / "file"
    blocked.write_bytes(b"")
    loader = part(layouts["snappy"], 1, 0, 0, memory_limit=1 << 20, spill_dir=str(blocked / "spill"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert read(loader) == reference
    assert loader.stats()["read_plan"] == "read_ahead"


RESUME = """
import json, sys
import shardflow as sf
source, rank, worker, spill_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
loader = sf.DataLoader(sf.dataset(source).shuffle(seed=7), batch_size=16, rank=rank, world_size=2,
                       worker=worker, num_workers=2, memory_limit=2 << 20, spill_dir=spill_dir)
loader.set_epoch(1)
loader.load_state_dict(json.loads(sys.stdin.read()))
ids = [i for b in loader for i in b["id"].tolist()]
print(json.dumps([ids, loader.stats()["read_plan"], loader.stats()["spilled_bytes"]]))
"""


def test_a_resume_mid_epoch_in_a_fresh_process_spills_only_the_rest(layouts: dict[str, str], tmp_path: Path) -> None:
    for rank in range(2):
        for worker in range(2):
            reader = part(layouts["snappy"], rank, worker, 1, memory_limit=SMALL, spill_dir=str(tmp_path))
            whole = read(reader)
            loader = part(layouts["snappy"], rank, worker, 1, memory_limit=SMALL, spill_dir=str(tmp_path))
            it = iter(loader)
            first = [i for _ in range(5) for i in next(it)["id"].tolist()]
            state = loader.state_dict()
            out = subprocess.run(
                [sys.executable, "-c", RESUME, layouts["snappy"], str(rank), str(worker), str(tmp_path)],
                input=json.dumps(state), capture_output=True, text=True, check=True, timeout=300,
            ).stdout
            rest, plan, spilled = json.loads(out)
            assert plan == "spill"
            assert first + rest == whole, (rank, worker)
            # The rows delivered before the state are not spilled again.
            assert spilled <= 1.1 * reader.stats()["spilled_bytes"] * len(rest) / len(whole), (spilled, len(rest))


EARLY = """
import json, sys
import shardflow as sf
rank, worker, spill_dir, options = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
taken = int(sys.argv[5]) if len(sys.argv) > 5 else None
loader = sf.DataLoader(sf.dataset("s3://early/*.parquet", storage_options=options).shuffle(seed=7), batch_size=16,
                       rank=rank, world_size=2, worker=worker, num_workers=2, memory_limit=2 << 20, num_threads=2,
                       spill_dir=spill_dir)
loader.set_epoch(1)
state = sys.stdin.read()
if state:
    loader.load_state_dict(json.loads(state))
ids, spilled_at_first = [], None
for batch in loader:
    ids.append(batch["id"].tolist())
    if spilled_at_first is None:
        spilled_at_first = loader.stats()["spilled_bytes"]
    if len(ids) == taken:
        break
stats = loader.stats()
state = loader.state_dict() if taken else None
print(json.dumps([ids, stats["read_plan"], spilled_at_first, stats["spilled_bytes"], state]))
"""


def test_a_spills_first_batches_are_read_from_their_pages_while_its_first_pass_runs(
        layouts: dict[str, str], seaweed: object, proxy: object, tmp_path: Path) -> None:
    """Files as HF `datasets` writes them (an offset index, pages of a few rows) on S3,
    every answer 0.1 s late: the spill's first pass over 24 row groups on 2 threads takes
    1.2 s at least, and the first batches are read from their pages meanwhile (side by
    side), then dropped from what the spill delivers: the first batch comes while the
    spill has written a part of the rows. On 2 ranks x 2 workers, with a resume mid-epoch
    in a fresh process (which reads its first batches so again), every part gets the rows
    of the local files' plan in its order."""
    client = seaweed.client()
    client.create_bucket(Bucket="early")
    for path in sorted(Path(layouts["paged"]).parent.glob("*.parquet")):
        client.upload_file(str(path), "early", path.name)
    proxy.set_faults(latency=0.1)
    options = json.dumps(seaweed.storage_options(proxy.url))

    def run(rank: int, worker: int, state: dict | None = None, taken: int | None = None) -> list:
        args = [sys.executable, "-c", EARLY, str(rank), str(worker), str(tmp_path), options]
        out = subprocess.run(args + ([str(taken)] if taken else []), input=json.dumps(state) if state else "",
                             capture_output=True, text=True, check=True, timeout=300).stdout
        return json.loads(out)

    parts = [(rank, worker) for rank in range(2) for worker in range(2)]
    with ThreadPoolExecutor(len(parts)) as pool:
        runs = list(pool.map(lambda p: run(*p), parts))
        heads = list(pool.map(lambda p: run(*p, taken=4), parts[1:3]))
        rests = list(pool.map(lambda a: run(*a[0], state=a[1][4]), zip(parts[1:3], heads)))
    seen = []
    for (rank, worker), (batches, plan, spilled_at_first, spilled, _) in zip(parts, runs):
        local = part(layouts["row pages"], rank, worker, 1, memory_limit=SMALL)
        assert batches == [b["id"].tolist() for b in local], (rank, worker)
        assert plan == "spill"
        assert spilled_at_first < spilled, (spilled_at_first, spilled)
        seen += [i for b in batches for i in b]
    assert sorted(seen) == list(range(ROWS))
    for (rank, worker), head, rest in zip(parts[1:3], heads, rests):
        whole = runs[parts.index((rank, worker))][0]
        assert head[0] + rest[0] == whole, (rank, worker)
        assert rest[1] == "spill" and rest[2] < rest[3], rest[1:4]
    assert list(tmp_path.iterdir()) == []


TORCH = """
import json, sys
import torch
import shardflow as sf
from shardflow.torch import IterableDataset
source, rank, spill_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
adapter = IterableDataset(sf.dataset(source).shuffle(seed=7), batch_size=16, rank=rank, world_size=2,
                          memory_limit=2 << 20, spill_dir=spill_dir)
loader = torch.utils.data.DataLoader(adapter, batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=120)
epochs = []
for epoch in range(2):
    adapter.set_epoch(epoch)
    epochs.append([i for b in loader for i in b["id"].tolist()])
print(json.dumps(epochs))
"""


def test_forked_torch_workers_spill_each_their_own_share(layouts: dict[str, str], tmp_path: Path) -> None:
    """2 ranks x 2 forked torch workers, 2 epochs, each worker spilling its share: torch
    takes the workers' batches in turn, each worker's as the in-place plan gives them."""
    pytest.importorskip("torch")
    for rank in range(2):
        out = subprocess.run(
            [sys.executable, "-c", TORCH, layouts["snappy"], str(rank), str(tmp_path)],
            capture_output=True, text=True, check=True, timeout=300,
        ).stdout
        for epoch, got in enumerate(json.loads(out)):
            workers = []
            for worker in range(2):
                loader = sf.DataLoader(sf.dataset(layouts["plain"]).shuffle(seed=7), batch_size=16, rank=rank,
                                       world_size=2, worker=worker, num_workers=2)
                loader.set_epoch(epoch)
                workers.append([b["id"].tolist() for b in loader])
            in_turn = [i for pair in zip(*workers, strict=True) for batch in pair for i in batch]
            assert got == in_turn, (rank, epoch)
    assert list(tmp_path.iterdir()) == []


KILLED = """
import sys, time
import shardflow as sf
loader = sf.DataLoader(sf.dataset(sys.argv[1]).shuffle(seed=3), batch_size=8, memory_limit=2 << 20, spill_dir=sys.argv[2])
for batch in loader:
    print(loader.stats()["spilled_bytes"], flush=True)
    time.sleep(60)
"""


def _open_files(pid: int) -> list[str]:
    """What process `pid`'s descriptors name. The loader reads on while the test looks: a
    descriptor it closes between the listing and the look is passed over."""
    names = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            names.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            pass
    return names


def test_kill_9_during_a_spill_leaves_nothing_behind(layouts: dict[str, str], tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    with subprocess.Popen([sys.executable, "-c", KILLED, layouts["snappy"], str(spill)], stdout=subprocess.PIPE, text=True) as child:
        try:
            line = child.stdout.readline() if child.stdout else ""
            assert int(line) > 0  # a batch is out: every row was spilled first
            # The spill's files are open in the child, and have no name in the directory.
            open_files = _open_files(child.pid)
            assert any(str(spill) in f for f in open_files), open_files
            assert list(spill.iterdir()) == []
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
    assert list(spill.iterdir()) == []
    # A later run in the same directory reads the whole epoch.
    loader = sf.DataLoader(sf.dataset(layouts["snappy"]).shuffle(seed=3), batch_size=8, memory_limit=SMALL, spill_dir=str(spill))
    assert sorted(read(loader)) == list(range(ROWS))


def test_break_stops_the_spill_and_frees_its_files(layouts: dict[str, str], tmp_path: Path) -> None:
    loader = sf.DataLoader(sf.dataset(layouts["snappy"]).shuffle(seed=3), batch_size=8, memory_limit=SMALL, spill_dir=str(tmp_path))
    it = iter(loader)
    next(it)
    own = f"/proc/{os.getpid()}/fd"

    def spill_files() -> list[str]:
        found = []
        for fd in os.listdir(own):
            try:
                target = os.readlink(f"{own}/{fd}")
            except OSError:
                continue
            if target.startswith(str(tmp_path)):
                found.append(target)
        return found

    assert spill_files()  # the buckets still to serve are open (and nameless)
    del it
    wait_for(lambda: not spill_files(), timeout=30)


def test_a_corrupt_unit_during_the_spill_names_its_file(tmp_path: Path) -> None:
    source = write(tmp_path / "data")
    victim = tmp_path / "data" / "part-1.parquet"
    raw = bytearray(victim.read_bytes())
    # Garble a quarter of the file, page headers among it, not the footer (a value's
    # bytes alone could change unseen: Parquet pages carry no checksum by default).
    raw[len(raw) // 4 : len(raw) // 2] = np.random.default_rng(0).bytes(len(raw) // 2 - len(raw) // 4)
    victim.write_bytes(bytes(raw))
    loader = sf.DataLoader(sf.dataset(source).shuffle(seed=3), batch_size=8, memory_limit=SMALL, spill_dir=str(tmp_path / "spill"))
    with pytest.raises(sf.ShardflowError, match="part-1.parquet"):
        for _ in loader:
            pass


def test_a_corrupt_first_unit_stops_the_readers_it_started(tmp_path: Path) -> None:
    """The first unit's first piece starts the other reading threads while the spill's own
    thread reads on; a corruption further into that unit fails the epoch with its file
    named, the other threads stopped, and a later epoch over sound files is whole."""
    rows, width = 3200, 16 << 10  # one row group of 50 MiB a file: its first piece at 8 MiB
    files = 4
    root = tmp_path / "data"
    root.mkdir()
    rng = np.random.default_rng(0)
    for f in range(files):
        values = rng.integers(0, 256, (rows, width), dtype=np.uint8)
        table = pa.table({"id": pa.array(range(f * rows, (f + 1) * rows), pa.int64()),
                          "blob": pa.array([v.tobytes() for v in values], pa.binary())})
        pq.write_table(table, root / f"part-{f}.parquet", row_group_size=rows)
    victim = root / "part-0.parquet"
    sound = victim.read_bytes()
    raw = bytearray(sound)
    raw[len(raw) * 6 // 10 : len(raw) * 7 // 10] = rng.bytes(len(raw) * 7 // 10 - len(raw) * 6 // 10)
    victim.write_bytes(bytes(raw))
    # The 200 MiB outgrow the limit, and half of it is room for two streamed units' reads
    # (what each took by its first piece, and two pieces): two threads read.
    options = {"batch_size": 64, "memory_limit": 160 << 20, "spill_dir": str(tmp_path / "spill")}
    loader = sf.DataLoader(sf.dataset(str(root / "*.parquet")).shuffle(seed=1), **options)
    with pytest.raises(sf.ShardflowError, match="part-0.parquet"):
        for _ in loader:
            pass
    assert loader.stats()["read_plan"] == "spill"
    assert list((tmp_path / "spill").iterdir()) == []
    victim.write_bytes(sound)
    loader = sf.DataLoader(sf.dataset(str(root / "*.parquet")).shuffle(seed=1), **options)
    ids = [i for batch in loader for i in batch["id"].tolist()]
    assert sorted(ids) == list(range(files * rows))
