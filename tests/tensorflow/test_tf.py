"""The TensorFlow adapter: specs from the schema, values round-tripped, Keras training."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
from conftest import FASHION_MNIST, read_idx

import shardflow as sf
from shardflow.tf import to_tf_dataset


def write_mixed(path: Path, n: int = 100) -> pa.Table:
    table = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "score": pa.array(np.linspace(0, 1, n, dtype=np.float32)),
            "image": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(n * 6, dtype=np.uint8)), 6),
            "name": [f"name-{i}-ü" for i in range(n)],
            "blob": [bytes([i % 256]) * (i % 4) for i in range(n)],
            "tags": pa.array([list(range(i % 5)) for i in range(n)], pa.list_(pa.int32())),
            "meta": [{"a": i, "b": float(i) / 2} for i in range(n)],
        }
    )
    pq.write_table(table, path, row_group_size=30)
    return table


def test_element_spec_matches_the_schema(tmp_path: Path) -> None:
    write_mixed(tmp_path / "m.parquet")
    batched = to_tf_dataset(sf.DataLoader(sf.dataset(str(tmp_path / "m.parquet")), batch_size=16))
    spec = batched.element_spec
    assert spec["id"] == tf.TensorSpec((None,), tf.int64)
    assert spec["score"] == tf.TensorSpec((None,), tf.float32)
    assert spec["image"] == tf.TensorSpec((None, 6), tf.uint8)
    assert spec["name"] == tf.TensorSpec((None,), tf.string) and spec["blob"] == tf.TensorSpec((None,), tf.string)
    assert spec["tags"] == tf.RaggedTensorSpec((None, None), tf.int32, ragged_rank=1)
    assert spec["meta"] == {"a": tf.TensorSpec((None,), tf.int64), "b": tf.TensorSpec((None,), tf.float64)}
    samples = to_tf_dataset(sf.dataset(str(tmp_path / "m.parquet")))
    assert samples.element_spec["image"] == tf.TensorSpec((6,), tf.uint8)
    assert samples.element_spec["tags"] == tf.TensorSpec((None,), tf.int32)


def test_values_round_trip(tmp_path: Path) -> None:
    table = write_mixed(tmp_path / "m.parquet")
    batches = list(to_tf_dataset(sf.DataLoader(sf.dataset(str(tmp_path / "m.parquet")), batch_size=16)))
    assert [len(b["id"]) for b in batches] == [16] * 6 + [4]
    names = [s.decode() for b in batches for s in b["name"].numpy()]
    assert names == table.column("name").to_pylist()
    assert [s for b in batches for s in b["blob"].numpy()] == table.column("blob").to_pylist()
    assert [row for b in batches for row in b["tags"].to_list()] == table.column("tags").to_pylist()
    image = np.concatenate([b["image"].numpy() for b in batches])
    np.testing.assert_array_equal(image.reshape(-1), np.arange(600, dtype=np.uint8))
    metas = [float(v) for b in batches for v in b["meta"]["b"].numpy()]
    assert metas == [m["b"] for m in table.column("meta").to_pylist()]
    samples = list(to_tf_dataset(sf.dataset(str(tmp_path / "m.parquet"))).take(3))
    assert [s["tags"].numpy().tolist() for s in samples] == [[], [0], [0, 1]]
    assert samples[2]["name"].numpy().decode() == "name-2-ü"


@pytest.mark.parametrize("fmt", ["parquet", "tfrecord"])
def test_keras_fit_lowers_the_loss(tmp_path: Path, fmt: str) -> None:
    images = read_idx(FASHION_MNIST / "t10k-images-idx3-ubyte.gz")
    labels = read_idx(FASHION_MNIST / "t10k-labels-idx1-ubyte.gz").astype(np.int64)
    if fmt == "parquet":
        path = tmp_path / "fmnist.parquet"
        image_column = pa.FixedSizeListArray.from_arrays(pa.array(images.reshape(-1).astype(np.int64)), 784)
        pq.write_table(pa.table({"image": image_column, "label": labels}), path, row_group_size=2000)
        ds = sf.dataset(str(path))
    else:
        path = tmp_path / "fmnist.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as w:
            for image, label in zip(images, labels):
                feature = {
                    "image": tf.train.Feature(int64_list=tf.train.Int64List(value=image.reshape(-1).astype(np.int64))),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
                }
                w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        ds = sf.dataset(str(path), features={"image": sf.FixedLen((784,), "int64"), "label": sf.FixedLen((), "int64")})
    loader = sf.DataLoader(ds, batch_size=64, shuffle=True, seed=0)
    train = to_tf_dataset(loader).map(lambda b: (tf.cast(b["image"], tf.float32) / 255.0, b["label"])).prefetch(2)
    assert train.element_spec[0].shape.as_list() == [None, 784]
    # 10,000 / 64, rounded up: known for TFRecord too, from its record index.
    assert train.cardinality().numpy() == 157

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [tf.keras.Input((784,)), tf.keras.layers.Dense(64, activation="relu"), tf.keras.layers.Dense(10)]
    )
    model.compile(optimizer="adam", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    losses: list[float] = []

    class Record(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            losses.append(float((logs or {})["loss"]))

    model.fit(train, epochs=1, verbose=0, shuffle=False, callbacks=[Record()])  # shardflow shuffles
    assert len(losses) == 157
    # Keras reports the running mean: it falls as the model learns.
    assert losses[-1] < 0.75 * losses[10]


def test_each_pass_over_a_dataset_is_its_next_epoch(tmp_path: Path) -> None:
    write_mixed(tmp_path / "m.parquet")
    samples = to_tf_dataset(sf.dataset(str(tmp_path / "m.parquet"), columns=["id"]).shuffle(seed=0, buffer_size=20))
    passes = [[int(s["id"].numpy()) for s in samples] for _ in range(3)]
    for order in passes:
        assert sorted(order) == list(range(100))
    # Keras iterates the dataset once per epoch: each epoch is shuffled anew.
    assert len({tuple(order) for order in passes}) == 3


def test_images_of_their_own_sizes_are_a_clear_error(tmp_path: Path) -> None:
    import io
    import tarfile

    from PIL import Image

    with tarfile.open(tmp_path / "sizes.tar", "w") as tar:
        for i, (h, w) in enumerate([(4, 5), (6, 2)]):
            buffer = io.BytesIO()
            Image.fromarray(np.zeros((h, w, 3), np.uint8)).save(buffer, format="PNG")
            info = tarfile.TarInfo(f"s{i}.png")
            info.size = len(buffer.getvalue())
            tar.addfile(info, io.BytesIO(buffer.getvalue()))
    ds = sf.dataset(tmp_path / "sizes.tar", format_options={"decode": "rgb8"})
    with pytest.raises(TypeError, match="images of their own sizes.*resize=\\[H, W\\] or center_crop="):
        to_tf_dataset(sf.DataLoader(ds, batch_size=2))
    fixed = sf.dataset(tmp_path / "sizes.tar", format_options={"decode": "rgb8", "resize": [3, 3]})
    assert next(iter(to_tf_dataset(sf.DataLoader(fixed, batch_size=2))))["png"].shape == (2, 3, 3, 3)
