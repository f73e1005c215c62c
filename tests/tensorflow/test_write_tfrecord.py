"""TFRecord shards that `Dataset.write` makes read back through tf.data and
`tf.io.parse_example` as the rows they came from (Debian's Fashion-MNIST)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import FASHION_MNIST, read_idx

import shardflow as sf


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_written_tfrecords_parse_in_tensorflow(tmp_path: Path, compression: str | None) -> None:
    images = read_idx(FASHION_MNIST / "t10k-images-idx3-ubyte.gz")[:3000]
    labels = read_idx(FASHION_MNIST / "t10k-labels-idx1-ubyte.gz")[:3000].astype(np.int64)
    n = len(labels)
    source = sf.from_dict(
        {
            "image": [img.tobytes() for img in images],
            "label": labels,
            "mean": images.reshape(n, -1).mean(axis=1).astype(np.float32),
            "corners": images[:, [0, 0, -1, -1], [0, -1, 0, -1]].astype(np.int64),
            "tags": [["even" if i % 2 == 0 else "odd"] * (i % 3) for i in range(n)],
        }
    )
    manifest = source.write(tmp_path, "tfrecord", max_rows_per_shard=1000, compression=compression)
    files = [str(tmp_path / s["path"]) for s in manifest["shards"]]
    assert len(files) == 3
    spec = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "mean": tf.io.FixedLenFeature([], tf.float32),
        "corners": tf.io.FixedLenFeature([4], tf.int64),
        "tags": tf.io.VarLenFeature(tf.string),
    }
    records = tf.data.TFRecordDataset(files, compression_type="GZIP" if compression else "")
    parsed = next(iter(records.batch(n).map(lambda r: tf.io.parse_example(r, spec))))
    decoded = tf.io.decode_raw(parsed["image"], tf.uint8).numpy().reshape(n, 28, 28)
    np.testing.assert_array_equal(decoded, images)
    np.testing.assert_array_equal(parsed["label"].numpy(), labels)
    np.testing.assert_array_equal(parsed["mean"].numpy(), images.reshape(n, -1).mean(axis=1).astype(np.float32))
    np.testing.assert_array_equal(parsed["corners"].numpy(), images[:, [0, 0, -1, -1], [0, -1, 0, -1]])
    tags = tf.sparse.to_dense(parsed["tags"], default_value=b"").numpy()
    for i in range(n):
        assert [t for t in tags[i] if t] == [b"even" if i % 2 == 0 else b"odd"] * (i % 3)
