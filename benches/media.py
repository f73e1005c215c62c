"""Hub media to torch, side by side in one run: `Image` and `Audio` columns of Parquet
files `datasets` wrote, decoded by shardflow on its pool and by `datasets`.

    python benches/media.py [--images 20000] [--clips 600] [--repeats 3] [--only images,audio]

- **images**: ``--images`` JPEGs of 256-500 px a side (windows of scikit-learn's two
  sample photographs, saved by Pillow at quality 90: about 30 KB each) in a Hub
  layout (``data/train-*.parquet``, written by ``datasets`` with an ``Image`` feature).
  shardflow: ``sf.load_dataset(root, split="train")`` through ``sf.DataLoader(batch_size=32,
  output="torch")`` (each image decoded at its own size: a list of tensors). ``datasets``:
  ``load_dataset("parquet").with_format("torch")`` under torch's
  ``DataLoader(batch_size=32, num_workers=2)`` (as its docs show; a list per batch,
  the sizes differ). Images per second.
- **audio**: ``--clips`` clips of 10 s at 44.1 kHz, stereo, as FLAC and as MP3 (libsndfile
  writes them), decoded to 16 kHz mono. shardflow: ``.cast_column("audio",
  sf.Audio(sampling_rate=16000))`` through ``sf.DataLoader(batch_size=8)``. ``datasets``
  decodes audio through torchcodec, which needs FFmpeg's libraries; where it does not
  install (this machine), the reference is what its users do instead: ``Audio(decode=False)``
  and soundfile + soxr (HQ) per row, under ``DataLoader(num_workers=2)``. Seconds of audio
  decoded per second.

Medians of ``--repeats`` epochs each (the first epoch of each side included: the files
are in the page cache for both), and shardflow's ratio.
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

import shardflow as sf

BATCH = 32


def make_images(root: Path, n: int) -> None:
    import datasets
    from PIL import Image

    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(0)
    photos = load_sample_images().images  # two photographs, 427 x 640
    (root / "data").mkdir(parents=True)
    per_file = 5000
    for start in range(0, n, per_file):
        cells = []
        for i in range(start, min(n, start + per_file)):
            # A window of 256-427 x 256-500 px of a photograph, mirrored at random.
            photo = photos[i % len(photos)]
            h, w = rng.integers(256, photo.shape[0] + 1), rng.integers(256, 501)
            top, left = rng.integers(0, photo.shape[0] - h + 1), rng.integers(0, photo.shape[1] - w + 1)
            pixels = photo[top : top + h, left : left + w]
            if rng.random() < 0.5:
                pixels = pixels[:, ::-1]
            buf = io.BytesIO()
            Image.fromarray(np.ascontiguousarray(pixels)).save(buf, "JPEG", quality=90)
            cells.append({"bytes": buf.getvalue(), "path": f"{i}.jpg"})
        part = datasets.Dataset.from_dict({"image": cells, "n": list(range(start, start + len(cells)))})
        part = part.cast(datasets.Features({"image": datasets.Image(), "n": datasets.Value("int64")}))
        part.to_parquet(str(root / "data" / f"train-{start // per_file:05d}-of-{(n + per_file - 1) // per_file:05d}.parquet"))


def make_audio(root: Path, n: int, container: str) -> float:
    import datasets
    import soundfile

    rng = np.random.default_rng(1)
    rate, seconds = 44100, 10.0
    t = np.arange(int(rate * seconds)) / rate
    cells = []
    for i in range(n):
        tone = sum(0.2 * np.sin(2 * np.pi * f * t + p) for f, p in zip(rng.uniform(80, 4000, 4), rng.uniform(0, 6, 4)))
        samples = np.stack([tone, 0.8 * tone], axis=1) + 0.01 * rng.standard_normal((len(t), 2))
        buf = io.BytesIO()
        subtype = "MPEG_LAYER_III" if container == "MP3" else "PCM_16"
        soundfile.write(buf, np.clip(samples, -1, 1), rate, format=container, subtype=subtype)
        cells.append({"bytes": buf.getvalue(), "path": f"{i}.{container.lower()}"})
    (root / "data").mkdir(parents=True)
    part = datasets.Dataset.from_dict({"audio": cells, "n": list(range(n))})
    part = part.cast(datasets.Features({"audio": datasets.Audio(), "n": datasets.Value("int64")}))
    part.to_parquet(str(root / "data" / "train-00000-of-00001.parquet"))
    return n * seconds


def timed(run: Callable[[], int], repeats: int) -> tuple[float, int]:
    times, count = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        count = run()
        times.append(time.perf_counter() - start)
    return statistics.median(times), count


def images(root: Path, repeats: int) -> list[tuple[str, float]]:
    import datasets
    import torch

    def ours() -> int:
        loader = sf.DataLoader(sf.load_dataset(str(root), split="train"), batch_size=BATCH, output="torch")
        count = 0
        for batch in loader:
            assert isinstance(batch["image"][0], torch.Tensor)
            count += len(batch["image"])
        return count

    theirs_ds = datasets.load_dataset("parquet", data_files=str(root / "data" / "*.parquet"), split="train").with_format("torch")

    def theirs() -> int:
        loader = torch.utils.data.DataLoader(theirs_ds, batch_size=BATCH, num_workers=2, collate_fn=list)
        count = 0
        for batch in loader:
            assert isinstance(batch[0]["image"], torch.Tensor)
            count += len(batch)
        return count

    rows = []
    for name, run in (("shardflow, DataLoader(batch_size=32)", ours), ('datasets with_format("torch"), DataLoader(2)', theirs)):
        seconds, count = timed(run, repeats)
        rows.append((name, count / seconds))
    return rows


def soundfile_soxr(cell: dict[str, Any]) -> Any:
    import soundfile
    import soxr
    import torch

    samples, rate = soundfile.read(io.BytesIO(cell["audio"]["bytes"]), dtype="float32", always_2d=True)
    return torch.from_numpy(soxr.resample(samples.mean(axis=1), rate, 16000, quality="HQ"))


def audio(root: Path, seconds_of_audio: float, repeats: int) -> list[tuple[str, float]]:
    import datasets
    import torch

    def ours() -> int:
        ds = sf.load_dataset(str(root), split="train").cast_column("audio", sf.Audio(sampling_rate=16000))
        count = 0
        for batch in sf.DataLoader(ds, batch_size=8, output="torch"):
            count += sum(len(a) for a in batch["audio"]["array"])
        return count

    stored = datasets.load_dataset("parquet", data_files=str(root / "data" / "*.parquet"), split="train")
    stored = stored.cast_column("audio", datasets.Audio(decode=False))

    def theirs() -> int:
        loader = torch.utils.data.DataLoader(stored, batch_size=8, num_workers=2, collate_fn=lambda rows: [soundfile_soxr(r) for r in rows])
        return sum(len(a) for batch in loader for a in batch)

    rows = []
    samples = {}
    for name, run in (("shardflow, DataLoader(batch_size=8)", ours), ("datasets decode=False + soundfile + soxr, DataLoader(2)", theirs)):
        seconds, count = timed(run, repeats)
        samples[name] = count
        rows.append((name, seconds_of_audio / seconds))
    a, b = samples.values()
    assert abs(a - b) <= len(stored), f"both sides decode the same audio: {a} and {b} samples"
    return rows


def report(title: str, unit: str, rows: list[tuple[str, float]]) -> None:
    print(f"\n{title}")
    print(f"| runner | {unit} |")
    print("|---|---:|")
    for name, rate in rows:
        print(f"| {name} | {rate:,.0f} |")
    print(f"shardflow / peer: {rows[0][1] / rows[1][1]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--clips", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="images,audio")
    args = parser.parse_args()
    only = set(args.only.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        if "images" in only:
            root = Path(tmp) / "images"
            make_images(root, args.images)
            report(f"{args.images:,} JPEGs of 256-500 px from Hub-layout Parquet to torch tensors", "images/s", images(root, args.repeats))
        if "audio" in only:
            for container in ("FLAC", "MP3"):
                root = Path(tmp) / container
                seconds = make_audio(root, args.clips, container)
                report(f"{args.clips} clips of 10 s, 44.1 kHz stereo {container}, to 16 kHz mono", "audio s/s", audio(root, seconds, args.repeats))


if __name__ == "__main__":
    main()
