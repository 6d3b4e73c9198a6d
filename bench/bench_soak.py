"""Soak: many requests in a row against one `zinc serve` process, its RSS and open file descriptors
sampled as they go, to show that neither grows with the number of requests served.

The requests take turns through six kinds: a whole chat completion and a streamed text completion
on one keep-alive connection, a whole text completion and a streamed chat completion each on a new
connection, a streamed chat completion whose client resets the connection after the first token
(its generation is cancelled), and a malformed body (400). The server's RSS (VmRSS) and its count
of entries in /proc/PID/fd are read every `--sample-every` requests; the baseline is taken after a
warm-up (one round of every kind, so lazily opened files and caches are in) with no client
connection open, the final figures the same way at the end.

    python bench/bench_soak.py                       # 10,000 requests, the real SmolLM2 (zinc serve)
    python bench/bench_soak.py --fake                # the same against the fake engine (no model)
    python bench/bench_soak.py --requests 300 --json soak.json

Linux only (/proc). The server is a subprocess: `zinc serve` (with `--device cpu`), or `serve()` on
tests/fakes.py's FakeEngine with `--fake`.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import BinaryIO

import orjson

ROOT = Path(__file__).resolve().parent.parent
# The fake engine records every request for the tests to look at: here it keeps the last few only,
# so that the RSS measured is the server's.
FAKE_SERVER = """
import collections, sys
from tests.fakes import FakeEngine
from zinc.server import ServerConfig, serve
engine = FakeEngine(context_length=2048)
for name in ("requests", "template_calls", "started", "completed", "aborts"):
    setattr(engine, name, collections.deque(maxlen=64))
sys.exit(serve(engine, ServerConfig(port=int(sys.argv[1]))))
"""
SETTLE_S = 10.0  # at most this long for the server to close what the client closed


@dataclass
class Sample:
    requests: int
    seconds: float
    rss_kib: int
    fds: int


@dataclass
class Soak:
    engine: str
    requests: int = 0
    max_tokens: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    baseline: Sample | None = None
    final: Sample | None = None
    peak_rss_kib: int = 0
    elapsed_s: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    hold: Hold | None = None


@dataclass
class Hold:
    """`--hold N`: N idle connections opened at once, past the server's connection cap."""

    opened: int
    held: int  # kept open by the server
    refused: int  # answered 503 and closed at once
    other: int  # neither (closed without an answer, reset)
    fds_held: int  # the server's fds while they were open
    fds_after: int  # and once they were closed
    health_ms: list[float] = field(default_factory=list)  # /health on a connection opened before them


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def settled_fds(pid: int, target: int | None = None) -> int:
    """The server's fd count once it stops changing (or reaches `target`): closing a connection
    the client closed takes the server a moment."""
    deadline = time.monotonic() + SETTLE_S
    last = fd_count(pid)
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = fd_count(pid)
        if now == target or (target is None and now == last):
            return now
        last = now
    return last


def read_response(f: BinaryIO) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response (Content-Length or chunked)."""
    line = f.readline()
    if not line.startswith(b"HTTP/1.1 "):
        raise ConnectionError(f"no response: {line!r}")
    status = int(line.split()[1])
    headers: dict[str, str] = {}
    while (line := f.readline()) not in (b"\r\n", b""):
        key, _, value = line.decode().partition(":")
        headers[key.strip().lower()] = value.strip()
    if "content-length" in headers:
        return status, headers, f.read(int(headers["content-length"]))
    body = b""
    while size := int(f.readline(), 16):
        body += f.read(size)
        f.readline()
    f.readline()
    return status, headers, body


def request(path: str, body: bytes, *, close: bool) -> bytes:
    connection = b"Connection: close\r\n" if close else b""
    return b"POST %s HTTP/1.1\r\nHost: soak\r\n%sContent-Length: %d\r\n\r\n%s" % (
        path.encode(), connection, len(body), body)  # fmt: skip


class Client:
    """The soak's requests, in turns; one keep-alive connection kept across them."""

    def __init__(self, port: int, max_tokens: int) -> None:
        self.port = port
        self.max_tokens = max_tokens
        self.sock: socket.socket | None = None
        self.file: BinaryIO | None = None
        self.kinds: list[Callable[[], int]] = [
            self.keep_alive_whole, self.keep_alive_stream, self.new_whole, self.new_stream, self.reset_mid_stream,
            self.bad_body,
        ]  # fmt: skip

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=120)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def chat(self, stream: bool, max_tokens: int | None = None) -> bytes:
        messages = [{"role": "user", "content": "Say something."}]
        body = {"messages": messages, "max_tokens": max_tokens or self.max_tokens, "stream": stream}
        return orjson.dumps(body)

    def text(self, stream: bool) -> bytes:
        return orjson.dumps({"prompt": "Once upon a time", "max_tokens": self.max_tokens, "stream": stream})

    def on_keep_alive(self, data: bytes) -> int:
        for attempt in (0, 1):  # the server may have closed an idle connection: reconnect once
            if self.sock is None:
                self.sock = self.connect()
                self.file = self.sock.makefile("rb")
            assert self.file is not None
            try:
                self.sock.sendall(data)
                status, headers, _ = read_response(self.file)
            except (ConnectionError, ValueError):
                self.close_keep_alive()
                if attempt:
                    raise
                continue
            if headers.get("connection") == "close":
                self.close_keep_alive()
            return status
        raise AssertionError("unreachable")

    def on_new(self, data: bytes) -> int:
        with self.connect() as sock, sock.makefile("rb") as f:
            sock.sendall(data)
            return read_response(f)[0]

    def keep_alive_whole(self) -> int:
        return self.on_keep_alive(request("/v1/chat/completions", self.chat(False), close=False))

    def keep_alive_stream(self) -> int:
        return self.on_keep_alive(request("/v1/completions", self.text(True), close=False))

    def new_whole(self) -> int:
        return self.on_new(request("/v1/completions", self.text(False), close=True))

    def new_stream(self) -> int:
        return self.on_new(request("/v1/chat/completions", self.chat(True), close=True))

    def reset_mid_stream(self) -> int:
        """A stream the client abandons after its first token: a reset, not a clean close."""
        sock = self.connect()
        with sock.makefile("rb") as f:
            sock.sendall(request("/v1/chat/completions", self.chat(True, max_tokens=64), close=False))
            status = int(f.readline().split()[1])
            while f.readline() not in (b"\r\n", b""):
                pass
            f.readline()  # the first chunk's size line: a token is on its way
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()
        return status

    def bad_body(self) -> int:
        return self.on_new(request("/v1/chat/completions", b'{"messages": [', close=True))

    def run(self, i: int) -> int:
        return self.kinds[i % len(self.kinds)]()

    def close_keep_alive(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.sock is not None:
            self.sock.close()
        self.sock = self.file = None


def hold(port: int, pid: int, n: int) -> Hold:
    """Open `n` idle connections at once (past the cap, the server answers 503 and closes) and
    time `/health` on a keep-alive connection opened before them."""
    health = socket.create_connection(("127.0.0.1", port), timeout=30)
    health_file = health.makefile("rb")
    idle: list[socket.socket] = []
    try:
        for _ in range(n):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=30))
        fds_held = settled_fds(pid)
        times = []
        for _ in range(20):
            started = time.perf_counter()
            health.sendall(b"GET /health HTTP/1.1\r\nHost: soak\r\n\r\n")
            assert read_response(health_file)[0] == 200
            times.append((time.perf_counter() - started) * 1000)
        held = refused = other = 0
        for sock in idle:
            sock.setblocking(False)
            try:
                data = sock.recv(64)
            except BlockingIOError:
                held += 1
                continue
            except OSError:
                data = b""
            if data.startswith(b"HTTP/1.1 503"):
                refused += 1
            else:
                other += 1
    finally:
        for sock in idle:
            sock.close()
        health_file.close()
        health.close()
    return Hold(n, held, refused, other, fds_held, 0, sorted(times))


def start_server(args: argparse.Namespace, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.setdefault("ZINC_CACHE", str(ROOT / ".zinc-cache"))  # the tests' compile cache, if it is there
    if args.fake:
        command = [sys.executable, "-c", FAKE_SERVER, str(port)]
    else:
        command = [sys.executable, "-m", "zinc", "serve", "-m", args.model, "-p", str(port), "--device", "cpu",
                   "-c", "512", "--parallel", "4"]  # fmt: skip
    log = open(args.server_log, "wb") if args.server_log else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log)


def wait_until_serving(proc: subprocess.Popen[bytes], port: int, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with status {proc.returncode} before serving")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, sock.makefile("rb") as f:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: soak\r\n\r\n")
                if read_response(f)[0] == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("the server did not start")


def soak(args: argparse.Namespace) -> Soak:
    port = free_port()
    proc = start_server(args, port)
    result = Soak(
        engine="fake" if args.fake else args.model, requests=args.requests, max_tokens=args.max_tokens
    )
    try:
        wait_until_serving(proc, port)
        client = Client(port, args.max_tokens)
        for i in range(2 * len(client.kinds)):  # warm-up: every kind twice
            client.run(i)
        client.close_keep_alive()
        started = time.monotonic()
        result.baseline = Sample(0, 0.0, rss_kib(proc.pid), settled_fds(proc.pid))
        statuses: Counter[int] = Counter()
        for i in range(args.requests):
            statuses[client.run(i)] += 1
            done = i + 1
            if done % args.sample_every == 0 or done == args.requests:
                sample = Sample(done, time.monotonic() - started, rss_kib(proc.pid), fd_count(proc.pid))
                result.samples.append(sample)
                if not args.quiet:
                    print(f"{done:>7} requests  {sample.seconds:7.1f} s  RSS {sample.rss_kib / 1024:7.1f} MiB  "
                          f"{sample.fds:>4} fds", flush=True)  # fmt: skip
        result.elapsed_s = time.monotonic() - started
        client.close_keep_alive()
        final_fds = settled_fds(proc.pid, target=result.baseline.fds)
        result.final = Sample(args.requests, result.elapsed_s, rss_kib(proc.pid), final_fds)
        result.statuses = {str(k): v for k, v in sorted(statuses.items())}
        if args.hold:
            result.hold = hold(port, proc.pid, args.hold)
            result.hold.fds_after = settled_fds(proc.pid, target=result.baseline.fds)
        result.peak_rss_kib = max(
            [result.baseline.rss_kib, result.final.rss_kib] + [s.rss_kib for s in result.samples]
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return result


def report(result: Soak) -> str:
    assert result.baseline is not None and result.final is not None
    b, f = result.baseline, result.final
    rate = result.requests / result.elapsed_s if result.elapsed_s else 0.0
    return "\n".join([
        f"soak: {result.requests} requests against {result.engine} (max_tokens {result.max_tokens}) "
        f"in {result.elapsed_s:.1f} s ({rate:.0f}/s); statuses {result.statuses}",
        f"RSS   {b.rss_kib / 1024:8.1f} MiB before  {f.rss_kib / 1024:8.1f} MiB after  "
        f"({(f.rss_kib - b.rss_kib) / 1024:+.1f} MiB; peak {result.peak_rss_kib / 1024:.1f} MiB)",
        f"fds   {b.fds:8d} before      {f.fds:8d} after      ({f.fds - b.fds:+d})",
    ] + ([] if result.hold is None else [
        f"hold  {result.hold.opened} idle connections: {result.hold.held} held, {result.hold.refused} "
        f"answered 503, {result.hold.other} other; server fds {result.hold.fds_held} with them, "
        f"{result.hold.fds_after} after; /health median {result.hold.health_ms[10]:.1f} ms, "
        f"max {result.hold.health_ms[-1]:.1f} ms",
    ]))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument(
        "--max-tokens", type=int, default=4, help="tokens per request (the abandoned streams ask 64)"
    )
    parser.add_argument(
        "--model", default="smollm2", help="what `zinc serve -m` gets (default: the bundled SmolLM2)"
    )
    parser.add_argument("--fake", action="store_true", help="the fake engine instead of a model")
    parser.add_argument("--sample-every", type=int, default=500, help="requests between two samples")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--server-log", type=Path, help="the server's output goes here (default: dropped)")
    parser.add_argument("--hold", type=int, default=0, help="then open this many idle connections at once")
    parser.add_argument("--quiet", action="store_true", help="print only the summary")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.sample_every < 1 or args.max_tokens < 1:
        parser.error("--requests, --sample-every and --max-tokens must be at least 1")
    result = soak(args)
    print(report(result))
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(asdict(result), option=orjson.OPT_INDENT_2) + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
