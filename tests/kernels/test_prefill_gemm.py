"""The Vulkan GPU targets' prefill: chunks padded to GEMM_ROWS rows, matmuls as a dequantization
and a GEMM (zinc.compiler.gemm).

What makes it a GEMM is IREE's choice of pipeline, so the compile tests read it from the
executable configurations: a tiled pipeline for the padded chunk's matmuls, not SubgroupReduce
(one workgroup per token and row, which the fused quantized matmul gets). ampere and rdna3 only
compile here; the padded entry points run on lavapipe with the f32 GEMM (`ZINC_VULKAN_GEMM=f32`),
which must give the fused form's logits and the reference's. The kernels' arithmetic for every
quant type is checked in tests/kernels/test_quant_kernels.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.compile_pool import compile_kernel
from tests.conftest import DEVICES, reference_model
from tests.kernels.test_quant_kernels import gemm_function, quantized
from tests.kernels.test_vulkan_targets import QUANTIZED
from tests.model.test_fixture_numerics import TOL
from zinc.artifact import PREFILL_ROWS
from zinc.compiler.build import artifact_key, ensure_artifact, plan
from zinc.compiler.gemm import dequant_name, gemm_name, render_dequant, render_gemm
from zinc.compiler.kernels import QUANT_TYPES
from zinc.compiler.targets import GEMM_ROWS, GENERIC, compile_mlir, prefill_gemm, vulkan_target_flags
from zinc.errors import ArtifactError, ZincError
from zinc.model.gguf_file import open_gguf
from zinc.runtime.device import to_host
from zinc.runtime.module import LoadedModule, load_failure
from zinc.runtime.session import ModelSession


def test_the_named_targets_take_gemms_and_the_generic_target_keeps_the_fused_form(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ZINC_VULKAN_GEMM", raising=False)
    assert GEMM_ROWS == PREFILL_ROWS  # a chunk the session sends always fits the padded entry
    assert prefill_gemm("rdna3") == prefill_gemm("valhall") == (GEMM_ROWS, "f16")
    # NVIDIA's driver fails to build the cooperative-matrix f16 GEMM: its targets take f32
    for name in ("ampere", "ada", "turing", "volta", "pascal"):
        assert prefill_gemm(name) == (GEMM_ROWS, "f32"), name
    assert prefill_gemm(GENERIC) is None
    monkeypatch.setenv("ZINC_VULKAN_GEMM", "f32")
    assert prefill_gemm(GENERIC) == (GEMM_ROWS, "f32")
    monkeypatch.setenv("ZINC_VULKAN_GEMM", "off")
    assert prefill_gemm("ampere") is None
    monkeypatch.setenv("ZINC_VULKAN_GEMM", "bf16")
    with pytest.raises(ZincError, match="choose off, f16 or f32"):
        prefill_gemm(GENERIC)


def test_only_the_prefill_entries_are_padded_and_the_form_is_in_the_cache_key(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ZINC_VULKAN_GEMM", raising=False)
    path = tiny_models["tiny-q8-q41"]
    mlir = plan(path, "vulkan", (1, 4), "rdna3").mlir
    entries = dict(re.findall(r"func\.func @(\w+)\((.*?)\n}\n", mlir, re.S))
    for name in ("prefill", "prefill_kv"):
        body = entries[name]
        assert f"%T = arith.constant {GEMM_ROWS} : index" in body and "@gemm_f16_" in body, name
        # the output head's one-token matmul is left; no fused matmul over the chunk's tokens
        assert not re.search(r"@matmul_\w+_t_", body), name
    for name in ("decode_b1", "decode_b4"):
        assert "@gemm_" not in entries[name] and "@dequant_" not in entries[name], name
    assert "@gemm_" not in plan(path, "vulkan", (1, 4)).mlir
    gguf = open_gguf(path)
    generic = artifact_key(gguf, "vulkan", (1,))
    monkeypatch.setenv("ZINC_VULKAN_GEMM", "f32")
    assert artifact_key(gguf, "vulkan", (1,)) != generic


def _pipelines(directory: Path) -> Iterator[tuple[str, str]]:
    """(dispatch name, IREE pipeline) of each executable configuration dumped into `directory`."""
    for f in sorted(directory.iterdir()):
        text = f.read_text()
        name, pipe = re.search(r"func\.func @(\w+)", text), re.search(r"pipeline<(\w+)>", text)
        if name and pipe:
            yield name.group(1), pipe.group(1)


def gemm_module(dt: str) -> str:
    """Every quantized type's dequantization and GEMM, x of GEMM_ROWS rows as a padded chunk's."""
    n, k, rows = 64, 512, GEMM_ROWS
    parts = []
    for i, qname in enumerate(QUANTIZED):
        q = QUANT_TYPES[qname]
        pt, wt = q.param_type(n, k), f"tensor<{n}x{k}x{dt}>"
        parts += [render_dequant(q, n, k, dt), render_gemm(n, k, dt) if i == 0 else ""]
        parts.append(
            f"func.func @main{i}(%w: {pt}, %x: tensor<{rows}x{k}xf32>) -> tensor<{rows}x{n}xf32> {{\n"
            f"  %wd = func.call @{dequant_name(q, n, k, dt)}(%w) : ({pt}) -> {wt}\n"
            f"  %xd = tensor.cast %x : tensor<{rows}x{k}xf32> to tensor<?x{k}xf32>\n"
            f"  %y = func.call @{gemm_name(n, k, dt)}(%xd, %wd) : (tensor<?x{k}xf32>, {wt}) -> tensor<?x{n}xf32>\n"
            f"  %ys = tensor.cast %y : tensor<?x{n}xf32> to tensor<{rows}x{n}xf32>\n"
            f"  return %ys : tensor<{rows}x{n}xf32>\n}}\n"
        )
    return "\n".join(parts)


@pytest.mark.parametrize(
    ("target", "pipeline"),
    [("ampere", "CooperativeMatrixVectorize"), ("rdna3", "CooperativeMatrixVectorize")],
)
def test_every_dequantization_and_gemm_compiles_for_the_gpu_targets_as_a_tiled_gemm(
    target: str, pipeline: str, tmp_path: Path
) -> None:
    flags = (*vulkan_target_flags(target), f"--iree-hal-dump-executable-configurations-to={tmp_path}")
    compile_mlir(gemm_module("f16"), "vulkan", flags)  # for its dumped configurations: not memoized
    found = dict(_pipelines(tmp_path))
    gemms = {name: pipe for name, pipe in found.items() if "matmul_like" in name}
    assert gemms, f"no matmul dispatch among {sorted(found)}"
    assert set(gemms.values()) == {pipeline}, gemms


def test_the_f16_gemm_saturates_an_outlier_instead_of_overflowing() -> None:
    """An input beyond f16's range (a large activation) becomes 65504, not inf: the products stay
    finite, as llvm-cpu computes the f16 form here (lavapipe's target cannot)."""
    n, k, rows = 64, 512, GEMM_ROWS
    pt = QUANT_TYPES["Q8_0"].param_type(n, k)
    text = f'util.global private @w = #flow.parameter.named<"model"::"w"> : {pt}\n' + gemm_function(
        "Q8_0", n, k, "f16", rows
    )
    spec = DEVICES["cpu"]()
    rng = np.random.default_rng(3)
    param, ref_w = quantized("Q8_0", n, k, rng)
    mod = LoadedModule(compile_kernel(text, "cpu"), spec.uri, parameter_arrays={"w": param})
    x = np.zeros((rows, k), np.float32)
    x[0, 0], x[1, 0], x[2, 1] = 1e6, -3e5, 1.0
    y = to_host(mod.fn("gemm_f16")(mod.to_device(x)), mod.device)
    assert np.isfinite(y).all()
    w16 = ref_w.astype(np.float16).astype(np.float64)
    want = np.stack([65504.0 * w16[:, 0], -65504.0 * w16[:, 0], w16[:, 1]])
    np.testing.assert_allclose(y[:3], want, rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def sessions(tiny_models: dict[str, Path]) -> Iterator[dict[tuple[str, str], ModelSession]]:
    """Sessions on lavapipe of two fixtures, each compiled with the f32 GEMM and the fused form."""
    out: dict[tuple[str, str], ModelSession] = {}
    spec = DEVICES["vulkan"]()
    with pytest.MonkeyPatch.context() as mp:
        for fixture in ("tiny-q8-q41", "tiny-gemma3"):
            for form in ("f32", "off"):
                mp.setenv("ZINC_VULKAN_GEMM", form)
                art = ensure_artifact(tiny_models[fixture], "vulkan", batch_sizes=(1,), vulkan_target=GENERIC)
                out[fixture, form] = ModelSession(art, tiny_models[fixture], spec, context_length=512)
    yield out


@pytest.mark.vulkan
@pytest.mark.parametrize("fixture", ["tiny-q8-q41", "tiny-gemma3"])
def test_padded_gemm_chunks_give_the_fused_forms_logits_on_lavapipe(
    fixture: str, sessions: dict[tuple[str, str], ModelSession], tiny_models: dict[str, Path]
) -> None:
    """A prompt of two chunks (128 and 72 tokens: the second padded by 56), a decode step reading
    them, and a 5-token prompt continuing after them (123 padding rows), through the padded GEMM
    entry points and through the fused ones: the same logits as each other, and the reference's."""
    gemm, fused = sessions[fixture, "f32"], sessions[fixture, "off"]
    ref = reference_model(tiny_models[fixture], "vulkan")
    prompt = [(i * 37) % 300 + 1 for i in range(200)]
    steps = [
        ("a prompt of two chunks", lambda s: s.prefill(prompt), prompt),
        ("a decode step after it", lambda s: s.decode(42, len(prompt)), [42]),
        ("a prompt continuing after cached rows", lambda s: s.prefill([5, 6, 7, 8, 9], start=len(prompt) + 1), [5, 6, 7, 8, 9]),
    ]  # fmt: skip
    for what, run, ids in steps:
        a, b = run(gemm).logits(), run(fused).logits()
        expect = ref.forward(ids)[-1]
        scale = float(np.abs(expect).max())
        assert float(np.abs(a - b).max()) / scale < TOL, f"{what}: GEMM and fused forms differ"
        assert float(np.abs(a - expect).max()) / scale < TOL, f"{what}: the GEMM form against the reference"


@pytest.mark.vulkan
def test_a_kernel_the_device_cannot_build_is_a_clear_error_naming_the_cause() -> None:
    """An artifact for another GPU (ampere's subgroups of 32; on an NVIDIA driver, a kernel it
    refuses to compile) fails to load on lavapipe as an ArtifactError, not IREE's RuntimeError."""
    vmfb = compile_mlir(gemm_module("f16"), "vulkan", vulkan_target_flags("ampere"))
    with pytest.raises(ArtifactError, match=r"driver could not build the artifact's kernels \(.*subgroup size 32.*--vulkan-target"):
        LoadedModule(vmfb, "vulkan")


def test_the_nvidia_driver_refusal_reads_as_its_cause() -> None:
    """The failure an H200's driver gave for IREE 3.13's cooperative-matrix GEMM, word for word."""
    seen = ("Error creating vm context with modules: c/runtime/src/iree/hal/drivers/vulkan/executable.c:1529: "
            "UNKNOWN; [vkCreateComputePipelines] VK_ERROR_UNKNOWN; pipelines[0]; while invoking native function "
            "hal.executable.create; while calling import; \n[ 0] bytecode zinc_model@9:4844 -")  # fmt: skip
    message = load_failure(seen, "vulkan")
    assert "(UNKNOWN; [vkCreateComputePipelines] VK_ERROR_UNKNOWN; pipelines[0])" in message
    assert "--vulkan-target NAME" in message and "bytecode" not in message
    assert load_failure("out of memory", "vulkan") == "cannot load compiled module on vulkan: out of memory"
