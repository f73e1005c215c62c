"""Writes the fuzz corpora's seeds: small real files, each made by the format's
reference writer (pyarrow, json, numpy, tensorflow, webdataset), plus the .npz files
scipy ships. A format target's input is one flags byte (see `shardflow::fuzz`) then
the file, so each seed is written with flags 0 (read as is, errors raised).

    python fuzz/seeds.py [CORPUS_DIR]     # default: fuzz/corpus
"""

from __future__ import annotations

import glob
import io
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np


def save(corpus: Path, target: str, name: str, data: bytes, flags: int = 0) -> None:
    folder = corpus / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"seed-{name}").write_bytes(bytes([flags]) + data)


def records() -> list[dict]:
    return [
        {"id": i, "text": "héllo"[: i % 6], "score": i / 4, "tags": ["a", "b"][: i % 3],
         "messages": [{"role": "user", "content": "hi"}] * (i % 2), "flag": i % 3 == 0 or None}
        for i in range(6)
    ]


def arrow_seeds(corpus: Path) -> None:
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(records())
    table = table.append_column("image", pa.array([np.arange(4, dtype=np.uint8).tobytes()] * 6, pa.binary()))
    for name, kwargs in {
        "plain": {},
        "snappy-groups": {"row_group_size": 2, "compression": "snappy"},
        "zstd-dict": {"compression": "zstd", "use_dictionary": True},
        "v1-gzip": {"version": "1.0", "compression": "gzip", "data_page_version": "1.0"},
    }.items():
        sink = io.BytesIO()
        pq.write_table(table, sink, **kwargs)
        save(corpus, "parquet", name, sink.getvalue())
    for name, writer in {"file": ipc.new_file, "stream": ipc.new_stream}.items():
        for compression in (None, "lz4", "zstd"):
            sink = io.BytesIO()
            with writer(sink, table.schema, options=ipc.IpcWriteOptions(compression=compression)) as w:
                w.write_table(table, max_chunksize=2)
            save(corpus, "arrow", f"{name}-{compression}", sink.getvalue())
    flat = table.select(["id", "text", "score"])
    sink = io.BytesIO()
    pcsv.write_csv(flat, sink)
    save(corpus, "csv", "pyarrow", sink.getvalue())
    save(corpus, "csv", "quoted", b'a,b,c\n1,"x\ny",2020-01-02\n2,"q""q",2020-01-03T04:05:06\n,,\n')


def jsonl_seeds(corpus: Path) -> None:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records()).encode()
    save(corpus, "jsonl", "records", text)
    save(corpus, "jsonl", "records-gzip", text, flags=2)
    save(corpus, "jsonl", "mixed", b'{"a": 1}\n\n{"a": 2.5, "b": [1, 2]}\n{"a": null, "b": {"c": "d"}}\n')


def numpy_seeds(corpus: Path) -> None:
    arrays = {
        "f4": np.arange(12, dtype="<f4").reshape(3, 4),
        "be": np.arange(6, dtype=">i8"),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3)),
        "bytes": np.array([b"ab", b"c"], dtype="S3"),
        "text": np.array(["xy", "z"], dtype="<U2"),
        "scalar": np.array(b"abc", dtype="S3"),
        "complex": np.arange(4, dtype=np.complex64),
        "bool": np.array([True, False]),
    }
    for name, a in arrays.items():
        sink = io.BytesIO()
        np.save(sink, a)
        save(corpus, "npy", name, sink.getvalue())
        save(corpus, "npy_header", name, sink.getvalue()[:2])
    rows = {"x": np.arange(24, dtype=np.uint8).reshape(6, 4), "y": np.arange(6)}
    for name, write in {"stored": np.savez, "deflated": np.savez_compressed}.items():
        sink = io.BytesIO()
        write(sink, **rows)
        save(corpus, "npz", f"rows-{name}", sink.getvalue(), flags=2)
        sink = io.BytesIO()
        write(sink, **arrays)
        save(corpus, "npz", f"sample-{name}", sink.getvalue())
    import scipy

    for path in sorted(glob.glob(os.path.join(os.path.dirname(scipy.__file__), "**", "*.npz"), recursive=True)):
        data = Path(path).read_bytes()
        if len(data) <= 64 * 1024:
            save(corpus, "npz", "scipy-" + Path(path).stem, data)


def tfrecord_seeds(corpus: Path) -> None:
    import tensorflow as tf

    def example(i: int) -> bytes:
        feature = {
            "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes([i]) * 4])),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i, -i])),
            "score": tf.train.Feature(float_list=tf.train.FloatList(value=[i / 2])),
        }
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    with tempfile.TemporaryDirectory() as tmp:
        for name, options in {"plain": None, "gzip": "GZIP", "zlib": "ZLIB"}.items():
            path = os.path.join(tmp, name)
            with tf.io.TFRecordWriter(path, options=options) as w:
                for i in range(5):
                    w.write(example(i))
            save(corpus, "tfrecord", name, Path(path).read_bytes())
    pieces = b"".join(bytes([len(e)]) + e for e in (example(i) for i in range(4)) if len(e) < 256)
    save(corpus, "example", "tf", pieces)


def tar_seeds(corpus: Path) -> None:
    import webdataset as wds

    sink = io.BytesIO()
    with wds.TarWriter(sink) as w:
        for i in range(4):
            w.write({"__key__": f"s{i:03d}", "cls": i, "json": {"i": i}, "txt": "hé", "jpg": b"\xff\xd8" + bytes(8)})
    save(corpus, "webdataset", "wds", sink.getvalue())
    save(corpus, "webdataset", "wds-gzip", sink.getvalue(), flags=2)


def other_seeds(corpus: Path) -> None:
    for i, pattern in enumerate(["a.jsonl", "*.jsonl", "c-{000..001}.tar", "{a,b}.jsonl", "[[]x].csv", "{0..9}{0..9}"]):
        (corpus / "pattern").mkdir(parents=True, exist_ok=True)
        (corpus / "pattern" / f"seed-{i}").write_bytes(pattern.encode())
    (corpus / "options").mkdir(parents=True, exist_ok=True)
    (corpus / "options" / "seed-mode").write_bytes(bytes([5, 96 + 0]) + b"rows")
    (corpus / "record_index").mkdir(parents=True, exist_ok=True)
    key = b"shard.jsonl\x0012\x001"
    index = b"SFINDEX1" + len(key).to_bytes(8, "little") + key + (0).to_bytes(8, "little")
    index += (2).to_bytes(8, "little") + (3).to_bytes(8, "little")
    index += b"".join(o.to_bytes(8, "little") for o in (0, 4, 12))
    (corpus / "record_index" / "seed-two-rows").write_bytes(index)
    for target in ("tfrecord_framed", "tar_members"):
        (corpus / target).mkdir(parents=True, exist_ok=True)
        (corpus / target / "seed-small").write_bytes(bytes([0, 1, 0, 3, 1, 2, 3, 0x42, 0x01, 0x40, 5]))


def media_seeds(corpus: Path) -> None:
    """Image cells (flags bit 1 clear) by Pillow and audio cells (bit 1 set) by
    libsndfile, one of each kind a Hub dataset holds."""
    import soundfile
    from PIL import Image

    pixels = Image.fromarray((np.arange(24 * 16 * 3) % 251).astype(np.uint8).reshape(16, 24, 3))
    for fmt, kwargs in (("JPEG", {"quality": 80}), ("PNG", {}), ("WEBP", {"lossless": True}), ("GIF", {}), ("TIFF", {}), ("BMP", {})):
        out = io.BytesIO()
        pixels.save(out, fmt, **kwargs)
        save(corpus, "media", fmt.lower(), out.getvalue())
    tone = 0.5 * np.sin(np.arange(1600) / 8.0)
    for name, fmt, subtype in (("wav", "WAV", "PCM_16"), ("flac", "FLAC", "PCM_16"), ("mp3", "MP3", "MPEG_LAYER_III"), ("ogg", "OGG", "VORBIS")):
        out = io.BytesIO()
        soundfile.write(out, np.stack([tone, -tone], axis=1), 8000, format=fmt, subtype=subtype)
        save(corpus, "media", name, out.getvalue(), flags=2 | 4)


def main() -> None:
    corpus = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "corpus"
    for make in (arrow_seeds, jsonl_seeds, numpy_seeds, tar_seeds, other_seeds, tfrecord_seeds, media_seeds):
        make(corpus)
    print(f"seeds written under {corpus}")


if __name__ == "__main__":
    main()
