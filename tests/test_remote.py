"""S3 (a real SeaweedFS server) and HTTP(S) sources: same results as local files, under
injected faults, with a disk cache; errors that name URL, status and attempts."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.feather as feather
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
import webdataset as wds
from conftest import S3_SECRET, Seaweed, wait_for
from faultproxy import FaultProxy

import shardflow as sf


def normalize(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ("array", str(value.dtype), value.shape, value.tolist())
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items() if k != "__url__"}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    return value


def write_formats(root: Path) -> dict[str, tuple[list[str], dict]]:
    """One small dataset per format, as files under `root/<format>/`; returns, per
    format, the file names and the dataset() keyword arguments."""
    rng = np.random.default_rng(0)
    out: dict[str, tuple[list[str], dict]] = {}

    def folder(name: str) -> Path:
        (root / name).mkdir(parents=True, exist_ok=True)
        return root / name

    d = folder("parquet")
    for i in range(3):
        t = pa.table({"id": np.arange(i * 500, (i + 1) * 500), "v": rng.random(500), "s": [f"s{j}" for j in range(500)]})
        pq.write_table(t, d / f"part-{i}.parquet", row_group_size=128)
    out["parquet"] = (sorted(os.listdir(d)), {})
    d = folder("jsonl")
    for i in range(2):
        with gzip.open(d / f"part-{i}.jsonl.gz", "wt") as f:
            for j in range(700):
                f.write(json.dumps({"id": i * 700 + j, "tags": ["x"] * (j % 3), "o": {"k": j}}) + "\n")
    out["jsonl"] = (sorted(os.listdir(d)), {})
    d = folder("csv")
    pacsv.write_csv(pa.table({"a": np.arange(900), "b": [f'q"{j},' for j in range(900)]}), d / "t.csv")
    out["csv"] = (["t.csv"], {})
    d = folder("npy")
    np.save(d / "x.npy", rng.random((400, 3, 2)).astype(np.float32))
    out["npy"] = (["x.npy"], {"format_options": {"mode": "rows"}})
    d = folder("npz")
    for i in range(4):
        np.savez_compressed(d / f"s{i}.npz", image=np.full((4, 4), i, np.uint8), label=np.int64(i))
    out["npz"] = (sorted(os.listdir(d)), {})
    d = folder("tar")
    with wds.TarWriter(str(d / "shard-0.tar")) as sink:
        for j in range(50):
            sink.write({"__key__": f"k{j:03d}", "txt": f"t{j}", "cls": j % 5, "bin": bytes([j]) * j})
    out["webdataset"] = (["shard-0.tar"], {})
    d = folder("arrow")
    feather.write_feather(pa.table({"n": np.arange(300), "f": rng.random(300)}), d / "t.arrow", chunksize=64)
    with ipc.new_stream(d / "s.arrows", pa.schema([("n", pa.int64())])) as w:
        for k in range(3):
            w.write_batch(pa.record_batch([pa.array(np.arange(k * 10, k * 10 + 10))], names=["n"]))
    out["arrow"] = (["t.arrow"], {})
    out["arrow_stream"] = (["s.arrows"], {})
    d = folder("raw")
    for label in ("cat", "dog"):
        (d / label).mkdir(exist_ok=True)
        for j in range(3):
            (d / label / f"{j}.bin").write_bytes(f"{label}-{j}".encode() * 100)
    out["raw"] = (["cat/0.bin", "cat/1.bin", "cat/2.bin", "dog/0.bin", "dog/1.bin", "dog/2.bin"], {"format": "raw", "format_options": {"label": True}})
    return out


@pytest.fixture(scope="module")
def formats(tmp_path_factory: pytest.TempPathFactory, seaweed: Seaweed) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("formats")
    written = write_formats(root)
    seaweed.upload_tree(root, "formats")
    return root, written


DIRS = {"webdataset": "tar", "arrow_stream": "arrow"}


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv", "npy", "npz", "webdataset", "arrow", "arrow_stream", "raw"])
def test_every_format_reads_the_same_from_s3_and_http(formats: tuple[Path, dict], seaweed: Seaweed, fmt: str) -> None:
    root, written = formats
    names, kwargs = written[fmt]
    folder = DIRS.get(fmt, fmt)
    local = [str(root / folder / n) for n in names]
    expected = normalize(list(sf.dataset(local, **kwargs)))
    assert expected
    s3 = sf.dataset([f"s3://formats/{folder}/{n}" for n in names], storage_options=seaweed.storage_options(), **kwargs)
    assert normalize(list(s3)) == expected
    http = sf.dataset([f"{seaweed.filer_url}/buckets/formats/{folder}/{n}" for n in names], **kwargs)
    assert normalize(list(http)) == expected
    # Batches too, shuffled the same way (the order is a function of seed and data only).
    def ids(ds: sf.Dataset) -> list:
        return [normalize(b.to_pylist()) for b in sf.DataLoader(ds, batch_size=37, shuffle=True, seed=4, output="arrow")]
    assert ids(s3) == ids(sf.dataset(local, **kwargs))


def test_globs_prefixes_and_brace_ranges_list_like_local_files(formats: tuple[Path, dict], seaweed: Seaweed) -> None:
    options = seaweed.storage_options()
    names = [s.rsplit("/", 1)[1] for s in sf.dataset("s3://formats/parquet/*.parquet", storage_options=options).shards]
    assert names == ["part-0.parquet", "part-1.parquet", "part-2.parquet"]
    assert len(sf.dataset("s3://formats/parquet/", storage_options=options).shards) == 3
    assert len(sf.dataset("s3://formats/parquet/part-{0..1}.parquet", storage_options=options).shards) == 2
    assert len(sf.dataset(f"{seaweed.filer_url}/buckets/formats/parquet/part-{{0..2}}.parquet")) == 1500
    with pytest.raises(FileNotFoundError, match="s3://formats/parquet/\\*.csv"):
        sf.dataset("s3://formats/parquet/*.csv", storage_options=options)
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        sf.dataset("s3://formats/parquet/nope.parquet", storage_options=options)
    with pytest.raises(ValueError, match="cannot be listed"):
        sf.dataset(f"{seaweed.filer_url}/buckets/formats/parquet/*.parquet")
    with pytest.raises(FileNotFoundError):
        list(sf.dataset(f"{seaweed.filer_url}/buckets/formats/parquet/missing.parquet"))


def test_access_denied_and_secrets_never_shown(formats: tuple[Path, dict], seaweed: Seaweed) -> None:
    wrong = dict(seaweed.storage_options(), secret_access_key="not-the-" + S3_SECRET)
    with pytest.raises(PermissionError) as info:
        sf.dataset("s3://formats/parquet/part-0.parquet", storage_options=wrong)
    assert "s3://formats/parquet/part-0.parquet" in str(info.value)
    # It names the object asked for, not a manifest probed beside it.
    assert "_shardflow.json" not in str(info.value)
    with pytest.raises(PermissionError):
        sf.dataset("s3://formats/parquet/part-0.parquet", storage_options={"endpoint_url": seaweed.s3_url, "anonymous": True})
    ds = sf.dataset("s3://formats/parquet/part-0.parquet", storage_options=seaweed.storage_options())
    for text in (repr(ds), str(info.value), repr(sf.DataLoader(ds)), repr(info.value)):
        assert S3_SECRET not in text
    with pytest.raises(ValueError, match="storage_options"):
        sf.dataset("s3://formats/parquet/part-0.parquet", storage_options={"endpoint": seaweed.s3_url})


def test_parquet_projection_fetches_only_its_column_chunks(seaweed: Seaweed, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    path = tmp_path / "wide.parquet"
    pq.write_table(pa.table({f"c{i}": rng.random(50_000) for i in range(20)}), path, row_group_size=10_000, compression="none")
    client = seaweed.client()
    client.create_bucket(Bucket="wide")
    client.upload_file(str(path), "wide", "wide.parquet")
    meta = pq.ParquetFile(path).metadata
    wanted = [meta.schema.names.index(c) for c in ("c3", "c11")]
    chunk_bytes = sum(
        meta.row_group(rg).column(col).total_compressed_size for rg in range(meta.num_row_groups) for col in wanted
    )
    loader = sf.DataLoader(
        sf.dataset("s3://wide/wide.parquet", columns=["c11", "c3"], storage_options=seaweed.storage_options()),
        batch_size=8192,
    )
    got = {k: np.concatenate(v) for k, v in zip(["c11", "c3"], zip(*[(b["c11"], b["c3"]) for b in loader]))}
    expected = pq.read_table(path, columns=["c11", "c3"])
    for k in got:
        np.testing.assert_array_equal(got[k], expected.column(k).to_numpy())
    fetched = loader.stats()["bytes_fetched"]
    assert chunk_bytes <= fetched <= 1.1 * chunk_bytes, (fetched, chunk_bytes)


@pytest.fixture(scope="module")
def many_objects(seaweed: Seaweed) -> int:
    client = seaweed.client()
    client.create_bucket(Bucket="many")
    from concurrent.futures import ThreadPoolExecutor

    def put(i: int) -> None:
        client.put_object(Bucket="many", Key=f"obj/{i:05d}.bin", Body=i.to_bytes(4, "little") * 256)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, range(2000)))
    return 2000


def sample_ids(loader: sf.DataLoader) -> list[int]:
    ids = []
    for batch in loader:
        for data in batch["bytes"]:
            assert len(data) == 1024 and data == data[:4] * 256  # intact, not truncated or mixed
            ids.append(int.from_bytes(data[:4], "little"))
    return ids


def test_faults_lose_and_repeat_nothing(many_objects: int, seaweed: Seaweed, proxy: FaultProxy) -> None:
    proxy.set_faults(latency=0.02, slow_down=0.05, reset=0.01, truncate=0.01, seed=1)
    options = seaweed.storage_options(proxy.url, retry_base_seconds=0.01, retry_max_seconds=0.2)
    ds = sf.dataset("s3://many/obj/", format="raw", storage_options=options)
    loader = sf.DataLoader(ds, batch_size=100, shuffle=True, seed=0)
    proxy.reset_counts()
    ids = sample_ids(loader)
    assert sorted(ids) == list(range(many_objects))
    stats = loader.stats()
    assert stats["retries"] > 0 and stats["requests"] >= many_objects + stats["retries"]
    # Requests overlap rather than queue one behind another (each waits 20 ms here).
    assert proxy.max_in_flight >= 4, proxy.max_in_flight


def test_interrupted_bodies_resume_where_they_stopped(seaweed: Seaweed, proxy: FaultProxy, tmp_path: Path) -> None:
    data = np.random.default_rng(1).integers(0, 256, 3_000_000, dtype=np.uint8).tobytes()
    client = seaweed.client()
    client.create_bucket(Bucket="big")
    client.put_object(Bucket="big", Key="blob.bin", Body=data)
    proxy.set_faults(truncate=0.5, reset=0.3, seed=2)
    options = seaweed.storage_options(proxy.url, retry_base_seconds=0.01, max_attempts=10, chunk_size=1 << 20)
    loader = sf.DataLoader(sf.dataset("s3://big/blob.bin", format="raw", storage_options=options), batch_size=1)
    (batch,) = list(loader)
    assert batch["bytes"][0] == data
    assert loader.stats()["retries"] > 0


def test_total_failure_is_a_clear_error_in_bounded_time(many_objects: int, seaweed: Seaweed, proxy: FaultProxy) -> None:
    options = seaweed.storage_options(proxy.url, retry_base_seconds=0.01, retry_max_seconds=0.05, max_attempts=4)
    ds = sf.dataset("s3://many/obj/0000*.bin", format="raw", storage_options=options)
    proxy.set_faults(slow_down=1.0)
    proxy.reset_counts()
    with pytest.raises(sf.ReadError) as info:
        list(sf.DataLoader(ds, batch_size=10))
    # Bounded: at most 4 tries for each of the 10 objects, then it gives up.
    assert proxy.gets("/many/obj/0000") <= 4 * 10
    message = str(info.value)
    assert "s3://many/obj/0000" in message and "503" in message and "after 4 attempts" in message
    proxy.set_faults(truncate=1.0)
    with pytest.raises(sf.ReadError, match="after 4 attempts"):
        list(sf.DataLoader(sf.dataset("s3://many/obj/00001.bin", format="raw", storage_options=options), batch_size=1))


def test_cache_serves_a_second_epoch_and_refetches_changed_objects(
    many_objects: int, seaweed: Seaweed, proxy: FaultProxy, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    options = seaweed.storage_options(proxy.url, cache_dir=str(cache))
    ds = sf.dataset("s3://many/obj/000*.bin", format="raw", storage_options=options)
    loader = sf.DataLoader(ds, batch_size=50)
    proxy.reset_counts()
    first = sample_ids(loader)
    assert proxy.gets("/many/obj/") == 100
    # Cache writes finish in the background: wait for all 100 entries to be in place.
    assert wait_for(lambda: len([p for p in cache.iterdir() if not p.name.startswith("tmp-")]) >= 100, timeout=60)
    proxy.reset_counts()
    assert sample_ids(loader) == first
    assert proxy.gets("/many/obj/") == 0
    assert loader.stats()["cache_hits"] == 100
    # A changed object has a new ETag: a new listing sees it, and only it is fetched.
    seaweed.client().put_object(Bucket="many", Key="obj/00007.bin", Body=(7).to_bytes(4, "little") * 256 + b"")
    client = seaweed.client()
    client.put_object(Bucket="many", Key="obj/00008.bin", Body=(808).to_bytes(4, "little") * 256)
    proxy.reset_counts()
    again = sample_ids(sf.DataLoader(sf.dataset("s3://many/obj/000*.bin", format="raw", storage_options=options), batch_size=50))
    assert again[8] == 808
    assert proxy.gets("/many/obj/00008.bin") == 1
    assert proxy.gets("/many/obj/") <= 2  # 00007 has the same bytes: SeaweedFS may keep its ETag
    client.put_object(Bucket="many", Key="obj/00008.bin", Body=(8).to_bytes(4, "little") * 256)


def test_credentials_from_environment_and_profiles(
    formats: tuple[Path, dict], seaweed: Seaweed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import S3_KEY

    monkeypatch.setenv("AWS_ENDPOINT_URL", seaweed.s3_url)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_SECRET)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert len(sf.dataset("s3://formats/parquet/")) == 1500  # the standard chain: environment
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    credentials = tmp_path / "credentials"
    credentials.write_text(f"[bench]\naws_access_key_id = {S3_KEY}\naws_secret_access_key = {S3_SECRET}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    assert len(sf.dataset("s3://formats/parquet/", storage_options={"profile": "bench"})) == 1500


class FakeS3:
    """A server that answers HEAD with an object's size and each GET with the next reply
    queued for its path (then the object's bytes), and keeps every GET's headers."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        import http.server
        import threading
        from urllib.parse import unquote

        self.objects, self.replies, self.gets = objects, {}, []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:  # noqa: N802 (the stdlib's name)
                self.send_response(200)
                self.send_header("Content-Length", str(len(fake.objects[unquote(self.path)])))
                self.send_header("ETag", '"v1"')
                self.end_headers()

            def do_GET(self) -> None:  # noqa: N802
                fake.gets.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                queued = fake.replies.get(self.path, [])
                if queued:
                    status, code, *date = queued.pop(0)
                    body = f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>m</Message></Error>".encode()
                    self.send_response_only(status)
                    self.send_header("Date", date[0] if date else self.date_time_string())
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                first, last = (int(x) for x in self.headers["Range"].removeprefix("bytes=").split("-"))
                data = fake.objects[unquote(self.path)]
                part = data[first : last + 1]
                self.send_response(206)
                self.send_header("Content-Length", str(len(part)))
                self.send_header("Content-Range", f"bytes {first}-{first + len(part) - 1}/{len(data)}")
                self.end_headers()
                self.wfile.write(part)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_s3_gets_are_signed_here_and_expired_tokens_are_fetched_again() -> None:
    """GETs skip the SDK (sigv4.rs signs them: UNSIGNED-PAYLOAD, the session token signed);
    an expired token is a retry with credentials fetched again, a skewed clock one dated
    by the server's; S3's refusals keep their meaning and name the object and S3's error
    code."""
    objects = {f"/b/{name}": bytes(range(256)) * 40 for name in ("a.bin", "denied.bin", "bad.bin", "x y+z.bin")}
    s3 = FakeS3(objects)
    options = {"endpoint_url": s3.url, "access_key_id": "AKFAKE", "secret_access_key": "S3CRET",
               "session_token": "TOKEN", "region": "eu-west-3", "retry_base_seconds": 0.01}
    try:
        s3.replies["/b/a.bin"] = [(400, "ExpiredToken"), (503, "SlowDown")]
        rows = list(sf.DataLoader(sf.dataset("s3://b/a.bin", format="raw", storage_options=options), batch_size=1, output="arrow"))
        assert rows[0].to_pylist()[0]["bytes"] == objects["/b/a.bin"]
        assert [path for path, _ in s3.gets] == ["/b/a.bin"] * 3
        for _, headers in s3.gets:
            assert headers["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"
            assert headers["x-amz-security-token"] == "TOKEN"
            assert headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKFAKE/")
            assert "/eu-west-3/s3/aws4_request, SignedHeaders=host;range;x-amz-content-sha256;x-amz-date;x-amz-security-token, Signature=" in headers["authorization"]
            assert "aws-sdk-rust" not in headers.get("user-agent", "")
            assert headers["if-match"] == '"v1"'
        # A clock S3 finds off is set by the server's Date: the retry is dated by it.
        import datetime
        from email.utils import formatdate

        ahead = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=2)
        s3.replies["/b/a.bin"] = [(403, "RequestTimeTooSkewed", formatdate(ahead.timestamp(), usegmt=True))]
        s3.gets.clear()
        list(sf.DataLoader(sf.dataset("s3://b/a.bin", format="raw", storage_options=options), batch_size=1))
        assert len(s3.gets) == 2
        dated = datetime.datetime.strptime(s3.gets[1][1]["x-amz-date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc)
        assert abs((dated - ahead).total_seconds()) < 60
        # Keys are sent percent-encoded as S3 signs them (only unreserved bytes and '/' bare).
        list(sf.DataLoader(sf.dataset("s3://b/x y+z.bin", format="raw", storage_options=options), batch_size=1))
        assert s3.gets[-1][0] == "/b/x%20y%2Bz.bin"

        s3.gets.clear()
        s3.replies["/b/denied.bin"] = [(403, "AccessDenied")] * 10
        with pytest.raises(sf.AccessDeniedError, match="s3://b/denied.bin"):
            list(sf.DataLoader(sf.dataset("s3://b/denied.bin", format="raw", storage_options=options)))
        assert len(s3.gets) == 1  # a refusal is not retried
        s3.replies["/b/bad.bin"] = [(400, "InvalidArgument")] * 10
        with pytest.raises(sf.ReadError, match="HTTP 400 InvalidArgument"):
            list(sf.DataLoader(sf.dataset("s3://b/bad.bin", format="raw", storage_options=options)))
    finally:
        s3.close()
