"""Tier 3: a whole model with the Vulkan integer dot-product decode matmuls (zinc.compiler.dp4),
run on lavapipe against the float64 reference.

The dp4 kernels exist for GPU targets (ampere, rdna3, ...), whose other kernels assume
subgroups of 32 or 64; lavapipe's are 8 wide. So the module zinc emits for ampere, with the dp4
kernels for subgroups of 8, is compiled for a Vulkan target that declares what lavapipe has
(subgroups of 8 with shuffles and arithmetic, 4 x int8 dot products, 8- and 16-bit storage) and
run there: prefills, batched decode steps over scattered slots and a lone step, each row's
logits against the reference rounding the activations to Q8 as the kernels do. Prefill chunks
take the f32 GEMM (ZINC_VULKAN_GEMM=f32: lavapipe computes f16 tensors wrong). The greedy token
is not checked: the named targets' device argmax does not run right on 8-wide subgroups (the
logits are what the dp4 kernels make).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import DEVICES
from tests.model.test_fixture_numerics import TOL_Q8, rel_err
from zinc.compiler import dp4
from zinc.compiler.build import compile_model, plan
from zinc.compiler.targets import target_flags
from zinc.model.gguf_file import open_gguf
from zinc.model.reference import ReferenceModel
from zinc.runtime.session import ModelSession

LAVAPIPE_TARGET = (
    '#hal.device.target<"vulkan", [#hal.executable.target<"vulkan-spirv", "vulkan-spirv-fb", '
    '{iree_codegen.target_info = #iree_gpu.target<arch = "", features = "spirv:v1.6,cap:Shader", '
    "wgp = <compute = fp32|fp16|int32|int16|int8, storage = b32|b16|b8, subgroup = shuffle|arithmetic, "
    "dot = dp4xi8toi32, mma = [], subgroup_size_choices = [8], max_workgroup_sizes = [1024, 1024, 1024], "
    "max_thread_count_per_workgroup = 1024, max_workgroup_memory_bytes = 65536, "
    "max_workgroup_counts = [65535, 65535, 65535]>>}>]> : !hal.device"
)


def compile_for_lavapipe(model: Path, out: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The ampere module with 8-wide dp4 kernels, compiled for LAVAPIPE_TARGET; returns its MLIR."""
    monkeypatch.setitem(dp4.SUBGROUP, "ampere", 8)
    monkeypatch.setenv("ZINC_VULKAN_GEMM", "f32")
    monkeypatch.delenv(dp4.ENV, raising=False)
    p = plan(model, "vulkan", (1, 4), vulkan_target="ampere")
    head = "module @zinc_model {"
    assert p.mlir.startswith(head)
    text = f"module @zinc_model attributes {{hal.device.targets = [{LAVAPIPE_TARGET}]}} {{" + p.mlir[len(head) :]
    compile_model(dataclasses.replace(p, mlir=text, flags=target_flags("vulkan")), out)
    return text


@pytest.mark.vulkan
def test_a_model_decodes_with_dp4_matmuls_on_lavapipe(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tiny_models["tiny-q8-q41"]  # Q8_0 embeddings and head, Q4_1 attention and FFN
    text = compile_for_lavapipe(path, tmp_path / "art", monkeypatch)
    assert "func.call @dp4_q4_1_s8_1x" in text and "func.call @dp4_q4_1_s8_4x" in text
    assert "func.call @dp4_q8_0_s8_4x" in text  # the tied output head of a decode batch
    session = ModelSession(tmp_path / "art", path, DEVICES["vulkan"](), context_length=256)
    ref_model = open_gguf(path)
    prompts = [[3, 17, 200, 5, 9, 11, 4, 8], [7, 1], [250, 30, 31, 32, 33]]
    free = np.random.default_rng(0).permutation(np.arange(1, 200, dtype=np.int32))
    slots = [free[i * 60 : (i + 1) * 60] for i in range(len(prompts))]
    refs = [ReferenceModel(ref_model, q8_activations=True, kv_f16=True) for _ in prompts]
    positions = []
    for prompt, own, ref in zip(prompts, slots, refs, strict=True):
        step = session.prefill_slots(prompt, 0, own[: len(prompt)])
        # the prefill's last-token head is a one-token dp4 matmul; its trunk the f32 GEMM
        assert rel_err(step.logits(), ref.forward(prompt)[-1]) < TOL_Q8
        positions.append(len(prompt))
    tokens = [5, 6, 7]
    for _ in range(3):  # decode_b4, 3 rows and a padding row
        batch = session.decode_batch(tokens, positions, [own[: p + 1] for own, p in zip(slots, positions, strict=True)])
        for i, ref in enumerate(refs):
            expect = ref.forward([tokens[i]])[-1]
            assert rel_err(batch.logits(i), expect) < TOL_Q8, f"row {i} at position {positions[i]}"
        positions = [p + 1 for p in positions]
        tokens = [int(np.argmax(batch.logits(i))) for i in range(len(tokens))]
    single = session.decode_batch([tokens[1]], [positions[1]], [slots[1][: positions[1] + 1]])  # decode_b1
    assert rel_err(single.logits(0), refs[1].forward([tokens[1]])[-1]) < TOL_Q8
