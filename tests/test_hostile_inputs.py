"""Hostile and malformed inputs: each case runs in a child interpreter whose address
space is capped a few hundred MB above what importing shardflow takes, so a panic, an
abort or an allocation the file cannot back fails that case, not the test session.
Every case must end in a `ShardflowError` that names the file (or, for valid data,
in the values a reference reader gives)."""

from __future__ import annotations

import io
import json
import logging
import os
import struct
import subprocess
import sys
import tarfile
import textwrap
import threading
import warnings
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import shardflow as sf

# What a child may allocate beyond its size after `import shardflow`: far below the
# lies these files tell (4 GiB and more), well above what reading them honestly takes.
HEADROOM = 768 << 20

PRELUDE = f"""
import json, resource, sys
import numpy as np
import shardflow as sf

def _vm_size():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024

if len(sys.argv) > 1 and sys.argv[1] != "uncapped":
    _limit = _vm_size() + int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (_limit, _limit))

def outcome(action):
    try:
        result = action()
    except sf.ShardflowError as e:
        print(json.dumps({{"error": type(e).__name__, "message": str(e), "url": e.url}}))
    else:
        print(json.dumps({{"error": None, "result": result}}))

def read_all(*args, **kwargs):
    return sum(len(b[next(iter(b))]) for b in sf.DataLoader(sf.dataset(*args, **kwargs), batch_size=7))

args = sys.argv[2:]
"""


def run_child(code: str, *args: object, headroom: int | None = HEADROOM, timeout: float = 240) -> dict[str, Any]:
    """Runs `code` after PRELUDE in a fresh interpreter, its address space capped at
    `headroom` over its size after the imports (no cap: None); returns what it reported."""
    cap = "uncapped" if headroom is None else str(headroom)
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code), cap, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        # One malloc arena per thread would reserve address space the cap then lacks.
        env={**os.environ, "MALLOC_ARENA_MAX": "2", "RUST_BACKTRACE": "0"},
    )
    assert proc.returncode == 0, f"the child died ({proc.returncode}):\n{proc.stderr[-4000:]}"
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-4000:]
    return json.loads(lines[-1])


def expect_error(report: dict[str, Any], path: Path, kind: str = "DecodeError", *words: str) -> str:
    assert report["error"] == kind, report
    message = report["message"]
    assert path.name in message, message
    for word in words:
        assert word in message, message
    return message


# ---- NPY ------------------------------------------------------------------------------


def npy_bytes(descr: str, shape: str, data: bytes, fortran: bool = False) -> bytes:
    header = f"{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}".encode()
    header += b" " * (-(10 + len(header) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + data


@pytest.mark.parametrize(
    "descr",
    ["<é8", "é", "<", "", "<f", "<f4x", "<i3", "<f+4", "<U99999999999999999999999", "|O", ">c4", "<U0", "<S-1"],
)
@pytest.mark.parametrize("mode", ["sample", "rows"])
def test_npy_bad_dtypes(tmp_path: Path, descr: str, mode: str) -> None:
    path = tmp_path / "bad.npy"
    path.write_bytes(npy_bytes(descr, "(2,)", b"\0" * 16))
    report = run_child("outcome(lambda: read_all(args[0], format_options={'mode': args[1]}))", path, mode)
    expect_error(report, path, "DecodeError", "byte 0")
    assert "dtype" in report["message"] or "pickle" in report["message"], report


@pytest.mark.parametrize(
    "shape",
    ["(2147483648, 2147483648)", "(4611686018427387904, 4611686018427387904)", "(101,)", "(0, 4294967296)",
     "(99999999999999999999999,)", "(1, 2147483648)"],
)
@pytest.mark.parametrize("mode", ["sample", "rows"])
def test_npy_shapes_beyond_the_file(tmp_path: Path, shape: str, mode: str) -> None:
    path = tmp_path / "big.npy"
    path.write_bytes(npy_bytes("<f8", shape, b"\0" * 800))
    report = run_child("outcome(lambda: read_all(args[0], format_options={'mode': args[1]}))", path, mode)
    expect_error(report, path)


def test_npy_good_file_still_matches_numpy(tmp_path: Path) -> None:
    path = tmp_path / "good.npy"
    np.save(path, np.arange(24, dtype=">i4").reshape(2, 3, 4))
    report = run_child("outcome(lambda: np.asarray(next(iter(sf.dataset(args[0])))['array']).tolist())", path)
    assert report == {"error": None, "result": np.load(path).tolist()}


# ---- NPZ ------------------------------------------------------------------------------


def npz_with(members: dict[str, bytes]) -> bytes:
    """An archive of stored members, written as given."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            archive.writestr(name + ".npy", data)
    return out.getvalue()


def patch_declared_size(archive: bytes, size: int) -> bytes:
    """Makes the central directory claim `size` uncompressed bytes for the first member."""
    at = archive.index(b"PK\x01\x02")
    return archive[: at + 24] + struct.pack("<I", size) + archive[at + 28 :]


def npy_of(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


@pytest.mark.parametrize(
    "members",
    [
        # 200 rows promised over 100 rows of data, then a neighbour rows mode would read.
        {"a": npy_bytes("<f8", "(200, 4)", b"\1" * 3200), "b": npy_of(np.zeros((200, 4)))},
        # 3 rows promised, 100 held.
        {"a": npy_bytes("<f8", "(3, 4)", b"\1" * 3200)},
        # (2**31, 2**31) over 800 bytes: a unit per 16 GiB row, 2**31 of them.
        {"a": npy_bytes("<f8", "(2147483648, 2147483648)", b"\1" * 800)},
        {"a": npy_bytes("<u1", "(2147483648, 4)", b"\1" * 800), "b": npy_bytes("<u1", "(2147483648,)", b"\1" * 8)},
    ],
    ids=["longer", "shorter", "huge", "huge-pair"],
)
@pytest.mark.parametrize("mode", ["sample", "rows"])
def test_npz_members_whose_headers_lie_about_their_size(tmp_path: Path, members: dict[str, bytes], mode: str) -> None:
    path = tmp_path / "lying.npz"
    path.write_bytes(npz_with(members))
    report = run_child("outcome(lambda: read_all(args[0], format_options={'mode': args[1]}))", path, mode)
    expect_error(report, path, "DecodeError", '"a"')


@pytest.mark.parametrize("which", ["first", "second"])
@pytest.mark.parametrize("mode", ["sample", "rows"])
def test_npz_directory_claiming_4_gib_decompressed(tmp_path: Path, which: str, mode: str) -> None:
    # Deflated members whose directory says almost 4 GiB: within max_decompressed_bytes,
    # far beyond what 100 compressed bytes can hold. The first archive is read while
    # preparing; the second only when its unit is decoded.
    good = io.BytesIO()
    np.savez_compressed(good, a=np.zeros((10, 100)))
    bad = patch_declared_size(good.getvalue(), 0xFFFF_FFF0)
    (tmp_path / "0.npz").write_bytes(bad if which == "first" else good.getvalue())
    (tmp_path / "1.npz").write_bytes(bad)
    report = run_child("outcome(lambda: read_all(args[0], format_options={'mode': args[1]}))", tmp_path / "*.npz", mode)
    expect_error(report, tmp_path / ("0.npz" if which == "first" else "1.npz"))


def test_npz_good_archives_still_match_numpy(tmp_path: Path) -> None:
    arrays = {"x": np.arange(60, dtype=np.float32).reshape(20, 3), "y": np.arange(20) % 3}
    np.savez(tmp_path / "s.npz", **arrays)
    np.savez_compressed(tmp_path / "c.npz", **arrays)
    code = """
    def rows():
        return [np.asarray(r['x']).tolist() + [int(r['y'])]
                for r in sf.dataset(args[0], format_options={'mode': 'rows'})]
    outcome(rows)
    """
    expected = [x + [y] for x, y in zip(arrays["x"].tolist(), arrays["y"].tolist())]
    for name in ("s.npz", "c.npz"):
        assert run_child(code, tmp_path / name) == {"error": None, "result": expected}


# ---- Arrow IPC ------------------------------------------------------------------------

ROWS = 12_345


def ipc_bytes(codec: str, stream: bool) -> bytes:
    table = pa.table({"x": pa.array(range(ROWS), pa.int64())})
    sink = io.BytesIO()
    options = pa.ipc.IpcWriteOptions(compression=codec)
    open_writer = pa.ipc.new_stream if stream else pa.ipc.new_file
    with open_writer(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue()


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
@pytest.mark.parametrize("stream", [False, True], ids=["file", "stream"])
def test_arrow_ipc_length_prefix_of_2_pow_46(tmp_path: Path, codec: str, stream: bool) -> None:
    data = ipc_bytes(codec, stream)
    # The one compressed buffer starts with its uncompressed length, 8 bytes per row.
    prefix = (ROWS * 8).to_bytes(8, "little")
    assert data.count(prefix) == 1
    path = tmp_path / ("lie.arrows" if stream else "lie.arrow")
    path.write_bytes(data.replace(prefix, (2**46).to_bytes(8, "little")))
    report = run_child("outcome(lambda: read_all(args[0]))", path)
    expect_error(report, path, "DecodeError", str(2**46))
    # Unpatched, the same bytes read as pyarrow reads them.
    good = tmp_path / ("good.arrows" if stream else "good.arrow")
    good.write_bytes(data)
    code = "outcome(lambda: [int(v) for b in sf.DataLoader(sf.dataset(args[0]), batch_size=5000) for v in b['x']])"
    assert run_child(code, good) == {"error": None, "result": list(range(ROWS))}


def test_arrow_ipc_decompressed_total_is_bounded_by_the_option(tmp_path: Path) -> None:
    path = tmp_path / "x.arrow"
    path.write_bytes(ipc_bytes("zstd", stream=False))
    report = run_child("outcome(lambda: read_all(args[0], format_options={'max_decompressed_bytes': 1000}))", path)
    expect_error(report, path, "DecodeError", "max_decompressed_bytes")


# ---- CSV ------------------------------------------------------------------------------


@pytest.mark.parametrize("column", range(4))
@pytest.mark.parametrize("text", ["2024-01-0éT12:00:00", "2024-01-01éT12:00:00", "2024-01-01T12:00:0é", "é"])
def test_csv_multibyte_text_where_dates_are_expected(tmp_path: Path, column: int, text: str) -> None:
    # Every other cell holds a timestamp, so the column looks like dates up to the
    # multibyte character: it must come out as text, as pyarrow reads it.
    rows = [["2024-01-01T12:00:00"] * 4 for _ in range(5)]
    rows[2][column] = text
    path = tmp_path / "t.csv"
    path.write_text("a,b,c,d\n" + "".join(",".join(r) + "\n" for r in rows), encoding="utf-8")
    code = """
    import pyarrow as pa
    outcome(lambda: pa.RecordBatchReader.from_stream(sf.dataset(args[0])).read_all().to_pydict()[args[1]])
    """
    report = run_child(code, path, "abcd"[column])
    expected = pacsv.read_csv(path).column("abcd"[column]).to_pylist()
    assert report == {"error": None, "result": expected}
    assert text in expected


# ---- storage_options --------------------------------------------------------------------


@pytest.mark.parametrize("key", ["timeout_seconds", "retry_base_seconds", "retry_max_seconds"])
@pytest.mark.parametrize("value", ["inf", "1e300", "nan", "-1"])
def test_out_of_range_seconds_are_invalid_arguments(tmp_path: Path, key: str, value: str) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": [1, 2, 3]}), path)
    report = run_child("outcome(lambda: read_all(args[0], storage_options={args[1]: float(args[2])}))", path, key, value)
    assert report["error"] == "InvalidArgumentError", report
    assert report["message"].startswith(f'storage_options["{key}"] must be a number of seconds'), report
    assert "format_options" not in report["message"]


def test_feature_shapes_beyond_a_tensor_are_invalid_arguments(tmp_path: Path) -> None:
    path = tmp_path / "x.tfrecord"
    path.write_bytes(tfrecord_frame(b""))
    for shape in [(2**20, 2**20), (2**31,), (2**40, 2**40, 2**40)]:
        with pytest.raises(sf.InvalidArgumentError, match=r'features\["x"\] shape'):
            sf.dataset(str(path), features={"x": sf.FixedLen(shape, "float32")})


# ---- secrets in URLs --------------------------------------------------------------------

SECRETS = ("hunter2", "SIGSECRET", "CREDSECRET", "TOKSECRET", "KEYSECRET", "AKIAIDSECRET", "S3SECRETKEY", "S3TOKSECRET")


class Refusing:
    """An HTTP server that answers every request 503, on a free local port."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(503, "Slow Down")
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_HEAD = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_secrets_in_urls_stay_out_of_errors_reprs_stats_and_warnings() -> None:
    server = Refusing()
    query = "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=CREDSECRET&X-Amz-Signature=SIGSECRET&X-Amz-Security-Token=TOKSECRET&api_key=KEYSECRET"
    fast = {"max_attempts": 2, "retry_base_seconds": 0.01, "retry_max_seconds": 0.02, "timeout_seconds": 5}
    cases = [
        # Plain HTTP answered 503; HTTPS to a port that speaks no TLS (a client error
        # whose own text quotes the URL).
        (f"http://user:hunter2@127.0.0.1:{server.port}/d/x.bin?{query}", {}),
        (f"https://user:hunter2@127.0.0.1:{server.port}/d/x.bin?{query}", {}),
        (
            "s3://bucket/d/x.bin",
            {
                "endpoint_url": f"http://user:hunter2@127.0.0.1:{server.port}",
                "access_key_id": "AKIAIDSECRET",
                "secret_access_key": "S3SECRETKEY",
                "session_token": "S3TOKSECRET",
                "region": "us-east-1",
            },
        ),
    ]
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger().addHandler(handler)
    try:
        for url, options in cases:
            shown: list[str] = []
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    ds = sf.dataset(url, format="raw", storage_options={**fast, **options})
                except sf.ShardflowError as e:
                    shown += [str(e), repr(e), str(e.url)]
                else:
                    assert ds.shards == [url]  # what the user gave, documented as such
                    loader = sf.DataLoader(ds, batch_size=1)
                    shown += [repr(ds), repr(loader)]
                    with pytest.raises(sf.ShardflowError) as info:
                        list(loader)
                    shown += [str(info.value), repr(info.value), str(info.value.url), str(loader.stats())]
                    for cause in (info.value.__cause__, info.value.__context__):
                        if cause is not None:
                            shown.append(str(cause))
            shown += [str(w.message) for w in caught]
            shown += [r.getMessage() for r in records]
            text = "\n".join(shown)
            assert "127.0.0.1" in text or "bucket" in text, text  # the errors do name the place
            for secret in SECRETS:
                assert secret not in text, (secret, text)
            assert "***" in text or url.startswith("s3://"), text
    finally:
        logging.getLogger().removeHandler(handler)
        server.close()


# ---- offsets past 2 GiB -----------------------------------------------------------------


def tfrecord_frame(data: bytes) -> bytes:
    """One record, checksums left zero (read with verify_crc=False)."""
    return struct.pack("<Q", len(data)) + b"\0" * 4 + data + b"\0" * 4


# Reads the file as one batch of up to 10 rows, without copying the bytes into Python.
ONE_BIG_BATCH = """
import pyarrow as pa
import pyarrow.compute as pc
def check():
    ds = sf.dataset(args[0], format_options=json.loads(args[2]))
    (batch,) = list(sf.DataLoader(ds, batch_size=10, output="arrow"))
    column = pa.record_batch(batch).column(args[1])
    last = [memoryview(column[i].as_buffer())[-1] for i in range(len(column))]
    return [str(column.type), pc.binary_length(column).to_pylist(), last]
outcome(check)
"""


def read_one_big_batch(path: Path, column: str, options: dict[str, object]) -> list[Any]:
    report = run_child(ONE_BIG_BATCH, path, column, json.dumps(options), headroom=None, timeout=1500)
    assert report["error"] is None, report
    return report["result"]


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("layout", ["one 2.5 GiB record", "ten 256 MiB records"])
def test_tfrecord_column_past_2_gib(tmp_path: Path, layout: str) -> None:
    path = tmp_path / "big.tfrecord"
    sizes = [5 << 29] if layout.startswith("one") else [1 << 28] * 10
    with open(path, "wb") as f:
        for i, size in enumerate(sizes):
            f.write(tfrecord_frame(bytes([i + 1]) * size))
    options = {"raw": True, "verify_crc": False, "compression": "none"}
    result = read_one_big_batch(path, "record", options)
    assert result == ["large_binary", sizes, list(range(1, len(sizes) + 1))]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_webdataset_column_past_2_gib(tmp_path: Path) -> None:
    path = tmp_path / "big.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(10):
            data = bytes([i + 1]) * (1 << 28)
            info = tarfile.TarInfo(f"s{i:02d}.bin")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert read_one_big_batch(path, "bin", {}) == ["large_binary", [1 << 28] * 10, list(range(1, 11))]
