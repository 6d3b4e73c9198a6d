"""Where a CPU decode step's (or prompt chunk's) time goes, kernel by kernel, from IREE's HAL profiling.

Usage: .venv/bin/python bench/cpu_profile.py [--model smollm2|NAME|GGUF] [--batch 1] [--position 128]
       [--prefill TOKENS [--start POSITION]] [--steps 20] [--threads 2] [--top 12] [--json FILE]

For the CPU what bench/gpu_profile.py is for a GPU. The model (NAME: a fixtures/real_shapes.py
spec in Q4_0, written on first use) is compiled into zinc's cache on first use; then the
iree-base-runtime wheel's `iree-benchmark-module` runs its `decode_b{batch}` --steps times with
`--device_profiling_mode=host-execution` (or, with --prefill, its `prefill_kv` over a prompt chunk of
that many tokens at position 0 or --start), under which IREE's local-task driver records each
dispatch's start, end and the summed time of its workgroups. Printed, and written with --json:
  - the step's span (first dispatch's start to last one's end, median over the steps), the part of
    it no dispatch covers (gaps: the task system between dispatches), and the worker time left
    idle inside dispatches (threads x wall - the workgroups' time: one worker done or not yet
    started while another works), per step;
  - per kernel function, by time per step: calls per step, ms per step and share, its worker time
    left idle per step (where an uneven split or a slowed worker costs), the mean and the fastest call; for the integer matmuls (zinc.compiler.dot8, named by type and shape) the weight
    bytes one call reads over those two times, in GB/s, to hold against the host's read bandwidth
    (a prompt chunk's: its multiply-adds, in GMAC/s, to hold against the host's arithmetic).
On a busy host the mean is what the steps got and the fastest what the kernel can do.
Imports: gpu_profile (tool, decode_inputs), zinc.artifact (CTX_ALIGN), zinc.compiler.build,
zinc.compiler.kernels, the stdlib.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent.parent))  # fixtures/; bench/ stays first
from gpu_profile import SLOTS, decode_inputs, tool

Json = dict[str, Any]
# an integer matmul kernel by type and shape (not the dispatch that quantizes its rows, `_xq`)
MATMUL = re.compile(r"^dot8_([a-z0-9_]+?)_(?:1|b\d+|t)_(\d+)x(\d+)(?!_xq)(?:_|$)")


def matmul_bytes(function: str) -> int | None:
    """The weight bytes one call of an integer matmul kernel reads (its name gives the GGML type and
    the [n, k] shape), or None for any other function."""
    from zinc.compiler.kernels import QUANT_TYPES

    m = MATMUL.match(function)
    q = QUANT_TYPES.get(m.group(1).upper()) if m else None
    if m is None or q is None:
        return None
    n, k = int(m.group(2)), int(m.group(3))
    return int(n * (k // q.block) * q.block_bytes)


def matmul_macs(function: str, tokens: int) -> int | None:
    """The multiply-adds of one call of a prompt chunk's integer matmul (`dot8_<type>_t_<n>x<k>`)
    over `tokens` rows, or None for any other function."""
    m = MATMUL.match(function)
    if m is None or "_t_" not in function:
        return None
    return int(m.group(2)) * int(m.group(3)) * tokens


def model_path(name: str) -> Path:
    if Path(name).is_file():
        return Path(name)
    if name == "smollm2":
        from zinc.model.gguf_file import default_model_path

        return default_model_path()
    from fixtures.real_shapes import ensure_model

    return ensure_model(name, "Q4_0")


def capture(artifact: Path, gguf: Path, args: argparse.Namespace, prof: Path) -> float:
    """Run the profiled benchmark into `prof`; the median step time it reports, in ms."""
    manifest = json.loads((artifact / "manifest.json").read_text())
    cmd = [tool("iree-benchmark-module"), "--device=local-task", f"--task_topology_group_count={args.threads}",
           f"--module={artifact / manifest['vmfb']}", f"--parameters=model={gguf}",
           *[f"--parameters=model={artifact / a}" for a in manifest.get("parameter_archives", [])],
           *step_args(manifest, args),
           f"--benchmark_min_time={args.steps}x", "--benchmark_format=json",
           "--device_profiling_mode=host-execution", f"--device_profiling_output={prof}"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit((done.stderr or done.stdout)[-2000:])
    bench = json.loads(done.stdout[done.stdout.index("{") :])
    times = [b["real_time"] for b in bench["benchmarks"] if b.get("run_type") != "aggregate"]
    return float(statistics.median(times))


def step_args(manifest: Json, args: argparse.Namespace) -> list[str]:
    """The function flag and inputs of the step profiled: decode_b{batch}, or with --prefill
    `prefill_kv` (slab, ids [T], start, ctx [start + T padded to CTX_ALIGN]: position p in slot p,
    the slab grown to hold them; with --start 0 every position's slot is 0)."""
    inputs = decode_inputs(manifest["hparams"], args.position, manifest["kv_cache"]["dtype"], args.batch)
    if not args.prefill:
        return [f"--function=decode_b{args.batch}", *inputs]
    from zinc.artifact import CTX_ALIGN

    start = getattr(args, "start", 0)
    ctx = -(-(start + args.prefill) // CTX_ALIGN) * CTX_ALIGN
    slab, slots = inputs[0], "0"
    if start:
        slab = re.sub(r"^--input=\d+x", f"--input={max(SLOTS, ctx)}x", slab)
        slots = " ".join(map(str, range(ctx)))
    return ["--function=prefill_kv", slab, f"--input={args.prefill}xi32=100", f"--input={start}", f"--input={ctx}xi32={slots}"]


def profile_records(prof: Path) -> tuple[list[Json], list[Json]]:
    """The per-function rows (`iree-profile dispatch`) and the dispatch events (`export`)."""

    def jsonl(*cmd: str) -> list[Json]:
        run = [tool("iree-profile"), *cmd, str(prof)]
        out = subprocess.run(run, capture_output=True, text=True, check=True, timeout=120)
        return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]

    rows = [r for r in jsonl("dispatch", "--format=jsonl") if "total_ns" in r]
    events = [e for e in jsonl("export", "--format=ireeperf-jsonl")
              if e.get("record_type") == "host_execution_event" and e.get("op") == "dispatch"]  # fmt: skip
    return rows, events


def steps_of(events: list[Json]) -> list[list[Json]]:
    """The dispatch events cut into steps: each step begins with the function the first one ran."""
    events = sorted(events, key=lambda e: e["start_host_time_ns"])
    steps: list[list[Json]] = []
    for e in events:
        if not steps or e["key"] == events[0]["key"]:
            steps.append([])
        steps[-1].append(e)
    return steps


def step_figures(step: list[Json], threads: int) -> tuple[int, int, int, int]:
    """A step's span, its dispatches' summed walls, the time inside it that no dispatch covers,
    and the worker time left idle inside its dispatches, in ns."""
    start, end = step[0]["start_host_time_ns"], max(e["end_host_time_ns"] for e in step)
    covered, reach = 0, start
    for e in step:  # sorted by start; dispatches without a barrier between them may overlap
        lo, hi = max(e["start_host_time_ns"], reach), e["end_host_time_ns"]
        covered += max(0, hi - lo)
        reach = max(reach, hi)
    idle = sum(max(0, threads * e["duration_ns"] - e["tile_duration_sum_ns"]) for e in step)
    return end - start, sum(e["duration_ns"] for e in step), end - start - covered, idle


def summarize(rows: list[Json], events: list[Json], threads: int, top: int, tokens: int = 0) -> Json:
    steps = steps_of(events)
    n = len(steps)
    spans, walls, gaps, idle = zip(*(step_figures(s, threads) for s in steps), strict=True)
    total = sum(r["total_ns"] for r in rows)
    idle_of: dict[str, int] = {}
    for e in events:  # per function: where the idle worker time is (an uneven split, a slow worker)
        idle_of[e["key"]] = idle_of.get(e["key"], 0) + max(0, threads * e["duration_ns"] - e["tile_duration_sum_ns"])
    kernels = []
    for r in sorted(rows, key=lambda r: -r["total_ns"])[:top]:
        row: Json = {"function": r["key"], "calls": r["count"] / n, "ms": r["total_ns"] / n / 1e6,
                     "share": r["total_ns"] / total, "mean_us": r["avg_ns"] / 1e3, "best_us": r["min_ns"] / 1e3,
                     "idle_ms": idle_of.get(r["key"], 0) / n / 1e6}  # fmt: skip
        nbytes, macs = matmul_bytes(r["key"]), matmul_macs(r["key"], tokens)
        if macs is not None:
            row |= {"gmacs_mean": macs / r["avg_ns"], "gmacs_best": macs / r["min_ns"]}
        elif nbytes is not None:
            row |= {"gbps_mean": nbytes / r["avg_ns"], "gbps_best": nbytes / r["min_ns"]}
        kernels.append(row)
    return {"steps": n, "dispatches": len(events) / n, "span_ms": statistics.median(spans) / 1e6,
            "walls_ms": statistics.median(walls) / 1e6, "gaps_ms": statistics.median(gaps) / 1e6,
            "idle_worker_ms": statistics.median(idle) / 1e6, "kernels": kernels}  # fmt: skip


def render(s: Json, threads: int) -> str:
    lines = [
        f"{s['steps']} steps of {s['dispatches']:.0f} dispatches: span {s['span_ms']:.2f} ms, dispatches' walls "
        f"{s['walls_ms']:.2f} ms, gaps {s['gaps_ms']:.2f} ms, idle worker time inside dispatches "
        f"{s['idle_worker_ms']:.2f} ms (of {threads} workers)",
        f"{'function':52s} {'calls':>5s} {'ms':>7s} {'share':>6s} {'idle ms':>7s} {'mean us':>9s} {'best us':>9s}  "
        "GB/s mean / best (a prompt chunk's matmuls: GMAC/s)",
    ]
    for k in s["kernels"]:
        rate = "gmacs" if "gmacs_mean" in k else "gbps"
        gb = f"  {k[rate + '_mean']:5.1f} / {k[rate + '_best']:5.1f}" if rate + "_mean" in k else ""
        lines.append(f"{k['function'][:52]:52s} {k['calls']:5.0f} {k['ms']:7.2f} {k['share']:6.1%} {k['idle_ms']:7.2f} "
                     f"{k['mean_us']:9.1f} {k['best_us']:9.1f}{gb}")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--model", default="smollm2", help="smollm2, a real_shapes.py name, or a GGUF path")
    ap.add_argument("--batch", type=int, default=1, help="the decode bucket (decode_bN) to run")
    ap.add_argument("--position", type=int, default=128, help="cached positions each row attends to")
    ap.add_argument("--prefill", type=int, default=0, help="profile prefill_kv over a chunk of this many tokens")
    ap.add_argument("--start", type=int, default=0, help="with --prefill: the chunk's first position")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    from zinc.compiler.build import ensure_artifact

    gguf = model_path(args.model)
    artifact = ensure_artifact(gguf, "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        prof = Path(tmp) / "decode.ireeprof"
        step_ms = capture(artifact, gguf, args, prof)
        rows, events = profile_records(prof)
    at = f" at position {args.start}" if args.start else ""
    step = f"prefill_kv of {args.prefill} tokens{at}" if args.prefill else f"decode_b{args.batch} at position {args.position}"
    summary = {"model": gguf.name, "step": step, "batch": args.batch, "position": args.position,
               "prefill": args.prefill, "benchmark_step_ms": step_ms, **summarize(rows, events, args.threads, args.top, args.prefill)}  # fmt: skip
    print(f"{gguf.name}, {step}: {step_ms:.2f} ms a step")
    print(render(summary, args.threads))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
