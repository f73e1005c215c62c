"""Side by side, in one run, on the same files: an epoch in batches of 256, ending in
numpy, with shardflow and with each format's reference reader.

- TFRecord of tf.train.Example {image: 784 bytes, label: int64}: tf.data
  (TFRecordDataset -> batch -> parse_example -> numpy) vs shardflow (features=).
- WebDataset tar {jpg: 8 KB, cls, json}: webdataset (.decode() -> to_tuple -> batched)
  vs shardflow.
- NPZ (np.savez, 60k x 28 x 28 uint8 + labels): np.load + slicing vs shardflow rows mode.

    python benches/peer_formats.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np

import shardflow as sf

BATCH = 256


def write_tfrecord(path: str, n: int) -> None:
    import tensorflow as tf

    rng = np.random.default_rng(0)
    with tf.io.TFRecordWriter(path) as w:
        for i in range(n):
            feature = {
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[rng.integers(0, 255, 784, np.uint8).tobytes()])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 10])),
            }
            w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def write_tar(path: str, n: int) -> None:
    import webdataset as wds

    with wds.TarWriter(path) as sink:
        for i in range(n):
            sink.write({"__key__": f"s{i:06d}", "jpg": bytes([i % 256]) * 8192, "cls": i % 10, "json": {"id": i, "tags": ["a", "b"]}})


def write_npz(path: str, n: int) -> None:
    rng = np.random.default_rng(0)
    np.savez(path, image=rng.integers(0, 255, (n, 28, 28), np.uint8), label=np.arange(n) % 10)


def tf_epoch(path: str) -> int:
    import tensorflow as tf

    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    ds = tf.data.TFRecordDataset(path).batch(BATCH).map(lambda x: tf.io.parse_example(x, spec), num_parallel_calls=tf.data.AUTOTUNE)
    return sum(len(b["label"]) for b in ds.prefetch(tf.data.AUTOTUNE).as_numpy_iterator())


def wds_epoch(path: str) -> int:
    import webdataset as wds

    ds = wds.WebDataset(path, shardshuffle=False).decode().to_tuple("jpg", "cls", "json").batched(BATCH)
    return sum(len(batch[1]) for batch in ds)


def npz_epoch(path: str) -> int:
    with np.load(path) as archive:
        images, labels = archive["image"], archive["label"]
    return sum(len(labels[i : i + BATCH]) + 0 * images[i : i + BATCH].size for i in range(0, len(labels), BATCH))


def shardflow_epoch(ds: sf.Dataset) -> int:
    return sum(b.num_rows for b in sf.DataLoader(ds, batch_size=BATCH))


def measure(runners: dict[str, Callable[[], int]], rows: int, repeats: int, size_mb: float) -> None:
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, run in runners.items():  # interleaved, so machine noise hits both
            start = time.perf_counter()
            assert run() == rows, name
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, median in medians.items():
        print(f"  {name:34s} {median * 1000:8.1f} ms  {rows / median:12,.0f} records/s  {size_mb / median:8.1f} MB/s")
    names = list(medians)
    print(f"  shardflow speedup: {medians[names[1]] / medians[names[0]]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        cases = [
            ("TFRecord + tf.train.Example", "x.tfrecord", 100_000, write_tfrecord, tf_epoch,
             dict(features={"image": sf.FixedLen((), "bytes"), "label": sf.FixedLen((), "int64")})),
            ("WebDataset tar", "x.tar", 20_000, write_tar, wds_epoch, dict(columns=["jpg", "cls", "json"])),
            ("NPZ (np.savez)", "x.npz", 60_000, write_npz, npz_epoch, dict(format_options={"mode": "rows"})),
        ]
        print(f"cpus={os.cpu_count()}, batch_size={BATCH}, medians of {args.repeats} epochs")
        for title, name, rows, write, peer, options in cases:
            path = os.path.join(d, name)
            write(path, rows)
            size_mb = os.path.getsize(path) / 1e6
            ds = sf.dataset(path, **options)
            print(f"{title}: {rows:,} records, {size_mb:.1f} MB")
            measure({"shardflow": lambda ds=ds: shardflow_epoch(ds), peer.__name__.replace("_epoch", ""): lambda p=path, f=peer: f(p)}, rows, args.repeats, size_mb)


if __name__ == "__main__":
    main()
