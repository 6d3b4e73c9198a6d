"""Quantized kernels: the GGUF types zinc compiles, and the MLIR for matmul and row gather.

Owns: `QUANT_TYPES` (which GGML types are supported and how their raw blocks are typed as
parameters), rendering of the `mlir/matmul_*.mlir` templates, and the embedding-row gather.
Every kernel reads the GGUF bytes as they are; dequantization is fused into the kernel, with f16
scales decoded by integer ops so one kernel is correct on llvm-cpu and on Vulkan.
Imports: zinc.errors, zinc.mlir (templates, read with importlib.resources).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from string import Template

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
        if self.name == "F16":
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
    )
}


def quant_type(name: str, tensor: str) -> QuantType:
    q = QUANT_TYPES.get(name)
    if q is None:
        raise UnsupportedModelError(
            f"tensor {tensor} has quant type {name}, which zinc cannot compile yet "
            f"(supported: {', '.join(QUANT_TYPES)})"
        )
    return q


def f16_to_f32(lo: str, hi: str, out: str, indent: str = "      ") -> str:
    """MLIR lines decoding an f16 given as two i8 SSA values (little-endian) into f32 `%out`.

    bits = lo | hi << 8; f = as_f32((bits & 0x7fff) << 13) * 2^112, then the sign bit. Exact for
    normal and subnormal halves (the multiply renormalizes); inf/nan are not expected in scales.
    """
    p = out.lstrip("%")
    lines = [
        f"%{p}_l = arith.extui {lo} : i8 to i32",
        f"%{p}_h = arith.extui {hi} : i8 to i32",
        f"%{p}_c8 = arith.constant 8 : i32",
        f"%{p}_hs = arith.shli %{p}_h, %{p}_c8 : i32",
        f"%{p}_b = arith.ori %{p}_l, %{p}_hs : i32",
    ]
    return "\n".join(indent + ln for ln in lines) + "\n" + _f16_bits_to_f32(f"%{p}_b", out, indent)


def _f16_bits_to_f32(bits: str, out: str, indent: str) -> str:
    p = out.lstrip("%")
    lines = [
        f"%{p}_m7 = arith.constant 32767 : i32",
        f"%{p}_em = arith.andi {bits}, %{p}_m7 : i32",
        f"%{p}_c13 = arith.constant 13 : i32",
        f"%{p}_e2 = arith.shli %{p}_em, %{p}_c13 : i32",
        f"%{p}_ef = arith.bitcast %{p}_e2 : i32 to f32",
        f"%{p}_k = arith.constant 0x77800000 : f32",
        f"%{p}_mag = arith.mulf %{p}_ef, %{p}_k : f32",
        f"%{p}_mi = arith.bitcast %{p}_mag : f32 to i32",
        f"%{p}_ms = arith.constant 32768 : i32",
        f"%{p}_sg = arith.andi {bits}, %{p}_ms : i32",
        f"%{p}_c16 = arith.constant 16 : i32",
        f"%{p}_s2 = arith.shli %{p}_sg, %{p}_c16 : i32",
        f"%{p}_or = arith.ori %{p}_mi, %{p}_s2 : i32",
        f"{out} = arith.bitcast %{p}_or : i32 to f32",
    ]
    return "\n".join(indent + ln for ln in lines)


def template(name: str) -> Template:
    """An MLIR template from the `mlir/` folder (shipped as package data)."""
    return Template(resources.files("zinc.mlir").joinpath(name).read_text())


def t_dims(dynamic: bool) -> dict[str, str]:
    """Placeholder values for the token dimension: dynamic (prefill) or 1 (decode)."""
    return {"T": "?", "TV": "%T", "DYN": "%T"} if dynamic else {"T": "1", "TV": "1", "DYN": ""}


def matmul_name(q: QuantType, n: int, k: int, dynamic: bool) -> str:
    return f"matmul_{q.name.lower()}_{'t' if dynamic else '1'}_{n}x{k}"


def render_matmul(q: QuantType, n: int, k: int, dynamic: bool) -> str:
    """A private func `y[T, n] = x[T, k] @ W[n, k]^T` with W bound raw from the GGUF."""
    if k % q.block:
        raise UnsupportedModelError(f"{q.name} matrix with {k} columns is not a whole number of blocks")
    subs = {
        "NAME": matmul_name(q, n, k, dynamic),
        "N": str(n),
        "K": str(k),
        "B": str(k // q.block),
        "F16_D": f16_to_f32("%lo", "%hi", "%d"),
        "F16_M": f16_to_f32("%mlo", "%mhi", "%m"),
        **t_dims(dynamic),
    }
    return template(f"matmul_{q.name.lower()}.mlir").substitute(subs)


def gather_name(q: QuantType, rows: int, cols: int, dynamic: bool) -> str:
    return f"gather_{q.name.lower()}_{'t' if dynamic else '1'}_{rows}x{cols}"


def render_gather(q: QuantType, rows: int, cols: int, dynamic: bool) -> str:
    """A private func `out[T, cols] = dequant(W[ids[t], :])`: embedding lookup from raw blocks.

    Token ids must be < rows; the runtime checks that before the call.
    """
    d = t_dims(dynamic)
    t, dyn = d["T"], d["DYN"]
    wt = q.param_type(rows, cols)
    body = _gather_body(q, wt)
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


def _gather_body(q: QuantType, wt: str) -> str:
    """MLIR lines computing `%v: f32`, the dequantized weight at (%row, %k) of `%w: wt`."""
    if q.name == "F32":
        lines = [f"%v = tensor.extract %w[%row, %k] : {wt}"]
        return "\n".join("      " + ln for ln in lines)
    if q.name == "F16":
        lines = [
            "%i0 = arith.constant 0 : index",
            "%i1 = arith.constant 1 : index",
            f"%lo = tensor.extract %w[%row, %k, %i0] : {wt}",
            f"%hi = tensor.extract %w[%row, %k, %i1] : {wt}",
        ]
        return "\n".join("      " + ln for ln in lines) + "\n" + f16_to_f32("%lo", "%hi", "%v")
    lines = [
        "%cb = arith.constant 32 : index",
        "%b = arith.divui %k, %cb : index",
        "%j = arith.remui %k, %cb : index",
        "%i0 = arith.constant 0 : index",
        "%i1 = arith.constant 1 : index",
        f"%lo = tensor.extract %w[%row, %b, %i0] : {wt}",
        f"%hi = tensor.extract %w[%row, %b, %i1] : {wt}",
    ]
    text = "\n".join("      " + ln for ln in lines) + "\n" + f16_to_f32("%lo", "%hi", "%d") + "\n"
    if q.name == "Q8_0":
        tail = [
            "%i2 = arith.constant 2 : index",
            "%jo = arith.addi %j, %i2 : index",
            f"%q = tensor.extract %w[%row, %b, %jo] : {wt}",
            "%qf = arith.sitofp %q : i8 to f32",
            "%v = arith.mulf %qf, %d : f32",
        ]
        return text + "\n".join("      " + ln for ln in tail)
    off = 2 if q.name == "Q4_0" else 4
    tail = [
        "%i16 = arith.constant 16 : index",
        "%h = arith.divui %j, %i16 : index",
        "%jj = arith.remui %j, %i16 : index",
        f"%ioff = arith.constant {off} : index",
        "%jo = arith.addi %jj, %ioff : index",
        f"%byte = tensor.extract %w[%row, %b, %jo] : {wt}",
        "%h8 = arith.index_cast %h : index to i8",
        "%c4 = arith.constant 4 : i8",
        "%sh = arith.muli %h8, %c4 : i8",
        "%qs = arith.shrui %byte, %sh : i8",
        "%c15 = arith.constant 15 : i8",
        "%qn = arith.andi %qs, %c15 : i8",
    ]
    if q.name == "Q4_0":
        tail += [
            "%qi = arith.extui %qn : i8 to i32",
            "%c8 = arith.constant 8 : i32",
            "%qc = arith.subi %qi, %c8 : i32",
            "%qf = arith.sitofp %qc : i32 to f32",
            "%v = arith.mulf %qf, %d : f32",
        ]
        return text + "\n".join("      " + ln for ln in tail)
    mlines = [
        "%i2 = arith.constant 2 : index",
        "%i3 = arith.constant 3 : index",
        f"%mlo = tensor.extract %w[%row, %b, %i2] : {wt}",
        f"%mhi = tensor.extract %w[%row, %b, %i3] : {wt}",
    ]
    text += "\n".join("      " + ln for ln in mlines) + "\n" + f16_to_f32("%mlo", "%mhi", "%m") + "\n"
    tail += [
        "%qf = arith.uitofp %qn : i8 to f32",
        "%wd = arith.mulf %qf, %d : f32",
        "%v = arith.addf %wd, %m : f32",
    ]
    return text + "\n".join("      " + ln for ln in tail)
