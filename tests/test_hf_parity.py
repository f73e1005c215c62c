"""The `datasets` cookbook calls, run against Hugging Face `datasets` (the reference) and
shardflow on the same JSONL files, with nested chat records: locally, and with shardflow
reading the same files from S3 (SeaweedFS)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import shardflow as sf
from servers import Seaweed

datasets = pytest.importorskip("datasets")

SIZES = [120, 0, 377, 64, 211]


def plain(value: object) -> object:
    """A value as plain Python (numpy scalars and arrays become ints, floats, lists)."""
    return json.loads(json.dumps(value, default=lambda o: o.tolist()))


def rows_of(ds: object) -> list[dict]:
    return [plain(dict(r)) for r in ds]  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def chat_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("chat")
    files = []
    n = 0
    for f, size in enumerate(SIZES):
        path = root / f"chat-{f:02d}.jsonl"
        with open(path, "w") as out:
            for _ in range(size):
                turns = [
                    {"role": "user" if t % 2 == 0 else "assistant", "content": f"turn {t} of {n}"}
                    for t in range(1 + n % 4)
                ]
                out.write(json.dumps({"id": n, "score": n * 0.25, "messages": turns}) + "\n")
                n += 1
        files.append(path)
    return files


@pytest.fixture(scope="module", params=["local", "s3"])
def pair(request: pytest.FixtureRequest, chat_files: list[Path]) -> tuple[object, sf.Dataset]:
    """(the HF dataset, the shardflow dataset) over the same records."""
    reference = datasets.load_dataset(
        "json", data_files=[str(p) for p in chat_files], split="train"
    )
    if request.param == "local":
        ours = sf.dataset([str(p) for p in chat_files])
    else:
        seaweed: Seaweed = request.getfixturevalue("seaweed")
        client = seaweed.client()
        client.create_bucket(Bucket="chat")
        for path in chat_files:
            client.upload_file(str(path), "chat", path.name)
        ours = sf.dataset("s3://chat/chat-*.jsonl", storage_options=seaweed.storage_options())
    return reference, ours


def test_rows_len_and_indexing(pair: tuple) -> None:
    ref, ours = pair
    assert len(ours) == len(ref) == sum(SIZES)
    assert rows_of(ours) == rows_of(ref)
    for i in [0, 1, 119, 120, 500, len(ref) - 1, -1, -len(ref)]:
        assert plain(ours[i]) == plain(ref[i]), i
    assert plain(ours[10:20]) == plain(ref[10:20])
    assert plain(ours[700:]) == plain(ref[700:])


def test_take_skip_select_filter_map(pair: tuple) -> None:
    ref, ours = pair
    assert rows_of(ours.take(130)) == rows_of(ref.take(130))
    assert rows_of(ours.skip(600)) == rows_of(ref.skip(600))
    assert rows_of(ours.select(range(100, 356))) == rows_of(ref.select(range(100, 356)))
    picks = [5, 700, 3, 3, 400, 771]
    assert rows_of(ours.select(picks)) == rows_of(ref.select(picks))
    assert rows_of(ours.select(np.array(picks))) == rows_of(ref.select(picks))

    def long_chat(r: dict) -> bool:
        return len(r["messages"]) >= 3

    assert rows_of(ours.filter(long_chat)) == rows_of(ref.filter(long_chat))

    def turns(r: dict) -> dict:
        return {"turns": len(r["messages"]), "id2": r["id"] * 2}

    mapped_ref = ref.map(turns).select_columns(["id2", "turns"])
    mapped = ours.map(turns).select_columns(["id2", "turns"])
    assert rows_of(mapped) == rows_of(mapped_ref)


def test_concatenate_and_column_verbs(pair: tuple) -> None:
    ref, ours = pair
    both_ref = datasets.concatenate_datasets([ref.select(range(50)), ref.select(range(700, 772))])
    both = sf.concatenate([ours.select(range(50)), ours.select(range(700, 772))])
    assert len(both) == len(both_ref)
    assert rows_of(both) == rows_of(both_ref)
    assert plain(both[60]) == plain(both_ref[60])
    assert rows_of(ours.select_columns(["messages", "id"])) == rows_of(
        ref.select_columns(["messages", "id"])
    )
    assert rows_of(ours.remove_columns(["messages"])) == rows_of(ref.remove_columns(["messages"]))
    renamed = ours.rename_columns({"id": "key"})
    assert rows_of(renamed) == rows_of(ref.rename_columns({"id": "key"}))
    assert renamed.schema.names == ["key", "score", "messages"]


def test_random_verbs_agree_in_size_and_rows(pair: tuple) -> None:
    ref, ours = pair
    ids = sorted(r["id"] for r in rows_of(ref))
    shuffled = rows_of(ours.shuffle(seed=0))
    assert len(shuffled) == len(ids) and sorted(r["id"] for r in shuffled) == ids
    assert rows_of(ours.shuffle(seed=0)) == shuffled
    assert [r["id"] for r in rows_of(ours.shuffle(seed=1))] != [r["id"] for r in shuffled]

    split_ref = ref.train_test_split(test_size=100, seed=0)
    split = ours.train_test_split(test_size=100, seed=0)
    for name in ("train", "test"):
        assert len(split[name]) == len(split_ref[name])
    train = {r["id"] for r in rows_of(split["train"])}
    test = {r["id"] for r in rows_of(split["test"])}
    assert not train & test and sorted(train | test) == ids
    again = ours.train_test_split(test_size=100, seed=0)
    assert {r["id"] for r in rows_of(again["test"])} == test


def test_streaming_shuffle_then_batch(pair: tuple, chat_files: list[Path]) -> None:
    ref, ours = pair
    streamed = datasets.load_dataset(
        "json", data_files=[str(p) for p in chat_files], split="train", streaming=True
    )
    ref_batches = list(streamed.shuffle(seed=0, buffer_size=100).batch(batch_size=64, drop_last_batch=True))
    batched = ours.shuffle(seed=0, buffer_size=100).batch(batch_size=64, drop_last_batch=True)
    batches = list(batched)
    assert [len(b["id"]) for b in batches] == [len(b["id"]) for b in ref_batches]
    assert batched.column_names == list(ref_batches[0])
    first = next(iter(ours.shuffle(seed=0, buffer_size=100).batch(64, drop_last_batch=True)))
    assert list(first["id"]) == list(batches[0]["id"])
    seen = [i for b in batches for i in list(b["id"])]
    assert len(set(seen)) == len(seen) == len(ref) // 64 * 64
