"""Vulkan decode matmuls with integer dot products: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K.

Owns: `SUBGROUP` (the named Vulkan targets whose devices have 4 x int8 dot products, and the
subgroup size the kernels assume on each), `subgroup_size` (with `$ZINC_VULKAN_DOT`: off turns
the kernels off), `supports`, and the two kernels (templates in mlir/):
  - `render_quantize` (mlir/dp4_quantize.mlir): x [T, k] rounded to int8 per 32 values, with each
    block's scale and scaled sum, all in one [T, k / 32, 10] i32 tensor, once per activation
    that several matmuls read (zinc.compiler.emitter.Body memoizes it);
  - `render_decode` (mlir/dp4_decode.mlir): a dispatch written by hand that reads the GGUF blocks
    as they are, as 32-bit words (zinc.compiler.dp4_units: each type's units), and multiplies 4
    bytes at a time with `spirv.SDotAccSat` (OpSDotAccSat: dp4a on NVIDIA, v_dot4 on AMD), a row
    per subgroup at a time, for T tokens (one, or a decode batch's), the sums reduced in the
    subgroup.
Weights stay as GGUF stores them (nothing repacked): a subgroup's invocations read consecutive
units of a row, so its loads are contiguous (llama.cpp's GPU backends take the same approach to
quantized decode: int8 activations per 32 values and dp4a). The subgroup size is a constant of the
kernel: a device whose subgroups are another size would sum the wrong invocations, which is why
the size comes with the target (the tests run it on lavapipe, whose subgroups are 8 wide).
Imports: zinc.compiler.dp4_units, zinc.compiler.kernels (QuantType, templates), zinc.errors.
"""

from __future__ import annotations

import os

from zinc.compiler.dp4_units import IND, UNITS, Sub, unit_lines, units, words_shape
from zinc.compiler.kernels import QuantType, template
from zinc.errors import ZincError

# IREE's named Vulkan targets with 4 x int8 dot products (iree_gpu.target `dot = dp4xi8toi32`;
# volta, pascal and rdna1 have none) and the subgroup size of their devices: NVIDIA's warp, AMD
# RDNA in wave32, CDNA's wave64, Mali Valhall's 16, Adreno's 64.
SUBGROUP: dict[str, int] = {
    "ampere": 32, "ada": 32, "turing": 32,
    "rdna2": 32, "rdna3": 32, "rdna4": 32, "cdna1": 64, "cdna2": 64, "cdna3": 64,
    "valhall": 16, "valhall1": 16, "valhall2": 16, "valhall3": 16, "valhall4": 16,
    "adreno": 64,
}  # fmt: skip
SUBGROUPS_PER_WG = 4  # subgroups per workgroup, each one row of W
QUANTIZE_WG = 64  # invocations (blocks) per workgroup of the quantize kernel
ENV = "ZINC_VULKAN_DOT"


def subgroup_size(vulkan_target: str) -> int:
    """The subgroup size the dp4 kernels are compiled for on `vulkan_target`, or 0: no dp4
    kernels (a target without dot products, GENERIC, or `$ZINC_VULKAN_DOT=off`)."""
    forced = os.environ.get(ENV, "")
    if forced not in ("", "on", "off"):
        raise ZincError(f"{ENV}={forced!r}: choose on or off")
    return 0 if forced == "off" else SUBGROUP.get(vulkan_target, 0)


def supports(q: QuantType, n: int, k: int) -> bool:
    lay = UNITS.get(q.name)
    return lay is not None and k % (lay.block_weights * lay.group) == 0 and k % (32 * lay.per_unit) == 0


def quantize_name(k: int, rows: int = 1) -> str:
    return f"dp4_quantize_{rows}x{k}"


def decode_name(q: QuantType, n: int, k: int, s: int, rows: int = 1) -> str:
    return f"dp4_{q.name.lower()}_s{s}_{rows}x{n}x{k}"


def quantized_type(k: int, rows: int = 1) -> str:
    """x [rows, k] quantized (`render_quantize`): per block 8 words of quants, d, d sum q."""
    return f"tensor<{rows}x{k // 32}x10xi32>"


def render_quantize(k: int, rows: int = 1) -> str:
    b = rows * k // 32
    return template("dp4_quantize.mlir").substitute(
        NAME=quantize_name(k, rows), K=k, R=rows, KB=k // 32, B=b, WG=QUANTIZE_WG, WGS=-(-b // QUANTIZE_WG),
        XREF=memref((b, 32), "f32"), XQREF=memref((b, 10), "i32"),
    )


def memref(shape: tuple[int, ...], elem: str) -> str:
    """A row-major memref type with a dynamic offset (see mlir/dp4_decode.mlir: why)."""
    strides = [1]
    for d in reversed(shape[1:]):
        strides.insert(0, strides[0] * d)
    dims = "x".join(map(str, shape))
    return f"memref<{dims}x{elem}, strided<[{', '.join(map(str, strides))}], offset: ?>>"


def render_decode(q: QuantType, n: int, k: int, s: int, rows: int = 1) -> str:
    """The dispatch and the private func `y[rows, n] = x W^T`, taking x quantized
    (`render_quantize`): each weight unit is read once for all the rows."""
    if not supports(q, n, k):
        raise ZincError(f"no dp4 kernel for a {q.name} [{n}, {k}] matrix")
    wref = memref(words_shape(q.name, n, k), "i32")
    xqref = memref((rows, k // 32, 10), "i32")
    yref = memref((rows, n), "f32")
    prep, subs = unit_lines(q.name, wref)
    body = list(prep)
    for t in range(rows):
        acc = f"%acc{t}"
        for j, sub in enumerate(subs):
            tag = f"%t{t}b{j}_"
            dots, isum = _dots(sub, t, tag, xqref)
            out = f"%acc{t}_{j}" if j < len(subs) - 1 else f"%out{t}"
            body += dots + _scaled(sub, t, isum, acc, out, tag, xqref)
            acc = out
    stores = []
    for t in range(rows):
        stores += [f"        %tot{t} = gpu.subgroup_reduce add %sum{t} : (f32) -> f32",
                   "        scf.if %first {", f"          memref.store %tot{t}, %y[%ct{t}, %row] : {yref}", "        }"]  # fmt: skip
    ts = range(rows)
    subs_text = {
        "NAME": decode_name(q, n, k, s, rows), "S": s, "SG": SUBGROUPS_PER_WG, "N": n, "T": rows,
        "WGS": -(-n // SUBGROUPS_PER_WG), "U": units(q.name, k), "B": k // 32, "WTYPE": q.param_type(n, k),
        "CONSTS": "\n".join([*(f"    %ci{i} = arith.constant {i} : index" for i in range(36)),
                             *(f"    %ct{t} = arith.constant {t} : index" for t in ts)]),
        "UNIT": "\n".join(body), "WREF": wref, "XQREF": xqref, "YREF": yref, "STORES": "\n".join(stores),
        "RESULTS": ", ".join(f"%sum{t}" for t in ts), "ITER": ", ".join(f"%acc{t} = %zf" for t in ts),
        "TYPES": ", ".join("f32" for _ in ts), "YIELD": ", ".join(f"%out{t}" for t in ts),
    }  # fmt: skip
    return template("dp4_decode.mlir").substitute(subs_text)


def _dots(sub: Sub, t: int, tag: str, xqref: str) -> tuple[list[str], str]:
    """The i32 sum over a 32-block of its weight bytes times token t's quantized x."""
    lines, acc = [], "%zi"
    for i, (word, m) in enumerate(sub.words):
        lines += [f"{IND}{tag}x{i} = memref.load %xq[%ct{t}, {sub.xblock}, %ci{m}] : {xqref}",
                  f"{IND}{tag}p{i} = spirv.SDotAccSat {word}, {tag}x{i}, {acc}, <PackedVectorFormat4x8Bit> : i32 -> i32"]  # fmt: skip
        acc = f"{tag}p{i}"
    return lines, acc


def _scaled(sub: Sub, t: int, isum: str, acc: str, out: str, tag: str, xqref: str) -> list[str]:
    """`out = acc + scale (dx isum) + bias sx`: the block's part of token t's sum, in f32."""
    lines = [f"{IND}{tag}i = arith.sitofp {isum} : i32 to f32",
             f"{IND}{tag}dxi = memref.load %xq[%ct{t}, {sub.xblock}, %ci8] : {xqref}",
             f"{IND}{tag}dx = arith.bitcast {tag}dxi : i32 to f32",
             f"{IND}{tag}p = arith.mulf {tag}i, {tag}dx : f32"]  # fmt: skip
    if sub.bias is None:
        return [*lines, f"{IND}{out} = math.fma {sub.scale}, {tag}p, {acc} : f32"]
    return [*lines, f"{IND}{tag}sxi = memref.load %xq[%ct{t}, {sub.xblock}, %ci9] : {xqref}",
            f"{IND}{tag}sx = arith.bitcast {tag}sxi : i32 to f32", f"{IND}{tag}a = math.fma {sub.scale}, {tag}p, {acc} : f32",
            f"{IND}{out} = math.fma {sub.bias}, {tag}sx, {tag}a : f32"]  # fmt: skip
