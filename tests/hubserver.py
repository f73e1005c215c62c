"""A local Hugging Face Hub for the tests: a folder of dataset repos served through the
endpoints the Hub's own clients use (`huggingface_hub`'s `HfFileSystem` and
`snapshot_download`, `datasets` streaming), so that what shardflow reads from it can be
compared with what they read.

- `GET /api/datasets/{repo}[/revision/{rev}]`: repo info with its commit sha.
- `GET /api/datasets/{repo}/tree/{rev}[/{path}]`: the files, paginated with `Link`.
- `POST /api/datasets/{repo}/paths-info/{rev}`: entries of the paths asked for.
- The same for model repos: `/api/models/{repo}/...`, `/{repo}/resolve/{rev}/{path}`.
- `HEAD`/`GET /datasets/{repo}/resolve/{rev}/{path}`: small files served here, data
  files redirected (302) to a second host, which needs no token, as the Hub's storage.
  Ranges give 206; `ETag`, `X-Repo-Commit`, `X-Linked-Etag` and `X-Linked-Size` as the
  Hub sends them; a 404's `X-Error-Code` says which of repo, revision or file is missing.

A token, when set, is required on the Hub host (401 without it). The server counts
requests by kind and bytes sent by file, and can answer the next requests with a 429.
Listens on 127.0.0.1 only; started and stopped by the tests.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

# Files served straight from the Hub host (as git blobs); the rest go through storage (LFS).
_SMALL = {"README.md", ".gitattributes"}


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


class Repo:
    """One revision of a repo: a folder."""

    def __init__(self, repo_id: str, revision: str, folder: Path) -> None:
        self.repo_id, self.revision, self.folder = repo_id, revision, folder
        self.sha = _sha1(f"{repo_id}@{revision}:" + ",".join(self.files()))

    def files(self) -> list[str]:
        return sorted(p.relative_to(self.folder).as_posix() for p in self.folder.rglob("*") if p.is_file())

    def entry(self, path: str) -> dict[str, Any] | None:
        target = self.folder / path
        if target.is_dir():
            return {"type": "directory", "oid": _sha1(path), "size": 0, "path": path}
        if not target.is_file():
            return None
        data = target.read_bytes()
        entry: dict[str, Any] = {
            "type": "file", "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
            "size": len(data), "path": path,
        }
        if Path(path).name not in _SMALL:
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry


class HubServer:
    def __init__(self, repos: dict[str, dict[str, Path]], token: str | None = None, page_size: int = 50) -> None:
        """`repos`: repo id -> {revision name: folder}; "main" is the default branch."""
        self.repos = {rid: {rev: Repo(rid, rev, folder) for rev, folder in revs.items()} for rid, revs in repos.items()}
        self.token = token
        self.page_size = page_size
        self.counts: Counter[str] = Counter()
        self.bytes_sent: Counter[str] = Counter()
        self.auth_on_storage = 0
        self.throttle = 0  # answer this many more file reads with 429
        self.throttled = 0
        self.lock = threading.Lock()
        self.hub = ThreadingHTTPServer(("127.0.0.1", 0), self._handler(storage=False))
        self.storage = ThreadingHTTPServer(("127.0.0.1", 0), self._handler(storage=True))
        self.hub.daemon_threads = self.storage.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.hub.server_address[1]}"
        self.storage_url = f"http://127.0.0.1:{self.storage.server_address[1]}"
        self.threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (self.hub, self.storage)]
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        for s in (self.hub, self.storage):
            s.shutdown()
            s.server_close()

    def reset_counts(self) -> None:
        with self.lock:
            self.counts.clear()
            self.bytes_sent.clear()

    def count(self, kind: str, n: int = 1) -> None:
        with self.lock:
            self.counts[kind] += n

    def find(self, repo_id: str, revision: str) -> Repo | None:
        revs = self.repos.get(repo_id, {})
        return revs.get(revision) or next((r for r in revs.values() if r.sha == revision), None)

    def _handler(self, storage: bool) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def error(self, status: int, code: str | None, message: str) -> None:
                headers = {"Content-Type": "application/json", "X-Error-Message": message}
                if status == 429:
                    headers |= {"Retry-After": "1", "RateLimit": '"api";r=0;t=1'}
                if code:
                    headers["X-Error-Code"] = code
                self.reply(status, json.dumps({"error": message}).encode(), headers)

            def json(self, value: Any, headers: dict[str, str] | None = None) -> None:
                self.reply(200, json.dumps(value).encode(), {"Content-Type": "application/json", **(headers or {})})

            def do_HEAD(self) -> None:
                self.route()

            def do_GET(self) -> None:
                self.route()

            def do_POST(self) -> None:
                self.route()

            def route(self) -> None:
                try:
                    if storage:
                        self.serve_storage()
                    else:
                        self.serve_hub()
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def authorized(self) -> bool:
                if server.token is None or self.headers.get("Authorization") == f"Bearer {server.token}":
                    return True
                self.error(401, "RepoNotFound", "Invalid credentials in Authorization header")
                return False

            def throttled(self) -> bool:
                with server.lock:
                    if server.throttle <= 0:
                        return False
                    server.throttle -= 1
                    server.throttled += 1
                self.error(429, None, "rate limited")
                return True

            def repo_of(self, parts: list[str], revision: str | None) -> tuple[Repo | None, str]:
                repo_id = "/".join(parts[:2])
                if repo_id not in server.repos:
                    self.error(404, "RepoNotFound", f"Repository {repo_id} not found")
                    return None, repo_id
                repo = server.find(repo_id, revision or "main")
                if repo is None:
                    self.error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                return repo, repo_id

            def serve_hub(self) -> None:
                split = urlsplit(self.path)
                query = parse_qs(split.query)
                parts = [unquote(p) for p in split.path.strip("/").split("/")]
                if parts[:2] in (["api", "datasets"], ["api", "models"]) and len(parts) >= 4:
                    if not self.authorized():
                        return
                    rest = parts[4:]
                    if not rest or rest[0] == "revision":
                        server.count("info")
                        repo, _ = self.repo_of(parts[2:4], "/".join(rest[1:]) if rest else None)
                        if repo:
                            self.json({
                                "_id": repo.sha[:24], "id": repo.repo_id, "author": repo.repo_id.split("/")[0],
                                "sha": repo.sha, "private": server.token is not None, "gated": False,
                                "disabled": False, "lastModified": "2026-01-01T00:00:00.000Z",
                                "createdAt": "2026-01-01T00:00:00.000Z", "tags": [], "downloads": 0,
                                "likes": 0, "siblings": [{"rfilename": f} for f in repo.files()],
                            })
                        return
                    if rest[0] == "tree" and len(rest) >= 2:
                        server.count("tree")
                        repo, _ = self.repo_of(parts[2:4], rest[1])
                        if repo:
                            self.tree(repo, "/".join(rest[2:]), query)
                        return
                    if rest[0] == "paths-info" and len(rest) >= 2 and self.command == "POST":
                        server.count("paths-info")
                        repo, _ = self.repo_of(parts[2:4], rest[1])
                        if repo:
                            length = int(self.headers.get("Content-Length") or 0)
                            body = self.rfile.read(length).decode()
                            if self.headers.get("Content-Type", "").startswith("application/json"):
                                paths = json.loads(body).get("paths", [])
                            else:
                                paths = parse_qs(body).get("paths", [])
                            entries = [e for p in paths if (e := repo.entry(p.strip("/")))]
                            self.json(entries)
                        return
                if parts[:1] == ["datasets"] and len(parts) >= 6 and parts[3] == "resolve":
                    if not self.authorized():
                        return
                    self.resolve(parts)
                    return
                if len(parts) >= 5 and parts[2] == "resolve":  # a model repo: /org/name/resolve/...
                    if not self.authorized():
                        return
                    self.resolve(["models", *parts])
                    return
                server.count("unknown:" + self.command + " " + split.path)
                self.error(404, None, f"no route {self.command} {split.path}")

            def tree(self, repo: Repo, path: str, query: dict[str, list[str]]) -> None:
                path = path.strip("/")
                if path and not (repo.folder / path).is_dir():
                    self.error(404, "EntryNotFound", f"{path} does not exist on {repo.revision}")
                    return
                recursive = query.get("recursive", ["false"])[0].lower() in ("true", "1")
                base = repo.folder / path
                found = sorted(base.rglob("*") if recursive else base.iterdir())
                entries = [repo.entry(p.relative_to(repo.folder).as_posix()) for p in found]
                cursor = int(query.get("cursor", ["0"])[0])
                page = entries[cursor:cursor + server.page_size]
                headers = {}
                if cursor + server.page_size < len(entries):
                    rev = quote(repo.revision if repo.revision in self.path else repo.sha, safe="")
                    kind = "models" if "/api/models/" in self.path else "datasets"
                    nxt = f"{server.url}/api/{kind}/{repo.repo_id}/tree/{rev}/{quote(path)}".rstrip("/")
                    flags = f"recursive={str(recursive).lower()}&expand=false"
                    headers["Link"] = f'<{nxt}?{flags}&cursor={cursor + server.page_size}>; rel="next"'
                self.json(page, headers)

            def resolve(self, parts: list[str]) -> None:
                server.count("resolve-" + self.command.lower())
                # /datasets/org/name/resolve/{rev}/{path} (a model repo's without "datasets/",
                # given here as "models/"): a revision with slashes comes escaped.
                repo, _ = self.repo_of(parts[1:3], parts[4])
                if repo is None:
                    return
                path = "/".join(parts[5:])
                entry = repo.entry(path)
                if entry is None or entry["type"] != "file":
                    self.error(404, "EntryNotFound", f"{path} does not exist on {repo.revision}")
                    return
                common = {"X-Repo-Commit": repo.sha, "Accept-Ranges": "bytes"}
                if "lfs" not in entry:
                    self.send_file(repo.folder / path, f'"{entry["oid"]}"', common)
                    return
                location = f"{server.storage_url}/{quote(repo.repo_id)}/{repo.sha}/{quote(path)}?sig=x"
                self.reply(302, b"", {
                    **common, "Location": location, "ETag": f'"{entry["lfs"]["oid"]}"',
                    "X-Linked-Etag": f'"{entry["lfs"]["oid"]}"', "X-Linked-Size": str(entry["size"]),
                })

            def serve_storage(self) -> None:
                if self.headers.get("Authorization"):
                    with server.lock:
                        server.auth_on_storage += 1
                split = urlsplit(self.path)
                parts = [unquote(p) for p in split.path.strip("/").split("/")]
                server.count("storage-" + self.command.lower())
                if self.command == "GET" and self.throttled():
                    return
                repo = server.find("/".join(parts[:2]), parts[2]) if len(parts) > 3 else None
                target = repo.folder / "/".join(parts[3:]) if repo else None
                if target is None or not target.is_file():
                    self.error(404, None, "no such object")
                    return
                digest = hashlib.sha256(target.read_bytes()).hexdigest()
                self.send_file(target, f'"{digest}"', {"Accept-Ranges": "bytes"}, count_as="/".join(parts[3:]))

            def send_file(self, target: Path, etag: str, headers: dict[str, str], count_as: str | None = None) -> None:
                data = target.read_bytes()
                status, body = 200, data
                headers = {**headers, "ETag": etag, "Content-Type": "application/octet-stream"}
                ranged = self.headers.get("Range", "")
                if ranged.startswith("bytes="):
                    first, _, last = ranged[len("bytes="):].partition("-")
                    start = int(first) if first else max(0, len(data) - int(last))
                    end = min(int(last) + 1, len(data)) if first and last else len(data)
                    if start >= len(data) and len(data) > 0:
                        self.reply(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                        return
                    status, body = 206, data[start:end]
                    headers["Content-Range"] = f"bytes {start}-{max(start, end - 1)}/{len(data)}"
                if self.command == "GET" and count_as is not None:
                    with server.lock:
                        server.bytes_sent[count_as] += len(body)
                self.reply(status, body, headers)

        return Handler
