"""Google Cloud Storage and Azure Blob as sources and destinations, against real
servers: fake-gcs-server (GCS's JSON API) and `tests/azureserver.py` (the Blob REST API,
checked by `tests/test_azure_server.py` to be one the `azure-storage-blob` SDK works
with, SharedKey signatures verified). Each test runs over both stores, as the S3 tests
run over SeaweedFS: every format read as from local files, written and read back,
listings across pages, objects replaced mid-epoch, resume in a fresh process,
`load_dataset` on a repo layout, faults through the fault proxy; then each store's
credential chain."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from azureserver import ACCOUNT, ACCOUNT_KEY, AzureServer
from faultproxy import FaultProxy
from gcpauth import SERVICE_ACCOUNT, GcpAuthServer, verify_self_signed_jwt
from servers import FakeGCS
from test_remote import DIRS, normalize, sample_ids, write_formats

import shardflow as sf


@dataclass
class Store:
    """One object store as the tests use it: its scheme, how to put objects in it
    (independently of shardflow), and the storage options that reach it."""

    scheme: str
    create: Callable[[str], None]
    put: Callable[[str, str, bytes], None]
    names: Callable[[str, str], list[str]]
    options: Callable[..., dict]
    host_port: tuple[str, int]

    def url(self, bucket: str, name: str = "") -> str:
        return f"{self.scheme}://{bucket}/{name}"

    def upload_tree(self, root: Path, bucket: str) -> None:
        for path in sorted(root.rglob("*")):
            if path.is_file():
                self.put(bucket, str(path.relative_to(root)), path.read_bytes())


@pytest.fixture(scope="module")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGCS]:
    server = FakeGCS(tmp_path_factory.mktemp("gcs"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def azure_server() -> Iterator[AzureServer]:
    server = AzureServer()
    yield server
    server.stop()


def gcs_store(server: FakeGCS) -> Store:
    known: set[str] = set()

    def create(bucket: str) -> None:
        if bucket not in known and bucket not in server.buckets:
            server.create_bucket(bucket)
        known.add(bucket)

    def put(bucket: str, name: str, data: bytes) -> None:
        create(bucket)
        server.put(bucket, name, data)

    return Store("gs", create, put, server.names, server.storage_options, ("127.0.0.1", server.port))


def azure_store(server: AzureServer) -> Store:
    def names(container: str, prefix: str = "") -> list[str]:
        return sorted(n for n in server.containers.get(container, None).blobs if n.startswith(prefix)) if container in server.containers else []

    def options(endpoint: str | None = None, **extra: object) -> dict:
        connection = server.connection_string
        if endpoint:
            connection = connection.replace(server.url, f"{endpoint}/devstoreaccount1")
        return {"connection_string": connection, **extra}

    return Store("az", server.create_container, lambda c, n, d: server.put_blob(c, n, d) and None, names, options, ("127.0.0.1", server.port))


@pytest.fixture(params=["gs", "az"])
def store(request: pytest.FixtureRequest) -> Store:
    if request.param == "gs":
        return gcs_store(request.getfixturevalue("gcs_server"))
    return azure_store(request.getfixturevalue("azure_server"))


@pytest.fixture(scope="module")
def formats(tmp_path_factory: pytest.TempPathFactory, gcs_server: FakeGCS, azure_server: AzureServer) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("formats")
    written = write_formats(root)
    for store in (gcs_store(gcs_server), azure_store(azure_server)):
        store.upload_tree(root, "formats")
    return root, written


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv", "npy", "npz", "webdataset", "arrow", "arrow_stream", "raw"])
def test_every_format_reads_as_from_local_files(formats: tuple[Path, dict], store: Store, fmt: str) -> None:
    root, written = formats
    names, kwargs = written[fmt]
    folder = DIRS.get(fmt, fmt)
    local = sf.dataset([str(root / folder / n) for n in names], **kwargs)
    remote = sf.dataset([store.url("formats", f"{folder}/{n}") for n in names], storage_options=store.options(), **kwargs)
    expected = normalize(list(local))
    assert expected and normalize(list(remote)) == expected

    def batches(ds: sf.Dataset) -> list:
        return [normalize(b.to_pylist()) for b in sf.DataLoader(ds, batch_size=37, shuffle=True, seed=4, output="arrow")]

    assert batches(remote) == batches(local)


def test_globs_prefixes_and_brace_ranges(formats: tuple[Path, dict], store: Store) -> None:
    options = store.options()
    urls = lambda spec: [t["url"] for t in sf.dataset(spec, storage_options=options)._shard_table()]  # noqa: E731
    assert urls(store.url("formats", "parquet/part-*.parquet")) == [store.url("formats", f"parquet/part-{i}.parquet") for i in range(3)]
    assert urls(store.url("formats", "parquet/part-{0..1}.parquet")) == [store.url("formats", f"parquet/part-{i}.parquet") for i in range(2)]
    assert urls(store.url("formats", "parquet/")) == urls(store.url("formats", "parquet/*.parquet"))
    with pytest.raises(sf.ShardflowError, match="no-such"):
        sf.dataset(store.url("formats", "no-such/*.parquet"), storage_options=options)
    with pytest.raises(sf.NotFoundError, match="missing.parquet"):
        sf.dataset(store.url("formats", "parquet/missing.parquet"), storage_options=options)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "webdataset", "tfrecord", "npz"])
def test_every_format_round_trips_through_writes(store: Store, fmt: str) -> None:
    options = store.options()
    n = 500
    source = sf.from_dict({"cls": np.arange(n) * 3, "txt": [f"row {i}" for i in range(n)]})
    store.create("every")
    dest = store.url("every", fmt)
    manifest = source.write(dest, fmt, max_rows_per_shard=200, compression="gzip" if fmt == "jsonl" else None, storage_options=options)
    assert [s["rows"] for s in manifest["shards"]] == [200, 200, 100]
    assert store.names("every", f"{fmt}/") == sorted([f"{fmt}/_shardflow.json"] + [f"{fmt}/{s['path']}" for s in manifest["shards"]])
    features = {"cls": sf.FixedLen([], "int64"), "txt": sf.FixedLen([], "bytes")} if fmt == "tfrecord" else None
    ds = sf.dataset(dest + "/", storage_options=options, features=features)
    assert len(ds) == n
    rows = list(ds)
    assert [int(r["cls"]) for r in rows] == list(range(0, 3 * n, 3))
    assert [r["txt"].decode() if isinstance(r["txt"], bytes) else str(r["txt"]) for r in rows] == [f"row {i}" for i in range(n)]
    with pytest.raises(sf.AlreadyExistsError, match=dest):
        source.write(dest, fmt, storage_options=options)
    # Overwriting with fewer shards removes the stale one.
    source.write(dest, fmt, max_rows_per_shard=300, overwrite=True, storage_options=options)
    assert len([n for n in store.names("every", f"{fmt}/") if "part-" in n]) == 2


def test_large_shards_go_up_in_parts_and_a_failed_write_leaves_nothing(store: Store) -> None:
    options = store.options()
    store.create("big")
    rng = np.random.default_rng(0)
    blobs = [rng.bytes(400_000) for _ in range(100)]
    manifest = sf.from_dict({"cls": np.arange(100), "bin": blobs}).write(
        store.url("big", "one"), "webdataset", max_bytes_per_shard=1 << 30, storage_options=options
    )
    assert len(manifest["shards"]) == 1 and manifest["shards"][0]["bytes"] > 40_000_000
    assert [r["bin"] for r in sf.dataset(store.url("big", "one/"), storage_options=options)] == blobs
    # Refused 36 MB into a streamed shard (two parts sent): no object is left.
    keys = [f"k{i}" for i in range(100)]
    keys[90] = keys[89]
    with pytest.raises(sf.ShardflowError, match="k89"):
        sf.from_dict({"__key__": keys, "bin": blobs}).write(
            store.url("big", "failed"), "webdataset", max_bytes_per_shard=1 << 30, storage_options=options
        )
    assert store.names("big", "failed/") == []


def put_many(store: Store, bucket: str, count: int) -> None:
    store.create(bucket)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: store.put(bucket, f"obj/{i:05d}.bin", i.to_bytes(4, "little") * 256), range(count)))


@pytest.fixture
def many(store: Store) -> int:
    if not store.names("many", "obj/"):
        put_many(store, "many", 2500)
    return 2500


@pytest.fixture
def proxy(store: Store) -> Iterator[FaultProxy]:
    p = FaultProxy(*store.host_port)
    yield p
    p.close()


def list_requests(store: Store, proxy: FaultProxy) -> int:
    return sum(n for key, n in proxy.counts.items() if ("comp=list" in key) or ("/o?" in key))


def test_listing_pages_through_thousands_of_objects(store: Store, many: int, proxy: FaultProxy) -> None:
    proxy.reset_counts()
    ds = sf.dataset(store.url("many", "obj/"), format="raw", storage_options=store.options(proxy.url))
    urls = [t["url"] for t in ds._shard_table()]
    assert urls == [store.url("many", f"obj/{i:05d}.bin") for i in range(many)]
    assert list_requests(store, proxy) >= 3, proxy.counts  # pages of at most 1,000


def test_faults_lose_and_repeat_nothing(store: Store, many: int, proxy: FaultProxy) -> None:
    proxy.set_faults(latency=0.02, slow_down=0.03, server_error=0.02, throttle=0.005, reset=0.01, truncate=0.01, seed=1)
    options = store.options(proxy.url, retry_base_seconds=0.01, retry_max_seconds=0.2)
    ds = sf.dataset(store.url("many", "obj/0*.bin"), format="raw", storage_options=options)
    loader = sf.DataLoader(ds, batch_size=100, shuffle=True, seed=0)
    proxy.reset_counts()
    ids = sample_ids(loader)
    assert sorted(ids) == list(range(many))
    stats = loader.stats()
    assert stats["retries"] > 0 and stats["requests"] >= many + stats["retries"]
    assert loader.report().throttled > 0  # 429s, their Retry-After waited out
    assert proxy.max_in_flight >= 4, proxy.max_in_flight


def test_the_cache_serves_a_second_epoch_keyed_by_version(store: Store, tmp_path: Path) -> None:
    for i in range(5):
        store.put("cached", f"c/{i}.bin", bytes([i]) * 5000)
    options = store.options(cache_dir=str(tmp_path / "cache"))
    first = sf.DataLoader(sf.dataset(store.url("cached", "c/"), format="raw", storage_options=options), batch_size=5)
    assert [bytes(b) for batch in first for b in batch["bytes"]] == [bytes([i]) * 5000 for i in range(5)]
    assert first.stats()["cache_misses"] >= 5
    again = sf.DataLoader(sf.dataset(store.url("cached", "c/"), format="raw", storage_options=options), batch_size=5)
    assert [bytes(b) for batch in again for b in batch["bytes"]] == [bytes([i]) * 5000 for i in range(5)]
    assert again.stats()["cache_hits"] >= 5 and again.stats()["bytes_fetched"] == 0
    # A replaced object has a new version: it is fetched, not served stale.
    store.put("cached", "c/3.bin", b"n" * 5000)
    third = sf.DataLoader(sf.dataset(store.url("cached", "c/"), format="raw", storage_options=options), batch_size=5)
    assert [bytes(b) for batch in third for b in batch["bytes"]][3] == b"n" * 5000
    assert third.stats()["bytes_fetched"] == 5000


def test_an_object_replaced_mid_epoch_is_an_error_naming_it(store: Store) -> None:
    for i in range(3):
        store.put("replaced", f"r/{i}.bin", bytes([i]) * 1000)
    # Listed (each object's version pinned), then one replaced before the epoch reads it.
    ds = sf.dataset(store.url("replaced", "r/"), format="raw", storage_options=store.options())
    store.put("replaced", "r/2.bin", b"new" * 500)
    with pytest.raises(sf.ReadError, match=r"r/2\.bin.*changed"):
        list(sf.DataLoader(ds, batch_size=1))
    # Read again, the new version is what a new listing pins.
    assert [bytes(r["bytes"]) for r in sf.dataset(store.url("replaced", "r/2.bin"), format="raw", storage_options=store.options())] == [b"new" * 500]


RESUME = """
import json, sys
import shardflow as sf
options, url, state_path = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
loader = sf.DataLoader(sf.dataset(url, storage_options=options), batch_size=64, shuffle=True, seed=7,
                       rank=int(sys.argv[4]), world_size=2)
loader.load_state_dict(json.load(open(state_path)))
print(json.dumps([int(i) for b in loader for i in b["id"]]))
"""


def test_a_resumed_epoch_in_a_fresh_process_is_exact(store: Store, tmp_path: Path) -> None:
    for i in range(4):
        table = pa.table({"id": np.arange(i * 400, (i + 1) * 400)})
        pq.write_table(table, tmp_path / f"p{i}.parquet", row_group_size=100)
        store.put("resume", f"ids/p{i}.parquet", (tmp_path / f"p{i}.parquet").read_bytes())
    url, options = store.url("resume", "ids/"), store.options()
    for rank in range(2):
        def loader() -> sf.DataLoader:
            return sf.DataLoader(sf.dataset(url, storage_options=options), batch_size=64, shuffle=True, seed=7, rank=rank, world_size=2)

        whole = loader()
        whole.set_epoch(1)
        full = [int(i) for b in whole for i in b["id"]]
        partial = loader()
        partial.set_epoch(1)
        it = iter(partial)
        head = [int(i) for _ in range(5) for i in next(it)["id"]]
        (tmp_path / "state.json").write_text(json.dumps(partial.state_dict()))
        out = subprocess.run(
            [sys.executable, "-c", RESUME, json.dumps(options), url, str(tmp_path / "state.json"), str(rank)],
            capture_output=True, text=True, check=True, timeout=120,
        )
        assert head + json.loads(out.stdout) == full


def test_load_dataset_on_a_repo_layout_in_a_bucket_equals_the_local_one(store: Store, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    pq.write_table(pa.table({"text": [f"t{i}" for i in range(30)], "label": np.arange(30) % 3}), repo / "data" / "train-00000-of-00001.parquet")
    pq.write_table(pa.table({"text": ["x", "y"], "label": [1, 2]}), repo / "data" / "test-00000-of-00001.parquet")
    for path in sorted(repo.rglob("*")):
        if path.is_file():
            store.put("hub", f"repo/{path.relative_to(repo)}", path.read_bytes())
    local = sf.load_dataset(str(repo))
    remote = sf.load_dataset(store.url("hub", "repo"), storage_options=store.options())
    assert sorted(remote) == sorted(local) == ["test", "train"]
    for split in local:
        assert list(remote[split]) == list(local[split])


# ---- GCS credentials: Application Default Credentials, against local Google endpoints ----


@pytest.fixture
def google(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[GcpAuthServer]:
    server = GcpAuthServer()
    server.objects[("creds", "x.bin")] = b"secret bytes" * 10
    # Nothing of this machine's own: no key file named, no gcloud file, no emulator.
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST", "GCE_METADATA_HOST", "GCE_METADATA_IP", "GCE_METADATA_ROOT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    yield server
    server.stop()


def read_gcs(server: GcpAuthServer, **options: Any) -> list[bytes]:
    ds = sf.dataset("gs://creds/x.bin", format="raw", storage_options={"endpoint_url": server.url, **options})
    return [bytes(r["bytes"]) for r in ds]


def test_gcs_service_account_from_the_environment_signs_its_requests(google: GcpAuthServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = google.add_service_account(tmp_path / "sa.json")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "sa.json"))
    google.required_authorization = None
    assert read_gcs(google) == [b"secret bytes" * 10]
    assert google.authorizations and all(a is not None for a in google.authorizations)
    claims = verify_self_signed_jwt(google.authorizations[-1], key)  # signed with the account's key
    assert claims["iss"] == claims["sub"] == SERVICE_ACCOUNT
    # A key file named in storage_options["token"] comes first.
    other = google.add_service_account(tmp_path / "other.json", client_email="other@shardflow-test.iam.gserviceaccount.com")
    google.reset_counts()
    assert read_gcs(google, token=str(tmp_path / "other.json")) == [b"secret bytes" * 10]
    assert verify_self_signed_jwt(google.authorizations[-1], other)["iss"].startswith("other@")
    with pytest.raises(ValueError):
        verify_self_signed_jwt(google.authorizations[-1], key)


def test_gcs_gcloud_file_then_the_metadata_server(google: GcpAuthServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # gcloud's file with a service account in it (as `gcloud auth application-default` may write).
    gcloud = tmp_path / ".config" / "gcloud"
    gcloud.mkdir(parents=True)
    key = google.add_service_account(gcloud / "application_default_credentials.json")
    assert read_gcs(google) == [b"secret bytes" * 10]
    verify_self_signed_jwt(google.authorizations[-1], key)
    # Without it, the metadata server's token (GCE_METADATA_HOST respected).
    (gcloud / "application_default_credentials.json").unlink()
    monkeypatch.setenv("GCE_METADATA_HOST", google.metadata_host)
    google.reset_counts()
    google.required_authorization = f"Bearer {google.metadata_token}"
    assert read_gcs(google) == [b"secret bytes" * 10]
    assert google.counts["/computeMetadata/v1/instance/service-accounts/default/token"] == 1  # fetched once, kept
    # A token the server refuses is a clear error naming the object.
    google.required_authorization = "Bearer something-else"
    with pytest.raises(sf.AccessDeniedError, match="gs://creds/x.bin"):
        read_gcs(google)


def test_gcs_anonymous_without_any_credentials_or_when_asked(google: GcpAuthServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # No key, no gcloud file, no metadata server answering: public buckets still read.
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    assert read_gcs(google) == [b"secret bytes" * 10]
    assert google.authorizations and set(google.authorizations) == {None}
    google.reset_counts()
    monkeypatch.setenv("GCE_METADATA_HOST", google.metadata_host)
    assert read_gcs(google, token="anon") == [b"secret bytes" * 10]
    assert set(google.authorizations) == {None} and not google.counts["/computeMetadata/v1/instance/service-accounts/default/token"]


def test_gcs_objects_stored_gzip_encoded_read_as_stored_ranges_and_all(gcs_server: FakeGCS) -> None:
    """`gsutil cp -Z` stores objects with `Content-Encoding: gzip`; without
    `Accept-Encoding: gzip` GCS (and fake-gcs-server) ignores `Range` and serves them
    decompressed. Read as stored, they decode by their extension."""
    import gzip

    rng = np.random.default_rng(5)
    rows = [{"id": i, "text": rng.bytes(16).hex()} for i in range(20_000)]
    stored = gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode())
    gcs_server.create_bucket("encoded")
    gcs_server.put("encoded", "rows.jsonl.gz", stored, content_encoding="gzip")
    options = gcs_server.storage_options(chunk_size=64 * 1024)
    assert len(stored) > 4 * 64 * 1024  # read as several ranges
    assert [dict(r) for r in sf.dataset("gs://encoded/rows.jsonl.gz", storage_options=options)] == rows
    assert [bytes(r["bytes"]) for r in sf.dataset("gs://encoded/rows.jsonl.gz", format="raw", storage_options=options)] == [stored]


def test_storage_emulator_host_is_honoured(gcs_server: FakeGCS, monkeypatch: pytest.MonkeyPatch) -> None:
    gcs_server.create_bucket("emulated")
    gcs_server.put("emulated", "a.bin", b"abc")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"127.0.0.1:{gcs_server.port}")
    assert [bytes(r["bytes"]) for r in sf.dataset("gs://emulated/a.bin", format="raw")] == [b"abc"]


# ---- Azure credentials: connection strings, keys, SAS, anonymous, in adlfs's order ----


def read_azure(url: str, **options: Any) -> list[bytes]:
    return [bytes(r["bytes"]) for r in sf.dataset(url, format="raw", storage_options=options)]


def test_azure_keys_from_options_and_environment_and_every_url_form(azure_server: AzureServer, monkeypatch: pytest.MonkeyPatch) -> None:
    azure_server.put_blob("creds", "dir/x.bin", b"azure bytes")
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    expected = [b"azure bytes"]
    assert read_azure("az://creds/dir/x.bin", connection_string=azure_server.connection_string) == expected
    keyed = {"account_name": ACCOUNT, "account_key": ACCOUNT_KEY, "endpoint_url": azure_server.url}
    assert read_azure("az://creds/dir/x.bin", **keyed) == expected
    # The account named in the URL; Azure's own https:// form, and abfs's.
    assert read_azure(f"abfss://creds@{ACCOUNT}.dfs.core.windows.net/dir/x.bin", account_key=ACCOUNT_KEY, endpoint_url=azure_server.url) == expected
    https = f"https://{ACCOUNT}.blob.core.windows.net/creds/dir/"
    assert [t["url"] for t in sf.dataset(https, format="raw", storage_options={"account_key": ACCOUNT_KEY, "endpoint_url": azure_server.url})._shard_table()] == [https + "x.bin"]
    # The environment: adlfs's and object_store's spellings, and the az CLI's.
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", ACCOUNT)
    monkeypatch.setenv("AZURE_STORAGE_KEY", ACCOUNT_KEY)
    assert read_azure("az://creds/dir/x.bin", endpoint_url=azure_server.url) == expected
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT")
    monkeypatch.delenv("AZURE_STORAGE_KEY")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azure_server.connection_string)
    assert read_azure("az://creds/dir/x.bin") == expected
    # A wrong key (in storage_options, which come before the environment) is refused by
    # the server's SharedKey check: a clear error naming the blob.
    wrong = ACCOUNT_KEY[:-8] + "AAAAAAA="
    with pytest.raises(sf.AccessDeniedError, match="az://creds/dir/x.bin"):
        read_azure("az://creds/dir/x.bin", account_name=ACCOUNT, account_key=wrong, endpoint_url=azure_server.url)


def test_azure_sas_tokens_and_anonymous_public_containers(azure_server: AzureServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import datetime, timedelta, timezone

    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    azure_server.put_blob("sas", "x.bin", b"sas bytes")
    sas = generate_container_sas(ACCOUNT, "sas", account_key=ACCOUNT_KEY, permission=ContainerSasPermissions(read=True, list=True),
                                 expiry=datetime.now(timezone.utc) + timedelta(hours=1))
    options = {"account_name": ACCOUNT, "sas_token": sas, "endpoint_url": azure_server.url}
    assert read_azure("az://sas/", **options) == [b"sas bytes"]
    # Public containers read without a credential (anon=True, adlfs's name).
    azure_server.put_blob("public", "p.bin", b"public bytes")
    with pytest.raises(sf.ShardflowError, match="az://public/"):
        read_azure("az://public/", account_name=ACCOUNT, anon=True, endpoint_url=azure_server.url)
    azure_server.public_containers.add("public")
    assert read_azure("az://public/", account_name=ACCOUNT, anon=True, endpoint_url=azure_server.url) == [b"public bytes"]


def test_azure_managed_identity_token_then_anonymous_when_there_is_none(azure_server: AzureServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Entra ID through a managed identity: the token comes from the identity endpoint
    (IMDS, here a local one) and is sent as a bearer token; with no endpoint answering and
    nothing else named, public containers still read anonymously."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_CLIENT_ID", "AZURE_FEDERATED_TOKEN_FILE", "IDENTITY_HEADER"):
        monkeypatch.delenv(name, raising=False)
    asked: list[dict[str, str]] = []

    class Imds(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            asked.append({"path": self.path, "metadata": self.headers.get("Metadata", "")})
            body = json.dumps({"access_token": "entra-token", "expires_on": str(int(time.time()) + 3600),
                               "token_type": "Bearer", "resource": "https://storage.azure.com"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    imds = ThreadingHTTPServer(("127.0.0.1", 0), Imds)
    threading.Thread(target=imds.serve_forever, daemon=True).start()
    try:
        azure_server.put_blob("entra", "e.bin", b"entra bytes")
        azure_server.bearer_tokens.add("entra-token")
        monkeypatch.setenv("AZURE_MSI_ENDPOINT", f"http://127.0.0.1:{imds.server_address[1]}/metadata/identity/oauth2/token")
        options = {"account_name": ACCOUNT, "endpoint_url": azure_server.url}
        assert read_azure("az://entra/e.bin", **options) == [b"entra bytes"]
        assert asked and asked[0]["metadata"] == "true" and "resource=https" in asked[0]["path"]
        # No identity endpoint answers: anonymous, which a private container refuses and a
        # public one serves.
        monkeypatch.setenv("AZURE_MSI_ENDPOINT", "http://127.0.0.1:9/metadata/identity/oauth2/token")
        with pytest.raises(sf.ShardflowError, match="az://entra/e.bin"):
            read_azure("az://entra/e.bin", **options)
        azure_server.public_containers.add("entra")
        assert read_azure("az://entra/e.bin", **options) == [b"entra bytes"]
    finally:
        imds.shutdown()
        imds.server_close()


def test_the_command_line_takes_both_schemes_as_it_takes_paths(formats: tuple[Path, dict], gcs_server: FakeGCS, azure_server: AzureServer, tmp_path: Path) -> None:
    """`shardflow convert` from GCS to Azure, credentials from the environment (the
    emulator's address; a connection string), then `head` of what it wrote."""
    root, _ = formats
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AZURE_", "GOOGLE_", "STORAGE_EMULATOR"))}
    env.update(STORAGE_EMULATOR_HOST=gcs_server.url, AZURE_STORAGE_CONNECTION_STRING=azure_server.connection_string, HOME=str(tmp_path))
    cli = [sys.executable, "-m", "shardflow"]
    azure_server.create_container("converted")
    subprocess.run([*cli, "convert", "gs://formats/parquet/", "az://converted/jsonl", "--to", "jsonl", "--max-rows-per-shard", "600"],
                   env=env, check=True, capture_output=True, timeout=120)
    assert sorted(azure_server.containers["converted"].blobs) == ["jsonl/_shardflow.json"] + [f"jsonl/part-{i:05d}.jsonl" for i in range(3)]
    head = subprocess.run([*cli, "head", "-n", "3", "az://converted/jsonl"], env=env, check=True, capture_output=True, text=True, timeout=120)
    expected = pq.read_table(root / "parquet" / "part-0.parquet").slice(0, 3).to_pylist()
    assert [json.loads(line)["id"] for line in head.stdout.splitlines()] == [r["id"] for r in expected]
