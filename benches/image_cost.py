"""What one photo costs: CPU milliseconds per photo for the harness's JPEG workload
(decode, resize the shorter side to 256, center-crop to 224x224), by shardflow on one
decode thread and by Pillow in a loop over the same bytes, and shardflow's samples/s on
all cores in a warm process (several epochs of one loader). Then decoding at each
photo's own size (no resize or crop): shardflow's samples/s against webdataset's
``.decode("rgb8")`` (Pillow), each over the same tars in batches of 256.

    python benches/image_cost.py [--repeats 3] [--data DIR]

DIR is the harness's data folder (``benches/harness.py --only images`` makes it). The
harness measures fresh processes with a memory sampler beside them; this measures the
work itself, so the two together show where a fresh process's time goes.
"""

from __future__ import annotations

import argparse
import glob
import io
import statistics
import tarfile
import time
from pathlib import Path

from PIL import Image

import shardflow as sf
from harness import resize_crop_224

OPTIONS = {"decode": {"jpg": "rgb8"}, "resize": 256, "center_crop": 224}
OWN_SIZE = {"decode": {"jpg": "rgb8"}}


def webdataset_own_size(data: Path) -> tuple[float, int]:
    """webdataset + Pillow at each photo's own size: (wall seconds, samples)."""
    import webdataset as wds

    urls = sorted(glob.glob(str(data / "part-*.tar")))
    pipeline = wds.WebDataset(urls, shardshuffle=False).decode("rgb8").to_tuple("jpg", "cls")
    # Images of their own sizes do not stack: batches are lists of samples.
    pipeline = pipeline.batched(256, collation_fn=None, partial=True)
    wall, samples = time.perf_counter(), 0
    for batch in pipeline:
        samples += len(batch)
    return time.perf_counter() - wall, samples


def photos(data: Path) -> list[bytes]:
    out = []
    for path in sorted(glob.glob(str(data / "part-*.tar"))):
        with tarfile.open(path) as tar:
            out += [tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".jpg")]  # type: ignore[union-attr]
    return out


def pillow_ms(jpegs: list[bytes], transform: bool) -> float:
    start = time.process_time()
    for jpeg in jpegs:
        image = Image.open(io.BytesIO(jpeg))
        if transform:
            resize_crop_224(image)
        else:
            image.load()
    return (time.process_time() - start) / len(jpegs) * 1000


def shardflow_epoch(data: Path, loader: sf.DataLoader | None = None, **loader_args: object) -> tuple[float, float, int]:
    """One epoch: (CPU seconds, wall seconds, samples)."""
    if loader is None:
        loader = sf.DataLoader(sf.dataset(str(data / "part-*.tar"), columns=["jpg", "cls"], format_options=OPTIONS), batch_size=256, **loader_args)
    cpu, wall, samples = time.process_time(), time.perf_counter(), 0
    for batch in loader:
        samples += len(batch["cls"])
    return time.process_time() - cpu, time.perf_counter() - wall, samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", type=Path, default=Path.home() / ".cache/shardflow/bench-data/images-1")
    args = parser.parse_args()
    if not list(args.data.glob("part-*.tar")):
        from harness import make_images

        args.data.mkdir(parents=True, exist_ok=True)
        make_images(args.data, 0.5)
    jpegs = photos(args.data)
    rows: dict[str, list[float]] = {
        "Pillow decode": [], "Pillow decode+resize+crop": [], "shardflow, 1 thread": [], "shardflow warm samples/s": [],
        "own size: webdataset samples/s": [], "own size: shardflow samples/s": [],
    }
    for _ in range(args.repeats):
        rows["Pillow decode"].append(pillow_ms(jpegs, transform=False))
        rows["Pillow decode+resize+crop"].append(pillow_ms(jpegs, transform=True))
        cpu, _, samples = shardflow_epoch(args.data, num_threads=1)
        rows["shardflow, 1 thread"].append(cpu / samples * 1000)
        loader = sf.DataLoader(sf.dataset(str(args.data / "part-*.tar"), columns=["jpg", "cls"], format_options=OPTIONS), batch_size=256)
        shardflow_epoch(args.data, loader)  # the first epoch faults its memory in
        _, wall, samples = shardflow_epoch(args.data, loader)
        rows["shardflow warm samples/s"].append(samples / wall)
        wall, samples = webdataset_own_size(args.data)
        rows["own size: webdataset samples/s"].append(samples / wall)
        own = sf.DataLoader(sf.dataset(str(args.data / "part-*.tar"), columns=["jpg", "cls"], format_options=OWN_SIZE), batch_size=256)
        shardflow_epoch(args.data, own)
        _, wall, samples = shardflow_epoch(args.data, own)
        rows["own size: shardflow samples/s"].append(samples / wall)
    print(f"{len(jpegs)} photos, median of {args.repeats}")
    for name, values in rows.items():
        unit = "" if "samples/s" in name else " CPU ms a photo"
        print(f"  {name:28} {statistics.median(values):8.2f}{unit}")


if __name__ == "__main__":
    main()
