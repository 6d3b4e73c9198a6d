"""A short request behind a long prompt (issue 36, "interactive under long prompts"), on the
real-shape models: the time to first token of a short completion sent 0.15 s after a long prompt,
against the same kind of request on an idle server, and the time of one prefill chunk (an idle
~100-token prompt's first token: about one 128-token chunk). zinc's scheduler prefills the long prompt in chunks and puts the
short prompt in at the next step, so its target is twice the idle time plus one chunk; llama.cpp's
server (with `--llama-server`) finishes the long prompt's batch first.

Usage: .venv/bin/python bench/bench_interactive.py [--models llama-3.2-1b llama-3.1-8b] [--long 1024]
       [--runs 3] [--llama-server .bench/llama.cpp/build/bin/llama-server] [--json .bench/interactive.json]
       [--out docs/PERFORMANCE.md] [--from-json FILE ...]  (render earlier runs' JSON, models merged)
Every prompt starts with a number of its own (no cached prefix answers it); greedy, 2 threads,
the servers one after the other. Prints the markdown section (`--out` puts it in place of the
report's own, above its Notes); --json keeps the raw figures.
Imports: bench.loopback (the servers and the streaming client), bench.bench (PROMPT_TEXT, cpu_info),
bench.report (replace_section), fixtures.real_shapes (ensure_model), the stdlib.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent.parent))  # fixtures/; bench/ stays first
from loopback import Server, free_port, llama_server_argv, say, streams, zinc_argv
from report import publish

from bench import PROMPT_TEXT, cpu_info

TITLE = "## Short requests behind long prompts"
DELAY_S = 0.15  # the short request follows the long one by this much
CHUNK = 128  # zinc serve's default --prefill-chunk
SHORT_TOKENS = 8
_serial = itertools.count(1)


def prompt(words: int) -> str:
    """About `words` words of English, led by a number of its own."""
    text = (PROMPT_TEXT + " ") * (words // len(PROMPT_TEXT.split()) + 1)
    return f"{next(_serial) * 7919} " + " ".join(text.split()[:words])


def body(text: str, n: int) -> dict[str, Any]:
    return {"prompt": text, "max_tokens": n, "temperature": 0}


def measure(port: int, long_words: int, runs: int) -> dict[str, Any]:
    """Idle short TTFT, one chunk's TTFT, and the short TTFT behind a long prompt, `runs` each."""
    idle, chunk, behind, long_tokens = [], [], [], 0
    for _ in range(runs):
        idle.append(streams(port, [(0.0, "/v1/completions", body(prompt(12), SHORT_TOKENS))])[0].ttft)
        chunk.append(streams(port, [(0.0, "/v1/completions", body(prompt(CHUNK * 3 // 4), 1))])[0].ttft)
        long, short = streams(port, [
            (0.0, "/v1/completions", body(prompt(long_words), 1)),
            (DELAY_S, "/v1/completions", body(prompt(12), SHORT_TOKENS)),
        ])  # fmt: skip
        behind.append(short.ttft)
        long_tokens = long.prompt
        say(f"  idle {idle[-1]:.2f} s, chunk {chunk[-1]:.2f} s, behind {long.prompt} tokens {short.ttft:.2f} s")
    return {"idle_s": idle, "chunk_s": chunk, "behind_s": behind, "long_tokens": long_tokens}


def run(models: list[str], long_words: int, runs: int, llama: Path | None) -> dict[str, Any]:
    from fixtures.real_shapes import ensure_model

    out: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "cpu": cpu_info().get("model", ""),
        "delay_s": DELAY_S, "runs": runs, "llama_server": str(llama) if llama else None, "models": {},
    }
    for name in models:
        gguf = ensure_model(name, "Q4_0")
        servers: list[tuple[str, Callable[[int], list[str]]]] = [("zinc", lambda p, g=gguf: zinc_argv(g, p))]
        if llama is not None:
            servers.append(("llama-server", lambda p, g=gguf: llama_server_argv(llama, g, p)))
        out["models"][name] = {}
        for who, argv in servers:
            port = free_port()
            with Server(f"{who} {name}", argv(port), port, "/health"):
                streams(port, [(0.0, "/v1/completions", body(prompt(CHUNK), 4))])  # warm-up
                out["models"][name][who] = measure(port, long_words, runs)
    return out


def section(data: dict[str, Any]) -> str:
    """The report's section: what was measured, and a row per model and server."""

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    rows = [
        TITLE, "",
        f"`bench/bench_interactive.py`, {data['date']}, {data['cpu'] or 'this host'}, 2 threads, each server alone, "
        f"medians of {data['runs']} runs: the time to first token of a short completion sent {data['delay_s']} s "
        "after a long prompt, beside the same request on an idle server and one prefill chunk's time (a "
        "~100-token prompt's first token). zinc prefills the long prompt in 128-token chunks and puts the short "
        "one in at the next step; llama-server answers it once the long prompt's batch is done. Target (issue "
        "36): twice the idle time plus one chunk.", "",
        "| model | server | long prompt tokens | idle TTFT s | one chunk s | TTFT behind the long prompt s | target s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for name, servers in data["models"].items():
        for who, r in servers.items():
            target = 2 * med(r["idle_s"]) + med(r["chunk_s"])
            rows.append(
                f"| {name} Q4_0 | {who} | {r['long_tokens']:,} | {med(r['idle_s']):.2f} | {med(r['chunk_s']):.2f} | "
                f"{med(r['behind_s']):.2f} | {target:.2f} |"
            )
    return "\n".join(rows) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["llama-3.2-1b", "llama-3.1-8b"])
    ap.add_argument("--long", type=int, default=1024, help="words in the long prompt (about as many tokens)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--llama-server", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help="the report to put the section in")
    ap.add_argument("--from-json", type=Path, nargs="+", default=None, help="render these runs instead")
    args = ap.parse_args()
    if args.from_json:
        runs = [json.loads(f.read_text()) for f in args.from_json]
        data = {**runs[-1], "models": {k: v for r in runs for k, v in r["models"].items()}}
    else:
        data = run(args.models, args.long, args.runs, args.llama_server)
    publish(data, section(data), TITLE, args.json, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
