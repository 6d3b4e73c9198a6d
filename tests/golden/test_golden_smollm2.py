"""Tier 4: greedy tokens equal llama.cpp's (fixtures/golden/smollm2.json), on CPU and Vulkan.

llama.cpp quantizes activations to 8 bits for its quantized dot products and keeps the KV cache
in f16, so its logits differ from an exact f32 computation by up to a few tenths here. Tokens
must match exactly until the first step where llama.cpp's own top-1/top-2 gap is below
NEAR_TIE; at a divergence, zinc's token must be llama.cpp's runner-up at a near-tie step
(anything else is a bug). Lavapipe runs SmolLM2 at seconds per token, so the Vulkan run in CI
generates fewer tokens (VULKAN_TOKENS) of two prompts (VULKAN_PROMPTS) with the same rule; the
opt-in long tier (`pytest --golden-long -m golden_long`) generates all 32 of every prompt on Vulkan.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import VULKAN_LONG, SessionFactory, device_params, golden
from zinc.engine.generate import generate_ids
from zinc.runtime.session import ModelSession

NEAR_TIE = 0.5  # logits; the largest gap at which zinc (exact) and llama.cpp (q8 activations) may disagree
# first-step top logits, zinc vs llama.cpp: both round activations to Q8, and the roundings that flip
# differ, so the gap moves with any rounding change (the code prompt's: 0.47 with the linalg prefill
# attention, 0.52 with the flash one, whose attention differs from it by 1e-7)
TOP1_TOL = 0.75
VULKAN_TOKENS = 6
# CI's Vulkan prompts: France (5 tokens, the chained test's) and counting (17, no near-tie in its
# first 6 steps); the code prompt (a 0.44 near-tie at its 4th token, a minute of prefill on
# lavapipe) runs in the long tier
VULKAN_PROMPTS = (0, 2)


def check_tokens(ours: list[int], prompt: dict[str, Any]) -> int:
    """Compare with llama.cpp; returns how many tokens matched before a legitimate divergence: a
    token llama.cpp scored within NEAR_TIE of its own choice (its runner-up, or a third of a
    three-way tie: the code prompt's step 6 has four tokens within 0.19)."""
    expected = prompt["generated_ids"]
    for i, (a, b) in enumerate(zip(ours, expected, strict=False)):
        if a == b:
            continue
        top5 = prompt["steps"][i]["top5"]  # llama.cpp's [token, logit], best first
        gap = top5[0][1] - dict((int(t), v) for t, v in top5).get(a, float("-inf"))
        assert gap < NEAR_TIE, (
            f"{prompt['text']!r}: token {i} is {a}, llama.cpp chose {b} and scored {a} "
            f"{gap:.3f} below it (its top 5: {top5}); not a near-tie"
        )
        return i
    return len(ours)


_STEPWISE: dict[tuple[int, str, int], tuple[ModelSession, np.ndarray, list[int]]] = {}


def stepwise(session: ModelSession, prompt: dict[str, Any], n: int) -> tuple[np.ndarray, list[int]]:
    """The prefill's logits and `n` greedy tokens, one `decode` call a step (EOS not stopping, as
    in the golden run); once per session, prompt and length in a run (seconds a token on lavapipe)."""
    key = (id(session), prompt["text"], n)
    if key not in _STEPWISE or _STEPWISE[key][0] is not session:
        step = session.prefill(prompt["ids"])
        ours = [step.token]
        logits = step.logits()
        while len(ours) < n:
            ours.append(session.decode(ours[-1], len(prompt["ids"]) + len(ours) - 1).token)
        _STEPWISE[key] = (session, logits, ours)
    return _STEPWISE[key][1:]


def run_prompt(session: ModelSession, prompt: dict[str, Any], n: int, top1_tol: float) -> int:
    """Check the first step's top logits against llama.cpp's (within `top1_tol`), generate `n`
    greedy tokens and return how many agree."""
    logits, ours = stepwise(session, prompt, n)
    for tok, value in prompt["first_token_top5"][:3]:
        assert abs(float(logits[tok]) - value) < top1_tol, f"{prompt['text']!r}: logit of {tok}"
    assert len(ours) == n
    return check_tokens(ours, prompt)


@pytest.mark.golden
@pytest.mark.parametrize("device", [*device_params("cpu", "vulkan"), VULKAN_LONG])
def test_smollm2_greedy_matches_llama_cpp(device: str, smollm2: Path, open_session: SessionFactory) -> None:
    data = golden("smollm2")
    session = open_session(smollm2, device.removesuffix("-long"))
    short = device == "vulkan"  # CI's Vulkan run
    n = VULKAN_TOKENS if short else data["settings"]["gen_tokens"]
    prompts = [data["prompts"][i] for i in VULKAN_PROMPTS] if short else data["prompts"]
    matched = []
    for prompt in prompts:
        matched.append(run_prompt(session, prompt, n, TOP1_TOL))
    # every prompt must agree for a while; SmolLM2's first prompt meets a 0.33 near-tie at token 5
    assert min(matched) >= min(5, n), matched


@pytest.mark.golden
@pytest.mark.parametrize("device", device_params("cpu", "vulkan"))
def test_chained_greedy_steps_match_llama_cpp(device: str, smollm2: Path, open_session: SessionFactory) -> None:
    """`generate_ids` feeds each decode step the one before's token on the device
    (ModelSession.decode_after): the tokens of the step-by-step loop, and llama.cpp's by the same rule."""
    data = golden("smollm2")
    session = open_session(smollm2, device)
    n = VULKAN_TOKENS if device == "vulkan" else data["settings"]["gen_tokens"]
    prompt = min(data["prompts"], key=lambda p: len(p["ids"]))  # lavapipe prefills seconds a token
    ours = list(generate_ids(session, prompt["ids"], n))
    assert ours == stepwise(session, prompt, n)[1]  # the same calls, fed from the device instead of the host
    assert check_tokens(ours, prompt) >= min(5, n)
