"""NPY/NPZ read through shardflow equal np.load."""

from __future__ import annotations

import glob
import io
import os
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

import shardflow as sf

DTYPES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128", "S5", "U4",
]


def array_of(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if dtype == "bool":
        values = rng.random(n) < 0.5
    elif dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    elif dtype.startswith("float"):
        values = rng.standard_normal(n).astype(dtype)
    elif dtype.startswith("complex"):
        values = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype)
    elif dtype.startswith("S"):
        values = np.array([bytes(rng.integers(97, 123, i % 6)) for i in range(n)], dtype=dtype)
    else:
        values = np.array(["".join(chr(0x3b1 + (i + j) % 20) for j in range(i % 5)) for i in range(n)], dtype=dtype)
    return values.reshape(shape)


def variants(a: np.ndarray) -> dict[str, np.ndarray]:
    """The same values in C and Fortran order and in both byte orders."""
    out = {"c": a, "f": np.asfortranarray(a)}
    if a.dtype.itemsize > 1 and a.dtype.kind in "iufc":
        out["be"] = a.astype(a.dtype.newbyteorder(">"))
        out["be_f"] = np.asfortranarray(out["be"])
    if a.dtype.kind == "U":
        out["be"] = a.astype(a.dtype.newbyteorder(">"))
    return out


def assert_same(ours: object, reference: np.ndarray) -> None:
    """Equal in shape, values and dtype (fixed-width bytes and text included), in the
    machine's byte order."""
    assert isinstance(ours, np.ndarray)
    assert ours.shape == reference.shape
    assert ours.dtype == reference.dtype.newbyteorder("="), (ours.dtype, reference.dtype)
    np.testing.assert_array_equal(ours, reference)


@pytest.mark.parametrize("dtype", DTYPES)
def test_npy_every_dtype_order_and_byte_order(tmp_path: Path, dtype: str) -> None:
    for name, a in variants(array_of(dtype, (3, 4, 2))).items():
        path = tmp_path / f"{name}.npy"
        np.save(path, a)
        reference = np.load(path)
        (row,) = list(sf.dataset(str(path)))
        assert list(row) == ["array"]
        assert_same(row["array"], reference)
        # rows mode: samples along the first axis, through the batch path
        batch = next(iter(sf.DataLoader(sf.dataset(str(path), format_options={"mode": "rows"}), batch_size=3)))
        assert_same(batch["array"], reference)


def test_zero_size_npy(tmp_path: Path) -> None:
    np.save(tmp_path / "e.npy", np.zeros((2, 0), np.float32))
    (row,) = list(sf.dataset(str(tmp_path / "e.npy")))
    assert row["array"].shape == (2, 0) and row["array"].dtype == np.float32


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_every_dtype(tmp_path: Path, compressed: bool) -> None:
    arrays = {f"a_{d}": array_of(d, (2, 3), seed=i) for i, d in enumerate(DTYPES)}
    arrays["fortran"] = np.asfortranarray(array_of("float64", (4, 5)))
    arrays["big_endian"] = array_of("int32", (6,)).astype(">i4")
    arrays["scalar"] = np.float64(3.25)
    arrays["empty"] = np.zeros((0, 3), np.int16)
    path = tmp_path / "all.npz"
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    reference = np.load(path)
    (row,) = list(sf.dataset(str(path)))
    assert sorted(row) == sorted(reference.files)
    for key in reference.files:
        assert_same(row[key], reference[key])


def test_npz_rows_mode_streams_rows_by_range(tmp_path: Path) -> None:
    n = 6_000
    y = np.arange(n, dtype=np.int64)
    x = np.broadcast_to((y % 251).astype(np.uint8)[:, None, None], (n, 48, 48)).copy()  # 13.8 MB
    np.savez(tmp_path / "train.npz", x=x, y=y)
    np.savez_compressed(tmp_path / "test.npz", x=x[:100], y=y[:100])
    ds = sf.dataset(str(tmp_path / "train.npz"), format_options={"mode": "rows"})
    assert len(ds) == n
    loader = sf.DataLoader(ds, batch_size=512, shuffle=True, seed=0)
    seen = []
    for batch in loader:
        assert batch["x"].shape[1:] == (48, 48)
        np.testing.assert_array_equal(batch["x"], np.broadcast_to((batch["y"] % 251).astype(np.uint8)[:, None, None], batch["x"].shape))
        seen.extend(batch["y"].tolist())
    assert sorted(seen) == list(range(n)) and seen != list(range(n))
    assert loader.stats()["units"] == 2  # 8 MB row ranges of a stored archive
    compressed = sf.dataset(str(tmp_path / "test.npz"), format_options={"mode": "rows"})
    batch = next(iter(sf.DataLoader(compressed, batch_size=100)))
    np.testing.assert_array_equal(batch["x"], x[:100])


def test_per_sample_files(tmp_path: Path) -> None:
    for i in range(20):
        np.savez(tmp_path / f"s{i:02d}.npz", image=np.full((2, 2), i, np.uint8), label=np.int64(i))
    rows = list(sf.dataset(str(tmp_path / "*.npz")))
    assert [r["label"].item() for r in rows] == list(range(20))
    batch = next(iter(sf.DataLoader(sf.dataset(str(tmp_path / "*.npz")), batch_size=20)))
    assert batch["image"].shape == (20, 2, 2)
    np.testing.assert_array_equal(batch["image"][:, 0, 0], np.arange(20))


def test_zero_d_and_fixed_width_strings_keep_numpys_dtype(tmp_path: Path) -> None:
    arrays = {
        "s0d": np.array(b"abc", dtype="S3"),  # as scipy's .npz files hold them
        "u0d": np.array("héllo", dtype="<U7"),
        "u_inner_nul": np.array(["a\x00b", "\x00c"], dtype="<U4"),
        "s_short": np.array([b"a", b"", b"abcd\x00e"], dtype="S6"),
        "u_be": np.array([["x", "yz"], ["", "w"]], dtype=">U2"),
    }
    np.savez(tmp_path / "s.npz", **arrays)
    (row,) = list(sf.dataset(str(tmp_path / "s.npz")))
    for key, value in arrays.items():
        assert_same(row[key], value)
    # Files of one dataset may declare different widths: the widest value decides, so
    # nothing is cut.
    np.save(tmp_path / "a.npy", np.array([b"ab"], dtype="S2"))
    np.save(tmp_path / "b.npy", np.array([b"abcde"], dtype="S5"))
    rows = list(sf.dataset(str(tmp_path / "*.npy")))
    assert [r["array"].tolist() for r in rows] == [[b"ab"], [b"abcde"]]
    assert rows[1]["array"].dtype == np.dtype("S5")


def shipped_numpy_files() -> list[str]:
    """Every .npy and .npz file that scipy and numpy ship (their test data)."""
    import scipy

    roots = [os.path.dirname(scipy.__file__), os.path.dirname(np.__file__)]
    return sorted(f for root in roots for f in glob.glob(os.path.join(root, "**", "*.np[yz]"), recursive=True))


def test_shipped_npy_and_npz_files_equal_np_load() -> None:
    files = shipped_numpy_files()
    assert any(f.endswith(".npz") for f in files), "scipy ships .npz test data"
    checked = 0
    for path in files:
        try:
            with warnings.catch_warnings():
                # numpy warns about headers written by Python 2, and reads them.
                warnings.simplefilter("ignore", UserWarning)
                if path.endswith(".npz"):
                    with np.load(path, allow_pickle=False) as reference:
                        expected = {k: reference[k] for k in reference.files}
                else:
                    expected = {"array": np.load(path, allow_pickle=False)}
        except ValueError:
            # Object arrays: np.load refuses them without allow_pickle, and so do we.
            with pytest.raises(sf.DecodeError, match="pickle"):
                list(sf.dataset(path))
            continue
        def supported(a: np.ndarray) -> bool:
            sizes = {"f": (2, 4, 8), "c": (8, 16)}
            return a.dtype.kind in "biufcSU" and a.dtype.itemsize in sizes.get(a.dtype.kind, (a.dtype.itemsize,))

        if not all(supported(a) for a in expected.values()):
            # e.g. float128 (long double), or a structured dtype: no Arrow type holds
            # it as numpy does, so a clear error.
            with pytest.raises(sf.DecodeError, match="unsupported dtype|structured dtypes"):
                list(sf.dataset(path))
            continue
        (row,) = list(sf.dataset(path))
        assert sorted(row) == sorted(expected), path
        for key, value in expected.items():
            assert_same(row[key], value)
        checked += 1
    assert checked >= 5


def test_object_arrays_are_refused_not_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):  # noqa: D105
            return (open, (str(marker), "w"))

    np.savez(tmp_path / "evil.npz", x=np.array([Evil()], dtype=object))
    with pytest.raises(sf.DecodeError, match="pickle"):
        list(sf.dataset(str(tmp_path / "evil.npz")))
    np.save(tmp_path / "evil.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(sf.DecodeError, match="pickle"):
        list(sf.dataset(str(tmp_path / "evil.npy")))
    assert not marker.exists()


def test_header_that_lies_about_its_size(tmp_path: Path) -> None:
    path = tmp_path / "lie.npy"
    np.save(path, np.zeros((10, 10), np.float32))
    data = path.read_bytes().replace(b"(10, 10)", b"(99, 10)")
    path.write_bytes(data)
    with pytest.raises(sf.DecodeError, match="lie.npy.*promises 3960 bytes"):
        list(sf.dataset(str(path)))
    # The same lie inside an archive.
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("x.npy", data)
    (tmp_path / "lie.npz").write_bytes(buf.getvalue())
    with pytest.raises(sf.DecodeError, match="lie.npz.*promises 3960 bytes"):
        list(sf.dataset(str(tmp_path / "lie.npz")))


@pytest.mark.parametrize("keep", [10, 100, 0.5, -30, -1])
def test_truncated_npz(tmp_path: Path, keep: float) -> None:
    path = tmp_path / "t.npz"
    np.savez_compressed(path, a=np.arange(10_000), b=np.ones((50, 50)))
    data = path.read_bytes()
    cut = int(len(data) * keep) if isinstance(keep, float) else keep
    path.write_bytes(data[:cut])
    with pytest.raises(sf.DecodeError, match="t.npz"):
        list(sf.dataset(str(path)))


def test_deflate_bomb_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "bomb.npz"
    np.savez_compressed(path, zeros=np.zeros(20_000_000, np.uint8))  # 20 MB -> ~20 KB
    assert path.stat().st_size < 100_000
    with pytest.raises(sf.DecodeError, match="over the limit of 1000000"):
        list(sf.dataset(str(path), format_options={"max_decompressed_bytes": 1_000_000}))
    (row,) = list(sf.dataset(str(path)))
    assert row["zeros"].shape == (20_000_000,)
