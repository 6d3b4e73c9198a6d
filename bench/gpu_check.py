"""zinc's Vulkan logits on the GPU against the float64 numpy reference (zinc.model.reference).

Usage: python bench/gpu_check.py --bundle DIR --out FILE [--budget-s 150] [--max-bytes 2e9] [--chained-steps 32]

scripts/gpu-bench runs it after bench_gpu.py: zinc's kernels for the GPU's IREE target (the f16
GEMM prefill, the subgroup matvecs, the f16 KV slab) have never run on a GPU, and speed says
nothing of whether they compute the model. For each model of the bundle whose weights are at most
--max-bytes (numpy takes minutes over an 8B model), a prompt of PROMPT tokens (two prefill calls:
128 rows and a padded 72) and DECODE_STEPS decode steps, fed the reference's greedy tokens: each
step's max |logit error| over the largest |logit|, and whether the greedy tokens agree; the same
for the model's artifact without the dp4 matmuls, where the bundle carries one (under "linalg").
Then, under "chained", the same session's time for --chained-steps greedy steps enqueued as
`zinc serve` enqueues them: a step's interval and the host's time to enqueue one.
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
CHAINED_STEPS = 32  # timed after the check: the host's enqueue of a step against the step itself


def prompt_ids(n: int) -> list[int]:
    """Ordinary ids of every vocabulary zinc serves (as bench_gpu.prompt_ids)."""
    return [3000 + (i * 7919) % 40000 for i in range(n)]


def reference(gguf: str) -> list[tuple[list[int], Any]]:
    """The float64 reference's steps: (the ids fed, its logits), the prompt and then DECODE_STEPS
    of its own greedy tokens; every artifact of the model is fed the same."""
    import numpy as np

    from zinc.model.gguf_file import open_gguf
    from zinc.model.reference import ReferenceModel

    ref = ReferenceModel(open_gguf(gguf), kv_f16=True, lazy=True)
    ids = prompt_ids(PROMPT)
    steps = [(ids, ref.forward(ids)[-1])]
    for _ in range(DECODE_STEPS):
        token = [int(np.argmax(steps[-1][1]))]
        steps.append((token, ref.forward(token)[-1]))
    return steps


def check(artifact: str, gguf: str, want: list[tuple[list[int], Any]], chained_steps: int = CHAINED_STEPS) -> Json:
    import numpy as np

    from zinc.runtime.device import resolve_device
    from zinc.runtime.session import ModelSession

    t0 = time.monotonic()
    session = ModelSession(Path(artifact), Path(gguf), resolve_device("vulkan"), context_length=512)
    steps: list[Json] = []
    pos = 0
    for i, (ids, expect) in enumerate(want):
        got = (session.prefill(ids) if i == 0 else session.decode(ids[0], pos)).logits()
        pos += len(ids)
        scale = float(np.abs(expect).max())
        steps.append({"step": "prefill" if i == 0 else f"decode {i}", "rel_err": float(np.abs(got - expect).max()) / scale,
                      "argmax": [int(np.argmax(got)), int(np.argmax(expect))], "max_logit": scale})  # fmt: skip
    result: Json = {"steps": steps, "seconds": time.monotonic() - t0, "worst_rel_err": max(s["rel_err"] for s in steps),
                    "tokens_agree": sum(s["argmax"][0] == s["argmax"][1] for s in steps), "of": len(steps)}  # fmt: skip
    try:  # a failure here leaves the check's result as it is
        result["chained"] = chained(session, int(np.argmax(got)), pos, chained_steps)
    except Exception as exc:
        result["chained"] = {"error": f"{type(exc).__name__}: {exc}"[-2000:]}
    return result


def chained(session: Any, token: int, pos: int, n: int) -> Json:
    """`n` greedy steps as `zinc serve` runs them (each enqueued before the one before it is
    read): the host's time to enqueue a step (the VM call, command recording, the uploads; the
    median) and a step's time (the mean). An enqueue shorter than a step keeps the device busy; as
    long as one, the host is what bounds decode."""
    import statistics

    prev = session.decode(token, pos)
    _ = prev.token  # the first step's pipelines and buffers set up before anything is timed
    enqueue: list[float] = []
    t0 = time.perf_counter()
    for i in range(n):
        e0 = time.perf_counter()
        step = session.decode_after(prev, pos + 1 + i)
        enqueue.append(time.perf_counter() - e0)
        _ = prev.token
        prev = step
    _ = prev.token
    return {"steps": n, "enqueue_ms": 1e3 * statistics.median(enqueue), "ms_per_step": 1e3 * (time.perf_counter() - t0) / n}


def check_model(model: Json, end: float, chained_steps: int = CHAINED_STEPS) -> Json:
    """`check` of the model's artifact, and of its `artifact_linalg` (the decode matmuls without
    integer dot products: zinc.compiler.subgroup_matmul's forms) under "linalg" while time is left."""
    want = reference(model["gguf"])
    result = check(model["artifact"], model["gguf"], want, chained_steps)
    if "artifact_linalg" in model and end - time.monotonic() > 20:
        try:
            result["linalg"] = check(model["artifact_linalg"], model["gguf"], want, chained_steps)
        except Exception as exc:  # reported beside the first artifact's result
            result["linalg"] = {"error": f"{type(exc).__name__}: {exc}"[-2000:]}
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--bundle", required=True, help="the unpacked bundle (models.json with GGUF and artifact paths)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=150.0, help="seconds for all the models together")
    ap.add_argument("--max-bytes", type=float, default=2e9, help="the largest weights (bytes a token reads) checked")
    ap.add_argument("--chained-steps", type=int, default=CHAINED_STEPS, help="greedy steps timed after the check (min 1)")
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
                results[model["key"]] = check_model(model, end, max(1, args.chained_steps))
            except Exception as exc:  # a failed model is a result too; the next one runs
                results[model["key"]] = {"error": f"{type(exc).__name__}: {exc}"[-2000:]}
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
        print(f"{model['key']}: {json.dumps(results[model['key']])[:400]}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
