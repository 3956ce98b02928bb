"""The learner's weight server: the latest version's params as bytes, over HTTP.

One version is served at a time (actors want the latest); a request for an older one
gets 404 Not Found, and its actor asks the version again.
"""

from __future__ import annotations

import http.server
import socket
import threading
import urllib.parse

from distributed.comm import get_address_host_port


class WeightServer:
    def __init__(self, host: str):
        self._latest: tuple[int, list[memoryview]] | None = None  # (version, its chunks)
        self._lock = threading.Lock()
        self._httpd = http.server.ThreadingHTTPServer((host, 0), _handler(self))
        self._httpd.daemon_threads = True
        # Started by the first `serve` (in `Session.run`): building a session starts no thread.
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="tandem-weight-server", daemon=True)

    def url(self, version: int) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v/{version}"

    def serve(self, version: int, chunks: list[memoryview]) -> None:
        """Serves `version`: its bytes are the chunks in order (`params_to_chunks`)."""
        with self._lock:
            self._latest = (version, chunks)
            if self._thread.ident is None:
                self._thread.start()

    def get(self, version: int) -> list[memoryview] | None:
        with self._lock:
            if self._latest is None or self._latest[0] != version:
                return None
            return self._latest[1]

    def close(self) -> None:
        with self._lock:
            serving = self._thread.ident is not None
        if serving:  # `shutdown` waits for a `serve_forever` that has begun
            self._httpd.shutdown()
        self._httpd.server_close()


def _handler(server: WeightServer) -> type:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the http.server API)
            path = urllib.parse.urlparse(self.path).path
            version = path.removeprefix("/v/")
            chunks = server.get(int(version)) if version.isdigit() else None
            if chunks is None:
                self.send_error(404, "not the latest version")
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(sum(chunk.nbytes for chunk in chunks)))
            self.end_headers()
            for chunk in chunks:  # each array from its own memory: nothing copied in this process
                self.wfile.write(chunk)

        def log_message(self, *args) -> None:  # one line per fetch would flood the learner's log
            pass

    return Handler


def address_towards(address: str) -> str:
    """This host's IP address on the route to `address` (a Dask address, "tcp://host:port"):
    where a peer that reaches that host can reach this one. Sends nothing (a UDP connect
    only picks the route). An in-process scheduler's peers are in this process."""
    if address.startswith("inproc://"):
        return "127.0.0.1"
    host, port = get_address_host_port(address)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))
        return probe.getsockname()[0]
