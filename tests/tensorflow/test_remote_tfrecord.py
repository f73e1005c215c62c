"""TFRecord (written by TensorFlow) reads the same from S3 and HTTP as from disk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf
from conftest import Seaweed

import shardflow as sf


def test_tfrecord_from_s3_and_http_equals_local(tmp_path: Path, seaweed: Seaweed) -> None:
    path = tmp_path / "data.tfrecord.gz"
    with tf.io.TFRecordWriter(str(path), tf.io.TFRecordOptions(compression_type="GZIP")) as w:
        for i in range(500):
            feature = {
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=np.arange(i % 7, dtype=np.float32))),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
            }
            w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    client = seaweed.client()
    client.create_bucket(Bucket="tfrecords")
    client.upload_file(str(path), "tfrecords", "data.tfrecord.gz")
    local = list(sf.dataset(str(path)))
    assert [r["label"] for r in local] == list(range(500))
    assert list(sf.dataset("s3://tfrecords/data.tfrecord.gz", storage_options=seaweed.storage_options())) == local
    assert list(sf.dataset(f"{seaweed.filer_url}/buckets/tfrecords/data.tfrecord.gz")) == local
