"""Tier 4 for Gemma 3 270M: greedy tokens equal llama.cpp's (fixtures/golden/gemma3.json).

Same rule as the SmolLM2 golden test (tests/golden/test_golden_smollm2.py): tokens match exactly
until the first step where llama.cpp's own top-1/top-2 gap is below NEAR_TIE, and a divergence
there must pick llama.cpp's runner-up. Which near-tie a prompt meets first depends on the
kernels' rounding: with f32 activations the France prompt agreed for 15 tokens (a 0.11 near-tie)
and the others for all 32; with the integer dot-product kernels on an AVX2 CPU (activations
rounded to Q8 per 32 weights, llama.cpp rounds its Q4_K activations per 256) the France and
counting prompts agree for all 32 and the code prompt for 23 (a near-tie there). The test asks
for at least 11 tokens of every prompt, the first near-tie any of these runs met (0.035).
llama.cpp's 8-bit activations move its first-step logits by up to 0.72 from zinc's exact ones
(the code prompt), so the logit check allows TOP1_TOL = 1.0 (tests/model/test_gemma3_numerics.py
compares zinc's logits with the float64 reference).
Lavapipe is slow on this model (on 2 idle cores: compile about 60 s, a prompt's prefill about 2 s
a token, each decode step with its 262k-token Q8_0 head 2.5 s), so CI checks the first prompt's
first VULKAN_TOKENS tokens only; the opt-in long tier (`pytest --golden-long -m golden_long`) runs
32 tokens of every prompt on Vulkan (about 6 minutes): the France prompt agrees for 15 (a 0.11
near-tie, llama.cpp's runner-up taken), the code and counting prompts for all 32.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ONE_SEQUENCE, VULKAN_LONG, SessionFactory, device_params, golden
from tests.golden.test_golden_smollm2 import run_prompt
from zinc.errors import GGUFError
from zinc.model.gguf_file import resolve_model

TOP1_TOL = 1.0
VULKAN_TOKENS = 3
VULKAN_PROMPTS = 1


@pytest.fixture(scope="session")
def gemma3() -> Path:
    try:
        return resolve_model("gemma3-270m")
    except GGUFError as exc:
        pytest.skip(exc.message)


@pytest.mark.golden
@pytest.mark.slow
@pytest.mark.parametrize("device", [*device_params("cpu", "vulkan"), VULKAN_LONG])
def test_gemma3_greedy_matches_llama_cpp(device: str, gemma3: Path, open_session: SessionFactory) -> None:
    data = golden("gemma3")
    on = device.removesuffix("-long")
    # on Vulkan no other test opens Gemma 3: its artifact needs no batched decode entries
    session = open_session(gemma3, on, ONE_SEQUENCE if on == "vulkan" else None)
    short = device == "vulkan"  # CI's Vulkan run: the first prompt's first tokens
    n = VULKAN_TOKENS if short else data["settings"]["gen_tokens"]
    prompts = data["prompts"][:VULKAN_PROMPTS] if short else data["prompts"]
    matched = []
    for prompt in prompts:
        matched.append(run_prompt(session, prompt, n, TOP1_TOL))
    assert min(matched) >= (VULKAN_TOKENS if short else 11), matched
