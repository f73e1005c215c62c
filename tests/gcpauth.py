"""Local stand-ins for the Google endpoints a GCS client's credential chain talks to, so
that tests can check which credential a client found and what it sent, without Google:

- the GCE metadata server: `GET /` (the ping clients use to detect GCE),
  `/computeMetadata/v1/instance/service-accounts/default/token` (an access token),
  `.../default/email` and `/computeMetadata/v1/project/project-id`; each needs the
  header `Metadata-Flavor: Google` (403 without it) and answers with it, as GCE's does.
  Point clients here with `GCE_METADATA_HOST=<metadata_host>`.
- an OAuth token endpoint, `POST /token`: `grant_type=refresh_token` for authorized-user
  credentials (client id, secret and refresh token checked against this server's), and
  `grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer` for service accounts (the
  assertion's RS256 signature checked with the key of an account made by
  `add_service_account`, and its iss, aud, iat, exp and scope as Google checks them).
- a GCS JSON API front: object listing, metadata and media downloads (`alt=media`, also
  under `/download/storage/v1/...`, with Range), of the bytes tests put in `objects`. It
  records each request's Authorization header (None when absent) in `authorizations`,
  and answers 401 when `required_authorization` is set and the header differs.

A client may also skip the token endpoint and sign its own JWT with a service account's
key; `verify_self_signed_jwt` checks such a bearer token. Requests are counted by path.
One ThreadingHTTPServer on 127.0.0.1, started and stopped by the tests, TCP_NODELAY and
a large accept queue as in faultproxy.py.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from collections import Counter
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from faultproxy import LocalServer

JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
# Google refuses assertions that live longer than an hour, or whose clock is far off.
MAX_JWT_LIFETIME = 3600
CLOCK_SKEW = 300
METADATA = "/computeMetadata/v1"
PROJECT = "shardflow-test"
SERVICE_ACCOUNT = f"loader@{PROJECT}.iam.gserviceaccount.com"


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def decode_rs256(token: str, public_key: rsa.RSAPublicKey) -> dict[str, Any]:
    """The claims of an RS256 JWT signed by `public_key`; ValueError if it is not one."""
    try:
        header_b64, claims_b64, signature_b64 = token.split(".")
        header = json.loads(b64url_decode(header_b64))
        claims = json.loads(b64url_decode(claims_b64))
        signature = b64url_decode(signature_b64)
    except (ValueError, TypeError) as error:
        raise ValueError(f"not a JWT: {error}") from None
    if header.get("alg") != "RS256":
        raise ValueError(f"JWT algorithm {header.get('alg')!r}, not RS256")
    try:
        public_key.verify(signature, f"{header_b64}.{claims_b64}".encode(), padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature:
        raise ValueError("JWT signature does not verify") from None
    if not isinstance(claims, dict):
        raise ValueError("JWT claims are not an object")
    return claims


def verify_self_signed_jwt(authorization_header: str | None, public_key: rsa.RSAPublicKey) -> dict[str, Any]:
    """Checks that an Authorization header is `Bearer <jwt>` with an unexpired RS256 JWT signed
    by `public_key` (a service account's own, as clients sign without calling token_uri);
    returns its claims, or raises ValueError."""
    scheme, _, token = (authorization_header or "").partition(" ")
    if scheme != "Bearer" or not token:
        raise ValueError(f"not a bearer token: {authorization_header!r}")
    claims = decode_rs256(token.strip(), public_key)
    now = time.time()
    if not isinstance(claims.get("exp"), (int, float)) or claims["exp"] < now - CLOCK_SKEW:
        raise ValueError(f"JWT expired or without exp: {claims.get('exp')!r}")
    if isinstance(claims.get("iat"), (int, float)) and claims["iat"] > now + CLOCK_SKEW:
        raise ValueError(f"JWT issued in the future: {claims['iat']}")
    return claims


def make_service_account(path: Path, token_uri: str, client_email: str = SERVICE_ACCOUNT,
                         project_id: str = PROJECT) -> rsa.RSAPublicKey:
    """Writes a service-account key file, as the Cloud console makes them, with a fresh RSA
    2048 key; returns the public key, which verifies what the key file's holder signs."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    info = {
        "type": "service_account",
        "project_id": project_id,
        "private_key_id": hashlib.sha1(pem).hexdigest(),
        "private_key": pem.decode(),
        "client_email": client_email,
        "client_id": str(int(hashlib.sha1(client_email.encode()).hexdigest()[:20], 16)),
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": token_uri,
        "universe_domain": "googleapis.com",
    }
    path.write_text(json.dumps(info, indent=2))
    return key.public_key()


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class GcpAuthServer:
    def __init__(self) -> None:
        self.metadata_token = "metadata-token"
        self.metadata_email = f"default@{PROJECT}.iam.gserviceaccount.com"
        self.project_id = PROJECT
        # The authorized user (gcloud auth application-default login) this server knows.
        self.client_id = "client-id.apps.googleusercontent.com"
        self.client_secret = "client-secret"
        self.refresh_token = "refresh-token"
        self.user_token = "user-token"
        # client_email -> public key, for jwt-bearer assertions.
        self.service_accounts: dict[str, rsa.RSAPublicKey] = {}
        self.service_account_token = "service-account-token"
        self.expires_in = 3600
        self.objects: dict[tuple[str, str], bytes] = {}
        self.started = time.time()  # objects' creation time
        self.authorizations: list[str | None] = []
        self.required_authorization: str | None = None
        self.counts: Counter[str] = Counter()  # by path, without the query
        self.token_requests: list[dict[str, str]] = []  # the form of each POST /token
        self.lock = threading.Lock()
        self.server = LocalServer(("127.0.0.1", 0), self._handler())
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.metadata_host = f"127.0.0.1:{self.port}"
        self.token_uri = f"{self.url}/token"
        self.server.start()

    def stop(self) -> None:
        self.server.stop()

    def reset_counts(self) -> None:
        with self.lock:
            self.counts.clear()
            self.authorizations.clear()
            self.token_requests.clear()

    def add_service_account(self, path: Path, client_email: str = SERVICE_ACCOUNT) -> rsa.RSAPublicKey:
        """Writes a key file whose token_uri is this server, which will then grant it tokens."""
        public_key = make_service_account(path, self.token_uri, client_email, self.project_id)
        self.service_accounts[client_email] = public_key
        return public_key

    def write_authorized_user(self, path: Path) -> None:
        """Writes application_default_credentials.json for this server's authorized user."""
        path.write_text(json.dumps({
            "type": "authorized_user", "client_id": self.client_id, "client_secret": self.client_secret,
            "refresh_token": self.refresh_token, "token_uri": self.token_uri, "universe_domain": "googleapis.com",
        }))

    # ---- the token endpoint ---------------------------------------------------------

    def grant(self, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """Answers a POST /token: (status, JSON body)."""
        with self.lock:
            self.token_requests.append(form)
        grant_type = form.get("grant_type")
        if grant_type == "refresh_token":
            if (form.get("client_id"), form.get("client_secret")) != (self.client_id, self.client_secret):
                return 401, {"error": "invalid_client", "error_description": "The OAuth client was not found."}
            if form.get("refresh_token") != self.refresh_token:
                return 400, {"error": "invalid_grant", "error_description": "Bad Request"}
            return 200, self._token(self.user_token, form.get("scope"))
        if grant_type == JWT_BEARER:
            return self._grant_assertion(form.get("assertion", ""))
        return 400, {"error": "unsupported_grant_type", "error_description": f"Invalid grant_type: {grant_type}"}

    def _grant_assertion(self, assertion: str) -> tuple[int, dict[str, Any]]:
        def invalid(description: str) -> tuple[int, dict[str, Any]]:
            return 400, {"error": "invalid_grant", "error_description": description}

        try:
            unverified = json.loads(b64url_decode(assertion.split(".")[1]))
        except (ValueError, IndexError):
            return invalid("Invalid JWT: not a JWT.")
        public_key = self.service_accounts.get(str(unverified.get("iss"))) if isinstance(unverified, dict) else None
        if public_key is None:
            return invalid("Invalid grant: account not found")
        try:
            claims = decode_rs256(assertion, public_key)
        except ValueError:
            return invalid("Invalid JWT Signature.")
        if claims.get("aud") != self.token_uri:
            return invalid(f"Invalid JWT: aud must be {self.token_uri}, got {claims.get('aud')!r}.")
        iat, exp, now = claims.get("iat"), claims.get("exp"), time.time()
        if (not isinstance(iat, (int, float)) or not isinstance(exp, (int, float)) or exp - iat > MAX_JWT_LIFETIME
                or iat > now + CLOCK_SKEW or exp < now - CLOCK_SKEW):
            return invalid("Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable "
                           "timeframe. Check your iat and exp values in the JWT claim.")
        if not claims.get("scope") and not claims.get("target_audience"):
            return 400, {"error": "invalid_scope",
                         "error_description": "Invalid OAuth scope or ID token audience provided."}
        return 200, self._token(self.service_account_token, claims.get("scope"))

    def _token(self, token: str, scope: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"access_token": token, "expires_in": self.expires_in, "token_type": "Bearer"}
        if scope:
            body["scope"] = scope
        return body

    # ---- the GCS front ----------------------------------------------------------------

    def object_resource(self, bucket: str, name: str, data: bytes) -> dict[str, Any]:
        md5 = hashlib.md5(data).digest()
        # Tests replace bytes in `objects` directly, so a generation derives from the content:
        # new bytes, new generation, as a write would give.
        generation = str(int.from_bytes(md5[:6], "big") + 1_700_000_000_000_000)
        return {
            "kind": "storage#object", "id": f"{bucket}/{name}/{generation}", "name": name, "bucket": bucket,
            "generation": generation, "metageneration": "1", "contentType": "application/octet-stream",
            "size": str(len(data)), "md5Hash": base64.b64encode(md5).decode(),
            "etag": base64.b64encode(md5[:8]).decode().rstrip("="),
            "timeCreated": rfc3339(self.started), "updated": rfc3339(self.started), "storageClass": "STANDARD",
            "selfLink": f"{self.url}/storage/v1/b/{bucket}/o/{quote(name, safe='')}",
            "mediaLink": f"{self.url}/download/storage/v1/b/{bucket}/o/{quote(name, safe='')}"
                         f"?generation={generation}&alt=media",
        }

    def list_objects(self, bucket: str, query: dict[str, str]) -> dict[str, Any]:
        prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
        start, limit = query.get("pageToken", ""), int(query.get("maxResults", "1000"))
        with self.lock:
            names = sorted(name for b, name in self.objects if b == bucket and name.startswith(prefix))
            datas = {name: self.objects[(bucket, name)] for name in names}
        # Objects and, with a delimiter, the prefixes grouping them (True): one page in name order.
        entries: list[tuple[str, bool]] = []
        for name in names:
            cut = name.find(delimiter, len(prefix)) if delimiter else -1
            entry = (name[: cut + len(delimiter)], True) if cut >= 0 else (name, False)
            if entry[0] >= start and (not entries or entries[-1] != entry):
                entries.append(entry)
        page, rest = entries[:limit], entries[limit:]
        body: dict[str, Any] = {"kind": "storage#objects"}
        items = [self.object_resource(bucket, n, datas[n]) for n, is_prefix in page if not is_prefix]
        prefixes = [n for n, is_prefix in page if is_prefix]
        if items:
            body["items"] = items
        if prefixes:
            body["prefixes"] = prefixes
        if rest:
            body["nextPageToken"] = rest[0][0]
        return body

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        gcp = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: object) -> None:  # quiet
                pass

            def reply(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def json(self, status: int, value: Any, headers: dict[str, str] | None = None) -> None:
                headers = {"Content-Type": "application/json; charset=UTF-8", **(headers or {})}
                self.reply(status, json.dumps(value).encode(), headers)

            def gcs_error(self, status: int, reason: str, message: str, headers: dict[str, str] | None = None) -> None:
                details = [{"message": message, "domain": "global", "reason": reason}]
                error = {"code": status, "message": message, "errors": details}
                self.json(status, {"error": error}, headers)

            def do_GET(self) -> None:
                self.route()

            def do_HEAD(self) -> None:
                self.route()

            def do_POST(self) -> None:
                self.route()

            def route(self) -> None:
                split = urlsplit(self.path)
                with gcp.lock:
                    gcp.counts[split.path] += 1
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
                if split.path == "/" or split.path.startswith(METADATA + "/"):
                    self.metadata(split.path)
                elif split.path == "/token" and self.command == "POST":
                    self.token(body)
                elif split.path.startswith(("/storage/v1/b/", "/download/storage/v1/b/")) and self.command == "GET":
                    self.gcs(split.path, query)
                else:
                    self.reply(404, f"no route {self.command} {split.path}".encode(), {"Content-Type": "text/plain"})

            def metadata(self, path: str) -> None:
                flavor = {"Metadata-Flavor": "Google"}
                if self.headers.get("Metadata-Flavor") != "Google":
                    self.reply(403, b"Missing required header: Metadata-Flavor", {**flavor, "Content-Type": "text/html"})
                    return
                text = {
                    "/": "computeMetadata/\n",
                    f"{METADATA}/instance/service-accounts/default/email": gcp.metadata_email,
                    f"{METADATA}/project/project-id": gcp.project_id,
                }
                if path == f"{METADATA}/instance/service-accounts/default/token":
                    token = {"access_token": gcp.metadata_token, "expires_in": gcp.expires_in, "token_type": "Bearer"}
                    self.json(200, token, flavor)
                elif path in text:
                    self.reply(200, text[path].encode(), {**flavor, "Content-Type": "application/text"})
                else:
                    self.reply(404, b"Not Found", {**flavor, "Content-Type": "text/html"})

            def token(self, body: bytes) -> None:
                if not self.headers.get("Content-Type", "").startswith("application/x-www-form-urlencoded"):
                    self.json(400, {"error": "invalid_request", "error_description": "Expected a form body."})
                    return
                form = {k: v[-1] for k, v in parse_qs(body.decode(), keep_blank_values=True).items()}
                self.json(*gcp.grant(form))

            def gcs(self, path: str, query: dict[str, str]) -> None:
                authorization = self.headers.get("Authorization")
                with gcp.lock:
                    gcp.authorizations.append(authorization)
                if gcp.required_authorization is not None and authorization != gcp.required_authorization:
                    challenge = {"WWW-Authenticate": 'Bearer realm="https://accounts.google.com/"'}
                    self.gcs_error(401, "authError", "Invalid Credentials", challenge)
                    return
                media = path.startswith("/download/") or query.get("alt") == "media"
                parts = path.removeprefix("/download").split("/", 6)  # "", storage, v1, b, bucket, o, object
                if len(parts) < 6 or parts[5] != "o":
                    self.gcs_error(404, "notFound", f"no route GET {path}")
                    return
                bucket = unquote(parts[4])
                if len(parts) == 6:
                    self.json(200, gcp.list_objects(bucket, query))
                    return
                name = unquote(parts[6])
                with gcp.lock:
                    data = gcp.objects.get((bucket, name))
                if data is None:
                    self.gcs_error(404, "notFound", f"No such object: {bucket}/{name}")
                    return
                resource = gcp.object_resource(bucket, name, data)
                # Only the live generation is kept: asking for another is asking for a deleted one.
                if query.get("generation", resource["generation"]) != resource["generation"]:
                    self.gcs_error(404, "notFound", f"No such object: {bucket}/{name}#{query['generation']}")
                    return
                if query.get("ifGenerationMatch", resource["generation"]) != resource["generation"]:
                    self.gcs_error(412, "conditionNotMet", "At least one of the pre-conditions you specified did not hold.")
                    return
                if not media:
                    self.json(200, resource, {"ETag": resource["etag"]})
                    return
                self.media(data, resource)

            def media(self, data: bytes, resource: dict[str, Any]) -> None:
                headers = {
                    "Content-Type": resource["contentType"], "ETag": resource["etag"], "Accept-Ranges": "bytes",
                    "x-goog-generation": resource["generation"], "x-goog-metageneration": "1",
                    "x-goog-stored-content-length": resource["size"], "x-goog-hash": f"md5={resource['md5Hash']}",
                }
                ranged = self.headers.get("Range", "")
                if not ranged.startswith("bytes="):
                    self.reply(200, data, headers)
                    return
                first, _, last = ranged[len("bytes="):].partition("-")
                start = int(first) if first else max(0, len(data) - int(last))
                end = min(int(last), len(data) - 1) if first and last else len(data) - 1
                if start >= len(data):
                    self.reply(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                    return
                self.reply(206, data[start : end + 1], {**headers, "Content-Range": f"bytes {start}-{end}/{len(data)}"})

        return Handler
