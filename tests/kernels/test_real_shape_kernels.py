"""Tier 2 at the sizes people run: every reduction width of the real-shape table through the kernels.

The widths are those of `fixtures/real_shapes.py` (Llama 3.x 1B-8B, Qwen 2.5 0.5B-7B, Qwen 3 4B/8B,
Gemma 3 1B-12B, Mistral 7B): n_embd (q, k, v, gate, up, the output head), n_head * head_dim
(attn_output) and n_ff (ffn_down). A kernel's code depends on its width (the loop over blocks, and
whether its quantized activation rows fit its stack: `dot8.quantized_apart`) and on its row count;
the output width N only sizes its grid, so N is small here and the slow tier compiles whole models.
On the CPU: the integer dot-product kernels (one token, a batch of 8 rows, a prompt of 11 rows)
of each quant type real files use (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, and Q5_0 and Q5_1, llama.cpp's
stand-ins for a K-quant whose width is not a whole number of 256-blocks), against the weights from
`gguf.quants.dequantize` times the activations rounded to Q8 as the kernels round them. On Vulkan:
the linalg forms every Vulkan target compiles (zinc.compiler.subgroup_matmul; one token, a prompt)
of the same types, against the same weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

import numpy as np
import pytest

from fixtures.real_shapes import SPECS
from tests.compile_pool import KernelJob, compile_kernel
from tests.conftest import DEVICES, device_params, target_of
from tests.kernels.test_quant_kernels import quantized
from zinc.compiler import dot8, dot8_layout
from zinc.compiler.kernels import QUANT_TYPES, matmul_name, render_matmul
from zinc.model.reference import q8_round
from zinc.runtime.device import to_host
from zinc.runtime.module import LoadedModule

Array = np.ndarray[Any, Any]
N = 32  # output rows: two pairs of 8-row groups, as every real matrix has (its rows are a multiple of 16)
PROMPT = 11  # a tile of 8 rows and a padded one


def real_widths() -> list[int]:
    """Every distinct reduction width of the table's matmuls."""
    widths = set()
    for s in SPECS.values():
        widths |= {s.n_embd, s.n_head * s.head_dim, s.n_ff}
    return sorted(widths)


def widths_for(qtype: str) -> list[int]:
    """The widths a weight of `qtype` can have (a K-quant needs whole 256-blocks)."""
    return [k for k in real_widths() if k % QUANT_TYPES[qtype].block == 0]


def test_the_table_has_the_widths_that_broke_compiles() -> None:
    """The table reaches the widths where a batch's quantized rows leave the kernel's stack
    (TinyLlama's 5632 and wider) and keeps ones where they stay (one token at every width)."""
    widths = real_widths()
    assert max(widths) >= 18944 and min(widths) <= 1152
    assert any(dot8.quantized_apart(8, k) for k in widths)
    assert any(not dot8.quantized_apart(8, k) for k in widths)
    assert not any(dot8.quantized_apart(1, k) for k in widths)


def _dot8_module(qtype: str, widths: list[int]) -> str:
    q = QUANT_TYPES[qtype]
    text = ""
    for k in widths:
        planes = {f"w{k}_{p}": t for p, t in dot8.plane_types(q, N, k).items()}
        text += "".join(
            f'util.global private @{p} = #flow.parameter.named<"model"::"{p}"> : {t}\n'
            for p, t in planes.items()
        )
        text += dot8.render_decode(q, N, k) + dot8.render_decode(q, N, k, 8) + dot8.render_prefill(q, N, k)
        loads = "".join(f"  %{p} = util.global.load @{p} : {t}\n" for p, t in planes.items())
        names, types = ", ".join(f"%{p}" for p in planes), ", ".join(planes.values())
        for fn, callee, t in (
            ("mv", dot8.decode_name(q, N, k), "1"), ("b8", dot8.decode_name(q, N, k, 8), "8"),
            ("mm", dot8.prefill_name(q, N, k), "?"),
        ):  # fmt: skip
            arg, res = f"tensor<{t}x{k}xf32>", f"tensor<{t}x{N}xf32>"
            text += (
                f"func.func @{fn}_{k}(%x: {arg}) -> {res} {{\n{loads}"
                f"  %y = func.call @{callee}({names}, %x) : ({types}, {arg}) -> {res}\n  return %y : {res}\n}}\n"
            )
    return text


def compile_jobs(test: str, params: Mapping[str, Any]) -> list[KernelJob]:
    """The module each test below compiles (tests/compile_pool.py compiles them ahead)."""
    if test == "test_dot8_kernels_at_every_real_width":
        return [(_dot8_module(params["qtype"], widths_for(params["qtype"])), "cpu", ())]
    if test == "test_linalg_kernels_at_every_real_width":
        return [(_linalg_module(params["qtype"], widths_for(params["qtype"])), target_of(params["device"]), ())]
    return []


@cache
def _weights(qtype: str, k: int) -> tuple[Array, Array]:
    return quantized(qtype, N, k, np.random.default_rng(k))


def _activations(rows: int, k: int) -> Array:
    rng = np.random.default_rng(k + 1)
    return (rng.standard_normal((rows, k)) * np.exp(rng.standard_normal((rows, k)))).astype(np.float32)


@pytest.mark.skipif(
    not dot8_layout.enabled(), reason="this CPU lacks AVX2, F16C or FMA (it compiles the f32 kernels)"
)
@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1"])
def test_dot8_kernels_at_every_real_width(qtype: str) -> None:
    spec = DEVICES["cpu"]()
    q = QUANT_TYPES[qtype]
    widths = widths_for(qtype)
    params: dict[str, Array] = {}
    for k in widths:
        raw, _ = _weights(qtype, k)
        planes = dot8.repack(q, raw.reshape(-1).view(np.uint8), N, k)
        params |= {f"w{k}_{p}": a for p, a in planes.items()}
    mod = LoadedModule(
        compile_kernel(_dot8_module(qtype, widths), spec.target), spec.uri, parameter_arrays=params
    )
    for k in widths:
        _, w = _weights(qtype, k)
        x = _activations(PROMPT, k)
        ref = q8_round(x.astype(np.float64)) @ w.T
        scale = np.abs(ref).max()
        y = to_host(mod.fn(f"mm_{k}")(mod.to_device(x)), mod.device)
        assert np.abs(y - ref).max() / scale < 1e-5, f"{qtype} prompt of {PROMPT} rows, width {k}"
        y8 = to_host(mod.fn(f"b8_{k}")(mod.to_device(x[:8])), mod.device)
        assert np.abs(y8 - ref[:8]).max() / scale < 1e-5, f"{qtype} batch of 8 rows, width {k}"
        y1 = to_host(mod.fn(f"mv_{k}")(mod.to_device(x[3:4])), mod.device)
        assert np.abs(y1 - ref[3:4]).max() / scale < 1e-5, f"{qtype} one token, width {k}"
        # a row's result is the same whichever kernel computes it (where the rows are quantized too)
        assert np.array_equal(y8[3:4], y1) and np.array_equal(y[3:4], y1), f"{qtype} width {k}"


def _linalg_module(qtype: str, widths: list[int]) -> str:
    q = QUANT_TYPES[qtype]
    text = ""
    for k in widths:
        pt = q.param_type(N, k)
        text += f'util.global private @w{k} = #flow.parameter.named<"model"::"w{k}"> : {pt}\n'
        text += render_matmul(q, N, k, True, two_dims=True) + render_matmul(q, N, k, False, two_dims=True)
        for fn, dynamic, t in (("mm", True, "?"), ("mv", False, "1")):
            arg, res = f"tensor<{t}x{k}xf32>", f"tensor<{t}x{N}xf32>"
            text += (
                f"func.func @{fn}_{k}(%x: {arg}) -> {res} {{\n  %w = util.global.load @w{k} : {pt}\n"
                f"  %y = func.call @{matmul_name(q, N, k, dynamic)}(%w, %x) : ({pt}, {arg}) -> {res}\n"
                f"  return %y : {res}\n}}\n"
            )
    return text


@pytest.mark.parametrize("device", device_params("vulkan"))
@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q5_0"])
def test_linalg_kernels_at_every_real_width(qtype: str, device: str) -> None:
    spec = DEVICES[device]()
    widths = widths_for(qtype)
    params = {f"w{k}": _weights(qtype, k)[0] for k in widths}
    mod = LoadedModule(
        compile_kernel(_linalg_module(qtype, widths), spec.target), spec.uri, parameter_arrays=params
    )
    for k in widths:
        _, w = _weights(qtype, k)
        x = _activations(PROMPT, k)
        ref = x.astype(np.float64) @ w.T
        mag = np.abs(x.astype(np.float64)) @ np.abs(w.T)
        y = to_host(mod.fn(f"mm_{k}")(mod.to_device(x)), mod.device)
        assert (np.abs(y - ref) / mag.max()).max() < 1e-5, f"{qtype} prompt, width {k}"
        y1 = to_host(mod.fn(f"mv_{k}")(mod.to_device(x[3:4])), mod.device)
        assert (np.abs(y1 - ref[3:4]) / mag.max()).max() < 1e-5, f"{qtype} one token, width {k}"
