"""The peer table: every loader on every workload it supports, each run in a fresh
process, loaders alternating, the median of the repeats.

    python benches/harness.py [--repeats 3] [--scale 1.0] [--only parquet,chat,...] [--loaders webdataset,...]

Data is generated once (seeded) under ``--data`` (default ``~/.cache/shardflow/bench-data``)
and reused. Each run is ``python benches/harness.py --child WORKLOAD LOADER DATA``, which
imports what the loader needs, waits until the process is idle (numpy's BLAS threads spin
for a while after its import), then reads one epoch in batches of 256 and reports, as
JSON, its samples, the time to its first batch, its wall time and its CPU time (its own
and its reaped children's: torch workers included). One more run of each loader, not
timed, gives its peak memory: the parent samples the PSS of the child and all its
descendants every 20 ms and keeps the peak of the sum. (Sampled during the timed runs, the
walk of the child's page tables slowed a loader that maps and unmaps memory: shardflow's
full shuffle of 256 KB rows took 2.4 s rather than 1.5 s.) Results go to
``benches/results/<machine>.md`` (and a PNG chart beside it when matplotlib is installed).

Workloads: Parquet, chat JSONL, TFRecord, WebDataset tar (raw bytes, and JPEG photos
decoded, resized and cropped to 224x224) and NPZ on local disk, and small objects on S3:
a SeaweedFS started on this machine, read directly (with wrk's ceiling beside it) and
through a proxy that adds 25 ms to every request. Random access: one epoch of a
full-permutation shuffle (HF's ``Dataset.shuffle(seed)``) over small rows (784 bytes) and
large ones (256 KB), against HF ``datasets``' map-style shuffle, Lance's ``take`` and
pyarrow's ``Table.take``.

On Parquet, Daft's ``to_torch_iter_dataset`` and Grain's ``DataLoader`` (over an ArrayRecord
copy of the rows, pickled) run too. LitData, MosaicML Streaming and Grain read formats of
their own: each workload they take is converted once (``python benches/harness.py
--convert WORKLOAD LOADER DATA``, untimed) into DATA/litdata, DATA/mds and DATA/grain, kept
like the data, and uploaded to the bucket for the S3 workloads. Loaders whose packages pin versions that the rest exclude run with another
interpreter (``--peers-python``; scripts/bench.sh makes its venv).

Metrics: samples/s, MB/s (the workload's bytes on disk / wall time), CPU seconds per GB
on disk, peak PSS (MB, summed over worker processes), time to first batch (ms), the
speed of each loader relative to shardflow's on the same workload, and on S3 the bytes
the client fetched from the server (counted at the proxy) beside the bytes of the samples
it delivered.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import io
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

BATCH = 256
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from faultproxy import FaultProxy  # noqa: E402
from servers import S3_KEY, S3_SECRET  # noqa: E402


# -- workloads: data ----------------------------------------------------------------


def make_parquet(directory: Path, scale: float) -> None:
    from rss_epochs import write

    write(directory, int(200_000 * scale))


def make_chat(directory: Path, scale: float) -> None:
    from peer_chat import write_shards

    write_shards(str(directory), 16, int(10_000 * scale))


def make_tfrecord(directory: Path, scale: float) -> None:
    from peer_formats import write_tfrecord

    for shard in range(4):
        write_tfrecord(str(directory / f"part-{shard}.tfrecord"), int(25_000 * scale))


def make_tar(directory: Path, scale: float) -> None:
    from peer_formats import write_tar

    for shard in range(4):
        write_tar(str(directory / f"part-{shard}.tar"), int(5_000 * scale))


def make_images(directory: Path, scale: float) -> None:
    """JPEG photos with a class label: crops of scikit-learn's two sample photographs
    (640x427), 256-448 px a side, zoomed up to 1.5x and flipped at random, at quality 90."""
    import sklearn.datasets
    import webdataset as wds
    from PIL import Image

    folder = Path(sklearn.datasets.__file__).parent / "images"
    photos = [Image.open(folder / name).convert("RGB") for name in ("china.jpg", "flower.jpg")]
    rng = random.Random(0)
    per_shard = int(1_000 * scale)
    for shard in range(4):
        with wds.TarWriter(str(directory / f"part-{shard}.tar")) as sink:
            for i in range(shard * per_shard, (shard + 1) * per_shard):
                label = rng.randrange(len(photos))
                photo = photos[label]
                w, h = rng.randint(256, 448), rng.randint(256, 448)
                zoom = rng.uniform(1.0, 1.5)
                cw, ch = min(photo.width, round(w / zoom)), min(photo.height, round(h / zoom))
                x, y = rng.randint(0, photo.width - cw), rng.randint(0, photo.height - ch)
                image = photo.resize((w, h), Image.Resampling.BILINEAR, box=(x, y, x + cw, y + ch))
                if rng.random() < 0.5:
                    image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
                jpeg = io.BytesIO()
                image.save(jpeg, "JPEG", quality=90)
                sink.write({"__key__": f"s{i:06d}", "jpg": jpeg.getvalue(), "cls": label})


def make_npz(directory: Path, scale: float) -> None:
    """One sample per file, as an NPZ dataset of images usually is."""
    import numpy as np

    rng = np.random.default_rng(0)
    for i in range(int(10_000 * scale)):
        np.savez(directory / f"sample-{i:06d}.npz", image=rng.integers(0, 255, (28, 28), np.uint8), label=np.int64(i % 10))


def make_large_rows(directory: Path, scale: float) -> None:
    """Issue 53's setup: 256 KB rows of random bytes, 10 files, as pyarrow writes them by
    default (snappy, dictionary pages, no page index), row groups of 64 rows."""
    from memory_rss import write

    write(directory, int(2_000 * scale), 256, compression="snappy", row_group_size=64)


# -- loaders: one epoch each, in batches (dicts of columns, or tuples) ---------------


def sf_loader(pattern: str, **dataset_args: object) -> Callable[[Path], Iterable]:
    def run(data: Path) -> Iterable:
        import shardflow as sf

        return sf.DataLoader(sf.dataset(str(data / pattern), **dataset_args), batch_size=BATCH)

    return run


def sf_tfrecord(data: Path) -> Iterable:
    import shardflow as sf

    features = {"image": sf.FixedLen((), "bytes"), "label": sf.FixedLen((), "int64")}
    return sf.DataLoader(sf.dataset(str(data / "part-*.tfrecord"), features=features), batch_size=BATCH)


def sf_chat(data: Path) -> Iterable:
    import shardflow as sf

    ds = sf.dataset(sorted(str(p) for p in data.glob("chat-*"))).shuffle(seed=7, buffer_size=10_000)
    return sf.DataLoader(ds, batch_size=BATCH)


def pyarrow_parquet(data: Path) -> Iterable:
    for path in sorted(data.glob("part-*.parquet")):
        yield from pyarrow_parquet_file(path)


def polars_parquet(data: Path) -> Iterable:
    import polars as pl

    frame = pl.scan_parquet(str(data / "part-*.parquet")).collect()
    for chunk in frame.iter_slices(BATCH):
        yield {"image": chunk["image"].to_numpy(), "label": chunk["label"].to_numpy()}


def torch_loader(make: Callable[[Path], object], workers: int, batch_size: int | None = None,
                 collate: Callable | None = None) -> Callable[[Path], Iterable]:
    def run(data: Path) -> Iterable:
        import torch.utils.data as tud

        context = "fork" if workers else None
        return tud.DataLoader(make(data), batch_size=batch_size, num_workers=workers, multiprocessing_context=context,
                              collate_fn=collate)

    return run


def parquet_for_torch(data: Path) -> object:
    """Row groups read with pyarrow, split between torch's workers by file."""
    import torch.utils.data as tud

    files = sorted(data.glob("part-*.parquet"))

    class Parquet(tud.IterableDataset):
        def __iter__(self):  # noqa: ANN204
            info = tud.get_worker_info()
            mine = files[info.id :: info.num_workers] if info else files
            for path in mine:
                yield from pyarrow_parquet_file(path)

    return Parquet()


def pyarrow_parquet_file(path: Path) -> Iterable:
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH):
        image = batch.column("image")
        yield {"image": image.flatten().to_numpy().reshape(len(image), -1), "label": batch.column("label").to_numpy()}


def hf_streaming(data: Path) -> Iterable:
    from datasets import load_dataset

    files = sorted(str(p) for p in data.glob("chat-*"))
    ds = load_dataset("json", data_files=files, split="train", streaming=True)
    return ds.shuffle(seed=7, buffer_size=10_000).batch(BATCH)


def hf_map_style(data: Path) -> Iterable:
    from datasets import load_dataset

    files = sorted(str(p) for p in data.glob("chat-*"))
    # The Arrow cache is built on the first run and reused (as users do).
    ds = load_dataset("json", data_files=files, split="train", cache_dir=str(data / ".hf-cache"))
    return ds.shuffle(seed=7).iter(batch_size=BATCH)


# Random access: one epoch in the order of a uniform permutation of every row (HF's
# `Dataset.shuffle(seed)`), in batches of BATCH rows; the columns of RANDOM_COLUMNS.
RANDOM_COLUMNS = {"shuffle-small": ["image", "label"], "shuffle-large": ["id", "image"]}


def random_columns(data: Path) -> list[str]:
    """By the data's folder (`shuffle-small[-s3]-<scale>`)."""
    return RANDOM_COLUMNS[data.name.rsplit("-", 1)[0].removesuffix("-s3")]


def sf_full_shuffle(data: Path) -> Iterable:
    import shardflow as sf

    ds = sf.dataset(str(data / "part-*.parquet"), columns=random_columns(data)).shuffle(seed=0)
    return sf.DataLoader(ds, batch_size=BATCH)


def sf_full_shuffle_s3(data: Path) -> Iterable:
    import shardflow as sf

    ds = sf.dataset(f"s3://bench/{s3_prefix()}/part-*.parquet", columns=random_columns(data),
                    storage_options=sf_s3_options()).shuffle(seed=0)
    return sf.DataLoader(ds, batch_size=BATCH)


def write_sf_decoded(spec: dict, data: Path, out: Path) -> None:
    """shardflow's decoded copy (`decoded_cache=`) as a first epoch writes it: every row read once."""
    import shardflow as sf

    ds = sf.dataset(str(data / "part-*.parquet"), columns=random_columns(data), decoded_cache=str(out))
    for _ in sf.DataLoader(ds, batch_size=BATCH):
        pass


def sf_decoded_shuffle(source: str) -> Iterable:
    """The full shuffle of the same files with their decoded copy warm (`source`)."""
    import shardflow as sf

    data = Path(source).parent
    ds = sf.dataset(str(data / "part-*.parquet"), columns=random_columns(data), decoded_cache=source).shuffle(seed=0)
    return sf.DataLoader(ds, batch_size=BATCH)


def write_hf_arrow(spec: dict, data: Path, out: Path) -> None:
    from datasets import Dataset

    files = sorted(str(p) for p in data.glob("part-*.parquet"))
    Dataset.from_parquet(files, columns=random_columns(data), cache_dir=str(out / "cache")).save_to_disk(str(out / "dataset"))


def hf_shuffled(source: str) -> Iterable:
    """HF's map-style Dataset (memory-mapped Arrow, as `save_to_disk` wrote it) shuffled:
    an indices mapping read through in order."""
    from datasets import load_from_disk

    return load_from_disk(f"{source}/dataset").shuffle(seed=0, keep_in_memory=True).iter(batch_size=BATCH)


def write_lance(spec: dict, data: Path, out: Path) -> None:
    import lance
    import pyarrow.dataset as pds

    table = pds.dataset(sorted(data.glob("part-*.parquet"))).to_table(columns=random_columns(Path(data)))
    lance.write_dataset(table, str(out / "data.lance"))


def lance_take(source: str) -> Iterable:
    """Lance's `take` of each batch of a uniform permutation of the rows."""
    import lance
    import numpy as np

    options = None
    if source.startswith("s3://"):
        options = {"endpoint": s3_endpoint(), "aws_access_key_id": S3_KEY, "aws_secret_access_key": S3_SECRET,
                   "region": "us-east-1", "allow_http": "true"}
    ds = lance.dataset(f"{source}/data.lance", storage_options=options)
    order = np.random.default_rng(0).permutation(ds.count_rows())
    for start in range(0, len(order), BATCH):
        yield ds.take(order[start:start + BATCH])


def pyarrow_take(data: Path, remote: bool = False) -> Iterable:
    """The whole table read into memory (`read_table`), then `Table.take` of each batch of a
    uniform permutation: fast, at the cost of memory as large as the data."""
    import numpy as np
    import pyarrow.parquet as pq

    files, filesystem = sorted(str(p) for p in data.glob("part-*.parquet")), None
    if remote:
        from pyarrow.fs import S3FileSystem

        host = s3_endpoint().split("://", 1)[1]
        filesystem = S3FileSystem(endpoint_override=host, scheme="http", access_key=S3_KEY, secret_key=S3_SECRET,
                                  region="us-east-1")
        files = [f"bench/{s3_prefix()}/{Path(f).name}" for f in files]
    table = pq.read_table(files, columns=random_columns(data), filesystem=filesystem)
    order = np.random.default_rng(0).permutation(table.num_rows)
    for start in range(0, len(order), BATCH):
        yield table.take(order[start:start + BATCH])


def tf_data(data: Path) -> Iterable:
    import tensorflow as tf

    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    files = sorted(str(p) for p in data.glob("part-*.tfrecord"))
    ds = tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE).batch(BATCH)
    ds = ds.map(lambda x: tf.io.parse_example(x, spec), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE).as_numpy_iterator()


def webdataset_for_torch(data: Path) -> object:
    import webdataset as wds

    urls = sorted(str(p) for p in data.glob("part-*.tar"))
    return wds.WebDataset(urls, shardshuffle=False, workersplitter=wds.split_by_worker).decode().to_tuple("jpg", "cls", "json").batched(BATCH)


def resize_crop_224(image: object) -> object:
    """torchvision's Resize(256) + CenterCrop(224) on a PIL image, as an (224, 224, 3) uint8
    array: the shorter side scaled to 256 (antialiased bilinear), the centre cut out."""
    import numpy as np
    from PIL import Image

    image = image.convert("RGB")  # type: ignore[attr-defined]
    w, h = image.size
    size = (256, int(256 * h / w)) if w <= h else (int(256 * w / h), 256)
    image = image.resize(size, Image.Resampling.BILINEAR)
    left, top = round((size[0] - 224) / 2), round((size[1] - 224) / 2)
    return np.asarray(image.crop((left, top, left + 224, top + 224)))


def webdataset_pil_for_torch(data: Path) -> object:
    """Decoded by PIL and transformed sample by sample; torch's DataLoader batches them."""
    import webdataset as wds

    urls = sorted(str(p) for p in data.glob("part-*.tar"))
    ds = wds.WebDataset(urls, shardshuffle=False, workersplitter=wds.split_by_worker)
    return ds.decode("pil").to_tuple("jpg", "cls").map_tuple(resize_crop_224, int)


def npz_files_for_torch(data: Path) -> object:
    import numpy as np
    import torch.utils.data as tud

    files = sorted(data.glob("sample-*.npz"))

    class Npz(tud.Dataset):
        def __len__(self) -> int:
            return len(files)

        def __getitem__(self, i: int) -> dict:
            with np.load(files[i]) as archive:
                return {"image": archive["image"], "label": archive["label"]}

    return Npz()


# -- S3: small objects on a local SeaweedFS (see `serve_s3`) -------------------------

S3_OBJECT_BYTES = 100 * 1024
# Objects per prefix: fewer where latency is added, as the slower peers take minutes.
S3_PREFIXES = {"small": 2_000, "slow": 500}


def s3_endpoint() -> str:
    return os.environ["SHARDFLOW_BENCH_S3"]


def s3_prefix() -> str:
    return os.environ["SHARDFLOW_BENCH_S3_PREFIX"]


def s3_payload() -> bytes:
    """Every object's bytes."""
    return random.Random(0).randbytes(S3_OBJECT_BYTES)


def s3_client():  # noqa: ANN201
    import boto3

    return boto3.client("s3", endpoint_url=s3_endpoint(), aws_access_key_id=S3_KEY, aws_secret_access_key=S3_SECRET,
                        region_name="us-east-1")


def sf_s3_options() -> dict:
    return {"endpoint_url": s3_endpoint(), "access_key_id": S3_KEY, "secret_access_key": S3_SECRET, "region": "us-east-1"}


def sf_s3(data: Path) -> Iterable:
    import shardflow as sf

    ds = sf.dataset(f"s3://bench/{s3_prefix()}/", format="raw", storage_options=sf_s3_options())
    return sf.DataLoader(ds, batch_size=BATCH, output="arrow")


sf_s3.imports = ["pyarrow"]  # its batches are pyarrow's: imported with the rest, before the timing


def s3torchconnector_loader(workers: int) -> Callable[[Path], Iterable]:
    def run(data: Path) -> Iterable:
        import torch.utils.data as tud
        from s3torchconnector import S3ClientConfig, S3IterableDataset

        ds = S3IterableDataset.from_prefix(
            f"s3://bench/{s3_prefix()}/", region="us-east-1", endpoint=s3_endpoint(),
            s3client_config=S3ClientConfig(force_path_style=True), transform=read_s3_object, enable_sharding=True,
        )
        return tud.DataLoader(ds, batch_size=BATCH, num_workers=workers, multiprocessing_context="fork" if workers else None,
                              collate_fn=collate_objects)

    return run


def collate_objects(objects: list[bytes]) -> dict[str, list[bytes]]:
    return {"bytes": objects}


def read_s3_object(reader: object) -> bytes:
    return reader.read()  # type: ignore[attr-defined]


def boto3_for_torch(data: Path) -> object:
    import torch.utils.data as tud

    class Objects(tud.Dataset):
        """One object per sample; each worker makes its own client."""

        client = None

        def __init__(self) -> None:
            self.keys = [f"{s3_prefix()}/{i:05d}.bin" for i in range(S3_PREFIXES[s3_prefix()])]

        def __len__(self) -> int:
            return len(self.keys)

        def __getitem__(self, i: int) -> bytes:
            if self.client is None:
                self.client = s3_client()
            return self.client.get_object(Bucket="bench", Key=self.keys[i])["Body"].read()

    return Objects()


# -- LitData and MosaicML Streaming: their own formats, converted once from the samples -------


def parquet_samples(data: Path) -> Iterator[dict]:
    import pyarrow.parquet as pq

    for path in sorted(data.glob("part-*.parquet")):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH):
            images = batch.column("image").flatten().to_numpy().reshape(len(batch), -1)
            for image, label, caption in zip(images, batch.column("label").to_pylist(), batch.column("caption").to_pylist()):
                yield {"image": image, "label": label, "caption": caption}


def tar_samples(data: Path) -> Iterator[dict]:
    """As the webdataset loader decodes them: jpg bytes, cls an int, json a dict."""
    import webdataset as wds

    urls = sorted(str(p) for p in data.glob("part-*.tar"))
    for sample in wds.WebDataset(urls, shardshuffle=False).decode():
        yield {key: sample[key] for key in ("jpg", "cls", "json")}


def s3_samples(data: Path) -> Iterator[dict]:
    payload = s3_payload()
    for _ in range(S3_PREFIXES[s3_prefix()]):
        yield {"bytes": payload}


@dataclass(frozen=True)
class Converted:
    """A loader that reads a copy of the workload in a format of its own: `write(spec, data, out)`
    makes it once from the workload's samples in DATA/<folder> (see `convert`); on S3 it reads
    that copy from s3://bench/<folder>-<prefix>/."""

    folder: str
    write: Callable[[dict, Path, Path], None]
    read: Callable[[str], Iterable]
    remote: bool

    def __call__(self, data: Path) -> Iterable:
        return self.read(f"s3://bench/{self.folder}-{s3_prefix()}" if self.remote else str(data / self.folder))


def write_litdata(spec: dict, data: Path, out: Path) -> None:
    import litdata

    # One input and one worker keep the samples in order; chunks of 64 MB, as MDS's shards.
    litdata.optimize(fn=spec["samples"], inputs=[data], output_dir=str(out), chunk_bytes="64MB", num_workers=1,
                     reorder_files=False, verbose=False)


def write_mds(spec: dict, data: Path, out: Path) -> None:
    from streaming import MDSWriter

    with MDSWriter(out=str(out), columns=spec["mds_columns"]) as writer:
        for sample in spec["samples"](data):
            writer.write(sample)


def write_grain(spec: dict, data: Path, out: Path) -> None:
    """ArrayRecord, the format Grain reads natively: one record per sample, pickled (Grain
    leaves the encoding to the user), one record per chunk for random access as Grain's
    documentation advises, uncompressed (a record read 4x faster than with the default
    brotli on this machine)."""
    import pickle

    from array_record.python.array_record_module import ArrayRecordWriter

    out.mkdir(parents=True, exist_ok=True)
    writer = ArrayRecordWriter(str(out / "samples.array_record"), "group_size:1,uncompressed")
    for sample in spec["samples"](data):
        writer.write(pickle.dumps(sample, protocol=5))
    writer.close()


def grain_loader(workers: int) -> Callable[[str], Iterable]:
    """Grain's DataLoader over its ArrayRecord copy: records in order, unpickled and batched
    by Grain's own operations, in `workers` processes."""

    def read(source: str) -> Iterable:
        import pickle

        import grain

        class Unpickle(grain.transforms.Map):
            def map(self, record: bytes) -> dict:
                return pickle.loads(record)

        records = grain.sources.ArrayRecordDataSource(sorted(str(p) for p in Path(source).glob("*.array_record")))
        return grain.DataLoader(data_source=records, sampler=grain.samplers.SequentialSampler(len(records)),
                                operations=[Unpickle(), grain.transforms.Batch(BATCH)], worker_count=workers)

    return read


def daft_parquet(data: Path) -> Iterable:
    """Daft's torch IterableDataset of the Parquet files (rows as dicts, the image a tensor
    column), batched by torch's DataLoader with no workers: each worker would read every
    row."""
    import daft
    import torch.utils.data as tud

    # Daft subclasses torchdata's DataPipes when torchdata imports, and fails on torchdata
    # 0.10+, which has none (it catches ImportError only): hide torchdata from it.
    sys.modules["torchdata"] = None  # type: ignore[assignment]

    frame = daft.read_parquet(sorted(str(p) for p in data.glob("part-*.parquet")))
    # As a tensor column the image comes as a numpy array, not a list of 784 ints.
    frame = frame.with_column("image", frame["image"].cast(daft.DataType.tensor(daft.DataType.uint8(), (784,))))
    return tud.DataLoader(frame.to_torch_iter_dataset(), batch_size=BATCH)


def scratch() -> str:
    """An empty cache folder for this run, removed when it ends: a cache kept from an earlier
    run would turn this one's S3 reads into local ones."""
    path = tempfile.mkdtemp(prefix="shardflow-bench-")
    atexit.register(shutil.rmtree, path, True)
    return path


def litdata_s3() -> dict:
    """LitData's storage_options for the bench's server: boto3 and s3fs take the endpoint from
    them and the keys from the environment; obstore, which makes LitData's data GETs, copies
    boto3's endpoint."""
    from litdata.streaming import downloader

    # LitData gives obstore client options of its own, without allow_http (and obstore then
    # ignores AWS_ALLOW_HTTP), so it cannot reach a plain-http server. That one option is added.
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True  # type: ignore[typeddict-unknown-key]
    return {"endpoint_url": s3_endpoint()}


def litdata_streaming(workers: int) -> Callable[[str], Iterable]:
    def read(source: str) -> Iterable:
        import litdata

        remote = source.startswith("s3://")
        ds = litdata.StreamingDataset(source, cache_dir=scratch() if remote else None,
                                      storage_options=litdata_s3() if remote else None)
        return litdata.StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers)

    return read


def mds_dataset(source: str) -> object:
    from streaming import StreamingDataset

    if not source.startswith("s3://"):
        return StreamingDataset(local=source, batch_size=BATCH)
    # MosaicML Streaming's boto3 client takes a custom endpoint from here only.
    os.environ["S3_ENDPOINT_URL"] = s3_endpoint()
    return StreamingDataset(remote=source, local=scratch(), batch_size=BATCH)


def converted_peers(remote: bool = False) -> dict[str, Converted]:
    peers = {}
    for w in (0, 2):
        peers[f"litdata StreamingDataset in StreamingDataLoader({w})"] = Converted(
            "litdata", write_litdata, litdata_streaming(w), remote)
    for w in (0, 2):
        peers[f"mosaicml-streaming StreamingDataset in torch DataLoader({w})"] = Converted(
            "mds", write_mds, torch_loader(mds_dataset, w, BATCH), remote)
    return peers


def litdata_raw(source: str, storage_options: dict | None = None, transform: Callable | None = None,
                extensions: list[str] | None = None) -> object:
    """LitData's StreamingRawDataset: one file (or object) per sample, no conversion."""
    from litdata import StreamingRawDataset
    from litdata.raw.indexer import FileIndexer

    class Listing(FileIndexer):
        """Lists the files on every run. LitData's default keeps its index in the cache and also
        uploads it into the bucket's prefix, where the other loaders would take it for a sample."""

        def build_or_load_index(self, input_dir: str, cache_dir: str, storage_options: dict | None,
                                recompute_index: bool = False) -> list:
            return self.discover_files(input_dir, storage_options)

    return StreamingRawDataset(source, cache_dir=scratch(), indexer=Listing(extensions=extensions),
                               storage_options=storage_options, transform=transform)


def load_npz(raw: bytes) -> dict:
    import numpy as np

    with np.load(io.BytesIO(raw)) as archive:
        return {"image": archive["image"], "label": archive["label"]}


def litdata_raw_npz(data: Path) -> object:
    # The data folder also holds the harness's marker file.
    return litdata_raw(str(data), transform=load_npz, extensions=[".npz"])


def litdata_raw_s3(data: Path) -> object:
    return litdata_raw(f"s3://bench/{s3_prefix()}/", storage_options=litdata_s3())


def batch_rows(batch: object) -> int:
    if isinstance(batch, dict):
        return len(next(iter(batch.values())))
    if isinstance(batch, (tuple, list)):  # webdataset's [jpg, cls, json] columns
        return len(batch[1])
    if hasattr(batch, "num_rows"):
        return batch.num_rows
    raise TypeError(type(batch))


# What each loader (by the first word of its name) imports, done before the clock starts.
IMPORTS = {
    "shardflow": ["shardflow"],
    "pyarrow": ["pyarrow.parquet"],
    "polars": ["polars"],
    "torch": ["torch.utils.data", "pyarrow.parquet"],
    "datasets": ["datasets"],
    "lance": ["lance", "pyarrow"],
    "tf.data": ["tensorflow"],
    "webdataset": ["webdataset", "torch.utils.data", "PIL.Image"],
    "np.load": ["torch.utils.data"],
    "s3torchconnector": ["s3torchconnector", "torch.utils.data"],
    "boto3": ["boto3", "torch.utils.data"],
    "litdata": ["litdata", "torch.utils.data"],
    "daft": ["daft", "torch.utils.data"],
    "grain": ["grain", "array_record.python.array_record_module"],
    "mosaicml-streaming": ["streaming", "torch.utils.data"],
}
# Loaders (by the first word of their name) whose packages pin versions that the others'
# exclude: they run with --peers-python (see scripts/bench.sh).
PEERS_VENV = {"litdata", "mosaicml-streaming"}

WORKLOADS: dict[str, dict] = {
    "parquet": {
        "title": "Parquet: 784-byte image + label + caption, 8 files, row groups of 10k",
        "make": make_parquet,
        "files": "part-*.parquet",
        "samples": parquet_samples,
        "mds_columns": {"image": "ndarray:uint8:784", "label": "int", "caption": "str"},
        "loaders": {
            "shardflow": sf_loader("part-*.parquet"),
            "pyarrow iter_batches+to_numpy": pyarrow_parquet,
            "polars read+iter_slices": polars_parquet,
            "torch DataLoader(0) + pyarrow": torch_loader(parquet_for_torch, 0),
            "torch DataLoader(2) + pyarrow": torch_loader(parquet_for_torch, 2),
            "daft to_torch_iter_dataset in torch DataLoader(0)": daft_parquet,
            "grain DataLoader(0) on its ArrayRecord copy": Converted("grain", write_grain, grain_loader(0), False),
            "grain DataLoader(2) on its ArrayRecord copy": Converted("grain", write_grain, grain_loader(2), False),
            **converted_peers(),
        },
    },
    "chat": {
        "title": "chat JSONL (messages: list<struct>), 16 shards, half gzip, shuffle buffer 10k",
        "make": make_chat,
        "files": "chat-*",
        "loaders": {
            "shardflow": sf_chat,
            "datasets streaming": hf_streaming,
            "datasets map-style (cached)": hf_map_style,
        },
    },
    "tfrecord": {
        "title": "TFRecord of tf.train.Example {image: 784 bytes, label}, 4 files",
        "make": make_tfrecord,
        "files": "part-*.tfrecord",
        "loaders": {
            "shardflow": sf_tfrecord,
            "tf.data": tf_data,
        },
    },
    "tar": {
        "title": "WebDataset tar {jpg: 8 KB, cls, json}, 4 shards",
        "make": make_tar,
        "files": "part-*.tar",
        "samples": tar_samples,
        "mds_columns": {"jpg": "bytes", "cls": "int", "json": "json"},
        "loaders": {
            "shardflow": sf_loader("part-*.tar", columns=["jpg", "cls", "json"]),
            "webdataset in torch DataLoader(0)": torch_loader(webdataset_for_torch, 0),
            "webdataset in torch DataLoader(2)": torch_loader(webdataset_for_torch, 2),
            **converted_peers(),
        },
    },
    "images": {
        "title": "WebDataset tar {jpg: a photo, 256-448 px a side, cls}, 4 shards; decoded, resized to 256, cropped to 224x224",
        "make": make_images,
        "files": "part-*.tar",
        "loaders": {
            "shardflow": sf_loader("part-*.tar", columns=["jpg", "cls"],
                                   format_options={"decode": {"jpg": "rgb8"}, "resize": 256, "center_crop": 224}),
            "webdataset + PIL in torch DataLoader(0)": torch_loader(webdataset_pil_for_torch, 0, BATCH),
            "webdataset + PIL in torch DataLoader(2)": torch_loader(webdataset_pil_for_torch, 2, BATCH),
        },
    },
    "npz": {
        "title": "NPZ, one 28x28 image + label per file",
        "make": make_npz,
        "files": "sample-*.npz",
        "loaders": {
            "shardflow": sf_loader("sample-*.npz"),
            "np.load in torch DataLoader(0)": torch_loader(npz_files_for_torch, 0, BATCH),
            "np.load in torch DataLoader(2)": torch_loader(npz_files_for_torch, 2, BATCH),
            "litdata StreamingRawDataset in torch DataLoader(0)": torch_loader(litdata_raw_npz, 0, BATCH),
            "litdata StreamingRawDataset in torch DataLoader(2)": torch_loader(litdata_raw_npz, 2, BATCH),
        },
    },
}
RANDOM_LOADERS = {
    "shardflow": sf_full_shuffle,
    "shardflow, decoded_cache= (its copy, made by a first epoch)": Converted("sf-decoded", write_sf_decoded, sf_decoded_shuffle, False),
    "datasets map-style shuffle(seed).iter": Converted("hf-arrow", write_hf_arrow, hf_shuffled, False),
    "lance take of shuffled batches": Converted("lance", write_lance, lance_take, False),
    "pyarrow read_table + Table.take (all in memory)": pyarrow_take,
}
# From S3, the peers that read it (HF's map-style Dataset memory-maps local files only).
RANDOM_S3_LOADERS = {
    "shardflow": sf_full_shuffle_s3,
    "lance take of shuffled batches": Converted("lance", write_lance, lance_take, True),
    "pyarrow read_table + Table.take (all in memory)": lambda data: pyarrow_take(data, remote=True),
}
for name, title, make in (
    ("shuffle-small", "784-byte image + label, the parquet workload's files", make_parquet),
    ("shuffle-large", "256 KB rows, 10 Parquet files, pyarrow's defaults (snappy), row groups of 64", make_large_rows),
):
    for remote in (False, True):
        WORKLOADS[f"{name}-s3" if remote else name] = {
            "title": f"Full-permutation shuffle (random access){' from S3 (SeaweedFS on this machine)' if remote else ''}, {title}",
            "make": make,
            "files": "part-*.parquet",
            "loaders": RANDOM_S3_LOADERS if remote else RANDOM_LOADERS,
            "upload": remote,
        }
S3_LOADERS = {
    "shardflow": sf_s3,
    "s3torchconnector in torch DataLoader(0)": s3torchconnector_loader(0),
    "s3torchconnector in torch DataLoader(2)": s3torchconnector_loader(2),
    "boto3 in torch DataLoader(0)": torch_loader(boto3_for_torch, 0, BATCH, collate_objects),
    "boto3 in torch DataLoader(2)": torch_loader(boto3_for_torch, 2, BATCH, collate_objects),
    "litdata StreamingRawDataset in torch DataLoader(0)": torch_loader(litdata_raw_s3, 0, BATCH, collate_objects),
    "litdata StreamingRawDataset in torch DataLoader(2)": torch_loader(litdata_raw_s3, 2, BATCH, collate_objects),
    **converted_peers(remote=True),
}
for latency_ms in (0, 25):
    added = f", +{latency_ms} ms per request" if latency_ms else ""
    prefix = "slow" if latency_ms else "small"
    WORKLOADS[f"s3+{latency_ms}ms" if latency_ms else "s3"] = {
        "title": f"S3 (SeaweedFS on this machine{added}): "
        f"{S3_PREFIXES[prefix]:,} objects of {S3_OBJECT_BYTES // 1024} KB, one object = one sample",
        "latency": latency_ms / 1000,
        "prefix": prefix,
        "samples": s3_samples,
        "mds_columns": {"bytes": "bytes"},
        "loaders": S3_LOADERS,
    }


# -- the child: one epoch --------------------------------------------------------------


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def wait_until_idle(limit_s: float = 3.0) -> None:
    """Imports leave threads busy after they return: numpy's OpenBLAS threads spin for about
    50 ms of CPU. Waits until this process is idle, so that no loader is charged for them."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        before = cpu_seconds()
        time.sleep(0.05)
        if cpu_seconds() - before < 0.002:
            return


def child(workload: str, loader: str, data: Path) -> None:
    sys.path.insert(0, str(HERE))
    run = WORKLOADS[workload]["loaders"][loader]
    # Imports are not part of the timing: a training script has them done already.
    for module in ["numpy", *IMPORTS.get(loader.split(" ")[0], []), *getattr(run, "imports", [])]:
        importlib.import_module(module)
    wait_until_idle()

    cpu, start = cpu_seconds(), time.perf_counter()
    first = None
    samples = 0
    for batch in run(data):
        if first is None:
            first = time.perf_counter() - start
        samples += batch_rows(batch)
    wall = time.perf_counter() - start
    print(json.dumps({"samples": samples, "first": first, "wall": wall, "cpu": cpu_seconds() - cpu}))


def convert(workload: str, loader: str, data: Path) -> None:
    """Writes the copy `loader` reads, once (kept beside the data), with the loader's own
    packages; for S3 uploads it too, as the bucket lasts one harness run."""
    sys.path.insert(0, str(HERE))
    spec = WORKLOADS[workload]
    peer = spec["loaders"][loader]
    out = data / peer.folder
    if not (out / ".complete").exists():
        shutil.rmtree(out, ignore_errors=True)
        start = time.perf_counter()
        peer.write(spec, data, out)
        # The time the copy took to make, for the report (`copy_seconds`).
        (out / ".complete").write_text(f"{time.perf_counter() - start:.2f}")
    if peer.remote:
        client = s3_client()
        for path in sorted(out.rglob("*")):
            if path.is_file() and path.name != ".complete":
                client.upload_file(str(path), "bench", f"{peer.folder}-{s3_prefix()}/{path.relative_to(out)}")


# -- the parent ------------------------------------------------------------------------


def tree_pss_mb(root: int) -> float:
    """PSS of `root` and its descendants, summed (MB)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child_pid, parent in parents.items():
            if parent == pid and child_pid not in tree:
                tree.add(child_pid)
                frontier.append(child_pid)
    total = 0
    for pid in tree:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def run_once(workload: str, loader: str, data: Path, python: str, proxy: FaultProxy | None = None,
             memory: bool = False) -> dict:
    """One epoch in a fresh `python` process; with `proxy`, also the bytes it sent (`fetched`);
    with `memory`, its peak PSS (`pss`, sampled, which slows the run it watches)."""
    if proxy is not None:
        proxy.reset_counts()
    proc = subprocess.Popen([python, __file__, "--child", workload, loader, str(data)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0.0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_pss_mb(proc.pid))
            done.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    if memory:
        sampler.start()
    out, err = proc.communicate()
    done.set()
    if memory:
        sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{workload}/{loader} failed:\n{err[-3000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    result["pss"] = peak
    if proxy is not None:
        result["fetched"] = proxy.bytes_sent
    return result


@contextlib.contextmanager
def serve_s3(directory: Path) -> Iterator[tuple[str, FaultProxy]]:
    """A SeaweedFS on this machine holding the small objects, and a proxy in front of it
    (for added latency, and to count bytes): yields (server URL, proxy)."""
    from concurrent.futures import ThreadPoolExecutor

    from servers import Seaweed

    # No auth, so wrk's unsigned GETs are served like the loaders' signed ones.
    server = Seaweed(directory, auth=False)
    proxy = FaultProxy("127.0.0.1", server.ports["s3"])
    try:
        client = server.client()
        client.create_bucket(Bucket="bench")
        payload = s3_payload()
        keys = [f"{prefix}/{i:05d}.bin" for prefix, n in S3_PREFIXES.items() for i in range(n)]
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(lambda key: client.put_object(Bucket="bench", Key=key, Body=payload), keys))
        yield server.s3_url, proxy
    finally:
        proxy.close()
        server.stop()


def prepare(data_root: Path, workload: str, scale: float) -> Path:
    directory = data_root / f"{workload}-{scale:g}"
    marker = directory / ".complete"
    if not marker.exists():
        directory.mkdir(parents=True, exist_ok=True)
        WORKLOADS[workload]["make"](directory, scale)
        marker.write_text("")
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs=3, metavar=("WORKLOAD", "LOADER", "DATA"), help=argparse.SUPPRESS)
    parser.add_argument("--convert", nargs=3, metavar=("WORKLOAD", "LOADER", "DATA"), help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="data size relative to the default")
    parser.add_argument("--only", default=",".join(WORKLOADS))
    parser.add_argument("--loaders", default=None,
                        help="peers to run beside shardflow, by the start of their names (e.g. 's3torchconnector,boto3')")
    parser.add_argument("--data", default=str(Path.home() / ".cache/shardflow/bench-data"))
    parser.add_argument("--out", default=str(HERE / "results" / f"{platform.node() or 'machine'}.md"))
    parser.add_argument("--peers-python", default=os.environ.get("SHARDFLOW_BENCH_PEERS_PYTHON", sys.executable),
                        help="the interpreter of the loaders in PEERS_VENV (LitData, MosaicML Streaming)")
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], Path(args.child[2]))
        return
    if args.convert:
        convert(args.convert[0], args.convert[1], Path(args.convert[2]))
        return
    sys.path.insert(0, str(HERE))
    lines = [
        f"# shardflow and its peers on {platform.node()}",
        "",
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, batch {BATCH}, "
        f"median of {args.repeats} runs, each loader in a fresh process, loaders alternating. "
        f"Made by `python benches/harness.py --repeats {args.repeats} --scale {args.scale:g}`.",
        "",
    ]
    chart: dict[str, dict[str, float]] = {}
    workloads = args.only.split(",")
    with contextlib.ExitStack() as stack:
        s3 = None
        if any("latency" in WORKLOADS[w] or WORKLOADS[w].get("upload") for w in workloads):
            s3 = stack.enter_context(serve_s3(Path(stack.enter_context(tempfile.TemporaryDirectory()))))
        for workload in workloads:
            lines += measure_workload(workload, args, s3, chart)
    write_report(lines, chart, Path(args.out))


def measure_workload(workload: str, args: argparse.Namespace, s3: tuple[str, FaultProxy] | None,
                     chart: dict[str, dict[str, float]]) -> list[str]:
    """Runs every loader of `workload` `args.repeats` times, alternating; its table."""
    spec = WORKLOADS[workload]
    # shardflow, and the peers `--loaders` names (by the start of their names; all by default).
    loaders = {name: loader for name, loader in spec["loaders"].items()
               if name == "shardflow" or args.loaders is None or name.startswith(tuple(args.loaders.split(",")))}
    python = {name: args.peers_python if name.split(" ")[0] in PEERS_VENV else sys.executable for name in loaders}
    ceiling = None
    # The proxy that counts the bytes of the timed runs, where they go through it.
    counted = None
    if "latency" in spec:
        url, proxy = s3
        proxy.set_faults(latency=spec["latency"])
        counted = proxy if spec["latency"] else None
        # The children read the endpoint from here, and s3torchconnector its credentials.
        os.environ["SHARDFLOW_BENCH_S3"] = proxy.url if spec["latency"] else url
        os.environ.update(SHARDFLOW_BENCH_S3_PREFIX=spec["prefix"], AWS_ACCESS_KEY_ID=S3_KEY, AWS_SECRET_ACCESS_KEY=S3_SECRET)
        data = Path(args.data) / f"s3-{spec['prefix']}"
        data.mkdir(parents=True, exist_ok=True)
        objects = S3_PREFIXES[spec["prefix"]]
        size_mb = objects * S3_OBJECT_BYTES / 1e6
        from peer_s3 import wrk_run

        paths = [f"bench/{spec['prefix']}/{i:05d}.bin" for i in range(objects)]
        measured = wrk_run(os.environ["SHARDFLOW_BENCH_S3"], paths)
        ceiling = measured[0] if measured else None
    else:
        data = prepare(Path(args.data), workload, args.scale)
        size_mb = sum(p.stat().st_size for p in data.glob(spec["files"])) / 1e6
        if spec.get("upload"):
            # The workload's files in the bucket, under its name.
            url, _ = s3
            os.environ.update(SHARDFLOW_BENCH_S3=url, SHARDFLOW_BENCH_S3_PREFIX=workload,
                              AWS_ACCESS_KEY_ID=S3_KEY, AWS_SECRET_ACCESS_KEY=S3_SECRET)
            client = s3_client()
            for path in sorted(data.glob(spec["files"])):
                client.upload_file(str(path), "bench", f"{workload}/{path.name}")
    # One conversion for each copy (the loaders that read one share it), before any run.
    copies = {loader.folder: name for name, loader in loaders.items() if isinstance(loader, Converted)}
    for name in copies.values():
        subprocess.run([python[name], __file__, "--convert", workload, name, str(data)], check=True)
    runs: dict[str, list[dict]] = {name: [] for name in loaders}
    for _ in range(args.repeats):
        for name in loaders:
            runs[name].append(run_once(workload, name, data, python[name], counted))
    samples = {r["samples"] for rs in runs.values() for r in rs}
    assert len(samples) == 1, f"{workload}: loaders disagree on the sample count: {samples}"
    n = samples.pop()
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k not in ("samples", "pss")}
           for name, rs in runs.items()}
    for name in loaders:
        med[name]["pss"] = run_once(workload, name, data, python[name], counted, memory=True)["pss"]
    if "latency" in spec and counted is None:
        # The direct runs bypass the proxy, which (in Python) would cap their speed: one more
        # run of each through it counts the bytes.
        os.environ["SHARDFLOW_BENCH_S3"] = proxy.url
        for name in loaders:
            med[name]["fetched"] = run_once(workload, name, data, python[name], proxy)["fetched"]
        os.environ["SHARDFLOW_BENCH_S3"] = url
    base = med["shardflow"]["wall"]
    header = ["loader", "samples/s", "MB/s", "CPU s/GB", "peak PSS MB", "first batch ms", "shardflow is"]
    if "latency" in spec:
        header += ["MB fetched", "fetched / delivered"]

    def row(*cells: str) -> str:
        return "| " + " | ".join([*cells, *[""] * (len(header) - len(cells))]) + " |"

    lines = [f"## {spec['title']}", "", f"{n:,} samples, {size_mb:.0f} MB.", "", row(*header), "|---" * len(header) + "|"]
    chart[workload] = {}
    for name, m in med.items():
        cells = [name, f"{n / m['wall']:,.0f}", f"{size_mb / m['wall']:.0f}", f"{m['cpu'] / (size_mb / 1e3):.1f}",
                 f"{m['pss']:.0f}", f"{m['first'] * 1e3:.0f}", "" if name == "shardflow" else f"{m['wall'] / base:.1f}x faster"]
        if "fetched" in m:
            # Every sample is one whole object: the bytes delivered are n of them.
            cells += [f"{m['fetched'] / 1e6:.0f}", f"{m['fetched'] / (n * S3_OBJECT_BYTES):.2f}"]
        lines.append(row(*cells))
        chart[workload][name] = n / m["wall"]
    if ceiling is not None:
        lines.append(row("server ceiling (wrk, 64 connections)", f"{ceiling:,.0f}", f"{ceiling * S3_OBJECT_BYTES / 1e6:.0f}",
                         "", "", "", f"at {n / base / ceiling:.0%} of it"))
    elif "latency" in spec:
        lines.append(row("server ceiling", "wrk is not installed"))
    made = [f"{name}: {seconds:.1f} s" for name, loader in loaders.items()
            if isinstance(loader, Converted) and (seconds := copy_seconds(data / loader.folder)) is not None]
    if made:
        lines += ["", "Copies made once before the timed runs, not counted in them: " + "; ".join(made) + "."]
    lines.append("")
    print("\n".join(lines), flush=True)
    return lines


def copy_seconds(out: Path) -> float | None:
    """How long a loader's copy took to make (`convert`); None if not recorded."""
    try:
        return float((out / ".complete").read_text())
    except (OSError, ValueError):
        return None


def write_report(lines: list[str], chart: dict[str, dict[str, float]], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print(f"wrote {out}")
    try:
        write_chart(chart, out.with_suffix(".png"))
        print(f"wrote {out.with_suffix('.png')}")
    except ImportError:
        print("matplotlib is not installed: no chart")


def write_chart(chart: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heights = [len(rates) for rates in chart.values()]
    fig, axes = plt.subplots(len(chart), 1, figsize=(9, 1.2 * len(chart) + 0.4 * sum(heights)),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (workload, rates) in zip(axes[:, 0], chart.items()):
        names = list(rates)
        ax.barh(names, [rates[n] / 1e3 for n in names], color=["tab:blue" if n == "shardflow" else "tab:gray" for n in names])
        ax.set_title(workload)
        ax.set_xlabel("thousand samples/s")
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
