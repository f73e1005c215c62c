"""A small Azure Blob Storage server for the tests, in memory. No Azure emulator
(Azurite) installs here, so this stands in for one: the real `azure-storage-blob` SDK
uploads, lists and downloads through it with the development storage connection string,
and a loader's requests must be signed and shaped as Azure's service wants them.

Addressing is path-style, as the emulators': `http://127.0.0.1:PORT/devstoreaccount1/
<container>/<blob>`. Operations: Create Container, List Blobs (prefix, delimiter,
maxresults, opaque marker), Get Blob (x-ms-range / Range, x-ms-range-get-content-md5),
Get Blob Properties, Put Blob, Put Block, Put Block List (uncommitted blocks stay invisible
until a list commits them), Delete Blob. If-Match / If-None-Match / If-Modified-Since /
If-Unmodified-Since are honoured; every write gives the blob a new ETag, quoted in
headers and bare in listings, as Azure sends them.

Every request is authorized as Azure does it:
- `Authorization: SharedKey devstoreaccount1:<sig>`: the signature is recomputed from the
  string-to-sign of https://learn.microsoft.com/en-us/rest/api/storageservices/authorize-with-shared-key
  (version 2015-02-21 and later), and a mismatch answers 403 AuthenticationFailed with the
  string the server signed, so a client's bug shows in the test failure. Such requests
  need `x-ms-version` 2015-02-21 or later (older versions sign differently; they are
  refused with 400 rather than checked by the wrong rules) and `x-ms-date` or `Date`
  within 15 minutes. x-ms- headers sort by code point, as the docs say (the Python SDK
  sorts with a collation that skips '-' first; for the headers clients send, the same).
- `?...&sig=`: a service SAS (sr=c or sr=b) or an account SAS, signed version 2020-12-06
  or later, its HMAC, times, protocol, IP and permissions checked. Stored access
  policies (si) are refused, and write operations need `w` (`c`, create-only, is not
  modelled).
- `Authorization: Bearer <token>`: accepted when the token is in `bearer_tokens`
  (Entra ID), else 401 InvalidAuthenticationInfo.
- No credential: reads and listing of containers in `public_containers`; anything else
  answers 404 ResourceNotFound, as Azure does so that strangers can't probe for names.

Unmodelled operations answer 501. Counts requests by method and by operation, and tests
may put, replace and delete blobs directly (`put_blob`, `delete_blob`). Listens on
127.0.0.1 only; started and stopped by the tests. Headers and body go out at once
(TCP_NODELAY) and a burst of connections is queued, not dropped, as in faultproxy.py.
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import hashlib
import hmac
import ipaddress
import itertools
import re
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.message import Message
from http.server import BaseHTTPRequestHandler
from urllib.parse import unquote, urlsplit
from xml.sax.saxutils import escape

from faultproxy import LocalServer

ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
SHARED_KEY_MIN_VERSION = "2015-02-21"
SAS_MIN_VERSION = "2020-12-06"
CLOCK_SKEW = 15 * 60
# Azure computes a range's MD5 only for ranges up to 4 MiB.
RANGE_MD5_LIMIT = 4 * 1024 * 1024
CONTAINER_NAME = re.compile(r"[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]")
# Standard headers in the order they enter the string-to-sign.
SIGNED_HEADERS = (
    "Content-Encoding", "Content-Language", "Content-Length", "Content-MD5", "Content-Type", "Date",
    "If-Modified-Since", "If-Match", "If-None-Match", "If-Unmodified-Since", "Range",
)
# SAS query parameters that override response headers.
SAS_OVERRIDES = {
    "rscc": "Cache-Control", "rscd": "Content-Disposition", "rsce": "Content-Encoding",
    "rscl": "Content-Language", "rsct": "Content-Type",
}


@dataclass(frozen=True)
class Blob:
    data: bytes
    etag: str
    last_modified: float
    created: float
    content_type: str
    content_md5: bytes | None
    metadata: dict[str, str]
    # Committed (block id, bytes), for Put Block List's <Committed>; empty after Put Blob.
    blocks: tuple[tuple[str, bytes], ...] = ()


@dataclass
class Container:
    etag: str
    created: float
    blobs: dict[str, Blob] = field(default_factory=dict)
    # Blob name -> block id -> bytes, staged by Put Block and not yet committed.
    uncommitted: dict[str, dict[str, bytes]] = field(default_factory=dict)


@dataclass(frozen=True)
class Operation:
    name: str
    # Any one of these SAS permission letters allows it.
    permissions: str
    # "c" (container) or "o" (object): an account SAS's srt must include it.
    resource_type: str


@dataclass(frozen=True)
class Grant:
    """What a request's credential allows."""

    anonymous: bool = False
    permissions: str | None = None  # None: everything (account key, bearer token)
    resource_types: str | None = None  # an account SAS's srt
    container: str | None = None  # a service SAS or public access: this container only
    blob: str | None = None  # a service SAS with sr=b: this blob only
    overrides: dict[str, str] = field(default_factory=dict)


@dataclass
class Response:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


class AzureError(Exception):
    def __init__(self, status: int, code: str, message: str, detail: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.detail = status, code, message, detail
        self.headers = headers or {}


@dataclass
class Request:
    method: str
    raw_path: str  # as sent, still percent-encoded: the signed resource uses it
    query: list[tuple[str, str]]  # decoded, in order
    headers: Message
    body: bytes
    container: str
    blob: str

    def param(self, name: str) -> str | None:
        return next((v for k, v in self.query if k == name), None)


def http_date(t: float) -> str:
    return email.utils.formatdate(t, usegmt=True)


def parse_http_date(value: str) -> float | None:
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None


def sign(key: str, string_to_sign: str) -> str:
    digest = hmac.new(base64.b64decode(key), string_to_sign.encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def bare_etag(etag: str) -> str:
    return etag.strip().removeprefix("W/").strip('"')


def etags_match(header: str, etag: str) -> bool:
    return any(t.strip() == "*" or bare_etag(t) == bare_etag(etag) for t in header.split(","))


class AzureServer:
    def __init__(self, account_key: str = ACCOUNT_KEY) -> None:
        self.account_key = account_key
        self.containers: dict[str, Container] = {}
        # Containers anyone may read and list without a credential.
        self.public_containers: set[str] = set()
        # Entra ID access tokens accepted as `Authorization: Bearer <token>`.
        self.bearer_tokens: set[str] = set()
        # The most blobs a listing page holds, whatever `maxresults` asks.
        self.page_limit = 1000
        self.counts: Counter[str] = Counter()  # by HTTP method
        self.operations: Counter[str] = Counter()  # by operation: "GetBlob", "PutBlock", ...
        self.lock = threading.Lock()
        # Azure ETags look like "0x8DC2B5F3E7A1C4D"; a counter keeps each write's distinct.
        self._etags = itertools.count(0x8DC000000000000 + time.time_ns() // 1000 % 0x1000000000)
        self.server = LocalServer(("127.0.0.1", 0), self._handler())
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/{ACCOUNT}"
        self.connection_string = (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={account_key};BlobEndpoint={self.url};"
        )
        self.server.start()

    def stop(self) -> None:
        self.server.stop()

    def reset_counts(self) -> None:
        with self.lock:
            self.counts.clear()
            self.operations.clear()

    # ---- direct access to the store, for tests --------------------------------------

    def create_container(self, name: str) -> None:
        with self.lock:
            self.containers.setdefault(name, Container(self._new_etag(), time.time()))

    def put_blob(self, container: str, name: str, data: bytes, content_type: str = "application/octet-stream",
                 metadata: dict[str, str] | None = None) -> str:
        """Writes (or replaces) a blob, creating its container if need be; returns the new ETag."""
        self.create_container(container)
        with self.lock:
            blob = self._store(container, name, data, content_type, hashlib.md5(data).digest(), metadata or {})
        return blob.etag

    def delete_blob(self, container: str, name: str) -> None:
        with self.lock:
            self.containers[container].blobs.pop(name, None)

    def read_blob(self, container: str, name: str) -> bytes | None:
        with self.lock:
            box = self.containers.get(container)
            blob = box.blobs.get(name) if box else None
        return blob.data if blob else None

    def _new_etag(self) -> str:
        return f'"0x{next(self._etags):X}"'

    def _store(self, container: str, name: str, data: bytes, content_type: str, md5: bytes | None,
               metadata: dict[str, str], blocks: tuple[tuple[str, bytes], ...] = ()) -> Blob:
        box = self.containers[container]
        old = box.blobs.get(name)
        now = time.time()
        blob = Blob(data, self._new_etag(), now, old.created if old else now, content_type, md5, metadata, blocks)
        box.blobs[name] = blob
        # A committed write discards the blob's staged blocks, as Azure does.
        box.uncommitted.pop(name, None)
        return blob

    # ---- requests ----------------------------------------------------------------

    def handle(self, request: Request) -> Response:
        with self.lock:
            self.counts[request.method] += 1
        try:
            if request.container == "":
                raise AzureError(501, "NotImplemented", "account-level operations are not modelled by this test server")
            operation = self._operation(request)
            with self.lock:
                self.operations[operation.name] += 1
            grant = self._authorize(request)
            self._check_grant(grant, operation, request)
            response = getattr(self, "_" + operation.name)(request)
            for param, header in SAS_OVERRIDES.items():
                if param in grant.overrides:
                    response.headers[header] = grant.overrides[param]
            return response
        except AzureError as error:
            return self._error(request, error)

    def _error(self, request: Request, error: AzureError) -> Response:
        headers = {**self._common(request), "x-ms-error-code": error.code, **error.headers}
        if error.status == 304:
            return Response(304, headers)
        request_id = headers["x-ms-request-id"]
        when = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f0Z")
        detail = f"<AuthenticationErrorDetail>{escape(error.detail)}</AuthenticationErrorDetail>" if error.detail else ""
        body = (
            f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{error.code}</Code>'
            f"<Message>{escape(error.message)}\nRequestId:{request_id}\nTime:{when}</Message>{detail}</Error>"
        ).encode()
        headers["Content-Type"] = "application/xml"
        return Response(error.status, headers, body)

    def _operation(self, request: Request) -> Operation:
        restype, comp, method = request.param("restype"), request.param("comp"), request.method
        if request.blob == "":
            if restype == "container" and comp is None and method == "PUT":
                return Operation("CreateContainer", "cw", "c")
            if restype == "container" and comp == "list" and method == "GET":
                return Operation("ListBlobs", "l", "c")
        elif restype is None:
            if comp is None and method == "GET":
                return Operation("GetBlob", "r", "o")
            if comp is None and method == "HEAD":
                return Operation("GetBlobProperties", "r", "o")
            if comp is None and method == "PUT":
                return Operation("PutBlob", "w", "o")
            if comp == "block" and method == "PUT":
                return Operation("PutBlock", "w", "o")
            if comp == "blocklist" and method == "PUT":
                return Operation("PutBlockList", "w", "o")
            if comp is None and method == "DELETE":
                return Operation("DeleteBlob", "d", "o")
        raise AzureError(501, "NotImplemented",
                         f"{method} restype={restype} comp={comp} is not modelled by this test server")

    # ---- authorization ---------------------------------------------------------------

    def _authorize(self, request: Request) -> Grant:
        authorization = request.headers.get("Authorization")
        if authorization is not None:
            scheme, _, credential = authorization.partition(" ")
            if scheme == "SharedKey":
                self._verify_shared_key(request, credential.strip())
                return Grant()
            if scheme == "Bearer":
                if credential.strip() in self.bearer_tokens:
                    return Grant()
                raise AzureError(
                    401, "InvalidAuthenticationInfo", "Server failed to authenticate the request.",
                    detail="Unknown bearer token.",
                    headers={"WWW-Authenticate": "Bearer authorization_uri=https://login.microsoftonline.com/"
                             "00000000-0000-0000-0000-000000000000/oauth2/authorize resource_id=https://storage.azure.com"},
                )
            raise AuthFailed(f"Unsupported authorization scheme {scheme!r}.")
        if request.param("sig") is not None:
            return self._verify_sas(request)
        if request.container in self.public_containers:
            return Grant(anonymous=True, permissions="rl", container=request.container)
        raise AzureError(404, "ResourceNotFound", "The specified resource does not exist.")

    def _check_grant(self, grant: Grant, operation: Operation, request: Request) -> None:
        allowed = grant.permissions is None or any(p in grant.permissions for p in operation.permissions)
        in_scope = (grant.container in (None, request.container) and grant.blob in (None, request.blob)
                    and (grant.resource_types is None or operation.resource_type in grant.resource_types))
        if grant.anonymous and not (allowed and in_scope):
            raise AzureError(404, "ResourceNotFound", "The specified resource does not exist.")
        if operation.name == "CreateContainer" and grant.container is not None:
            raise AzureError(403, "AuthorizationResourceTypeMismatch",
                             "A service SAS cannot create containers; use an account SAS or key.")
        if not in_scope:
            raise AzureError(403, "AuthorizationResourceTypeMismatch",
                             "This request is not authorized to perform this operation using this resource type.")
        if not allowed:
            raise AzureError(403, "AuthorizationPermissionMismatch",
                             "This request is not authorized to perform this operation using this permission.")

    def string_to_sign(self, request: Request) -> str:
        """The SharedKey string-to-sign (version 2015-02-21 and later) for a request."""
        standard = []
        for name in SIGNED_HEADERS:
            value = request.headers.get(name, "")
            standard.append("" if name == "Content-Length" and value == "0" else value)
        x_ms: dict[str, list[str]] = {}
        for name, value in request.headers.items():
            if name.lower().startswith("x-ms-"):
                x_ms.setdefault(name.lower(), []).append(re.sub(r"\s+", " ", value.strip()))
        canonical_headers = "".join(f"{name}:{','.join(values)}\n" for name, values in sorted(x_ms.items()))
        params: dict[str, list[str]] = {}
        for name, value in request.query:
            params.setdefault(name.lower(), []).append(value)
        resource = f"/{ACCOUNT}{request.raw_path}" + "".join(
            f"\n{name}:{','.join(sorted(values))}" for name, values in sorted(params.items())
        )
        return "\n".join([request.method, *standard]) + "\n" + canonical_headers + resource

    def _verify_shared_key(self, request: Request, credential: str) -> None:
        account, _, signature = credential.partition(":")
        version = request.headers.get("x-ms-version")
        if version is None or version < SHARED_KEY_MIN_VERSION:
            raise AzureError(400, "InvalidHeaderValue", f"This test server needs x-ms-version {SHARED_KEY_MIN_VERSION} "
                             f"or later on SharedKey requests (got {version}); older versions sign differently.")
        if account != ACCOUNT:
            raise AuthFailed(f"The account {account!r} in the Authorization header is not {ACCOUNT!r}.")
        date = request.headers.get("x-ms-date") or request.headers.get("Date")
        when = parse_http_date(date) if date else None
        if when is None:
            raise AuthFailed("Request date header not specified or not an RFC 1123 date.")
        if abs(time.time() - when) > CLOCK_SKEW:
            raise AuthFailed(f"Request date header too old or too far ahead: '{date}'.")
        expected = self.string_to_sign(request)
        if not hmac.compare_digest(signature, sign(self.account_key, expected)):
            raise AuthFailed(f"The MAC signature found in the HTTP request '{signature}' is not the same as any "
                             f"computed signature. Server used following string to sign: '{expected}'.")

    def _verify_sas(self, request: Request) -> Grant:
        q = {name: value for name, value in reversed(request.query)}

        def get(name: str) -> str:
            return q.get(name, "")  # absent fields sign as empty

        if get("sv") < SAS_MIN_VERSION:
            raise AuthFailed(f"Signed version {get('sv')!r}: this test server checks SAS versions "
                             f"{SAS_MIN_VERSION} and later.")
        if get("si"):
            raise AuthFailed("Stored access policies (si) are not modelled by this test server.")
        if "ss" in q or "srt" in q:
            if "b" not in get("ss"):
                raise AzureError(403, "AuthorizationServiceMismatch", "This account SAS does not cover the blob service.")
            fields = [ACCOUNT, get("sp"), get("ss"), get("srt"), get("st"), get("se"), get("sip"), get("spr"),
                      get("sv"), get("ses")]
            expected = "\n".join(fields) + "\n"
            grant = Grant(permissions=get("sp"), resource_types=get("srt"))
        else:
            if get("sr") == "c":
                resource = f"/blob/{ACCOUNT}/{request.container}"
            elif get("sr") == "b" and request.blob:
                resource = f"/blob/{ACCOUNT}/{request.container}/{request.blob}"
            else:
                raise AuthFailed(f"Signed resource sr={get('sr')!r} does not fit this request (sr=c or sr=b are modelled).")
            fields = [get("sp"), get("st"), get("se"), resource, get("si"), get("sip"), get("spr"), get("sv"),
                      get("sr"), get("snapshot"), get("ses"), *(get(p) for p in SAS_OVERRIDES)]
            expected = "\n".join(fields)
            grant = Grant(permissions=get("sp"), container=request.container,
                          blob=request.blob if get("sr") == "b" else None,
                          overrides={p: q[p] for p in SAS_OVERRIDES if p in q})
        if not hmac.compare_digest(get("sig"), sign(self.account_key, expected)):
            raise AuthFailed(f"Signature did not match. String to sign used was {expected!r}.")
        now = datetime.now(timezone.utc)
        expiry = sas_time(get("se"))
        if expiry is None or now > expiry:
            raise AuthFailed(f"Signed expiry time [{get('se')}] is not a time after now.")
        start = sas_time(get("st")) if get("st") else now
        if start is None or now < start:
            raise AuthFailed(f"Signed start time [{get('st')}] is not a time before now.")
        if get("spr") == "https":
            raise AzureError(403, "AuthorizationProtocolMismatch", "This SAS allows https only; the request used http.")
        # The server listens on 127.0.0.1 only: that is every client's address.
        if get("sip") and not ip_in(get("sip"), "127.0.0.1"):
            raise AzureError(403, "AuthorizationSourceIPMismatch", f"The request's address is not in sip={get('sip')}.")
        return grant

    # ---- operations ----------------------------------------------------------------

    def _container(self, request: Request) -> Container:
        box = self.containers.get(request.container)
        if box is None:
            raise AzureError(404, "ContainerNotFound", "The specified container does not exist.")
        return box

    def _blob(self, request: Request) -> Blob:
        blob = self._container(request).blobs.get(request.blob)
        if blob is None:
            raise AzureError(404, "BlobNotFound", "The specified blob does not exist.")
        return blob

    @staticmethod
    def _common(request: Request) -> dict[str, str]:
        headers = {"x-ms-request-id": str(uuid.uuid4()), "x-ms-version": request.headers.get("x-ms-version", "2009-09-19")}
        if "x-ms-client-request-id" in request.headers:
            headers["x-ms-client-request-id"] = request.headers["x-ms-client-request-id"]
        return headers

    def _CreateContainer(self, request: Request) -> Response:
        if not CONTAINER_NAME.fullmatch(request.container):
            raise AzureError(400, "InvalidResourceName", "The specified resource name contains invalid characters.")
        access = request.headers.get("x-ms-blob-public-access")
        if access not in (None, "container"):
            raise AzureError(501, "NotImplemented",
                             f"x-ms-blob-public-access: {access} is not modelled (only 'container').")
        with self.lock:
            if request.container in self.containers:
                raise AzureError(409, "ContainerAlreadyExists", "The specified container already exists.")
            box = self.containers[request.container] = Container(self._new_etag(), time.time())
            if access == "container":
                self.public_containers.add(request.container)
        return Response(201, {**self._common(request), "ETag": box.etag, "Last-Modified": http_date(box.created)})

    def _ListBlobs(self, request: Request) -> Response:
        prefix = request.param("prefix") or ""
        delimiter = request.param("delimiter") or ""
        marker = request.param("marker") or ""
        try:
            max_results = int(request.param("maxresults") or 5000)
            start = base64.urlsafe_b64decode(marker.encode()).decode() if marker else ""
        except (ValueError, binascii.Error):
            raise AzureError(400, "OutOfRangeQueryParameterValue", "maxresults or marker is not valid.") from None
        if not 1 <= max_results <= 5000:
            raise AzureError(400, "OutOfRangeQueryParameterValue", "maxresults must be between 1 and 5000.")
        # Azure may return fewer than asked, and a NextMarker: tests cap pages to see clients follow it.
        max_results = min(max_results, self.page_limit)
        with self.lock:
            blobs = dict(self._container(request).blobs)
        # Blobs and, with a delimiter, the prefixes that group them, in name order.
        entries: list[tuple[str, Blob | None]] = []
        for name in sorted(n for n in blobs if n.startswith(prefix)):
            cut = name.find(delimiter, len(prefix)) if delimiter else -1
            entry = (name[: cut + len(delimiter)], None) if cut >= 0 else (name, blobs[name])
            if entry[0] >= start and (not entries or entries[-1][0] != entry[0]):
                entries.append(entry)
        page, rest = entries[:max_results], entries[max_results:]
        items = []
        for name, blob in page:
            if blob is None:
                items.append(f"<BlobPrefix><Name>{escape(name)}</Name></BlobPrefix>")
                continue
            md5 = f"<Content-MD5>{base64.b64encode(blob.content_md5).decode()}</Content-MD5>" if blob.content_md5 else ""
            items.append(
                f"<Blob><Name>{escape(name)}</Name><Properties>"
                f"<Creation-Time>{http_date(blob.created)}</Creation-Time>"
                f"<Last-Modified>{http_date(blob.last_modified)}</Last-Modified>"
                f"<Etag>{bare_etag(blob.etag)}</Etag><Content-Length>{len(blob.data)}</Content-Length>"
                f"<Content-Type>{escape(blob.content_type)}</Content-Type>{md5}<BlobType>BlockBlob</BlobType>"
                "<AccessTier>Hot</AccessTier><AccessTierInferred>true</AccessTierInferred>"
                "<LeaseStatus>unlocked</LeaseStatus><LeaseState>available</LeaseState>"
                "<ServerEncrypted>true</ServerEncrypted></Properties></Blob>"
            )
        next_marker = base64.urlsafe_b64encode(rest[0][0].encode()).decode() if rest else ""
        echoed = "".join(
            f"<{tag}>{escape(value)}</{tag}>"
            for tag, value in (("Prefix", prefix), ("Marker", marker), ("MaxResults", request.param("maxresults") or ""),
                               ("Delimiter", delimiter))
            if value
        )
        body = (
            f'<?xml version="1.0" encoding="utf-8"?><EnumerationResults ServiceEndpoint="{self.url}/" '
            f'ContainerName="{escape(request.container)}">{echoed}<Blobs>{"".join(items)}</Blobs>'
            f"<NextMarker>{next_marker}</NextMarker></EnumerationResults>"
        ).encode()
        return Response(200, {**self._common(request), "Content-Type": "application/xml"}, body)

    def _check_conditions(self, request: Request, blob: Blob | None, read: bool) -> None:
        headers = request.headers
        if_match, if_none_match = headers.get("If-Match"), headers.get("If-None-Match")
        modified_since, unmodified_since = headers.get("If-Modified-Since"), headers.get("If-Unmodified-Since")
        not_met = AzureError(412, "ConditionNotMet", "The condition specified using HTTP conditional header(s) is not met.")
        # Reads answer 304 where a write gets 412 (or 409 for If-None-Match: * on an existing blob).
        not_modified = AzureError(304, "ConditionNotMet", "Not modified.") if read else not_met
        if if_match is not None and (blob is None or not etags_match(if_match, blob.etag)):
            raise not_met
        if blob is None:
            return
        if if_none_match is not None and etags_match(if_none_match, blob.etag):
            if not read and if_none_match.strip() == "*":
                raise AzureError(409, "BlobAlreadyExists", "The specified blob already exists.")
            raise not_modified
        since = parse_http_date(modified_since) if modified_since else None
        if since is not None and int(blob.last_modified) <= since:
            raise not_modified
        until = parse_http_date(unmodified_since) if unmodified_since else None
        if until is not None and int(blob.last_modified) > until:
            raise not_met

    def _blob_headers(self, request: Request, blob: Blob) -> dict[str, str]:
        return {
            **self._common(request), "ETag": blob.etag, "Last-Modified": http_date(blob.last_modified),
            "Content-Type": blob.content_type, "Accept-Ranges": "bytes", "x-ms-blob-type": "BlockBlob",
            "x-ms-creation-time": http_date(blob.created), "x-ms-lease-state": "available",
            "x-ms-lease-status": "unlocked", "x-ms-server-encrypted": "true",
            **{f"x-ms-meta-{k}": v for k, v in blob.metadata.items()},
        }

    def _GetBlobProperties(self, request: Request) -> Response:
        with self.lock:
            blob = self._blob(request)
        self._check_conditions(request, blob, read=True)
        headers = self._blob_headers(request, blob)
        if blob.content_md5:
            headers["Content-MD5"] = base64.b64encode(blob.content_md5).decode()
        # HEAD: the length is the blob's; no body goes out.
        return Response(200, headers, blob.data)

    def _GetBlob(self, request: Request) -> Response:
        with self.lock:
            blob = self._blob(request)
        self._check_conditions(request, blob, read=True)
        headers = self._blob_headers(request, blob)
        size = len(blob.data)
        ranged = request.headers.get("x-ms-range") or request.headers.get("Range")
        want_md5 = request.headers.get("x-ms-range-get-content-md5", "").lower() == "true"
        if ranged is None:
            if want_md5:
                raise AzureError(400, "InvalidHeaderValue", "x-ms-range-get-content-md5 needs a range.")
            if blob.content_md5:
                headers["Content-MD5"] = base64.b64encode(blob.content_md5).decode()
            return Response(200, headers, blob.data)
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", ranged.strip())
        if match is None or (match[2] and int(match[2]) < int(match[1])):
            raise AzureError(400, "InvalidHeaderValue",
                             f"Unsupported range {ranged!r} (this server takes bytes=a-b, bytes=a-).")
        start = int(match[1])
        if start >= size:
            raise AzureError(416, "InvalidRange", "The range specified is invalid for the current size of the resource.",
                             headers={"Content-Range": f"bytes */{size}"})
        end = min(int(match[2]), size - 1) if match[2] else size - 1
        body = blob.data[start : end + 1]
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        if blob.content_md5:
            headers["x-ms-blob-content-md5"] = base64.b64encode(blob.content_md5).decode()
        if want_md5:
            if len(body) > RANGE_MD5_LIMIT:
                raise AzureError(400, "OutOfRangeInput", "x-ms-range-get-content-md5 needs a range of 4 MiB or less.")
            headers["Content-MD5"] = base64.b64encode(hashlib.md5(body).digest()).decode()
        return Response(206, headers, body)

    @staticmethod
    def _check_md5(request: Request) -> bytes:
        md5 = hashlib.md5(request.body).digest()
        sent = request.headers.get("Content-MD5")
        if sent is not None and sent.strip() != base64.b64encode(md5).decode():
            raise AzureError(400, "Md5Mismatch", "The MD5 value specified in the request did not match the stored one.")
        return md5

    @staticmethod
    def _metadata(request: Request) -> dict[str, str]:
        return {k.lower()[len("x-ms-meta-"):]: v for k, v in request.headers.items() if k.lower().startswith("x-ms-meta-")}

    def _PutBlob(self, request: Request) -> Response:
        blob_type = request.headers.get("x-ms-blob-type")
        if blob_type is None:
            raise AzureError(400, "MissingRequiredHeader", "x-ms-blob-type is required.")
        if blob_type != "BlockBlob":
            raise AzureError(501, "NotImplemented", f"x-ms-blob-type: {blob_type} (this server models BlockBlob only).")
        md5 = self._check_md5(request)
        content_type = (request.headers.get("x-ms-blob-content-type") or request.headers.get("Content-Type")
                        or "application/octet-stream")
        with self.lock:
            box = self._container(request)
            self._check_conditions(request, box.blobs.get(request.blob), read=False)
            blob = self._store(request.container, request.blob, request.body, content_type, md5, self._metadata(request))
        return Response(201, {**self._common(request), "ETag": blob.etag, "Last-Modified": http_date(blob.last_modified),
                              "Content-MD5": base64.b64encode(md5).decode(), "x-ms-request-server-encrypted": "true"})

    def _PutBlock(self, request: Request) -> Response:
        block_id = request.param("blockid") or ""
        try:
            raw_id = base64.b64decode(block_id, validate=True)
        except binascii.Error:
            raw_id = b""
        if not raw_id or len(raw_id) > 64:
            raise AzureError(400, "InvalidQueryParameterValue", f"blockid {block_id!r} is not base64 of 1 to 64 bytes.")
        md5 = self._check_md5(request)
        with self.lock:
            box = self._container(request)
            staged = box.uncommitted.setdefault(request.blob, {})
            committed = box.blobs[request.blob].blocks if request.blob in box.blobs else ()
            # Azure refuses a blob's block ids of differing lengths.
            if any(len(other) != len(block_id) for other in itertools.chain(staged, (i for i, _ in committed))):
                raise AzureError(400, "InvalidBlobOrBlock", "The specified blob or block content is invalid.")
            staged[block_id] = request.body
        return Response(201, {**self._common(request), "Content-MD5": base64.b64encode(md5).decode(),
                              "x-ms-request-server-encrypted": "true"})

    def _PutBlockList(self, request: Request) -> Response:
        try:
            root = ET.fromstring(request.body)
        except ET.ParseError:
            raise AzureError(400, "InvalidXmlDocument", "The block list is not well-formed XML.") from None
        if root.tag != "BlockList" or any(e.tag not in ("Latest", "Committed", "Uncommitted") for e in root):
            raise AzureError(400, "InvalidXmlDocument",
                             "The block list must be a <BlockList> of Latest, Committed and Uncommitted.")
        md5 = request.headers.get("x-ms-blob-content-md5")
        content_type = request.headers.get("x-ms-blob-content-type") or "application/octet-stream"
        with self.lock:
            box = self._container(request)
            old = box.blobs.get(request.blob)
            self._check_conditions(request, old, read=False)
            staged = box.uncommitted.get(request.blob, {})
            committed = dict(old.blocks) if old else {}
            blocks = []
            for element in root:
                block_id = (element.text or "").strip()
                sources = {"Latest": (staged, committed), "Committed": (committed,), "Uncommitted": (staged,)}[element.tag]
                found = next((s[block_id] for s in sources if block_id in s), None)
                if found is None:
                    raise AzureError(400, "InvalidBlockList",
                                     f"The specified block list is invalid: no {element.tag} block {block_id!r}.")
                blocks.append((block_id, found))
            blob = self._store(request.container, request.blob, b"".join(d for _, d in blocks), content_type,
                               base64.b64decode(md5) if md5 else None, self._metadata(request), tuple(blocks))
        return Response(201, {**self._common(request), "ETag": blob.etag, "Last-Modified": http_date(blob.last_modified),
                              "x-ms-request-server-encrypted": "true"})

    def _DeleteBlob(self, request: Request) -> Response:
        with self.lock:
            box = self._container(request)
            self._check_conditions(request, self._blob(request), read=False)
            del box.blobs[request.blob]
            box.uncommitted.pop(request.blob, None)
        return Response(202, {**self._common(request), "x-ms-delete-type-permanent": "true"})

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        azure = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = "Windows-Azure-Blob/1.0"
            sys_version = "Microsoft-HTTPAPI/2.0"
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: object) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                self.serve()

            def do_HEAD(self) -> None:
                self.serve()

            def do_PUT(self) -> None:
                self.serve()

            def do_DELETE(self) -> None:
                self.serve()

            def serve(self) -> None:
                length = self.headers.get("Content-Length")
                if length is None and self.command == "PUT":
                    # Azure takes no chunked bodies; unread, the body would poison the connection.
                    self.close_connection = True
                    self.reply(Response(411, {"x-ms-error-code": "MissingContentLengthHeader"}))
                    return
                body = self.rfile.read(int(length)) if length else b""
                split = urlsplit(self.path)
                query = [(unquote(k), unquote(v)) for k, _, v in (p.partition("=") for p in split.query.split("&") if p)]
                parts = split.path.split("/", 3)[1:]  # account, container, blob
                if not parts or parts[0] != ACCOUNT:
                    message = f"path must start with /{ACCOUNT}".encode()
                    self.reply(Response(400, {"x-ms-error-code": "InvalidUri"}, message))
                    return
                container = unquote(parts[1]) if len(parts) > 1 else ""
                blob = unquote(parts[2]) if len(parts) > 2 else ""
                self.reply(azure.handle(Request(self.command, split.path, query, self.headers, body, container, blob)))

            def reply(self, response: Response) -> None:
                self.send_response(response.status)
                for key, value in response.headers.items():
                    self.send_header(key, value)
                if response.status != 304:
                    self.send_header("Content-Length", str(len(response.body)))
                self.end_headers()
                if self.command != "HEAD" and response.status != 304:
                    self.wfile.write(response.body)

        return Handler


class AuthFailed(AzureError):
    def __init__(self, detail: str) -> None:
        super().__init__(403, "AuthenticationFailed", "Server failed to authenticate the request. Make sure the value of "
                         "Authorization header is formed correctly including the signature.", detail=detail)


def sas_time(value: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def ip_in(allowed: str, address: str) -> bool:
    """Whether an address is in a SAS's sip: one address or a range "low-high"."""
    low, _, high = allowed.partition("-")
    try:
        ip, first, last = (ipaddress.ip_address(a) for a in (address, low, high or low))
    except ValueError:
        return False
    return ip.version == first.version == last.version and first <= ip <= last  # type: ignore[operator]
