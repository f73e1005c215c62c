"""Writing shards: ``Dataset.write`` against each format's usual Python writer, on the
same rows (the Parquet workload of ``benches/rss_epochs.py``: a 784-byte image, a label and
a caption per row), read from Parquet and written to local disk.

    python benches/write.py [--rows 200000] [--repeats 3]

Peers: ``pyarrow.parquet.write_table`` on the table read whole (in memory first, so the
peer's read is not timed), ``webdataset.ShardWriter`` fed from pyarrow batches (the image
as ``.npy``, as shardflow writes it), and ``tf.io.TFRecordWriter`` of ``tf.train.Example``
protos when tensorflow is installed (images as int64 lists, as shardflow writes them).
Each writes shards of 50,000 rows. Reported: median seconds and MB/s (of the files
written), shardflow's speed relative to the peer on the same format.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

import shardflow as sf
from rss_epochs import write as make_source

ROWS_PER_SHARD = 50_000


def size_of(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if not p.name.startswith("_"))


def shardflow_writer(fmt: str) -> Callable[[Path, Path], None]:
    def run(source: Path, out: Path) -> None:
        ds = sf.dataset(source)
        if fmt == "webdataset":  # a sample's files are typed by extension, as webdataset's writer does
            ds = ds.rename_columns({"image": "image.npy", "label": "cls", "caption": "txt"})
        ds.write(out, fmt, max_rows_per_shard=ROWS_PER_SHARD)

    return run


def rows(table: object) -> Iterator[tuple[np.ndarray, int, str]]:
    """(image, label, caption) per row, for the Python writers."""
    for batch in table.to_batches():
        images = batch.column("image").flatten().to_numpy().reshape(batch.num_rows, -1)
        yield from zip(images, batch.column("label").to_numpy(), batch.column("caption").to_pylist())


def pyarrow_parquet(source: Path, out: Path) -> Callable[[], None]:
    table = pq.read_table(source)

    def run() -> None:
        out.mkdir()
        for i, start in enumerate(range(0, table.num_rows, ROWS_PER_SHARD)):
            pq.write_table(table.slice(start, ROWS_PER_SHARD), out / f"part-{i:05d}.parquet")

    return run


def webdataset_writer(source: Path, out: Path) -> Callable[[], None]:
    import webdataset as wds

    table = pq.read_table(source)

    def run() -> None:
        out.mkdir()
        with wds.ShardWriter(str(out / "part-%05d.tar"), maxcount=ROWS_PER_SHARD, verbose=0) as sink:
            for row, (image, label, caption) in enumerate(rows(table)):
                sink.write({"__key__": f"{row:09d}", "image.npy": image, "cls": int(label), "txt": caption})

    return run


def tf_writer(source: Path, out: Path) -> Callable[[], None]:
    import tensorflow as tf

    table = pq.read_table(source)

    def run() -> None:
        out.mkdir()
        writer = None
        for row, (image, label, caption) in enumerate(rows(table)):
            if row % ROWS_PER_SHARD == 0:
                if writer is not None:
                    writer.close()
                writer = tf.io.TFRecordWriter(str(out / f"part-{row // ROWS_PER_SHARD:05d}.tfrecord"))
            feature = {
                "image": tf.train.Feature(int64_list=tf.train.Int64List(value=image)),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                "caption": tf.train.Feature(bytes_list=tf.train.BytesList(value=[caption.encode()])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        if writer is not None:
            writer.close()

    return run


def timed(run: Callable[[], None], out: Path, repeats: int) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(repeats):
        shutil.rmtree(out, ignore_errors=True)
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
        size = size_of(out)
    return statistics.median(times), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shardflow-write-") as tmp:
        base = Path(tmp)
        source = base / "source"
        source.mkdir()
        make_source(source, args.rows)
        peers: dict[str, tuple[str, Callable[[Path, Path], Callable[[], None]]]] = {
            "parquet": ("pyarrow.parquet.write_table", pyarrow_parquet),
            "webdataset": ("webdataset.ShardWriter", webdataset_writer),
        }
        try:
            import tensorflow  # noqa: F401

            peers["tfrecord"] = ("tf.io.TFRecordWriter", tf_writer)
        except ImportError:
            pass
        print(f"{args.rows:,} rows, shards of {ROWS_PER_SHARD:,}; median of {args.repeats}")
        print("| format | shardflow s | MB/s | peer | peer s | MB/s | ratio |")
        print("|---|---|---|---|---|---|---|")
        for fmt in ("parquet", "webdataset", "tfrecord", "jsonl", "npz"):
            out = base / f"sf-{fmt}"
            ours, size = timed(lambda: shardflow_writer(fmt)(source, out), out, args.repeats)
            row = f"| {fmt} | {ours:.2f} | {size / 1e6 / ours:,.0f} |"
            if fmt in peers:
                name, make = peers[fmt]
                peer_out = base / f"peer-{fmt}"
                theirs, peer_size = timed(make(source, peer_out), peer_out, args.repeats)
                row += f" {name} | {theirs:.2f} | {peer_size / 1e6 / theirs:,.0f} | {theirs / ours:.1f}x |"
            else:
                row += " | | | |"
            print(row)


if __name__ == "__main__":
    main()
