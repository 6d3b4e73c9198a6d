"""Per-dispatch times of one decode step of zinc's Vulkan artifact, from IREE's HAL profiling.

Usage: python bench/gpu_profile.py --bundle DIR --out FILE [--position 256] [--top 25] [--budget-s 100]

scripts/gpu-bench runs it after bench_gpu.py, on the GPU, for every model of the bundle: which of
zinc's kernels take a decode step's time there is what the next round of GPU tuning needs, and
one call of `iree-benchmark-module` (from the carried iree-base-runtime wheel) measures it:
`decode_b1` with a KV slab of 256 slots, the token at position --position (its slots all 0:
attention reads that many cached rows), `--device_profiling_mode=dispatch-events`, then
`iree-profile dispatch` groups the device timestamps by dispatch function. Out: per model the
step's wall time and the --top functions by total time (calls, mean, workgroup count and size);
for a model carried with an `artifact_linalg` too (bench/gpu_bundle.py DP4_AB), the same of that
artifact under "linalg", with the time left: the step without zinc.compiler.dp4's matmuls.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

Json = dict[str, Any]
SLOTS = 256


def tool(name: str) -> str:
    """An IREE runtime tool shipped in the iree-base-runtime wheel."""
    spec = importlib.util.find_spec("iree._runtime_libs")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("iree-base-runtime is not installed")
    return str(Path(next(iter(spec.submodule_search_locations))) / name)


def decode_inputs(hp: Json, position: int, kv_dtype: str = "f16x2", batch: int = 1) -> list[str]:
    """decode_b{batch}'s arguments: the slab [slots, L, 2, Hkv, hd] as the manifest's
    `kv_cache.dtype` stores it (f16x2: hd / 2 i32 words), and per row its token, its position
    and its slots (every row at `position`, its slots all 0)."""
    hd = hp["key_length"]
    width, element = (hd // 2, "i32") if kv_dtype == "f16x2" else (hd, kv_dtype)
    slab = f"{SLOTS}x{hp['block_count']}x2x{hp['head_count_kv']}x{width}x{element}=0"
    return [
        f"--input={slab}",
        f"--input={batch}xi32=100",
        f"--input={batch}xi32={position}",
        f"--input={batch}x{position + 1}xi32=0",
    ]


def profile(model: Json, args: argparse.Namespace, timeout: float, field: str = "artifact") -> Json:
    art = Path(model[field])
    manifest = json.loads((art / "manifest.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        prof = Path(tmp) / "decode.ireeprof"
        cmd = [tool("iree-benchmark-module"), f"--device={args.device}", f"--module={art / manifest['vmfb']}",
               f"--parameters=model={model['gguf']}", "--function=decode_b1",
               *decode_inputs(manifest["hparams"], args.position, manifest["kv_cache"]["dtype"]),
               "--benchmark_min_time=5x",
               "--benchmark_format=json", "--device_profiling_mode=dispatch-events",
               f"--device_profiling_output={prof}"]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            return {"error": (done.stderr or done.stdout)[-2000:]}
        bench = json.loads(done.stdout[done.stdout.index("{") :])
        step_ms = min(b["real_time"] for b in bench["benchmarks"] if b.get("run_type") != "aggregate")
        out = subprocess.run([tool("iree-profile"), "dispatch", "--format=jsonl", str(prof)],
                             capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    rows = [r for r in map(json.loads, out.stdout.splitlines()) if "total_ns" in r]
    total = sum(r["total_ns"] for r in rows) or 1
    rows.sort(key=lambda r: -r["total_ns"])
    top = [{"function": r["key"], "share": r["total_ns"] / total, "calls": r["count"], "mean_us": r["avg_ns"] / 1e3,
            "workgroups": r.get("last_workgroup_count"), "workgroup_size": r.get("last_workgroup_size")}
           for r in rows[: args.top]]  # fmt: skip
    return {"step_ms": step_ms, "position": args.position, "dispatch_functions": len(rows), "top": top}


def attempt(model: Json, args: argparse.Namespace, seconds: float, field: str) -> Json:
    """`profile`, or what stopped it."""
    if seconds < 10:
        return {"error": "out of time"}
    try:
        return profile(model, args, seconds, field)
    except (subprocess.SubprocessError, OSError, ValueError, KeyError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[-2000:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument(
        "--bundle", required=True, help="the unpacked bundle (models.json with GGUF and artifact paths)"
    )
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="vulkan")
    ap.add_argument("--position", type=int, default=256, help="cached positions the step attends to")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--budget-s", type=float, default=100.0, help="seconds for all the models together")
    args = ap.parse_args()
    end = time.monotonic() + args.budget_s
    results: Json = {}
    models = json.loads((Path(args.bundle) / "models.json").read_text())
    for i, model in enumerate(models):
        share = (end - time.monotonic()) / (len(models) - i)  # an equal share of what is left
        results[model["key"]] = attempt(model, args, share, "artifact")
        if "artifact_linalg" in model and "step_ms" in results[model["key"]]:  # the A/B of the dp4 matmuls
            left = (end - time.monotonic()) / (len(models) - i)  # an equal share again
            results[model["key"]]["linalg"] = attempt(model, args, left, "artifact_linalg")
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
        r = results[model["key"]]
        print(f"{model['key']}: " + (f"decode step {r['step_ms']:.2f} ms" if "step_ms" in r else r["error"][-300:]),
              file=sys.stderr, flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
