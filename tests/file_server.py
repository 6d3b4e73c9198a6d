"""A local HTTP file server for download tests (nothing here reaches a model hub).

`FileServer` serves byte blobs on 127.0.0.1 with `Range` support, and can misbehave on purpose:
drop the connection after some bytes of the first response(s), ignore ranges, or send slowly so
progress can be watched. It records every request's path and Range header.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # the client hung up mid-response: the tests cancel downloads on purpose
        super().handle_error(request, client_address)


class FileServer:
    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = dict(files)
        self.requests: list[tuple[str, str | None]] = []  # (path, range header)
        self.sent_bytes = 0
        self.drop_after: int | None = None  # bytes of a response body before the connection drops
        self.drops_left = 0  # how many responses drop
        self.ignore_range = False
        self.chunk = 64 * 1024
        self.chunk_delay = 0.0  # seconds between chunks
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                owner._get(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _get(self, h: BaseHTTPRequestHandler) -> None:
        name = h.path.lstrip("/")
        range_header = h.headers.get("Range")
        with self.lock:
            self.requests.append((name, range_header))
            drop = self.drop_after if self.drops_left > 0 else None
            if drop is not None:
                self.drops_left -= 1
        data = self.files.get(name)
        if data is None:
            h.send_response(404)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        start = 0
        match = re.fullmatch(r"bytes=(\d+)-", range_header or "")
        if match and not self.ignore_range:
            start = int(match[1])
            if start >= len(data):
                h.send_response(416)
                h.send_header("Content-Range", f"bytes */{len(data)}")
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
            h.send_response(206)
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            h.send_response(200)
        body = data[start:]
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Accept-Ranges", "bytes")
        h.end_headers()
        sent = 0
        while sent < len(body):
            piece = body[sent : sent + self.chunk]
            if drop is not None and sent + len(piece) > drop:
                piece = piece[: max(0, drop - sent)]
                h.wfile.write(piece)
                h.wfile.flush()
                with self.lock:
                    self.sent_bytes += len(piece)
                h.close_connection = True
                return
            h.wfile.write(piece)
            sent += len(piece)
            with self.lock:
                self.sent_bytes += len(piece)
            if self.chunk_delay:
                time.sleep(self.chunk_delay)
