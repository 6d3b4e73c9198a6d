"""Tier 4, opt-in (`pytest --golden-long -m golden_long`): llama.cpp's greedy tokens through the
module zinc compiles for a named GPU target, on lavapipe.

The ampere module of SmolLM2 and of Gemma 3 270M (its dp4 decode kernels for lavapipe's 8-wide
subgroups, or with ZINC_VULKAN_DOT=off the linalg matmuls of zinc.compiler.subgroup_matmul),
compiled for a target declaring lavapipe's subgroups (tests.model.test_gpu_target_model
`compile_for_lavapipe`), so IREE takes the subgroup pipelines a GPU's code takes; prompt chunks
through the f32 GEMM. Every golden prompt for GEN_TOKENS tokens, by the rule of
the other golden tests. Each case compiles for one to five minutes and runs a prompt in about 30 s
(SmolLM2) or a few minutes (Gemma 3), so it stays out of CI.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import DEVICES, golden
from tests.golden import test_golden_gemma3, test_golden_smollm2
from tests.golden.test_golden_smollm2 import run_prompt
from tests.model.test_gpu_target_model import compile_for_lavapipe
from zinc.errors import GGUFError
from zinc.model.gguf_file import default_model_path, resolve_model
from zinc.runtime.session import ModelSession

GEN_TOKENS = 16
# (model, logit tolerance of the first step, tokens every prompt must agree for: the first
# near-tie the CPU and generic Vulkan runs meet)
MODELS = {
    "smollm2": (default_model_path, test_golden_smollm2.TOP1_TOL, 5),
    "gemma3": (lambda: resolve_model("gemma3-270m"), test_golden_gemma3.TOP1_TOL, 11),
}


@pytest.mark.golden
@pytest.mark.golden_long
@pytest.mark.vulkan
@pytest.mark.parametrize("dot", [True, False], ids=["dp4", "linalg"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_named_target_module_matches_llama_cpp_on_lavapipe(
    name: str, dot: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    find, top1_tol, agree = MODELS[name]
    try:
        model = find()
    except GGUFError as exc:  # as the other golden tests: a model wheel not installed
        pytest.skip(exc.message)
    mlir = compile_for_lavapipe(model, tmp_path / "art", monkeypatch, dot, "f32")
    assert ("func.call @dp4_" in mlir) == dot
    session = ModelSession(tmp_path / "art", model, DEVICES["vulkan"](), context_length=512)
    matched = [run_prompt(session, prompt, GEN_TOKENS, top1_tol) for prompt in golden(name)["prompts"]]
    assert min(matched) >= agree, matched
