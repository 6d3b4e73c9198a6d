"""Integer dot-product matmuls for the CPU (x86-64 with AVX2): the decode path of Q4_0, Q4_1, Q8_0.

Owns: `DOT8_TYPES`, `enabled()` (the host has AVX2, F16C and FMA, and `ZINC_CPU_INT8` is not 0),
the grouped weight layout (`plane_types`, `repack`: a byte shuffle of the GGUF blocks, 8 rows of a
group side by side, 4 bytes of each row at a time) and the kernels that read it:
  - decode (`render_decode`, one token or a static batch of rows): a hand-written dispatch
    (`mlir/dot8_decode.mlir`, a `stream.executable` IREE compiles as it is). Each workgroup first
    quantizes the activations per 32-block to int8 (scale `max|x| / 127`, round to nearest even,
    and the block sum for Q4_1 / Q4_0, as llama.cpp's Q8_1 / Q8_0 activations), then multiplies
    with `vpmaddubsw` / `vpmaddwd` (LLVM intrinsics), 8 output rows per vector, scales in f32;
  - prefill (`render_prefill`): the weight dequantized to f32 and one `linalg.matmul`, as in
    `tiled`, reading the grouped planes.
IREE's own codegen turns an i8 x i8 -> i32 contraction into scalar multiplies
(docs/PERFORMANCE.md, History), which is why these kernels name the instructions.
Imports: numpy, zinc.compiler.kernels (QuantType, templates), zinc.compiler.tiled (the shared
f16-decode and dequantization body lines).
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from zinc.compiler import tiled
from zinc.compiler.kernels import QuantType, template

G = 8  # output rows per vector: a group of rows is interleaved 4 bytes at a time
DOT8_TYPES = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}  # type -> 32-byte loads per block of a group
TARGET_WORKGROUPS = 16  # workgroups per dispatch: each quantizes the activations once
U8 = np.ndarray[Any, np.dtype[np.uint8]]


@cache
def host_supports() -> bool:
    """AVX2 (the byte dot products), F16C (scale decoding) and FMA, from /proc/cpuinfo."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            return {"avx2", "f16c", "fma"} <= set(line.split(":", 1)[1].split())
    return False


def enabled() -> bool:
    return os.environ.get("ZINC_CPU_INT8", "1") != "0" and host_supports()


def supports(q: QuantType, n: int, k: int) -> bool:
    return q.name in DOT8_TYPES and n % G == 0 and k % 32 == 0


def plane_types(q: QuantType, n: int, k: int) -> dict[str, str]:
    """Planes of an [n, k] weight: quants [n/8, k/32, loads, 8 rows, 4 bytes], f16-bit scales
    [n/8, k/32, 8 rows] (and the Q4_1 minimums, the same)."""
    ng, b, loads = n // G, k // 32, DOT8_TYPES[q.name]
    out = {"qs": f"tensor<{ng}x{b}x{loads}x{G}x4xi8>", "d": f"tensor<{ng}x{b}x{G}xi16>"}
    if q.name == "Q4_1":
        out["m"] = out["d"]
    return out


def repack(q: QuantType, raw: U8, n: int, k: int) -> dict[str, np.ndarray[Any, Any]]:
    """The planes of one GGUF tensor (`raw`: its bytes); scales stay f16 bits, sizes equal GGUF's."""
    ng, b, loads = n // G, k // 32, DOT8_TYPES[q.name]
    blocks = np.ascontiguousarray(raw).reshape(n, b, q.block_bytes)
    head = 4 if q.name == "Q4_1" else 2  # bytes of scales before the quants
    qs = blocks[:, :, head:].reshape(ng, G, b, loads, 4).transpose(0, 2, 3, 1, 4)

    def scale(lo: int) -> np.ndarray[Any, Any]:
        bits = blocks[:, :, lo : lo + 2].copy().view(np.int16)[..., 0]
        return np.ascontiguousarray(bits.reshape(ng, G, b).transpose(0, 2, 1))

    out = {"qs": np.ascontiguousarray(qs).view(np.int8), "d": scale(0)}
    if q.name == "Q4_1":
        out["m"] = scale(2)
    return out


def decode_name(q: QuantType, n: int, k: int, rows: int = 0) -> str:
    return f"dot8_{q.name.lower()}_{f'b{rows}' if rows else '1'}_{n}x{k}"


def _load_lines(q: QuantType, rows: int) -> str:
    """Per block of a group: the 32-byte loads, and per row the i16 (4-bit) or i32 (8-bit) sums."""
    lines: list[str] = []
    four = DOT8_TYPES[q.name] == 4
    for s in range(DOT8_TYPES[q.name]):
        lines.append(f"%w{s} = vector.load %wq[%g, %b, %c{s}, %c0] : memref<${{QS}}>, vector<32xi8>")
        if four:
            lines += [f"%lo{s} = arith.andi %w{s}, %m15 : vector<32xi8>", f"%hi{s} = arith.shrui %w{s}, %c4v : vector<32xi8>"]
        else:
            lines.append(f"%aw{s} = math.absi %w{s} : vector<32xi8>")
    for r in range(rows):
        acc = ""
        halves = [(s, s, f"lo{s}") for s in range(4)] + [(s, 4 + s, f"hi{s}") for s in range(4)]
        parts = halves if four else [(s, s, f"w{s}") for s in range(8)]
        for s, xs, w in parts:
            p = f"%p{r}_{xs}"
            lines += [
                f"%x{r}_{xs}a = vector.load %xq[%c{r}, %b, %c{4 * xs}] : memref<${{XQ}}>, vector<4xi8>",
                f"%x{r}_{xs}b = vector.bitcast %x{r}_{xs}a : vector<4xi8> to vector<1xi32>",
                f"%x{r}_{xs}c = vector.broadcast %x{r}_{xs}b : vector<1xi32> to vector<8xi32>",
                f"%x{r}_{xs} = vector.bitcast %x{r}_{xs}c : vector<8xi32> to vector<32xi8>",
            ]
            if four:
                lines.append(f"{p} = {_intr('pmadd.ub.sw', f'%{w}', f'%x{r}_{xs}', '32xi8', '16xi16')}")
            else:  # signed weights: |w| times x with w's sign, the unsigned x signed form vpmaddubsw takes
                lines += [
                    f"%sx{r}_{xs} = {_intr('psign.b', f'%x{r}_{xs}', f'%w{s}', '32xi8', '32xi8')}",
                    f"%u{r}_{xs} = {_intr('pmadd.ub.sw', f'%aw{s}', f'%sx{r}_{xs}', '32xi8', '16xi16')}",
                    f"{p} = {_intr('pmadd.wd', f'%u{r}_{xs}', '%ones', '16xi16', '8xi32')}",
                ]
            if acc:  # 4-bit: 8 pair sums of at most 2 * 15 * 127 each fit in i16
                lines.append(f"%s{r}_{xs} = arith.addi {acc}, {p} : vector<{'16xi16' if four else '8xi32'}>")
                acc = f"%s{r}_{xs}"
            else:
                acc = p
        if four:  # the i16 sums of each row's 4-byte groups, added pairwise into i32
            lines.append(f"%i{r} = {_intr('pmadd.wd', acc, '%ones', '16xi16', '8xi32')}")
            acc = f"%i{r}"
        lines += [
            f"%f{r} = arith.sitofp {acc} : vector<8xi32> to vector<8xf32>",
            f"%dx{r} = memref.load %dx[%c{r}, %b] : memref<${{DX}}>",
            f"%dxv{r} = vector.broadcast %dx{r} : f32 to vector<8xf32>",
            f"%t{r} = arith.mulf %dw, %dxv{r} : vector<8xf32>",
            f"%a{r}{'' if q.name == 'Q8_0' else 'x'} = math.fma %f{r}, %t{r}, %acc{r} : vector<8xf32>",
        ]
        if q.name != "Q8_0":  # + m * sum(x) (Q4_1) or - 8 d * sum(x) (Q4_0), sum(x) as d_x * sum(q_x)
            lines += [
                f"%sx{r} = memref.load %sx[%c{r}, %b] : memref<${{DX}}>",
                f"%sxv{r} = vector.broadcast %sx{r} : f32 to vector<8xf32>",
                f"%a{r} = math.fma %mw, %sxv{r}, %a{r}x : vector<8xf32>",
            ]
    return "\n".join("          " + ln for ln in lines)


def _intr(name: str, a: str, b: str, ty: str, out: str) -> str:
    return f'llvm.call_intrinsic "llvm.x86.avx2.{name}"({a}, {b}) : (vector<{ty}>, vector<{ty}>) -> vector<{out}>'


def render_decode(q: QuantType, n: int, k: int, rows: int = 0) -> str:
    """A `stream.executable` and the private func `y[R, n] = x[R, k] @ W[n, k]^T` dispatching it
    (R = `rows`, or 1 for the single-token decode)."""
    r = rows or 1
    ng, b, loads = n // G, k // 32, DOT8_TYPES[q.name]
    per_wg = max(1, -(-ng // TARGET_WORKGROUPS))
    types = plane_types(q, n, k)
    planes = list(types)
    name = decode_name(q, n, k, rows)
    if q.name == "Q4_1":
        mscale = "%mbits = vector.load %wm[%g, %b, %c0] : memref<${DS}>, vector<8xi16>\n" + (
            "          %mh = arith.bitcast %mbits : vector<8xi16> to vector<8xf16>\n"
            "          %mw = arith.extf %mh : vector<8xf16> to vector<8xf32>"
        )
    elif q.name == "Q4_0":
        mscale = "%mw = arith.mulf %dw, %m8 : vector<8xf32>"
    else:
        mscale = ""
    consts = "\n".join(f"    %c{i} = arith.constant {i} : index" for i in range(max(32, r)))
    shapes = {"QS": f"{ng}x{b}x{loads}x32xi8", "DS": f"{ng}x{b}x{G}xi16", "XQ": f"{r}x{b}x32xi8", "DX": f"{r}x{b}xf32"}
    text = template("dot8_decode.mlir").substitute(
        **shapes,
        NAME=name, NWG=str(-(-ng // per_wg)), PER_WG=str(per_wg), NG=str(ng), R=str(r), B=str(b),
        K=str(k), N=str(n), CONSTS=consts, ITER_INIT=", ".join(f"%acc{i} = %zf" for i in range(r)),
        ITER_TYPES=", ".join(["vector<8xf32>"] * r), YIELD=", ".join(f"%a{i}" for i in range(r)),
        YIELD_TYPES=", ".join(["vector<8xf32>"] * r), RESULTS=f"%acc:{r}" if r > 1 else "%acc0",
        STORES="\n".join(
            f"      vector.store {'%acc#' + str(i) if r > 1 else '%acc0'}, %y[%c{i}, %n0] : memref<{r}x{n}xf32>, vector<8xf32>"
            for i in range(r)
        ),
        BINDINGS=", ".join(f"%b_{p}: !stream.binding" for p in planes),
        WM=("    %wm = stream.binding.subspan %b_m[%c0] : !stream.binding -> memref<${DS}>" if "m" in types else ""),
        MSCALE=mscale, BODY=_load_lines(q, r),
        ARGS=", ".join(f"%w_{p}: {types[p]}" for p in planes), OPERANDS=", ".join(f"%w_{p}" for p in planes),
        OPERAND_TYPES=", ".join(types[p] for p in planes),
    )  # fmt: skip
    for key, val in shapes.items():
        text = text.replace("${" + key + "}", val)
    return text  # the memref shapes inside the inserted fragments, as in the template


def prefill_name(q: QuantType, n: int, k: int) -> str:
    return f"dot8_{q.name.lower()}_t_{n}x{k}"


def render_prefill(q: QuantType, n: int, k: int) -> str:
    """A private func `y[T, n] = x[T, k] @ W[n, k]^T`: the grouped planes dequantized to W^T
    [k, n] f32 (k = 32 b + 16 h + 4 s + e for 4-bit, 32 b + 4 s + e for 8-bit), then a matmul."""
    ng, b, loads = n // G, k // 32, DOT8_TYPES[q.name]
    types = plane_types(q, n, k)
    lay = tiled.TILED_TYPES[q.name]
    four = loads == 4
    dims = "(g, b, s, i, e, h)" if four else "(g, b, s, i, e)"
    maps = [f"affine_map<{dims} -> (g, b, s, i, e)>"] + [f"affine_map<{dims} -> (g, b, i)>"] * (len(types) - 1)
    maps.append(f"affine_map<{dims} -> (b, {'h, ' if four else ''}s, e, g, i)>")
    out_shape = f"{b}x2x4x4x{ng}x{G}" if four else f"{b}x8x4x{ng}x{G}"
    bb = ", ".join(["%q: i8"] + [f"%{p}b: i16" for p in list(types)[1:]] + ["%o: f32"])
    return template("tiled_prefill.mlir").substitute(
        NAME=prefill_name(q, n, k), ARGS=", ".join(f"%w_{p}: {t}" for p, t in types.items()), N=str(n), K=str(k),
        MAPS=", ".join(maps), ITERS=", ".join(['"parallel"'] * (6 if four else 5)),
        INS=", ".join(f"%w_{p}" for p in types), IN_TYPES=", ".join(types.values()), OUT_SHAPE=out_shape, BB=bb,
        SCALES=tiled.scales_lines(lay), WEIGHT=tiled.weight_lines(lay, 5, -1),
        COLLAPSE="[[0, 1, 2, 3], [4, 5]]" if four else "[[0, 1, 2], [3, 4]]",
    )  # fmt: skip
