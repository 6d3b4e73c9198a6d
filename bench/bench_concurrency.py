"""Concurrent streams: zinc's continuous batching beside llama.cpp's server, same model, same run.

Usage: .venv/bin/python bench/bench_concurrency.py [--runs R] [--tokens N] [--out FILE.md]
(llama.cpp's server needs `pip install 'llama-cpp-python[server]'` or fastapi, uvicorn,
sse-starlette, starlette-context and pydantic-settings next to llama-cpp-python; the benchmark
only, never CI.)

Starts `zinc serve --parallel 8` and then `python -m llama_cpp.server` (2 threads,
`--interrupt_requests false`: by default it ends a running stream when another request comes) as
subprocesses on loopback, each with the bundled SmolLM2 Q4_1, and measures with streaming
`/v1/completions` requests (greedy, raw sockets in threads):
1. one stream: decode tokens/s (first to last token), aggregate tokens/s (all its tokens / the
   time from sending the request to its last token) and time to first token;
2. 4 and 8 concurrent streams: aggregate tokens/s (all tokens / wall time from the first request
   sent to the last stream done), as a ratio to one stream's aggregate (the same measure: both
   count the prompts and the first tokens' wait) and to its decode rate (which counts neither),
   and the worst time to first token;
3. time to first token of a new request while 7 others stream, against its idle value;
4. a chat follow-up turn over a ~1,000-token history: with `session_id` (zinc) after the first turn,
   against the same follow-up sent cold (its first message differs, so nothing is reused).
Medians of --runs runs; progress on stderr, markdown on stdout and --out.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

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


def request(port: int, path: str, body: dict[str, Any]) -> Stream:
    """One streaming request; tokens counted from usage when the server sends it, else by chunks."""
    out = Stream()
    conn = http.client.HTTPConnection(HOST, port, timeout=REQUEST_TIMEOUT_S)
    payload = json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}})
    out.sent = time.perf_counter()
    conn.request("POST", path, payload, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"{path}: HTTP {resp.status}: {resp.read()[:200]!r}")
    chunks = 0
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        data = json.loads(line[6:])
        if data.get("usage"):
            out.tokens = data["usage"]["completion_tokens"]
            out.prompt = data["usage"].get("prompt_tokens") or 0
            out.cached = (data["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        for choice in data.get("choices") or []:
            out.finish = choice.get("finish_reason") or out.finish
            piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            if piece:
                now = time.perf_counter()
                out.first = out.first or now
                out.last = now
                chunks += 1
    conn.close()
    if not out.finish:
        raise RuntimeError(f"{path}: the stream ended without a finish_reason (the server cut it short)")
    out.tokens = out.tokens or chunks
    return out


def completion(port: int, prompt: str, n: int) -> Stream:
    return request(port, "/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0})


def in_threads(jobs: Sequence[Callable[[], Stream]]) -> list[Stream]:
    results: list[Stream | BaseException] = [RuntimeError("not run")] * len(jobs)

    def run(i: int) -> None:
        try:
            results[i] = jobs[i]()
        except BaseException as exc:  # reported below
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(REQUEST_TIMEOUT_S)
    for r in results:
        if isinstance(r, BaseException):
            raise RuntimeError(f"a concurrent request failed: {r}")
    return [r for r in results if isinstance(r, Stream)]


def concurrent(port: int, n_streams: int, tokens: int) -> tuple[float, float, int]:
    """Aggregate tokens/s, worst time to first token and how many streams ended before `tokens`
    of `n_streams` streams sent at once."""
    streams = in_threads([partial(completion, port, p, tokens) for p in PROMPTS[:n_streams]])
    wall = max(s.last for s in streams) - min(s.sent for s in streams)
    short = sum(s.tokens < tokens for s in streams)
    return sum(s.tokens for s in streams) / wall, max(s.ttft for s in streams), short


def ttft_under_load(port: int, tokens: int) -> float:
    """Time to first token of a new request while 7 others stream."""
    started = threading.Barrier(8, timeout=REQUEST_TIMEOUT_S)
    result: list[float] = []

    def background(prompt: str) -> Stream:
        return completion(port, prompt, tokens * 3)

    def probe() -> Stream:
        started.wait()
        time.sleep(1.0)  # the others are past their prompts and decoding
        s = completion(port, PROBE, 4)
        result.append(s.ttft)
        return s

    def waiting(prompt: str) -> Stream:
        started.wait()
        return background(prompt)

    in_threads([*(partial(waiting, p) for p in PROMPTS[:7]), probe])
    return result[0]


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
    in_threads([partial(completion, port, f"{WARM_UP} ({i})", 8) for i in range(8)])
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
        add("load_ttft", ttft_under_load(port, tokens))
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
