"""Tier 3: a whole model as a named GPU target compiles it, run on lavapipe against the float64
reference: with the integer dot-product decode matmuls (zinc.compiler.dp4), and without them
(ZINC_VULKAN_DOT=off: the linalg matmuls of zinc.compiler.subgroup_matmul).

Named targets (ampere, rdna3, ...) assume subgroups of 32 or 64 lanes; lavapipe's are 8 wide. So
the module zinc emits for ampere, with the dp4 kernels for subgroups of 8, is compiled for a
Vulkan target that declares what lavapipe has (tests.conftest `lavapipe_subgroup_target`), where
IREE takes the same subgroup pipelines, and run there: prefills, batched decode steps over
scattered slots and a lone step, each row's logits against the reference (rounding the
activations to Q8 as the dp4 kernels do, or not; a prompt chunk's matmuls as its GEMM computes
them: `ReferenceModel(gemm=...)`), and each row's greedy token from the device's
argmax against the logits'. Prompt chunks take the f16 GEMM the named targets compile (with the
dp4 kernels: the configuration a GPU runs) or the f32 one (ZINC_VULKAN_GEMM=f32); lavapipe
computes f16 tensors wrong only under the generic target.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import DEVICES, for_device_target, lavapipe_subgroup_target
from tests.model.test_fixture_numerics import TOL, TOL_Q8, rel_err
from zinc.compiler import dp4
from zinc.compiler.build import compile_model, plan
from zinc.compiler.targets import target_flags
from zinc.model.gguf_file import open_gguf
from zinc.model.reference import ReferenceModel
from zinc.runtime.session import ModelSession


def compile_for_lavapipe(
    model: Path, out: Path, monkeypatch: pytest.MonkeyPatch, dot: bool, gemm: str
) -> str:
    """The ampere module (with 8-wide dp4 kernels when `dot`, prompt chunks through the `gemm`
    GEMM), compiled for lavapipe's subgroups; returns its MLIR."""
    monkeypatch.setitem(dp4.SUBGROUP, "ampere", 8)
    monkeypatch.setenv("ZINC_VULKAN_GEMM", gemm)
    monkeypatch.setenv(dp4.ENV, "on" if dot else "off")
    p = plan(model, "vulkan", (1, 4), vulkan_target="ampere")
    text = for_device_target(p.mlir, lavapipe_subgroup_target(8))
    compile_model(dataclasses.replace(p, mlir=text, flags=target_flags("vulkan")), out)
    return text


@pytest.mark.vulkan
@pytest.mark.parametrize(("dot", "gemm"), [(True, "f16"), (False, "f32")], ids=["dp4-f16", "linalg-f32"])
def test_a_named_target_model_decodes_on_lavapipe(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dot: bool, gemm: str
) -> None:
    path = tiny_models["tiny-q8-q41"]  # Q8_0 embeddings and head, Q4_1 attention and FFN
    text = compile_for_lavapipe(path, tmp_path / "art", monkeypatch, dot, gemm)
    assert ("xf16>" in text) == (gemm == "f16")  # the f16 GEMM's operands
    if dot:
        assert "func.call @dp4_q4_1_s8_1x" in text and "func.call @dp4_q4_1_s8_4x" in text
        assert "func.call @dp4_q8_0_s8_4x" in text  # the tied output head of a decode batch
    else:
        assert "dp4_" not in text and "zinc.compiler.subgroup_matmul" in text
    session = ModelSession(tmp_path / "art", path, DEVICES["vulkan"](), context_length=256)
    ref_model = open_gguf(path)
    prompts = [[3, 17, 200, 5, 9, 11, 4, 8], [7, 1], [250, 30, 31, 32, 33]]
    free = np.random.default_rng(0).permutation(np.arange(1, 200, dtype=np.int32))
    slots = [free[i * 60 : (i + 1) * 60] for i in range(len(prompts))]
    refs = [ReferenceModel(ref_model, q8_activations=dot, kv_f16=True, gemm=gemm) for _ in prompts]
    tol = TOL_Q8 if dot else TOL  # Q8 rounding is discontinuous (tests.conftest.reference_model)
    positions = []
    for prompt, own, ref in zip(prompts, slots, refs, strict=True):
        step = session.prefill_slots(prompt, 0, own[: len(prompt)])
        # the prefill's last-token head is a one-token decode matmul; its trunk the GEMM
        assert rel_err(step.logits(), ref.forward(prompt)[-1]) < tol
        assert step.token == int(np.argmax(step.logits()))
        positions.append(len(prompt))
    tokens = [5, 6, 7]
    for _ in range(3):  # decode_b4, 3 rows and a padding row
        batch = session.decode_batch(tokens, positions, [own[: p + 1] for own, p in zip(slots, positions, strict=True)])
        for i, ref in enumerate(refs):
            expect = ref.forward([tokens[i]])[-1]
            assert rel_err(batch.logits(i), expect) < tol, f"row {i} at position {positions[i]}"
            assert batch.token(i) == int(np.argmax(batch.logits(i)))
        positions = [p + 1 for p in positions]
        tokens = [int(np.argmax(batch.logits(i))) for i in range(len(tokens))]
    single = session.decode_batch([tokens[1]], [positions[1]], [slots[1][: positions[1] + 1]])  # decode_b1
    assert rel_err(single.logits(0), refs[1].forward([tokens[1]])[-1]) < tol
    assert single.token(0) == int(np.argmax(single.logits(0)))


@pytest.mark.vulkan
def test_a_named_target_qwen2_model_prefills_and_decodes_on_lavapipe(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """qwen2's recipe (q/k/v biases, q's and k's added inside NEOX RoPE, untied head) through the
    configuration a GPU runs: dp4 decode matmuls, prompt chunks through the f16 GEMM."""
    path = tiny_models["tiny-qwen2"]
    text = compile_for_lavapipe(path, tmp_path / "art", monkeypatch, True, "f16")
    assert "func.call @rope_neox_1_" in text and "_bias(" in text
    session = ModelSession(tmp_path / "art", path, DEVICES["vulkan"](), context_length=256)
    ref = ReferenceModel(open_gguf(path), q8_activations=True, kv_f16=True, gemm="f16")
    prompt = [3, 17, 200, 5, 9, 11, 4, 8]
    step = session.prefill(prompt)
    assert rel_err(step.logits(), ref.forward(prompt)[-1]) < TOL_Q8
    token = step.token
    for i in range(3):
        step = session.decode(token, len(prompt) + i)
        assert rel_err(step.logits(), ref.forward([token])[-1]) < TOL_Q8, f"step {i}"
        assert step.token == int(np.argmax(step.logits()))
        token = step.token
