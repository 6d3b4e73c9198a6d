"""The HTTP server's overhead over the engine, with the bundled SmolLM2 on the CPU, in one process.

Usage: .venv/bin/python bench/bench_server.py [--tokens N] [--runs R] [--out FILE.md]

Builds the engine as `zinc serve` does, starts the real server (`start_server` on a uvloop loop in
a thread, port 0 on 127.0.0.1), and measures, alternating in-process and HTTP runs of the same
greedy prompt:

1. decode tokens/s of `engine.generate()` consumed in-process vs tokens/s seen by a streaming HTTP
   client (`/v1/completions`, `stream: true`, `stream_options.include_usage`, a raw socket), from
   the first to the last content token; the ratio should be at least 95%;
2. time to the first token, in-process vs through HTTP (medians of R runs);
3. `/health` latency (median, p99 of sequential requests on one keep-alive connection) with no other
   connection, then with 200 idle keep-alive connections open.

Prints a markdown section to stdout (progress goes to stderr) and, with --out, writes it to a file.
Every loop is bounded in count and time; nothing listens beyond loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import math
import os
import platform
import resource
import socket
import statistics
import sys
import threading
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import orjson
import uvloop

from zinc.compiler.build import ensure_artifact
from zinc.engine.engine import LocalEngine
from zinc.engine.types import GenerationRequest, SamplingParams
from zinc.model.gguf_file import default_model_path, open_gguf
from zinc.runtime.device import resolve_device
from zinc.runtime.session import ModelSession
from zinc.server import Server, ServerConfig, start_server
from zinc.tokenizer import ChatTemplate, Tokenizer

T = TypeVar("T")
HOST = "127.0.0.1"
CONTEXT = 2048
MODEL_ID = "smollm2"
TARGET_RATIO = 0.95
WARMUP_TOKENS = 4
IDLE_CONNECTIONS = 200
HEALTH_REQUESTS = 200
SOCKET_TIMEOUT_S = 30.0  # any single socket operation
GENERATION_TIMEOUT_S = 300.0  # one whole generation, in-process or over HTTP
# a short prompt (TTFT is mostly prefill) that the model continues for 64+ greedy tokens before it
# would end its turn; a run that stops early is an error, not a measurement
PROMPT = "Once upon a time, in a small village by the sea, there lived"


def say(msg: str) -> None:
    print(f"[bench_server {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Trace:
    """One generation as its consumer saw it (perf_counter seconds)."""

    start: float  # request issued
    content_times: list[float] = field(default_factory=list)  # each non-empty text piece arrived
    text: list[str] = field(default_factory=list)
    tokens: int = 0  # exact completion tokens (usage)
    finish: str | None = None

    @property
    def ttft(self) -> float:
        return self.content_times[0] - self.start

    @property
    def decode_tps(self) -> float:
        """Tokens after the first over the time from the first to the last content token."""
        span = self.content_times[-1] - self.content_times[0]
        return (self.tokens - 1) / span if span > 0 else math.nan


# --------------------------------------------------------------------------------------------
# The server, on a uvloop loop in a background thread
# --------------------------------------------------------------------------------------------
class ServerThread:
    """`start_server` on a uvloop loop in a daemon thread (like tests/e2e RunningServer)."""

    def __init__(self, engine: LocalEngine, config: ServerConfig) -> None:
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="bench-server", daemon=True)
        self.thread.start()
        self.server: Server = self.call(start_server(engine, config), timeout=10)
        self.port = self.server.port

    def call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=timeout)

    def connect(self) -> socket.socket:
        sock = socket.create_connection((HOST, self.port), timeout=SOCKET_TIMEOUT_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def stop(self) -> None:
        try:
            self.call(self.server.close(), timeout=30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            if not self.thread.is_alive():
                self.loop.close()


# --------------------------------------------------------------------------------------------
# In-process generation (run on the server's loop, as the server runs it)
# --------------------------------------------------------------------------------------------
async def consume_engine(engine: LocalEngine, ids: Sequence[int], max_tokens: int, request_id: str) -> Trace:
    request = GenerationRequest(request_id, list(ids), max_tokens, SamplingParams(temperature=0.0))
    trace = Trace(time.perf_counter())
    async for event in engine.generate(request):  # bounded: at most max_tokens + 1 events
        now = time.perf_counter()
        if event.text:
            trace.content_times.append(now)
            trace.text.append(event.text)
        if event.finish_reason is not None:
            trace.finish = event.finish_reason
            trace.tokens = event.usage.completion_tokens if event.usage else 0
    return trace


def engine_run(srv: ServerThread, engine: LocalEngine, ids: Sequence[int], n: int, tag: str) -> Trace:
    coro = asyncio.wait_for(consume_engine(engine, ids, n, tag), GENERATION_TIMEOUT_S)
    return srv.call(coro, timeout=GENERATION_TIMEOUT_S + 10)


# --------------------------------------------------------------------------------------------
# HTTP/1.1 over a raw socket
# --------------------------------------------------------------------------------------------
def read_head(f: BinaryIO) -> tuple[int, dict[str, str]]:
    status_line = f.readline(65536)
    if not status_line:
        raise ConnectionError("the server closed the connection")
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    for _ in range(200):
        line = f.readline(65536)
        if line in (b"\r\n", b""):
            return status, headers
        key, _, value = line.decode("latin-1").partition(":")
        headers[key.strip().lower()] = value.strip()
    raise ValueError("too many response headers")


def read_body(f: BinaryIO, headers: dict[str, str]) -> bytes:
    if "content-length" in headers:
        return f.read(int(headers["content-length"]))
    raise ValueError(f"expected a Content-Length body, got headers {headers}")


def http_stream_run(srv: ServerThread, prompt: str, n: int) -> Trace:
    """Stream one greedy `/v1/completions` and time every content token as it arrives."""
    body = orjson.dumps({
        "model": MODEL_ID, "prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
    })  # fmt: skip
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(body)}\r\n\r\n"
    deadline = time.monotonic() + GENERATION_TIMEOUT_S
    trace = Trace(time.perf_counter())
    with srv.connect() as sock, sock.makefile("rb") as f:
        sock.sendall(head.encode() + body)
        status, headers = read_head(f)
        if status != 200:
            raise RuntimeError(f"/v1/completions answered {status}: {read_body(f, headers)[:500]!r}")
        if headers.get("transfer-encoding") != "chunked":
            raise RuntimeError(f"expected a chunked event stream, got headers {headers}")
        pending, done = b"", False
        for _ in range(8 * n + 64):  # HTTP chunks: a few per token at most
            if time.monotonic() > deadline:
                raise TimeoutError("the HTTP stream ran past its deadline")
            size = int(f.readline(1024).split(b";")[0], 16)
            if size == 0:
                f.readline(1024)  # the CRLF after the last chunk (no trailers)
                break
            pending += f.read(size)
            f.readline(1024)  # the chunk's CRLF
            now = time.perf_counter()
            *events, pending = pending.split(b"\n\n")
            for event in events:
                data = event.removeprefix(b"data: ")
                if data == b"[DONE]":
                    done = True
                    continue
                chunk = orjson.loads(data)
                if "error" in chunk:
                    raise RuntimeError(f"error inside the stream: {chunk['error']}")
                if chunk.get("usage"):
                    trace.tokens = int(chunk["usage"]["completion_tokens"])
                for choice in chunk.get("choices") or ():
                    if choice.get("text"):
                        trace.content_times.append(now)
                        trace.text.append(choice["text"])
                    if choice.get("finish_reason"):
                        trace.finish = choice["finish_reason"]
        else:
            raise RuntimeError("the HTTP stream did not end")
    if not done:
        raise RuntimeError("the stream ended without data: [DONE]")
    return trace


HEALTH_REQUEST = f"GET /health HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()


def health(sock: socket.socket, f: BinaryIO) -> float:
    """One keep-alive `GET /health`; its latency in seconds."""
    start = time.perf_counter()
    sock.sendall(HEALTH_REQUEST)
    status, headers = read_head(f)
    body = read_body(f, headers)
    elapsed = time.perf_counter() - start
    if status != 200 or headers.get("connection") == "close" or orjson.loads(body)["status"] != "ok":
        raise RuntimeError(f"/health answered {status} {headers} {body[:200]!r}")
    return elapsed


def health_latencies(srv: ServerThread, count: int) -> list[float]:
    with srv.connect() as sock, sock.makefile("rb") as f:
        health(sock, f)  # warm-up
        return [health(sock, f) for _ in range(count)]


def still_open(sock: socket.socket) -> bool:
    """True when the server has not closed this idle connection (nothing to read, no EOF)."""
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)


def raise_fd_limit(needed: int) -> str:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        new = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        return f"{soft} -> {new}"
    return f"{soft} (enough)"


@dataclass
class HealthResult:
    idle: int
    latencies: list[float]
    idle_open_after: int  # idle connections the server still held after the measurement
    server_connections: int  # the server's count while the idle ones were open


def health_bench(srv: ServerThread, idle: int, count: int) -> HealthResult:
    idle_socks: list[tuple[socket.socket, BinaryIO]] = []
    try:
        for _ in range(idle):
            sock = srv.connect()
            idle_socks.append((sock, sock.makefile("rb")))
            health(*idle_socks[-1])  # one request each, then the connection stays idle
        server_connections = srv.server.connection_count
        latencies = health_latencies(srv, count)
        open_after = sum(still_open(sock) for sock, _ in idle_socks)
        return HealthResult(idle, latencies, open_after, server_connections)
    finally:
        for sock, f in idle_socks:
            f.close()
            sock.close()


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------
def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def nearest_rank(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def report(
    *,
    n: int,
    runs: int,
    prompt_tokens: int,
    device: str,
    engine_traces: list[Trace],
    http_traces: list[Trace],
    same_text: bool,
    health_results: list[HealthResult],
    fd_limit: str,
    load: tuple[tuple[float, float, float], tuple[float, float, float]],
    elapsed: float,
) -> str:
    e_tps = [t.decode_tps for t in engine_traces]
    h_tps = [t.decode_tps for t in http_traces]
    e_ttft = [t.ttft for t in engine_traces]
    h_ttft = [t.ttft for t in http_traces]
    ratio = median(h_tps) / median(e_tps)
    paired = [h / e for h, e in zip(h_tps, e_tps, strict=True)]
    verdict = "meets" if ratio >= TARGET_RATIO else "misses"
    fmt_list = ", ".join
    lines = [
        "## Server benchmark",
        "",
        f"{dt.datetime.now().isoformat(timespec='seconds')} on {platform.node()} ({os.cpu_count()} CPUs), "
        f"SmolLM2-135M-Instruct Q4_1 on {device}, greedy, prompt {prompt_tokens} tokens, "
        f"{n} completion tokens, {runs} runs alternating in-process and HTTP "
        f"(`bench/bench_server.py --tokens {n} --runs {runs}`, {elapsed:.0f} s). "
        f"Load average {load[0][0]:.2f} before, {load[1][0]:.2f} after (other processes share the CPU: "
        "numbers are noisy).",
        "",
        "| | engine, in-process | HTTP stream (`/v1/completions`) | HTTP / engine |",
        "|---|---:|---:|---:|",
        f"| decode tokens/s, median | {median(e_tps):.2f} | {median(h_tps):.2f} | "
        f"**{ratio:.1%}** ({verdict} the >= {TARGET_RATIO:.0%} target) |",
        f"| decode tokens/s, per run | {fmt_list(f'{v:.2f}' for v in e_tps)} | "
        f"{fmt_list(f'{v:.2f}' for v in h_tps)} | {fmt_list(f'{v:.1%}' for v in paired)} |",
        f"| time to first token, ms, median | {ms(median(e_ttft))} | {ms(median(h_ttft))} | "
        f"{median(h_ttft) / median(e_ttft):.1%} ({(median(h_ttft) - median(e_ttft)) * 1e3:+.2f} ms) |",
        f"| time to first token, ms, per run | {fmt_list(ms(v) for v in e_ttft)} | "
        f"{fmt_list(ms(v) for v in h_ttft)} | |",
        f"| completion tokens / content chunks | {engine_traces[-1].tokens} / {len(engine_traces[-1].content_times)} "
        f"| {http_traces[-1].tokens} / {len(http_traces[-1].content_times)} | "
        f"same text: {'yes' if same_text else '**no**'} |",
        "",
        "Decode tokens/s = (completion tokens - 1) / (time of the last content token - time of the first); "
        "time to first token runs from `engine.generate()` (in-process) or from opening the connection "
        "(HTTP) to the first non-empty text.",
        "",
        f"`/health` latency, {len(health_results[0].latencies)} sequential "
        f"requests on one keep-alive connection (open-file limit {fd_limit}):",
        "",
        "| idle keep-alive connections | median ms | p99 ms | max ms | server connections before | idle still open after |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in health_results:
        lines.append(
            f"| {r.idle} | {ms(median(r.latencies))} | {ms(nearest_rank(r.latencies, 0.99))} | "
            f"{ms(max(r.latencies))} | {r.server_connections} | {r.idle_open_after} / {r.idle} |"
        )
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------
def build_engine(cpu_driver: str) -> LocalEngine:
    path = default_model_path()
    meta = open_gguf(path).metadata
    tok = Tokenizer.from_metadata(meta)
    spec = resolve_device("cpu", cpu_driver)
    artifact = ensure_artifact(path, "cpu", say)
    session = ModelSession(artifact, path, spec, CONTEXT)
    return LocalEngine(session, tok, ChatTemplate.from_metadata(meta, tok), MODEL_ID)


def check_trace(trace: Trace, n: int, where: str) -> None:
    if trace.tokens != n or trace.finish != "length":
        raise RuntimeError(f"{where}: expected {n} tokens ending at the length limit, got {trace.tokens} "
                           f"({trace.finish}); the prompt stopped early")  # fmt: skip
    if len(trace.content_times) < 2:
        raise RuntimeError(f"{where}: fewer than two content tokens arrived")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=32, help="completion tokens per run (default 32)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each kind (default 3)")
    parser.add_argument("--out", type=Path, help="also write the markdown section to this file")
    parser.add_argument("--cpu-driver", default="local-task", help="IREE CPU driver (default local-task)")
    args = parser.parse_args(argv)
    n, runs = args.tokens, args.runs
    if not 2 <= n <= 1024 or not 1 <= runs <= 50:
        parser.error("--tokens must be within 2..1024 and --runs within 1..50")

    started = time.monotonic()
    load_before = os.getloadavg()
    fd_limit = raise_fd_limit(1024 + 4 * IDLE_CONNECTIONS)
    say("loading the engine (the first compile takes about a minute)")
    engine = build_engine(args.cpu_driver)
    ids = engine.tokenize(PROMPT)  # as the server tokenizes a text prompt
    say(f"engine ready on {engine.stats().device}; prompt {len(ids)} tokens")
    srv = ServerThread(engine, ServerConfig(host=HOST, port=0))
    try:
        say(f"server on http://{HOST}:{srv.port}; warm-up")
        engine_run(srv, engine, ids, WARMUP_TOKENS, "warmup")
        http_stream_run(srv, PROMPT, WARMUP_TOKENS)
        engine_traces: list[Trace] = []
        http_traces: list[Trace] = []
        for i in range(runs):
            engine_traces.append(engine_run(srv, engine, ids, n, f"bench-{i}"))
            check_trace(engine_traces[-1], n, "in-process")
            http_traces.append(http_stream_run(srv, PROMPT, n))
            check_trace(http_traces[-1], n, "HTTP")
            say(f"run {i + 1}/{runs}: engine {engine_traces[-1].decode_tps:.2f} tok/s, "
                f"HTTP {http_traces[-1].decode_tps:.2f} tok/s")  # fmt: skip
        texts = {"".join(t.text) for t in engine_traces + http_traces}
        say("/health latency, no idle connections")
        health_results = [health_bench(srv, 0, HEALTH_REQUESTS)]
        say(f"/health latency with {IDLE_CONNECTIONS} idle keep-alive connections")
        health_results.append(health_bench(srv, IDLE_CONNECTIONS, HEALTH_REQUESTS))
    finally:
        srv.stop()
    text = report(
        n=n, runs=runs, prompt_tokens=len(ids), device=engine.stats().device,
        engine_traces=engine_traces, http_traces=http_traces, same_text=len(texts) == 1,
        health_results=health_results, fd_limit=fd_limit, load=(load_before, os.getloadavg()),
        elapsed=time.monotonic() - started,
    )  # fmt: skip
    print(text)
    if args.out:
        args.out.write_text(text)
        say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
