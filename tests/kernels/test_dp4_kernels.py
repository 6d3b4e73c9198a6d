"""Tier 2: the Vulkan integer dot-product matmuls (zinc.compiler.dp4) against `gguf.quants`.

They are compiled for IREE's `ampere` target (whose SPIR-V has OpSDotAccSat and subgroup
operations) with subgroups of 8, the size of lavapipe's, and run there: lavapipe executes the
dot products and the subgroup reductions, so the kernels' arithmetic is checked here although the
code is meant for a GPU. The reference is the dequantized weights times x as the kernel quantizes
it (per 32-block, max|x| / 127, round to even), which the kernel must match to float rounding,
and times x itself, which it must match as closely as llama.cpp's Q8_1 activations do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from tests.compile_pool import KernelJob, compile_kernel
from tests.conftest import DEVICES
from tests.kernels.test_quant_kernels import quantized
from zinc.compiler import dp4
from zinc.compiler.emitter import Body, ModuleEmitter
from zinc.compiler.kernels import QUANT_TYPES
from zinc.compiler.targets import vulkan_target_flags
from zinc.errors import ZincError
from zinc.runtime.device import to_host
from zinc.runtime.module import LoadedModule

Array = np.ndarray[Any, Any]
LAVAPIPE_SUBGROUP = 8
ROWS = 3  # tokens of the batch entry
# (rows, columns): rows not a multiple of a workgroup's (4 subgroups x 2), units not of the subgroup
SHAPES = [(64, 512), (37, 1536), (8, 2048)]  # Q6_K: whole pairs of 256-blocks


def module(name: str, n: int, k: int, s: int, entries: int = 3) -> str:
    """Three entries: `main` (x -> W x through Body.linear, as the model calls it), `twice` (two
    matmuls of the same x: one quantization) and `rows` (a decode batch of ROWS tokens)."""
    mod = ModuleEmitter(dp4_subgroup=s)
    q = QUANT_TYPES[name]
    lines = []
    for entry, count, rows in (("main", 1, 0), ("twice", 2, 0), ("rows", 1, ROWS))[:entries]:
        body = Body(mod, dynamic=rows > 0)
        body.rows = rows
        t = "?" if rows else "1"
        outs = [body.linear(f"w{i}", q, n, k, "%x", f"y{i}") for i in range(count)]
        if count == 2:
            body.emit(f"%sum = arith.addf {outs[0]}, {outs[1]} : tensor<1x{n}xf32>")
            outs = ["%sum"]
        lines += [f"func.func @{entry}(%x: tensor<{t}x{k}xf32>) -> tensor<{t}x{n}xf32> {{", *body.lines]
        lines += [f"  return {outs[0]} : tensor<{t}x{n}xf32>", "}"]
    mod.entries.append("\n".join(lines))
    return mod.text("dp4")


def quantize_like_kernel(x: Array) -> Array:
    """x as the kernel sees it: per 32-block, q = round-to-even(x * 127 / max|x|) times max|x| / 127."""
    xb = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(xb).max(axis=1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.rint(xb * inv)
    return (q * (amax / np.float32(127))).reshape(x.shape).astype(np.float64)


def compile_jobs(test: str, params: Mapping[str, Any]) -> list[KernelJob]:
    """The module each test below compiles (tests/compile_pool.py compiles them ahead)."""
    if test == "test_dp4_matmul_matches_dequantize":
        n, k = params["shape"]
        return [(module(params["qtype"], n, k, LAVAPIPE_SUBGROUP), "vulkan", vulkan_target_flags("ampere"))]
    if test == "test_dp4_kernels_compile_for_every_target_with_dot_products":
        text = module("Q4_K", 64, 256, dp4.SUBGROUP[params["target"]], entries=1)
        return [(text, "vulkan", vulkan_target_flags(t)) for t in (params["target"], "volta")]
    return []


@pytest.mark.vulkan
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_dp4_matmul_matches_dequantize(qtype: str, shape: tuple[int, int]) -> None:
    n, k = shape
    spec = DEVICES["vulkan"]()
    rng = np.random.default_rng(7)
    raw0, ref0 = quantized(qtype, n, k, rng)
    raw1, ref1 = quantized(qtype, n, k, rng)
    text = module(qtype, n, k, LAVAPIPE_SUBGROUP)
    # one quantization per entry: `twice`'s two matmuls share theirs
    assert text.count("spirv.SDotAccSat") > 0 and text.count(f"func.call @{dp4.quantize_name(k)}(") == 2
    assert text.count(f"func.call @{dp4.quantize_name(k, ROWS)}(") == 1
    vmfb = compile_kernel(text, "vulkan", vulkan_target_flags("ampere"))
    mod = LoadedModule(vmfb, spec.uri, parameter_arrays={"w0": raw0, "w1": raw1})
    xs = rng.standard_normal((ROWS, k)).astype(np.float32)
    xs[0, 32:64] = 0.0  # a block of zeros quantizes to zeros
    xs[1, 64:96] *= 1e-3
    xs[2] *= 50.0
    xq = quantize_like_kernel(xs)
    x = xs[:1]
    y = to_host(mod.fn("main")(mod.to_device(x)), mod.device).astype(np.float64)
    assert close(y, ref0, xq[:1])
    full = x.astype(np.float64) @ ref0.T
    assert np.max(np.abs(y - full)) / np.max(np.abs(full)) < 2e-2
    both = to_host(mod.fn("twice")(mod.to_device(x)), mod.device).astype(np.float64)
    assert close(both, ref0 + ref1, xq[:1], np.abs(ref0) + np.abs(ref1))
    rows = to_host(mod.fn("rows")(mod.to_device(xs)), mod.device).astype(np.float64)
    assert rows.shape == (ROWS, n) and close(rows, ref0, xq)


def close(y: Array, w: Array, xq: Array, w_mag: Array | None = None) -> bool:
    """y == xq W^T up to float rounding: within 1e-5 of the sum of the products' magnitudes."""
    mag = np.abs(xq) @ (np.abs(w) if w_mag is None else w_mag).T + 1e-30
    return bool(np.max(np.abs(y - xq @ w.T) / mag) < 1e-5)


@pytest.mark.parametrize("target", sorted(dp4.SUBGROUP))
def test_dp4_kernels_compile_for_every_target_with_dot_products(target: str) -> None:
    """Each target in dp4.SUBGROUP compiles the kernels with its own subgroup size, and its
    SPIR-V has the dot product (a target without them fails to legalize OpSDotAccSat)."""
    text = module("Q4_K", 64, 256, dp4.SUBGROUP[target], entries=1)
    assert compile_kernel(text, "vulkan", vulkan_target_flags(target))
    with pytest.raises(ZincError, match="SDotAccSat"):
        compile_kernel(text, "vulkan", vulkan_target_flags("volta"))


def test_dp4_applies_where_the_target_has_dot_products(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(dp4.ENV, raising=False)
    assert dp4.subgroup_size("ampere") == 32 and dp4.subgroup_size("cdna3") == 64
    assert dp4.subgroup_size("generic") == 0 and dp4.subgroup_size("volta") == 0
    monkeypatch.setenv(dp4.ENV, "off")
    assert dp4.subgroup_size("ampere") == 0
    monkeypatch.setenv(dp4.ENV, "yes")
    with pytest.raises(ZincError, match=dp4.ENV):
        dp4.subgroup_size("ampere")
    q4 = QUANT_TYPES["Q4_0"]
    assert dp4.supports(q4, 64, 128) and not dp4.supports(q4, 64, 96)  # Q4_0: whole pairs of blocks
    assert dp4.supports(QUANT_TYPES["Q4_1"], 64, 96) and dp4.supports(QUANT_TYPES["Q4_K"], 64, 256)
    assert dp4.supports(QUANT_TYPES["Q6_K"], 64, 512) and not dp4.supports(QUANT_TYPES["Q6_K"], 64, 256)
    assert dp4.supports(QUANT_TYPES["Q5_K"], 64, 256) and not dp4.supports(QUANT_TYPES["Q5_1"], 64, 256)
