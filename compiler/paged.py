"""The paged KV cache in MLIR: gathering a sequence's cached rows by slot, decode attention over
the slab (a hand-written online-softmax dispatch on the CPU, mlir/attention_decode.mlir; linalg on
Vulkan, mlir/attention_batch.mlir), per-row argmax and the slot-indexed cache writer.

Owns: the ops over the slot-major slab `[NS, L, 2, Hkv, hd]` (a slot holds one position's K and V
for every layer; which slots a sequence owns is the runtime's page table, the kernels only see
slot indices), and `kv_write`, the entry point that scatters a step's new rows into their slots.
The slab holds f16 on the CPU (half the bytes for attention to read, as llama.cpp's default
cache) and f32 on Vulkan (f16 there needs 16-bit storage buffers, not tried); the math is f32,
and a step's own new rows are rounded to the slab's type before its attention reads them, so a
position's K/V is the same number in the step that computes it and in every later one.
Imports: zinc.compiler.emitter, zinc.compiler.kernels, zinc.model.hparams.
"""

from __future__ import annotations

from zinc.compiler.emitter import NO_WINDOW, Body, _sym, f32_const
from zinc.compiler.kernels import t_dims, template
from zinc.model.hparams import HParams

LANES = 16  # f32 lanes of the partial dot products in decode attention (one 512-bit vector)


def slab_type(hp: HParams, dt: str = "f32") -> str:
    return f"tensor<?x{hp.block_count}x2x{hp.head_count_kv}x{hp.key_length}x{dt}>"


def rows_type(hp: HParams, t: str, dt: str = "f32") -> str:
    """A step's new K/V rows [T, L, 2, Hkv, hd]."""
    return f"tensor<{t}x{hp.block_count}x2x{hp.head_count_kv}x{hp.key_length}x{dt}>"


def to_slab(b: Body, value: str, t: str, nkv: int, hd: int) -> tuple[str, str]:
    """New K or V rows [t, nkv, hd] in f32 -> (the rows in the slab's type, the same rows back in
    f32: what every later step will read). Both are `value` itself when the slab is f32."""
    dt = b.mod.kv_dtype
    if dt == "f32":
        return value, value
    f32, low = f"tensor<{t}x{nkv}x{hd}xf32>", f"tensor<{t}x{nkv}x{hd}x{dt}>"
    dyn = "%T" if t == "?" else ""
    e16, e32, out = b.fresh("e_low"), b.fresh("e_f32"), b.fresh("kv_low")
    b.emit(f"{e16} = tensor.empty({dyn}) : {low}")
    b.emit(f"{e32} = tensor.empty({dyn}) : {f32}")
    ident = "affine_map<(t, h, d) -> (t, h, d)>"
    b.emit(
        f"{out}:2 = linalg.generic {{indexing_maps = [{ident}, {ident}, {ident}], "
        f'iterator_types = ["parallel", "parallel", "parallel"]}} ins({value} : {f32}) '
        f"outs({e16}, {e32} : {low}, {f32}) {{"
    )
    b.emit(f"  ^bb0(%x: f32, %o: {dt}, %o2: f32):")
    b.emit(f"    %l = arith.truncf %x : f32 to {dt}")
    b.emit(f"    %w = arith.extf %l : {dt} to f32")
    b.emit(f"    linalg.yield %l, %w : {dt}, f32")
    b.emit(f"}} -> ({low}, {f32})")
    return f"{out}#0", f"{out}#1"


def gather_kv(b: Body, hp: HParams, ctx: str, layer: int, part: int) -> str:
    """Layer `layer`'s K (`part` 0) or V (1) of one sequence at the slots `ctx` [S] -> [S, Hkv, hd], f32."""
    nl, nkv, hd, dt = hp.block_count, hp.head_count_kv, hp.key_length, b.mod.kv_dtype
    name = f"gather_kv_{nl}x{nkv}x{hd}{dt}"
    out = "%f = arith.extf %v : f16 to f32\n      linalg.yield %f : f32" if dt == "f16" else "linalg.yield %v : f32"
    b.mod.helper(name, template("gather_kv.mlir").substitute(
        NAME=name, L=str(nl), HKV=str(nkv), HD=str(hd), DT=dt, YIELD=out
    ))  # fmt: skip
    consts = []
    for value in (layer, part):
        c = b.fresh("c")
        b.emit(f"{c} = arith.constant {value} : index")
        consts.append((c, "index"))
    args = [("%cache", slab_type(hp, dt)), (ctx, "tensor<?xi32>"), *consts]
    return b.call(name, args, f"tensor<?x{nkv}x{hd}xf32>", "kv_old")


def context_kv(
    b: Body, hp: HParams, ctx: str, layer: int, part: int, new: str, start: str = "%start", t: str = "%T"
) -> str:
    """Layer `layer`'s K (`part` 0) or V (1) of one sequence by position, [S, Hkv, hd]: the rows
    before `start` gathered from the slab at the slots `ctx` [S], this step's `t` rows `new`
    [t, Hkv, hd] at `start`.. (ctx's entries from `start` on point at scratch slot 0 and are
    overwritten or unseen), so a prefill's attention reads every position in one order however
    it was cached."""
    nkv, hd = hp.head_count_kv, hp.key_length
    rows = f"tensor<?x{nkv}x{hd}xf32>"
    out = b.fresh("kv_ctx")
    b.emit(
        f"{out} = tensor.insert_slice {new} into {gather_kv(b, hp, ctx, layer, part)}[{start}, 0, 0] "
        f"[{t}, {nkv}, {hd}] [1, 1, 1] : {rows} into {rows}"
    )
    return out


def attention_batch(
    b: Body, hp: HParams, layer: int, q: str, kv_new: tuple[str, str], lens: str, scale: float, window: int
) -> str:
    """One new token per row, each row its own sequence with `lens[t]` cached rows, read from the
    slab through its slots `%ctx` inside the attention itself (on the CPU the hand-written dispatch
    mlir/attention_decode.mlir, on Vulkan the linalg form mlir/attention_batch.mlir)."""
    heads, heads_kv, head_dim = hp.head_count, hp.head_count_kv, hp.key_length
    win = window or NO_WINDOW
    if b.mod.tiled:  # the CPU: the hand-written online-softmax dispatch
        name = (
            f"attention_decode_w{win}_s{_sym(scale)}_{b.t_tag}_{hp.block_count}x{heads}x{heads_kv}x{head_dim}"
            f"{b.mod.kv_dtype}"
        )
        b.mod.helper(name, _render_decode_attention(name, hp, b.t, scale, win, b.mod.kv_dtype))
    else:
        name = f"attention_batch_w{win}_s{_sym(scale)}_{b.t_tag}_{heads}x{heads_kv}x{head_dim}"
        b.mod.helper(name, _render_batch_attention(name, hp, b, scale, win))
    new = f"tensor<{b.t}x{heads_kv}x{head_dim}xf32>"
    hhd = b.act(heads * head_dim)
    c = b.fresh("layer")
    b.emit(f"{c} = arith.constant {layer} : index")
    args = [(q, hhd), ("%cache", slab_type(hp, b.mod.kv_dtype)), ("%ctx", f"tensor<{b.t}x?xi32>"), (c, "index"),
            (kv_new[0], new), (kv_new[1], new), (lens, f"tensor<{b.t}xi32>")]  # fmt: skip
    return b.call(name, args, hhd, "attn")


def _render_batch_attention(name: str, hp: HParams, b: Body, scale: float, win: int) -> str:
    """The linalg form (mlir/attention_batch.mlir), for Vulkan."""
    heads, heads_kv, head_dim = hp.head_count, hp.head_count_kv, hp.key_length
    subs = {
        "NAME": name, "HHD": str(heads * head_dim), "HKV": str(heads_kv), "G": str(heads // heads_kv),
        "HD": str(head_dim), "SCALE": f32_const(scale), "WINDOW": str(win), "L": str(hp.block_count),
        "DYN_S": "%T, %S" if b.dynamic else "%S", **t_dims(b.dynamic),
    }  # fmt: skip
    return template("attention_batch.mlir").substitute(subs)


def _render_decode_attention(name: str, hp: HParams, t: str, scale: float, win: int, dt: str) -> str:
    """mlir/attention_decode.mlir and the private func dispatching it, for rows `t` (1 or ?), over a
    slab of `dt` (f16 rows are widened to f32 as they are loaded)."""
    heads, heads_kv, hd = hp.head_count, hp.head_count_kv, hp.key_length
    hhd, slab = heads * hd, slab_type(hp, dt)
    mem = f"memref<?x{hp.block_count}x2x{heads_kv}x{hd}x{dt}>"

    def load(out: str, part: str, j: int) -> list[str]:
        at = f"%cache[%slot{j}, %layer, {part}, %g, %c0] : {mem}"
        if dt == "f32":
            return [f"{out} = vector.load {at}, vector<{hd}xf32>"]
        return [f"{out}h = vector.load {at}, vector<{hd}x{dt}>",
                f"{out} = arith.extf {out}h : vector<{hd}x{dt}> to vector<{hd}xf32>"]  # fmt: skip

    chunks = hd // LANES if hd % LANES == 0 else 0  # 16-lane pieces of a head, or 0: whole-head sums
    qchunks = _chunks("%qs", "%qc", hd, chunks) if chunks else []
    scores, values = [], []
    for j in range(8):
        scores += [
            f"%sp{j}u = arith.addi %s0, %c{j}x : index",
            f"%sp{j} = arith.minui %sp{j}u, %slast : index",
            f"%slot{j}i = memref.load %ctx[%t, %sp{j}] : memref<?x?xi32>",
            f"%slot{j} = arith.index_cast %slot{j}i : i32 to index",
            *load(f"%k{j}", "%c0", j),
            *(_partial_dot(j, hd, chunks) if chunks else [
                f"%pk{j} = arith.mulf %qs, %k{j} : vector<{hd}xf32>",
                f"%d{j} = vector.reduction <add>, %pk{j} fastmath<reassoc> : vector<{hd}xf32> into f32",
            ]),
        ]
        values += [
            *load(f"%v{j}", "%c1", j),
            f"%p{j} = vector.extract %p[{j}] : f32 from vector<8xf32>",
            f"%pv{j} = vector.broadcast %p{j} : f32 to vector<{hd}xf32>",
            f"%a{j + 1} = math.fma %pv{j}, %v{j}, %a{j} : vector<{hd}xf32>",
        ]
    scores += _sum_tree() if chunks else ["%sc = vector.from_elements %d0, %d1, %d2, %d3, %d4, %d5, %d6, %d7 : vector<8xf32>"]
    consts = [f"%c{j}x = arith.constant {j} : index" for j in range(8)]
    executable = template("attention_decode.mlir").substitute(
        NAME=name, H=str(heads), G=str(heads // heads_kv), HD=str(hd), HHD=str(hhd), HKV=str(heads_kv),
        L=str(hp.block_count), SCALE=f32_const(scale), WINDOW=str(win), DT=dt,
        QCHUNKS="\n".join("      " + ln for ln in qchunks),
        SCORES="\n".join("        " + ln for ln in [*consts, *scores]),
        VALUES="\n".join("        " + ln for ln in values),
    )  # fmt: skip
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
    return executable + "\n".join(lines) + "\n"


def _partial_dot(j: int, hd: int, chunks: int) -> list[str]:
    """Lines for `%d{j}`: q . k_j as LANES partial sums (one per lane, the head's chunks of LANES
    multiplied and added lane by lane), left for `_sum_tree` to finish."""
    lines = _chunks(f"%k{j}", f"%kc{j}_", hd, chunks)
    names = [f"%d{j}_{i}" for i in range(chunks - 1)] + [f"%d{j}"]
    lines.append(f"{names[0]} = arith.mulf %qc0, %kc{j}_0 : vector<{LANES}xf32>")
    lines += [f"{names[i]} = math.fma %qc{i}, %kc{j}_{i}, {names[i - 1]} : vector<{LANES}xf32>" for i in range(1, chunks)]
    return lines


def _chunks(value: str, out: str, hd: int, chunks: int) -> list[str]:
    """Lines splitting `value` (vector<hd x f32>) into `chunks` vectors of LANES: `out`0, `out`1, ..."""
    rows = f"vector<{chunks}x{LANES}xf32>"
    return [f"{out}s = vector.shape_cast {value} : vector<{hd}xf32> to {rows}"] + [
        f"{out}{i} = vector.extract {out}s[{i}] : vector<{LANES}xf32> from {rows}" for i in range(chunks)
    ]


def _sum_tree() -> list[str]:
    """Lines reducing the 8 positions' partial sums %d0..%d7 (LANES = 16 lanes each) to `%sc`, their 8
    scores, by halving: each level adds the two halves of every sum's lanes, two sums per vector
    (3 shuffles and adds per pair instead of a horizontal reduction per position)."""
    v, lines = f"vector<{LANES}xf32>", []
    level = [f"%d{j}" for j in range(8)]
    width = LANES  # lanes per sum in the inputs of this level
    n = 0
    while len(level) > 1:
        half, nxt = width // 2, []
        for a, b in zip(level[::2], level[1::2], strict=True):
            per = LANES // width  # sums per input vector
            lo = [base + s * width + i for base in (0, LANES) for s in range(per) for i in range(half)]
            hi = [x + half for x in lo]
            out = f"%st{n}"
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
        f"%ste = vector.shuffle {level[0]}, {level[0]} {even} : {v}, {v}",
        f"%sto = vector.shuffle {level[0]}, {level[0]} {[x + 1 for x in even]} : {v}, {v}",
        "%sc = arith.addf %ste, %sto : vector<8xf32>",
    ]


def argmax_rows(b: Body, logits: str, vocab: int) -> str:
    """The greedy token of every row of logits [T, V] (dynamic T)."""
    name = b.mod.helper(
        f"argmax_rows_{vocab}",
        template("argmax_rows.mlir").substitute(NAME=f"argmax_rows_{vocab}", V=str(vocab)),
    )
    return b.call(name, [(logits, f"tensor<?x{vocab}xf32>")], "tensor<?xi32>", "tokens")


def kv_write(hp: HParams, per_layer: bool = False, dt: str = "f32") -> str:
    """`kv_write(cache, rows [T, L, 2, Hkv, hd], slots [T] i32)`: the only writer of the slab, in
    place; row t goes to slot `slots[t]` (padding rows of a batch all go to scratch slot 0, so the
    indices need not be unique).

    It is a separate call because IREE 3.13 drops the in-place write-back of an
    `iree.abi.output` argument that the same function also reads (it updates a copy).
    `per_layer` (Vulkan) writes one scatter per layer, indexed by (slot, layer): IREE 3.13's
    SPIR-V scatter leaves elements past about 65,000 per dispatch unwritten (checked on lavapipe).
    `dt`: the slab's (and the rows') element type.
    """
    ct, rt = slab_type(hp, dt), rows_type(hp, "?", dt)
    lines = [
        f"func.func @kv_write(%cache: {ct}, %rows: {rt}, %slots: tensor<?xi32>) -> ({ct} {{iree.abi.output = 0 : index}}) {{",
        "  %c0 = arith.constant 0 : index",
        "  %T = tensor.dim %slots, %c0 : tensor<?xi32>",
    ]
    if not per_layer:
        lines += [
            "  %idx = tensor.expand_shape %slots [[0, 1]] output_shape [%T, 1] : tensor<?xi32> into tensor<?x1xi32>",
            *_scatter("%r", "%rows", rt, "%idx", "%cache", ct, "[0]", dt),
            f"  return %r : {ct}",
            "}",
        ]
        return "\n".join(lines)
    nl, nkv, hd = hp.block_count, hp.head_count_kv, hp.key_length
    lt = f"tensor<?x2x{nkv}x{hd}x{dt}>"
    acc = "%cache"
    for il in range(nl):
        lines += [
            f"  %ix{il} = tensor.empty(%T) : tensor<?x2xi32>",
            f"  %id{il} = linalg.generic {{indexing_maps = [affine_map<(t, c) -> (t)>, affine_map<(t, c) -> (t, c)>], "
            f'iterator_types = ["parallel", "parallel"]}} ins(%slots : tensor<?xi32>) outs(%ix{il} : tensor<?x2xi32>) {{',
            "    ^bb0(%s: i32, %o: i32):",
            "      %c = linalg.index 1 : index",
            "      %first = arith.cmpi eq, %c, %c0 : index",
            f"      %l = arith.constant {il} : i32",
            "      %v = arith.select %first, %s, %l : i32",
            "      linalg.yield %v : i32",
            "  } -> tensor<?x2xi32>",
            f"  %u{il} = tensor.extract_slice %rows[0, {il}, 0, 0, 0] [%T, 1, 2, {nkv}, {hd}] [1, 1, 1, 1, 1] : {rt} to {lt}",
            *_scatter(f"%w{il}", f"%u{il}", lt, f"%id{il}", acc, ct, "[0, 1]", dt),
        ]
        acc = f"%w{il}"
    return "\n".join([*lines, f"  return {acc} : {ct}", "}"])


def _scatter(out: str, updates: str, ut: str, idx: str, into: str, ct: str, dims: str, dt: str) -> list[str]:
    it = "tensor<?x1xi32>" if dims == "[0]" else "tensor<?x2xi32>"
    return [
        f"  {out} = iree_linalg_ext.scatter dimension_map = {dims} unique_indices(false)",
        f"      ins({updates}, {idx} : {ut}, {it}) outs({into} : {ct}) {{",
        f"    ^bb0(%u: {dt}, %o: {dt}):",
        f"      iree_linalg_ext.yield %u : {dt}",
        f"  }} -> {ct}",
    ]
