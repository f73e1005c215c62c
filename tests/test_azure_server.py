"""The Azure Blob test server against the real azure-storage-blob SDK: if the SDK can
upload, list and download through it, and is refused where Azure would refuse it, a
loader's Azure tests against it mean something."""

from __future__ import annotations

import base64
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from azure.core import MatchConditions
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.storage.blob import (
    AccountSasPermissions,
    BlobBlock,
    BlobClient,
    BlobSasPermissions,
    BlobServiceClient,
    BlockState,
    ContainerClient,
    ContainerSasPermissions,
    ResourceTypes,
    generate_account_sas,
    generate_blob_sas,
    generate_container_sas,
)
from azureserver import ACCOUNT, ACCOUNT_KEY, AzureServer

BLOCK = 64 * 1024


@pytest.fixture(scope="module")
def server() -> Iterator[AzureServer]:
    s = AzureServer()
    yield s
    s.stop()


def client(server: AzureServer) -> BlobServiceClient:
    # Small sizes so that uploads go in blocks and downloads in several ranged GETs.
    return BlobServiceClient.from_connection_string(
        server.connection_string, max_single_put_size=BLOCK, max_block_size=BLOCK,
        max_single_get_size=BLOCK, max_chunk_get_size=BLOCK,
    )


def error_code(error: HttpResponseError) -> str | None:
    # The SDK sets error_code on the errors it raises from a storage error's x-ms-error-code.
    return getattr(error, "error_code", None)


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str | None, bytes]:
    """A GET with urllib: status, Azure's error code, and the body (empty for an error).
    Replies, refusals included, are closed here: an open one is a ResourceWarning later."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {})) as reply:
            return reply.status, None, reply.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers["x-ms-error-code"], b""


def test_sdk_round_trip(server: AzureServer) -> None:
    container = client(server).create_container("round-trip")
    small, large = b"hello azure", os.urandom(5 * BLOCK + 123)
    server.reset_counts()
    container.upload_blob("b/small.txt", small)
    assert server.operations == {"PutBlob": 1}
    container.upload_blob("a/large.bin", large, validate_content=True)
    assert server.operations["PutBlock"] == 6 and server.operations["PutBlockList"] == 1
    for name in ("c/1", "c/2", "d"):
        container.upload_blob(name, name.encode())
    with pytest.raises(ResourceExistsError):  # upload_blob sends If-None-Match: * unless overwrite
        container.upload_blob("d", b"again")

    server.reset_counts()
    pages = [[b.name for b in page] for page in container.list_blobs(results_per_page=2).by_page()]
    assert pages == [["a/large.bin", "b/small.txt"], ["c/1", "c/2"], ["d"]]
    assert server.operations == {"ListBlobs": 3}
    assert [b.name for b in container.list_blobs(name_starts_with="c/")] == ["c/1", "c/2"]
    assert [b.name for b in container.walk_blobs(delimiter="/")] == ["a/", "b/", "c/", "d"]
    listed = {b.name: b for b in container.list_blobs()}
    assert listed["a/large.bin"].size == len(large) and listed["a/large.bin"].blob_type == "BlockBlob"

    server.reset_counts()
    assert container.download_blob("b/small.txt").readall() == small
    assert container.download_blob("a/large.bin").readall() == large
    assert server.operations["GetBlob"] == 1 + 6  # chunks after the first carry If-Match
    assert container.download_blob("a/large.bin", validate_content=True).readall() == large
    assert container.download_blob("a/large.bin", offset=BLOCK - 7, length=BLOCK + 50).readall() == large[BLOCK - 7 : 2 * BLOCK + 43]
    assert container.download_blob("a/large.bin", offset=len(large) - 5).readall() == large[-5:]

    props = container.get_blob_client("a/large.bin").get_blob_properties()
    # As Azure's: quoted in headers, bare in listings.
    assert props.size == len(large) and props.etag == f'"{listed["a/large.bin"].etag}"'
    assert props.etag.startswith('"0x') and props.last_modified is not None
    with pytest.raises(ResourceNotFoundError):
        container.download_blob("missing").readall()


def test_empty_blob(server: AzureServer) -> None:
    # The SDK's first GET asks for a range, which an empty blob answers 416; it then GETs whole.
    container = client(server).create_container("empty")
    container.upload_blob("zero", b"")
    assert container.download_blob("zero").readall() == b""


def test_names_needing_escapes(server: AzureServer) -> None:
    # The signed resource is the path as sent, percent-encoded; listing gives names back decoded.
    container = client(server).create_container("odd-names")
    names = ["a%20b", "q?x&y=z#h", "sp ace/\u00fc+x.bin"]
    for name in names:
        container.upload_blob(name, name.encode())
    assert [b.name for b in container.list_blobs()] == sorted(names)
    assert all(container.download_blob(name).readall() == name.encode() for name in names)


def test_wrong_key_is_refused(server: AzureServer) -> None:
    client(server).create_container("secret").upload_blob("x", b"x")
    wrong = base64.b64encode(b"not the key" * 6).decode()
    bad = BlobServiceClient(server.url, credential={"account_name": ACCOUNT, "account_key": wrong})
    with pytest.raises(ClientAuthenticationError) as refused:
        bad.get_container_client("secret").download_blob("x").readall()
    assert refused.value.status_code == 403 and error_code(refused.value) == "AuthenticationFailed"
    assert "string to sign" in str(refused.value)


def test_stale_etag(server: AzureServer) -> None:
    container = client(server).create_container("stale")
    etag = container.upload_blob("obj", b"first").get_blob_properties().etag
    assert server.put_blob("stale", "obj", b"second") != etag
    with pytest.raises(ResourceModifiedError) as stale:
        container.download_blob("obj", etag=etag, match_condition=MatchConditions.IfNotModified).readall()
    assert stale.value.status_code == 412
    assert container.download_blob("obj").readall() == b"second"


def test_uncommitted_blocks_are_invisible(server: AzureServer) -> None:
    container = client(server).create_container("blocks")
    blob = container.get_blob_client("staged")
    ids = [base64.b64encode(f"block-{i:04d}".encode()).decode() for i in range(2)]
    blob.stage_block(ids[0], b"one,")
    blob.stage_block(ids[1], b"two")
    assert list(container.list_blobs()) == []
    with pytest.raises(ResourceNotFoundError):
        blob.download_blob().readall()
    blob.commit_block_list([BlobBlock(ids[0]), BlobBlock(ids[1])])
    assert [b.name for b in container.list_blobs()] == ["staged"]
    assert blob.download_blob().readall() == b"one,two"
    # The SDK sends every id as <Latest> (it compares BlockState to lowercase names): a
    # committed block is found again, one never staged is not.
    blob.commit_block_list([BlobBlock(ids[1], BlockState.COMMITTED)])
    assert blob.download_blob().readall() == b"two"
    with pytest.raises(HttpResponseError) as missing:
        blob.commit_block_list([BlobBlock(base64.b64encode(b"block-9999").decode())])
    assert error_code(missing.value) == "InvalidBlockList"


def test_sas_anonymous_and_bearer(server: AzureServer) -> None:
    client(server).create_container("shared").upload_blob("x", b"data")
    expiry = datetime.now(timezone.utc) + timedelta(hours=1)

    def sas(permission: ContainerSasPermissions, expires: datetime = expiry) -> ContainerClient:
        token = generate_container_sas(ACCOUNT, "shared", account_key=ACCOUNT_KEY, permission=permission, expiry=expires)
        return ContainerClient(server.url, "shared", credential=token)

    reader = sas(ContainerSasPermissions(read=True, list=True))
    assert [b.name for b in reader.list_blobs()] == ["x"]
    assert reader.download_blob("x").readall() == b"data"
    with pytest.raises(HttpResponseError) as no_write:
        reader.upload_blob("y", b"nope")
    assert error_code(no_write.value) == "AuthorizationPermissionMismatch"
    with pytest.raises(ClientAuthenticationError):
        sas(ContainerSasPermissions(read=True), datetime.now(timezone.utc) - timedelta(minutes=1)).download_blob("x").readall()

    # A blob SAS reaches its blob only; an account SAS may create containers.
    blob_token = generate_blob_sas(ACCOUNT, "shared", "x", account_key=ACCOUNT_KEY,
                                   permission=BlobSasPermissions(read=True), expiry=expiry)
    assert BlobClient(server.url, "shared", "x", credential=blob_token).download_blob().readall() == b"data"
    with pytest.raises(ClientAuthenticationError):
        BlobClient(server.url, "shared", "y", credential=blob_token).download_blob().readall()
    account_token = generate_account_sas(ACCOUNT, ACCOUNT_KEY, ResourceTypes(container=True, object=True),
                                         AccountSasPermissions(create=True, write=True), expiry)
    BlobServiceClient(server.url, credential=account_token).create_container("by-sas").upload_blob("z", b"z")
    assert server.read_blob("by-sas", "z") == b"z"

    url = f"{server.url}/shared/x"
    assert get(url) == (404, "ResourceNotFound", b"")
    server.public_containers.add("shared")
    assert get(url)[::2] == (200, b"data")
    server.public_containers.discard("shared")

    server.bearer_tokens.add("entra-token")
    headers = {"x-ms-version": "2025-01-05"}
    assert get(url, {"Authorization": "Bearer entra-token", **headers})[::2] == (200, b"data")
    assert get(url, {"Authorization": "Bearer other", **headers})[0] == 401
