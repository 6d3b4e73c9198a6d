"""bench/gpu_kernels.py on lavapipe (an artifact's kernels built one by one, the refused ones
named) and what it found: every layer's attention shares one executable, on ampere and on the
generic target (the layer's number reaches it as a push constant,
zinc.compiler.emitter.Body.opaque_index)."""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.compile_pool import compile_kernel
from tests.kernels.test_prefill_gemm import gemm_module
from zinc.compiler.build import plan
from zinc.compiler.targets import compile_mlir, shared_layers, vulkan_target_flags

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import gpu_kernels

pytestmark = pytest.mark.vulkan


def _kernels(path: Path, vulkan_target: str) -> list[list[int]]:
    """The SPIR-V modules of the 2-layer model's artifact for `vulkan_target` (compiled once a run)."""
    p = plan(path, "vulkan", (1, 4), vulkan_target)
    return gpu_kernels.spirv_modules(compile_kernel(p.mlir, "vulkan", vulkan_target_flags(vulkan_target)))


@pytest.mark.parametrize("vulkan_target", ["ampere", "generic"])
def test_every_layer_shares_its_attention_kernels(tiny_models: dict[str, Path], vulkan_target: str) -> None:
    """On ampere and the generic target, the 2-layer model's kernels that read the KV slab over a
    dynamic length (i32 slab words in, f32 out: the decode attention's two reductions, the
    prefill's K/V gathers) are there once per shape and entry point; with the layer's number (and
    K or V) folded in, each was there once per layer (and part)."""
    modules = _kernels(tiny_models["tiny-q8-q41"], vulkan_target)
    names = [gpu_kernels.reflect(w)[0] for w in modules]
    shapes = (re.sub(r"_dispatch_\d+", "", n) for n in names)
    reads = Counter(s for s in shapes if re.search(r"(xD|Dx)\w*_(f32x)?(i32x)+f32$", s))
    assert any(r.startswith("decode_b1_") for r in reads) and any(r.startswith("prefill_") for r in reads), names
    assert set(reads.values()) == {1}, reads


def test_lavapipe_builds_every_kernel_and_names_the_ones_it_refuses(tiny_models: dict[str, Path]) -> None:
    device = gpu_kernels.Device()
    modules = _kernels(tiny_models["tiny-q8-q41"], "generic")
    assert all(device.build(w) == 0 for w in modules)
    # ampere's cooperative-matrix f16 GEMMs: lavapipe has no cooperative matrices
    gemms = gpu_kernels.spirv_modules(compile_mlir(gemm_module("f16"), "vulkan", vulkan_target_flags("ampere")))
    refused = [gpu_kernels.reflect(w)[0] for w in gemms if device.build(w) != 0]
    assert refused and all("matmul_like" in name for name in refused), refused


def test_reflect_reads_the_entry_bindings_and_push_constants(tiny_models: dict[str, Path]) -> None:
    entry, pairs, push = gpu_kernels.reflect(_kernels(tiny_models["tiny-q8-q41"], "generic")[0])
    assert re.fullmatch(r"\w+_dispatch_\d+_\w+", entry)
    assert pairs and all(s == 0 for s, _ in pairs) and push % 4 == 0


def test_which_targets_share_layers() -> None:
    """A dynamic slab offset leaves the subgroup pipelines an i64 vector: adreno and valhall (no
    64-bit integers) keep each layer's constant, as the CPU does; the generic target keeps the
    offset scalar and shares its layers."""
    assert shared_layers("ampere") and shared_layers("ada") and shared_layers("rdna3") and shared_layers("cdna3")
    assert shared_layers("generic")
    assert not shared_layers("adreno") and not shared_layers("valhall")
