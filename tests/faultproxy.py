"""A fault-injecting HTTP proxy for tests: forwards every request to an upstream server
(S3 or plain HTTP) unchanged, and can add latency before the response, answer 503
SlowDown, reset the connection part-way through a body, cut a body short, or never
answer at all (a blackhole: the connection stays open and silent until the proxy closes).
It counts the requests it sees and the bytes it sends back, so tests can check what was
(not) fetched.

Faults aside, it answers as a real server does: headers and body go out at once
(TCP_NODELAY: without it a sequential client waits for its delayed ACK, 20-40 ms a
request), and a burst of new connections is queued, not dropped (socketserver's
backlog of 5 drops SYNs, which clients resend only after 1, 3, 7... s).

Signed S3 requests pass unchanged: the client signs for the proxy's address and the
upstream server checks the headers it receives.
"""

from __future__ import annotations

import http.client
import io
import random
import socket
import struct
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer"}
SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


@dataclass
class Faults:
    """Probabilities (0..1) of each fault per GET, and latency before each response."""

    latency: float = 0.0
    slow_down: float = 0.0
    # 500 Internal Server Error; 429 Too Many Requests with `Retry-After: 1`.
    server_error: float = 0.0
    throttle: float = 0.0
    reset: float = 0.0
    truncate: float = 0.0
    blackhole: float = 0.0
    seed: int = 0
    rng: random.Random = field(default_factory=random.Random)


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.faults = Faults()
        self.counts: Counter[str] = Counter()
        # Requests being answered now, and the most at any one time since reset_counts().
        self.in_flight = 0
        self.max_in_flight = 0
        # Bytes sent to clients (status lines, headers, bodies) since reset_counts().
        self.bytes_sent = 0
        self.lock = threading.Lock()
        # Set when the proxy closes: blackholed requests give up then.
        self.closing = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def setup(self) -> None:
                super().setup()
                self.wfile = _CountingWriter(self.wfile, proxy)  # type: ignore[assignment]

            def log_message(self, format: str, *args: object) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                proxy._forward(self, "GET")

            def do_HEAD(self) -> None:
                proxy._forward(self, "HEAD")

            def do_PUT(self) -> None:
                proxy._forward(self, "PUT")

            def do_POST(self) -> None:
                proxy._forward(self, "POST")

            def do_DELETE(self) -> None:
                proxy._forward(self, "DELETE")

        self.server = LocalServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.server.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_faults(self, **kwargs: float) -> None:
        seed = int(kwargs.pop("seed", 0))
        self.faults = Faults(**kwargs, seed=seed, rng=random.Random(seed))

    def reset_counts(self) -> None:
        with self.lock:
            self.counts.clear()
            self.max_in_flight = self.in_flight
            self.bytes_sent = 0

    def gets(self, path_contains: str = "") -> int:
        with self.lock:
            return sum(n for key, n in self.counts.items() if key.startswith("GET ") and path_contains in key)

    def close(self) -> None:
        self.closing.set()
        self.server.stop()

    def _draw(self) -> str | None:
        faults = self.faults
        with self.lock:
            r = faults.rng.random()
        for name in ("slow_down", "server_error", "throttle", "reset", "truncate", "blackhole"):
            p = getattr(faults, name)
            if r < p:
                return name
            r -= p
        return None

    def _forward(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        with self.lock:
            self.counts[f"{method} {handler.path}"] += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            self._answer(handler, method)
        finally:
            with self.lock:
                self.in_flight -= 1

    def _answer(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else None
        fault = self._draw() if method == "GET" else None
        if fault == "blackhole":
            # Read the request, then say nothing until the proxy closes.
            self.closing.wait(600)
            handler.close_connection = True
            return
        if self.faults.latency:
            time.sleep(self.faults.latency)
        if self.closing.is_set():
            return  # the test is over; its upstream may be gone too
        if fault == "slow_down":
            handler.send_response(503, "Slow Down")
            handler.send_header("Content-Type", "application/xml")
            handler.send_header("Content-Length", str(len(SLOW_DOWN)))
            handler.end_headers()
            handler.wfile.write(SLOW_DOWN)
            return
        if fault in ("server_error", "throttle"):
            handler.send_response(500 if fault == "server_error" else 429)
            if fault == "throttle":
                handler.send_header("Retry-After", "1")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        upstream = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            headers = {k: v for k, v in handler.headers.items() if k.lower() not in HOP_BY_HOP}
            upstream.request(method, handler.path, body=body, headers=headers)
            response = upstream.getresponse()
            handler.send_response(response.status, response.reason)
            for key, value in response.getheaders():
                if key.lower() not in HOP_BY_HOP:
                    handler.send_header(key, value)
            # A body the upstream sent chunked (GCS's JSON replies) goes out with its
            # length: the transfer coding is hop-by-hop, and without either the client
            # cannot tell where the body ends.
            whole = None
            if method != "HEAD" and response.getheader("Content-Length") is None:
                whole = response.read()
                handler.send_header("Content-Length", str(len(whole)))
            handler.end_headers()
            if method == "HEAD":
                return
            body_reader: io.BufferedIOBase | http.client.HTTPResponse = response
            total = int(response.getheader("Content-Length") or 0)
            if whole is not None:
                body_reader, total = io.BytesIO(whole), len(whole)
            # Faults on a body: stop half-way, by a TCP reset or a plain close.
            stop_at = total // 2 if fault in ("reset", "truncate") and total > 1 else None
            sent = 0
            while True:
                chunk = body_reader.read(64 * 1024)
                if not chunk:
                    break
                if stop_at is not None and sent + len(chunk) >= stop_at:
                    handler.wfile.write(chunk[: stop_at - sent])
                    handler.wfile.flush()
                    self._break(handler, fault == "reset")
                    return
                handler.wfile.write(chunk)
                sent += len(chunk)
        finally:
            upstream.close()

    @staticmethod
    def _break(handler: BaseHTTPRequestHandler, reset: bool) -> None:
        connection = handler.connection
        if reset:
            # SO_LINGER 0: close() sends RST instead of FIN.
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        try:
            connection.shutdown(socket.SHUT_RDWR) if not reset else None
        finally:
            connection.close()
            handler.close_connection = True


class LocalServer(ThreadingHTTPServer):
    """The test servers' HTTP server (this proxy's, tests/azureserver.py's and
    tests/gcpauth.py's): a thread per connection, a deep accept queue, and clients that
    hang up mid-answer taken as normal."""

    daemon_threads = True
    request_queue_size = 1024

    def handle_error(self, request: object, client_address: object) -> None:
        # A client that hangs up mid-answer (a cancelled read, wrk at its end) is normal.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]

    def start(self) -> None:
        """Serves on a thread of its own until `stop`."""
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _CountingWriter:
    """A handler's socket writer that adds what it writes to the proxy's `bytes_sent`."""

    def __init__(self, raw: io.BufferedIOBase, proxy: FaultProxy) -> None:
        self.raw, self.proxy = raw, proxy

    def write(self, data: bytes) -> int:
        with self.proxy.lock:
            self.proxy.bytes_sent += len(data)
        return self.raw.write(data)

    def __getattr__(self, name: str) -> object:
        return getattr(self.raw, name)
