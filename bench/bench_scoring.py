"""Prompt scoring (`echo` with `logprobs` on /v1/completions): zinc's engine against llama.cpp's
through llama-cpp-python, scoring as its OpenAI server's `create_completion(echo=True,
logprobs=...)` does (a model opened with `logits_all`: `eval`, then the log-softmax of every row).

Usage: .venv/bin/python bench/bench_scoring.py [--models smollm2 llama-3.2-1b] [--lengths 256 1024]
       [--runs 3] [--json .bench/scoring.json] [--out docs/PERFORMANCE.md] [--from-json FILE]
Each run is a fresh process per engine (zinc and llama.cpp alternating), 2 threads, with prompts
of each length that no earlier run scored; the figure is prompt tokens scored per second, the
median of the runs. zinc scores with decode steps of up to 8 positions (zinc.engine.scoring);
llama.cpp computes every position's logits in its prefill batches. On SmolLM2 (real weights) the
report also gives how far apart the two engines' logprobs are.
Imports: bench.bench (helpers, workers' plumbing), bench.report, fixtures.real_shapes, the stdlib.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent.parent))  # zinc and fixtures/; bench/ stays first
from report import publish

from bench import PROMPT_TEXT, THREADS, cpu_info, run_worker, say

TITLE = "## Prompt scoring"
CONTEXT = 2048
Json = dict[str, Any]


def worker_zinc(spec: Json) -> Json:
    from zinc.compiler.build import ensure_artifact
    from zinc.engine.engine import LocalEngine
    from zinc.model.gguf_file import open_gguf
    from zinc.runtime.device import resolve_device
    from zinc.runtime.session import ModelSession
    from zinc.tokenizer import ChatTemplate, Tokenizer

    gguf = Path(spec["gguf"])
    device = resolve_device("cpu", "local-task", threads=THREADS)
    session = ModelSession(ensure_artifact(gguf, "cpu"), gguf, device, context_length=CONTEXT)
    meta = open_gguf(gguf).metadata
    tokenizer = Tokenizer.from_metadata(meta)
    engine = LocalEngine(session, tokenizer, ChatTemplate.from_metadata(meta, tokenizer), "bench")

    async def score() -> Json:
        await engine.prompt_logprobs(spec["warmup"], 1)
        out: Json = {}
        for name, ids in spec["prompts"].items():
            t0 = time.perf_counter()
            scored = await engine.prompt_logprobs(ids, 1)
            out[name] = {"s": time.perf_counter() - t0, "logprobs": [t.logprob for t in scored.rest]}
        return out

    try:
        return asyncio.run(score())
    finally:
        engine.close()


def worker_llama(spec: Json) -> Json:
    """llama-cpp-python's scoring, as its `create_completion(echo=True, logprobs=...)` does it
    (which fails on token-id prompts in 0.3.36): `eval` with every position's logits kept, then
    `Llama.logits_to_logprobs` over them."""
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=spec["gguf"], n_threads=THREADS, n_threads_batch=THREADS, n_ctx=CONTEXT, n_batch=512,
        logits_all=True, verbose=False,
    )  # fmt: skip

    def score(ids: list[int]) -> list[float]:
        llm.reset()  # type: ignore[no-untyped-call]
        llm.eval(ids)
        rows = llama_cpp.Llama.logits_to_logprobs(llm.scores[: len(ids) - 1])
        return [float(rows[p, ids[p + 1]]) for p in range(len(ids) - 1)]

    score(spec["warmup"])
    out: Json = {}
    for name, ids in spec["prompts"].items():
        t0 = time.perf_counter()
        logprobs = score(ids)
        out[name] = {"s": time.perf_counter() - t0, "logprobs": logprobs}
    return out


def prompts(gguf: Path, lengths: list[int], run: int) -> dict[str, list[int]]:
    """A prompt of each length, led by a number of this run's (no run scores another's tokens)."""
    from zinc.model.gguf_file import open_gguf
    from zinc.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(open_gguf(gguf).metadata)
    out = {}
    for n in lengths:
        text = f"{(run * 10 + n) * 7919} {PROMPT_TEXT}"
        ids = tok.encode(text)
        while len(ids) < n:
            text += PROMPT_TEXT
            ids = tok.encode(text)
        out[str(n)] = ids[:n]
    return out


def model_path(name: str) -> Path:
    if name == "smollm2":
        from zinc.model.gguf_file import default_model_path

        return default_model_path()
    from fixtures.real_shapes import ensure_model

    return ensure_model(name, "Q4_0")


def run(models: list[str], lengths: list[int], runs: int) -> Json:
    data: Json = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "cpu": cpu_info().get("model", ""),
                  "runs": runs, "models": {}}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            gguf = model_path(name)
            rows: Json = {"zinc": [], "llama.cpp": []}
            for r in range(runs):
                spec = {
                    "gguf": str(gguf),
                    "prompts": prompts(gguf, lengths, r + 1),
                    "warmup": prompts(gguf, [32], 0)["32"],
                }
                for who, kind in (("zinc", "zinc"), ("llama.cpp", "llama")):
                    result = run_worker(kind, spec, Path(tmp), dict(os.environ), Path(__file__))
                    rows[who].append(result)
                    say(f"{name} run {r + 1} {who}: " + ", ".join(f"{k} {len(spec['prompts'][k]) / v['s']:.0f} tok/s"
                                                                  for k, v in result.items() if k in spec["prompts"]))  # fmt: skip
            data["models"][name] = {"lengths": lengths, **rows}
    return data


def section(data: Json) -> str:
    lines = [
        TITLE, "",
        f"`bench/bench_scoring.py`, {data['date']}, {data['cpu'] or 'this host'}, {THREADS} threads, a fresh "
        f"process per engine and run, medians of {data['runs']} runs: prompt tokens scored per second for "
        "`echo` with `logprobs` (each token's logprob after the ones before it). zinc scores with decode steps "
        "of up to 8 positions over the stored prompt; llama.cpp (llama-cpp-python with `logits_all`, as its "
        "`create_completion` scores) takes every position's logits from its prefill batches, then their "
        "log-softmax in numpy. The last column: the median and largest difference between the two "
        "engines' logprobs, on SmolLM2's real weights.", "",
        "| model | prompt tokens | zinc tok/s | llama.cpp tok/s | ratio | median / max abs logprob difference |",
        "|---|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for name, m in data["models"].items():
        for n in m["lengths"]:
            key = str(n)
            z = statistics.median(n / r[key]["s"] for r in m["zinc"])
            ll = statistics.median(n / r[key]["s"] for r in m["llama.cpp"])
            diff = "n/a (random weights)"
            if name == "smollm2":
                d = [
                    abs(a - b)
                    for a, b in zip(
                        m["zinc"][0][key]["logprobs"], m["llama.cpp"][0][key]["logprobs"], strict=True
                    )
                ]
                diff = f"{statistics.median(d):.3f} / {max(d):.2f}"
            lines.append(f"| {name} | {n:,} | {z:,.0f} | {ll:,.0f} | {z / ll:.2f}x | {diff} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        spec = json.loads(Path(sys.argv[4]).read_text())
        result = worker_zinc(spec) if sys.argv[2] == "zinc" else worker_llama(spec)
        Path(spec["result"]).write_text(json.dumps(result))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["smollm2", "llama-3.2-1b"])
    ap.add_argument("--lengths", nargs="+", type=int, default=[256, 1024])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--from-json", type=Path, default=None, help="render this earlier run instead")
    args = ap.parse_args()
    data = (
        json.loads(args.from_json.read_text())
        if args.from_json
        else run(args.models, args.lengths, args.runs)
    )
    publish(data, section(data), TITLE, args.json, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
