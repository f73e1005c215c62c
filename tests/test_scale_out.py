"""Scale-out: every rank gets the same number of batches for every format (drop_last or
padding), and an epoch saved on one world size resumes exactly once on another (elastic
resume), in a fresh process."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardflow as sf
from test_random_access import ident, open_format, write_shards

FORMATS = ["parquet", "arrow", "jsonl", "jsonl.gz", "csv", "tfrecord", "webdataset", "webdataset.gz", "npy", "npz", "raw"]


def batch_ids(fmt: str, batch: dict) -> list[int]:
    """The ids of a batch's rows, whatever the format made of them (numpy or torch)."""
    if fmt == "tfrecord":
        return [json.loads(bytes(r))["id"] for r in batch["record"]]
    if fmt.startswith("webdataset"):
        return [int(v if isinstance(v, str) else bytes(v).decode()) for v in batch["id.txt"]]
    if fmt == "raw":
        return [int(bytes(v).decode()) for v in batch["bytes"]]
    column = batch["array"] if fmt == "npy" else batch["id"]
    return [int(i) for i in column.tolist()]


def torch_parts(ds: sf.Dataset, fmt: str, world: int, workers: int, **kwargs: Any) -> list[list[list[int]]]:
    """What each rank's torch ``DataLoader`` yields, batch by batch: the adapter run as
    each of the rank's workers would run it (torch's worker info stood in for)."""
    import shardflow.torch as sft

    per_rank = []
    for rank in range(world):
        batches: list[list[int]] = []
        for worker in range(max(workers, 1)):
            info = types.SimpleNamespace(id=worker, num_workers=workers, seed=1000 + worker) if workers else None
            original = sft.get_worker_info
            sft.get_worker_info = lambda info=info: info  # type: ignore[assignment]
            try:
                adapter = sft.IterableDataset(ds, rank=rank, world_size=world, **kwargs)
                batches += [batch_ids(fmt, b) for b in adapter]
            finally:
                sft.get_worker_info = original  # type: ignore[assignment]
        per_rank.append(batches)
    return per_rank


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(0, 60), min_size=1, max_size=5),
    world=st.integers(1, 8),
    workers=st.integers(0, 3),
    batch_size=st.integers(1, 16),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
)
def test_every_rank_gets_as_many_batches(
    tmp_path_factory: pytest.TempPathFactory, fmt: str, sizes: list[int], world: int, workers: int,
    batch_size: int, shuffle: bool, drop_last: bool,
) -> None:
    if sum(sizes) == 0:
        sizes = sizes + [1]
    total = sum(sizes)
    ds = open_format(write_shards(tmp_path_factory.mktemp("ranks"), fmt, sizes), fmt)
    if shuffle:
        ds = ds.shuffle(seed=7, buffer_size=25)
    per_rank = torch_parts(ds, fmt, world, workers, batch_size=batch_size, drop_last=drop_last)
    counts = [len(batches) for batches in per_rank]
    assert len(set(counts)) == 1, counts
    rows = [i for batches in per_rank for b in batches for i in b]
    seen = collections.Counter(rows)
    # A rank's share (even with drop_last, padded otherwise) is cut between its workers,
    # each row once, and each worker batches its own rows.
    workers = max(workers, 1)

    def worker_rows(rank_rows: int) -> list[int]:
        return [rank_rows // workers + (w < rank_rows % workers) for w in range(workers)]

    if drop_last:
        assert max(seen.values(), default=1) == 1 and set(seen) <= set(range(total))
        kept = [n // batch_size * batch_size for n in worker_rows(total // world)]
        assert len(rows) == world * sum(kept)
    elif world > 1:
        # Padded: every row once, and the shorter ranks (not workers) read first rows again.
        assert set(seen) == set(range(total))
        assert len(rows) == world * -(-total // world)
        assert sum(seen.values()) - len(seen) == world * -(-total // world) - total
    else:
        assert sorted(rows) == list(range(total))


def test_uneven_jsonl_files_give_every_rank_the_same_batches(tmp_path: Path) -> None:
    # The layout from the issue: on world sizes 2, 3, 5 and 8 ranks got [40, 79],
    # [87, 0, 32], [10, 0, 31, 78, 0] and [9, 0, 31, 78, 0, 1, 0, 0] batches.
    paths = write_shards(tmp_path, "jsonl", [1, 997, 40, 2503, 311, 7])
    ds = sf.dataset(paths).shuffle(seed=0, buffer_size=500)
    for world in (2, 3, 5, 8):
        counts, rows = [], []
        for rank in range(world):
            loader = sf.DataLoader(ds, batch_size=32, drop_last=True, rank=rank, world_size=world)
            batches = [b["id"].tolist() for b in loader]
            assert len(loader) == len(batches)
            counts.append(len(batches))
            rows += [i for b in batches for i in b]
        assert counts == [3859 // world // 32] * world
        assert len(rows) == len(set(rows))


def test_padding_is_counted_and_can_be_turned_off(tmp_path: Path) -> None:
    paths = write_shards(tmp_path, "parquet", [10, 3])  # 13 rows on 4 ranks
    ds = sf.dataset(paths)
    padded = [sf.DataLoader(ds, batch_size=2, rank=r, world_size=4) for r in range(4)]
    rows = [[i for b in loader for i in b["id"].tolist()] for loader in padded]
    assert [len(r) for r in rows] == [4, 4, 4, 4]
    assert sorted(set(i for r in rows for i in r)) == list(range(13))
    assert sum(loader.stats()["padded_rows"] for loader in padded) == 3
    exact = [[i for b in sf.DataLoader(ds, batch_size=2, rank=r, world_size=4, pad=False) for i in b["id"].tolist()] for r in range(4)]
    assert sorted(i for r in exact for i in r) == list(range(13))
    with pytest.raises(TypeError):
        sf.DataLoader(ds, pad="yes")  # type: ignore[arg-type]


def test_a_take_after_a_shuffle_buffer_is_padded_too(tmp_path: Path) -> None:
    # Every rank reads the shuffled stream and keeps its own rows of the first 50.
    ds = sf.dataset(write_shards(tmp_path, "jsonl", [40, 30])).shuffle(seed=2, buffer_size=20).take(50)
    loaders = [sf.DataLoader(ds, batch_size=4, rank=r, world_size=4) for r in range(4)]
    rows = [[i for b in loader for i in b["id"].tolist()] for loader in loaders]
    assert [len(r) for r in rows] == [13, 13, 13, 13]
    assert [len(loader) for loader in loaders] == [4, 4, 4, 4]
    assert len({i for r in rows for i in r}) == 50
    assert sum(loader.stats()["padded_rows"] for loader in loaders) == 2
    exact = [[i for b in sf.DataLoader(ds, batch_size=4, rank=r, world_size=4, pad=False) for i in b["id"].tolist()] for r in range(4)]
    assert [len(r) for r in exact] == [13, 13, 12, 12]


# ---- elastic resume ------------------------------------------------------------------

RESUME = """
import json, sys
sys.path.insert(0, {tests!r})
import shardflow as sf
from test_scale_out import build, batch_ids, id_format
spec = json.loads(sys.argv[1])
ds = build(spec)
states = json.load(open(spec["states"]))
out = {{}}
for world in spec["worlds"]:
    out[world] = []
    for rank in range(world):
        loader = sf.DataLoader(ds, batch_size=spec["batch_size"], rank=rank, world_size=world, pad=False)
        loader.load_state_dict(states)
        out[world].append([batch_ids(id_format(spec), b) for b in loader])
print(json.dumps(out))
"""


def id_format(spec: dict) -> str:
    """The format whose ids the rows of `spec`'s dataset carry."""
    return "parquet" if spec["kind"] == "interleave" else spec["kind"]


def build(spec: dict) -> sf.Dataset:
    """The dataset a spec describes (the same in the saving and the resuming process)."""
    if spec["kind"] == "interleave":
        a = open_format(spec["paths"][0], "jsonl")
        b = open_format(spec["paths"][1], "parquet")
        ds = sf.interleave([a, b], probabilities=[0.6, 0.4], seed=3, stopping_strategy="all_exhausted_without_replacement")
    else:
        ds = open_format(spec["paths"], spec["kind"])
    if spec["shuffle"]:
        ds = ds.shuffle(seed=11, buffer_size=40)
    if spec["filter"]:
        fmt = id_format(spec)
        ds = ds.filter(lambda row: ident(fmt, row) % 5 != 0)
    return ds


@pytest.mark.parametrize("kind", ["parquet", "jsonl", "tfrecord", "webdataset", "interleave"])
@pytest.mark.parametrize("shuffle,filtered", [(False, False), (True, False), (True, True)], ids=["plain", "shuffled", "shuffled+filter"])
def test_four_ranks_resume_on_three_and_on_six(tmp_path: Path, kind: str, shuffle: bool, filtered: bool) -> None:
    rng = np.random.default_rng([ord(c) for c in kind] + [shuffle, filtered])
    sizes = [int(n) for n in rng.integers(0, 120, 5)] + [37]
    if kind == "interleave":
        paths: Any = [write_shards(tmp_path / "a", "jsonl", sizes), write_shards(tmp_path / "b", "parquet", sizes[::-1], start=sum(sizes))]
        total = 2 * sum(sizes)
    else:
        paths = write_shards(tmp_path, kind, sizes)
        total = sum(sizes)
    expected = {i for i in range(total) if not filtered or i % 5 != 0}
    spec = {"kind": kind, "paths": paths, "shuffle": shuffle, "filter": filtered, "batch_size": 8}
    ds = build(spec)
    stop = int(rng.integers(1, 6))
    before, states = [], []
    for rank in range(4):
        loader = sf.DataLoader(ds, batch_size=8, rank=rank, world_size=4, pad=False)
        batches = iter(loader)
        for _ in range(stop):
            batch = next(batches, None)
            if batch is not None:
                before += batch_ids(id_format(spec), batch)
        states.append(loader.state_dict())
    (tmp_path / "states.json").write_text(json.dumps(states))
    script = RESUME.format(tests=str(Path(__file__).parent))
    run = {**spec, "worlds": [3, 6], "states": str(tmp_path / "states.json")}
    out = subprocess.run([sys.executable, "-c", script, json.dumps(run)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for per_rank in json.loads(out.stdout).values():
        after = [i for batches in per_rank for b in batches for i in b]
        assert len(before) + len(after) == len(set(before) | set(after)), "a row came twice"
        assert set(before) | set(after) == expected
        if not filtered:
            # Shares of the rest are within a row of each other, so batches within one.
            counts = [len(b) for b in per_rank]
            assert max(counts) - min(counts) <= 1


def test_single_state_is_enough_when_ranks_move_in_lockstep(tmp_path: Path) -> None:
    ds = sf.dataset(write_shards(tmp_path, "parquet", [50, 77, 13]))
    loader = sf.DataLoader(ds, batch_size=10, rank=2, world_size=4, pad=False)
    batches = iter(loader)
    before = [next(batches)["id"].tolist() for _ in range(2)]
    state = loader.state_dict()
    del batches
    # Every rank of four stood at batch 2 of its share: 35 rows each, 20 of them read.
    after = []
    for rank in range(3):
        resumed = sf.DataLoader(ds, batch_size=10, rank=rank, world_size=3, pad=False)
        resumed.load_state_dict(state)
        after += [i for b in resumed for i in b["id"].tolist()]
    starts = [0, 35, 70, 105]
    read = {i for s in starts for i in range(s, s + 20)}
    assert sorted(after) == sorted(set(range(140)) - read)
    assert {i for b in before for i in b} == set(range(70, 90))


def test_states_of_another_run_or_epoch_are_refused(tmp_path: Path) -> None:
    ds = sf.dataset(write_shards(tmp_path, "jsonl", [40, 40])).shuffle(seed=1, buffer_size=10)
    states = []
    for rank in range(2):
        loader = sf.DataLoader(ds, batch_size=5, rank=rank, world_size=2, pad=False)
        loader.set_epoch(rank)  # not one checkpoint
        next(iter(loader))
        states.append(loader.state_dict())
    with pytest.raises(ValueError, match="not of one checkpoint"):
        sf.DataLoader(ds, batch_size=5, world_size=3, rank=0, pad=False).load_state_dict(states)
    other = sf.dataset(write_shards(tmp_path / "other", "jsonl", [40, 41])).shuffle(seed=1, buffer_size=10)
    with pytest.raises(ValueError, match="dataset"):
        sf.DataLoader(other, batch_size=5, world_size=3, rank=0, pad=False).load_state_dict(states[:1])
    with pytest.raises(ValueError, match="every rank's state_dict"):
        sf.DataLoader(ds, batch_size=5, world_size=3, rank=0, pad=False).load_state_dict(states[:1])


def test_flat_map_epochs_resume_only_on_the_same_world_size(tmp_path: Path) -> None:
    ds = sf.dataset(write_shards(tmp_path, "parquet", [30])).flat_map(lambda r: [r, r])
    states = []
    for rank in range(2):
        loader = sf.DataLoader(ds, batch_size=4, rank=rank, world_size=2, pad=False)
        next(iter(loader))
        states.append(loader.state_dict())
    assert states[0]["consumed"] is None
    with pytest.raises(ValueError, match="only on the world size that saved it"):
        sf.DataLoader(ds, batch_size=4, rank=0, world_size=3, pad=False).load_state_dict(states)
    # The same world size replays as before.
    again = sf.DataLoader(ds, batch_size=4, rank=1, world_size=2, pad=False)
    again.load_state_dict(states)
    assert sum(len(b["id"]) for b in again) == 30 - 4


def test_a_flat_map_on_equal_ranks_resumes_on_another_world_size(tmp_path: Path) -> None:
    """On ranks kept equal every rank reads the flat_map's whole stream and keeps every
    world_size-th row: the rows have places in that stream, so 2 ranks' states resume on
    3, the rows not delivered once each, but one padding row per rank; and on one rank
    (which reads its own stream undealt in a fresh epoch), whose reader, or each of its
    workers, deals the rows left all the same, each once."""
    ds = sf.dataset(write_shards(tmp_path, "parquet", [30, 7])).flat_map(lambda r: [r, {**r, "id": r["id"] + 1000}])
    expected = collections.Counter(list(range(37)) + list(range(1000, 1037)))
    states, before = [], collections.Counter()
    for rank in range(2):
        loader = sf.DataLoader(ds, batch_size=4, rank=rank, world_size=2, shuffle=True, seed=1)
        batches = iter(loader)
        for _ in range(2 + rank):
            before.update(next(batches)["id"].tolist())
        states.append(loader.state_dict())
    assert states[0]["consumed"] is not None
    after = collections.Counter()
    counts = []
    for rank in range(3):
        loader = sf.DataLoader(ds, batch_size=4, rank=rank, world_size=3, shuffle=True, seed=1)
        loader.load_state_dict(states)
        ids = [i for b in loader for i in b["id"].tolist()]
        counts.append(len(ids))
        after.update(ids)
    got = before + after
    assert set(got) == set(expected) and len(set(counts)) == 1, counts
    assert sum((got - expected).values()) <= 2 + 3
    # 2 -> 1: the rows left, once each, with nothing added (one rank has no padding).
    alone = sf.DataLoader(ds, batch_size=4, shuffle=True, seed=1)
    alone.load_state_dict(states)
    rest = collections.Counter(i for b in alone for i in b["id"].tolist())
    assert before + rest - expected == collections.Counter(), (before + rest - expected)
    assert expected - (before + rest) == collections.Counter(), (expected - (before + rest))
    # The next epoch is read undealt, whole again.
    assert collections.Counter(i for b in alone for i in b["id"].tolist()) == expected


# ---- samplers ------------------------------------------------------------------------


def test_weighted_sample_with_replacement_follows_a_weight_column(tmp_path: Path) -> None:
    rows = [{"id": i, "w": [0.0, 1.0, 3.0, 6.0][i % 4]} for i in range(400)]
    (tmp_path / "w.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds = sf.dataset(str(tmp_path / "w.jsonl")).weighted_sample("w", num_samples=20_000, seed=4)
    assert len(ds) == 20_000
    loader = sf.DataLoader(ds, batch_size=1000)
    drawn = np.concatenate([b["w"] for b in loader])
    share = {w: float(np.mean(drawn == w)) for w in (0.0, 1.0, 3.0, 6.0)}
    assert share[0.0] == 0.0
    for w in (1.0, 3.0, 6.0):
        assert abs(share[w] - w / 10) < 0.02, share
    # The same (seed, epoch), the same draws; another epoch, other draws.
    again = np.concatenate([b["id"] for b in sf.DataLoader(ds, batch_size=1000)])
    first = np.concatenate([b["id"] for b in sf.DataLoader(ds, batch_size=1000)])
    assert np.array_equal(again, first)
    epochs = sf.DataLoader(ds, batch_size=1000)
    one, two = ([i for b in epochs for i in b["id"].tolist()] for _ in range(2))
    assert one != two
    with pytest.raises(sf.SchemaError, match="nope"):
        len(sf.dataset(str(tmp_path / "w.jsonl")).weighted_sample("nope"))


def test_weighted_sample_without_replacement_and_per_row_weights(tmp_path: Path) -> None:
    ds = sf.dataset(write_shards(tmp_path, "parquet", [60, 40]))
    weights = np.where(np.arange(100) < 10, 50.0, 1.0)
    weights[-5:] = 0.0
    sample = ds.weighted_sample(weights, num_samples=95, replacement=False, seed=1)
    ids = [r["id"] for r in sample]
    assert sorted(ids) == list(range(95))  # distinct, the zero-weight rows never drawn
    assert sum(i < 10 for i in ids[:10]) >= 7  # the heavy rows come early
    with pytest.raises(ValueError, match="only 95 have a weight above zero"):
        ds.weighted_sample(weights, num_samples=96, replacement=False)
    with pytest.raises(ValueError, match="3 weights for 100 rows"):
        ds.weighted_sample([1.0, 2.0, 3.0])
    # Pickled by recipe, with the same draws.
    import pickle

    assert [r["id"] for r in pickle.loads(pickle.dumps(sample))] == ids


def test_source_weights_mix_a_concatenation(tmp_path: Path) -> None:
    small = sf.dataset(write_shards(tmp_path / "a", "jsonl", [100]))
    large = sf.dataset(write_shards(tmp_path / "b", "parquet", [10_000], start=1000))
    mixed = sf.concatenate([small, large]).weighted_sample(source_weights=[0.5, 0.5], num_samples=10_000, seed=2)
    ids = np.concatenate([b["id"] for b in sf.DataLoader(mixed, batch_size=500)])
    assert abs(float(np.mean(ids < 1000)) - 0.5) < 0.03
    with pytest.raises(ValueError, match="source_weights"):
        small.weighted_sample(source_weights=[1.0])


def test_weighted_sample_splits_between_ranks_and_distributed_samplers(tmp_path: Path) -> None:
    import torch.utils.data as tud

    from shardflow.torch import MapDataset

    ds = sf.dataset(write_shards(tmp_path, "tfrecord", [50, 70]), format="tfrecord", format_options={"raw": True})
    sample = ds.weighted_sample(np.linspace(0.1, 1.0, 120), num_samples=90, seed=5)
    whole = [json.loads(bytes(r["record"]))["id"] for r in sample]
    # The loader's ranks split the drawn rows exactly.
    per_rank = [[json.loads(bytes(x))["id"] for b in sf.DataLoader(sample, batch_size=7, rank=r, world_size=3) for x in b["record"]] for r in range(3)]
    assert sum(per_rank, []) == whole
    # torch's DistributedSampler over MapDataset reads the same drawn rows, once each.
    mapped = MapDataset(sample)
    seen = []
    for rank in range(3):
        sampler = tud.DistributedSampler(mapped, num_replicas=3, rank=rank, shuffle=False)
        loader = tud.DataLoader(mapped, batch_size=8, sampler=sampler, collate_fn=lambda rows: rows)
        seen += [json.loads(bytes(r["record"]))["id"] for batch in loader for r in batch]
    assert sorted(seen) == sorted(whole)
    mapped.set_epoch(1)
    assert [json.loads(bytes(mapped[i]["record"]))["id"] for i in range(90)] != whole
