"""The Google auth stand-ins of gcpauth.py, checked with urllib alone: what a GCS client's
credential tests rely on must itself behave as Google's endpoints do."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from gcpauth import JWT_BEARER, GcpAuthServer, verify_self_signed_jwt


@pytest.fixture(scope="module")
def server() -> Iterator[GcpAuthServer]:
    s = GcpAuthServer()
    yield s
    s.stop()


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def sign_jwt(key_file: Path, claims: dict[str, Any]) -> str:
    """An RS256 JWT signed with a service-account key file's private key, as clients make them."""
    info = json.loads(key_file.read_text())
    key = serialization.load_pem_private_key(info["private_key"].encode(), password=None)
    assert isinstance(key, rsa.RSAPrivateKey)
    header = {"alg": "RS256", "typ": "JWT", "kid": info["private_key_id"]}
    signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"
    signature = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input}.{b64url(signature)}"


def fetch(url: str, headers: dict[str, str] | None = None, form: dict[str, str] | None = None) -> tuple[int, bytes, Any]:
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers or {})) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        with error:  # closed here: an open refusal is a ResourceWarning later
            return error.code, error.read(), error.headers


def tamper(token: str) -> str:
    header, claims, signature = token.split(".")
    forged = json.loads(base64.urlsafe_b64decode(claims + "=="))
    forged["scope"] = "https://www.googleapis.com/auth/cloud-platform"
    return f"{header}.{b64url(json.dumps(forged).encode())}.{signature}"


def test_metadata_server(server: GcpAuthServer) -> None:
    token_url = f"{server.url}/computeMetadata/v1/instance/service-accounts/default/token"
    server.reset_counts()
    status, _, _ = fetch(token_url)
    assert status == 403
    status, body, headers = fetch(token_url, {"Metadata-Flavor": "Google"})
    assert status == 200 and headers["Metadata-Flavor"] == "Google"
    assert json.loads(body) == {"access_token": server.metadata_token, "expires_in": 3600, "token_type": "Bearer"}
    email_url = f"{server.url}/computeMetadata/v1/instance/service-accounts/default/email"
    assert fetch(email_url, {"Metadata-Flavor": "Google"})[1].decode() == server.metadata_email
    assert server.counts["/computeMetadata/v1/instance/service-accounts/default/token"] == 2


def test_refresh_token_grant(server: GcpAuthServer, tmp_path: Path) -> None:
    server.write_authorized_user(tmp_path / "adc.json")
    user = json.loads((tmp_path / "adc.json").read_text())
    form = {"grant_type": "refresh_token", **{k: user[k] for k in ("client_id", "client_secret", "refresh_token")}}
    status, body, _ = fetch(user["token_uri"], form=form)
    assert status == 200 and json.loads(body)["access_token"] == server.user_token
    status, body, _ = fetch(server.token_uri, form={**form, "refresh_token": "revoked"})
    assert status == 400 and json.loads(body)["error"] == "invalid_grant"
    status, _, _ = fetch(server.token_uri, form={**form, "client_secret": "wrong"})
    assert status == 401


def test_service_account_grant(server: GcpAuthServer, tmp_path: Path) -> None:
    key_file = tmp_path / "sa.json"
    public_key = server.add_service_account(key_file)
    info = json.loads(key_file.read_text())
    assert info["type"] == "service_account" and info["token_uri"] == server.token_uri
    assert info["private_key"].startswith("-----BEGIN PRIVATE KEY-----")  # PKCS#8
    now = int(time.time())
    claims = {"iss": info["client_email"], "aud": server.token_uri, "iat": now, "exp": now + 3600,
              "scope": "https://www.googleapis.com/auth/devstorage.read_only"}
    assertion = sign_jwt(key_file, claims)
    status, body, _ = fetch(server.token_uri, form={"grant_type": JWT_BEARER, "assertion": assertion})
    assert status == 200 and json.loads(body)["access_token"] == server.service_account_token
    status, body, _ = fetch(server.token_uri, form={"grant_type": JWT_BEARER, "assertion": tamper(assertion)})
    assert status == 400 and json.loads(body)["error_description"] == "Invalid JWT Signature."
    too_long = sign_jwt(key_file, {**claims, "exp": now + 7200})
    assert fetch(server.token_uri, form={"grant_type": JWT_BEARER, "assertion": too_long})[0] == 400

    # A client that signs its own JWT for the API instead of calling token_uri.
    own = sign_jwt(key_file, {"iss": info["client_email"], "sub": info["client_email"],
                              "aud": "https://storage.googleapis.com/", "iat": now, "exp": now + 3600})
    assert verify_self_signed_jwt(f"Bearer {own}", public_key)["aud"] == "https://storage.googleapis.com/"
    for bad in (f"Bearer {tamper(own)}", own, None):
        with pytest.raises(ValueError):
            verify_self_signed_jwt(bad, public_key)
    other = server.add_service_account(tmp_path / "other.json", "other@shardflow-test.iam.gserviceaccount.com")
    with pytest.raises(ValueError):
        verify_self_signed_jwt(f"Bearer {own}", other)


def test_gcs_front(server: GcpAuthServer) -> None:
    data = bytes(range(256)) * 4
    server.objects[("bkt", "dir/data.bin")] = data
    server.objects[("bkt", "dir/sub/x")] = b"x"
    server.objects[("bkt", "top")] = b"t"
    server.reset_counts()
    base = f"{server.url}/storage/v1/b/bkt/o"
    status, body, _ = fetch(f"{base}/dir%2Fdata.bin", {"Authorization": "Bearer one"})
    meta = json.loads(body)
    assert status == 200 and (meta["name"], meta["bucket"], meta["size"]) == ("dir/data.bin", "bkt", "1024")
    assert meta["generation"].isdigit() and meta["etag"]

    status, body, headers = fetch(f"{base}/dir%2Fdata.bin?alt=media", {"Range": "bytes=10-19"})
    assert status == 206 and body == data[10:20] and headers["Content-Range"] == "bytes 10-19/1024"
    download = f"{server.url}/download/storage/v1/b/bkt/o/dir%2Fdata.bin?alt=media"
    assert fetch(download, {"Range": "bytes=1000-"})[1] == data[1000:]
    assert fetch(download)[1] == data
    assert fetch(f"{base}/missing?alt=media")[0] == 404
    stale = str(int(meta["generation"]) + 1)
    assert fetch(f"{base}/dir%2Fdata.bin?alt=media&ifGenerationMatch={stale}")[0] == 412

    listing = json.loads(fetch(f"{base}?prefix=dir%2F&delimiter=%2F")[1])
    assert [o["name"] for o in listing["items"]] == ["dir/data.bin"] and listing["prefixes"] == ["dir/sub/"]
    first = json.loads(fetch(f"{base}?maxResults=2")[1])
    rest = json.loads(fetch(f"{base}?maxResults=2&pageToken={urllib.parse.quote(first['nextPageToken'])}")[1])
    assert [o["name"] for o in first["items"] + rest["items"]] == ["dir/data.bin", "dir/sub/x", "top"]
    assert "nextPageToken" not in rest
    assert server.authorizations[:2] == ["Bearer one", None]

    server.required_authorization = "Bearer right"
    try:
        status, body, headers = fetch(f"{base}/top?alt=media", {"Authorization": "Bearer wrong"})
        assert status == 401 and json.loads(body)["error"]["code"] == 401 and "WWW-Authenticate" in headers
        assert fetch(f"{base}/top?alt=media", {"Authorization": "Bearer right"})[1] == b"t"
    finally:
        server.required_authorization = None
    assert server.authorizations[-2:] == ["Bearer wrong", "Bearer right"]
