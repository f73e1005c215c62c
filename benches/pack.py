"""What packing adds to tokenizing, and TRL's packing of the same rows, in one run.

    python benches/pack.py [--conversations 20000] [--repeats 3] [--seq-length 2048]

The corpus and tokenizer of benches/chat_tokens.py. Runners:

- ``tokenize``: ``ds.apply_chat_template(tok, labels=True)`` through ``sf.DataLoader``;
- ``tokenize + pack``: the same, then ``ds.pack(seq_length)`` (bfd, windows of 1,000);
- ``trl pack_dataset``: TRL's ``pack_dataset`` over a ``datasets.Dataset`` of the same
  tokens (made beforehand, not timed), iterated.

And a shuffled, packed epoch of the same tokens, written beforehand to Parquet (pyarrow's
defaults) and read back by each side:

- ``2 ranks, shuffled + packed``: two processes at once (rank 0 and 1 of 2), each
  iterating ``sf.dataset(parquet).shuffle(seed=0).pack(seq_length)`` through
  ``sf.DataLoader(shuffle=True)``: the wall time from telling both (started, imports
  done) to begin until both have finished the epoch;
- ``2 ranks, decoded_cache``: the same with ``decoded_cache=`` (its files written by a
  first epoch, timed once and printed, as ``datasets``' Arrow copy is made beforehand);
- ``trl, shuffled + packed``: ``pack_dataset`` of ``datasets``' ``load_dataset("parquet")``
  of the same file (loaded and cached beforehand, not timed) after its ``shuffle(seed=0)``,
  then a ``datasets`` iteration of the packs.

Medians of the repeats are printed, with packing's share of the tokenize + pack time and
the ratio of the two shuffled, packed epochs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import chat_tokens as bench  # noqa: E402

import shardflow as sf  # noqa: E402


#: One rank of the shuffled, packed epoch: started and imported beforehand (as TRL's side
#: has its imports and its loaded dataset beforehand), it reads the epoch when told to and
#: prints the packs it was given.
RANK = """
import sys
import shardflow as sf
print("ready", flush=True)
sys.stdin.readline()
ds = sf.dataset({parquet!r}, decoded_cache={cache!r}).shuffle(seed=0).pack({seq_length})
loader = sf.DataLoader(ds, batch_size=16, rank=int(sys.argv[1]), world_size=2, shuffle=True, seed=0)
print(sum(len(b["input_ids"]) for b in loader), flush=True)
"""


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

        # datasets caches a map's output by fingerprint: each run packs anew.
        fresh = {"load_from_cache_file": False}

        def trl() -> int:
            packed = pack_dataset(reference, args.seq_length, "bfd", map_kwargs=fresh)
            return sum(len(b["input_ids"]) for b in packed.iter(batch_size=16))

        parquet = str(Path(directory) / "tokens.parquet")
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table(columns), parquet)
        on_disk = datasets.load_dataset("parquet", data_files=parquet, split="train", cache_dir=str(Path(directory) / "hf"))

        def two_ranks(cache: str | None = None) -> tuple[int, float]:
            """Both ranks' packs, and the wall time from telling both to start until both
            have printed theirs (reading through `cache` where given)."""
            script = RANK.format(parquet=parquet, seq_length=args.seq_length, cache=cache)
            ranks = [subprocess.Popen([sys.executable, "-c", script, str(r)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                     for r in range(2)]
            for p in ranks:
                assert p.stdout is not None and p.stdout.readline().strip() == "ready"
            start = time.perf_counter()
            for p in ranks:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            packs = [int(p.stdout.readline()) for p in ranks if p.stdout is not None]
            elapsed = time.perf_counter() - start
            for p in ranks:
                if p.wait() != 0:
                    sys.exit(f"rank failed: {p.returncode}")
            return sum(packs), elapsed

        # The decoded copy `datasets` reads (made by load_dataset above, untimed): with
        # decoded_cache=, the first epoch makes shardflow's, timed here once.
        cache = str(Path(directory) / "decoded")
        _, cold = two_ranks(cache)

        def trl_shuffled() -> int:
            packed = pack_dataset(on_disk.shuffle(seed=0, load_from_cache_file=False), args.seq_length, "bfd", map_kwargs=fresh)
            return sum(len(b["input_ids"]) for b in packed.iter(batch_size=16))

        runners = {
            "tokenize": tokenize, "tokenize + pack": tokenize_and_pack, "trl pack_dataset": trl,
            "2 ranks, shuffled + packed": two_ranks, "2 ranks, decoded_cache": lambda: two_ranks(cache),
            "trl, shuffled + packed": trl_shuffled,
        }
        times: dict[str, list[float]] = {name: [] for name in runners}
        counts: dict[str, int] = {}
        for _ in range(args.repeats):
            for name, run in runners.items():
                start = time.perf_counter()
                out = run()
                elapsed = time.perf_counter() - start
                # The 2-rank runner times its epoch itself (process start left out).
                counts[name], elapsed = out if isinstance(out, tuple) else (out, elapsed)
                times[name].append(elapsed)
        # The same rows in the same order, windows of 1,000: the same packs.
        assert counts["tokenize + pack"] == counts["trl pack_dataset"], counts
        medians = {name: statistics.median(t) for name, t in times.items()}
        n = args.conversations
        print(f"{n:,} conversations into {counts['trl pack_dataset']:,} packs of at most {args.seq_length} tokens")
        for name, median in medians.items():
            print(f"{name:18s} median {median:6.2f} s  {n / median:8,.0f} conversations/s")
        extra = medians["tokenize + pack"] - medians["tokenize"]
        print(f"packing adds {extra:.2f} s, {extra / medians['tokenize']:.1%} of tokenizing")
        print(f"2 ranks: {counts['2 ranks, shuffled + packed']:,} packs (padded to equal ranks), TRL {counts['trl, shuffled + packed']:,}; "
              f"{medians['trl, shuffled + packed'] / medians['2 ranks, shuffled + packed']:.2f}x TRL + datasets")
        print(f"with decoded_cache= (written by a first epoch of {cold:.2f} s): "
              f"{medians['trl, shuffled + packed'] / medians['2 ranks, decoded_cache']:.2f}x TRL + datasets")


if __name__ == "__main__":
    main()
