"""zinc's Vulkan logits on the GPU against the float64 numpy reference (zinc.model.reference).

Usage: python bench/gpu_check.py --bundle DIR --out FILE [--budget-s 150] [--max-bytes 2e9]

scripts/gpu-bench runs it after bench_gpu.py: zinc's kernels for the GPU's IREE target (the f16
GEMM prefill, the subgroup matvecs, the f16 KV slab) have never run on a GPU, and speed says
nothing of whether they compute the model. For each model of the bundle whose weights are at most
--max-bytes (numpy takes minutes over an 8B model), a prompt of PROMPT tokens (two prefill calls:
128 rows and a padded 72) and DECODE_STEPS decode steps, fed the reference's greedy tokens: each
step's max |logit error| over the largest |logit|, and whether the greedy tokens agree.
The bundle's models have random weights, which make the forward pass chaotic (a value rounded
another way flips what an attention head picks): on lavapipe, whose arithmetic is f32 with an f16
KV slab, SmolLM2's steps are within about 3e-3 of the reference, and the GPU targets' f16 GEMM
rounds more; a wrong kernel is off by the size of the logits themselves (about 1).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

Json = dict[str, Any]
PROMPT = 200
DECODE_STEPS = 2


def prompt_ids(n: int) -> list[int]:
    """Ordinary ids of every vocabulary zinc serves (as bench_gpu.prompt_ids)."""
    return [3000 + (i * 7919) % 40000 for i in range(n)]


def check(model: Json) -> Json:
    import numpy as np

    from zinc.model.gguf_file import open_gguf
    from zinc.model.reference import ReferenceModel
    from zinc.runtime.device import resolve_device
    from zinc.runtime.session import ModelSession

    t0 = time.monotonic()
    session = ModelSession(Path(model["artifact"]), Path(model["gguf"]), resolve_device("vulkan"), context_length=512)
    ref = ReferenceModel(open_gguf(model["gguf"]), kv_f16=True, lazy=True)
    steps: list[Json] = []
    ids = prompt_ids(PROMPT)
    got, want = session.prefill(ids).logits(), ref.forward(ids)[-1]
    pos = len(ids)
    for i in range(DECODE_STEPS + 1):
        scale = float(np.abs(want).max())
        steps.append({"step": "prefill" if i == 0 else f"decode {i}", "rel_err": float(np.abs(got - want).max()) / scale,
                      "argmax": [int(np.argmax(got)), int(np.argmax(want))], "max_logit": scale})  # fmt: skip
        if i == DECODE_STEPS:
            break
        token = int(np.argmax(want))  # both go on from the reference's token
        got, want = session.decode(token, pos).logits(), ref.forward([token])[-1]
        pos += 1
    return {"steps": steps, "seconds": time.monotonic() - t0, "worst_rel_err": max(s["rel_err"] for s in steps),
            "tokens_agree": sum(s["argmax"][0] == s["argmax"][1] for s in steps), "of": len(steps)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--bundle", required=True, help="the unpacked bundle (models.json with GGUF and artifact paths)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=150.0, help="seconds for all the models together")
    ap.add_argument("--max-bytes", type=float, default=2e9, help="the largest weights (bytes a token reads) checked")
    args = ap.parse_args()
    end = time.monotonic() + args.budget_s
    results: Json = {}
    models = json.loads((Path(args.bundle) / "models.json").read_text())
    for model in sorted(models, key=lambda m: m["bytes_per_token"]):  # the small ones first
        if model["bytes_per_token"] > args.max_bytes:
            results[model["key"]] = {"skipped": f"weights of {model['bytes_per_token'] / 1e9:.1f} GB: numpy takes minutes"}
        elif end - time.monotonic() < 20:
            results[model["key"]] = {"skipped": "out of time"}
        else:
            try:
                results[model["key"]] = check(model)
            except Exception as exc:  # a failed model is a result too; the next one runs
                results[model["key"]] = {"error": f"{type(exc).__name__}: {exc}"[-2000:]}
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
        print(f"{model['key']}: {json.dumps(results[model['key']])[:400]}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
