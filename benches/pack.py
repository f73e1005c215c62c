"""What packing adds to tokenizing, and TRL's packing of the same rows, in one run.

    python benches/pack.py [--conversations 20000] [--repeats 3] [--seq-length 2048]

The corpus and tokenizer of benches/chat_tokens.py. Runners:

- ``tokenize``: ``ds.apply_chat_template(tok, labels=True)`` through ``sf.DataLoader``;
- ``tokenize + pack``: the same, then ``ds.pack(seq_length)`` (bfd, windows of 1,000);
- ``trl pack_dataset``: TRL's ``pack_dataset`` over a ``datasets.Dataset`` of the same
  tokens (made beforehand, not timed), iterated.

Medians of the repeats are printed, with packing's share of the tokenize + pack time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import chat_tokens as bench  # noqa: E402

import shardflow as sf  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--conversations", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seq-length", type=int, default=2048)
    args = parser.parse_args()
    import datasets
    from trl.data_utils import pack_dataset

    tok = sf.Tokenizer.from_pretrained(bench.DEEPSEEK)
    source = bench.TEMPLATE.read_text()
    with tempfile.TemporaryDirectory() as directory:
        paths = bench.write(directory, bench.conversations(args.conversations))

        def tokenized() -> sf.Dataset:
            return sf.dataset(paths).apply_chat_template(tok, chat_template=source, labels=True, remove_columns=["messages"])

        rows = [dict(r) for r in tokenized()]
        columns = {k: [list(r[k]) for r in rows] for k in ("input_ids", "assistant_masks", "labels")}
        reference = datasets.Dataset.from_dict(columns)

        def tokenize() -> int:
            return sum(len(b["input_ids"]) for b in sf.DataLoader(tokenized(), batch_size=256))

        def tokenize_and_pack() -> int:
            packed = tokenized().pack(args.seq_length)
            return sum(len(b["input_ids"]) for b in sf.DataLoader(packed, batch_size=16))

        def trl() -> int:
            packed = pack_dataset(reference, args.seq_length, "bfd")
            return sum(len(b["input_ids"]) for b in packed.iter(batch_size=16))

        runners = {"tokenize": tokenize, "tokenize + pack": tokenize_and_pack, "trl pack_dataset": trl}
        times: dict[str, list[float]] = {name: [] for name in runners}
        counts: dict[str, int] = {}
        for _ in range(args.repeats):
            for name, run in runners.items():
                start = time.perf_counter()
                counts[name] = run()
                times[name].append(time.perf_counter() - start)
        # The same rows in the same order, windows of 1,000: the same packs.
        assert counts["tokenize + pack"] == counts["trl pack_dataset"], counts
        medians = {name: statistics.median(t) for name, t in times.items()}
        n = args.conversations
        print(f"{n:,} conversations into {counts['trl pack_dataset']:,} packs of at most {args.seq_length} tokens")
        for name, median in medians.items():
            print(f"{name:18s} median {median:6.2f} s  {n / median:8,.0f} conversations/s")
        extra = medians["tokenize + pack"] - medians["tokenize"]
        print(f"packing adds {extra:.2f} s, {extra / medians['tokenize']:.1%} of tokenizing")


if __name__ == "__main__":
    main()
