"""N concurrent streams: `zinc serve --parallel N` beside llama.cpp's own `llama-server -np N`, same model.

Usage: .venv/bin/python bench/bench_streams.py --model GGUF [--llama-server BIN] [--streams 8]
       [--tokens 64] [--runs 3] [--context 2048]
(bench_sizes.py calls `compare` for each real-shape model; this CLI prints its medians.)

Each server runs alone on loopback (zinc first, then llama-server), with 2 threads and N slots of
--context tokens each (llama-server's -c is N times that, `--cache-reuse 0`;
loopback.zinc_argv and llama_server_argv), is waited for on /health, warmed up (one stream of
--tokens, then N short ones at once) and measured --runs times with streaming `/v1/completions`
(greedy, `max_tokens` --tokens, read by loopback's one-thread client):
- one stream: its tokens / the time from sending the request to its last token;
- N streams sent at once: all their tokens / the time from the first request sent to the last
  token (the aggregate; prompts and the wait for the first tokens count, as for one stream).
Every measured prompt starts with its own number, so no two share a prefix past the BOS token
and no server reuses a cached prompt. Tokens are counted from the streams' usage. The real-shape
models have random weights: llama-server is sent `ignore_eos: true` so that it never ends a
stream early; zinc has no such field (it ignores fields it does not know), so a stream it ends
at an end token counts only the tokens it made, and the `short` count shows it (0 expected).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from loopback import CONTEXT, Server, completion_body, free_port, llama_server_argv, say, streams, zinc_argv

Json = dict[str, Any]
PATH = "/v1/completions"
TEXTS = [
    "Explain how bees make honey, from flower to jar.",
    "List the planets of the solar system and describe each one in detail.",
    "Write a long story about a dragon who learns to cook.",
    "Explain how a computer works, step by step, from the transistor up.",
    "Describe the history of Rome from its founding to the fall of the empire.",
    "Write a recipe for bread with every step explained.",
    "Explain the rules of chess to a beginner, piece by piece.",
    "Describe a walk through a forest in autumn, in great detail.",
]


def prompt(run: int, i: int, n_streams: int) -> str:
    """The `i`th prompt of run `run`, led by a number of its own (3 digits up to 100 runs of 8)."""
    return f"{101 + run * (n_streams + 1) + i} {TEXTS[i % len(TEXTS)]}"


def measure(server: Server, n_streams: int, tokens: int, runs: int, extra: Json) -> list[Json]:
    """Per run: one stream's and `n_streams` streams' aggregate tok/s, their worst time to first
    token and how many of the 1 + `n_streams` streams ended before `tokens`."""

    def body(text: str, n: int) -> Json:
        return {**completion_body(text, n), **extra}

    port = server.port
    # a fresh server's first steps of each batch size are slower; the warm-up prompts share
    # no prefix with the measured ones
    streams(port, [(0.0, PATH, body("Warm-up. Hello, how are you today?", tokens))])
    streams(port, [(0.0, PATH, body(f"Warm-up {i}. Hello, how are you today?", 8)) for i in range(n_streams)])
    rows = []
    for run in range(runs):
        (one,) = streams(port, [(0.0, PATH, body(prompt(run, n_streams, n_streams), tokens))])
        many = streams(port, [(0.0, PATH, body(prompt(run, i, n_streams), tokens)) for i in range(n_streams)])
        wall = max(s.last for s in many) - min(s.sent for s in many)
        row = {"one": one.tokens / (one.last - one.sent), "agg": sum(s.tokens for s in many) / wall,
               "ttft": max(s.ttft for s in many), "short": sum(s.tokens < tokens for s in (one, *many))}  # fmt: skip
        say(f"  {server.name} run {run + 1}/{runs}: 1 stream {row['one']:.2f} tok/s, {n_streams} streams "
            f"{row['agg']:.2f} tok/s, worst TTFT {row['ttft']:.2f} s, short {row['short']}")  # fmt: skip
        rows.append(row)
    return rows


def compare(
    model: Path,
    llama_server: Path | None,
    n_streams: int = 8,
    tokens: int = 64,
    runs: int = 3,
    context: int = CONTEXT,
    env: dict[str, str] | None = None,
) -> Json:
    """zinc's and llama-server's per-run rows (`measure`) on `model`, zinc first (`env`: zinc's
    environment, e.g. its ZINC_CACHE); llama-server's rows are empty without `llama_server`."""
    out: Json = {"streams": n_streams, "tokens": tokens, "context": context, "zinc": [], "llama": []}
    port = free_port()
    with Server("zinc", zinc_argv(model, port, n_streams, context), port, "/health", env) as server:
        out["zinc"] = measure(server, n_streams, tokens, runs, {})
    if llama_server is not None:
        port = free_port()
        argv = llama_server_argv(llama_server, model, port, n_streams, context)
        with Server("llama-server", argv, port, "/health") as server:
            out["llama"] = measure(server, n_streams, tokens, runs, {"ignore_eos": True})
    return out


def medians(rows: list[Json]) -> Json:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]} if rows else {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server binary (none: zinc only)")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--context", type=int, default=CONTEXT, help="tokens a slot")
    args = ap.parse_args()
    out = compare(args.model, args.llama_server, args.streams, args.tokens, args.runs, args.context)
    z, ll = medians(out["zinc"]), medians(out["llama"])
    ratio = f"{z['agg'] / ll['agg']:.2f}x" if ll else "-"
    print(json.dumps({**out, "median": {"zinc": z, "llama": ll}}, indent=1))
    print(f"{args.streams} streams aggregate tok/s: zinc {z['agg']:.2f}, llama-server {ll.get('agg', 0):.2f}, "
          f"ratio {ratio}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
