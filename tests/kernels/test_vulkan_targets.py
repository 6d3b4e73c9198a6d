"""Vulkan GPU targets: which IREE target a device maps to, and that zinc's kernels compile for them.

`zinc compile --target vulkan` compiles for the GPU in the machine (zinc.compiler.targets
`vulkan_target_for`, from the device's properties as zinc.runtime.vulkan_probe reads them) or the
one `--vulkan-target` names. Named GPU targets (ampere, rdna3, ...) enable IREE's subgroup
pipelines, under which the nibble-packed matmuls need forms of two reduction dims
(zinc.compiler.subgroup_matmul; tests/kernels/test_subgroup_matmul.py runs them on lavapipe); the
generic target takes those forms too, being faster there. Compile only here: there is no GPU to
run ampere or rdna3 code.
The whole models and the real-shape widths are in the slow tier (minutes of iree-compile).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests.compile_pool import KernelJob, compile_kernel
from tests.conftest import DEVICES
from tests.kernels.test_real_shape_kernels import widths_for
from zinc.compiler import paged
from zinc.compiler.build import artifact_key, plan
from zinc.compiler.emitter import Body, ModuleEmitter
from zinc.compiler.kernels import QUANT_TYPES, matmul_name, render_matmul
from zinc.compiler.subgroup_matmul import FORMS
from zinc.compiler.targets import (
    AMD,
    ARM,
    GENERIC,
    INTEL,
    NVIDIA,
    QUALCOMM,
    GpuProperties,
    check_vulkan_target,
    compile_mlir,
    gpu_properties,
    pick_device,
    vulkan_target_flags,
    vulkan_target_for,
)
from zinc.errors import ZincError
from zinc.model.gguf_file import open_gguf
from zinc.runtime.device import to_host
from zinc.runtime.module import LoadedModule
from zinc.runtime.vulkan_probe import probe

GPU_TARGETS = ("ampere", "rdna3", GENERIC)
MESA = 0x10005  # the vendor id Mesa's software drivers report
DEVICES_SEEN = [  # (name as the driver reports it, vendor id, type, features) -> target
    ("NVIDIA H100 80GB HBM3", NVIDIA, "discrete", (), "ampere"),
    ("NVIDIA H200", NVIDIA, "discrete", (), "ampere"),
    ("NVIDIA A100-SXM4-80GB", NVIDIA, "discrete", (), "ampere"),
    ("NVIDIA GeForce RTX 3090", NVIDIA, "discrete", (), "ampere"),
    ("NVIDIA GeForce RTX 4090", NVIDIA, "discrete", (), "ada"),
    ("NVIDIA L4", NVIDIA, "discrete", (), "ada"),
    ("Tesla T4", NVIDIA, "discrete", (), "turing"),
    ("NVIDIA GeForce RTX 2080 Ti", NVIDIA, "discrete", (), "turing"),
    ("Tesla V100-SXM2-16GB", NVIDIA, "discrete", (), "volta"),
    ("NVIDIA GeForce GTX 1080", NVIDIA, "discrete", (), "pascal"),
    ("NVIDIA Graphics Device", NVIDIA, "discrete", ("coop", "dot"), "ampere"),  # newer than the table
    ("NVIDIA Graphics Device", NVIDIA, "discrete", (), GENERIC),
    ("AMD Radeon RX 7900 XTX (RADV NAVI31)", AMD, "discrete", (), "rdna3"),
    ("AMD Radeon Graphics (RADV GFX1103_R1)", AMD, "integrated", (), "rdna3"),
    ("AMD Radeon RX 6800 XT", AMD, "discrete", (), "rdna2"),
    ("AMD Radeon RX 9070 XT", AMD, "discrete", (), "rdna4"),
    ("AMD Radeon RX 5700 XT (RADV NAVI10)", AMD, "discrete", (), "rdna1"),
    ("AMD Instinct MI300X", AMD, "discrete", (), "cdna3"),
    ("Intel(R) Arc(tm) A770 Graphics (DG2)", INTEL, "discrete", ("coop", "dot"), GENERIC),
    ("Mali-G715", ARM, "integrated", (), "valhall"),
    ("Mali-G52", ARM, "integrated", (), GENERIC),  # Bifrost
    ("Adreno (TM) 740", QUALCOMM, "integrated", (), "adreno"),
    ("llvmpipe (LLVM 15.0.6, 256 bits)", MESA, "cpu", ("dot",), GENERIC),
    ("SwiftShader Device (LLVM 10.0.0)", 0x1AE0, "cpu", (), GENERIC),
]


@pytest.mark.parametrize(("name", "vendor", "kind", "features", "expected"), DEVICES_SEEN)
def test_a_device_maps_to_its_iree_target(name: str, vendor: int, kind: str, features: tuple[str, ...], expected: str) -> None:
    gpu = GpuProperties(
        name, vendor, kind, subgroup_size=32, integer_dot_product="dot" in features,
        cooperative_matrix="coop" in features, storage_16bit=True,
    )  # fmt: skip
    assert vulkan_target_for(gpu) == expected
    assert check_vulkan_target(expected) == expected  # every answer is a target zinc accepts


def test_target_flags_and_bad_names() -> None:
    assert vulkan_target_flags(GENERIC) == ()
    assert vulkan_target_flags("ampere") == ("--iree-vulkan-target=ampere",)
    with pytest.raises(ZincError, match="unknown Vulkan target 'hopper'"):
        vulkan_target_flags("hopper")


def test_the_target_is_in_the_cache_key_and_the_manifest_flags(tiny_models: dict[str, Path]) -> None:
    gguf = open_gguf(tiny_models["tiny-q8-q41"])
    keys = {t: artifact_key(gguf, "vulkan", (1,), t) for t in GPU_TARGETS}
    assert len(set(keys.values())) == len(GPU_TARGETS)
    assert artifact_key(gguf, "vulkan", (1,)) == keys[GENERIC]
    p = plan(tiny_models["tiny-q8-q41"], "vulkan", (1,), "rdna3")
    assert p.vulkan_target == "rdna3" and "--iree-vulkan-target=rdna3" in p.flags
    assert "= linalg.index" not in _matmuls(p.mlir)
    generic = plan(tiny_models["tiny-q8-q41"], "vulkan", (1,))
    assert not any(f.startswith("--iree-vulkan-target") for f in generic.flags)
    # the generic target's Q4_1 matmuls loop over two reduction dims too
    assert "matmul_q4_1" in _matmuls(generic.mlir) and "= linalg.index" not in _matmuls(generic.mlir)


def _matmuls(mlir: str) -> str:
    """The text of the quantized matmul helpers of a module."""
    return "\n".join(re.findall(r"func\.func private @matmul_q.*?\n}\n", mlir, re.S))


def matmul_module(qname: str, n: int, k: int, dynamic: bool, two_dims: bool) -> str:
    q, t = QUANT_TYPES[qname], "?" if dynamic else "1"
    name = matmul_name(q, n, k, dynamic)
    w, x, y = q.param_type(n, k), f"tensor<{t}x{k}xf32>", f"tensor<{t}x{n}xf32>"
    return render_matmul(q, n, k, dynamic, two_dims) + (
        f"func.func @main(%w: {w}, %x: {x}) -> {y} {{\n"
        f"  %y = func.call @{name}(%w, %x) : ({w}, {x}) -> {y}\n  return %y : {y}\n}}\n"
    )


def test_the_vulkan_form_loops_over_two_reduction_dims_and_the_cpu_form_is_unchanged() -> None:
    two = '["parallel", "parallel", "reduction", "reduction"]'
    for qname in FORMS:
        gpu = render_matmul(QUANT_TYPES[qname], 32, 256, True, two_dims=True)
        cpu = render_matmul(QUANT_TYPES[qname], 32, 256, True)
        assert "= linalg.index" not in gpu and gpu.count("linalg.generic") == 1 and two in gpu
        assert "= linalg.index" in cpu and two not in cpu
    q8 = QUANT_TYPES["Q8_0"]  # two reduction dims already: one form everywhere
    assert render_matmul(q8, 32, 256, True, two_dims=True) == render_matmul(q8, 32, 256, True)


QUANTIZED = (*FORMS, "Q8_0", "F16", "F32")


@pytest.mark.parametrize("target", GPU_TARGETS)
def test_every_matmul_compiles_for_the_gpu_targets(target: str) -> None:
    """One module of every linalg matmul form (a prompt and one token) for the target, compiled:
    with linalg.index in their bodies, every nibble-packed type failed for ampere and rdna3
    (memref.alloc of index in workgroup memory)."""
    compile_kernel(every_matmul_module(), "vulkan", vulkan_target_flags(target))


def every_matmul_module() -> str:
    parts = []
    for i, qname in enumerate(QUANTIZED):
        for dynamic in (True, False):
            text = matmul_module(qname, 64, 512, dynamic, True)
            parts.append(text.replace("@main", f"@main{i}{'t' if dynamic else '1'}"))
    return "\n".join(parts)


def compile_jobs(test: str, params: Mapping[str, Any]) -> list[KernelJob]:
    """The modules the compile-only tests compile (tests/compile_pool.py compiles them ahead)."""
    if test == "test_every_matmul_compiles_for_the_gpu_targets":
        return [(every_matmul_module(), "vulkan", vulkan_target_flags(params["target"]))]
    if test == "test_decode_attention_compiles_for_the_gpu_targets":
        target = params["target"]
        return [(decode_attention_module(target != GENERIC), "vulkan", vulkan_target_flags(target))]
    return []


@pytest.mark.vulkan
def test_lavapipe_maps_to_the_generic_target() -> None:
    """The probe reads this machine's device from the Vulkan loader: lavapipe is a CPU
    implementation, so zinc compiles for the generic target."""
    devices = probe()
    assert devices, "the Vulkan loader reported no device"
    device = pick_device(devices)
    assert device is not None and device.name == devices[0].name
    if device.device_type == "cpu":
        assert device.subgroup_size >= 1
        assert vulkan_target_for(gpu_properties(device)) == GENERIC


@pytest.mark.sizes  # minutes of iree-compile each: the opt-in tier, not every CI run
@pytest.mark.parametrize("target", GPU_TARGETS)
@pytest.mark.parametrize("qname", ["Q4_0", "Q8_0", "Q4_K", "Q6_K", "Q5_0", "Q5_K"])
def test_real_shape_matmuls_compile_for_the_gpu_targets(target: str, qname: str) -> None:
    """The real-shape widths of tests/kernels/test_real_shape_kernels.py, compiled for the target."""
    parts = []
    for k in widths_for(qname):
        for dynamic in (True, False):
            text = matmul_module(qname, 32, k, dynamic, True)
            parts.append(text.replace("@main", f"@main{k}{'t' if dynamic else '1'}"))
    compile_mlir("\n".join(parts), "vulkan", vulkan_target_flags(target))


@pytest.mark.e2e
def test_the_cli_refuses_a_bad_vulkan_target(tiny_models: dict[str, Path]) -> None:
    from tests.e2e.test_cli import assert_one_line_error, zinc

    model = str(tiny_models["tiny-q8-q41"])
    assert_one_line_error(zinc("compile", model, "--target", "vulkan", "--vulkan-target", "hopper"), "unknown Vulkan target 'hopper'")
    assert_one_line_error(zinc("compile", model, "--target", "cpu", "--vulkan-target", "ampere"), "--vulkan-target needs --target vulkan")


@pytest.mark.slow
@pytest.mark.e2e
def test_the_cli_compiles_for_a_gpu_not_in_this_machine(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    """`--vulkan-target rdna3` on a machine without that GPU: the artifact's manifest records it."""
    from tests.e2e.test_cli import zinc

    out = tmp_path / "art"
    proc = zinc("compile", str(tiny_models["tiny-q8-q41"]), "--target", "vulkan", "--vulkan-target", "rdna3", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert "--iree-vulkan-target=rdna3" in manifest["flags"]


def decode_attention_module(index_inputs: bool) -> str:
    """mlir/attention_batch.mlir (Vulkan's decode attention over the slab) for one row, SmolLM2's heads."""
    hp = SimpleNamespace(block_count=3, head_count=9, head_count_kv=3, key_length=64)
    mod = ModuleEmitter(index_inputs=index_inputs)
    b = Body(mod, dynamic=False)
    b.per_row = True
    out = paged.attention_batch(b, hp, 1, "%q", ("%kn", "%vn"), "%len", 0.125, 0)  # type: ignore[arg-type]
    new, q = "tensor<1x3x64xf32>", "tensor<1x576xf32>"
    mod.entries.append(
        f"func.func @main(%cache: {paged.slab_type(hp, mod.kv_dtype)}, %q: {q}, %ctx: tensor<1x?xi32>, %kn: {new}, "
        f"%vn: {new}, %len: tensor<1xi32>) -> {q} {{\n" + "\n".join(b.lines) + f"\n  return {out} : {q}\n}}"
    )
    text: str = mod.text("attention")
    return text


@pytest.mark.parametrize("target", GPU_TARGETS)
def test_decode_attention_compiles_for_the_gpu_targets(target: str) -> None:
    """Its slab reads index the cache by (g, d): linalg.index there failed for ampere like the matmuls."""
    compile_kernel(decode_attention_module(target != GENERIC), "vulkan", vulkan_target_flags(target))


@pytest.mark.vulkan
def test_the_gpu_decode_attention_computes_the_same_bits_on_lavapipe() -> None:
    spec = DEVICES["vulkan"]()
    rng = np.random.default_rng(9)
    cache = rng.standard_normal((40, 3, 2, 3, 64)).astype(np.float16).view(np.int32)  # f16x2
    args = (
        rng.standard_normal((1, 576)).astype(np.float32),
        np.arange(1, 25, dtype=np.int32)[None],
        *(rng.standard_normal((1, 3, 64)).astype(np.float32) for _ in range(2)),
        np.array([21], np.int32),
    )
    ys = []
    for index_inputs in (False, True):
        mod = LoadedModule(compile_mlir(decode_attention_module(index_inputs), "vulkan"), spec.uri)
        ys.append(to_host(mod.fn("main")(mod.to_device(cache), *(mod.to_device(a) for a in args)), mod.device))
    assert np.isfinite(ys[0]).all() and np.array_equal(ys[0], ys[1])


@pytest.mark.sizes  # minutes of iree-compile each: the opt-in tier, not every CI run
@pytest.mark.parametrize("target", ["ampere", "rdna3"])
def test_smollm2_compiles_for_the_gpu_targets(target: str, smollm2: Path) -> None:
    """Every kernel of SmolLM2's Vulkan module (prefill, decode buckets 1, 4, 8, kv_write) for the
    target: it failed for ampere and rdna3 in matmul_q4_1_t_576x576 before the iota inputs, then in
    the decode attention. About 10 minutes of iree-compile on 2 busy cores."""
    p = plan(smollm2, "vulkan", (1, 4, 8), target)
    compile_mlir(p.mlir, "vulkan", vulkan_target_flags(target))


@pytest.mark.sizes  # minutes of iree-compile each: the opt-in tier, not every CI run
@pytest.mark.parametrize("target", ["ampere", "rdna3"])
def test_gemma3_compiles_for_the_gpu_targets(target: str) -> None:
    """Gemma 3 270M's Vulkan module (Q4_K, Q5_0, Q6_K and Q8_0 matmuls, sliding-window attention,
    its 262,144-token head) for ampere, the target an H100 maps to, and rdna3 (checked by hand:
    724 s and 311 s)."""
    from zinc.errors import GGUFError
    from zinc.model.gguf_file import resolve_model

    try:
        model = resolve_model("gemma3-270m")
    except GGUFError as exc:
        pytest.skip(exc.message)
    p = plan(model, "vulkan", (1, 4, 8), target)
    compile_mlir(p.mlir, "vulkan", vulkan_target_flags(target))
