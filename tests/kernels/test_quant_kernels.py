"""Tier 2: every supported quant type's fused kernels against gguf's dequantize + numpy.

Each module holds the prefill matmul (dynamic T), the decode matmul (T = 1) and the embedding
row gather for one type and shape, with the weight bound as a parameter exactly as in a model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from tests.conftest import DEVICES, device_params
from zinc.compiler.kernels import QUANT_TYPES, gather_name, matmul_name, render_gather, render_matmul
from zinc.compiler.targets import compile_mlir
from zinc.runtime.device import to_host
from zinc.runtime.module import LoadedModule

SHAPES = [(64, 128), (96, 32), (32, 256)]  # (N rows out, K inputs)


def quantized(name: str, w: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(parameter bytes as bound by zinc, dequantized float64 weights)."""
    q = QUANT_TYPES[name]
    n, k = w.shape
    if name == "F32":
        return w, w.astype(np.float64)
    if name == "F16":
        h = w.astype(np.float16)
        return h.view(np.int8).reshape(n, k, 2), h.astype(np.float64)
    t = GGMLQuantizationType[name]
    raw = quants.quantize(w, t)
    return raw.view(np.int8).reshape(n, k // q.block, q.block_bytes), quants.dequantize(raw, t).astype(np.float64)


def kernel_module(name: str, n: int, k: int) -> str:
    q = QUANT_TYPES[name]
    pt = q.param_type(n, k)
    text = f'util.global private @w = #flow.parameter.named<"model"::"w"> : {pt}\n'
    text += render_matmul(q, n, k, True) + render_matmul(q, n, k, False) + render_gather(q, n, k, True)
    for fn, callee, arg, res in (
        ("mm", matmul_name(q, n, k, True), f"tensor<?x{k}xf32>", f"tensor<?x{n}xf32>"),
        ("mv", matmul_name(q, n, k, False), f"tensor<1x{k}xf32>", f"tensor<1x{n}xf32>"),
        ("rows", gather_name(q, n, k, True), "tensor<?xi32>", f"tensor<?x{k}xf32>"),
    ):
        text += (
            f"func.func @{fn}(%x: {arg}) -> {res} {{\n  %w = util.global.load @w : {pt}\n"
            f"  %y = func.call @{callee}(%w, %x) : ({pt}, {arg}) -> {res}\n  return %y : {res}\n}}\n"
        )
    return text


@pytest.mark.parametrize("device", device_params("cpu", "vulkan"))
@pytest.mark.parametrize("qtype", list(QUANT_TYPES))
def test_kernels_match_dequantize(qtype: str, device: str) -> None:
    spec = DEVICES[device]()
    rng = np.random.default_rng(7)
    for n, k in SHAPES:
        w = rng.standard_normal((n, k)).astype(np.float32)
        param, ref_w = quantized(qtype, w)
        mod = LoadedModule(compile_mlir(kernel_module(qtype, n, k), spec.target), spec.uri, parameter_arrays={"w": param})
        x = rng.standard_normal((5, k)).astype(np.float32)
        ref = x.astype(np.float64) @ ref_w.T
        scale = np.abs(ref).max()
        y = to_host(mod.fn("mm")(mod.to_device(x)), mod.device)
        assert y.shape == (5, n)
        assert np.abs(y - ref).max() / scale < 1e-5, f"{qtype} prefill matmul {n}x{k}"
        y1 = to_host(mod.fn("mv")(mod.to_device(x[2:3])), mod.device)
        assert np.abs(y1 - ref[2:3]).max() / scale < 1e-5, f"{qtype} decode matmul {n}x{k}"
        ids = np.array([n - 1, 0, n // 2], np.int32)
        rows = to_host(mod.fn("rows")(mod.to_device(ids)), mod.device)
        np.testing.assert_allclose(rows, ref_w[ids], rtol=0, atol=1e-6, err_msg=f"{qtype} gather")
