"""The fast CPU matmul path: GGUF blocks repacked into tiled planes, and the kernels that read them.

Owns: `TILED_TYPES` (the quant types with a tiled layout), `repack` (a pure byte shuffle of one
GGUF tensor into its planes, run once by `zinc compile` and written to the artifact's `.irpa`),
`plane_types` (the MLIR types those planes are bound as), and the kernels:
  - decode (T = 1): one `linalg.generic` per matrix over `[N/TW, B, 32, TW]` planes, rows of a
    tile innermost so a workgroup streams one contiguous slab; the last product is written as
    `math.fma(a, b, -0.0)` + `arith.addf` so IREE does not form a `vector.contract` (which it
    scalarises), and a `compilation_info` vectorizes the TW rows, never the reduction;
  - prefill (T = ?): the tile is dequantized to f32 and multiplied with `linalg.matmul`, the
    contraction path IREE tiles and vectorizes well.
The layout and the body follow ../shared/research/quant-kernels.md (measured there and here).
Imports: numpy, zinc.compiler.kernels (QuantType, f16 decoding, templates), zinc.errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from zinc.compiler.bitops import f16_bits_to_f32
from zinc.compiler.kernels import QuantType, template

TW = 32  # output rows per tile: the vectorized dimension
U8 = np.ndarray[Any, np.dtype[np.uint8]]


@dataclass(frozen=True)
class TiledLayout:
    quant: str  # GGML type name
    planes: tuple[str, ...]  # parameter suffixes, in kernel argument order
    qbytes: int  # bytes of quants per 32 weights (32 for 8-bit, 16 for 4- and 5-bit)
    bias: float = 0.0  # w = (q + bias) * d for the symmetric 4/5-bit types


TILED_TYPES: dict[str, TiledLayout] = {
    "Q8_0": TiledLayout("Q8_0", ("qs", "d"), 32),
    "Q4_0": TiledLayout("Q4_0", ("qs", "d"), 16, -8.0),
    "Q4_1": TiledLayout("Q4_1", ("qs", "d", "m"), 16),
    "Q5_0": TiledLayout("Q5_0", ("qs", "d", "qh"), 16, -16.0),
}
# plane element types: quants as bytes, scales as f16 bits, Q5 high bits as one 32-bit word per block
PLANE_TYPE = {"qs": "i8", "d": "i16", "m": "i16", "qh": "i32"}


def supports(q: QuantType, n: int, k: int) -> bool:
    return q.name in TILED_TYPES and n % TW == 0 and k % 32 == 0


def plane_types(q: QuantType, n: int, k: int) -> dict[str, str]:
    """MLIR tensor type of each plane of an [n, k] weight."""
    lay, nt, b = TILED_TYPES[q.name], n // TW, k // 32
    return {
        p: f"tensor<{nt}x{b}x{lay.qbytes}x{TW}xi8>" if p == "qs" else f"tensor<{nt}x{b}x{TW}x{PLANE_TYPE[p]}>"
        for p in lay.planes
    }


def repack(q: QuantType, raw: U8, n: int, k: int) -> dict[str, np.ndarray[Any, Any]]:
    """Planes of one GGUF tensor (`raw`: its bytes). Scales stay f16 bits, so sizes equal GGUF's."""
    b = k // 32
    blocks = np.ascontiguousarray(raw).reshape(n, b, q.block_bytes)

    def tile(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:  # [n, b, ...] -> [n/TW, b, ..., TW]
        a = a.reshape(n // TW, TW, *a.shape[1:])
        return np.ascontiguousarray(np.moveaxis(a, 1, -1))

    def f16_bits(lo: int) -> np.ndarray[Any, Any]:
        return blocks[:, :, lo : lo + 2].copy().view(np.int16)[..., 0]

    if q.name == "Q8_0":
        return {"qs": tile(blocks[:, :, 2:].view(np.int8)), "d": tile(f16_bits(0))}
    if q.name == "Q4_0":
        return {"qs": tile(blocks[:, :, 2:].view(np.int8)), "d": tile(f16_bits(0))}
    if q.name == "Q4_1":
        return {"qs": tile(blocks[:, :, 4:].view(np.int8)), "d": tile(f16_bits(0)), "m": tile(f16_bits(2))}
    if q.name == "Q5_0":  # f16 d, u32 high bits (bit j of element j), 16 bytes of nibbles
        qh = blocks[:, :, 2:6].copy().view(np.int32)[..., 0]
        return {"qs": tile(blocks[:, :, 6:].view(np.int8)), "d": tile(f16_bits(0)), "qh": tile(qh)}
    raise ValueError(f"no tiled layout for {q.name}")


def _compilation_info(rank: int, row_tile: int = 0) -> str:
    """Distribute and vectorize the TW rows of one tile; step the reductions one at a time.
    With `row_tile`, a leading batch-row loop is vectorized `row_tile` rows at a time."""
    par = ", ".join(["1", str(TW)] + ["0"] * (rank - 2))
    red = ", ".join(["0", "0"] + ["1"] * (rank - 2))
    if row_tile:
        par, red = f"0, {par}", f"0, {red}"
        vec = f"{row_tile}, {', '.join(['1', str(TW)] + ['0'] * (rank - 2))}"
        return (
            "#iree_codegen.compilation_info<lowering_config = #iree_cpu.lowering_config<"
            f"distribution = [{par}], vector_common_parallel = [{vec}], vector_reduction = [{red}]>, "
            "translation_info = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>>"
        )
    return (
        "#iree_codegen.compilation_info<lowering_config = #iree_cpu.lowering_config<"
        f"distribution = [{par}], vector_common_parallel = [{par}], vector_reduction = [{red}]>, "
        "translation_info = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>>"
    )


def _scale(bits: str, out: str) -> str:
    """Lines decoding f16 bits held in an i16 SSA value into f32 `out`."""
    p = out.lstrip("%")
    return f"      %{p}_w = arith.extui {bits} : i16 to i32\n" + f16_bits_to_f32(f"%{p}_w", out, "      ")


def _scales(lay: TiledLayout) -> str:
    return "\n".join(_scale(f"%{p}b", f"%{p}") for p in lay.planes[1:] if PLANE_TYPE[p] == "i16")


def _weight_lines(lay: TiledLayout, h_dim: int, j_dim: int) -> str:
    """Body lines computing `%wv` (the dequantized weight) from `%q`, `%d` (and `%m` or `%qhb`);
    `h_dim`/`j_dim` are the loop dims of the nibble half and of the element within the half."""
    if lay.qbytes == 32:
        return "      %qf = arith.sitofp %q : i8 to f32\n      %wv = arith.mulf %qf, %d : f32"
    lines = [
        f"%h = linalg.index {h_dim} : index",
        "%h8 = arith.index_cast %h : index to i8",
        "%c4 = arith.constant 4 : i8",
        "%sh = arith.muli %h8, %c4 : i8",
        "%qsh = arith.shrui %q, %sh : i8",
        "%c15 = arith.constant 15 : i8",
        "%qn = arith.andi %qsh, %c15 : i8",
    ]
    if "qh" in lay.planes:  # the fifth bit: bit (16 h + j) of the block's word
        lines += [
            f"%jj = linalg.index {j_dim} : index",
            "%c16 = arith.constant 16 : index",
            "%hj = arith.muli %h, %c16 : index",
            "%bit = arith.addi %hj, %jj : index",
            "%bit32 = arith.index_cast %bit : index to i32",
            "%qhs = arith.shrui %qhb, %bit32 : i32",
            "%one = arith.constant 1 : i32",
            "%hb = arith.andi %qhs, %one : i32",
            "%c4i = arith.constant 4 : i32",
            "%hb4 = arith.shli %hb, %c4i : i32",
            "%qn32 = arith.extui %qn : i8 to i32",
            "%q5 = arith.ori %qn32, %hb4 : i32",
            "%qf = arith.uitofp %q5 : i32 to f32",
        ]
    else:
        lines.append("%qf = arith.uitofp %qn : i8 to f32")
    if lay.bias:
        lines += [f"%cb = arith.constant {lay.bias:.1f} : f32", "%m = arith.mulf %d, %cb : f32"]
    lines.append("%wv = math.fma %qf, %d, %m : f32")
    return "\n".join("      " + ln for ln in lines)


def _maps(lay: TiledLayout) -> tuple[str, str, str]:
    """(loop dims, quant map, scale map, x map) pieces for 8-bit (t,n,b,j) or 4-bit (t,n,b,h,j)."""
    if lay.qbytes == 32:
        return "(t, n, b, j)", "(t, b, j, n)", "(t, b, n)"
    return "(t, n, b, h, j)", "(t, b, j, n)", "(t, b, n)"


ROW_TILE = 8  # batch rows per vector body (measured on AVX2 for 8 rows: 8 beats 4 by 12%, 2 by 25%)


def decode_name(q: QuantType, n: int, k: int, rows: int = 0) -> str:
    return f"tiled_{q.name.lower()}_{f'b{rows}' if rows else '1'}_{n}x{k}"


def render_decode(q: QuantType, n: int, k: int, rows: int = 0) -> str:
    """A private func `y[1, n] = x[1, k] @ W[n, k]^T` over the tiled planes; with `rows`, the
    same for a batch of `rows` tokens (mlir/tiled_decode_batch.mlir)."""
    lay, nt, b = TILED_TYPES[q.name], n // TW, k // 32
    types = plane_types(q, n, k)
    dims, qmap, smap = _maps(lay)
    four = lay.qbytes == 16
    xshape = f"{b}x2x16" if four else f"{b}x32"
    xmap = "(b, h, j)" if four else "(b, j)"
    xexpand = f"[[0, 1, 2]] output_shape [{b}, 2, 16]" if four else f"[[0, 1]] output_shape [{b}, 32]"
    rank = 5 if four else 4
    out = "(t, n)"
    if rows:  # a leading row loop r; x and y gain a row index
        dims, xmap, out = "(r, " + dims[1:], "(r, " + xmap[1:], "(r, t, n)"
        xexpand = (
            f"[[0], [1, 2, 3]] output_shape [{rows}, {b}, 2, 16]"
            if four
            else f"[[0], [1, 2]] output_shape [{rows}, {b}, 32]"
        )
    args = ", ".join(f"%w_{p}: {types[p]}" for p in lay.planes)
    maps = [f"affine_map<{dims} -> {qmap}>"] + [f"affine_map<{dims} -> {smap}>"] * (len(lay.planes) - 1)
    maps += [f"affine_map<{dims} -> {xmap}>", f"affine_map<{dims} -> {out}>"]
    ins = ", ".join(f"%w_{p}" for p in lay.planes) + ", %xb"
    in_types = ", ".join(types[p] for p in lay.planes) + f", tensor<{f'{rows}x' if rows else ''}{xshape}xf32>"
    bb = ", ".join(["%q: i8"] + [f"%{p}b: {PLANE_TYPE[p]}" for p in lay.planes[1:]] + ["%xv: f32", "%a: f32"])
    iters = ", ".join(['"parallel"'] * (3 if rows else 2) + ['"reduction"'] * (rank - 2))
    shift = 1 if rows else 0
    return template("tiled_decode_batch.mlir" if rows else "tiled_decode.mlir").substitute(
        NAME=decode_name(q, n, k, rows), ARGS=args, N=str(n), K=str(k), NT=str(nt), TW=str(TW), R=str(rows),
        XSHAPE=xshape, XEXPAND=xexpand, INFO=_compilation_info(rank, min(rows, ROW_TILE)), MAPS=", ".join(maps),
        ITERS=iters, INS=ins, IN_TYPES=in_types, BB=bb, SCALES=_scales(lay),
        WEIGHT=_weight_lines(lay, 3 + shift, 4 + shift),
    )  # fmt: skip


def prefill_name(q: QuantType, n: int, k: int) -> str:
    return f"tiled_{q.name.lower()}_t_{n}x{k}"


def render_prefill(q: QuantType, n: int, k: int) -> str:
    """A private func `y[T, n] = x[T, k] @ W[n, k]^T`: dequantize W^T [k, n] to f32, then matmul."""
    lay, nt, b = TILED_TYPES[q.name], n // TW, k // 32
    types = plane_types(q, n, k)
    four = lay.qbytes == 16
    # dequant generic over (t, b, j, n) [+ h]: output W^T viewed as [B, 32, NT, TW] = [K, N]
    dims = "(t, b, h, j, n)" if four else "(t, b, j, n)"
    out_map = f"affine_map<{dims} -> (b, {'h, j' if four else 'j'}, t, n)>"
    out_shape = f"{b}x2x16x{nt}x{TW}" if four else f"{b}x32x{nt}x{TW}"
    maps = [f"affine_map<{dims} -> (t, b, j, n)>"] + [f"affine_map<{dims} -> (t, b, n)>"] * (
        len(lay.planes) - 1
    )
    maps.append(out_map)
    args = ", ".join(f"%w_{p}: {types[p]}" for p in lay.planes)
    ins = ", ".join(f"%w_{p}" for p in lay.planes)
    in_types = ", ".join(types[p] for p in lay.planes)
    bb = ", ".join(["%q: i8"] + [f"%{p}b: {PLANE_TYPE[p]}" for p in lay.planes[1:]] + ["%o: f32"])
    iters = ", ".join(['"parallel"'] * (5 if four else 4))
    weight = _weight_lines(lay, 2, 3)
    collapse = "[[0, 1, 2], [3, 4]]" if four else "[[0, 1], [2, 3]]"
    return template("tiled_prefill.mlir").substitute(
        NAME=prefill_name(q, n, k), ARGS=args, N=str(n), K=str(k), MAPS=", ".join(maps), ITERS=iters,
        INS=ins, IN_TYPES=in_types, OUT_SHAPE=out_shape, BB=bb, SCALES=_scales(lay), WEIGHT=weight, COLLAPSE=collapse,
    )  # fmt: skip
