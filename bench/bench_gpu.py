"""zinc against llama.cpp's Vulkan `llama-server` on one GPU: the figures of docs/PERFORMANCE.md's GPU section.

Usage (scripts/gpu-bench runs it; on the device machine after `gpu-bench run` unpacked the bundle):
  python bench/bench_gpu.py --bundle DIR --llama-server BIN --out FILE [--budget-s S] [--runs N]
  python bench/bench_gpu.py --report DIR [--doc docs/PERFORMANCE.md] [--json docs/gpu-bench.json]
  (DIR: the run's output, gpu-bench.json and, when there, gpu-kernels.json, gpu-check.json and
  gpu-profile.json)

For each model of the bundle's models.json (a GGUF and zinc's Vulkan artifact for it), `zinc serve
--device vulkan --artifact DIR` and then `llama-server -ngl 999` (every layer on the GPU) run alone on
loopback, with the same slots and context, measured by the same one-thread client (loopback.streams):
- start: seconds from the process's start to its first 200 on /health (weights loaded);
- ttft: a short prompt's time to its first token on the idle server;
- prefill tok/s: a PROMPT-token prompt (token ids, each run's first ids its own, so no cached prefix
  answers it), `max_tokens` 1: prompt tokens / time to the first token;
- decode tok/s: one greedy stream of --tokens tokens: (tokens - 1) / (last token - first token);
- 1 stream and --streams streams' aggregate tok/s, worst TTFT (bench_streams.measure).
Medians of --runs. Each server gets an equal share of the time left (--budget-s over the servers
still to run), so a slow one cannot take the others' turns. The models have random weights: llama-server is sent `ignore_eos`, and a stream
zinc ends early at an end token counts the tokens it made (`short`). A step that cannot fit in
its server's share is skipped (and said so); the results are written to --out after every step,
so a run cut short keeps what it measured.

The memory-bandwidth ceiling: the GPU's read bandwidth (a torch reduction over 4 GiB, when torch
and CUDA are there) over the bytes of weights a decode step reads (bench_sizes.bytes_per_token).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import loopback
from bench_streams import measure as measure_streams
from loopback import HOST, Server, free_port, say, streams
from report import replace_section

Json = dict[str, Any]
PATH = "/v1/completions"
PROMPT = 512
CONTEXT = 2048
SECTION = "## GPU"
BANDWIDTH_SNIPPET = """
import json, time, torch
x = torch.ones(1 << 30, dtype=torch.float32, device="cuda")
for _ in range(3): x.sum()
torch.cuda.synchronize(); t0 = time.perf_counter()
for _ in range(20): x.sum()
torch.cuda.synchronize(); dt = time.perf_counter() - t0
print(json.dumps({"read_gb_s": 20 * x.numel() * 4 / dt / 1e9, "name": torch.cuda.get_device_name()}))
"""


class Budget:
    """The seconds left of the run; `fits(s)` is false when fewer than `s` are left."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def fits(self, seconds: float) -> bool:
        return self.left() >= seconds


def body(prompt: str | list[int], n: int, extra: Json) -> Json:
    return {"prompt": prompt, "max_tokens": n, "temperature": 0, **extra}


def prompt_ids(run: int, n: int) -> list[int]:
    """`n` token ids, the first two the run's own: ordinary ids of every vocabulary zinc serves
    (above the special tokens, below SmolLM2's 49,152)."""
    return [1000 + run, 2000 + run] + [3000 + (i * 7919) % 40000 for i in range(n - 2)]


def one(port: int, prompt: str | list[int], n: int, extra: Json, budget: Budget) -> loopback.Stream:
    loopback.REQUEST_TIMEOUT_S = max(10.0, budget.left())
    (s,) = streams(port, [(0.0, PATH, body(prompt, n, extra))])
    return s


def measure_server(server: Server, args: argparse.Namespace, extra: Json, budget: Budget, row: Json,
                   save: Callable[[], None]) -> None:  # fmt: skip
    """Fill `row` with the server's figures, step by step (`save` after each)."""
    port = server.port
    ttft: list[float] = []
    prefill: list[float] = []
    decode: list[float] = []
    try:
        one(port, "Warm-up. Hello, how are you today?", 8, extra, budget)
        one(port, prompt_ids(99, args.prompt), 1, extra, budget)  # the prefill shapes' first calls
        for run in range(args.runs):
            if not budget.fits(20):
                row["skipped"] = f"prefill/decode after {run} runs: out of time"
                break
            t = one(port, f"{run} Say hello in three words.", 1, extra, budget).ttft
            p = one(port, prompt_ids(run, args.prompt), 1, extra, budget)
            d = one(port, f"{run + 10} Write a long story about a dragon who learns to cook.", args.tokens, extra,
                    budget)  # fmt: skip
            ttft.append(t)
            prefill.append(args.prompt / p.ttft)
            decode.append(d.rate)
            row["short"] = row.get("short", 0) + (d.tokens < args.tokens)
            say(f"  {server.name} run {run + 1}: ttft {p.ttft * 1e3:.1f} ms, prefill {prefill[-1]:.1f} tok/s, "
                f"decode {decode[-1]:.2f} tok/s ({d.tokens} tokens)")  # fmt: skip
    except RuntimeError as exc:  # loopback.streams: a request outlived the server's share
        row["skipped"] = f"{exc}, after {len(decode)} of {args.runs} runs (its share of the budget)"
    if decode:
        row.update(
            ttft_ms=1e3 * statistics.median(ttft),
            prefill_tok_s=statistics.median(prefill),
            decode_tok_s=statistics.median(decode),
            runs={"ttft_s": ttft, "prefill": prefill, "decode": decode},
        )
    save()
    if "skipped" in row:
        return
    # one stream's tokens at the median decode rate, the streams' at most 4 times as long
    need = 10 + args.runs * 5 * args.stream_tokens / max(row.get("decode_tok_s", 1.0), 1.0)
    if not budget.fits(need):
        row["skipped_streams"] = f"needs about {need:.0f} s, {budget.left():.0f} s left"
        return
    loopback.REQUEST_TIMEOUT_S = max(10.0, budget.left())
    try:
        rows = measure_streams(server, args.streams, args.stream_tokens, args.runs, extra)
    except RuntimeError as exc:  # loopback.streams: a request outlived the server's share
        row["skipped_streams"] = f"{exc} (its share of the budget)"
        return
    row.update(streams=args.streams, stream1_tok_s=statistics.median(r["one"] for r in rows),
               streams_tok_s=statistics.median(r["agg"] for r in rows),
               streams_worst_ttft_s=statistics.median(r["ttft"] for r in rows),
               streams_short=sum(r["short"] for r in rows))  # fmt: skip
    save()


def zinc_argv(model: Json, port: int, args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "zinc", "serve", "-m", model["gguf"], "--artifact", model["artifact"],
            "--device", "vulkan", "--host", HOST, "--port", str(port), "--parallel", str(args.streams),
            "--ctx-size", str(CONTEXT)]  # fmt: skip


def llama_argv(model: Json, port: int, args: argparse.Namespace) -> list[str]:
    return [args.llama_server, "-m", model["gguf"], "-ngl", "999", "-np", str(args.streams),
            "-c", str(args.streams * CONTEXT), "--cache-reuse", "0", "--host", HOST, "--port", str(port)]  # fmt: skip


def gpu_info() -> Json:
    """The GPU's name and driver (nvidia-smi) and its read bandwidth (torch), when they are there."""
    info: Json = {}
    if shutil.which("nvidia-smi"):
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        if done.returncode == 0 and done.stdout.strip():
            name, driver, memory = (part.strip() for part in done.stdout.splitlines()[0].split(","))
            info.update(name=name, driver=driver, memory=memory)
    try:
        done = subprocess.run(
            [sys.executable, "-c", BANDWIDTH_SNIPPET], capture_output=True, text=True, timeout=120
        )
        if done.returncode == 0:
            measured = json.loads(done.stdout.strip().splitlines()[-1])
            info["read_gb_s"] = measured["read_gb_s"]
            info.setdefault("name", measured["name"])
        else:
            info["bandwidth_error"] = done.stderr.strip().splitlines()[-1:] or ["failed"]
    except (OSError, subprocess.SubprocessError, ValueError, KeyError) as exc:
        info["bandwidth_error"] = str(exc)
    return info


def vulkan_name() -> str:
    done = subprocess.run([sys.executable, "-m", "zinc.runtime.vulkan_probe"], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    devices = json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else []
    return ", ".join(d.get("name", "?") for d in devices) or "no Vulkan device"


def run(args: argparse.Namespace) -> int:
    budget = Budget(args.budget_s)
    bundle = Path(args.bundle)
    models: list[Json] = json.loads((bundle / "models.json").read_text())
    info = gpu_info()
    vk = vulkan_name()
    out: Json = {"gpu": info.get("name", vk), "vulkan_device": vk, "date": dt.datetime.now(dt.UTC).isoformat(timespec="minutes"),
                 "gpu_info": info, "settings": {"prompt": args.prompt, "tokens": args.tokens, "runs": args.runs,
                 "streams": args.streams, "stream_tokens": args.stream_tokens, "context": CONTEXT},
                 "bundle": json.loads((bundle / "bundle.json").read_text()), "models": {}}  # fmt: skip
    say(f"GPU: {out['gpu']} (Vulkan: {vk}); {info}")

    def save() -> None:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")

    save()
    turns = [(model, who) for model in models for who in ("zinc", "llama.cpp") if who in args.only]
    for model in models:
        out["models"][model["key"]] = {"name": model["name"], "bytes_per_token": model["bytes_per_token"],
                                       "zinc": {}, "llama.cpp": {}}  # fmt: skip
    for i, (model, who) in enumerate(turns):
        row: Json = out["models"][model["key"]][who]
        later = len(turns) - i - 1
        # the start may take what the later servers do not need at least: a GPU's driver builds
        # every kernel when a server loads (an H200's took 18 s for the 1B artifact's 229 and
        # 129 s for the 8B's 358 on a first start)
        start_limit = budget.left() - later * args.min_server_s
        if start_limit < args.min_server_s:
            row["skipped"] = f"out of time ({budget.left():.0f} s left for {later + 1} servers)"
            say(f"{model['key']} {who}: skipped, {budget.left():.0f} s left")
            save()
            continue
        argv, extra = (zinc_argv, {}) if who == "zinc" else (llama_argv, {"ignore_eos": True})
        port = free_port()
        loopback.START_TIMEOUT_S = max(10.0, min(300.0, start_limit - 15))
        t0 = time.monotonic()
        try:
            with Server(f"{who} {model['key']}", argv(model, port, args), port, "/health") as server:
                row["start_s"] = time.monotonic() - t0
                save()
                # then an equal share of what is left, so that a slow server cannot take the
                # later ones' time
                turn = Budget(budget.left() / (later + 1))
                try:
                    measure_server(server, args, extra, turn, row, save)
                finally:
                    row["log_tail"] = server.tail(3000)
        except Exception as exc:  # a failed server or step is a result too; the next one runs
            row["error"] = f"{type(exc).__name__}: {exc}"[-3000:]
            say(f"{model['key']} {who} failed: {row['error']}")
        save()
    return 0


# --- the report ---------------------------------------------------------------------------------------
def fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits if v >= 100 or digits else 1}f}"


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def render(data: Json) -> str:
    info = data.get("gpu_info", {})
    bw = info.get("read_gb_s")
    n = data["settings"]["streams"]
    lines = [
        SECTION, "",
        f"{data['gpu']} (Vulkan device: {data['vulkan_device']}; driver {info.get('driver', '?')}), {data['date']}, "
        f"`scripts/gpu-bench` (bench/bench_gpu.py): zinc's Vulkan artifact for IREE's "
        f"`{data['bundle'].get('vulkan_target', '?')}` target against llama.cpp's Vulkan `llama-server` "
        f"({data['bundle'].get('llama_server', '?')}, every layer on the GPU), one after the other, the same "
        f"{data['settings']['streams']} slots of {data['settings']['context']} tokens; medians of "
        f"{data['settings']['runs']} runs. Prefill: a {data['settings']['prompt']}-token prompt; decode: "
        f"{data['settings']['tokens']} tokens of one stream; TTFT: a short prompt on the idle server. "
        + (f"Ceiling: the GPU's measured read bandwidth ({bw:.0f} GB/s) over the bytes a token reads." if bw else ""),
        "",
        "| model | decode tok/s zinc | llama.cpp | ratio | zinc / ceiling | prefill tok/s zinc | llama.cpp | ratio "
        f"| TTFT ms zinc | llama.cpp | 1 stream tok/s zinc | {n} streams zinc | {n} / 1 zinc | {n} streams llama.cpp "
        "| start s zinc | llama.cpp |",
        "|---|" + "---:|" * 16,
    ]  # fmt: skip
    notes = []
    for m in data["models"].values():
        z, ll = m["zinc"], m["llama.cpp"]
        ceiling = bw * 1e9 / m["bytes_per_token"] if bw else None
        share = f"{100 * z['decode_tok_s'] / ceiling:.0f}%" if ceiling and z.get("decode_tok_s") else "-"
        lines.append(
            f"| {m['name']} | {fmt(z.get('decode_tok_s'))} | {fmt(ll.get('decode_tok_s'))} | "
            f"{ratio(z.get('decode_tok_s'), ll.get('decode_tok_s'))} | {share} | {fmt(z.get('prefill_tok_s'), 0)} | "
            f"{fmt(ll.get('prefill_tok_s'), 0)} | {ratio(z.get('prefill_tok_s'), ll.get('prefill_tok_s'))} | "
            f"{fmt(z.get('ttft_ms'))} | {fmt(ll.get('ttft_ms'))} | {fmt(z.get('stream1_tok_s'))} | "
            f"{fmt(z.get('streams_tok_s'))} | {ratio(z.get('streams_tok_s'), z.get('stream1_tok_s'))} | "
            f"{fmt(ll.get('streams_tok_s'))} | {fmt(z.get('start_s'))} | {fmt(ll.get('start_s'))} |"
        )
        for who, row in (("zinc", z), ("llama.cpp", ll)):
            for key in ("error", "skipped", "skipped_streams"):
                if key in row:
                    notes.append(
                        f"- {m['name']}, {who}: {key.replace('_', ' ')}: {row[key].splitlines()[0][:300]}"
                    )
    lines += ["", *notes] if notes else []
    lines += ["", "The run's raw figures: docs/gpu-bench.json."]
    return "\n".join(lines)


def profile_lines(profile: Json, names: dict[str, str]) -> list[str]:
    """The few kernels that take most of a decode step on the GPU, per model (gpu_profile.py)."""
    lines = ["", "Where one decode step's time goes on the GPU (bench/gpu_profile.py: IREE's HAL profiling of "
             "`decode_b1`; share of the step's dispatch time, calls, mean):", ""]  # fmt: skip
    for key, p in profile.items():
        if "top" not in p:
            lines.append(
                f"- {names.get(key, key)}: not profiled ({p.get('error', '?').splitlines()[-1][:200]})"
            )
            continue
        top = ", ".join(f"`{t['function'].split('_dispatch_')[-1][:48]}` {100 * t['share']:.0f}% "
                        f"({t['calls']} x {t['mean_us']:.0f} us)" for t in p["top"][:5])  # fmt: skip
        lines.append(
            f"- {names.get(key, key)}: a step {p['step_ms']:.2f} ms at {p['position']} cached positions; {top}"
        )
        lin = p.get("linalg", {})
        if "step_ms" in lin:
            lines.append(f"  - without the integer dot-product matmuls (ZINC_VULKAN_DOT=off): a step {lin['step_ms']:.2f} ms")
    return lines


def check_lines(check: Json, names: dict[str, str]) -> list[str]:
    """zinc's logits on the GPU against the float64 reference, per model (gpu_check.py)."""
    lines = ["", "zinc's logits on the GPU against the float64 numpy reference (bench/gpu_check.py: a 200-token "
             "prompt in two prefill calls, then decode steps; max |error| over the largest |logit|; random "
             "weights, so errors of a few 1e-3 are rounding and one near 1 a wrong kernel):", ""]  # fmt: skip
    for key, c in check.items():
        name = names.get(key, key)
        if "steps" not in c:
            why = c.get("skipped") or c.get("error", "?").splitlines()[-1][:200]
            lines.append(f"- {name}: not checked ({why})")
            continue
        errs = ", ".join(f"{s['step']} {s['rel_err']:.1e}" for s in c["steps"])
        lines.append(f"- {name}: {errs}; greedy tokens agree on {c['tokens_agree']} of {c['of']} steps.")
        ch = c.get("chained", {})
        if "error" in ch:
            lines.append(f"  - chained greedy steps: not timed ({ch['error'].splitlines()[-1][:200]})")
        elif ch:
            lines.append(f"  - {ch['steps']} chained greedy steps: {ch['ms_per_step']:.2f} ms a step, "
                         f"{ch['enqueue_ms']:.2f} ms for the host to enqueue one (the host bounds decode where the two are about equal)")
        lin = c.get("linalg", {})
        if "steps" in lin:
            errs = ", ".join(f"{s['step']} {s['rel_err']:.1e}" for s in lin["steps"])
            lines.append(f"  - without the integer dot-product matmuls: {errs}; tokens agree on {lin['tokens_agree']} of {lin['of']}.")
        elif lin:
            lines.append(f"  - without the integer dot-product matmuls: not checked ({lin['error'].splitlines()[-1][:200]})")
    return lines


def kernel_lines(kernels: Json) -> list[str]:
    """Which of each artifact's kernels the GPU's driver refused to build (gpu_kernels.py)."""
    lines = ["", f"Kernels built one by one on {kernels['device']} (bench/gpu_kernels.py: a compute pipeline for "
             "each SPIR-V module of the artifact):", ""]  # fmt: skip
    for path, r in kernels["artifacts"].items():
        name = "/".join(Path(path).parts[-2:])
        refused = ", ".join(f"`{x['entry']}` ({x['result']})" for x in r["refused"][:6])
        lines.append(f"- {name}: {r['modules']} kernels built in {r['seconds']:.0f} s, {len(r['refused'])} refused"
                     f"{': ' + refused if refused else ''}")  # fmt: skip
    return lines


def report(args: argparse.Namespace) -> int:
    run_dir = Path(args.report)
    data = json.loads((run_dir / "gpu-bench.json").read_text())
    for m in data["models"].values():  # the logs stay in the run's output, not in the docs
        for who in ("zinc", "llama.cpp"):
            m[who].pop("log_tail", None)
    section = render(data)
    if (run_dir / "gpu-profile.json").exists():
        data["profile"] = json.loads((run_dir / "gpu-profile.json").read_text())
        names = {key: m["name"] for key, m in data["models"].items()}
        section += "\n" + "\n".join(profile_lines(data["profile"], names))
    if (run_dir / "gpu-kernels.json").exists():
        data["kernels"] = json.loads((run_dir / "gpu-kernels.json").read_text())
        section += "\n" + "\n".join(kernel_lines(data["kernels"]))
    if (run_dir / "gpu-check.json").exists():
        data["check"] = json.loads((run_dir / "gpu-check.json").read_text())
        names = {key: m["name"] for key, m in data["models"].items()}
        section += "\n" + "\n".join(check_lines(data["check"], names))
    Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
    replace_section(Path(args.doc), section, SECTION)
    print(section)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--bundle", help="the unpacked bundle: models.json, bundle.json, GGUFs and artifacts")
    ap.add_argument("--llama-server", help="llama.cpp's Vulkan llama-server")
    ap.add_argument("--out", help="the results' JSON")
    ap.add_argument("--budget-s", type=float, default=420.0, help="seconds the whole run may take")
    ap.add_argument("--min-server-s", type=float, default=45.0, help="seconds a server's turn needs at least")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=PROMPT, help="prefill prompt tokens")
    ap.add_argument("--tokens", type=int, default=128, help="decode tokens")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--stream-tokens", type=int, default=64)
    ap.add_argument("--only", nargs="+", default=["zinc", "llama.cpp"], choices=["zinc", "llama.cpp"])
    ap.add_argument("--report", help="render the run in this folder into --doc and --json")
    ap.add_argument("--doc", default="docs/PERFORMANCE.md")
    ap.add_argument("--json", default="docs/gpu-bench.json")
    args = ap.parse_args()
    if args.report:
        return report(args)
    if not (args.bundle and args.out and ("llama.cpp" not in args.only or args.llama_server)):
        ap.error("--bundle, --out and --llama-server are needed to run")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
