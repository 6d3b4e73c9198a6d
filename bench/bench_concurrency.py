"""Concurrent streams: zinc's continuous batching beside llama.cpp's server, same model, same run.

Usage: .venv/bin/python bench/bench_concurrency.py [--runs R] [--tokens N] [--out FILE.md]
(llama.cpp's server needs `pip install 'llama-cpp-python[server]'` or fastapi, uvicorn,
sse-starlette, starlette-context and pydantic-settings next to llama-cpp-python; the benchmark
only, never CI.)

Starts `zinc serve --parallel 8` and then `python -m llama_cpp.server` (2 threads,
`--interrupt_requests false`: by default it ends a running stream when another request comes) as
subprocesses on loopback, each with the bundled SmolLM2 Q4_1, and measures with streaming
`/v1/completions` requests (greedy; raw sockets, all read by one thread):
1. one stream: decode tokens/s (first to last token), aggregate tokens/s (all its tokens / the
   time from sending the request to its last token) and time to first token;
2. 4 and 8 concurrent streams: aggregate tokens/s (all tokens / wall time from the first request
   sent to the last stream done), as a ratio to one stream's aggregate (the same measure: both
   count the prompts and the first tokens' wait) and to its decode rate (which counts neither),
   and the worst time to first token;
3. time to first token of a new request while 7 others stream, against its idle value (and how
   many of them were still streaming when it came);
4. a chat follow-up turn over a ~1,000-token history: with `session_id` (zinc) after the first turn,
   against the same follow-up sent cold (its first message differs, so nothing is reused).
Medians of --runs runs; progress on stderr, markdown on stdout and --out.
"""

from __future__ import annotations

import argparse
import http.client
import os
import platform
import selectors
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from zinc.model.gguf_file import default_model_path

HOST = "127.0.0.1"
START_TIMEOUT_S = 600.0  # zinc may compile on first use
REQUEST_TIMEOUT_S = 600.0
# Each runs to the requested length with SmolLM2 (greedy): a stream the model ends early would leave
# fewer streams running than the row says (the counting prompt used before stopped at 27 tokens).
PROMPTS = [
    "Explain how bees make honey, from flower to jar. Bees",
    "List the planets of the solar system and describe each one in detail. Mercury is",
    "Write a long story about a dragon who learns to cook. Once upon a time,",
    "Explain how a computer works, step by step, from the transistor up. First,",
    "Describe the history of Rome from its founding to the fall of the empire. Rome",
    "Write a recipe for bread with every step explained. To begin,",
    "Explain the rules of chess to a beginner, piece by piece. The king",
    "Describe a walk through a forest in autumn, in great detail. The path",
]
# 7 that run to 512 tokens, for the streams a new request comes among: SmolLM2 ends the second of
# PROMPTS, the planets, after 177, and the first, the bees, after 77 since the CPU's RMSNorm sums its
# squares in 16 lanes (a rounding change); the city takes the bees' place here
LONG = ["Explain how a city is planned and built, street by street. Planners", *PROMPTS[2:]]
# neither prompt shares a prefix with the ones above, so no server reuses a cached prompt for them
WARM_UP = "Hello, how are you today?"
PROBE = "Name the colors of the rainbow and say where each one comes from. Red"


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


def concurrent(port: int, n_streams: int, tokens: int) -> tuple[float, float, int]:
    """Aggregate tokens/s, worst time to first token and how many streams ended before `tokens`
    of `n_streams` streams sent at once."""
    out = streams(port, [(0.0, "/v1/completions", completion_body(p, tokens)) for p in PROMPTS[:n_streams]])
    wall = max(s.last for s in out) - min(s.sent for s in out)
    short = sum(s.tokens < tokens for s in out)
    return sum(s.tokens for s in out) / wall, max(s.ttft for s in out), short


def ttft_under_load(port: int, tokens: int) -> tuple[float, int]:
    """Time to first token of a new request sent while 7 others stream (1 s after them: they are
    past their prompts and decoding), and how many of the 7 were still streaming when it came.
    They ask for 8x `tokens` (at 3x, before, zinc's streams could end by 1 s) with the 7 prompts that
    run that long."""
    background = [(0.0, "/v1/completions", completion_body(p, tokens * 8)) for p in LONG]
    *others, probe = streams(port, [*background, (1.0, "/v1/completions", completion_body(PROBE, 4))])
    return probe.ttft, sum(s.last > probe.first for s in others)


def history(seed: int) -> list[dict[str, str]]:
    words = ["river", "mountain", "lantern", "harbor", "orchard", "meadow", "glacier", "canyon", "village", "bridge", "tower", "garden", "forest", "desert", "island", "valley"]  # fmt: skip
    text = " ".join(words[(i * 7 + seed) % len(words)] for i in range(900))
    return [
        {"role": "system", "content": f"Session {seed:04d}. You are a helpful assistant."},
        {"role": "user", "content": f"Here are my notes: {text}. Summarize them."},
    ]


def session_follow_up(port: int, with_session: bool, seed: int) -> tuple[float, float, int, int]:
    """TTFT of a follow-up turn after a first turn (reused) and of the same follow-up sent cold."""
    extra = {"session_id": f"bench-{seed}"} if with_session else {}
    turn1 = history(seed)
    first = request(
        port, "/v1/chat/completions", {"messages": turn1, "max_tokens": 8, "temperature": 0, **extra}
    )
    follow = [
        *turn1,
        {"role": "assistant", "content": "Here is a summary."},
        {"role": "user", "content": "Thanks."},
    ]
    warm = request(
        port, "/v1/chat/completions", {"messages": follow, "max_tokens": 4, "temperature": 0, **extra}
    )
    cold_msgs = [
        {"role": "system", "content": f"Session {seed + 5000:04d}. You are a helpful assistant."},
        *follow[1:],
    ]
    cold = request(port, "/v1/chat/completions", {"messages": cold_msgs, "max_tokens": 4, "temperature": 0})
    del first
    return warm.ttft, cold.ttft, warm.cached, warm.prompt


class Server:
    def __init__(self, name: str, argv: list[str], port: int, ready: str) -> None:
        self.name, self.port = name, port
        say(f"starting {name}: {' '.join(argv)}")
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {self.proc.returncode}")
            try:
                conn = http.client.HTTPConnection(HOST, port, timeout=5)
                conn.request("GET", ready)
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{name} did not start")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def measure(server: Server, runs: int, tokens: int) -> dict[str, float]:
    port = server.port
    # warm up one stream and every batch size (a fresh server's first steps of each are slower);
    # the prompts share no page with the measured ones, so nothing measured comes from this
    completion(port, WARM_UP, tokens)
    streams(port, [(0.0, "/v1/completions", completion_body(f"{WARM_UP} ({i})", 8)) for i in range(8)])
    rows: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        rows.setdefault(key, []).append(value)

    for run in range(runs):
        say(f"{server.name}: run {run + 1}/{runs}")
        one = completion(port, PROMPTS[0], tokens)
        add("one_rate", one.rate)
        add("one_agg", one.tokens / (one.last - one.sent))
        add("one_ttft", one.ttft)
        short = int(one.tokens < tokens)
        for n in (4, 8):
            rate, worst, cut = concurrent(port, n, tokens)
            add(f"agg_{n}", rate)
            add(f"ttft_{n}", worst)
            short += cut
        add("short", float(short))
        add("idle_ttft", completion(port, PROBE, 4).ttft)
        load_ttft, running = ttft_under_load(port, tokens)
        add("load_ttft", load_ttft)
        add("load_running", float(running))
        warm, cold, cached, prompt_tokens = session_follow_up(port, server.name == "zinc", 10 * run + 1)
        add("follow_prompt", float(prompt_tokens))
        add("follow_warm", warm)
        add("follow_cold", cold)
        add("follow_cached", float(cached))
    return {k: statistics.median(v) for k, v in rows.items()}


def report(z: dict[str, float], ll: dict[str, float], runs: int, tokens: int) -> str:
    def row(label: str, key: str, fmt: str, target: str = "") -> str:
        def cell(d: dict[str, float]) -> str:  # prompt_tokens 0: the server sent no usage in its stream
            return "n/a" if key == "follow_prompt" and not d[key] else f"{d[key]:{fmt}}"

        return f"| {label} | {cell(z)} | {cell(ll)} | {target} |"

    for d in (z, ll):
        for n in (4, 8):
            d[f"r{n}"] = d[f"agg_{n}"] / d["one_agg"]
            d[f"d{n}"] = d[f"agg_{n}"] / d["one_rate"]
        d["load_x"] = d["load_ttft"] / d["idle_ttft"]
        d["follow_x"] = d["follow_warm"] / d["follow_cold"]
    lines = [
        "## Concurrent streams (continuous batching)",
        "",
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; SmolLM2-135M Q4_1, greedy, streaming "
        f"`/v1/completions` of {tokens} tokens; zinc `serve --parallel 8` and llama-cpp-python's server "
        f"(`n_threads` 2) one after the other in the same run, medians of {runs} runs.",
        "",
        "| | zinc | llama.cpp server | target |",
        "|---|---:|---:|---|",
        row("one stream: decode tok/s (first to last token)", "one_rate", ".1f"),
        row("one stream: aggregate tok/s (request sent to last token)", "one_agg", ".1f"),
        row("one stream: time to first token (s)", "one_ttft", ".3f"),
        row("4 streams: aggregate tok/s", "agg_4", ".1f"),
        row("4 streams: x one stream's aggregate", "r4", ".2f", ">= 3.2 (80% of 4x)"),
        row("... x one stream's decode rate", "d4", ".2f"),
        row("8 streams: aggregate tok/s", "agg_8", ".1f"),
        row("8 streams: x one stream's aggregate", "r8", ".2f", ">= 4"),
        row("... x one stream's decode rate", "d8", ".2f"),
        row("8 streams: worst time to first token (s)", "ttft_8", ".3f"),
        row("new request while 7 stream: time to first token (s)", "load_ttft", ".3f"),
        row("... streams of the 7 still streaming when it came", "load_running", ".0f", "7"),
        row("... x its idle value", "load_x", ".2f", "<= 2"),
        row("session follow-up (~1,000-token history): time to first token (s)", "follow_warm", ".3f"),
        row("the same follow-up cold (s)", "follow_cold", ".3f"),
        row("... ratio", "follow_x", ".2f", "<= 0.3"),
        row("follow-up prompt tokens", "follow_prompt", ".0f"),
        row("prompt tokens reused (`cached_tokens`)", "follow_cached", ".0f"),
        row(f"streams of 1 + 4 + 8 that ended before {tokens} tokens", "short", ".0f", "0"),
        "",
        "llama.cpp's Python server decodes one request at a time (the others wait in its queue; it runs with "
        "`--interrupt_requests false`, as its default ends a stream as soon as another request arrives) and its "
        "single slot reuses only the longest common prefix with the previous prompt (its follow-up row is the "
        "follow-up sent right after the first turn, without a session). zinc decodes every stream in one "
        "batched step, keeps whole pages of earlier prompts in its prefix cache and pins a session's pages "
        "between turns.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)  # 2 cores: these figures move by a third from minute to minute
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    model = default_model_path()
    venv = Path(sys.executable).parent
    results = {}
    port = free_port()
    zinc = Server("zinc", [str(venv / "zinc"), "serve", "-m", str(model), "--port", str(port), "--parallel", "8",
                         "--threads", "2"],
                  port, "/health")  # fmt: skip
    try:
        results["zinc"] = measure(zinc, args.runs, args.tokens)
    finally:
        zinc.stop()
    port = free_port()
    llama = Server("llama.cpp", [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--n_threads", "2",
                                 "--n_threads_batch", "2", "--n_ctx", "4096", "--port", str(port),
                                 "--interrupt_requests", "false"],
                   port, "/v1/models")  # fmt: skip
    try:
        results["llama"] = measure(llama, args.runs, args.tokens)
    finally:
        llama.stop()
    text = report(results["zinc"], results["llama"], args.runs, args.tokens)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
