"""TFRecord and tf.train.Example read through shardflow equal TensorFlow's own readers."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import tensorflow as tf  # the reference implementation

import shardflow as sf

N = 300


def example(i: int) -> bytes:
    rng = np.random.default_rng(i)
    feature = {
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 10 - 3])),
        "image": tf.train.Feature(float_list=tf.train.FloatList(value=rng.random(12).astype(np.float32))),
        "name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"img-{i}".encode()])),
        "tags": tf.train.Feature(int64_list=tf.train.Int64List(value=list(range(i % 4)))),
        "big": tf.train.Feature(int64_list=tf.train.Int64List(value=[2**62 + i, -(2**40)])),
    }
    if i % 3 == 0:
        feature["maybe"] = tf.train.Feature(float_list=tf.train.FloatList(value=[i / 2]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write(path: Path, n: int = N, compression: str | None = None) -> list[bytes]:
    records = [example(i) for i in range(n)]
    with tf.io.TFRecordWriter(str(path), tf.io.TFRecordOptions(compression_type=compression)) as writer:
        for record in records:
            writer.write(record)
    return records


SPEC = {
    "image": tf.io.FixedLenFeature([4, 3], tf.float32),
    "label": tf.io.FixedLenFeature([], tf.int64),
    "name": tf.io.FixedLenFeature([], tf.string),
    "tags": tf.io.VarLenFeature(tf.int64),
    "maybe": tf.io.FixedLenFeature([], tf.float32, default_value=-1.0),
}


def tf_parse(records: list[bytes]) -> dict:
    parsed = tf.io.parse_example(tf.constant(records), SPEC)
    out = {k: v.numpy() for k, v in parsed.items() if not isinstance(v, tf.SparseTensor)}
    out["tags"] = tf.RaggedTensor.from_sparse(parsed["tags"]).to_list()
    return out


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_spec_reading_equals_tf_parse_example(tmp_path: Path, compression: str | None) -> None:
    path = tmp_path / "data.tfrecord"
    records = write(path, compression=compression)
    expected = tf_parse(records)
    ds = sf.dataset(str(path), features=SPEC)
    batch = next(iter(sf.DataLoader(ds, batch_size=N)))
    assert batch["image"].shape == (N, 4, 3) and batch["image"].dtype == np.float32
    np.testing.assert_array_equal(batch["image"], expected["image"])
    np.testing.assert_array_equal(batch["label"], expected["label"])
    np.testing.assert_array_equal(batch["maybe"], expected["maybe"])
    assert batch["name"].tolist() == expected["name"].tolist()
    assert [t.tolist() for t in batch["tags"]] == expected["tags"]


def test_shardflow_spec_classes_match_tf_classes(tmp_path: Path) -> None:
    path = tmp_path / "data.tfrecord"
    records = write(path, n=20)
    ours = {
        "image": sf.FixedLen((4, 3), "float32"),
        "label": sf.FixedLen((), "int64"),
        "name": sf.FixedLen((), "bytes"),
        "tags": sf.VarLen("int64"),
        "maybe": sf.FixedLen((), "float32", default=-1.0),
    }
    a = list(sf.dataset(str(path), features=ours))
    b = list(sf.dataset(str(path), features=SPEC))
    assert len(a) == len(b) == 20
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        np.testing.assert_array_equal(x["image"], y["image"])
        assert (x["label"], x["name"], x["tags"], x["maybe"]) == (y["label"], y["name"], y["tags"], y["maybe"])
    assert a[1]["maybe"] == -1.0 and a[3]["maybe"] == 1.5
    del records


def test_inferred_columns_equal_the_examples(tmp_path: Path) -> None:
    path = tmp_path / "data.tfrecords"
    records = write(path)
    rows = list(sf.dataset(str(path)))
    assert list(rows[0]) == ["big", "image", "label", "maybe", "name", "tags"]
    for i, (row, record) in enumerate(zip(rows, records)):
        feature = tf.train.Example.FromString(record).features.feature
        assert row["label"] == feature["label"].int64_list.value[0]  # one value everywhere: a scalar
        assert row["name"] == feature["name"].bytes_list.value[0]
        assert row["big"] == list(feature["big"].int64_list.value)
        assert row["tags"] == list(feature["tags"].int64_list.value)
        assert row["image"] == pytest.approx(list(np.float32(feature["image"].float_list.value)))
        assert row["maybe"] == (feature["maybe"].float_list.value[0] if i % 3 == 0 else None)


def test_raw_records_equal_tfrecord_dataset(tmp_path: Path) -> None:
    path = tmp_path / "data.tfrecord.gz"
    write(path, compression="GZIP")
    expected = [r.numpy() for r in tf.data.TFRecordDataset(str(path), compression_type="GZIP")]
    rows = list(sf.dataset(str(path), format_options={"raw": True}))
    assert [r["record"] for r in rows] == expected


def test_missing_required_feature_and_bad_spec(tmp_path: Path) -> None:
    path = tmp_path / "d.tfrecord"
    write(path, n=5)
    with pytest.raises(sf.DecodeError, match="required feature \"maybe\" is missing"):
        list(sf.dataset(str(path), features={"maybe": tf.io.FixedLenFeature([], tf.float32)}))
    with pytest.raises(sf.DecodeError, match="expected 5"):
        list(sf.dataset(str(path), features={"image": sf.FixedLen((5,), "float32")}))
    with pytest.raises(ValueError, match="float32, int64 or bytes"):
        sf.dataset(str(path), features={"x": sf.FixedLen((), "int32")})
    with pytest.raises(ValueError, match="no format option"):
        sf.dataset(str(path), format_options={"verify": False}).column_names


def record_offsets(data: bytes) -> list[int]:
    offsets, pos = [], 0
    while pos < len(data):
        offsets.append(pos)
        (length,) = struct.unpack("<Q", data[pos : pos + 8])
        pos += 12 + length + 4
    return offsets


def test_flipped_byte_is_a_crc_error_naming_file_and_offset(tmp_path: Path) -> None:
    path = tmp_path / "c.tfrecord"
    write(path)
    data = bytearray(path.read_bytes())
    offsets = record_offsets(bytes(data))
    at = data.index(b"img-200")
    assert offsets[200] < at < offsets[201]
    data[at + 4] = ord("X")  # record 200's name becomes img-X00
    path.write_bytes(bytes(data))
    with pytest.raises(sf.DecodeError) as info:
        list(sf.dataset(str(path), features=SPEC))
    assert str(path) in str(info.value) and "record 200" in str(info.value) and "checksum" in str(info.value)
    assert info.value.position == f"byte {offsets[200]}"

    loader = sf.DataLoader(sf.dataset(str(path), features=SPEC, on_error="skip"), batch_size=64)
    labels = [v for b in loader for v in b["label"].tolist()]
    assert len(labels) == N - 1
    assert loader.stats()["skipped_records"] == 1

    # With verification off the record is decoded as it is.
    rows = list(sf.dataset(str(path), features=SPEC, format_options={"verify_crc": False}))
    assert len(rows) == N and rows[200]["name"] == b"img-X00"
    assert rows[199]["name"] == b"img-199"


def test_corrupt_length_and_truncation(tmp_path: Path) -> None:
    path = tmp_path / "c.tfrecord"
    write(path, n=50)
    good = path.read_bytes()
    offsets = record_offsets(good)
    data = bytearray(good)
    data[offsets[10]] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(sf.DecodeError, match="record 10: length checksum mismatch"):
        list(sf.dataset(str(path), features=SPEC))
    for cut in (offsets[30] + 5, offsets[30] + 14, len(good) - 2):
        path.write_bytes(good[:cut])
        with pytest.raises(sf.DecodeError, match="c.tfrecord.*the file ends inside"):
            list(sf.dataset(str(path), features=SPEC))


def test_truncated_gzip_tfrecord(tmp_path: Path) -> None:
    path = tmp_path / "c.tfrecord.gz"
    write(path, compression="GZIP")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(sf.DecodeError, match="c.tfrecord.gz"):
        list(sf.dataset(str(path), features=SPEC))


def test_gzip_bomb_is_bounded(tmp_path: Path) -> None:
    # 50 MB of zeros compress to ~50 KB: a record "length" of zero repeated forever
    # would be a record storm; with a limit the read stops with a clear error.
    import gzip

    path = tmp_path / "bomb.tfrecord.gz"
    path.write_bytes(gzip.compress(b"\0" * 50_000_000))
    with pytest.raises(sf.DecodeError, match="exceeds 1000000 bytes"):
        list(sf.dataset(str(path), format_options={"raw": True, "verify_crc": False, "max_decompressed_bytes": 1_000_000}))
