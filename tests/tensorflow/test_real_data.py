"""Real data: Debian's Fashion-MNIST, converted by each format's reference writer
(pyarrow, TensorFlow, numpy, webdataset), reads back through shardflow identically."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
import webdataset as wds
from conftest import FASHION_MNIST, read_idx

import shardflow as sf

@pytest.fixture(scope="module")
def fashion() -> tuple[np.ndarray, np.ndarray]:
    images = read_idx(FASHION_MNIST / "t10k-images-idx3-ubyte.gz")
    labels = read_idx(FASHION_MNIST / "t10k-labels-idx1-ubyte.gz").astype(np.int64)
    assert images.shape == (10_000, 28, 28) and labels.shape == (10_000,)
    assert sorted(set(labels.tolist())) == list(range(10))
    return images, labels


def write_all(directory: Path, images: np.ndarray, labels: np.ndarray) -> dict[str, sf.Dataset]:
    n = len(labels)
    half = n // 2
    # Parquet (pyarrow): images as fixed-size lists of 784 bytes, two files.
    for part, rows in enumerate((slice(0, half), slice(half, n))):
        flat = pa.array(images[rows].reshape(-1))
        pq.write_table(
            pa.table({"image": pa.FixedSizeListArray.from_arrays(flat, 784), "label": labels[rows]}),
            directory / f"fmnist-{part}.parquet",
            row_group_size=1000,
        )
    # TFRecord (TensorFlow): tf.train.Example with the raw image bytes.
    with tf.io.TFRecordWriter(str(directory / "fmnist.tfrecord"), tf.io.TFRecordOptions(compression_type="GZIP")) as w:
        for image, label in zip(images, labels):
            feature = {
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
            }
            w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    # NPZ (numpy): the arrays side by side.
    np.savez_compressed(directory / "fmnist.npz", image=images, label=labels)
    # WebDataset tar (webdataset): one sample per image.
    with wds.TarWriter(str(directory / "fmnist.tar")) as sink:
        for i, (image, label) in enumerate(zip(images, labels)):
            sink.write({"__key__": f"test/{i:05d}", "npy": image, "cls": int(label)})
    return {
        "parquet": sf.dataset(str(directory / "fmnist-{0..1}.parquet")),
        "tfrecord": sf.dataset(
            str(directory / "fmnist.tfrecord"),
            features={"image": sf.FixedLen((), "bytes"), "label": sf.FixedLen((), "int64")},
        ),
        "npz": sf.dataset(str(directory / "fmnist.npz"), format_options={"mode": "rows"}),
        "webdataset": sf.dataset(str(directory / "fmnist.tar"), columns=["npy", "cls"]),
    }


def as_images(fmt: str, column: np.ndarray) -> np.ndarray:
    if fmt == "tfrecord":
        return np.stack([np.frombuffer(b, np.uint8) for b in column]).reshape(-1, 28, 28)
    return np.asarray(column).reshape(-1, 28, 28)


def test_four_formats_give_identical_images_and_labels(tmp_path: Path, fashion: tuple[np.ndarray, np.ndarray]) -> None:
    images, labels = fashion
    datasets = write_all(tmp_path, images, labels)
    for fmt, ds in datasets.items():
        got_images, got_labels = [], []
        for batch in sf.DataLoader(ds, batch_size=1000):
            columns = list(batch.values())
            got_images.append(as_images(fmt, columns[0]))
            got_labels.append(np.asarray(columns[1]))
        np.testing.assert_array_equal(np.concatenate(got_images), images, err_msg=fmt)
        np.testing.assert_array_equal(np.concatenate(got_labels), labels, err_msg=fmt)
    # Shuffled, each format still delivers every image exactly once.
    for fmt, ds in datasets.items():
        seen = np.concatenate([np.asarray(list(b.values())[1]) for b in sf.DataLoader(ds, batch_size=777, shuffle=True, seed=5)])
        assert np.bincount(seen).tolist() == np.bincount(labels).tolist(), fmt
