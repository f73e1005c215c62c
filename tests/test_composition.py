"""Ops composed the way users chain them: what each epoch, rank and worker gets when a
split or a weighted draw follows a shuffle (see the README's "Defaults you can rely on":
everything before the last split or weighted_sample draws as in epoch 0)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import write_id_shards
from torch.utils.data import DataLoader as TorchLoader

import shardflow as sf
from shardflow.torch import IterableDataset

EPOCHS = 3


@pytest.fixture(scope="module")
def thousand(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_id_shards(tmp_path_factory.mktemp("thousand"), [400, 350, 250], row_group_size=50)


def ids_of(ds: sf.Dataset, epoch: int, **loader_args: object) -> list[int]:
    loader = sf.DataLoader(ds, batch_size=64, **loader_args)  # type: ignore[arg-type]
    loader.set_epoch(epoch)
    return [i for batch in loader for i in batch["id"].tolist()]


def test_weighted_sample_after_a_shuffle_reads_weights_in_every_epoch() -> None:
    # Only 10 of 1,000 rows may be drawn; the shuffle before the draw used to move each
    # epoch while the weights stayed as read in epoch 0.
    ids = np.arange(1000)
    weights = np.where(ids % 100 == 7, 1.0, 0.0)
    allowed = set(ids[weights > 0].tolist())
    ds = sf.from_dict({"id": ids, "w": weights}).shuffle(seed=7).weighted_sample("w", 200)
    for epoch in range(EPOCHS):
        drawn = ids_of(ds, epoch)
        assert len(drawn) == 200 and set(drawn) <= allowed, epoch
        ds.set_epoch(epoch)
        assert {ds[i]["id"] for i in range(0, 200, 7)} <= allowed, epoch
    # A dataset used first at epoch 1 (a resumed run) reads its weights there.
    fresh = sf.from_dict({"id": ids, "w": weights}).shuffle(seed=7).weighted_sample("w", 200)
    assert set(ids_of(fresh, 1)) <= allowed
    fresh.set_epoch(2)
    assert fresh[0]["id"] in allowed
    # The draw itself is new each epoch.
    assert ids_of(ds, 0) != ids_of(ds, 1)


def test_split_after_full_shuffle_is_the_same_every_epoch(thousand: str) -> None:
    ds = sf.dataset(thousand).shuffle(seed=42)
    split = ds.train_test_split(test_size=0.2, shuffle=False)
    test_rows = set(ids_of(split["test"], 0))
    assert len(test_rows) == 200
    for epoch in range(EPOCHS):
        train = ids_of(split["train"], epoch)
        assert len(train) == 800 and not set(train) & test_rows, epoch
        assert set(ids_of(split["test"], epoch)) == test_rows
        # The train split's own shuffle still changes each epoch.
    orders = {tuple(ids_of(split["train"], e, shuffle=True, seed=1)) for e in range(EPOCHS)}
    assert len(orders) == EPOCHS


@pytest.mark.parametrize("buffered", [False, True], ids=["full", "buffer"])
def test_cookbook_take_skip_after_shuffle_never_leaks(thousand: str, buffered: bool) -> None:
    # The cookbook idiom: shuffle once, the first n rows as test, the rest as train;
    # then 3 epochs of a shuffled loader over train on 4 ranks x 2 torch workers.
    base = sf.dataset(thousand)
    shuffled = base.shuffle(seed=0, buffer_size=100) if buffered else base.shuffle(seed=0)
    test, train = shuffled.take(100), shuffled.skip(100)
    test_rows = set(ids_of(test, 0))
    assert len(test_rows) == 100
    ranks = [
        TorchLoader(
            IterableDataset(train, batch_size=16, shuffle=True, rank=rank, world_size=4, drop_last=False),
            batch_size=None, num_workers=2, multiprocessing_context="fork",
        )
        for rank in range(4)
    ]
    orders = []
    for epoch in range(EPOCHS):
        seen: list[int] = []
        for loader in ranks:
            for batch in loader:
                seen.extend(batch["id"].tolist())
        assert not set(seen) & test_rows, f"epoch {epoch}: test rows in train"
        assert set(seen) == set(range(1000)) - test_rows, epoch
        assert set(ids_of(test, epoch)) == test_rows
        orders.append(seen)
    assert len({tuple(o) for o in orders}) == EPOCHS  # train is still reshuffled


def test_interleave_before_a_take_draws_the_same_rows_every_epoch(thousand: str) -> None:
    a = sf.from_dict({"id": np.arange(0, 500)})
    b = sf.from_dict({"id": np.arange(500, 1000)})
    mixed = sf.interleave([a, b], probabilities=[0.3, 0.7], seed=5).take(300)
    first = ids_of(mixed, 0)
    assert len(first) == 300
    for epoch in range(1, EPOCHS):
        assert ids_of(mixed, epoch) == first


def test_concatenated_shuffles_before_a_select_stay_put(tmp_path: Path) -> None:
    a = sf.from_dict({"id": np.arange(0, 60)}).shuffle(seed=3)
    b = sf.from_dict({"id": np.arange(60, 100)}).shuffle(seed=4)
    picked = sf.concatenate([a, b]).select(range(10, 90, 3))
    first = ids_of(picked, 0)
    for epoch in range(1, EPOCHS):
        assert ids_of(picked, epoch) == first
    # Without a split after it, a concatenation of shuffles reshuffles each epoch.
    whole = sf.concatenate([a, b])
    assert ids_of(whole, 0) != ids_of(whole, 1)
    assert sorted(ids_of(whole, 1)) == list(range(100))


@pytest.mark.parametrize("strategy", ["all_exhausted", "all_exhausted_without_replacement"])
def test_interleave_refuses_what_could_not_run_out(strategy: str) -> None:
    a = sf.from_dict({"id": np.arange(10)})
    b = sf.from_dict({"id": np.arange(10, 20)})
    # Endless before (still drawing at 100,000 rows), or B's rows silently dropped.
    with pytest.raises(ValueError, match="dataset 1 has probability 0"):
        sf.interleave([a, b], probabilities=[1.0, 0.0], stopping_strategy=strategy)
    with pytest.raises(ValueError, match="dataset 0 is empty"):
        sf.interleave([a.take(0), b], stopping_strategy=strategy)
    with pytest.raises(ValueError, match="dataset 1 is empty"):
        sf.interleave([b, a.skip(10)], stopping_strategy=strategy)
    # first_exhausted may take a zero probability: that dataset is just never drawn.
    assert sorted(ids_of(sf.interleave([a, b], probabilities=[1.0, 0.0], seed=1), 0)) == list(range(10))


def test_interleave_probabilities_must_sum_to_one() -> None:
    a = sf.from_dict({"id": np.arange(10)})
    with pytest.raises(ValueError, match="sum to 1"):
        sf.interleave([a, a], probabilities=[2.0, 1.0])
    sf.interleave([a, a], probabilities=[0.1, 0.9])  # rounding in the sum is fine


def test_elastic_resume_between_one_and_many_ranks_with_the_defaults(thousand: str) -> None:
    # The default pad differs between 1 rank (off) and N ranks (on); a state's pad shapes
    # only how the saving run divided its epoch, not the loader that resumes it.
    ds = sf.dataset(thousand)

    def loader(rank: int = 0, world_size: int = 1) -> sf.DataLoader:
        return sf.DataLoader(ds, batch_size=10, shuffle=True, seed=1, rank=rank, world_size=world_size)

    def first_batches(source: sf.DataLoader, n: int) -> list[int]:
        batches = iter(source)
        return [i for _ in range(n) for i in next(batches)["id"].tolist()]

    # 2 ranks -> 1
    ranks = [loader(r, 2) for r in range(2)]
    delivered = [i for r in ranks for i in first_batches(r, 3)]
    one = loader()
    one.load_state_dict([r.state_dict() for r in ranks])
    rest = [i for batch in one for i in batch["id"].tolist()]
    assert sorted(delivered + rest) == list(range(1000))
    # 1 rank -> 2 (one state is enough: plain shuffled data moves in lockstep)
    single = loader()
    delivered = first_batches(single, 7)
    state = single.state_dict()
    rest = []
    for rank in range(2):
        resumed = loader(rank, 2)
        resumed.load_state_dict([state])
        rest += [i for batch in resumed for i in batch["id"].tolist()]
    assert sorted(delivered + rest) == list(range(1000))


def test_a_torch_resume_is_consumed_by_one_iteration(thousand: str) -> None:
    # The README's recipe: the workers' states into IterableDataset.load_state_dict,
    # then a new StatefulDataLoader with torch's default (non-persistent) workers. The
    # first pass finishes the saved epoch; later passes are whole epochs again.
    from torchdata.stateful_dataloader import StatefulDataLoader

    from shardflow.torch import dataset_states

    def dataset() -> IterableDataset:
        return IterableDataset(sf.dataset(thousand), batch_size=50, shuffle=True, seed=3)

    def loader(ds: IterableDataset) -> StatefulDataLoader:
        return StatefulDataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")

    first = loader(dataset())
    delivered: list[int] = []
    for step, batch in enumerate(first):
        delivered += batch["id"].tolist()
        if step == 5:
            break
    state = first.state_dict()
    ds = dataset()
    ds.load_state_dict(dataset_states(state))
    resumed = loader(ds)
    rest = [i for batch in resumed for i in batch["id"].tolist()]
    assert sorted(delivered + rest) == list(range(1000))
    later = [[i for batch in resumed for i in batch["id"].tolist()] for _ in range(2)]
    for epoch in later:
        assert sorted(epoch) == list(range(1000))
    assert later[0] != later[1]


def test_sample_mode_resumes_from_the_states_list(thousand: str) -> None:
    # Samples handed out one by one: the states list resumes exactly on the same number
    # of parts (samples already out are not repeated), a flat_map included, and on
    # another number of parts a flat_map's epoch gives the clear error (its rows have no
    # positions), where the adapter used to fail with a TypeError.
    from torchdata.stateful_dataloader import StatefulDataLoader

    from shardflow.torch import dataset_states

    def twice(row: dict) -> list[dict]:
        return [row, row]

    for flat in (False, True):
        def dataset() -> IterableDataset:
            base = sf.dataset(thousand)
            return IterableDataset(base.flat_map(twice) if flat else base, shuffle=True, seed=2)

        first = StatefulDataLoader(dataset(), batch_size=10)
        batches = iter(first)
        delivered = [i for _ in range(7) for i in next(batches)["id"].tolist()]
        state = first.state_dict()
        ds = dataset()
        ds.load_state_dict(dataset_states(state))
        rest = [i for batch in StatefulDataLoader(ds, batch_size=10) for i in batch["id"].tolist()]
        expected = sorted(list(range(1000)) * (2 if flat else 1))
        assert sorted(delivered + rest) == expected, flat
    elastic = dataset()
    elastic.load_state_dict(dataset_states(state))
    with pytest.raises(ValueError, match="only on the world size that saved it"):
        next(iter(StatefulDataLoader(elastic, batch_size=10, num_workers=2, multiprocessing_context="fork")))


def rank_rows(ds: sf.Dataset, world: int, batch_size: int = 2, **loader_args: object) -> list[list[list[int]]]:
    """Every rank's batches (as id lists) of epoch 0, checking len() against them."""
    ranks = []
    for rank in range(world):
        loader = sf.DataLoader(ds, batch_size=batch_size, rank=rank, world_size=world, **loader_args)  # type: ignore[arg-type]
        expected = len(loader)
        batches = [b["id"].tolist() for b in loader]
        assert len(batches) == expected, (rank, expected, len(batches))
        ranks.append(batches)
    return ranks


@pytest.mark.parametrize("strategy", [None, "all_exhausted_without_replacement"], ids=["concatenate", "without_replacement"])
def test_combined_datasets_pad_and_drop_once_against_the_total(strategy: str | None) -> None:
    # Finding 3: 4 datasets of 3 rows on 2 ranks gave 16 rows (4 repeats) padded, 8 of 12
    # with drop_last, and with pad=False over 10 parts, 10 batches on rank 0 and 20 on 1.
    def combined(n: int) -> sf.Dataset:
        parts = [sf.from_dict({"id": np.arange(3 * i, 3 * i + 3)}) for i in range(n)]
        return sf.concatenate(parts) if strategy is None else sf.interleave(parts, stopping_strategy=strategy)

    for args in ({}, {"drop_last": True}, {"pad": False}):
        ranks = rank_rows(combined(4), 2, **args)
        rows = [i for batches in ranks for b in batches for i in b]
        assert sorted(rows) == list(range(12)), args
        assert [len(batches) for batches in ranks] == [3, 3], args
    ranks = rank_rows(combined(10), 2, pad=False)
    assert [len(batches) for batches in ranks] == [8, 8]
    # 13 rows on 4 ranks (4 + 3 + 3 + 3): three ranks pad a row each, to 16 rows;
    # drop_last drops one row in all.
    parts = [sf.from_dict({"id": np.arange(a, b)}) for a, b in ((0, 5), (5, 9), (9, 13))]
    ds = sf.concatenate(parts) if strategy is None else sf.interleave(parts, stopping_strategy=strategy)
    padded = [i for batches in rank_rows(ds, 4, batch_size=4) for b in batches for i in b]
    assert len(padded) == 16 and set(padded) == set(range(13))
    dropped = [i for batches in rank_rows(ds, 4, batch_size=3, drop_last=True) for b in batches for i in b]
    assert len(dropped) == 12 == len(set(dropped))


def test_interleave_all_exhausted_goes_on_past_a_part_a_rank_has_none_of() -> None:
    # Finding 4: with 4 ranks, one source's short share ended the whole mix: 15 of its 60
    # rows lost with pad=False; with drop_last three ranks got 0 rows and one 120.
    a = sf.from_dict({"id": np.arange(0, 60)})
    b = sf.from_dict({"id": np.arange(1000, 1005)})  # 5 rows: ranks get 2, 1, 1, 1
    mixed = sf.interleave([a, b], stopping_strategy="all_exhausted")
    for args in ({"pad": False}, {"drop_last": True}, {}):
        ranks = rank_rows(mixed, 4, batch_size=4, **args)
        rows = [i for batches in ranks for b in batches for i in b]
        if "drop_last" not in args:  # (a short last batch may hold a last row)
            assert set(range(60)) <= set(rows), args  # every row of the longer source
        assert set(rows) - set(range(60)) == set(range(1000, 1005)), args
        assert len({len(batches) for batches in ranks}) == 1, args
    # An elastic resume 2 -> 3 ranks after one source ran out delivers the rest.
    loaders = [sf.DataLoader(mixed, batch_size=4, rank=r, world_size=2) for r in range(2)]
    before, states = [], []
    for loader in loaders:
        it = iter(loader)
        for _ in range(8):
            before += next(it)["id"].tolist()
        states.append(loader.state_dict())
    after = []
    for rank in range(3):
        resumed = sf.DataLoader(mixed, batch_size=4, rank=rank, world_size=3)
        resumed.load_state_dict(states)
        after += [i for b in resumed for i in b["id"].tolist()]
    assert set(range(60)) <= set(before) | set(after)
    assert after, "the resumed epoch delivered nothing"
    # A dataset too small for the readers is a clear error under first_exhausted.
    with pytest.raises(ValueError, match="too few to give each"):
        rank_rows(sf.interleave([a, b]), 8)


@pytest.mark.parametrize("probabilities", [None, [0.3, 0.7]], ids=["round_robin", "weighted"])
@pytest.mark.parametrize("strategy", ["first_exhausted", "all_exhausted"])
def test_interleave_ranks_take_as_many_steps(strategy: str, probabilities: list[float] | None) -> None:
    # Finding 6: ranks of an interleave got [31, 31, 31, 30] batches, and a DDP step waits
    # forever on the short one. Now every rank mixes to one shared length.
    a = sf.from_dict({"id": np.arange(0, 997)})
    b = sf.from_dict({"id": np.arange(10_000, 13_001)})
    mixed = sf.interleave([a, b], probabilities=probabilities, seed=11, stopping_strategy=strategy)
    for args in ({}, {"drop_last": True}, {"pad": False}):
        counts = [len(batches) for batches in rank_rows(mixed, 4, batch_size=32, **args)]
        assert len(set(counts)) == 1, (args, counts)
    # Torch workers too: every (rank, worker) reader shares the length.
    per_rank = []
    for rank in range(3):
        rows = 0
        for worker in range(2):
            loader = sf.DataLoader(mixed, batch_size=32, rank=rank, world_size=3, worker=worker, num_workers=2)
            rows += sum(len(b["id"]) for b in loader)
        per_rank.append(rows)
    assert len(set(per_rank)) == 1, per_rank


def test_arrow_ipc_streams_get_exact_shares(tmp_path: Path) -> None:
    # Finding 7: .arrows files were dealt whole, round-robin: 11 and 1 batches on 2 ranks,
    # and len() raised TypeError.
    import pyarrow as pa

    sizes, start = [10, 150, 40], 0
    for i, n in enumerate(sizes):
        table = pa.table({"id": np.arange(start, start + n)})
        with pa.ipc.new_stream(tmp_path / f"part-{i}.arrows", table.schema) as writer:
            for at in range(0, n, 7):
                writer.write_table(table.slice(at, 7))
        start += n
    ds = sf.dataset(str(tmp_path / "*.arrows"))
    assert len(ds) == 200
    ranks = rank_rows(ds, 2, batch_size=10)
    assert [len(batches) for batches in ranks] == [10, 10]
    assert sorted(i for batches in ranks for b in batches for i in b) == list(range(200))
    # Contiguous shares, in file order, as for every other format.
    assert ranks[0][0][0] == 0 and ranks[1][0][0] == 100


def test_torch_workers_of_a_rank_never_repeat_a_row(tmp_path: Path) -> None:
    # Finding 9: 7,665 rows on 3 ranks x 2 workers: each rank got 2,556 rows, one a repeat
    # (each worker was padded); 7,665 divides by 3, so nothing needs repeating.
    path = write_id_shards(tmp_path, [3000, 4665], row_group_size=500)
    ds = sf.dataset(path)
    per_rank = []
    for rank in range(3):
        loader = TorchLoader(
            IterableDataset(ds, batch_size=64, rank=rank, world_size=3),
            batch_size=None, num_workers=2, multiprocessing_context="fork",
        )
        per_rank.append([i for batch in loader for i in batch["id"].tolist()])
    assert [len(rows) for rows in per_rank] == [2555] * 3
    assert sorted(i for rows in per_rank for i in rows) == list(range(7665))
    # pad= as in DataLoader: 7,666 rows pad one rank by one row, or not at all.
    (tmp_path / "uneven").mkdir()
    uneven = sf.dataset(write_id_shards(tmp_path / "uneven", [7666], row_group_size=500))
    for pad, expected in ((True, [2556] * 3), (False, [2556, 2555, 2555])):
        counts = []
        for rank in range(3):
            adapter = IterableDataset(uneven, batch_size=64, rank=rank, world_size=3, pad=pad)
            counts.append(sum(len(b["id"]) for b in TorchLoader(adapter, batch_size=None, num_workers=2, multiprocessing_context="fork")))
        assert counts == expected, pad


# ---------------------------------------------------------------------------------------
# Found by the model-based tests (tests/test_model.py).


def test_a_take_after_a_filter_gives_every_rank_as_many_rows() -> None:
    # Every rank reads the filtered stream up to the take and keeps its own rows; it
    # learns the stream's length only at its end, and still pads (or, with drop_last,
    # holds back its row of an unfinished round) so that ranks take as many steps.
    evens = sf.from_dict({"id": np.arange(20)}).filter(lambda row: row["id"] % 2 == 0)
    ranks = [[b["id"].tolist() for b in sf.DataLoader(evens.take(7), batch_size=1, rank=r, world_size=2)] for r in range(2)]
    assert ranks == [[[0], [4], [8], [12]], [[2], [6], [10], [0]]]  # the stream's first row pads
    dropped = [
        [b["id"].tolist() for b in sf.DataLoader(evens.take(7), batch_size=1, rank=r, world_size=2, drop_last=True)]
        for r in range(2)
    ]
    assert dropped == [[[0], [4], [8]], [[2], [6], [10]]]
    single = [[b["id"].tolist() for b in sf.DataLoader(evens.take(1), batch_size=1, rank=r, world_size=2)] for r in range(2)]
    assert single == [[[0]], [[0]]]
    unpadded = [
        [b["id"].tolist() for b in sf.DataLoader(evens.take(7), batch_size=1, rank=r, world_size=2, pad=False)]
        for r in range(2)
    ]
    assert sorted(i for rank in unpadded for b in rank for i in b) == [0, 2, 4, 6, 8, 10, 12]


def test_a_flat_map_that_returns_nothing_for_a_whole_batch() -> None:
    ds = sf.from_dict({"id": np.arange(10)}).flat_map(lambda row: [row] * (row["id"] >= 8))
    assert [b["id"].tolist() for b in sf.DataLoader(ds, batch_size=4)] == [[8, 9]]


def test_one_reader_mixes_with_a_dataset_that_has_no_rows() -> None:
    # As datasets does: first_exhausted ends at the empty dataset's turn; all_exhausted
    # leaves a dataset that has no rows for this reader out of its turns.
    a = sf.from_dict({"id": np.arange(5)})
    empty = sf.from_dict({"id": np.arange(100, 105)}).take(0)
    mixed = sf.interleave([a, empty])
    assert len(mixed) == 1 and [r["id"] for r in mixed] == [0]
    one = sf.from_dict({"id": np.array([600])})
    every = sf.interleave([a, one], stopping_strategy="all_exhausted")
    # On 6 ranks, rank 0 holds one row of `a` and none of `one`: its mix is that row.
    assert [len(batches) for batches in rank_rows(every, 6, batch_size=1)] == [1] * 6


def test_a_torch_worker_that_finished_its_pass_resumes_to_nothing_more() -> None:
    # A checkpoint taken while one worker has handed out all of its batches and another
    # has not: resumed, the finished worker gives nothing more of the epoch (its state
    # is the epoch's, every row delivered), so nothing repeats.
    import shardflow.torch as sft  # its worker lookup is stood in for below

    ds = sf.from_dict({"id": np.arange(5)})
    real = sft.get_worker_info
    states, before = [], []
    try:
        for worker, steps in ((0, 1), (1, 1)):
            sft.get_worker_info = lambda worker=worker: type("Info", (), {"id": worker, "num_workers": 2, "seed": 7 + worker})()  # type: ignore[assignment]
            adapter = sft.IterableDataset(ds, batch_size=2)
            batches = iter(adapter)
            before += [next(batches)["id"].tolist() for _ in range(steps)]
            if worker == 1:
                assert next(batches, None) is None  # worker 1 (rows 3, 4) has finished
            states.append(adapter.state_dict())
        after = []
        for worker in (0, 1):
            sft.get_worker_info = lambda worker=worker: type("Info", (), {"id": worker, "num_workers": 2, "seed": 70 + worker})()  # type: ignore[assignment]
            adapter = sft.IterableDataset(ds, batch_size=2)
            adapter.load_state_dict(states[worker])
            after += [b["id"].tolist() for b in adapter]
    finally:
        sft.get_worker_info = real  # type: ignore[assignment]
    assert before == [[0, 1], [3, 4]] and after == [[2]]


def test_states_of_an_epoch_nothing_was_delivered_of_resume_anywhere() -> None:
    # A take after a filter divides rows as they stream by, so a resume on another
    # division is refused once rows were delivered; before that it is just the epoch.
    ds = sf.from_dict({"id": np.arange(20)}).filter(lambda row: row["id"] % 2 == 0).take(8)
    states = [sf.DataLoader(ds, batch_size=2, rank=r, world_size=2).state_dict() for r in range(2)]
    resumed = sf.DataLoader(ds, batch_size=2)
    resumed.load_state_dict(states)
    assert [i for b in resumed for i in b["id"].tolist()] == list(range(0, 16, 2))
