"""Prefill matmuls on Vulkan GPU targets as a dequantization and a plain GEMM.

Owns: `render_dequant` (a whole GGUF weight [n, k] dequantized into a tensor of `dt`, f16 or
f32, one element per invocation, by the embedding gather's body, zinc.compiler.gathers) and
`render_gemm` (`y[T, n] = x[T, k] @ W[n, k]^T` over a dequantized weight, f32 accumulation).

Why: over a prompt chunk, the fused quantized matmul (mlir/matmul_*.mlir) gets IREE 3.13's
SubgroupReduce pipeline on GPU targets, one workgroup per (token, row) that dequantizes the
weight again for every token. A separate dequantization feeding a contraction gets a tiled GEMM
(`CooperativeMatrixVectorize` on ampere and rdna3, for f16 operands), but only when the token
count is static: the prefill entry points pad their chunk to a fixed number of rows for it
(zinc.compiler.graph, `emit_module(gemm=(rows, type))`).
Imports: zinc.compiler.gathers, zinc.compiler.kernels.
"""

from __future__ import annotations

from zinc.compiler.gathers import gather_body
from zinc.compiler.kernels import QuantType


def dequant_name(q: QuantType, n: int, k: int, dt: str) -> str:
    return f"dequant_{q.name.lower()}_{n}x{k}_{dt}"


def render_dequant(q: QuantType, n: int, k: int, dt: str) -> str:
    """A private func `W[n, k]` in `dt` from the raw GGUF weight (rounded to f16 for "f16")."""
    wt, out = q.param_type(n, k), f"tensor<{n}x{k}x{dt}>"
    cast = "      %v_low = arith.truncf %v : f32 to f16\n" if dt == "f16" else ""
    result = "%v_low" if dt == "f16" else "%v"
    return f"""
func.func private @{dequant_name(q, n, k, dt)}(%w: {wt}) -> {out} {{
  %e = tensor.empty() : {out}
  %y = linalg.generic {{indexing_maps = [affine_map<(r, c) -> (r, c)>], iterator_types = ["parallel", "parallel"]}}
      outs(%e : {out}) {{
    ^bb0(%o: {dt}):
      %row = linalg.index 0 : index
      %k = linalg.index 1 : index
{gather_body(q.name, wt)}
{cast}      linalg.yield {result} : {dt}
  }} -> {out}
  return %y : {out}
}}
"""


def gemm_name(n: int, k: int, dt: str) -> str:
    return f"gemm_{dt}_{n}x{k}"


def render_gemm(n: int, k: int, dt: str) -> str:
    """A private func `y[T, n] = x[T, k] @ W[n, k]^T`, W already dequantized to `dt`; x is rounded
    to `dt` first (f16: saturated to its finite range, so an outlier stays large, not inf, and
    the sums finite), the products are summed in f32."""
    wt = f"tensor<{n}x{k}x{dt}>"
    lines = [
        f"func.func private @{gemm_name(n, k, dt)}(%x: tensor<?x{k}xf32>, %w: {wt}) -> tensor<?x{n}xf32> {{",
        "  %c0 = arith.constant 0 : index",
        f"  %T = tensor.dim %x, %c0 : tensor<?x{k}xf32>",
    ]
    xs = "%x"
    if dt != "f32":
        xs = "%xl"
        ident = "affine_map<(t, c) -> (t, c)>"
        lines += [
            f"  %xe = tensor.empty(%T) : tensor<?x{k}x{dt}>",
            f"  %xl = linalg.generic {{indexing_maps = [{ident}, {ident}], "
            f'iterator_types = ["parallel", "parallel"]}} ins(%x : tensor<?x{k}xf32>) outs(%xe : tensor<?x{k}x{dt}>) {{',
            f"    ^bb0(%a: f32, %o: {dt}):",
            "      %hi = arith.constant 65504.0 : f32",  # f16's largest finite: saturate, never inf
            "      %lo = arith.constant -65504.0 : f32",
            "      %a1 = arith.minimumf %a, %hi : f32",
            "      %a2 = arith.maximumf %a1, %lo : f32",
            f"      %l = arith.truncf %a2 : f32 to {dt}",
            f"      linalg.yield %l : {dt}",
            f"  }} -> tensor<?x{k}x{dt}>",
        ]
    widen = [f"      %af = arith.extf %a : {dt} to f32", f"      %bf = arith.extf %b : {dt} to f32"]
    a, b = ("%af", "%bf") if dt != "f32" else ("%a", "%b")
    lines += [
        "  %zero = arith.constant 0.0 : f32",
        f"  %e = tensor.empty(%T) : tensor<?x{n}xf32>",
        f"  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x{n}xf32>) -> tensor<?x{n}xf32>",
        "  %y = linalg.generic {indexing_maps = [affine_map<(t, n, c) -> (t, c)>, affine_map<(t, n, c) -> (n, c)>, "
        'affine_map<(t, n, c) -> (t, n)>], iterator_types = ["parallel", "parallel", "reduction"]}',
        f"      ins({xs}, %w : tensor<?x{k}x{dt}>, {wt}) outs(%acc : tensor<?x{n}xf32>) {{",
        f"    ^bb0(%a: {dt}, %b: {dt}, %o: f32):",
        *(widen if dt != "f32" else []),
        f"      %m = arith.mulf {a}, {b} : f32",
        "      %s = arith.addf %o, %m : f32",
        "      linalg.yield %s : f32",
        f"  }} -> tensor<?x{n}xf32>",
        f"  return %y : tensor<?x{n}xf32>",
        "}",
    ]
    return "\n".join(lines) + "\n"
