"""zinc vs llama.cpp at the sizes people run: real-shape models (fixtures/real_shapes.py), CPU, 2 threads.

Usage: .venv/bin/python bench/bench_sizes.py [--models llama-3.2-1b,llama-3.1-8b] [--quant Q4_0]
       [--runs 3] [--llama-bin DIR] [--streams 8] [--stream-tokens 64] [--long-model NAME|'']
       [--out docs/PERFORMANCE.md] [--title '## Sizes']

For each model: zinc's first compile into an empty cache (time, peak memory, artifact size), then
runs of zinc's engine (bench.py's zinc worker: cold start, prefill of a 512-token prompt, greedy
decode after a 128-token prompt, peak resident memory) alternating with llama.cpp's own
`llama-bench` (`-p 512 -t 2`, then `-n N -d 128`: its decode with as many positions cached as
zinc's; built from the newest source: `scripts/bench-sizes` builds it; its peak memory from wait4). The
report gives medians, the ratios, and the decode ceiling: the host's read bandwidth over the bytes
a token reads (every weight but the embedding table, which a token reads one row of). The host's
bandwidth drifts (30-50 GB/s within minutes here), so it is measured again before each run, and
the ceiling is at the median of those measurements. zinc's decode steps are chained as `zinc serve`
runs them (each enqueued before the token of the one before is read: bench.greedy_run). Then, with
--streams N (8 by default; 0: none), `zinc serve --parallel N` and llama.cpp's own `llama-server
-np N` (the same build) one after the other: one stream's and N concurrent streams' aggregate
tok/s, --runs runs each (bench_streams.py, which says how). It replaces
the "Sizes" section of the report (above its Notes) and writes docs/sizes.svg, tok/s against
model size; with another --title (scripts/bench-sizes: "## Other model families", Gemma 3 and
Qwen 2.5 at 1-1.5B) it replaces that section instead, without the plot.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent.parent))  # fixtures/; bench.py stays first
from bench_streams import compare
from report import replace_section

from bench import THREADS, cpu_info, greedy_run, make_prompts, measure_bandwidth, run_worker, say

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Sizes"
PROMPT = 512
Json = dict[str, Any]


def bytes_per_token(gguf_path: Path) -> int:
    """Bytes of weights one decode step reads: all tensors but the token embedding table, unless
    it is also the output head (tied)."""
    from zinc.model.gguf_file import open_gguf

    tensors = open_gguf(gguf_path).tensors
    tied = "output.weight" not in tensors
    return sum(t.n_bytes for name, t in tensors.items() if tied or name != "token_embd.weight")


def llama_bench(binary: Path, gguf: Path, n_decode: int, prompt: int = PROMPT, depth: int = 0) -> Json:
    """One `llama-bench` run (prefill of `prompt` tokens, `n_decode` generated after `depth`
    cached positions), with its peak RSS."""
    cmd = [str(binary), "-m", str(gguf), "-t", str(THREADS), "-p", str(prompt), "-n", str(n_decode),
           "-d", str(depth), "-r", "1", "-o", "json"]  # fmt: skip
    with tempfile.TemporaryFile("w+") as fout, tempfile.TemporaryFile("w+") as ferr:
        proc = subprocess.Popen(cmd, stdout=fout, stderr=ferr)
        _, status, usage = os.wait4(proc.pid, 0)  # reaped here, so its own rusage is read
        code = os.waitstatus_to_exitcode(status)
        fout.seek(0)
        ferr.seek(0)
        out, err = fout.read(), ferr.read()
    if code != 0:
        raise RuntimeError(f"llama-bench failed ({code}): {err[-2000:]}")
    rows = json.loads(out)
    rate = {("prefill" if r["n_prompt"] else "decode"): float(r["avg_ts"]) for r in rows}
    return {**rate, "build": rows[0].get("build_commit"), "maxrss_mib": usage.ru_maxrss / 1024}


def llama_pair(binary: Path, gguf: Path, n_decode: int, depth: int, prompt: int = PROMPT) -> Json:
    """llama-bench's prefill of a `prompt`-token prompt into an empty cache, then its decode with
    `depth` positions cached: the context zinc decodes at (bench.py's worker decodes after its
    `decode_prompt`). At depth 0 llama.cpp decodes with an empty cache, 2-7% faster at 1B than
    after 128 positions, which would set zinc against an easier run than its own."""
    pre = llama_bench(binary, gguf, 0, prompt=prompt)
    dec = llama_bench(binary, gguf, n_decode, prompt=0, depth=depth)
    return {**pre, "decode": dec["decode"], "maxrss_mib": max(pre["maxrss_mib"], dec["maxrss_mib"])}


def worker_long(spec: Json) -> Json:
    """zinc's engine at a long context: a warm-up, a timed prefill of a LONG-token prompt, then
    greedy decode with those positions cached (run in its own process, as bench.py's workers)."""
    from zinc.compiler.build import ensure_artifact
    from zinc.runtime.device import resolve_device
    from zinc.runtime.session import ModelSession

    gguf, n_decode, ids = Path(spec["gguf"]), int(spec["decode_tokens"]), list(spec["prompt"])
    artifact = ensure_artifact(gguf, "cpu", cache_dir=Path(spec["cache_dir"]))
    device = resolve_device("cpu", "local-task", threads=THREADS)
    session = ModelSession(artifact, gguf, device, context_length=int(spec["context"]))
    tok = session.prefill(ids[:64]).token  # warm-up: each entry point's first call pays one-time costs
    for i in range(4):
        tok = session.decode(tok, 64 + i).token
    prefill_s, _, decode_s = greedy_run(session, ids, n_decode)
    return {"prefill": len(ids) / prefill_s, "decode": n_decode / decode_s}


def bench_long(name: str, quant: str, runs: int, n_decode: int, llama_bin: Path | None, long: int) -> Json:
    """Prefill of a `long`-token prompt, and decode with `long` positions cached, both engines."""
    from fixtures.real_shapes import ensure_model

    gguf = ensure_model(name, quant)
    prompt = make_prompts(gguf, [long])[long]
    out: Json = {"model": name, "quant": quant, "tokens": long, "zinc": [], "llama": []}
    with tempfile.TemporaryDirectory(prefix="zinc-long-") as tmp_name:
        tmp = Path(tmp_name)
        spec = {"gguf": str(gguf), "prompt": prompt, "decode_tokens": n_decode, "context": 2 * long,
                "cache_dir": str(tmp / "cache")}  # fmt: skip
        for i in range(runs):
            for kind in ("zinc", "llama") if i % 2 == 0 else ("llama", "zinc"):
                if kind == "llama" and llama_bin is None:
                    continue
                if kind == "zinc":
                    row = run_worker("long", spec, tmp, dict(os.environ), script=Path(__file__).resolve())
                else:
                    assert llama_bin is not None
                    row = llama_pair(llama_bin / "llama-bench", gguf, n_decode, depth=long, prompt=long)
                out[kind].append(row)
                say(f"  long {i + 1} {kind}: prefill {long}: {row['prefill']:.1f} tok/s, "
                    f"decode at {long}: {row['decode']:.2f} tok/s")  # fmt: skip
    return out


def bench_model(
    name: str, quant: str, runs: int, n_decode: int, llama_bin: Path | None, bw: float, streams: int, stream_tokens: int
) -> Json:
    """Compile, then `runs` of zinc's engine alternating with llama-bench; then, with `streams`,
    `zinc serve` and `llama-server` with that many concurrent streams (bench_streams.compare; zinc
    reads the artifact compiled here)."""
    from fixtures.real_shapes import ensure_model

    gguf = ensure_model(name, quant)
    prompts = make_prompts(gguf, [PROMPT, 128, 16])
    spec: Json = {
        "gguf": str(gguf), "threads": THREADS, "driver": "local-task", "prompts": {str(PROMPT): prompts[PROMPT]},
        "decode_prompt": prompts[128], "cold_ids": prompts[16], "decode_tokens": n_decode, "constrained_tokens": 0,
    }  # fmt: skip
    per_token = bytes_per_token(gguf)
    out: Json = {"model": name, "quant": quant, "file_bytes": gguf.stat().st_size, "bytes_per_token": per_token,
                 "ceiling_tok_s": bw / per_token, "zinc": [], "llama": []}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="zinc-sizes-") as tmp_name:
        tmp = Path(tmp_name)
        env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
        say(f"{name} {quant}: compiling into an empty cache")
        out["compile"] = run_worker("compile", {**spec, "cache_dir": str(tmp / "cache")}, tmp, env)
        say(f"  compiled in {out['compile']['total_s']:.1f} s, peak {out['compile']['vmhwm_mib']:.0f} MiB")
        for i in range(runs):
            for kind in ("zinc", "llama") if i % 2 == 0 else ("llama", "zinc"):
                if kind == "llama" and llama_bin is None:
                    continue
                run_bw = measure_bandwidth(repeats=3)[f"gbps_{THREADS}t"]
                if kind == "zinc":
                    r = run_worker("zinc", {**spec, "cache_dir": str(tmp / "cache")}, tmp, env)
                    row = {"prefill": PROMPT / r["prefill_s"][str(PROMPT)], "decode": n_decode / r["decode_s"],
                           "cold_s": r["cold"]["total_s"], "maxrss_mib": r["vmhwm_mib"]}  # fmt: skip
                else:
                    assert llama_bin is not None
                    row = llama_pair(llama_bin / "llama-bench", gguf, n_decode, len(prompts[128]))
                row["bw_gbps"] = run_bw
                out[kind].append(row)
                say(f"  run {i + 1} {kind}: prefill {row['prefill']:.1f} tok/s, decode {row['decode']:.2f} tok/s, "
                    f"peak {row['maxrss_mib']:.0f} MiB, bandwidth {run_bw:.1f} GB/s")  # fmt: skip
        if streams:
            server = llama_bin / "llama-server" if llama_bin is not None else None
            if server is not None and not server.exists():
                say(f"no llama-server in {llama_bin} (scripts/bench-sizes builds it): streams of zinc only")
                server = None
            env = {**env, "ZINC_CACHE": str(tmp / "cache")}
            out["streams"] = compare(gguf, server, streams, stream_tokens, runs, env=env)
    return out


def med(rows: list[Json], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def ceiling(m: Json) -> float:
    """tok/s at the median of the bandwidths measured before the runs (the report's one figure
    where no run has its own)."""
    bws = [r["bw_gbps"] for r in m["zinc"] + m["llama"] if r.get("bw_gbps")]
    return statistics.median(bws) * 1e9 / m["bytes_per_token"] if bws else float(m["ceiling_tok_s"])


def render(data: Json, title: str = SECTION) -> str:
    def f(x: float | None, d: int = 1) -> str:
        return "-" if x is None else f"{x:.{d}f}"

    def r(a: float | None, b: float | None, lower: bool = False) -> str:
        if a is None or b is None or not a or not b:
            return "-"
        return f"{(b / a if lower else a / b):.2f}x"

    lines = [
        title, "",
        f"Real-shape models (fixtures/real_shapes.py: real releases' shapes and quant mixes, seeded random weights), "
        f"{data['date']}, {data['cpu'].get('model', 'CPU')}, {THREADS} threads for both, medians of {data['runs']} "
        f"runs alternating zinc and llama.cpp (`llama-bench` {data.get('llama_build') or '-'}). Ratios are zinc over "
        "llama.cpp (memory: llama.cpp over zinc, so above 1 is better for zinc everywhere). Both decode after "
        "128 cached positions (llama-bench `-d 128`). zinc's decode steps run "
        "chained, as `zinc serve` runs them (each enqueued before the one before it is read). The ceiling is the read "
        f"bandwidth ({THREADS} threads, numpy's sum or max, the faster, best of 3) over the bytes a token reads; the host's bandwidth "
        f"drifts ({data['bandwidth_gbps']:.1f} GB/s at the start of this run), so it is measured before each of "
        "the runs, zinc's and llama.cpp's, and the ceiling is at the median of those measurements.",
        "",
        "| model | size | decode tok/s zinc | llama.cpp | ratio | ceiling | zinc / ceiling | llama.cpp / ceiling | "
        "prefill 512 zinc | llama.cpp | ratio | peak RSS MiB zinc | llama.cpp | ratio | compile s | compile peak MiB | "
        "cold start s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for m in data["models"]:
        z, ll = m["zinc"], m["llama"]
        zd, ld, zp, lp = med(z, "decode"), med(ll, "decode"), med(z, "prefill"), med(ll, "prefill")
        zm, lm = med(z, "maxrss_mib"), med(ll, "maxrss_mib")
        ceil = ceiling(m)
        lines.append(
            f"| {m['model']} {m['quant']} | {m['file_bytes'] / 1e9:.2f} GB | {f(zd, 2)} | {f(ld, 2)} | {r(zd, ld)} | "
            f"{f(ceil, 2)} | {f(100 * zd / ceil if zd else None, 0)}% | {f(100 * ld / ceil if ld else None, 0)}% | "
            f"{f(zp)} | {f(lp)} | {r(zp, lp)} | "
            f"{f(zm, 0)} | {f(lm, 0)} | {r(zm, lm, lower=True)} | {m['compile']['total_s']:.1f} | "
            f"{m['compile']['vmhwm_mib']:.0f} | {f(med(z, 'cold_s'), 2)} |"
        )
    for lg in data.get("long", []):
        z, ll = lg["zinc"], lg["llama"]
        zp, lp, zd, ld = med(z, "prefill"), med(ll, "prefill"), med(z, "decode"), med(ll, "decode")
        lines += [
            "",
            f"Long context, {lg['model']} {lg['quant']}: a {lg['tokens']}-token prompt, then decode with those "
            "positions cached (zinc's context twice the prompt).",
            "",
            "| | zinc tok/s | llama.cpp tok/s | ratio |",
            "|---|---:|---:|---:|",
            f"| prefill of {lg['tokens']} tokens | {f(zp)} | {f(lp)} | {r(zp, lp)} |",
            f"| decode at {lg['tokens']} cached | {f(zd, 2)} | {f(ld, 2)} | {r(zd, ld)} |",
        ]
    lines += streams_table(data["models"], data["runs"])
    if title == SECTION:  # the size sweep has the plot (docs/sizes.svg)
        lines += ["", "![decode and prefill tok/s against model size](sizes.svg)"]
    lines.append("")
    return "\n".join(lines)


def streams_table(models: list[Json], runs: int) -> list[str]:
    """Concurrent streams, zinc serve vs llama-server, for the models measured with them."""

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    def ratio(a: float | None, b: float | None) -> str:
        return "-" if not a or not b else f"{a / b:.2f}x"

    rows = [m for m in models if m.get("streams")]
    if not rows:
        return []
    st = rows[0]["streams"]
    n, tokens, context = st["streams"], st["tokens"], st["context"]
    lines = [
        "",
        f"Concurrent streams: `zinc serve --parallel {n}` and llama.cpp's own `llama-server -np {n}` (the same "
        f"build, `-c` {n} x {context}, `--cache-reuse 0`), {THREADS} threads each, {context} tokens a slot, one "
        f"after the other (zinc first), medians of {runs} runs. Streaming greedy `/v1/completions` of {tokens} "
        "tokens, each prompt led by a number of its own (no cached prefix to reuse); llama-server is sent "
        "`ignore_eos` (zinc has no such field: a stream it ends early counts its fewer tokens, and shows under "
        f"short). Aggregate tok/s: all the streams' tokens over the time from the first request sent to the last "
        f"token (prompts included; one stream the same way). Target: {n} streams' aggregate at least 2x llama-server's.",
        "",
        f"| model | 1 stream tok/s zinc | llama-server | ratio | {n} streams aggregate tok/s zinc | llama-server | "
        f"ratio | {n} streams / 1 zinc | llama-server | worst TTFT s zinc | llama-server | short zinc / llama |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for m in rows:
        z, ll = m["streams"]["zinc"], m["streams"]["llama"]
        zo, lo, za, la = med(z, "one"), med(ll, "one"), med(z, "agg"), med(ll, "agg")
        short = f"{sum(r['short'] for r in z)} / {sum(r['short'] for r in ll) if ll else '-'}"
        lines.append(
            f"| {m['model']} {m['quant']} | {fmt(zo)} | {fmt(lo)} | {ratio(zo, lo)} | {fmt(za)} | {fmt(la)} | "
            f"{ratio(za, la)} | {ratio(za, zo)} | {ratio(la, lo)} | {fmt(med(z, 'ttft'))} | {fmt(med(ll, 'ttft'))} | "
            f"{short} |"
        )
    return lines


def svg(data: Json) -> str:
    """Decode and prompt tok/s of both engines against the model's size in GB (log-log)."""
    import math

    w, h, pad = 640, 360, 60
    pts: dict[str, list[tuple[float, float]]] = {}
    for m in data["models"]:
        gb = m["file_bytes"] / 1e9
        for eng in ("zinc", "llama"):
            for key in ("decode", "prefill"):
                v = med(m[eng], key)
                if v:
                    pts.setdefault(f"{eng} {key}", []).append((gb, v))
    xs = [x for p in pts.values() for x, _ in p] or [1.0]
    ys = [y for p in pts.values() for _, y in p] or [1.0]
    x0, x1 = math.log10(min(xs) / 1.5), math.log10(max(xs) * 1.5)
    y0, y1 = math.log10(min(ys) / 1.5), math.log10(max(ys) * 1.5)

    def px(x: float, y: float) -> tuple[float, float]:
        return (pad + (math.log10(x) - x0) / (x1 - x0) * (w - 2 * pad),
                h - pad - (math.log10(y) - y0) / (y1 - y0) * (h - 2 * pad))  # fmt: skip

    colors = {
        "zinc decode": "#1f77b4",
        "llama decode": "#ff7f0e",
        "zinc prefill": "#2ca02c",
        "llama prefill": "#d62728",
    }
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>',
           f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>',
           f'<text x="{w / 2}" y="{h - 15}" text-anchor="middle">model file size, GB (log)</text>',
           f'<text x="15" y="{h / 2}" transform="rotate(-90 15 {h / 2})" text-anchor="middle">tok/s (log)</text>']  # fmt: skip
    for i, (label, p) in enumerate(sorted(pts.items())):
        c = colors.get(label, "black")
        coords = [px(x, y) for x, y in sorted(p)]
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="'
                   + " ".join(f"{a:.1f},{b:.1f}" for a, b in coords) + '"/>')  # fmt: skip
        for (a, b), (_, y) in zip(coords, sorted(p), strict=True):
            out.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{c}"/>')
            out.append(f'<text x="{a + 5:.1f}" y="{b - 5:.1f}" fill="{c}">{y:.1f}</text>')
        out.append(f'<text x="{w - pad - 110}" y="{pad + 15 * i}" fill="{c}">{label}</text>')
    for m in data["models"]:
        a, _ = px(m["file_bytes"] / 1e9, 10**y0)
        out.append(f'<text x="{a:.1f}" y="{h - pad + 15}" text-anchor="middle">{m["model"]}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> int:
    from fixtures.real_shapes import QUANTS, SPECS

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--models", default="llama-3.2-1b,llama-3.1-8b")
    ap.add_argument("--quant", default="Q4_0", choices=QUANTS)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument(
        "--llama-bin",
        type=Path,
        default=Path(os.environ.get("LLAMA_CPP_BIN", REPO / ".bench" / "llama.cpp" / "build" / "bin")),
    )
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument(
        "--long-model", default="llama-3.2-1b", help="the model of the long-context run ('' for none)"
    )
    ap.add_argument("--long-tokens", type=int, default=4096)
    ap.add_argument("--streams", type=int, default=8, help="concurrent streams, zinc serve vs llama-server (0: none)")
    ap.add_argument("--stream-tokens", type=int, default=64, help="tokens each of those streams asks for")
    ap.add_argument("--worker", choices=["long"], help=argparse.SUPPRESS)
    ap.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "PERFORMANCE.md")
    ap.add_argument("--title", default=SECTION, help=f"the report section to write (default {SECTION!r}; another "
                    "title: its own section, .bench/<title>.json, and no plot)")
    args = ap.parse_args()
    if args.worker:  # bench.run_worker runs this file's workers the way it runs bench.py's
        spec = json.loads(args.spec.read_text())
        Path(spec["result"]).write_text(json.dumps(worker_long(spec)))
        return 0
    unknown = [m for m in [*args.models.split(","), args.long_model] if m and m not in SPECS]
    if unknown:  # said now, not after the runs of the models before it
        ap.error(f"unknown model {', '.join(map(repr, unknown))} (known: {', '.join(SPECS)})")
    llama_bin = None if args.no_llama else args.llama_bin
    if llama_bin is not None and not (llama_bin / "llama-bench").exists():
        say(f"no llama-bench in {llama_bin} (scripts/bench-sizes builds it): measuring zinc only")
        llama_bin = None
    bw = measure_bandwidth()[f"gbps_{THREADS}t"] * 1e9
    models = [
        bench_model(m, args.quant, args.runs, args.decode_tokens, llama_bin, bw, args.streams, args.stream_tokens)
        for m in args.models.split(",")
    ]
    long = (
        []
        if not args.long_model
        else [
            bench_long(
                args.long_model, args.quant, args.runs, args.decode_tokens, llama_bin, args.long_tokens
            )
        ]
    )
    # scripts/bench-sizes writes VERSION; llama-bench's own build_commit is then the git HEAD of the
    # tree around the sdist's (zinc's), so it is taken only where there is no VERSION
    version = llama_bin / ".." / ".." / "VERSION" if llama_bin else None
    builds = {version.read_text().strip()} if version and version.exists() else set()
    if not builds:
        builds = {r["build"] for m in models for r in m["llama"] if r.get("build") not in (None, "unknown")}
    data = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "cpu": cpu_info(), "runs": args.runs,
            "bandwidth_gbps": bw / 1e9, "models": models, "long": long, "llama_build": ", ".join(sorted(str(b) for b in builds))}  # fmt: skip
    slug = "sizes" if args.title == SECTION else re.sub(r"[^a-z0-9]+", "-", args.title.lower()).strip("-")
    (REPO / ".bench").mkdir(exist_ok=True)
    (REPO / ".bench" / f"{slug}.json").write_text(json.dumps(data, indent=1))
    replace_section(args.out, render(data, args.title), args.title)
    if args.title == SECTION:
        (args.out.parent / "sizes.svg").write_text(svg(data))
    print(render(data, args.title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
