"""Prefill attention on the CPU: the hand-written flash-attention dispatch
(mlir/attention_prefill.mlir) and the private func that transposes K and dispatches it.

Owns: `render_prefill_attention`, `rows_per_workgroup`. The linalg form (mlir/attention_window.mlir)
stores every [T, S] score, max, exponential and mask between its dispatches; at a 4,096-token
prompt those are tens of MB per layer and chunk, more than the caches hold, and its attention took
most of the prefill. This one keeps R rows' online softmax in a workgroup and reads each block of
BW keys once for its R rows, from a tile of K laid out block by block so it is read in order.
Vulkan keeps the linalg form.
Imports: zinc.artifact (CTX_ALIGN), zinc.compiler.kernels.
"""

from __future__ import annotations

from zinc.artifact import CTX_ALIGN
from zinc.compiler.kernels import template

BW = CTX_ALIGN  # positions per block: one 512-bit vector of scores (S is a multiple of it)
ROW_LANES = 512  # the R rows' weighted sums: up to 32 512-bit vectors


def rows_per_workgroup(hd: int) -> int:
    """Rows a workgroup takes (up to 4): each block of keys and values is read once for all of
    them, which pays more than keeping their weighted sums in registers (at head width 128 they
    spill)."""
    return max(1, min(4, ROW_LANES // hd))


def partial_sums(r: int, hd: int) -> int:
    """Partial dot products per row (independent FMA chains): 4 in all where `hd` allows."""
    return next(a for a in (max(1, 4 // r), 2, 1) if hd % a == 0)


def render_prefill_attention(
    name: str, heads: int, heads_kv: int, hd: int, scale: str, window: int
) -> str:
    """The executable and its dispatching func `@name(q [T, heads*hd], k, v [S, heads_kv, hd],
    start) -> [T, heads*hd]`, the signature of the linalg form's func; `scale` is an MLIR f32
    literal."""
    r, hhd = rows_per_workgroup(hd), heads * hd
    acc = partial_sums(r, hd)
    rows, dot, dot_init, dot_yield, softmax, values, stores = [], [], [], [], [], [], []
    vec = f"vector<{hd}xf32>"
    for i in range(r):
        rows += [
            f"%cr{i} = arith.constant {i} : index",
            f"%tu{i} = arith.addi %tb, %cr{i} : index",
            f"%t{i} = arith.minui %tu{i}, %tlast : index",
            f"%qp{i} = arith.addi %start, %t{i} : index",
            f"%qpi{i} = arith.index_cast %qp{i} : index to i32",
            f"%qpv{i} = vector.broadcast %qpi{i} : i32 to vector<{BW}xi32>",
        ]
    for a in range(acc):
        dot += [
            f"%ca{a} = arith.constant {a} : index",
            f"%d{a} = arith.addi %d, %ca{a} : index",
            f"%k{a} = vector.load %kt[%g, %sb, %d{a}, %c0] : memref<{heads_kv}x?x{hd}x{BW}xf32>, vector<{BW}xf32>",
            f"%qi{a} = arith.addi %qoff, %d{a} : index",
        ]
        for i in range(r):
            dot += [
                f"%q{i}_{a} = memref.load %q[%t{i}, %qi{a}] : memref<?x{hhd}xf32>",
                f"%qb{i}_{a} = vector.broadcast %q{i}_{a} : f32 to vector<{BW}xf32>",
                f"%f{i}_{a} = math.fma %qb{i}_{a}, %k{a}, %sa{i}_{a} : vector<{BW}xf32>",
            ]
    for i in range(r):
        dot_init += [f"%sa{i}_{a} = %zbw" for a in range(acc)]
        dot_yield += [f"%f{i}_{a}" for a in range(acc)]
        softmax += [*_sum_partials(i, acc), *_online_softmax(i, hd)]
        stores += [
            f"%lv{i} = vector.broadcast %res#{3 * i + 1} : f32 to {vec}",
            f"%out{i} = arith.divf %res#{3 * i + 2}, %lv{i} : {vec}",
            f"%in{i} = arith.cmpi ult, %tu{i}, %tn : index",
            f"scf.if %in{i} {{",
            f"  vector.store %out{i}, %y[%t{i}, %qoff] : memref<?x{hhd}xf32>, {vec}",
            "}",
        ]
    for j in range(BW):
        values += [
            f"%cj{j} = arith.constant {j} : index",
            f"%sj{j} = arith.addi %s0, %cj{j} : index",
            f"%vr{j} = vector.load %v[%sj{j}, %g, %c0] : memref<?x{heads_kv}x{hd}xf32>, {vec}",
        ]
        for i in range(r):
            values += [
                f"%pj{i}_{j} = vector.extract %p{i}[{j}] : f32 from vector<{BW}xf32>",
                f"%pb{i}_{j} = vector.broadcast %pj{i}_{j} : f32 to {vec}",
                f"%a{j + 1}_{i} = math.fma %pb{i}_{j}, %vr{j}, %a{j}_{i} : {vec}",
            ]
    executable = template("attention_prefill.mlir").substitute(
        NAME=name, HEADS=str(heads), G=str(heads // heads_kv), HKV=str(heads_kv), HD=str(hd), HHD=str(hhd),
        R=str(r), R1=str(r - 1), ACC=str(acc), WINDOW=str(window), SCALE=scale,
        BW=str(BW), BW1=str(BW - 1), IOTA=", ".join(map(str, range(BW))),
        ROWS=_indent(rows, 6), NRES=str(3 * r), NDOT=str(r * acc),
        ITER_INIT=", ".join(f"%m{i} = %mstart, %l{i} = %zero, %acc{i} = %zhd" for i in range(r)),
        ITER_TYPES=", ".join(f"f32, f32, {vec}" for _ in range(r)),
        DOT_INIT=", ".join(dot_init), DOT_TYPES=", ".join(f"vector<{BW}xf32>" for _ in dot_init),
        DOT=_indent(dot, 10), DOT_YIELD=", ".join(dot_yield),
        SOFTMAX=_indent(softmax, 8), VALUES=_indent(values, 8),
        YIELD=", ".join(f"%mn{i}, %l2{i}, %a{BW}_{i}" for i in range(r)), STORES=_indent(stores, 6),
    )  # fmt: skip
    return executable + _dispatcher(name, heads_kv, hd, hhd)


def _sum_partials(i: int, acc: int) -> list[str]:
    """Row i's 8 scores `%sc{i}` from its `acc` partial sums, added pairwise in a fixed order."""
    level = [f"%dot#{i * acc + a}" for a in range(acc)]
    lines, n = [], 0
    while len(level) > 1:
        nxt = []
        for x, y in zip(level[::2], level[1::2], strict=True):
            lines.append(f"%ps{i}_{n} = arith.addf {x}, {y} : vector<{BW}xf32>")
            nxt.append(f"%ps{i}_{n}")
            n += 1
        level = nxt
    return [*lines, f"%sc{i} = arith.addf {level[0]}, %zbw : vector<{BW}xf32>"]


def _online_softmax(i: int, hd: int) -> list[str]:
    """Row i's mask (causal and window) and online-softmax update of m, l and acc."""
    vec = f"vector<{hd}xf32>"
    return [
        f"%dist{i} = arith.subi %qpv{i}, %posv : vector<{BW}xi32>",
        f"%vis{i} = arith.cmpi sge, %dist{i}, %zi : vector<{BW}xi32>",
        f"%near{i} = arith.cmpi slt, %dist{i}, %win : vector<{BW}xi32>",
        f"%ok{i} = arith.andi %vis{i}, %near{i} : vector<{BW}xi1>",
        f"%scm{i} = arith.select %ok{i}, %sc{i}, %ninf : vector<{BW}xi1>, vector<{BW}xf32>",
        f"%bm{i} = vector.reduction <maximumf>, %scm{i} : vector<{BW}xf32> into f32",
        f"%mn{i} = arith.maximumf %m{i}, %bm{i} : f32",
        f"%dm{i} = arith.subf %m{i}, %mn{i} : f32",
        f"%dms{i} = arith.mulf %dm{i}, %scale : f32",
        f"%corr{i} = math.exp %dms{i} : f32",
        f"%mnv{i} = vector.broadcast %mn{i} : f32 to vector<{BW}xf32>",
        f"%e{i} = arith.subf %scm{i}, %mnv{i} : vector<{BW}xf32>",
        f"%es{i} = arith.mulf %e{i}, %scv : vector<{BW}xf32>",
        f"%p{i} = math.exp %es{i} : vector<{BW}xf32>",
        f"%psum{i} = vector.reduction <add>, %p{i} fastmath<reassoc> : vector<{BW}xf32> into f32",
        f"%l2{i} = math.fma %l{i}, %corr{i}, %psum{i} : f32",
        f"%corrv{i} = vector.broadcast %corr{i} : f32 to {vec}",
        f"%a0_{i} = arith.mulf %acc{i}, %corrv{i} : {vec}",
    ]


def _indent(lines: list[str], n: int) -> str:
    return "\n".join(" " * n + ln for ln in lines)


def _dispatcher(name: str, heads_kv: int, hd: int, hhd: int) -> str:
    """The private func: K [S, HKV, HD] in blocks of BW positions, [HKV, S / BW, HD, BW] (a
    block's keys one contiguous tile, read in order), then the dispatch over rows."""
    act, rows = f"tensor<?x{hhd}xf32>", f"tensor<?x{heads_kv}x{hd}xf32>"
    blocks, kt = f"tensor<?x{BW}x{heads_kv}x{hd}xf32>", f"tensor<{heads_kv}x?x{hd}x{BW}xf32>"
    return "\n".join([
        f"func.func private @{name}(%q: {act}, %k: {rows}, %v: {rows}, %start: index) -> {act} {{",
        "  %c0 = arith.constant 0 : index",
        f"  %cbw = arith.constant {BW} : index",
        f"  %T = tensor.dim %q, %c0 : {act}",
        f"  %S = tensor.dim %k, %c0 : {rows}",
        "  %SB = arith.divui %S, %cbw : index",
        f"  %kb = tensor.expand_shape %k [[0, 1], [2], [3]] output_shape [%SB, {BW}, {heads_kv}, {hd}] : {rows} into {blocks}",
        f"  %e = tensor.empty(%SB) : {kt}",
        f"  %kt = linalg.transpose ins(%kb : {blocks}) outs(%e : {kt}) permutation = [2, 0, 3, 1]",
        f"  %y = flow.dispatch @{name}_ex::@{name}[%T](%q, %kt, %v, %T, %S, %start) : "
        f"({act}{{%T}}, {kt}{{%SB}}, {rows}{{%S}}, index, index, index) -> {act}{{%T}}",
        f"  return %y : {act}",
        "}",
    ]) + "\n"  # fmt: skip
