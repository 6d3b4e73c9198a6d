"""Tier 3: the compiled model against the float64 numpy reference on tiny seeded GGUF fixtures.

Each fixture mixes quant types (Q8_0/Q4_1, Q4_0/F16, F32/Q8_0, tied and untied output, GQA and
plain MHA) and covers one architecture: llama, qwen2 (q/k/v biases), qwen3 (QK-norm, a head size
other than n_embd/n_head), gemma3 (six layers, a window of 5 on the local ones and one global layer)
and gemma3 with every option (window 3 and period 2, local RoPE base, linear RoPE scaling, a query
scalar, final logit softcapping), and llama with Llama 3.1's per-pair RoPE frequency factors
(`rope_freqs.weight`). The sequence covers a prefill, decodes at growing positions, and a second
prefill that continues after cached rows, so attention over old and new rows is checked on every
device.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ONE_SEQUENCE, SessionFactory, device_params, reference_model

# max |logit error| / max |logit|. f32 vs float64 accumulation alone is 1e-7..4e-6, but the cached
# K/V are f16 on every device (as the reference's, tests/conftest.py): a value that f32's error puts
# on the other side of a tie between two halves is stored one f16 ulp off, and a value close to 0
# many of its ulps off (its f32 error is the size of its row's). One such K value in 384 moved
# tiny-llama3-ropefreqs' batched decode logits by 5.5e-5 on Vulkan, and tiny-wide-kv's 240-token
# prompt and decodes were 4.4e-5 off; rounding all K/V to f16 or not moves them 1e-4 there.
# Where the rounding itself is checked bit for bit: tests/kernels/test_f16_bits.py.
TOL = 2e-4
TOL_Q8 = 1e-2  # with Q8 activations (the CPU on AVX2), see tests/conftest.py


# The fixtures that other tests open with the default decode buckets (batched decode, packed
# prefill, prefix hits, scoring): they share that artifact here, as tiny-q40-f16 does on the CPU
# with `zinc --prompt-ids` (tests/e2e/test_cli.py); the others compile decode_b1 only.
BATCHED = {"tiny-q8-q41", "tiny-gemma3", "tiny-llama3-ropefreqs"}


def buckets(fixture: str, device: str) -> tuple[int, ...] | None:
    """The decode buckets `fixture`'s session on `device` takes: None (the default) or ONE_SEQUENCE."""
    shared = fixture in BATCHED or (fixture == "tiny-q40-f16" and device != "vulkan")
    return None if shared else ONE_SEQUENCE


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("device", device_params("cpu", "cpu-task", "vulkan"))
@pytest.mark.parametrize(
    "fixture",
    [
        "tiny-q8-q41",
        "tiny-q40-f16",
        "tiny-f32-q8",
        "tiny-qwen2",
        "tiny-qwen3",
        "tiny-gemma3",
        "tiny-gemma3-scaled",
        "tiny-llama3-ropefreqs",
    ],
)
def test_compiled_matches_reference(
    fixture: str, device: str, tiny_models: dict[str, Path], open_session: SessionFactory
) -> None:
    path = tiny_models[fixture]
    session = open_session(path, device, buckets(fixture, device))
    ref = reference_model(path, device)
    tol = TOL_Q8 if ref.q8_activations else TOL
    prompt = [3, 17, 200, 5, 9, 11]
    step = session.prefill(prompt)
    expect = ref.forward(prompt)[-1]
    assert rel_err(step.logits(), expect) < tol
    assert step.token == int(np.argmax(step.logits()))
    pos = len(prompt)
    for token in (7, 100, 42, 0):
        step = session.decode(token, pos)
        pos += 1
        assert rel_err(step.logits(), ref.forward([token])[-1]) < tol, f"decode at position {pos - 1}"
    more = [1, 2, 3, 250]
    step = session.prefill(more, start=pos)
    assert rel_err(step.logits(), ref.forward(more)[-1]) < tol, "prefill continuing after cached rows"
    pos += len(more)
    long = [(i * 37) % 300 for i in range(21)]  # more than one prefill chunk on Vulkan
    step = session.prefill(long, start=pos)
    assert rel_err(step.logits(), ref.forward(long)[-1]) < tol, "a prompt longer than a prefill chunk"
