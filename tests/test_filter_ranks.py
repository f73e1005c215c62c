"""A filter or flat_map on several ranks: with the defaults (padding) and with
``drop_last``, every rank takes as many steps, in every epoch, shuffled or not, with
workers or not, and every kept row comes exactly once but for padding. A rank that ran
out of batches first would leave the others waiting in their next collective (the DDP
hang of HF datasets #6623 and #6437)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardflow as sf

ROWS = 103
EPOCHS = 3
ID_SCHEMA = pa.schema([("id", pa.int64())])


def keeps(i: int) -> bool:
    """Most rows of the first file, few of the rest: contiguous shares of the unfiltered
    rows would keep very different numbers."""
    return i < 45 or i % 9 == 0


def keep(row: dict) -> bool:
    return keeps(int(row["id"]))


def fans(i: int) -> list[int]:
    return [1000 * i + j for j in range(i % 3)]


def fan(row: dict) -> list[dict]:
    return [{"id": j} for j in fans(int(row["id"]))]


OPS = {
    "filter": (lambda ds: ds.filter(keep), [i for i in range(ROWS) if keeps(i)]),
    "flat_map": (lambda ds: ds.flat_map(fan, schema=ID_SCHEMA), [j for i in range(ROWS) for j in fans(i)]),
    "filtered_part": (
        lambda ds: sf.concatenate([ds.filter(keep), ds]),
        [i for i in range(ROWS) if keeps(i)] + list(range(ROWS)),
    ),
    "map_filter": (
        lambda ds: ds.map(lambda r: {"id": r["id"]}, schema=ID_SCHEMA).filter(keep),
        [i for i in range(ROWS) if keeps(i)],
    ),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = tmp_path_factory.mktemp("filter_ranks")
    for shard, (lo, hi) in enumerate([(0, 40), (40, 80), (80, ROWS)]):
        table = pa.table({"id": pa.array(range(lo, hi), pa.int64())})
        pq.write_table(table, directory / f"part-{shard}.parquet", row_group_size=16)
    return str(directory / "*.parquet")


def rank_batches(ds: sf.Dataset, rank: int, world: int, workers: int, epoch: int, **kwargs) -> tuple[list[list[int]], int]:
    """Rank ``rank``'s batches of epoch ``epoch`` (its workers' together) and the rows
    its loaders counted as padding."""
    batches, padded = [], 0
    for worker in range(workers):
        extra = dict(worker=worker, num_workers=workers) if workers > 1 else {}
        if kwargs.get("shuffle"):
            extra["seed"] = 5
        loader = sf.DataLoader(ds, rank=rank, world_size=world, **kwargs, **extra)
        loader.set_epoch(epoch)
        batches += [b["id"].tolist() for b in loader]
        padded += loader.stats()["padded_rows"]
    return batches, padded


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_every_rank_takes_as_many_steps_and_each_kept_row_comes_once(
    files: str, op: str, world: int, batch_size: int
) -> None:
    build, kept = OPS[op]
    ds = build(sf.dataset(files))
    for shuffle, drop_last, workers in [(False, False, 1), (True, False, 2), (True, True, 1), (False, True, 2)]:
        orders = []
        for epoch in range(EPOCHS):
            where = f"{op}, {world} ranks x {workers} workers, batch {batch_size}, shuffle={shuffle}, drop_last={drop_last}, epoch {epoch}"
            per_rank = [
                rank_batches(ds, r, world, workers, epoch, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last)
                for r in range(world)
            ]
            steps = [len(batches) for batches, _ in per_rank]
            assert len(set(steps)) == 1, f"{where}: batches per rank {steps}"
            got = Counter(i for batches, _ in per_rank for b in batches for i in b)
            want = Counter(kept)
            if drop_last:
                assert not got - want, f"{where}: rows twice or outside the data: {sorted((got - want).elements())}"
                missing = sum((want - got).values())
                # The remainder of the ranks' equal shares, and each rank's short last batch.
                assert missing <= (world - 1) + world * workers * (batch_size - 1), f"{where}: {missing} rows missing"
                if batch_size == 1 and workers == 1:
                    assert missing == len(kept) % world, f"{where}: {missing} rows missing"
            else:
                assert not want - got, f"{where}: kept rows never delivered: {sorted((want - got).elements())}"
                extra = got - want
                assert set(extra) <= set(kept), f"{where}: padding outside the data"
                assert sum(extra.values()) == -len(kept) % world, f"{where}: {sum(extra.values())} padded rows"
                assert sum(p for _, p in per_rank) == sum(extra.values()), f"{where}: padding counted wrong"
            orders.append([i for batches, _ in per_rank for b in batches for i in b])
        if shuffle:
            assert len({tuple(o) for o in orders}) == EPOCHS, f"{op}: the same order in two epochs"


def test_len_of_a_filtered_loader_on_ranks_is_its_batches(files: str) -> None:
    ds = sf.dataset(files).filter(keep)
    for rank in range(3):
        loader = sf.DataLoader(ds, batch_size=4, rank=rank, world_size=3, shuffle=True, seed=1)
        assert len(loader) == len(list(loader)) == -(-(-(-len(OPS["filter"][1]) // 3)) // 4)


RESUME = """
import json, sys
import shardflow as sf
sys.path.insert(0, {tests!r})
from test_filter_ranks import keep
ds = sf.dataset({files!r}).filter(keep)
loader = sf.DataLoader(ds, batch_size=4, rank={rank}, world_size=2, shuffle=True, seed=5)
loader.set_epoch(1)
loader.load_state_dict(json.loads(sys.stdin.read()))
print(json.dumps([i for b in loader for i in b["id"].tolist()]))
"""


def test_a_filtered_epoch_on_ranks_resumes_in_a_fresh_process(files: str) -> None:
    import json

    ds = sf.dataset(files).filter(keep)
    delivered, whole = Counter(), Counter()
    steps = []
    for rank in range(2):
        loader = sf.DataLoader(ds, batch_size=4, rank=rank, world_size=2, shuffle=True, seed=5)
        loader.set_epoch(1)
        whole.update(i for b in loader for i in b["id"].tolist())
        loader.set_epoch(1)
        it = iter(loader)
        first = [next(it)["id"].tolist() for _ in range(3)]
        state = loader.state_dict()
        rest = subprocess.run(
            [sys.executable, "-c", RESUME.format(tests=str(Path(__file__).parent), files=files, rank=rank)],
            input=json.dumps(state), capture_output=True, text=True, check=True,
        ).stdout
        rest_ids = json.loads(rest)
        delivered.update(i for b in first for i in b)
        delivered.update(rest_ids)
        steps.append(3 + -(-len(rest_ids) // 4))
    assert delivered == whole
    assert len(set(steps)) == 1, steps
