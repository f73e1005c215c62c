"""Image decoding in the Rust pool (`format_options={"decode": ...}` /
`{"decode_images": ...}`) against Pillow, on real images: scikit-learn's two sample
photographs and Debian's Fashion-MNIST."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
import sklearn.datasets

import shardflow as sf

from conftest import FASHION_MNIST, read_idx

SAMPLES = Path(sklearn.datasets.__file__).parent / "images"
# Pillow (libjpeg-turbo) and shardflow (zune-jpeg) round their integer IDCTs and their
# chroma upsampling differently: pixels may differ by a few levels. Measured on the
# photographs below: at most 3 levels with full-resolution chroma (4:4:4, ~99% of values
# equal), at most 4 with 4:2:0 chroma (~83% equal, mean difference 0.25).
JPEG_MAX_DIFF = 4
JPEG_MEAN_DIFF = 0.3


def encode(image: Image.Image, fmt: str, **kwargs: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **kwargs)
    return out.getvalue()


def write_tar(path: Path, samples: list[dict[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for i, sample in enumerate(samples):
            for ext, data in sample.items():
                info = tarfile.TarInfo(f"s{i:05d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def pil_pixels(data: bytes, mode: str = "RGB") -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert(mode))


def center_crop(pixels: np.ndarray, size: int) -> np.ndarray:
    """torchvision's CenterCrop: offsets round((side - size) / 2), halves to even."""
    top, left = round((pixels.shape[0] - size) / 2), round((pixels.shape[1] - size) / 2)
    return pixels[top : top + size, left : left + size]


@pytest.fixture(scope="module")
def photos() -> list[Image.Image]:
    return [Image.open(SAMPLES / name) for name in ("china.jpg", "flower.jpg")]


@pytest.fixture(scope="module")
def fashion() -> np.ndarray:
    return read_idx(FASHION_MNIST / "t10k-images-idx3-ubyte.gz")[:300]


def decoded(path: Path, field: str, **options: object) -> np.ndarray:
    ds = sf.dataset(path, format_options=options)
    return np.concatenate([b[field] for b in sf.DataLoader(ds, batch_size=64)])


def test_png_pixels_equal_pillows(tmp_path: Path, photos: list[Image.Image], fashion: np.ndarray) -> None:
    grey = [Image.fromarray(a) for a in fashion]
    colour = [photos[0].crop((x, y, x + 28, y + 28)) for x in range(0, 560, 70) for y in range(0, 390, 65)]
    rgba = [c.convert("RGBA") for c in colour[:10]]
    for im in rgba:
        im.putalpha(Image.fromarray(np.arange(28 * 28, dtype=np.uint8).reshape(28, 28)))
    pngs = [encode(im, "PNG") for im in grey + colour + rgba]
    pngs += [encode(im.convert("P", palette=Image.Palette.ADAPTIVE), "PNG") for im in colour[:10]]  # palette PNGs
    write_tar(tmp_path / "png.tar", [{"png": p, "cls": b"1"} for p in pngs])
    for mode, channels in (("RGB", "rgb8"), ("L", "l8"), ("RGBA", "rgba8")):
        ours = decoded(tmp_path / "png.tar", "png", decode={"png": channels}, center_crop=[28, 28])
        expected = np.stack([pil_pixels(p, mode) for p in pngs])
        if mode == "L":
            expected = expected[..., None]
        assert ours.dtype == np.uint8 and ours.shape == expected.shape
        np.testing.assert_array_equal(ours, expected)


def test_jpeg_pixels_match_pillow_within_the_idct_tolerance(
    tmp_path: Path, photos: list[Image.Image], fashion: np.ndarray
) -> None:
    originals = [(SAMPLES / name).read_bytes() for name in ("china.jpg", "flower.jpg")]
    crops = [photos[1].crop((x, 0, x + 400, 400)) for x in (0, 120, 240)]
    jpegs = originals + [
        encode(c, "JPEG", quality=q, subsampling=s) for c in crops for q in (75, 95) for s in (0, 2)
    ]
    sizes = {Image.open(io.BytesIO(j)).size for j in jpegs}
    assert sizes == {(640, 427), (400, 400)}
    for size, group in (((427, 640), jpegs[:2]), ((400, 400), jpegs[2:])):
        path = tmp_path / f"jpg-{size[0]}.tar"
        write_tar(path, [{"jpg": j} for j in group])
        ours = decoded(path, "jpg", decode={"jpg": "rgb8"}, center_crop=list(size)).astype(int)
        expected = np.stack([pil_pixels(j) for j in group]).astype(int)
        diff = np.abs(ours - expected)
        assert diff.max() <= JPEG_MAX_DIFF and diff.mean() <= JPEG_MEAN_DIFF, (diff.max(), diff.mean())
    # Greyscale JPEGs (Fashion-MNIST) decode to one channel, as Pillow's "L".
    greys = [encode(Image.fromarray(a), "JPEG", quality=90) for a in fashion[:100]]
    write_tar(tmp_path / "grey.tar", [{"jpeg": g} for g in greys])
    ours = decoded(tmp_path / "grey.tar", "jpeg", decode="l8", center_crop=28)
    diff = np.abs(ours[..., 0].astype(int) - np.stack([pil_pixels(g, "L") for g in greys]).astype(int))
    assert diff.max() <= JPEG_MAX_DIFF and diff.mean() <= JPEG_MEAN_DIFF, (diff.max(), diff.mean())


def test_jpegs_of_mixed_sizes_and_colours_in_one_stream(
    tmp_path: Path, photos: list[Image.Image], fashion: np.ndarray
) -> None:
    """Large and small, colour and grey JPEGs interleaved: each decode thread reuses one
    buffer from image to image, so a small image after a large one must not show the
    large one's pixels; colour becomes grey, and grey becomes colour, as Pillow converts."""
    large = (SAMPLES / "china.jpg").read_bytes()
    medium = encode(photos[1].crop((100, 0, 500, 400)), "JPEG", quality=95, subsampling=0)
    jpegs = [j for a in fashion[:4] for j in (large, encode(Image.fromarray(a), "JPEG", quality=90), medium)]
    write_tar(tmp_path / "mixed.tar", [{"jpg": j} for j in jpegs])
    for channels, mode in (("rgb8", "RGB"), ("l8", "L"), ("rgba8", "RGBA")):
        ours = decoded(tmp_path / "mixed.tar", "jpg", decode={"jpg": channels}, center_crop=28).astype(int)
        expected = np.stack([center_crop(pil_pixels(jpeg, mode), 28).reshape(28, 28, -1) for jpeg in jpegs])
        diff = np.abs(ours - expected.astype(int))
        assert diff.max() <= JPEG_MAX_DIFF and diff.mean() <= JPEG_MEAN_DIFF, (channels, diff.max(), diff.mean())


def test_resize_and_center_crop_as_torchvision(tmp_path: Path, photos: list[Image.Image]) -> None:
    data = [(SAMPLES / "china.jpg").read_bytes(), encode(photos[1].rotate(90, expand=True), "PNG")]
    write_tar(tmp_path / "mixed.tar", [{"jpg": data[0]}, {"png": data[1]}])
    ds = sf.dataset(tmp_path / "mixed.tar", format_options={"decode": "rgb8", "resize": 64, "center_crop": 56})
    rows = list(ds)
    assert rows[0]["jpg"].shape == (56, 56, 3) and rows[1]["png"].shape == (56, 56, 3)
    for raw, got in ((data[0], rows[0]["jpg"]), (data[1], rows[1]["png"])):
        image = Image.open(io.BytesIO(raw)).convert("RGB")
        w, h = image.size
        short = 64
        size = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
        expected = center_crop(np.asarray(image.resize(size, Image.Resampling.BILINEAR)), 56).astype(int)
        # Both filters are antialiased bilinear; their weights round differently.
        assert np.abs(got.astype(int) - expected).mean() < 4
    # Exact sizes; a crop larger than the image pads with zeros, as torchvision does.
    ds = sf.dataset(tmp_path / "mixed.tar", format_options={"decode": "rgb8", "resize": [20, 30], "center_crop": [24, 30]})
    image = next(iter(ds))["jpg"]
    assert image.shape == (24, 30, 3) and not image[:2].any() and not image[-2:].any() and image[2:-2].any()


def test_center_crop_offsets_round_as_python_does(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    arrays = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((351, 349), (100, 101), (64, 64))]
    write_tar(tmp_path / "sizes.tar", [{"png": encode(Image.fromarray(a), "PNG")} for a in arrays])
    got = decoded(tmp_path / "sizes.tar", "png", decode="rgb8", center_crop=60)
    for a, image in zip(arrays, got):
        # Halves round to even: 349 wide gives a left offset of 144.5 -> 144.
        np.testing.assert_array_equal(image, center_crop(a, 60))


def test_parquet_image_column_batches_share_memory(tmp_path: Path, fashion: np.ndarray) -> None:
    pngs = [encode(Image.fromarray(a), "PNG") for a in fashion]
    pq.write_table(
        pa.table({"image": pa.array(pngs, pa.binary()), "label": np.arange(len(pngs))}),
        tmp_path / "images.parquet",
        row_group_size=100,
    )
    ds = sf.dataset(tmp_path / "images.parquet", format_options={"decode_images": {"image": "l8"}, "center_crop": 28})
    assert list(ds._column_types()[0]["shape"]) == [28, 28, 1]
    batches = list(sf.DataLoader(ds, batch_size=50))
    images = np.concatenate([b["image"] for b in batches])
    np.testing.assert_array_equal(images[..., 0], fashion)
    first = batches[0]["image"]
    assert first.shape == (50, 28, 28, 1) and first.dtype == np.uint8
    assert first.base is not None and not first.flags.owndata  # a view of the decoded Arrow buffer
    with pytest.raises(sf.InvalidArgumentError, match="not a column"):
        sf.dataset(tmp_path / "images.parquet", format_options={"decode_images": {"img": "rgb8"}, "center_crop": 28}).schema
    # Without a resize or crop, each image keeps its own size.
    own = sf.dataset(tmp_path / "images.parquet", format_options={"decode_images": {"image": "rgb8"}})
    assert own[0]["image"].shape == (28, 28, 3)
    with pytest.raises(sf.InvalidArgumentError, match="decode_images"):
        sf.dataset(tmp_path / "images.parquet", format_options={"decode": "rgb8", "center_crop": 28})


def test_raw_image_folder(tmp_path: Path, fashion: np.ndarray) -> None:
    for i, a in enumerate(fashion[:40]):
        folder = tmp_path / ("shoes" if i % 2 else "shirts")
        folder.mkdir(exist_ok=True)
        Image.fromarray(a).save(folder / f"{i:03d}.{'png' if i % 3 else 'jpg'}")
    ds = sf.dataset(tmp_path, format="raw", format_options={"label": True, "decode": {"png": "l8", "jpg": "l8"}, "center_crop": 28})
    rows = {r["__key__"]: r for r in ds}
    assert len(rows) == 40
    for i, a in enumerate(fashion[:40]):
        row = rows[f"{'shoes' if i % 2 else 'shirts'}/{i:03d}"]
        assert row["bytes"].shape == (28, 28, 1) and row["label"] == ("shoes" if i % 2 else "shirts")
        if i % 3:  # PNG: exact
            np.testing.assert_array_equal(row["bytes"][..., 0], a)
    only_png = sf.dataset(tmp_path, format="raw", format_options={"decode": {"png": "l8"}, "center_crop": 28})
    with pytest.raises(sf.DecodeError, match=r'a jpg image, and decode= names only \["png"\]'):
        list(only_png)


def test_corrupt_images_raise_or_are_skipped_and_counted(tmp_path: Path, fashion: np.ndarray) -> None:
    good = [encode(Image.fromarray(a), "PNG") for a in fashion[:20]]
    bad = good[:]
    bad[5] = b"\x89PNG\r\n\x1a\n" + b"\x00" * 40  # a PNG signature, then garbage
    bad[11] = good[11][: len(good[11]) // 2]  # truncated
    write_tar(tmp_path / "bad.tar", [{"png": p, "cls": str(i).encode()} for i, p in enumerate(bad)])
    options = {"decode": "l8", "center_crop": 28}
    with pytest.raises(sf.DecodeError, match=r"bad\.tar.*image.*column \"png\"") as caught:
        list(sf.DataLoader(sf.dataset(tmp_path / "bad.tar", format_options=options), batch_size=8))
    assert caught.value.url.endswith("bad.tar")
    loader = sf.DataLoader(sf.dataset(tmp_path / "bad.tar", format_options=options, on_error="skip"), batch_size=8)
    batches = list(loader)
    assert [c for b in batches for c in b["cls"]] == [i for i in range(20) if i not in (5, 11)]
    assert loader.stats()["skipped_records"] == 2
    np.testing.assert_array_equal(
        np.concatenate([b["png"] for b in batches])[..., 0], np.delete(fashion[:20], [5, 11], axis=0)
    )


def torchvision_center_crop(pixels: np.ndarray, crop_h: int, crop_w: int) -> np.ndarray:
    """torchvision.transforms.functional.center_crop, line for line: pad a side smaller
    than the crop with (crop - size) // 2 zeros before and the rest after, then crop at
    round((size - crop) / 2)."""
    h, w = pixels.shape[:2]
    if crop_w > w or crop_h > h:
        left = (crop_w - w) // 2 if crop_w > w else 0
        top = (crop_h - h) // 2 if crop_h > h else 0
        right = (crop_w - w + 1) // 2 if crop_w > w else 0
        bottom = (crop_h - h + 1) // 2 if crop_h > h else 0
        pixels = np.pad(pixels, ((top, bottom), (left, right), (0, 0)))
        h, w = pixels.shape[:2]
        if crop_w == w and crop_h == h:
            return pixels
    top, left = int(round((h - crop_h) / 2.0)), int(round((w - crop_w) / 2.0))
    return pixels[top : top + crop_h, left : left + crop_w]


def test_center_crop_larger_than_the_image_pads_as_torchvision(tmp_path: Path) -> None:
    """A 5x5 image cropped to 8 sits at (1, 1), as torchvision puts it, not (2, 2):
    crop - size = 3 (mod 4) was one pixel off."""
    rng = np.random.default_rng(5)
    shapes = [(5, 5), (5, 6), (7, 3), (4, 9), (2, 2)]
    arrays = [rng.integers(1, 256, (h, w, 3), dtype=np.uint8) for h, w in shapes]
    write_tar(tmp_path / "small.tar", [{"png": encode(Image.fromarray(a), "PNG")} for a in arrays])
    for crop in ([8, 8], [6, 6], [9, 5]):
        got = decoded(tmp_path / "small.tar", "png", decode="rgb8", center_crop=crop)
        for a, image in zip(arrays, got):
            np.testing.assert_array_equal(image, torchvision_center_crop(a, *crop), err_msg=f"{a.shape} -> {crop}")


def test_sixteen_bit_pngs_scale_to_eight_bits_as_the_readme_says(tmp_path: Path) -> None:
    """(v + 128) // 257 per value, where Pillow's convert("L") clips at 255."""
    values = np.array([[0, 128, 129, 255, 256], [385, 32767, 65279, 65407, 65535]], dtype=np.uint16)
    buffer = io.BytesIO()
    Image.fromarray(values).save(buffer, format="PNG")  # a 16-bit grey PNG ("I;16")
    assert Image.open(io.BytesIO(buffer.getvalue())).mode.startswith("I")
    write_tar(tmp_path / "deep.tar", [{"png": buffer.getvalue()}])
    got = decoded(tmp_path / "deep.tar", "png", decode="l8", center_crop=[2, 5])[0].reshape(2, 5)
    np.testing.assert_array_equal(got, (values.astype(np.uint32) + 128) // 257)
    clipped = np.minimum(values, 255)  # what Pillow gives
    assert (got != clipped).any()


def test_images_decode_at_their_own_size(tmp_path: Path) -> None:
    """No resize or crop: each image its own (H, W, C) array — per sample, per index, in
    numpy batches (an object array of them) and torch batches (a list of tensors) —
    equal to Pillow's pixels."""
    import torch

    rng = np.random.default_rng(11)
    shapes = [(5, 7), (12, 3), (5, 7), (30, 41), (1, 1)]
    arrays = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in shapes]
    write_tar(tmp_path / "sizes.tar", [{"png": encode(Image.fromarray(a), "PNG")} for a in arrays])
    ds = sf.dataset(tmp_path / "sizes.tar", format_options={"decode": "rgb8"})
    for a, sample in zip(arrays, ds):
        assert sample["png"].dtype == np.uint8
        np.testing.assert_array_equal(sample["png"], a)
    np.testing.assert_array_equal(ds[3]["png"], arrays[3])
    batch = next(iter(sf.DataLoader(ds, batch_size=5)))
    assert [image.shape for image in batch["png"]] == [(h, w, 3) for h, w in shapes]
    for a, image in zip(arrays, batch["png"]):
        np.testing.assert_array_equal(image, a)
    # Two images of one size in a torch batch are still a list, as every batch is.
    for batch in sf.DataLoader(ds, batch_size=2, output="torch"):
        assert isinstance(batch["png"], list) and all(isinstance(t, torch.Tensor) for t in batch["png"])
    tensors = [t for b in sf.DataLoader(ds, batch_size=2, output="torch") for t in b["png"]]
    assert [tuple(t.shape) for t in tensors] == [(h, w, 3) for h, w in shapes]
    # Grey, and resized by the shorter side only: sizes vary, as torchvision's Resize(n) makes them.
    grey = sf.dataset(tmp_path / "sizes.tar", format_options={"decode": "l8", "resize": 10})
    expected = [(10, 14), (40, 10), (10, 14), (10, 13), (10, 10)]
    assert [s["png"].shape for s in grey] == [(h, w, 1) for h, w in expected]


def test_jpegs_at_their_own_size_match_pillow(tmp_path: Path, photos: list[Image.Image]) -> None:
    jpegs = [encode(p, "JPEG", quality=90) for p in photos]
    write_tar(tmp_path / "photos.tar", [{"jpg": j} for j in jpegs])
    got = [s["jpg"] for s in sf.dataset(tmp_path / "photos.tar", format_options={"decode": {"jpg": "rgb8"}})]
    for data, image in zip(jpegs, got):
        expected = pil_pixels(data)
        assert image.shape == expected.shape
        assert np.abs(image.astype(int) - expected).max() <= 4


def test_pixel_buffers_used_again_hold_zeros_for_missing_images(tmp_path: Path, fashion: np.ndarray) -> None:
    """Decoded tensors go into buffers used again once their batches are released: a
    sample without an image (a null tensor) must not carry the pixels a buffer held
    before in its slot. 100 KB of other bytes per sample make units of about 40 samples
    (4 MB), so the 300 samples decode into several buffers, used again within and
    across epochs."""
    filler = bytes(range(256)) * 400
    missing = np.arange(len(fashion)) % 7 == 3
    samples = [{"cls": str(i).encode(), "bin": filler} | ({} if missing[i] else {"png": encode(Image.fromarray(a), "PNG")})
               for i, a in enumerate(fashion)]
    write_tar(tmp_path / "gaps.tar", samples)
    ds = sf.dataset(tmp_path / "gaps.tar", columns=["png", "cls"], format_options={"decode": {"png": "l8"}, "center_crop": 28})
    expected = np.where(missing[:, None, None], 0, fashion)
    for output in ["numpy", "arrow", "arrow"]:
        loader = sf.DataLoader(ds, batch_size=32, num_threads=2, output=output)
        labels, images, nulls = [], [], []
        for batch in loader:
            if output == "numpy":
                labels += [int(c) for c in batch["cls"]]
                nulls += [image is None for image in batch["png"]]
                continue
            batch = pa.record_batch(batch)
            labels += batch.column("cls").to_pylist()
            column = batch.column("png").storage  # the fixed-shape tensor extension's lists
            nulls += column.is_null().to_pylist()
            # Every slot's pixels, the null ones' too (Arrow leaves those unspecified;
            # these are zeros, never an earlier image's).
            values = column.values.slice(column.offset * 28 * 28, len(column) * 28 * 28)
            images.append(values.to_numpy().reshape(-1, 28, 28))
        assert labels == list(range(len(fashion)))
        assert nulls == missing.tolist()
        if images:
            np.testing.assert_array_equal(np.concatenate(images), expected)


RESUME_CHILD = """
import pickle, sys
import numpy as np
import shardflow as sf
path, state_file, out_file = sys.argv[1:4]
with open(state_file, "rb") as f:
    state = pickle.load(f)
ds = sf.dataset(path, columns=["png", "cls"], format_options={"decode": {"png": "l8"}, "center_crop": 28})
loader = sf.DataLoader(ds, batch_size=24, shuffle=True, seed=3)
loader.load_state_dict(state)
seen = []
for epoch in range(state["epoch"], 2):
    loader.set_epoch(epoch)
    seen += [(int(c), image[..., 0]) for b in loader for c, image in zip(b["cls"], b["png"])]
with open(out_file, "wb") as f:
    pickle.dump(seen, f)
"""


def test_decoded_photos_across_ranks_workers_epochs_and_a_resume_in_a_new_process(tmp_path: Path, fashion: np.ndarray) -> None:
    """Photos decoded into pooled buffers from tar units read by byte range (members as
    slices of the unit), the way training reads them: 2 ranks x 2 forked torch workers
    for 2 epochs, and a loader stopped mid-epoch and resumed in a new process. Every
    sample comes once per epoch with Pillow's pixels (PNG: exact)."""
    import pickle
    import subprocess
    import sys

    from torch.utils.data import DataLoader as TorchLoader

    from shardflow.torch import IterableDataset

    filler = bytes(range(256)) * 400  # units of about 40 samples: several buffers, used again
    pngs = [encode(Image.fromarray(a), "PNG") for a in fashion]
    write_tar(tmp_path / "photos.tar", [{"cls": str(i).encode(), "bin": filler, "png": p} for i, p in enumerate(pngs)])
    expected = [pil_pixels(p, "L") for p in pngs]
    ds = sf.dataset(tmp_path / "photos.tar", columns=["png", "cls"], format_options={"decode": {"png": "l8"}, "center_crop": 28})

    def check(samples: list[tuple[int, np.ndarray]]) -> list[int]:
        for i, image in samples:
            np.testing.assert_array_equal(image, expected[i])
        return [i for i, _ in samples]

    ranks = [TorchLoader(IterableDataset(ds, batch_size=16, shuffle=True, rank=rank, world_size=2), batch_size=None,
                         num_workers=2, multiprocessing_context="fork") for rank in range(2)]
    orders = []
    for _epoch in range(2):
        order = []
        for loader in ranks:
            for batch in loader:
                order += check([(int(c), np.asarray(image)[..., 0]) for c, image in zip(batch["cls"], batch["png"])])
        assert sorted(order) == list(range(len(fashion)))
        orders.append(order)
    assert orders[0] != orders[1]

    def run(loader: sf.DataLoader, stop: tuple[int, int] | None) -> tuple[list[tuple[int, np.ndarray]], dict | None]:
        seen = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            for step, b in enumerate(loader):
                seen += [(int(c), image[..., 0]) for c, image in zip(b["cls"], b["png"])]
                if (epoch, step) == stop:
                    return seen, loader.state_dict()
        return seen, None

    whole, _ = run(sf.DataLoader(ds, batch_size=24, shuffle=True, seed=3), None)
    before, state = run(sf.DataLoader(ds, batch_size=24, shuffle=True, seed=3), (1, 4))
    (tmp_path / "state.pkl").write_bytes(pickle.dumps(state))
    subprocess.run([sys.executable, "-c", RESUME_CHILD, str(tmp_path / "photos.tar"), str(tmp_path / "state.pkl"),
                    str(tmp_path / "after.pkl")], check=True)
    after = pickle.loads((tmp_path / "after.pkl").read_bytes())
    assert check(before) + check(after) == check(whole)


def test_hf_image_columns_decode_as_datasets_decodes_them(tmp_path: Path, photos: list[Image.Image], fashion: np.ndarray) -> None:
    """A Parquet file `datasets` wrote with `Image` features (the photographs as JPEG,
    Fashion-MNIST as PNG, and one `Image(mode="L")` column): its images are decoded on the
    pool, each equal to `datasets`' own decoding (PIL), pixels as numpy; the features
    still say `Image`; `decode_images={}` reads the stored `{bytes, path}`; an image with
    a path and no bytes is an error naming it. Through a DataLoader on 2 ranks as well."""
    import datasets

    jpegs = [encode(p, "JPEG", quality=90) for p in photos] * 3
    pngs = [encode(Image.fromarray(a), "PNG") for a in fashion[: len(jpegs)]]
    features = datasets.Features({"photo": datasets.Image(), "grey": datasets.Image(mode="L"), "item": datasets.Image(), "n": datasets.Value("int64")})
    rows = {"photo": [{"bytes": b, "path": None} for b in jpegs], "grey": [{"bytes": b, "path": None} for b in jpegs],
            "item": [{"bytes": b, "path": None} for b in pngs], "n": list(range(len(jpegs)))}
    reference = datasets.Dataset.from_dict(rows, features=features)
    path = tmp_path / "hf.parquet"
    reference.to_parquet(str(path))
    ds = sf.dataset(path)
    assert ds.features.to_dict() == reference.features.to_dict()
    for ours, theirs in zip(ds, reference):
        np.testing.assert_array_equal(ours["item"][..., 0], np.asarray(theirs["item"]))  # PNG: exact
        for column, channels in (("photo", 3), ("grey", 1)):
            want = np.asarray(theirs[column])
            got = ours[column] if channels == 3 else ours[column][..., 0]
            assert got.shape == want.shape, column
            diff = np.abs(got.astype(int) - want.astype(int))
            assert diff.max() <= JPEG_MAX_DIFF and diff.mean() <= JPEG_MEAN_DIFF, column
    seen = sorted(int(n) for rank in range(2) for b in sf.DataLoader(ds, batch_size=2, rank=rank, world_size=2) for n in b["n"])
    assert seen == list(range(len(jpegs)))
    stored = sf.dataset(path, format_options={"decode_images": {}})
    assert stored[0]["photo"]["bytes"] == jpegs[0]
    by_path = tmp_path / "by_path.parquet"
    image_only = datasets.Features({"photo": datasets.Image()}).arrow_schema  # with its huggingface metadata
    pq.write_table(pa.table({"photo": [{"bytes": None, "path": "/elsewhere/a.jpg"}]}, schema=image_only), by_path)
    with pytest.raises(sf.DecodeError, match="only a path"):
        list(sf.dataset(by_path))


def test_a_decode_task_waiting_for_its_images_takes_in_no_other_unit(tmp_path: Path, photos: list[Image.Image]) -> None:
    """A row group's images are decoded side by side on the pool's threads. The thread
    whose task waits for images that others took waits idle: under rayon's parallel
    iterators it took in the next unit's whole decode task meanwhile, and the batches of
    its own unit, handed out first, waited for that one (a stall of 1.2-1.8 s in most
    epochs of a Hub image dataset). On the timeline, no thread's decode spans nest; the
    rows still come in order, every epoch."""
    import datasets

    rng = np.random.default_rng(5)
    jpegs = []
    for i in range(480):
        photo = np.asarray(photos[i % 2])
        top, left = rng.integers(0, photo.shape[0] - 256), rng.integers(0, photo.shape[1] - 256)
        jpegs.append(encode(Image.fromarray(photo[top : top + 256, left : left + 256]), "JPEG", quality=90))
    schema = datasets.Features({"photo": datasets.Image(), "n": datasets.Value("int64")}).arrow_schema
    table = pa.table({"photo": [{"bytes": b, "path": None} for b in jpegs], "n": list(range(len(jpegs)))}, schema=schema)
    pq.write_table(table, tmp_path / "photos.parquet", row_group_size=40)
    ds = sf.dataset(tmp_path / "photos.parquet")
    for epoch in range(6):
        trace = tmp_path / f"epoch{epoch}.json"
        loader = sf.DataLoader(ds, batch_size=16, num_threads=2, trace=trace)
        seen = [int(n) for batch in loader for n in batch["n"]]
        assert seen == list(range(len(jpegs)))
        del loader
        events = json.loads(trace.read_text())["traceEvents"]
        by_thread: dict[int, list[tuple[float, float]]] = {}
        for e in events:
            if e["ph"] == "X" and e["name"] == "decode":
                by_thread.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
        assert sum(map(len, by_thread.values())) == 12, by_thread
        for tid, spans in by_thread.items():
            spans.sort()
            for (_, end), (start, _) in zip(spans, spans[1:]):
                assert start >= end - 1, f"epoch {epoch}, thread {tid}: a unit's decode ran inside another's: {spans}"


def test_hub_images_of_every_format_and_orientation_decode_as_datasets_decodes_them(tmp_path: Path, photos: list[Image.Image]) -> None:
    """An `Image(mode="RGB")` column `datasets` wrote holding every kind the Hub has:
    JPEG (one with an EXIF orientation, one CMYK), PNG (RGB, RGBA, grey, palette),
    WebP (lossless), GIF, TIFF and BMP. Each decodes as `datasets` decodes it: PIL's
    `exif_transpose` and `convert("RGB")`; exact for the lossless formats, within the
    JPEG tolerance otherwise. Through `sf.load_dataset` on the Hub layout, and a
    loader on 2 ranks."""
    import datasets

    small = photos[1].crop((0, 0, 320, 200))  # 320 x 200 of the photograph
    rotated = Image.Exif()
    rotated[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    flipped = Image.Exif()
    flipped[0x0112] = 2  # mirror
    palette = small.convert("P", palette=Image.Palette.ADAPTIVE, colors=32)
    cells = [
        ("jpeg", encode(small, "JPEG", quality=90)),
        ("jpeg, EXIF rotated", encode(small, "JPEG", quality=90, exif=rotated)),
        ("jpeg, EXIF mirrored", encode(small, "JPEG", quality=90, exif=flipped)),
        ("jpeg, CMYK", encode(small.convert("CMYK"), "JPEG", quality=90)),
        ("png", encode(small, "PNG")),
        ("png, RGBA", encode(small.convert("RGBA"), "PNG")),
        ("png, grey", encode(small.convert("L"), "PNG")),
        ("png, palette", encode(palette, "PNG")),
        ("png, EXIF rotated", encode(small, "PNG", exif=rotated)),
        ("webp, lossless", encode(small, "WEBP", lossless=True)),
        ("gif", encode(palette, "GIF")),
        ("tiff", encode(small, "TIFF")),
        ("bmp", encode(small, "BMP")),
    ]
    features = datasets.Features({"image": datasets.Image(mode="RGB"), "kind": datasets.Value("string")})
    written = datasets.Dataset.from_dict({"image": [{"bytes": b, "path": None} for _, b in cells], "kind": [k for k, _ in cells]}).cast(features)
    (tmp_path / "data").mkdir()
    written.to_parquet(str(tmp_path / "data" / "train-00000-of-00001.parquet"))
    ds = sf.load_dataset(str(tmp_path), split="train")
    assert ds.features.to_dict() == written.features.to_dict()
    for ours, theirs in zip(ds, written):
        want = np.asarray(theirs["image"])
        kind = theirs["kind"]
        assert ours["image"].shape == want.shape, kind
        if kind.startswith("jpeg"):
            diff = np.abs(ours["image"].astype(int) - want.astype(int))
            assert diff.max() <= JPEG_MAX_DIFF and diff.mean() <= JPEG_MEAN_DIFF, kind
        else:
            np.testing.assert_array_equal(ours["image"], want, err_msg=kind)
    seen = sorted(str(k) for rank in range(2) for b in sf.DataLoader(ds, batch_size=3, rank=rank, world_size=2, drop_last=False, output="numpy") for k in b["kind"])
    assert set(seen) == {k for k, _ in cells}
