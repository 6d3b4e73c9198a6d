"""Decode attention on the CPU: the hand-written online-softmax dispatch (mlir/attention_decode.mlir)
and the private func that dispatches it.

Owns: `render_decode_attention`, `heads_per_workgroup`. A workgroup takes one row and several
query heads of one KV head (GQA; as many as fit in registers: all 3 of a KV head on SmolLM2, one
of Gemma 3's 256-wide heads), which share its reads (each position's slot, K row and V row,
widened from f16 once); blocks wholly behind a sliding window are skipped; and each head keeps its own softmax with the operations, in the order, of a workgroup of its own, so
results do not depend on the grouping (the outputs are bit for bit those of the kernel with a
workgroup per query head, which read each K/V row G times). The K/V rows of a position are a slot
apart (every layer's rows in between) and come from memory once the weights have gone through the
caches, so the kernel prefetches them `AHEAD` positions ahead.
Imports: zinc.compiler.emitter, zinc.compiler.kernels, zinc.model.hparams.
"""

from __future__ import annotations

from zinc.compiler.emitter import f32_const
from zinc.compiler.kernels import template
from zinc.model.hparams import HParams

LANES = 16  # f32 lanes of the partial dot products (one 512-bit vector)
# K/V rows prefetched this many positions ahead of the block being read (and the first ones before
# the loop). SmolLM2's attention of an 8-row step at 48 positions, summed over its tiles: 0.99 ms
# with the prefetch in the loop only, 0.78-0.84 with the first positions too, against 1.54 without
# any; 8 ahead 1.07-1.12, 32 ahead (in the loop only) 1.25-1.31; 24 within noise of 16.
AHEAD = 16
REGISTER_LANES = 192  # a workgroup's q and sums over its heads: 2 x 12 of the 32 512-bit registers


def render_decode_attention(name: str, hp: HParams, t: str, scale: float, win: int, dt: str) -> str:
    """mlir/attention_decode.mlir and the private func dispatching it, for rows `t` (1 or ?), over a
    slab of `dt` (f16 rows are widened to f32 as they are loaded)."""
    heads, heads_kv, hd = hp.head_count, hp.head_count_kv, hp.key_length
    group = heads // heads_kv
    per = heads_per_workgroup(group, hd)
    hhd = heads * hd
    mem = f"memref<?x{hp.block_count}x2x{heads_kv}x{hd}x{dt}>"
    chunks = hd // LANES if hd % LANES == 0 else 0  # 16-lane pieces of a head, or 0: whole-head sums
    vec = f"vector<{hd}xf32>"

    def load(out: str, part: str, j: int) -> list[str]:
        at = f"%cache[%slot{j}, %layer, {part}, %g, %c0] : {mem}"
        return [f"{out}h = vector.load {at}, vector<{hd}x{dt}>", f"{out} = arith.extf {out}h : vector<{hd}x{dt}> to {vec}"]

    hs = [f"_h{i}" for i in range(per)]  # the suffix of each head's values
    prologue, scores, softmax, values, stores = [], [], [], [], []
    for i, s in enumerate(hs):
        stores += [
            f"%inv{s} = arith.divf %one, %res#{3 * i + 1} : f32",
            f"%invv{s} = vector.broadcast %inv{s} : f32 to {vec}",
            f"%out{s} = arith.mulf %res#{3 * i + 2}, %invv{s} : {vec}",
            f"vector.store %out{s}, %y[%t, %qoff{s}] : memref<?x{hhd}xf32>, {vec}",
        ]
        prologue += [
            f"%h{s} = arith.addi %h0, %c{i}g : index",
            f"%qoff{s} = arith.muli %h{s}, %c{hd}d : index",
            f"%q0{s} = vector.load %q[%t, %qoff{s}] : memref<?x{hhd}xf32>, {vec}",
            f"%qs{s} = arith.mulf %q0{s}, %scv : {vec}",
            *(_chunks(f"%qs{s}", f"%qc{s}_", hd, chunks) if chunks else []),
            f"%pn{s} = arith.mulf %qs{s}, %knv : {vec}",
            f"%snew{s} = vector.reduction <add>, %pn{s} fastmath<reassoc> : {vec} into f32",
        ]
    warm = _warm(mem, hd, dt)
    consts = [f"%c{i}g = arith.constant {i} : index" for i in range(per)]
    lines = [f"%e{e} = arith.constant {e} : index" for e in _line_offsets(hd, dt)]  # used by the prefetches
    prologue = [*consts, *lines, f"%c{hd}d = arith.constant {hd} : index", *prologue]
    keys = [f"%c{j}x = arith.constant {j} : index" for j in range(8)]
    for j in range(8):
        keys += [
            f"%sp{j}u = arith.addi %s0, %c{j}x : index",
            f"%sp{j} = arith.minui %sp{j}u, %slast : index",
            f"%slot{j}i = memref.load %ctx[%t, %sp{j}] : memref<?x?xi32>",
            f"%slot{j} = arith.index_cast %slot{j}i : i32 to index",
            *load(f"%k{j}", "%c0", j),
            *(_chunks(f"%k{j}", f"%kc{j}_", hd, chunks) if chunks else []),
        ]
        values += load(f"%v{j}", "%c1", j)
    keys += _prefetch(mem, hd, dt)
    for s in hs:
        for j in range(8):
            scores += _partial_dot(j, hd, chunks, s) if chunks else [
                f"%pk{j}{s} = arith.mulf %qs{s}, %k{j} : {vec}",
                f"%d{j}{s} = vector.reduction <add>, %pk{j}{s} fastmath<reassoc> : {vec} into f32",
            ]  # fmt: skip
        scores += _sum_tree(s) if chunks else [
            f"%sc{s} = vector.from_elements {', '.join(f'%d{j}{s}' for j in range(8))} : vector<8xf32>"
        ]  # fmt: skip
        softmax += [
            f"%scm{s} = arith.select %ok, %sc{s}, %ninf : vector<8xi1>, vector<8xf32>",
            f"%bm{s} = vector.reduction <maximumf>, %scm{s} : vector<8xf32> into f32",
            f"%mn{s} = arith.maximumf %m{s}, %bm{s} : f32",
            f"%dm{s} = arith.subf %m{s}, %mn{s} : f32",
            f"%corr{s} = math.exp %dm{s} : f32",
            f"%mnv{s} = vector.broadcast %mn{s} : f32 to vector<8xf32>",
            f"%e{s} = arith.subf %scm{s}, %mnv{s} : vector<8xf32>",
            f"%p{s} = math.exp %e{s} : vector<8xf32>",
            f"%psum{s} = vector.reduction <add>, %p{s} fastmath<reassoc> : vector<8xf32> into f32",
            f"%l2{s} = math.fma %l{s}, %corr{s}, %psum{s} : f32",
            f"%corrv{s} = vector.broadcast %corr{s} : f32 to {vec}",
            f"%a0{s} = arith.mulf %acc{s}, %corrv{s} : {vec}",
        ]
        for j in range(8):
            values += [
                f"%p{j}{s} = vector.extract %p{s}[{j}] : f32 from vector<8xf32>",
                f"%pv{j}{s} = vector.broadcast %p{j}{s} : f32 to {vec}",
                f"%a{j + 1}{s} = math.fma %pv{j}{s}, %v{j}, %a{j}{s} : {vec}",
            ]
    executable = template("attention_decode.mlir").substitute(
        NAME=name, NWG=str(heads // per), PER=str(per), G=str(group), HD=str(hd), HHD=str(hhd),
        HKV=str(heads_kv), L=str(hp.block_count), SCALE=f32_const(scale), WINDOW=str(win), DT=dt,
        NRES=str(3 * per),
        ITER_INIT=", ".join(f"%m{s} = %snew{s}, %l{s} = %one, %acc{s} = %vnv" for s in hs),
        ITER_TYPES=", ".join(f"f32, f32, {vec}" for _ in hs),
        YIELD=", ".join(f"%mn{s}, %l2{s}, %a8{s}" for s in hs),
        HEADS=_indent(prologue, 6), WARM=_indent(warm, 8), KEYS=_indent(keys, 8), SCORES=_indent(scores, 8),
        SOFTMAX=_indent(softmax, 8), VALUES=_indent(values, 8), STORES=_indent(stores, 6),
    )  # fmt: skip
    return executable + _dispatcher(name, hp, t, dt)


def heads_per_workgroup(group: int, hd: int) -> int:
    """Query heads per workgroup: the most of a KV head's `group` (a divisor of it) whose q and
    running sums stay in registers (`REGISTER_LANES` f32 lanes of each). Gemma 3 (4 heads of 256
    over one KV head) with all 4 in one workgroup spilled and had one workgroup per row: its
    4-row step at 1,000 positions went from 7.9 to 9.2 ms (with 2 per workgroup its 8-row step
    from 12.1 to 15.0)."""
    return max(p for p in range(1, group + 1) if group % p == 0 and (p == 1 or p * hd <= REGISTER_LANES))


def _prefetch(mem: str, hd: int, dt: str) -> list[str]:
    """`memref.prefetch` of every 64-byte line of the K and V rows `AHEAD` positions past each of
    the block's 8 (their slots read from ctx, the position clamped to its last column; a prefetch
    never faults). The rows sit a slot apart (every layer's K/V in between), so no hardware
    prefetcher finds them, and after the weights have gone through the caches each one is a
    miss."""
    lines = [f"%cpa = arith.constant {AHEAD} : index"]
    for j in range(8):
        lines += [f"%pa{j}u = arith.addi %sp{j}u, %cpa : index", *_prefetch_position(f"%pa{j}u", f"p{j}", mem, hd, dt)]
    return lines


def _warm(mem: str, hd: int, dt: str) -> list[str]:
    """Before the loop: the prefetches of its first `AHEAD` positions (from `%lb`, the first block
    inside the window), which no block fetches ahead."""
    lines = []
    for j in range(AHEAD):
        lines += [
            f"%w{j}c = arith.constant {j} : index",
            f"%w{j}u = arith.addi %lb, %w{j}c : index",
            *_prefetch_position(f"%w{j}u", f"w{j}", mem, hd, dt),
        ]
    return lines


def _prefetch_position(pos: str, tag: str, mem: str, hd: int, dt: str) -> list[str]:
    """Prefetches of the K and V row at position `pos` (clamped to ctx's last column)."""
    return [
        f"%{tag}p = arith.minui {pos}, %slast : index",
        f"%{tag}si = memref.load %ctx[%t, %{tag}p] : memref<?x?xi32>",
        f"%{tag}s = arith.index_cast %{tag}si : i32 to index",
        *(f"memref.prefetch %cache[%{tag}s, %layer, {part}, %g, %e{e}], read, locality<3>, data : {mem}"
          for part in ("%c0", "%c1") for e in _line_offsets(hd, dt)),
    ]  # fmt: skip


def _line_offsets(hd: int, dt: str) -> range:
    """The element offsets of a K or V row's 64-byte lines."""
    return range(0, hd, 64 // (2 if dt == "f16" else 4))


def _indent(lines: list[str], n: int) -> str:
    return "\n".join(" " * n + ln for ln in lines)


def _dispatcher(name: str, hp: HParams, t: str, dt: str) -> str:
    """The private func that casts a static batch to the dispatch's dynamic types and dispatches
    one workgroup per row and KV head."""
    heads_kv, hd, hhd = hp.head_count_kv, hp.key_length, hp.head_count * hp.key_length
    slab = f"tensor<?x{hp.block_count}x2x{heads_kv}x{hd}x{dt}>"
    rows = f"tensor<{t}x{heads_kv}x{hd}xf32>"
    dyn = {f"tensor<{t}x{hhd}xf32>": f"tensor<?x{hhd}xf32>", f"tensor<{t}x?xi32>": "tensor<?x?xi32>",
           rows: f"tensor<?x{heads_kv}x{hd}xf32>", f"tensor<{t}xi32>": "tensor<?xi32>"}  # fmt: skip
    lines = [
        f"func.func private @{name}(%q: tensor<{t}x{hhd}xf32>, %cache: {slab}, %ctx: tensor<{t}x?xi32>, "
        f"%layer: index, %kn: {rows}, %vn: {rows}, %len: tensor<{t}xi32>) -> tensor<{t}x{hhd}xf32> {{",
        "  %c0 = arith.constant 0 : index",
        "  %c1 = arith.constant 1 : index",
        f"  %T = tensor.dim %q, %c0 : tensor<{t}x{hhd}xf32>",
        f"  %NS = tensor.dim %cache, %c0 : {slab}",
        f"  %S = tensor.dim %ctx, %c1 : tensor<{t}x?xi32>",
    ]
    operands = []
    for arg, ty in (("q", f"tensor<{t}x{hhd}xf32>"), ("ctx", f"tensor<{t}x?xi32>"), ("kn", rows), ("vn", rows),
                    ("len", f"tensor<{t}xi32>")):  # fmt: skip
        if t == "?":  # already the dispatch's dynamic type
            operands.append(f"%{arg}")
            continue
        lines.append(f"  %{arg}_d = tensor.cast %{arg} : {ty} to {dyn[ty]}")
        operands.append(f"%{arg}_d")
    q_d, ctx_d, kn_d, vn_d, len_d = operands
    lines += [
        f"  %y = flow.dispatch @{name}_ex::@{name}[%T]({q_d}, %cache, {ctx_d}, {kn_d}, {vn_d}, {len_d}, %T, %NS, %S, "
        f"%layer) : (tensor<?x{hhd}xf32>{{%T}}, {slab}{{%NS}}, tensor<?x?xi32>{{%T, %S}}, "
        f"tensor<?x{heads_kv}x{hd}xf32>{{%T}}, tensor<?x{heads_kv}x{hd}xf32>{{%T}}, tensor<?xi32>{{%T}}, "
        f"index, index, index, index) -> tensor<?x{hhd}xf32>{{%T}}",
        *([f"  %yc = tensor.cast %y : tensor<?x{hhd}xf32> to tensor<{t}x{hhd}xf32>"] if t != "?" else []),
        f"  return {'%yc' if t != '?' else '%y'} : tensor<{t}x{hhd}xf32>",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _partial_dot(j: int, hd: int, chunks: int, s: str) -> list[str]:
    """Lines for `%d{j}{s}`: head s's q . k_j as LANES partial sums (one per lane, the head's chunks
    of LANES multiplied and added lane by lane), left for `_sum_tree` to finish."""
    names = [f"%d{j}{s}_{i}" for i in range(chunks - 1)] + [f"%d{j}{s}"]
    lines = [f"{names[0]} = arith.mulf %qc{s}_0, %kc{j}_0 : vector<{LANES}xf32>"]
    lines += [f"{names[i]} = math.fma %qc{s}_{i}, %kc{j}_{i}, {names[i - 1]} : vector<{LANES}xf32>" for i in range(1, chunks)]
    return lines


def _chunks(value: str, out: str, hd: int, chunks: int) -> list[str]:
    """Lines splitting `value` (vector<hd x f32>) into `chunks` vectors of LANES: `out`0, `out`1, ..."""
    rows = f"vector<{chunks}x{LANES}xf32>"
    return [f"{out}s = vector.shape_cast {value} : vector<{hd}xf32> to {rows}"] + [
        f"{out}{i} = vector.extract {out}s[{i}] : vector<{LANES}xf32> from {rows}" for i in range(chunks)
    ]


def _sum_tree(s: str) -> list[str]:
    """Lines reducing head s's 8 positions' partial sums %d0{s}..%d7{s} (LANES lanes each) to
    `%sc{s}`, their 8 scores, by halving: each level adds the two halves of every sum's lanes, two
    sums per vector (3 shuffles and adds per pair instead of a horizontal reduction per position)."""
    v, lines = f"vector<{LANES}xf32>", []
    level = [f"%d{j}{s}" for j in range(8)]
    width = LANES  # lanes per sum in the inputs of this level
    n = 0
    while len(level) > 1:
        half, nxt = width // 2, []
        for a, b in zip(level[::2], level[1::2], strict=True):
            per = LANES // width  # sums per input vector
            lo = [base + k * width + i for base in (0, LANES) for k in range(per) for i in range(half)]
            hi = [x + half for x in lo]
            out = f"%st{n}{s}"
            lines += [
                f"{out}l = vector.shuffle {a}, {b} {lo} : {v}, {v}",
                f"{out}h = vector.shuffle {a}, {b} {hi} : {v}, {v}",
                f"{out} = arith.addf {out}l, {out}h : {v}",
            ]
            nxt.append(out)
            n += 1
        level, width = nxt, half
    # one vector of 8 sums, `width` (2) lanes each, side by side
    even = list(range(0, LANES, 2))
    return [
        *lines,
        f"%ste{s} = vector.shuffle {level[0]}, {level[0]} {even} : {v}, {v}",
        f"%sto{s} = vector.shuffle {level[0]}, {level[0]} {[x + 1 for x in even]} : {v}, {v}",
        f"%sc{s} = arith.addf %ste{s}, %sto{s} : vector<8xf32>",
    ]
