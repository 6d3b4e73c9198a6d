"""Tier 2: the CPU fast path (compiler/tiled.py) against gguf's dequantize + numpy.

Each GGUF tensor is repacked exactly as `zinc compile` does it, the planes are bound as
parameters, and the decode (T = 1), batched decode (R = 3 and 9 rows, more than one row tile)
and prefill (T = ?) kernels run on both CPU drivers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from tests.compile_pool import KernelJob, compile_kernel
from tests.conftest import DEVICES, device_params
from zinc.compiler import tiled
from zinc.compiler.kernels import QUANT_TYPES
from zinc.runtime.device import to_host
from zinc.runtime.module import LoadedModule

SHAPES = [(64, 128), (96, 32), (32, 576)]  # (N rows out, K inputs): N a multiple of the tile width


def kernel_module(qtype: str, n: int, k: int) -> str:
    q = QUANT_TYPES[qtype]
    planes = tiled.plane_types(q, n, k)
    text = "".join(
        f'util.global private @{p} = #flow.parameter.named<"model"::"{p}"> : {t}\n' for p, t in planes.items()
    )
    text += tiled.render_decode(q, n, k) + tiled.render_prefill(q, n, k)
    text += tiled.render_decode(q, n, k, 3) + tiled.render_decode(q, n, k, 9)
    loads = "".join(f"  %{p} = util.global.load @{p} : {t}\n" for p, t in planes.items())
    names, types = ", ".join(f"%{p}" for p in planes), ", ".join(planes.values())
    for fn, callee, t in (
        ("mv", tiled.decode_name(q, n, k), "1"), ("mm", tiled.prefill_name(q, n, k), "?"),
        ("b3", tiled.decode_name(q, n, k, 3), "3"), ("b9", tiled.decode_name(q, n, k, 9), "9"),
    ):  # fmt: skip
        arg, res = f"tensor<{t}x{k}xf32>", f"tensor<{t}x{n}xf32>"
        text += (
            f"func.func @{fn}(%x: {arg}) -> {res} {{\n{loads}"
            f"  %y = func.call @{callee}({names}, %x) : ({types}, {arg}) -> {res}\n  return %y : {res}\n}}\n"
        )
    return text


def compile_jobs(test: str, params: Mapping[str, Any]) -> list[KernelJob]:
    """The modules each test below compiles (tests/compile_pool.py compiles them ahead)."""
    if test != "test_tiled_kernels_match_dequantize":
        return []
    return [(kernel_module(params["qtype"], n, k), "cpu", ()) for n, k in SHAPES]


@pytest.mark.parametrize("device", device_params("cpu", "cpu-task"))
@pytest.mark.parametrize("qtype", list(tiled.TILED_TYPES))
def test_tiled_kernels_match_dequantize(qtype: str, device: str) -> None:
    spec = DEVICES[device]()
    q = QUANT_TYPES[qtype]
    rng = np.random.default_rng(11)
    for n, k in SHAPES:
        w = rng.standard_normal((n, k)).astype(np.float32)
        raw = quants.quantize(w, GGMLQuantizationType[qtype])
        ref_w = quants.dequantize(raw, GGMLQuantizationType[qtype]).astype(np.float64)
        planes = tiled.repack(q, raw.reshape(-1).view(np.uint8), n, k)
        assert sum(p.nbytes for p in planes.values()) == raw.nbytes  # a byte shuffle, same size
        mod = LoadedModule(
            compile_kernel(kernel_module(qtype, n, k), spec.target), spec.uri, parameter_arrays=planes
        )
        x = rng.standard_normal((9, k)).astype(np.float32)
        ref = x.astype(np.float64) @ ref_w.T
        scale = np.abs(ref).max()
        y = to_host(mod.fn("mm")(mod.to_device(x)), mod.device)
        assert y.shape == (9, n)
        assert np.abs(y - ref).max() / scale < 1e-5, f"{qtype} prefill {n}x{k}"
        y1 = to_host(mod.fn("mv")(mod.to_device(x[4:5])), mod.device)
        assert np.abs(y1 - ref[4:5]).max() / scale < 1e-5, f"{qtype} decode {n}x{k}"
        y3 = to_host(mod.fn("b3")(mod.to_device(x[2:5])), mod.device)
        assert np.abs(y3 - ref[2:5]).max() / scale < 1e-5, f"{qtype} batched decode of 3 rows {n}x{k}"
        y9 = to_host(mod.fn("b9")(mod.to_device(x)), mod.device)
        assert np.abs(y9 - ref).max() / scale < 1e-5, f"{qtype} batched decode of 9 rows {n}x{k}"
        # each row of a batch is computed exactly as that token alone would be
        assert np.array_equal(y9[4:5], y1), f"{qtype}: a batch row differs from the single-token kernel"


def test_only_whole_tiles_take_the_fast_path() -> None:
    q8 = QUANT_TYPES["Q8_0"]
    assert tiled.supports(q8, 64, 64) and not tiled.supports(q8, 48, 64)
    assert not tiled.supports(QUANT_TYPES["F16"], 64, 64)
