"""Quantized kernels: the GGUF types zinc compiles, and the MLIR for matmul and row gather.

Owns: `QUANT_TYPES` (which GGML types are supported and how their raw blocks are typed as
parameters: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), rendering of the
`mlir/matmul_*.mlir` templates, and the embedding-row gather (its per-type bodies live in
`gathers`). Every kernel reads the GGUF bytes as they are; dequantization is fused into the
kernel, with f16 scales and packed fields decoded by integer ops (`bitops`) so one kernel is
correct on llvm-cpu and on Vulkan.
Imports: zinc.compiler.bitops, zinc.compiler.gathers, zinc.errors, zinc.model.gguf_header (the
block sizes), zinc.mlir (templates, read with importlib.resources).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from string import Template

from zinc.compiler import subgroup_matmul
from zinc.compiler.bitops import (
    bf16_to_f32,
    f16_bits_to_f32,
    f16_to_f32,
    kquant_scale,
    q5_value,
    u32_from_bytes,
)
from zinc.compiler.gathers import gather_body
from zinc.errors import UnsupportedModelError
from zinc.model.gguf_header import GGML_TYPES


@dataclass(frozen=True)
class QuantType:
    name: str  # GGML type name, as gguf.GGMLQuantizationType spells it
    block: int  # weights per block (1 for plain float types)
    block_bytes: int  # bytes per block

    def param_type(self, rows: int, cols: int) -> str:
        """The MLIR tensor type that a [rows, cols] GGUF tensor of this type is bound as."""
        if self.name == "F32":
            return f"tensor<{rows}x{cols}xf32>"
        if self.name in ("F16", "BF16"):
            return f"tensor<{rows}x{cols}x2xi8>"
        return f"tensor<{rows}x{cols // self.block}x{self.block_bytes}xi8>"


# The GGML types zinc compiles, with their block sizes from the GGUF header reader's table
_SIZES = {name: (block, size) for name, block, size in GGML_TYPES.values()}
QUANT_TYPES: dict[str, QuantType] = {
    name: QuantType(name, *_SIZES[name])
    for name in ("F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "BF16")
}


# Types whose kernels work but whose tensors a model cannot bind yet, with the reason.
NOT_BINDABLE = {
    "BF16": "IREE's GGUF parameter index (iree-base-runtime 3.13) rejects any file holding a BF16 "
    "tensor (GGML type 30), so the model could not be loaded",
}


def quant_type(name: str, tensor: str) -> QuantType:
    """The registry entry for a model tensor's GGML type, or a clear `UnsupportedModelError`."""
    q = QUANT_TYPES.get(name)
    if q is None:
        raise UnsupportedModelError(
            f"tensor {tensor} has quant type {name}, which zinc cannot compile yet "
            f"(supported: {', '.join(t for t in QUANT_TYPES if t not in NOT_BINDABLE)})"
        )
    if name in NOT_BINDABLE:
        raise UnsupportedModelError(f"tensor {tensor} has quant type {name}: {NOT_BINDABLE[name]}")
    return q


# tiled.py decodes f16 bits held in i32 with this name.
_f16_bits_to_f32 = f16_bits_to_f32


def template(name: str) -> Template:
    """An MLIR template from the `mlir/` folder (shipped as package data)."""
    return Template(resources.files("zinc.mlir").joinpath(name).read_text())


def t_dims(dynamic: bool) -> dict[str, str]:
    """Placeholder values for the token dimension: dynamic (prefill) or 1 (decode)."""
    return {"T": "?", "TV": "%T", "DYN": "%T"} if dynamic else {"T": "1", "TV": "1", "DYN": ""}


def matmul_name(q: QuantType, n: int, k: int, dynamic: bool) -> str:
    return f"matmul_{q.name.lower()}_{'t' if dynamic else '1'}_{n}x{k}"


def render_matmul(
    q: QuantType, n: int, k: int, dynamic: bool, two_dims: bool = False, rows_form: bool = False
) -> str:
    """A private func `y[T, n] = x[T, k] @ W[n, k]^T` with W bound raw from the GGUF; with
    `two_dims` (every Vulkan target), a nibble-packed type takes its form of two reduction dims
    (zinc.compiler.subgroup_matmul); the CPU's fallback keeps the template's. With
    `rows_form` too (the generic Vulkan target's matmuls over several rows), a 32-weight block
    type takes its form over rows (subgroup_matmul.render_rows)."""
    if k % q.block:
        raise UnsupportedModelError(f"{q.name} matrix with {k} columns is not a whole number of blocks")
    subs = {
        "NAME": matmul_name(q, n, k, dynamic),
        "N": str(n),
        "K": str(k),
        "B": str(k // q.block),
        "F16_D": f16_to_f32("%lo", "%hi", "%d"),
        "F16_M": f16_to_f32("%mlo", "%mhi", "%m"),
        "BF16_W": bf16_to_f32("%lo", "%hi", "%wv"),
        "QH32": u32_from_bytes(("%b0", "%b1", "%b2", "%b3"), "%qh"),
        "Q5": q5_value("%q", "%h", "%j", "%qh", "%q5"),
        "KSCALE": kquant_scale("%upper"),
        **t_dims(dynamic),
    }
    if two_dims and rows_form and dynamic and q.name in subgroup_matmul.BLOCK_TYPES:
        return subgroup_matmul.render_rows(q.name, q.block_bytes, subs["NAME"], n, k, t_dims(dynamic))
    if two_dims and q.name in subgroup_matmul.FORMS:
        return subgroup_matmul.render(q.name, q.block, q.block_bytes, subs["NAME"], n, k, t_dims(dynamic))
    return template(f"matmul_{q.name.lower()}.mlir").substitute(subs)


def sub_once(pattern: str, repl: str | Callable[[re.Match[str]], str], text: str) -> str:
    """`re.sub` that must replace exactly one match (the templates are ours: anything else is a
    bug); a str `repl` is taken literally."""
    fn = repl if callable(repl) else (lambda _m, r=repl: r)
    out, count = re.subn(pattern, fn, text)
    if count != 1:
        raise AssertionError(f"{pattern!r} matched {count} times in a template")
    return out


def gather_name(q: QuantType, rows: int, cols: int, dynamic: bool) -> str:
    return f"gather_{q.name.lower()}_{'t' if dynamic else '1'}_{rows}x{cols}"


def render_gather(q: QuantType, rows: int, cols: int, dynamic: bool) -> str:
    """A private func `out[T, cols] = dequant(W[ids[t], :])`: embedding lookup from raw blocks.

    Token ids must be < rows; the runtime checks that before the call.
    """
    d = t_dims(dynamic)
    t, dyn = d["T"], d["DYN"]
    wt = q.param_type(rows, cols)
    body = gather_body(q.name, wt)
    return f"""
func.func private @{gather_name(q, rows, cols, dynamic)}(%w: {wt}, %ids: tensor<{t}xi32>) -> tensor<{t}x{cols}xf32> {{
  %c0 = arith.constant 0 : index
  %T = tensor.dim %ids, %c0 : tensor<{t}xi32>
  %e = tensor.empty({dyn}) : tensor<{t}x{cols}xf32>
  %y = linalg.generic {{indexing_maps = [affine_map<(t, k) -> (t)>, affine_map<(t, k) -> (t, k)>],
      iterator_types = ["parallel", "parallel"]}} ins(%ids : tensor<{t}xi32>) outs(%e : tensor<{t}x{cols}xf32>) {{
    ^bb0(%id: i32, %o: f32):
      %row = arith.index_cast %id : i32 to index
      %k = linalg.index 1 : index
{body}
      linalg.yield %v : f32
  }} -> tensor<{t}x{cols}xf32>
  return %y : tensor<{t}x{cols}xf32>
}}
"""
