"""Concurrent streams: zinc's continuous batching beside llama.cpp's server, same model, same run.

Usage: .venv/bin/python bench/bench_concurrency.py [--runs R] [--tokens N] [--model GGUF]
       [--llama-server BIN] [--out FILE.md]
(llama.cpp's Python server needs `pip install 'llama-cpp-python[server]'` or fastapi, uvicorn,
sse-starlette, starlette-context and pydantic-settings next to llama-cpp-python; the benchmark
only, never CI.)

Starts `zinc serve --parallel 8` and then `python -m llama_cpp.server` (2 threads,
`--interrupt_requests false`: by default it ends a running stream when another request comes), or
with --llama-server llama.cpp's own `llama-server -np 8 -t 2` (loopback.llama_server_argv), as
subprocesses on loopback, each with the bundled SmolLM2 Q4_1 (or --model), and measures with
streaming `/v1/completions` requests (greedy; raw sockets, all read by one thread):
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
import os
import platform
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from loopback import (
    CONTEXT,
    THREADS,
    Server,
    completion,
    completion_body,
    free_port,
    llama_server_argv,
    request,
    say,
    streams,
    zinc_argv,
)

from zinc.model.gguf_file import default_model_path

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


def report(z: dict[str, float], ll: dict[str, float], runs: int, tokens: int, model: str, llama: str) -> str:
    """The markdown section; `llama` is "python" (llama-cpp-python's server) or "server" (llama-server)."""
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
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; {model}, greedy, streaming "
        f"`/v1/completions` of {tokens} tokens; zinc `serve --parallel 8` and "
        + ("llama-cpp-python's server (`n_threads` 2)" if llama == "python" else
           f"llama.cpp's `llama-server -np 8 -t 2` ({CONTEXT} tokens a slot)")
        + f" one after the other in the same run, medians of {runs} runs.",
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
        (
            "llama.cpp's Python server decodes one request at a time (the others wait in its queue; it runs with "
            "`--interrupt_requests false`, as its default ends a stream as soon as another request arrives) and "
            "its single slot reuses only the longest common prefix with the previous prompt (its follow-up row is "
            "the follow-up sent right after the first turn, without a session)."
            if llama == "python"
            else "llama-server decodes its 8 slots' streams in one batch too, and sends a request to the slot whose "
            "cached prompt is most like its own, which reuses their common prefix (it has no sessions: its "
            "follow-up row is the follow-up sent right after the first turn)."
        )
        + " zinc decodes every stream in one batched step, keeps whole pages of earlier prompts in its prefix "
        "cache and pins a session's pages between turns.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)  # 2 cores: these figures move by a third from minute to minute
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--model", type=Path, help="GGUF for both servers (default: the bundled SmolLM2)")
    ap.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server binary, in place of llama-cpp-python")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    model = args.model or default_model_path()
    results = {}
    port = free_port()
    with Server("zinc", zinc_argv(model, port), port, "/health") as zinc:
        results["zinc"] = measure(zinc, args.runs, args.tokens)
    port = free_port()
    if args.llama_server:
        llama = Server("llama-server", llama_server_argv(args.llama_server, model, port), port, "/health")
    else:
        llama = Server("llama.cpp", [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--n_threads",
                                     str(THREADS), "--n_threads_batch", str(THREADS), "--n_ctx", "4096", "--port",
                                     str(port), "--interrupt_requests", "false"],
                       port, "/v1/models")  # fmt: skip
    with llama:
        results["llama"] = measure(llama, args.runs, args.tokens)
    kind = "server" if args.llama_server else "python"
    text = report(results["zinc"], results["llama"], args.runs, args.tokens, model.name, kind)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
