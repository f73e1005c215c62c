"""The shardflow command line (also ``python -m shardflow``).

commands:
  demo      write a small dataset to a temporary directory and stream it
  inspect   show a dataset's shards, totals, column types and first rows
  head      print the first rows as JSON lines
  bench     time epochs over a dataset
  convert   rewrite a dataset in another format, as shards with a manifest
  profile   is training input-bound? the loader's headspace, and where its time goes

Progress bars go to stderr, and only when it is a terminal; results go to stdout.
"""

from __future__ import annotations

import argparse
import base64
import importlib
import json
import math
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np

import shardflow as sf
from shardflow import _load, _native


def _write_demo_data(directory: str, rows: int, shards: int) -> tuple[str, str]:
    """Writes the same synthetic image-classification table as Parquet shards and as
    gzipped JSON Lines; returns the two glob patterns."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        sys.exit("the demo writes its Parquet files with pyarrow: pip install 'shardflow[arrow]'")
    rng = np.random.default_rng(0)
    per_shard = -(-rows // shards)
    for shard in range(shards):
        start = shard * per_shard
        n = max(0, min(per_shard, rows - start))
        pixels = rng.integers(0, 256, size=(n, 28 * 28), dtype=np.uint8)
        table = pa.table(
            {
                "id": np.arange(start, start + n, dtype=np.int64),
                "image": pa.FixedSizeListArray.from_arrays(pa.array(pixels.ravel()), 28 * 28),
                "label": rng.integers(0, 10, size=n, dtype=np.int64),
                "caption": [f"sample {i}" for i in range(start, start + n)],
            }
        )
        pq.write_table(table, os.path.join(directory, f"train-{shard:03d}.parquet"), row_group_size=8192)
    import gzip

    with gzip.open(os.path.join(directory, "meta-000.jsonl.gz"), "wt") as f:
        for i in range(min(rows, 20_000)):
            f.write(json.dumps({"id": i, "tags": ["a", "b"][: i % 3], "score": i / 7}) + "\n")
    return (
        os.path.join(directory, f"train-{{000..{shards - 1:03d}}}.parquet"),
        os.path.join(directory, "meta-*.jsonl.gz"),
    )


def _progress_bar(total: int | None, quiet: bool, desc: str | None = None) -> Any:
    """A tqdm bar counting samples on stderr. ``disable=None`` makes tqdm turn itself
    off when stderr is not a terminal, so pipes and log files get no bar."""
    from tqdm import tqdm  # imported here: only the commands that draw a bar pay for it

    return tqdm(
        total=total, desc=desc, unit="samples", unit_scale=True, leave=False, disable=True if quiet else None
    )


def _known_len(ds: sf.Dataset) -> int | None:
    try:
        return len(ds)
    except TypeError:  # a length that only reading the data could tell
        return None


def _json_safe(value: Any) -> Any:
    """``value`` with numpy arrays as lists (a 0-d array as its value), numpy scalars as
    Python scalars, bytes as base64 text and NaN and infinities as null, recursively, so
    that ``json.dumps`` writes strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, np.ndarray):
        return _json_safe(value.tolist())
    if isinstance(value, np.generic):
        return _json_safe(value.item())
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _print_json(value: Any) -> None:
    # default=str: dates, decimals and the like print as their text rather than fail
    print(json.dumps(_json_safe(value), default=str, allow_nan=False))


def _run_epoch(loader: sf.DataLoader, bar: Any = None) -> tuple[int, float, dict[str, float]]:
    """Runs one epoch, advancing ``bar`` if given; returns rows, seconds and the stats
    counters it added."""
    before = loader.stats()
    start = time.perf_counter()
    next_rate = start + 0.2
    rows = 0
    for batch in loader:
        rows += batch.num_rows
        if bar is not None:
            now = time.perf_counter()
            # stats() builds a dict: called every batch, it made batch_size=64 epochs 2.5x slower
            if now >= next_rate and not bar.disable:
                read = loader.stats()["bytes_read"] - before["bytes_read"]
                bar.set_postfix_str(f"{read / 1e6 / (now - start):,.1f} MB/s", refresh=False)
                next_rate = now + 0.2
            bar.update(batch.num_rows)
    seconds = time.perf_counter() - start
    after = loader.stats()
    # The counters' growth (stats() also names things, such as the read plan).
    return rows, seconds, {k: after[k] - before[k] for k in after if isinstance(after[k], (int, float))}


def _report(name: str, rows: int, seconds: float, stats: dict[str, Any]) -> None:
    mb = stats["bytes_read"] / 1e6
    print(
        f"{name}: {rows:,} samples in {seconds:.2f} s = {rows / seconds:,.0f} samples/s, "
        f"{mb / seconds:,.1f} MB/s read ({mb:.1f} MB, {stats['files_opened']} files); "
        f"waited {stats['wait_seconds']:.2f} s, decoded {stats['decode_seconds']:.2f} s (all threads)"
    )


def demo(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="shardflow-demo-") as directory:
        print(f"writing {args.rows:,} rows into {args.shards} Parquet shards under {directory} ...")
        parquet, jsonl = _write_demo_data(directory, args.rows, args.shards)
        ds = sf.dataset(parquet)
        print(f"dataset: {ds.format}, {len(ds.shards)} shards, {len(ds):,} rows, columns {ds.column_names}")
        loader = sf.DataLoader(ds, batch_size=args.batch_size, shuffle=True, seed=0, drop_last=False)
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            _report(f"epoch {epoch} (shuffled, batch_size={args.batch_size})", *_run_epoch(loader))
        first = next(iter(sf.DataLoader(ds, batch_size=4, shuffle=True, seed=0)))
        print("a batch:", {k: (v.dtype, v.shape) for k, v in first.items()})
        print("labels:", first["label"].tolist(), "captions:", first["caption"].tolist())
        meta = sf.dataset(jsonl)
        meta_loader = sf.DataLoader(meta, batch_size=1024)
        _report("JSON Lines (gzip)", *_run_epoch(meta_loader))
        print("a JSON record:", next(iter(meta.skip(2))))


def _rows_without_reading(ds: sf.Dataset) -> int | None:
    """The rows Parquet footers or a write manifest give; None for stream formats
    without one (``len()`` would index them: a whole pass before the work starts)."""
    return _sum_if_known([s["rows"] for s in ds._shard_table()])


def _type_name(column: dict[str, Any]) -> str:
    """``int64``, ``uint8[28, 28]``, ``float32[?]`` (ragged), ``struct{a: int64}``."""
    if column["dtype"] == "struct":
        return "struct{" + ", ".join(f"{f['name']}: {_type_name(f)}" for f in column["fields"]) + "}"
    shape = column["shape"]
    dims = ", ".join("?" if d is None else str(d) for d in shape)
    return f"{column['dtype']}[{dims}]" if shape else column["dtype"]


def _sum_if_known(values: list[int | None]) -> int | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _megabytes(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e6:,.1f}"


def _print_shard_table(shards: list[dict[str, Any]], limit: int = 20) -> None:
    shown = shards[:limit]
    width = max([len("shard"), *(len(s["url"]) for s in shown)])
    print(f"  {'shard':<{width}}  {'bytes':>14}  {'MB':>9}  {'rows':>12}")
    for s in shown:
        print(f"  {s['url']:<{width}}  {_count(s['bytes']):>14}  {_megabytes(s['bytes']):>9}  {_count(s['rows']):>12}")
    if len(shards) > limit:
        print(f"  ... {len(shards) - limit:,} more (--json lists all)")


def _open(args: argparse.Namespace, **kwargs: Any) -> sf.Dataset:
    """`dataset(SOURCE)`; for a Hub repo (``org/name``, ``hf://datasets/org/name``), or
    with --split or --name, the split ``load_dataset`` gives (without --split, the first)."""
    first, *rest = args.source
    repo_root = first.startswith("hf://") and first.rstrip("/").count("/") <= 4
    if not rest and (repo_root or _load._is_repo_id(first) or args.split or args.name):
        found = sf.load_dataset(first, args.name, split=args.split, **kwargs)
        return found if args.split else next(iter(found.values()))
    if args.split or args.name:
        raise SystemExit("--split and --name take one repo, folder or prefix")
    return sf.dataset(args.source, args.format, **kwargs)


def inspect(args: argparse.Namespace) -> None:
    ds = _open(args)
    shards = ds._shard_table()  # URLs redacted; rows where known without reading
    total_bytes = _sum_if_known([s["bytes"] for s in shards])
    # per-shard counts spare len() a pass over stream formats
    rows = _sum_if_known([s["rows"] for s in shards])
    if rows is None:
        rows = _known_len(ds)
    columns = [{"name": c["name"], "type": _type_name(c)} for c in ds._column_types()]
    samples = list(ds.take(args.head))
    if args.json:
        summary = {"format": ds.format, "shards": shards, "rows": rows, "bytes": total_bytes, "columns": columns}
        _print_json({**summary, "head": samples})
        return
    print(f"format:  {ds.format}")
    print(f"shards:  {len(shards):,}")
    _print_shard_table(shards)
    size = "size unknown" if total_bytes is None else f"{total_bytes:,} bytes ({total_bytes / 1e6:,.1f} MB)"
    print(f"total:   {size}, {'rows unknown' if rows is None else f'{rows:,} rows'}")
    print(f"columns: {ds.column_names}")
    width = max((len(c["name"]) for c in columns), default=0)
    for c in columns:
        print(f"  {c['name']:<{width}}  {c['type']}")
    for i, sample in enumerate(samples):
        print(f"[{i}]", {k: (v if not isinstance(v, (bytes, str)) or len(v) < 60 else v[:60]) for k, v in sample.items()})


def head(args: argparse.Namespace) -> None:
    ds = _open(args)
    for sample in ds.take(args.n):
        _print_json(sample)


def bench(args: argparse.Namespace) -> None:
    ds = _open(args, columns=args.columns)
    loader = sf.DataLoader(
        ds, batch_size=args.batch_size, shuffle=args.shuffle, num_threads=args.threads, output=args.output
    )
    total = _rows_without_reading(ds)
    epochs = []
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        with _progress_bar(total, args.json, f"epoch {epoch}") as bar:
            rows, seconds, added = _run_epoch(loader, bar)
        epochs.append(
            {
                "epoch": epoch,
                "rows": rows,
                "seconds": seconds,
                "samples_per_s": rows / seconds,
                "mb_per_s": added["bytes_read"] / 1e6 / seconds,
            }
        )
        if not args.json:
            _report(f"epoch {epoch}", rows, seconds, added)
    times = sorted(e["seconds"] for e in epochs)
    median = times[len(times) // 2] if times else None
    if args.json:
        _print_json({"epochs": epochs, "median_seconds": median})
    elif median is not None:
        print(f"median: {median:.3f} s per epoch")


def convert(args: argparse.Namespace) -> None:
    ds = _open(args)
    total = _rows_without_reading(ds)
    start = time.perf_counter()
    with _progress_bar(total, args.json, "convert") as bar:

        def progress(rows_written: int, bytes_written: int) -> None:
            bar.set_postfix_str(f"{bytes_written / 1e6:,.1f} MB", refresh=False)
            bar.update(rows_written - bar.n)

        manifest = ds.write(
            args.destination,
            format=args.to,
            max_rows_per_shard=args.max_rows_per_shard,
            max_bytes_per_shard=args.max_bytes_per_shard,
            compression=args.compression,
            overwrite=args.overwrite,
            progress=progress,
        )
    seconds = time.perf_counter() - start
    if args.json:
        _print_json({**manifest, "seconds": seconds})
        return
    print(
        f"wrote {len(manifest['shards']):,} {manifest['format']} shards, {manifest['rows']:,} rows, "
        f"{manifest['bytes'] / 1e6:,.1f} MB to {_native._redact(args.destination)} in {seconds:.2f} s"
    )


def _timeline(loader: sf.DataLoader, seconds: float, step: float) -> list[dict[str, Any]]:
    """Reads `loader` for `seconds` (sleeping `step` seconds a batch, the training step),
    and reads its report every second: the rows/s and each stage's utilisation."""
    start = last = time.perf_counter()
    points: list[dict[str, Any]] = []
    while time.perf_counter() - start < seconds:
        for _ in loader:
            if step:
                time.sleep(step)
            now = time.perf_counter()
            if now - last >= 1.0 or now - start >= seconds:
                r = loader.report(seconds=now - last)
                points.append({"t": now - start, "rows_per_second": r.rows / max(r.wall_seconds, 1e-9),
                               "waiting_share": r.waiting_share,
                               "utilisation": {s.name: s.utilisation for s in r.stages}})
                last = now
            if now - start >= seconds:
                break
    return points


def _plot(path: str, headspace: list[dict[str, Any]], consumer: list[dict[str, Any]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'shardflow[plot]'") from None
    fig, (rate, util) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    rate.plot([p["t"] for p in headspace], [p["rows_per_second"] for p in headspace], label="headspace (no step)")
    if consumer:
        rate.plot([p["t"] for p in consumer], [p["rows_per_second"] for p in consumer], label="with the training step")
    rate.set_ylabel("rows/s")
    rate.set_ylim(bottom=0)
    rate.legend()
    rate.set_title("shardflow profile: the loader's rate, and where its time goes")
    series = consumer or headspace
    for name in dict.fromkeys(n for p in series for n in p["utilisation"]):
        util.plot([p["t"] for p in series], [p["utilisation"].get(name, 0.0) * 100 for p in series], label=name)
    util.set_ylabel("stage utilisation %")
    util.set_xlabel("seconds")
    util.set_ylim(0, 105)
    util.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def profile(args: argparse.Namespace) -> None:
    ds = _open(args)
    if args.map:
        module, _, name = args.map.partition(":")
        sys.path.insert(0, os.getcwd())
        ds = ds.map(getattr(importlib.import_module(module), name))
    def make() -> sf.DataLoader:
        return sf.DataLoader(ds, batch_size=args.batch_size, shuffle=args.shuffle, **({"seed": 0} if args.shuffle else {}))
    loader = make()
    headspace = _timeline(loader, args.seconds, 0.0)
    consumer: list[dict[str, Any]] = []
    if args.step_ms:
        loader = make()
        consumer = _timeline(loader, args.seconds, args.step_ms / 1e3)
    report = loader.report(seconds=args.seconds)
    rate = sum(p["rows_per_second"] for p in headspace) / max(len(headspace), 1)
    if args.plot:
        _plot(args.plot, headspace, consumer)
    if args.json:
        _print_json({"headspace_rows_per_second": rate, "report": report.to_dict(),
                     "timeline": {"headspace": headspace, "consumer": consumer}})
        return
    print(f"headspace: {rate:,.0f} rows/s with no training step")
    print(report)
    if args.plot:
        print(f"plot: {args.plot}")


def _add_source(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "source", nargs="+", metavar="SOURCE",
        help="paths, globs, brace ranges or URLs; or a Hub repo (org/name, hf://datasets/org/name)",
    )
    p.add_argument("--format", help="the source format (default: from the file extension)")
    p.add_argument("--split", help="a split of the repo, folder or prefix, as load_dataset takes it (train[:10%%])")
    p.add_argument("--name", help="a config of the repo's README (load_dataset's name=)")


def _add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of text")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardflow",
        usage="%(prog)s [-h] COMMAND ...",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # the docstring above lists the commands; argparse's own list would repeat it
    sub = parser.add_subparsers(
        dest="command", required=True, prog="shardflow", metavar="COMMAND", help=argparse.SUPPRESS
    )

    p = sub.add_parser("demo", description="Writes a small dataset to a temporary directory and streams it.")
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=2)
    p.set_defaults(func=demo)

    p = sub.add_parser("inspect", description="Shows a dataset's shards, totals, column types and first rows.")
    _add_source(p)
    p.add_argument("--head", type=int, default=3, metavar="N", help="rows to show (default 3)")
    _add_json(p)
    p.set_defaults(func=inspect)

    p = sub.add_parser(
        "head",
        description="Prints the first N rows, one JSON object per line. Arrays become lists "
        "and bytes become base64 text.",
    )
    _add_source(p)
    p.add_argument("-n", type=int, default=10, metavar="N", help="rows to print (default 10)")
    p.set_defaults(func=head)

    p = sub.add_parser("bench", description="Times epochs over a dataset.")
    _add_source(p)
    p.add_argument("--columns", nargs="*", help="read only these columns")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--threads", type=int)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--output", choices=["numpy", "arrow"], default="arrow")
    _add_json(p)
    p.set_defaults(func=bench)

    p = sub.add_parser("convert", description="Rewrites a dataset in another format, as shards with a manifest.")
    _add_source(p)
    p.add_argument("destination", metavar="DEST", help="directory or URL to write to")
    p.add_argument("--to", required=True, metavar="FORMAT", help="the format to write, e.g. parquet, jsonl, webdataset")
    p.add_argument("--max-rows-per-shard", type=int, metavar="N")
    p.add_argument("--max-bytes-per-shard", type=int, metavar="N")
    p.add_argument("--compression", metavar="C", help="the codec (default: the format's own)")
    p.add_argument("--overwrite", action="store_true", help="replace what DEST already holds")
    _add_json(p)
    p.set_defaults(func=convert)

    p = sub.add_parser(
        "profile",
        description="Is training input-bound? Reads a dataset with no training step (the loader's "
        "headspace), then with a simulated step of --step-ms a batch, and prints the report of "
        "where the time went.",
    )
    _add_source(p)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--map", metavar="MODULE:FN", help="a per-sample function to map over the rows")
    p.add_argument("--seconds", type=float, default=10.0, help="how long each run reads (default 10)")
    p.add_argument("--step-ms", type=float, default=0.0, help="a training step to simulate, in ms a batch")
    p.add_argument("--plot", metavar="PNG", help="draw the rates and each stage's utilisation over time")
    _add_json(p)
    p.set_defaults(func=profile)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        args.func(args)
    except (sf.ShardflowError, FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    except BrokenPipeError:
        # the reader left early (`shardflow head ... | head -1`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
