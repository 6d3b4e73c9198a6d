"""Chained decode steps with the real lead (zinc.engine.batcher.ENQUEUE_LEAD_S) on a fake device:
how close the device runs steps back to back, and how long a new request waits.

Usage: .venv/bin/python bench/bench_chained_steps.py [--step-ms 20] [--steady 50] [--probes 40] [--seed 7]

The scheduler drives the fake model of tests/unit/_fake_step_model.py, whose calls run on an
in-order fake device of --step-ms per call, so only the host's own latency is measured: three
greedy sequences decode (their steps chained) for --steady steps, then --probes one-token
requests come in one at a time, each at a random point of a step (seeded). It prints:
- the device's idle gap between two chained steps (0 when the next was enqueued before the one
  running ended, as the lead intends): median, 90th percentile, max, and the share that is 0;
- for each probe, how many steps started on the device after it came and before its prompt (0:
  it waited for the running step only; 1: it came within the lead, or the host was late), and
  its wait from submitting to its token, in steps.
tests/unit/test_chained_steps.py checks the same behaviour with a lead of half a 120 ms step, so
that it does not depend on the host's speed; these figures do (a busy host is late more often).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from itertools import pairwise
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/ (the fake model)

from tests.unit._fake_step_model import PAGE, FakeModel, prompt, solo
from tests.unit.test_batcher import Run
from zinc.engine.batcher import ENQUEUE_LEAD_S, Scheduler


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--step-ms", type=float, default=20.0, help="the fake device's time per call")
    parser.add_argument("--steady", type=int, default=50, help="chained steps before the first probe")
    parser.add_argument("--probes", type=int, default=40)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    step_s = args.step_ms / 1000
    model = FakeModel(step_s=step_s, kv_slots=PAGE * 64, context_length=256)
    scheduler = Scheduler(model, page_size=16, parallel=8, max_queue=4)
    scheduler.start()
    rng = random.Random(args.seed)
    behind: list[int] = []
    waits: list[float] = []
    try:
        background = [prompt(100 + i, 6) for i in range(3)]
        runs = [Run(scheduler, p, max_tokens=250 - len(p), stop=()) for p in background]
        while len(model.rows("next")) < args.steady:  # the chain alone, then the probes
            time.sleep(0.001)
        for i in range(args.probes):
            time.sleep(rng.uniform(0.0, step_s))
            came = time.monotonic()
            ids = prompt(1000 + i, 5)
            probe = Run(scheduler, ids, max_tokens=1, stop=())
            assert probe.wait().reason == "length" and probe.tokens == solo(ids, 1)
            waits.append((time.monotonic() - came) / step_s)
            ran = [call.kind for call, start in model.ran if start >= came]
            behind.append(ran.index("prefill"))
        for run in runs:
            run.handle.cancel()
            assert run.wait().reason == "abort", (
                "the background ended before the probes: fewer --steady or --probes"
            )
    finally:
        scheduler.close()
    gaps = [(b[1] - a[1] - step_s) * 1000 for a, b in pairwise(model.ran) if a[0].kind == b[0].kind == "next"]
    zero = sum(abs(g) < 1e-6 for g in gaps) / max(1, len(gaps))
    print(f"## Chained steps: {args.step_ms:g} ms fake steps, lead {ENQUEUE_LEAD_S * 1000:g} ms")
    print()
    print(
        f"device gap between chained steps ({len(gaps)}): median {np.median(gaps):.3f} ms, "
        f"p90 {np.quantile(gaps, 0.9):.3f} ms, max {max(gaps):.3f} ms; back to back {zero:.0%}"
    )
    counts = Counter(behind)
    print(
        f"probes ({len(behind)}): steps started before their prompt: "
        + ", ".join(f"{k}: {counts[k]}" for k in sorted(counts))
    )
    print(
        f"probe wait from submit to token: median {np.median(waits):.2f} steps, p90 {np.quantile(waits, 0.9):.2f}"
    )


if __name__ == "__main__":
    main()
