"""Servers on loopback and the client the concurrency benchmarks measure them with.

`Server` runs one as a subprocess until it answers; `streams` sends streaming OpenAI requests
together, each on its own connection, and reads them all with one thread (raw sockets and
`selectors`), so the client takes as little as it can of the 2 cores the server runs on.
`zinc_argv` and `llama_server_argv` start zinc and llama.cpp's own server with the same threads
and slots. Used by bench_concurrency.py and bench_streams.py.
"""

from __future__ import annotations

import http.client
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

HOST = "127.0.0.1"
THREADS = 2
CONTEXT = 2048  # tokens a slot (zinc's --ctx-size)
START_TIMEOUT_S = 600.0  # zinc may compile on first use
REQUEST_TIMEOUT_S = 600.0


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass
class Stream:
    sent: float = 0.0
    first: float = 0.0
    last: float = 0.0
    tokens: int = 0
    cached: int = 0
    prompt: int = 0
    finish: str = ""

    @property
    def ttft(self) -> float:
        return self.first - self.sent

    @property
    def rate(self) -> float:
        return (
            (self.tokens - 1) / (self.last - self.first)
            if self.tokens > 1 and self.last > self.first
            else 0.0
        )


class Exchange:
    """One streaming request on its own connection, fed the bytes `streams` reads for it: the status
    line and headers, the body (chunked, sized or to the end), and its SSE `data:` lines, each
    timed at the read that brought it. Tokens are counted from usage when the server sends it, else
    by chunks with text."""

    def __init__(self, path: str, body: dict[str, Any]) -> None:
        self.path, self.out = path, Stream()
        payload = orjson.dumps({**body, "stream": True, "stream_options": {"include_usage": True}})
        self.request = (
            f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
        ).encode() + payload
        self.raw = bytearray()  # what has come and is not yet parsed
        self.text = bytearray()  # the body, de-chunked, not yet split into lines
        self.status = 0
        self.framing = ""  # "chunked", "sized" or "close"
        self.left = 0  # bytes still to come of the current chunk, or of a sized body
        self.done = False
        self.chunks = 0
        self.reads: list[tuple[float, bytes]] = []  # (time, bytes) of each read, parsed by `result`
        self.tail = b""  # the last bytes read, to see the chunked body's end

    def take(self, data: bytes, now: float) -> None:
        """Bytes read at `now`, kept to be parsed after the run (`result`): while the streams run,
        the client only reads and timestamps, and leaves the 2 cores to the server. The response
        ends at the end of the connection (every request says `Connection: close`) or at the
        chunked body's last chunk."""
        self.reads.append((now, data))
        self.tail = (self.tail + data)[-5:]
        self.done = not data or self.tail == b"0\r\n\r\n"

    def feed(self, data: bytes, now: float) -> None:
        """Parse bytes read at `now`; b"" is the end of the connection."""
        if not data:
            if self.framing == "close":
                self._lines(now, final=True)
            self.done = True
            return
        self.raw += data
        if not self.status and not self._head():
            return
        if self.framing == "chunked":
            self._chunks()
        else:
            take = len(self.raw) if self.framing == "close" else min(self.left, len(self.raw))
            self.text += self.raw[:take]
            del self.raw[:take]
            self.left -= take
            self.done = self.framing == "sized" and self.left <= 0
        self._lines(now, final=self.done)

    def _head(self) -> bool:
        end = self.raw.find(b"\r\n\r\n")
        if end < 0:
            return False
        head = bytes(self.raw[:end]).decode("latin-1").lower().split("\r\n")
        del self.raw[: end + 4]
        self.status = int(head[0].split()[1])
        fields = dict(line.split(":", 1) for line in head[1:] if ":" in line)
        if "chunked" in fields.get("transfer-encoding", ""):
            self.framing = "chunked"
        elif "content-length" in fields:
            self.framing, self.left = "sized", int(fields["content-length"])
        else:
            self.framing = "close"
        return True

    def _chunks(self) -> None:
        raw = self.raw
        while raw:
            if self.left:  # inside a chunk: its data, then its CRLF
                take = min(self.left, len(raw))
                self.text += raw[:take]
                del raw[:take]
                self.left -= take
                continue
            end = raw.find(b"\r\n")
            if end < 0:
                return
            line = bytes(raw[:end])
            if not line:  # the CRLF after a chunk's data
                del raw[:2]
                continue
            size = int(line.split(b";")[0], 16)
            if size == 0:
                self.done = True
                raw.clear()
                return
            del raw[: end + 2]
            self.left = size

    def _lines(self, now: float, final: bool) -> None:
        text = self.text
        end = text.rfind(b"\n")
        if self.status != 200 or (end < 0 and not final):
            return  # an error's body is kept whole for `result` to report
        cut = len(text) if final else end + 1
        lines = bytes(text[:cut]).split(b"\n")
        del text[:cut]
        out = self.out
        for raw_line in lines:
            line = raw_line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            data = orjson.loads(line[6:])
            usage = data.get("usage")
            if usage:
                out.tokens = usage["completion_tokens"]
                out.prompt = usage.get("prompt_tokens") or 0
                out.cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            for choice in data.get("choices") or []:
                out.finish = choice.get("finish_reason") or out.finish
                if choice.get("text") or (choice.get("delta") or {}).get("content"):
                    out.first = out.first or now
                    out.last = now
                    self.chunks += 1

    def result(self) -> Stream:
        reads, self.reads, self.done = self.reads, [], False
        for now, data in reads:
            if not self.done:
                self.feed(data, now)
        if self.status != 200:
            raise RuntimeError(f"{self.path}: HTTP {self.status}: {bytes(self.text)[:200]!r}")
        if not self.out.finish:
            raise RuntimeError(f"{self.path}: the stream ended without a finish_reason (cut short)")
        self.out.tokens = self.out.tokens or self.chunks
        return self.out


def streams(port: int, jobs: Sequence[tuple[float, str, dict[str, Any]]]) -> list[Stream]:
    """Run streaming requests `(delay_s, path, body)` together, each sent `delay_s` after the
    first, on their own connections, all read by this one thread with `selectors`: the clients
    share the 2 cores with the server, and threads with `http.client` took 40-80 us of CPU per
    token from it (a thread woken per chunk, the GIL handed over, chunked decoding in Python).
    Each read is only timestamped and kept; the responses are parsed once all have ended."""
    pending = sorted(((delay, i, Exchange(path, body)) for i, (delay, path, body) in enumerate(jobs)),
                     key=lambda job: job[0])  # fmt: skip
    exchanges = [job[2] for job in sorted(pending, key=lambda job: job[1])]
    sel = selectors.DefaultSelector()
    t0 = time.perf_counter()
    deadline = t0 + REQUEST_TIMEOUT_S
    live = 0
    try:
        while pending or live:
            now = time.perf_counter()
            if now > deadline:
                raise RuntimeError("a request did not finish in time")
            due = []  # connected first, then sent back to back: requests "sent at once" arrive so
            while pending and pending[0][0] <= now - t0:
                _, _, ex = pending.pop(0)
                sock = socket.create_connection((HOST, port), timeout=REQUEST_TIMEOUT_S)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                due.append((sock, ex))
            for sock, ex in due:
                ex.out.sent = time.perf_counter()
                sock.sendall(ex.request)
                sock.setblocking(False)
                sel.register(sock, selectors.EVENT_READ, ex)
                live += 1
            wait = max(0.0, pending[0][0] - (time.perf_counter() - t0)) if pending else 1.0
            for key, _ in sel.select(wait):
                ready, ex = key.fileobj, key.data
                assert isinstance(ready, socket.socket) and isinstance(ex, Exchange)
                sock = ready
                try:
                    data = sock.recv(1 << 16)
                except BlockingIOError:
                    continue
                ex.take(data, time.perf_counter())
                if ex.done:
                    sel.unregister(sock)
                    sock.close()
                    live -= 1
    finally:
        for key in list(sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        sel.close()
    return [ex.result() for ex in exchanges]


def request(port: int, path: str, body: dict[str, Any]) -> Stream:
    """One streaming request."""
    return streams(port, [(0.0, path, body)])[0]


def completion(port: int, prompt: str, n: int) -> Stream:
    return request(port, "/v1/completions", completion_body(prompt, n))


def completion_body(prompt: str, n: int) -> dict[str, Any]:
    return {"prompt": prompt, "max_tokens": n, "temperature": 0}


class Server:
    """A server subprocess on loopback, ready once GET `ready` answers 200; its output goes to a
    temporary file, whose tail a failed start shows. A failed start ends it; so does leaving the
    `with` block (`stop`: SIGTERM, then SIGKILL after 30 s), whatever was raised in it."""

    def __init__(
        self, name: str, argv: list[str], port: int, ready: str, env: dict[str, str] | None = None
    ) -> None:
        self.name, self.port = name, port
        say(f"starting {name}: {' '.join(argv)}")
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop)
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        try:
            self._wait(ready)
        except BaseException:
            self.stop()
            raise

    def _wait(self, ready: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")
            conn = http.client.HTTPConnection(HOST, self.port, timeout=5)
            try:
                conn.request("GET", ready)
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            finally:
                conn.close()
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not start in {START_TIMEOUT_S:.0f} s:\n{self.tail()}")

    def tail(self, n: int = 2000) -> str:
        """The last `n` bytes of its output."""
        size = self.log.seek(0, os.SEEK_END)
        self.log.seek(max(0, size - n))
        return self.log.read().decode(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def zinc_argv(model: Path, port: int, parallel: int = 8, context: int = CONTEXT) -> list[str]:
    """`zinc serve` with `parallel` slots of `context` tokens each (its KV cache holds them all)."""
    zinc = Path(sys.executable).parent / "zinc"
    return [str(zinc), "serve", "-m", str(model), "--host", HOST, "--port", str(port), "--parallel", str(parallel),
            "--threads", str(THREADS), "--ctx-size", str(context)]  # fmt: skip


def llama_server_argv(binary: Path, model: Path, port: int, parallel: int = 8, context: int = CONTEXT) -> list[str]:
    """llama.cpp's own server as `llama-server -np N` runs, with `parallel` slots of `context` tokens
    each (its -c is all the slots' together) and no reuse of cached prompt chunks by KV shifting
    (`--cache-reuse 0`, its default, said)."""
    return [str(binary), "-m", str(model), "-t", str(THREADS), "-np", str(parallel), "-c", str(parallel * context),
            "--cache-reuse", "0", "--host", HOST, "--port", str(port)]  # fmt: skip
