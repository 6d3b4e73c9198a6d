"""Quantized kernels: the GGUF types zinc compiles, and the MLIR for matmul and row gather.

Owns: `QUANT_TYPES` (which GGML types are supported and how their raw blocks are typed as
parameters: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), rendering of the
`mlir/matmul_*.mlir` templates, and the embedding-row gather (its per-type bodies live in
`gathers`). Every kernel reads the GGUF bytes as they are; dequantization is fused into the
kernel, with f16 scales and packed fields decoded by integer ops (`bitops`) so one kernel is
correct on llvm-cpu and on Vulkan.
Imports: zinc.compiler.bitops, zinc.compiler.gathers, zinc.errors, zinc.mlir (templates, read
with importlib.resources).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from string import Template

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


QUANT_TYPES: dict[str, QuantType] = {
    q.name: q
    for q in (
        QuantType("F32", 1, 4),
        QuantType("F16", 1, 2),
        QuantType("Q8_0", 32, 34),
        QuantType("Q4_0", 32, 18),
        QuantType("Q4_1", 32, 20),
        QuantType("Q5_0", 32, 22),
        QuantType("Q5_1", 32, 24),
        QuantType("Q4_K", 256, 144),
        QuantType("Q5_K", 256, 176),
        QuantType("Q6_K", 256, 210),
        QuantType("BF16", 1, 2),
    )
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


def render_matmul(q: QuantType, n: int, k: int, dynamic: bool, index_inputs: bool = False) -> str:
    """A private func `y[T, n] = x[T, k] @ W[n, k]^T` with W bound raw from the GGUF; with
    `index_inputs`, the form for GPU targets with subgroups (`with_index_inputs`)."""
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
    text = template(f"matmul_{q.name.lower()}.mlir").substitute(subs)
    return with_index_inputs(text, q.name) if index_inputs else text


# The loop indices each quantized matmul's body reads with linalg.index: (SSA name, loop dim, size).
LOOP_INDICES: dict[str, tuple[tuple[str, int, int], ...]] = {
    "Q4_0": (("h", 3, 2),),
    "Q4_1": (("h", 3, 2),),
    "Q5_0": (("h", 3, 2), ("j", 4, 16)),
    "Q5_1": (("h", 3, 2), ("j", 4, 16)),
    "Q4_K": (("u", 3, 2), ("h", 5, 2)),
    "Q5_K": (("u", 3, 2), ("h", 5, 2), ("c", 4, 2)),
    "Q6_K": (("mh", 4, 2), ("ml", 5, 2)),
}


def with_index_inputs(text: str, qname: str) -> str:
    """The matmul `text` with the loop indices of its body read from i32 iota inputs instead of
    `linalg.index`, the same arithmetic otherwise.

    On GPU targets with subgroups (ampere, rdna3, ...) IREE 3.13 compiles these matmuls with its
    SubgroupReduce pipeline, which keeps the vectorized `linalg.index` values of the reduction in
    workgroup memory as `index`, a type SPIR-V cannot store ("failed to legalize operation
    'memref.alloc' ... memref<576xindex, #spirv.storage_class<Workgroup>>"); an i32 input is
    stored as i32. The generic target (lavapipe) keeps linalg.index: there the iota form of a
    one-token matmul crashes IREE's SPIR-V vector unrolling (a segfault in getDimPosition).
    """
    found = LOOP_INDICES.get(qname, ())
    if not found:
        return text
    sizes = sorted({size for _, _, size in found})
    iotas = "".join(
        f"  %iota{n} = arith.constant dense<[{', '.join(map(str, range(n)))}]> : tensor<{n}xi32>\n" for n in sizes
    )
    text = sub_once(r"(  %zero = arith.constant 0\.0 : f32\n)", lambda m: m.group(1) + iotas, text)
    out_map = re.search(r"affine_map<\(([^)]*)\) -> \(t, n\)>\],", text)
    if out_map is None:
        raise AssertionError(f"matmul_{qname} template: no output map")
    maps = "".join(f"affine_map<({out_map.group(1)}) -> ({var})>,\n        " for var, _, _ in found)
    text = text[: out_map.start()] + maps + text[out_map.start() :]
    text = sub_once(r"(ins\([^:]*%xb)( :)", lambda m: m.group(1) + "".join(f", %iota{n}" for _, _, n in found) + m.group(2), text)
    text = sub_once(
        r"(xf32>)(\)\n\s*outs\()", lambda m: m.group(1) + "".join(f", tensor<{n}xi32>" for _, _, n in found) + m.group(2), text
    )
    args = "".join(f"%{var}_i: i32, " for var, _, _ in found)
    text = sub_once(r"%xv: f32, %a: f32\):", lambda m: f"%xv: f32, {args}%a: f32):", text)
    for var, dim, _ in found:
        cast = f"%{var} = arith.index_cast %{var}_i : i32 to index"
        text = sub_once(rf"%{var} = linalg\.index {dim} : index", cast, text)
    return text


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
