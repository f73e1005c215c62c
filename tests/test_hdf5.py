"""HDF5 (`format="hdf5"`) against h5py, the reference reader and writer: files h5py
writes with each layout and filter, in sample and rows mode, locally and from S3."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

import shardflow as sf

from conftest import FASHION_MNIST, read_idx

NUMERIC = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.float32, np.float64]

# (h5py create_dataset keyword arguments) for each storage layout and filter pipeline.
LAYOUTS = {
    "contiguous": {},
    "compact": {"compact": True},
    "chunked": {"chunks": True},
    "gzip": {"chunks": True, "compression": "gzip", "compression_opts": 6},
    "shuffle+gzip": {"chunks": True, "compression": "gzip", "shuffle": True},
    "fletcher32": {"chunks": True, "fletcher32": True},
    "lzf": {"chunks": True, "compression": "lzf"},
}


def create(group: h5py.Group, name: str, data: np.ndarray, layout: str) -> None:
    options = dict(LAYOUTS[layout])
    if "/" in name:
        parent, name = name.rsplit("/", 1)
        group = group.require_group(parent)
    if options.pop("compact", False):
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        space = h5py.h5s.create_simple(data.shape)
        tid = h5py.h5t.py_create(data.dtype)
        h5py.h5d.create(group.id, name.encode(), tid, space, dcpl=dcpl).write(h5py.h5s.ALL, h5py.h5s.ALL, data)
        return
    group.create_dataset(name, data=data, **options)


def rows_file(path: Path, n: int, layout: str, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = {
        **{np.dtype(t).name: (rng.integers(0, 100, (n, 3)) - (0 if np.dtype(t).kind == "u" else 50)).astype(t) for t in NUMERIC},
        "flag": rng.integers(0, 2, n).astype(bool),
        "name": np.array([f"s{i}".encode() for i in range(n)], dtype="S6"),
        "group/sub/image": rng.integers(0, 256, (n, 4, 5), dtype=np.uint8),
    }
    with h5py.File(path, "w") as f:
        for name, data in arrays.items():
            if layout == "compact" and data.nbytes > 30_000:
                create(f, name, data, "contiguous")
            else:
                create(f, name, data, layout)
    return arrays


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_rows_mode_equals_h5py_for_every_layout_and_filter(tmp_path: Path, layout: str) -> None:
    if layout == "lzf":
        # LZF is h5py's own filter: libhdf5 does not have it, so reading must fail clearly.
        rows_file(tmp_path / "a.h5", 10, layout)
        with pytest.raises(sf.DecodeError, match=r"a\.h5"):
            list(sf.dataset(tmp_path / "a.h5", format_options={"mode": "rows"}))
        return
    expected = [rows_file(tmp_path / f"part-{i}.h5", n, layout, seed=i) for i, n in enumerate((40, 25))]
    ds = sf.dataset(str(tmp_path / "part-*.h5"), format_options={"mode": "rows"})
    assert ds.format == "hdf5" and len(ds) == 65
    with h5py.File(tmp_path / "part-0.h5") as f:
        names = []
        f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    assert sorted(ds.column_names) == sorted(names)
    batch = next(iter(sf.DataLoader(ds, batch_size=65)))
    for name in names:
        want = np.concatenate([e[name] for e in expected])
        assert batch[name].dtype == want.dtype or want.dtype.kind == "S", name
        if want.dtype.kind == "S":
            assert list(batch[name]) == list(want)
        else:
            np.testing.assert_array_equal(batch[name], want)


def test_sample_mode_one_file_one_sample_with_groups(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    samples = []
    for i in range(6):
        sample = {"x": rng.standard_normal((3, 2)).astype(np.float32), "meta/label": np.int64(i), "meta/id": np.array(b"abc%d" % i, dtype="S5")}
        with h5py.File(tmp_path / f"s{i}.hdf5", "w") as f:
            f["x"] = sample["x"]
            f.create_group("meta")
            f["meta/label"] = sample["meta/label"]
            f["meta/id"] = sample["meta/id"]
        samples.append(sample)
    ds = sf.dataset(str(tmp_path / "s*.hdf5"))
    assert ds.column_names == ["meta/id", "meta/label", "x"] and len(ds) == 6
    for got, want in zip(ds, samples):
        np.testing.assert_array_equal(got["x"], want["x"])
        assert got["meta/label"] == want["meta/label"] and got["meta/id"] == want["meta/id"].item()
    only = sf.dataset(str(tmp_path / "s*.hdf5"), columns=["x"])
    assert only.column_names == ["x"] and len(list(only)) == 6


def test_chosen_datasets_and_real_images(tmp_path: Path) -> None:
    images = read_idx(FASHION_MNIST / "t10k-images-idx3-ubyte.gz")[:1000]
    labels = read_idx(FASHION_MNIST / "t10k-labels-idx1-ubyte.gz")[:1000].astype(np.int64)
    with h5py.File(tmp_path / "fmnist.h5", "w") as f:
        f.create_dataset("images", data=images, chunks=(100, 28, 28), compression="gzip", shuffle=True)
        f.create_dataset("labels", data=labels)
        f.create_dataset("mean", data=images.mean(axis=0))  # (28, 28): first dimension 28, not 1000
    ds = sf.dataset(tmp_path / "fmnist.h5", format_options={"mode": "rows"})
    assert ds.column_names == ["images", "labels"]  # the datasets sharing the common first dimension
    loader = sf.DataLoader(ds, batch_size=100, shuffle=True, seed=0)
    seen = np.concatenate([b["labels"] for b in loader])
    assert sorted(seen.tolist()) == sorted(labels.tolist())
    chosen = sf.dataset(tmp_path / "fmnist.h5", format_options={"mode": "rows", "datasets": ["/labels"]})
    assert chosen.column_names == ["labels"]
    with pytest.raises(sf.SchemaError, match="no dataset"):
        sf.dataset(tmp_path / "fmnist.h5", format_options={"mode": "rows", "datasets": ["nope"]}).column_names


def test_unsupported_and_corrupt_files_name_the_file(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "vlen.h5", "w") as f:
        f["x"] = np.arange(3)
        f["text"] = ["a", "bb", "ccc"]  # variable-length str
    with pytest.raises(sf.DecodeError, match=r"vlen\.h5.*dataset \"text\".*columns="):
        sf.dataset(tmp_path / "vlen.h5").column_names
    assert [r["x"].tolist() for r in sf.dataset(tmp_path / "vlen.h5", columns=["x"])] == [[0, 1, 2]]
    good = tmp_path / "good.h5"
    rows_file(good, 50, "gzip")
    data = bytearray(good.read_bytes())
    (tmp_path / "truncated.h5").write_bytes(data[: len(data) // 2])
    with pytest.raises(sf.DecodeError, match=r"truncated\.h5"):
        list(sf.dataset(tmp_path / "truncated.h5", format_options={"mode": "rows"}))
    # A tiny file declaring a 2^40-byte dataset that its fill value stands for.
    with h5py.File(tmp_path / "vast.h5", "w") as f:
        f.create_dataset("x", shape=(2**37,), dtype=np.int64, chunks=(1024,), fillvalue=7)
    assert (tmp_path / "vast.h5").stat().st_size < 100_000
    with pytest.raises(sf.DecodeError, match=r"vast\.h5.*max_decompressed_bytes"):
        list(sf.dataset(tmp_path / "vast.h5", format_options={"mode": "rows"}))
    (tmp_path / "garbage.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(range(256)) * 8)
    with pytest.raises(sf.DecodeError, match=r"garbage\.h5") as caught:
        sf.dataset(tmp_path / "garbage.h5").column_names
    assert caught.value.url.endswith("garbage.h5")


def test_hdf5_from_s3(tmp_path: Path, seaweed) -> None:  # noqa: ANN001
    expected = [rows_file(tmp_path / f"part-{i}.h5", 30, "shuffle+gzip", seed=i) for i in range(3)]
    client = seaweed.client()
    client.create_bucket(Bucket="hdf5-rows")
    for i in range(3):
        client.upload_file(str(tmp_path / f"part-{i}.h5"), "hdf5-rows", f"rows/part-{i}.h5")
    ds = sf.dataset("s3://hdf5-rows/rows/", format_options={"mode": "rows"}, storage_options=seaweed.storage_options())
    batch = next(iter(sf.DataLoader(ds, batch_size=90)))
    np.testing.assert_array_equal(batch["float64"], np.concatenate([e["float64"] for e in expected]))
    np.testing.assert_array_equal(batch["group/sub/image"], np.concatenate([e["group/sub/image"] for e in expected]))
