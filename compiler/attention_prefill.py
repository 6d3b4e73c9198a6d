"""Prefill attention on the CPU: the hand-written flash-attention dispatch
(mlir/attention_prefill.mlir) and the private func that lays out its operands and dispatches it.

Owns: `render_prefill_attention`, `Tiling`, `tiling`. The linalg form (mlir/attention_window.mlir)
stores every [T, S] score, max, exponential and mask between its dispatches; at a 4,096-token
prompt those are tens of MB per layer and chunk, more than the caches hold. This one keeps a
block of rows' online softmax in a workgroup, its vectors running across the rows (one lane a
row): a score is one FMA per head element with the key broadcast from memory, the softmax's max,
exponentials and sums take one vector op per position for all the rows, and each key and value
is read once for them all. Vulkan keeps the linalg form.
Imports: zinc.artifact (CTX_ALIGN), zinc.compiler.kernels, zinc.compiler.targets, zinc.errors.
"""

from __future__ import annotations

from dataclasses import dataclass

from zinc.artifact import CTX_ALIGN
from zinc.compiler.kernels import template
from zinc.compiler.targets import target_cpu_flags
from zinc.errors import ZincError

BW = CTX_ALIGN  # positions per block (S is a multiple of it)


@dataclass(frozen=True)
class Tiling:
    """lanes: the (row, query head) pairs of a workgroup, one vector register of f32: `rows`
    rows of `heads` query heads of one KV head, lane m row m // heads and head m % heads; jb:
    scores summed at once (their registers and the queries' stay in the register file); dc:
    head dims of the weighted sums updated at once, beside the block's BW probabilities."""

    lanes: int
    heads: int
    jb: int
    dc: int

    @property
    def rows(self) -> int:
        return self.lanes // self.heads


def tiling(heads: int, heads_kv: int, hd: int) -> Tiling:
    """AVX-512 (32 registers of 16 f32): 16 lanes, all 16 scores of a block at once, 8 dims of
    the sums beside the 16 probabilities. AVX2 (16 of 8): 8 lanes, 8 scores, 4 dims (the
    probabilities spill there). The lanes take as many query heads of a KV head as divide them
    (Llama 3's 4: 4 rows of 4 heads), so a prompt of a few tokens still fills them; the keys
    and values are read once for all the lanes either way."""
    wide = "avx512f" in target_cpu_flags()
    lanes, jb, dc = (16, 16, 8) if wide else (8, 8, 4)
    if hd % lanes:
        raise ZincError(f"the CPU's prefill attention takes head widths that are multiples of {lanes}, not {hd}")
    group = heads // heads_kv
    per = max(p for p in range(1, group + 1) if group % p == 0 and lanes % p == 0)
    return Tiling(lanes, per, jb, dc)


def render_prefill_attention(
    name: str, heads: int, heads_kv: int, hd: int, scale: str, window: int
) -> str:
    """The executable and its dispatching func `@name(q [T, heads*hd], k, v [S, heads_kv, hd],
    start) -> [T, heads*hd]`, the signature of the linalg form's func; `scale` is an MLIR f32
    literal."""
    tl = tiling(heads, heads_kv, hd)
    executable = template("attention_prefill.mlir").substitute(
        NAME=name, NHG=str(heads // tl.heads), GQ=str(tl.heads), GG=str(heads // heads_kv // tl.heads),
        HKV=str(heads_kv), HD=str(hd), HHD=str(heads * hd), L=str(tl.lanes), R=str(tl.rows),
        R1=str(tl.rows - 1), BW=str(BW), BW1=str(BW - 1), DC=str(tl.dc), WINDOW=str(window), SCALE=scale,
        LROW=", ".join(str(m // tl.heads) for m in range(tl.lanes)),
        QK=_indent(_scores(heads, heads_kv, hd, tl), 8), SOFTMAX=_indent(_softmax(tl.lanes, tl.jb), 8),
        PV=_indent(_weighted_sums(heads_kv, hd, tl), 10), OUT=_indent(_results(heads * hd, hd, tl), 8),
    )  # fmt: skip
    return executable + _dispatcher(name, heads, heads_kv, hd, tl.heads)


def _scores(heads: int, heads_kv: int, hd: int, tl: Tiling) -> list[str]:
    """The block's positions `%sp{j}` and raw scores (lanes: rows; `_score(j)`), JB at a time: a loop
    over the head's dims, one query vector and JB FMAs with the keys broadcast per dim (the
    block's keys of a dim side by side in kt)."""
    vec, kt = f"vector<{tl.lanes}xf32>", f"memref<{heads_kv}x?x{hd}x{BW}xf32>"
    lines = ["%sb = arith.divui %s0, %cbw : index"]
    for j in range(BW):
        lines += [f"%cj{j} = arith.constant {j} : index", f"%sp{j} = arith.addi %s0, %cj{j} : index"]
    for p in range(BW // tl.jb):
        js = range(p * tl.jb, (p + 1) * tl.jb)
        init = ", ".join(f"%a{j} = %zl" for j in js)
        types = ", ".join(vec for _ in js)
        lines += [
            f"%dot{p}:{tl.jb} = scf.for %d = %c0 to %chd step %c1 iter_args({init}) -> ({types}) {{",
            f"  %qv{p} = vector.maskedload %qt[%hg, %d, %tbq], %inq, %zl : memref<{heads // tl.heads}x{hd}x?xf32>, "
            f"vector<{tl.lanes}xi1>, {vec} into {vec}",
        ]
        for j in js:
            lines += [
                f"  %k{j} = memref.load %kt[%g, %sb, %d, %cj{j}] : {kt}",
                f"  %kb{j} = vector.broadcast %k{j} : f32 to {vec}",
                f"  %f{j} = math.fma %qv{p}, %kb{j}, %a{j} : {vec}",
            ]
        lines += [f"  scf.yield {', '.join(f'%f{j}' for j in js)} : {types}", "}"]
    return lines


def _score(j: int, jb: int) -> str:
    return f"%dot{j // jb}#{j % jb}"


def _softmax(lanes: int, jb: int) -> list[str]:
    """Each lane's mask (causal and window: 0 <= its position - s < WINDOW, as one unsigned
    compare), the block's max, the correction of the running sums, the probabilities `%p{j}` and
    the new denominator `%l2`, for all the rows at once."""
    vec, ivec = f"vector<{lanes}xf32>", f"vector<{lanes}xi32>"
    lines = []
    for j in range(BW):
        lines += [
            f"%spi{j} = arith.index_cast %sp{j} : index to i32",
            f"%spv{j} = vector.broadcast %spi{j} : i32 to {ivec}",
            f"%dist{j} = arith.subi %qpv, %spv{j} : {ivec}",
            f"%ok{j} = arith.cmpi ult, %dist{j}, %win : {ivec}",
            f"%sc{j} = arith.select %ok{j}, {_score(j, jb)}, %ninf : vector<{lanes}xi1>, {vec}",
        ]
    lines += _tree("maximumf", [f"%sc{j}" for j in range(BW)], "%bm", vec)
    lines += [
        f"%mn = arith.maximumf %m, %bm : {vec}",
        f"%dm = arith.subf %m, %mn : {vec}",
        f"%dms = arith.mulf %dm, %scv : {vec}",
        f"%corr = math.exp %dms : {vec}",
    ]
    for j in range(BW):
        lines += [
            f"%e{j} = arith.subf %sc{j}, %mn : {vec}",
            f"%es{j} = arith.mulf %e{j}, %scv : {vec}",
            f"%p{j} = math.exp %es{j} : {vec}",
        ]
    lines += _tree("addf", [f"%p{j}" for j in range(BW)], "%psum", vec)
    return [*lines, f"%l2 = math.fma %l, %corr, %psum : {vec}"]


def _weighted_sums(heads_kv: int, hd: int, tl: Tiling) -> list[str]:
    """One chunk of DC dims from `%dc`: the running sums ot[dc + i] (lanes: rows) corrected, then
    for each position j its probabilities times v[g, s0 + j, dc + i] broadcast."""
    vec, vt = f"vector<{tl.lanes}xf32>", f"memref<{heads_kv}x?x{hd}xf32>"
    lines = []
    for i in range(tl.dc):
        lines += [
            f"%ci{i} = arith.constant {i} : index",
            f"%di{i} = arith.addi %dc, %ci{i} : index",
            f"%o{i} = vector.load %ot[%di{i}, %c0] : memref<{hd}x{tl.lanes}xf32>, {vec}",
            f"%w0_{i} = arith.mulf %o{i}, %corr : {vec}",
        ]
    for j in range(BW):
        for i in range(tl.dc):
            lines += [
                f"%v{j}_{i} = memref.load %vt[%g, %sp{j}, %di{i}] : {vt}",
                f"%vb{j}_{i} = vector.broadcast %v{j}_{i} : f32 to {vec}",
                f"%w{j + 1}_{i} = math.fma %p{j}, %vb{j}_{i}, %w{j}_{i} : {vec}",
            ]
    lines += [f"vector.store %w{BW}_{i}, %ot[%di{i}, %c0] : memref<{hd}x{tl.lanes}xf32>, {vec}" for i in range(tl.dc)]
    return lines


def _results(hhd: int, hd: int, tl: Tiling) -> list[str]:
    """The lanes' results over L dims from `%dc`: ot's L vectors (lanes: (row, head) pairs)
    transposed into the lanes' (lanes: dims), each divided by its lane's denominator and stored
    to its row and head if the row is one of T's."""
    lanes = tl.lanes
    tile, vec = f"vector<{lanes}x{lanes}xf32>", f"vector<{lanes}xf32>"
    lines = [
        f"%tile = vector.transfer_read %ot[%dc, %c0], %c0f {{in_bounds = [true, true]}} : memref<{hd}x{lanes}xf32>, {tile}",
        f"%rt = vector.transpose %tile, [1, 0] : {tile} to {tile}",
        "%doff = arith.addi %qoff, %dc : index",
    ]
    for m in range(lanes):
        r, hh = divmod(m, tl.heads)
        lines += [
            f"%cm{m} = arith.constant {r} : index",
            f"%t{m} = arith.addi %tb, %cm{m} : index",
            f"%ho{m} = arith.constant {hh * hd} : index",
            f"%col{m} = arith.addi %doff, %ho{m} : index",
            f"%in{m} = arith.cmpi ule, %t{m}, %tlast : index",
            f"scf.if %in{m} {{",
            f"  %row{m} = vector.extract %rt[{m}] : {vec} from {tile}",
            f"  %ir{m} = vector.extract %inv[{m}] : f32 from {vec}",
            f"  %irv{m} = vector.broadcast %ir{m} : f32 to {vec}",
            f"  %out{m} = arith.mulf %row{m}, %irv{m} : {vec}",
            f"  vector.store %out{m}, %y[%t{m}, %col{m}] : memref<?x{hhd}xf32>, {vec}",
            "}",
        ]
    return lines


def _tree(op: str, values: list[str], out: str, vec: str) -> list[str]:
    """`out` = `op` over `values`, pairwise in a fixed order."""
    lines, level, n = [], values, 0
    while len(level) > 1:
        nxt = []
        for x, y in zip(level[::2], level[1::2], strict=True):
            name = f"{out}_{n}" if len(level) > 2 else out
            lines.append(f"{name} = arith.{op} {x}, {y} : {vec}")
            nxt.append(name)
            n += 1
        level = nxt
    return lines


def _indent(lines: list[str], n: int) -> str:
    return "\n".join(" " * n + ln for ln in lines)


def _dispatcher(name: str, heads: int, heads_kv: int, hd: int, per: int) -> str:
    """The private func: q [T, heads*hd] as [heads / per, hd, T * per] (a workgroup's lanes, its
    rows' `per` heads side by side: one vector load per dim), K [S, HKV, hd] in blocks of BW
    positions [HKV, S / BW, hd, BW] (a block's keys of one dim side by side: its broadcasts at
    fixed offsets from one address), V as [HKV, S, hd] (a KV head's rows contiguous, read in
    order), then the dispatch over blocks of rows and groups of heads."""
    hhd, nhg = heads * hd, heads // per
    act, rows = f"tensor<?x{hhd}xf32>", f"tensor<?x{heads_kv}x{hd}xf32>"
    q4, q4t = f"tensor<?x{nhg}x{per}x{hd}xf32>", f"tensor<{nhg}x{hd}x?x{per}xf32>"
    qt, vt = f"tensor<{nhg}x{hd}x?xf32>", f"tensor<{heads_kv}x?x{hd}xf32>"
    blocks, kt = f"tensor<?x{BW}x{heads_kv}x{hd}xf32>", f"tensor<{heads_kv}x?x{hd}x{BW}xf32>"
    return "\n".join([
        f"func.func private @{name}(%q: {act}, %k: {rows}, %v: {rows}, %start: index) -> {act} {{",
        "  %c0 = arith.constant 0 : index",
        "  %c2 = arith.constant 2 : index",
        f"  %cbw = arith.constant {BW} : index",
        f"  %T = tensor.dim %q, %c0 : {act}",
        f"  %S = tensor.dim %k, %c0 : {rows}",
        "  %SB = arith.divui %S, %cbw : index",
        f"  %q4 = tensor.expand_shape %q [[0], [1, 2, 3]] output_shape [%T, {nhg}, {per}, {hd}] : {act} into {q4}",
        f"  %eq = tensor.empty(%T) : {q4t}",
        f"  %q4t = linalg.transpose ins(%q4 : {q4}) outs(%eq : {q4t}) permutation = [1, 3, 0, 2]",
        f"  %qt = tensor.collapse_shape %q4t [[0], [1], [2, 3]] : {q4t} into {qt}",
        f"  %kb = tensor.expand_shape %k [[0, 1], [2], [3]] output_shape [%SB, {BW}, {heads_kv}, {hd}] : {rows} into {blocks}",
        f"  %ek = tensor.empty(%SB) : {kt}",
        f"  %kt = linalg.transpose ins(%kb : {blocks}) outs(%ek : {kt}) permutation = [2, 0, 3, 1]",
        f"  %ev = tensor.empty(%S) : {vt}",
        f"  %vt = linalg.transpose ins(%v : {rows}) outs(%ev : {vt}) permutation = [1, 0, 2]",
        "  %Tq = tensor.dim %qt, %c2 : " + qt,
        f"  %y = flow.dispatch @{name}_ex::@{name}[%T](%qt, %kt, %vt, %T, %S, %start) : "
        f"({qt}{{%Tq}}, {kt}{{%SB}}, {vt}{{%S}}, index, index, index) -> {act}{{%T}}",
        f"  return %y : {act}",
        "}",
    ]) + "\n"  # fmt: skip
