"""`sf.load_dataset("imagefolder" | "audiofolder", data_dir=...)` with `datasets`' rules,
compared with `datasets`' own builders on the same folders: splits from folder names,
a `label` `ClassLabel` of the sorted folder names where there is more than one and every
file sits at one depth, `drop_labels`, and the rows in the same order."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import soundfile
from PIL import Image

import shardflow as sf


def write_images(root: Path, layout: dict[str, int], seed: int = 0) -> None:
    """`layout`: a file's folder below `root` -> how many PNGs it gets."""
    rng = np.random.default_rng(seed)
    for folder, count in layout.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            pixels = rng.integers(0, 256, size=(12 + i, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / folder / f"{i}.png")


@pytest.mark.parametrize(
    "layout",
    [
        {"train/cat": 3, "train/dog": 2, "test/cat": 2, "test/dog": 1, "test/bird": 1},  # splits and labels
        {"cat": 2, "dog": 3},  # one split, labels
        {"only": 4},  # one folder: no labels
        {"a": 2, "a/deeper": 2},  # two depths: no labels
    ],
)
@pytest.mark.parametrize("drop_labels", [None, True, False])
def test_imagefolder_gives_datasets_rows_labels_and_names(tmp_path: Path, layout: dict[str, int], drop_labels: bool | None) -> None:
    import datasets

    write_images(tmp_path / "data", layout)
    ours = sf.load_dataset("imagefolder", data_dir=str(tmp_path / "data"), drop_labels=drop_labels)
    theirs = datasets.load_dataset("imagefolder", data_dir=str(tmp_path / "data"), drop_labels=drop_labels)
    assert sorted(ours) == sorted(theirs)
    for split in theirs:
        assert ours[split].features.to_dict() == theirs[split].features.to_dict(), split
        rows = list(ours[split])
        assert len(rows) == len(theirs[split])
        for mine, reference in zip(rows, theirs[split]):
            np.testing.assert_array_equal(mine["image"], np.asarray(reference["image"]))
            assert mine.get("label") == reference.get("label")


def test_imagefolder_across_ranks_and_a_resume(tmp_path: Path) -> None:
    """A folder's split read on 2 ranks gives each image once, and a loader resumed
    from a state saved mid-epoch gives the rest of the epoch."""
    write_images(tmp_path / "data", {"train/a": 7, "train/b": 6, "train/c": 5})
    ds = sf.load_dataset("imagefolder", data_dir=str(tmp_path / "data"), split="train")
    seen = [tuple(image.shape) + (int(label),) for rank in range(2) for b in sf.DataLoader(ds, batch_size=2, rank=rank, world_size=2, drop_last=False) for image, label in zip(b["image"], b["label"])]
    assert len(seen) == 18 and sorted(int(s[-1]) for s in seen) == [0] * 7 + [1] * 6 + [2] * 5
    loader = sf.DataLoader(ds, batch_size=4, shuffle=True, seed=1)
    whole = [int(x) for b in loader for x in b["label"]]
    loader = sf.DataLoader(ds, batch_size=4, shuffle=True, seed=1)
    first = []
    for step, b in enumerate(loader):
        first += [int(x) for x in b["label"]]
        if step == 1:
            state = loader.state_dict()
            break
    resumed = sf.DataLoader(ds, batch_size=4, shuffle=True, seed=1)
    resumed.load_state_dict(state)
    assert first + [int(x) for b in resumed for x in b["label"]] == whole


def test_audiofolder_decodes_each_clip_with_its_label(tmp_path: Path) -> None:
    """`audiofolder`: `datasets`' builder needs torchcodec even to list the files, so
    the rows are checked against its rules (the same code as `imagefolder`, compared
    with `datasets` above): files in path order, the labels of their folders, each clip
    decoded as libsndfile decodes it."""
    import datasets

    rng = np.random.default_rng(3)
    clips = {}
    for label, (fmt, ext) in {"speech": ("WAV", "wav"), "music": ("FLAC", "flac")}.items():
        (tmp_path / "data" / "train" / label).mkdir(parents=True)
        for i in range(3):
            buf = io.BytesIO()
            soundfile.write(buf, 0.3 * rng.standard_normal(1600 + 100 * i), 16000, format=fmt, subtype="PCM_16")
            (tmp_path / "data" / "train" / label / f"{i}.{ext}").write_bytes(buf.getvalue())
            clips[(label, i)] = buf.getvalue()
    ours = sf.load_dataset("audiofolder", data_dir=str(tmp_path / "data"), split="train")
    names = ["music", "speech"]
    assert ours.features.to_dict() == datasets.Features({"audio": datasets.Audio(), "label": datasets.ClassLabel(names=names)}).to_dict()
    rows = list(ours)
    assert [(names[r["label"]]) for r in rows] == ["music"] * 3 + ["speech"] * 3
    for row, key in zip(rows, [(n, i) for n in names for i in range(3)]):
        want, rate = soundfile.read(io.BytesIO(clips[key]), dtype="float32")
        assert row["audio"]["sampling_rate"] == rate
        np.testing.assert_array_equal(row["audio"]["array"], want)
    resampled = ours.cast_column("audio", sf.Audio(sampling_rate=8000))
    assert {len(r["audio"]["array"]) for r in resampled} == {800, 850, 900}


def test_folder_metadata_is_refused_unless_dropped(tmp_path: Path) -> None:
    """A `metadata.csv` beside the images is not joined yet: refused by name, not
    passed over; `drop_metadata=True` reads the images alone."""
    write_images(tmp_path / "data", {"x": 2})
    (tmp_path / "data" / "x" / "metadata.csv").write_text("file_name,text\n0.png,a\n1.png,b\n")
    with pytest.raises(sf.InvalidArgumentError, match="metadata.csv"):
        sf.load_dataset("imagefolder", data_dir=str(tmp_path / "data"))
    ds = sf.load_dataset("imagefolder", data_dir=str(tmp_path / "data"), drop_metadata=True, split="train")
    assert len(list(ds)) == 2
