"""The shardflow runner of benches/chat_tokens.py alone, for a profiler:

    perf record --call-graph dwarf,16384 -F 149 -- python benches/chat_tokens_profile.py
    perf report --children --sort sym -g none

Two passes of ``ds.apply_chat_template(tok)`` through ``sf.DataLoader`` over the bench's
corpus (20,000 conversations), each printing its rate.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import chat_tokens as bench  # noqa: E402

import shardflow as sf  # noqa: E402


def main() -> None:
    rows = bench.conversations(20_000)
    tok = sf.Tokenizer.from_pretrained(bench.DEEPSEEK)
    source = bench.TEMPLATE.read_text()
    with tempfile.TemporaryDirectory() as directory:
        paths = bench.write(directory, rows)
        for _ in range(2):
            start = time.perf_counter()
            ds = sf.dataset(paths).apply_chat_template(tok, chat_template=source, remove_columns=["messages"])
            n = sum(len(b["input_ids"]) for b in sf.DataLoader(ds, batch_size=bench.BATCH))
            print(f"{n:,} conversations, {n / (time.perf_counter() - start):,.0f} conversations/s", flush=True)


if __name__ == "__main__":
    main()
