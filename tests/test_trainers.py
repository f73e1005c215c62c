"""shardflow inside the trainers people use: HF Trainer, an accelerate loop and Lightning,
each run as 2 processes joined by gloo on CPU (as torchrun starts them), training a
2-layer GPT-2 built from a config (tests/trainer_worker.py). Every rank logs the row ids
of every step; the union of the ranks must be every row exactly once per epoch, in a new
order each epoch, in as many steps on every rank; and a run killed at a step of epoch 0
or 1 and resumed through the framework's own checkpoint must train exactly the batches
the uninterrupted run trained, step for step."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from test_ddp import finish, launch
from torch.utils.data import DataLoader as TorchLoader
from trainer_worker_draws import draw as weighted_draw

import shardflow as sf
from shardflow.torch import IterableDataset

WORKER = Path(__file__).with_name("trainer_worker.py")
EPOCHS = 2
BATCH = 8


def write_rows(path: Path, n: int) -> str:
    """`n` rows: an id and 8 token ids."""
    tokens = [((np.arange(8) + i) % 64).tolist() for i in range(n)]
    pq.write_table(pa.table({"id": np.arange(n), "input_ids": pa.array(tokens, pa.list_(pa.int64()))}), path, row_group_size=50)
    return str(path)


@pytest.fixture(scope="module")
def rows300(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_rows(tmp_path_factory.mktemp("trainers") / "rows.parquet", 300)


def run(world: int, out: Path, **spec: Any) -> None:
    """One run of `world` processes (or a single process, without a distributed run)."""
    out.mkdir(parents=True, exist_ok=True)
    spec = {"epochs": EPOCHS, "batch_size": BATCH, "workers": 0, "mode": "samples", "out": str(out), **spec}
    env = dict(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    if world > 1:
        env["TORCHELASTIC_RUN_ID"] = "shardflow-test"
    finish(launch(world, spec, worker=WORKER, env=env), out)


def steps(out: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (out / f"log-{rank}.jsonl").read_text().splitlines()]


def check_epochs(out: Path, world: int, rows: int, padding: int = 0) -> None:
    """Every row exactly once per epoch across the ranks (and `padding` rows twice), the
    ranks in lockstep, and a new order each epoch."""
    logs = [steps(out, r) for r in range(world)]
    assert len({len(log) for log in logs}) == 1, [len(log) for log in logs]
    per_epoch: dict[int, list[int]] = collections.defaultdict(list)
    for log in logs:
        for step in log:
            per_epoch[step["epoch"]] += step["ids"]
    assert sorted(per_epoch) == list(range(EPOCHS))
    for epoch, ids in per_epoch.items():
        assert sorted(set(ids)) == list(range(rows)) and len(ids) == rows + padding, (epoch, len(ids), len(set(ids)))
    orders = [[i for step in logs[0] if step["epoch"] == e for i in step["ids"]] for e in range(EPOCHS)]
    assert orders[0] != orders[1]


def check_resumed(whole: Path, resumed: Path, world: int, kill_at: int) -> None:
    """The resumed run trained, after the kill, exactly the uninterrupted run's batches."""
    for rank in range(world):
        expected, got = steps(whole, rank), steps(resumed, rank)
        assert len(got) == len(expected), (rank, len(got), len(expected))
        assert [s["ids"] for s in got[kill_at:]] == [s["ids"] for s in expected[kill_at:]], rank


def test_hf_trainer_on_two_ranks_trains_every_row_and_resumes_exactly(rows300: str, tmp_path: Path) -> None:
    # Trainer's loader goes through accelerate's batch dispatch (rank 0 reads for both):
    # the adapter read only its rank's half there, so half the rows were never trained.
    spec = dict(framework="trainer", data=rows300)
    run(2, tmp_path / "whole", **spec)
    check_epochs(tmp_path / "whole", 2, 300)
    assert len(steps(tmp_path / "whole", 0)) == EPOCHS * 19  # 150 rows a rank, batches of 8
    # Killed in epoch 1 (19 steps an epoch), resumed from Trainer's checkpoint: Trainer
    # sets the epoch and skips the batches it trained, and the adapter's order is a
    # function of (seed, epoch).
    run(2, tmp_path / "killed", kill_at=25, **spec)
    run(2, tmp_path / "killed", resume=True, **spec)
    check_resumed(tmp_path / "whole", tmp_path / "killed", 2, 25)


@pytest.mark.parametrize("framework", ["trainer", "accelerate"])
def test_a_weighted_map_dataset_draws_anew_each_epoch_under_the_framework(
    rows300: str, tmp_path: Path, framework: str
) -> None:
    # Trainer and accelerate set the epoch of their sampler (accelerate's
    # SeedableRandomSampler), never the dataset's: the weighted draw repeated itself
    # every epoch. Each epoch's rows across the ranks must be that epoch's draw.
    seedable = {"accelerate": {"use_seedable_sampler": True}} if framework == "accelerate" else {}  # Trainer's default
    run(2, tmp_path, framework=framework, data=rows300, mode="weighted", workers=2, **seedable)
    logs = [steps(tmp_path, r) for r in range(2)]
    assert len({len(log) for log in logs}) == 1
    for epoch in range(EPOCHS):
        got = collections.Counter(i for log in logs for s in log if s["epoch"] == epoch for i in s["ids"])
        want = collections.Counter(weighted_draw(rows300, epoch))
        # The ranks' samplers pad their last round with at most a batch of repeats.
        assert sum((want - got).values()) <= 2 * BATCH and sum((got - want).values()) <= 2 * BATCH, epoch


def test_hf_trainer_with_workers_counts_its_steps_exactly(tmp_path: Path) -> None:
    # 310 rows, 2 torch workers: each worker's 155 samples end on a short batch of its
    # own, so the loader yields 2 x 20 batches, not ceil(310 / 8) = 39; len() says so and
    # Trainer takes every one (with 39 it would stop short in the last epoch).
    spec = dict(framework="trainer", data=write_rows(tmp_path / "rows.parquet", 310), workers=2)
    run(2, tmp_path / "whole", **spec)
    check_epochs(tmp_path / "whole", 2, 310)
    assert len(steps(tmp_path / "whole", 0)) == EPOCHS * 20
    run(2, tmp_path / "killed", kill_at=7, **spec)  # in epoch 0
    run(2, tmp_path / "killed", resume=True, **spec)
    check_resumed(tmp_path / "whole", tmp_path / "killed", 2, 7)


def test_hf_trainer_on_one_process(rows300: str, tmp_path: Path) -> None:
    # num_train_epochs needs the dataset's length (Trainer refused an adapter without one).
    spec = dict(framework="trainer", data=rows300)
    run(1, tmp_path / "whole", **spec)
    check_epochs(tmp_path / "whole", 1, 300)
    run(1, tmp_path / "killed", kill_at=45, **spec)  # epoch 1 of 38 steps each
    run(1, tmp_path / "killed", resume=True, **spec)
    check_resumed(tmp_path / "whole", tmp_path / "killed", 1, 45)


@pytest.mark.parametrize("mode", ["samples", "batches"])
def test_accelerate_loop_resumes_exactly_through_save_state(rows300: str, tmp_path: Path, mode: str) -> None:
    # Batches: the adapter batches (the torch loader's batch_size=None). accelerate's
    # dispatch fetches the next step's batches before a step saves; the adapter's state
    # is taken back by them.
    spec = dict(framework="accelerate", data=rows300, mode=mode, stateful=True)
    run(2, tmp_path / "whole", **spec)
    check_epochs(tmp_path / "whole", 2, 300)
    run(2, tmp_path / "killed", kill_at=25, **spec)
    run(2, tmp_path / "killed", resume=True, **spec)
    check_resumed(tmp_path / "whole", tmp_path / "killed", 2, 25)


def test_accelerate_without_dispatch_divides_once(rows300: str, tmp_path: Path) -> None:
    # dispatch_batches=False: accelerate's IterableDatasetShard gives each process its
    # slice of what the adapter yields, so the adapter reads the whole epoch on each.
    # (It completes the last round of 2 x 8 rows with the first rows again: 300 -> 304.)
    run(2, tmp_path / "out", framework="accelerate", data=rows300, accelerate={"dispatch_batches": False})
    check_epochs(tmp_path / "out", 2, 300, padding=4)


@pytest.mark.parametrize("framework", ["accelerate", "lightning"])
def test_torch_workers_under_accelerate_and_lightning(rows300: str, tmp_path: Path, framework: str) -> None:
    run(2, tmp_path / "out", framework=framework, data=rows300, workers=2)
    check_epochs(tmp_path / "out", 2, 300)


def test_lightning_ddp_resumes_exactly_from_its_checkpoint(rows300: str, tmp_path: Path) -> None:
    # Lightning checkpoints rank 0's loader state alone; rank 1 resumes from it (its share
    # is as long, so it stood at the same batch).
    spec = dict(framework="lightning", data=rows300, stateful=True)
    run(2, tmp_path / "whole", **spec)
    check_epochs(tmp_path / "whole", 2, 300)
    run(2, tmp_path / "killed", kill_at=25, **spec)
    run(2, tmp_path / "killed", resume=True, **spec)
    check_resumed(tmp_path / "whole", tmp_path / "killed", 2, 25)


def write_sequences(path: Path, n: int) -> str:
    """`n` token sequences of 3 to 40 tokens (ids below 64), with `labels` and each
    token's sequence id (`seq_ids`), for packing."""
    rng = np.random.default_rng(5)
    tokens = [rng.integers(1, 64, size=int(rng.integers(3, 41))).tolist() for _ in range(n)]
    pq.write_table(pa.table({
        "id": np.arange(n),
        "input_ids": pa.array(tokens, pa.list_(pa.int64())),
        "labels": pa.array(tokens, pa.list_(pa.int64())),
        "seq_ids": pa.array([[i] * len(t) for i, t in enumerate(tokens)], pa.list_(pa.int64())),
    }), path, row_group_size=100)
    return str(path)


def test_hf_trainer_trains_padding_free_packs_on_two_ranks(tmp_path: Path) -> None:
    """HF Trainer, 2 ranks, a 2-layer Llama from a config, fed `ds.pack` through
    `shardflow.torch.padding_free` as its data collator, for 2 epochs of steps: every
    sequence trained exactly once per epoch (but the packs accelerate repeats to
    complete its last round), as many steps on each rank, a finite loss."""
    seq_length, batch = 64, 4
    data = write_sequences(tmp_path / "seqs.parquet", 300)
    ds = sf.dataset(data).pack(seq_length, columns=["input_ids", "labels", "seq_ids"], buffer_rows=50)
    packs = [sorted(set(row["seq_ids"])) for row in ds]
    steps_per_epoch = -(-len(packs) // (2 * batch))
    spec = dict(framework="trainer", data=data, mode="packed", seq_length=seq_length, buffer_rows=50,
                batch_size=batch, max_steps=EPOCHS * steps_per_epoch)
    run(2, tmp_path / "out", **spec)
    logs = [steps(tmp_path / "out", r) for r in range(2)]
    assert [len(log) for log in logs] == [EPOCHS * steps_per_epoch] * 2
    for epoch in range(EPOCHS):
        trained = collections.Counter(i for log in logs for s in log if s["epoch"] == epoch for i in s["ids"])
        assert sorted(trained) == list(range(300)), epoch
        # accelerate completes the last round with the epoch's first packs again.
        repeated = trained - collections.Counter(range(300))
        short = 2 * batch * steps_per_epoch - len(packs)
        assert sum(repeated.values()) <= short * max(len(p) for p in packs), epoch
    assert all(np.isfinite(s["loss"]) and s["tokens"] <= batch * seq_length for log in logs for s in log)


def test_a_padding_free_batch_keeps_sequences_apart_in_the_model() -> None:
    """The 2-layer Llama of the trainer test, given a padding-free batch of two packs,
    gives every sequence the logits it gets alone: packed sequences do not attend to
    each other (TRL #1230), with no attention mask and positions restarting at 0; and
    they do when the model keeps a cache, as the README warns."""
    from trainer_worker import tiny_llama

    from shardflow.torch import padding_free

    model = tiny_llama().eval()
    ds = sf.from_dict({"input_ids": [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]}).pack(6)
    packed = next(iter(sf.DataLoader(ds, batch_size=2, output="torch")))
    flat = padding_free(packed)
    with torch.no_grad():
        # Without a cache (training): with one, transformers does not look for packed
        # sequences in the positions.
        logits = model(input_ids=flat["input_ids"], position_ids=flat["position_ids"], use_cache=False).logits[0]
        start = 0
        for n in torch.cat([torch.as_tensor(x) for x in packed["seq_lengths"]]).tolist():
            alone = model(input_ids=flat["input_ids"][:, start:start + n], use_cache=False).logits[0]
            torch.testing.assert_close(logits[start:start + n], alone)
            start += n
    assert start == flat["input_ids"].shape[1] == 10
    with torch.no_grad():
        cached = model(input_ids=flat["input_ids"], position_ids=flat["position_ids"], use_cache=True).logits[0]
    assert not torch.allclose(cached, logits)


# ---------------------------------------------------------------------------------------
# In one process.


def uneven(n: int = 103) -> sf.Dataset:
    return sf.from_dict({"id": np.arange(n), "tokens": np.arange(n * 4).reshape(n, 4).tolist()})


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("adapter_batch", [None, 8], ids=["samples", "batches"])
def test_len_is_what_the_torch_loader_yields(workers: int, adapter_batch: int | None) -> None:
    adapter = IterableDataset(uneven(), batch_size=adapter_batch, rank=1, world_size=2)
    loader = TorchLoader(
        adapter, batch_size=None if adapter_batch else 5, num_workers=workers,
        multiprocessing_context="fork" if workers else None,
    )
    expected = len(loader)
    assert len(list(loader)) == expected
    assert len(adapter) == (52 if adapter_batch is None else 7)  # rank 1's share, padded to 52 rows


def test_a_state_from_before_any_read_names_accelerates_shared_file() -> None:
    # Under accelerate's batch dispatch, process 1 never reads; its state (taken when
    # prepare() made its loader) is written to the same dl_state_dict.bin as process 0's.
    import accelerate  # noqa: F401  (the message names it only where it is imported)

    state = IterableDataset(uneven(), shuffle=True).state_dict()
    assert state["position"] is None
    with pytest.raises(ValueError, match="before its worker read anything.*dl_state_dict.bin"):
        IterableDataset(uneven(), shuffle=True).load_state_dict(state)


def test_batching_twice_is_an_error() -> None:
    with pytest.raises(ValueError, match="batches them again.*batch_size=None"):
        next(iter(TorchLoader(IterableDataset(uneven(), batch_size=8), batch_size=4)))


def test_token_lists_of_one_length_are_one_tensor() -> None:
    batch = next(iter(sf.DataLoader(uneven(), batch_size=6, output="torch")))
    assert isinstance(batch["tokens"], torch.Tensor) and batch["tokens"].shape == (6, 4)
    ragged = sf.from_list([{"tokens": [1, 2]}, {"tokens": [3]}])
    out = next(iter(sf.DataLoader(ragged, batch_size=2, output="torch")))["tokens"]
    assert [t.tolist() for t in out] == [[1, 2], [3]]
