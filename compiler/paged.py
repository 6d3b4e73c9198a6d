"""The paged KV cache in MLIR: gathering a sequence's cached rows by slot, decode attention over
the slab (on the CPU the hand-written dispatch of zinc.compiler.attention_cpu; linalg on Vulkan,
mlir/attention_batch.mlir) and the slot-indexed cache writer.

Owns: the ops over the slot-major slab `[NS, L, 2, Hkv, hd]` (a slot holds one position's K and V
for every layer; which slots a sequence owns is the runtime's page table, the kernels only see
slot indices), and `kv_write`, the entry point that scatters a step's new rows into their slots.
The slab holds f16 values on every target (half the bytes for attention to read, as llama.cpp's
default cache): as f16 on the CPU, and on Vulkan as "f16x2", two halves to an i32 word
(`[NS, L, 2, Hkv, hd / 2] i32`, zinc.artifact.kv_storage), rounded and unpacked with integer ops
(zinc.compiler.bitops), because IREE 3.13's generic Vulkan target computes wrong values with f16
tensors (an f16 scatter wrote zeros). The math is f32, and a step's own new rows are rounded to
f16 before its attention reads them, so a position's K/V is the same number in the step that
computes it and in every later one.
Imports: zinc.artifact, zinc.compiler.attention_cpu, zinc.compiler.bitops, zinc.compiler.emitter,
zinc.compiler.kernels, zinc.model.hparams.
"""

from __future__ import annotations

import re

from zinc.artifact import kv_storage
from zinc.compiler.attention_cpu import render_decode_attention
from zinc.compiler.bitops import f16_bits_to_f32, f32_to_f16_bits
from zinc.compiler.emitter import NO_WINDOW, Body, _sym, f32_const
from zinc.compiler.kernels import sub_once, t_dims, template
from zinc.model.hparams import HParams


def row_width(hd: int, dt: str) -> int:
    """The last dimension of a K or V row of `hd` values in the slab of `dt` (f16x2: hd / 2 words)."""
    return kv_storage(dt, hd)[1]


def rows_of(t: str, nkv: int, hd: int, dt: str) -> str:
    """The type of K or V rows [t, nkv, hd] as the slab of `dt` stores them (f16x2: [t, nkv, hd / 2] i32)."""
    st, width = kv_storage(dt, hd)
    return f"tensor<{t}x{nkv}x{width}x{st}>"


def slab_type(hp: HParams, dt: str) -> str:
    """The KV slab [slots, L, 2, Hkv, hd] in the storage of KV type `dt` (zinc.artifact.kv_storage)."""
    st, width = kv_storage(dt, hp.key_length)
    return f"tensor<?x{hp.block_count}x2x{hp.head_count_kv}x{width}x{st}>"


def rows_type(hp: HParams, t: str, dt: str) -> str:
    """A step's new K/V rows [L, 2, T, Hkv, hd], layer-major: each layer's K (and V) rows of all
    T tokens are one contiguous block, so the step writes them where they are computed. Token-major
    ([T, L, 2, ...], the slab's order) made every layer's K and V of a decode batch or a prompt
    chunk a strided block, which IREE copies in by a one-workgroup `slow_memcpy` dispatch: two per
    layer, 60 a step for SmolLM2. In the slab's storage (f16x2: hd / 2 i32 words)."""
    st, width = kv_storage(dt, hp.key_length)
    return f"tensor<{hp.block_count}x2x{t}x{hp.head_count_kv}x{width}x{st}>"


def to_slab(b: Body, value: str, t: str, nkv: int, hd: int) -> tuple[str, str]:
    """New K or V rows [t, nkv, hd] in f32 -> (the rows as the slab stores them, `rows_of`; the
    same rows back in f32, rounded to f16: what every later step will read)."""
    dt = b.mod.kv_dtype
    if dt == "f16x2":
        return _to_f16x2(b, value, t, nkv, hd)
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


def _to_f16x2(b: Body, value: str, t: str, nkv: int, hd: int) -> tuple[str, str]:
    """`to_slab` for the f16x2 slab: the packed words [t, nkv, hd / 2] (values 2w and 2w + 1 read
    through an expand_shape to [t, nkv, hd / 2, 2]: word w = bits(2w) | bits(2w + 1) << 16) and,
    by a second elementwise op over the f32 rows, each value rounded to f16 and widened back."""
    f32, packed = f"tensor<{t}x{nkv}x{hd}xf32>", rows_of(t, nkv, hd, "f16x2")
    pairs = f"tensor<{t}x{nkv}x{hd // 2}x2xf32>"
    dyn = "%T" if t == "?" else ""
    x2, ep, words = b.fresh("kv_pairs"), b.fresh("e_words"), b.fresh("kv_words")
    b.emit(
        f"{x2} = tensor.expand_shape {value} [[0], [1], [2, 3]] output_shape [{dyn or t}, {nkv}, {hd // 2}, 2] "
        f": {f32} into {pairs}"
    )
    b.emit(f"{ep} = tensor.empty({dyn}) : {packed}")
    lo, hi = "affine_map<(t, h, w) -> (t, h, w, 0)>", "affine_map<(t, h, w) -> (t, h, w, 1)>"
    b.emit(
        f"{words} = linalg.generic {{indexing_maps = [{lo}, {hi}, affine_map<(t, h, w) -> (t, h, w)>], "
        f'iterator_types = ["parallel", "parallel", "parallel"]}} ins({x2}, {x2} : {pairs}, {pairs}) '
        f"outs({ep} : {packed}) {{"
    )
    b.emit("  ^bb0(%lo: f32, %hi: f32, %o: i32):")
    b.lines.append(f32_to_f16_bits("%lo", "%hl", "      "))
    b.lines.append(f32_to_f16_bits("%hi", "%hh", "      "))
    b.emit("    %c16 = arith.constant 16 : i32")
    b.emit("    %hs = arith.shli %hh, %c16 : i32")
    b.emit("    %w = arith.ori %hl, %hs : i32")
    b.emit("    linalg.yield %w : i32")
    b.emit(f"}} -> {packed}")
    e32, back = b.fresh("e_f32"), b.fresh("kv_back")
    ident = "affine_map<(t, h, d) -> (t, h, d)>"
    b.emit(f"{e32} = tensor.empty({dyn}) : {f32}")
    b.emit(
        f"{back} = linalg.generic {{indexing_maps = [{ident}, {ident}], "
        f'iterator_types = ["parallel", "parallel", "parallel"]}} ins({value} : {f32}) outs({e32} : {f32}) {{'
    )
    b.emit("  ^bb0(%x: f32, %o: f32):")
    b.lines.append(f32_to_f16_bits("%x", "%hx", "      "))
    b.lines.append(f16_bits_to_f32("%hx", "%w", "      ", specials=True))
    b.emit("    linalg.yield %w : f32")
    b.emit(f"}} -> {f32}")
    return words, back


def slab_read(dt: str, slab: str, index: list[str], raw: str, out: str) -> list[str]:
    """MLIR lines (unindented) loading element `index` (slot, layer, part, head, d: index values)
    of the slab `%cache` of type `slab` and KV type `dt` into `raw` and defining `out`, its value
    in f32: `raw` widened (f16), or (f16x2) word d // 2 shifted right by 16 (d % 2), its low 16
    bits decoded by bitops.f16_bits_to_f32."""
    *lead, d = index
    if dt == "f16":
        return [f"{raw} = tensor.extract %cache[{', '.join(index)}] : {slab}", f"{out} = arith.extf {raw} : f16 to f32"]
    if dt != "f16x2":
        raise AssertionError(f"KV cache type {dt!r}")
    p = out.lstrip("%") + "_pk"
    lines = [
        f"%{p}_c1 = arith.constant 1 : index",
        f"%{p}_dw = arith.shrui {d}, %{p}_c1 : index",
        f"{raw} = tensor.extract %cache[{', '.join(lead)}, %{p}_dw] : {slab}",
        f"%{p}_di = arith.index_cast {d} : index to i32",
        f"%{p}_one = arith.constant 1 : i32",
        f"%{p}_odd = arith.andi %{p}_di, %{p}_one : i32",
        f"%{p}_c4 = arith.constant 4 : i32",
        f"%{p}_sh = arith.shli %{p}_odd, %{p}_c4 : i32",
        f"%{p}_hs = arith.shrui {raw}, %{p}_sh : i32",
        f"%{p}_m16 = arith.constant 65535 : i32",
        f"%{p}_h = arith.andi %{p}_hs, %{p}_m16 : i32",
    ]
    return lines + f16_bits_to_f32(f"%{p}_h", out, "", specials=True).split("\n")


def gather_kv(b: Body, hp: HParams, ctx: str, layer: int, part: int) -> str:
    """Layer `layer`'s K (`part` 0) or V (1) of one sequence at the slots `ctx` [S] -> [S, Hkv, hd], f32."""
    nl, nkv, hd, dt = hp.block_count, hp.head_count_kv, hp.key_length, b.mod.kv_dtype
    name = f"gather_kv_{nl}x{nkv}x{hd}{dt}"
    slab = slab_type(hp, dt)
    lines = slab_read(dt, slab, ["%si", "%layer", "%part", "%h", "%d"], "%v", "%f")
    b.mod.helper(name, template("gather_kv.mlir").substitute(
        NAME=name, HKV=str(nkv), HD=str(hd), SLAB=slab, LOAD="\n      ".join([*lines, "linalg.yield %f : f32"])
    ))  # fmt: skip
    consts = [(b.opaque_index(value, hint), "index") for value, hint in ((layer, "layer"), (part, "part"))]
    args = [("%cache", slab), (ctx, "tensor<?xi32>"), *consts]
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
        b.mod.helper(name, render_decode_attention(name, hp, b.t, scale, win, b.mod.kv_dtype))
    else:
        name = f"attention_batch_w{win}_s{_sym(scale)}_{b.t_tag}_{heads}x{heads_kv}x{head_dim}"
        b.mod.helper(name, _render_batch_attention(name, hp, b, scale, win))
    new = f"tensor<{b.t}x{heads_kv}x{head_dim}xf32>"
    hhd = b.act(heads * head_dim)
    c = b.opaque_index(layer, "layer")
    args = [(q, hhd), ("%cache", slab_type(hp, b.mod.kv_dtype)), ("%ctx", f"tensor<{b.t}x?xi32>"), (c, "index"),
            (kv_new[0], new), (kv_new[1], new), (lens, f"tensor<{b.t}xi32>")]  # fmt: skip
    return b.call(name, args, hhd, "attn")


def _render_batch_attention(name: str, hp: HParams, b: Body, scale: float, win: int) -> str:
    """The linalg form (mlir/attention_batch.mlir), for Vulkan."""
    heads, heads_kv, head_dim, dt = hp.head_count, hp.head_count_kv, hp.key_length, b.mod.kv_dtype
    slab = slab_type(hp, dt)
    reads = {}  # each defines the f32 value %b
    for key, part in (("READ_K", "%part_k"), ("READ_V", "%part_v")):
        lines = slab_read(dt, slab, ["%si", "%layer", part, "%gi", "%di"], "%bw", "%b")
        reads[key] = "\n      ".join(lines)
    subs = {
        "NAME": name, "HHD": str(heads * head_dim), "HKV": str(heads_kv), "G": str(heads // heads_kv),
        "HD": str(head_dim), "SCALE": f32_const(scale), "WINDOW": str(win), "SLAB": slab, **reads,
        "DYN_S": "%T, %S" if b.dynamic else "%S", **t_dims(b.dynamic),
    }  # fmt: skip
    text = template("attention_batch.mlir").substitute(subs)
    return _slab_index_inputs(text, heads_kv, head_dim) if b.mod.index_inputs else text


def _slab_index_inputs(text: str, heads_kv: int, head_dim: int) -> str:
    """attention_batch.mlir with the (g, d) loop indices of its two slab reads taken from i32 iota
    inputs, not linalg.index: on GPU targets with subgroups IREE keeps them in workgroup memory as
    `index`, which SPIR-V cannot store (zinc.compiler.targets.index_inputs); the generic target
    keeps linalg.index."""
    iotas = (
        f"  %iota_g = arith.constant dense<[{', '.join(map(str, range(heads_kv)))}]> : tensor<{heads_kv}xi32>\n"
        f"  %iota_d = arith.constant dense<[{', '.join(map(str, range(head_dim)))}]> : tensor<{head_dim}xi32>\n"
    )
    zero = "  %z = arith.constant 0.0 : f32\n"
    text = sub_once(re.escape(zero), zero + iotas, text)
    extra = f"tensor<{heads_kv}xi32>, tensor<{head_dim}xi32>"
    for dims, ins, acc, d in (("t, g, r, s, d", "%qg", "%o", 4), ("t, g, r, d, s", "%po", "%acc", 3)):
        ctx_map = f"affine_map<({dims}) -> (t, s)>, "
        text = sub_once(re.escape(ctx_map), f"{ctx_map}affine_map<({dims}) -> (g)>, affine_map<({dims}) -> (d)>, ", text)
        found = re.search(rf"ins\({ins}, %ctx : (tensor<[^>]*>), (tensor<[^>]*>)\)", text)
        if found is None:
            raise AssertionError(f"attention_batch.mlir: no slab read over {ins}")
        text = sub_once(
            re.escape(found.group(0)),
            f"ins({ins}, %ctx, %iota_g, %iota_d : {found.group(1)}, {found.group(2)}, {extra})",
            text,
        )
        text = sub_once(
            rf"\^bb0\(%a: f32, %slot: i32, {acc}: f32\):\n      %gi = linalg\.index 1 : index\n"
            rf"      %di = linalg\.index {d} : index",
            f"^bb0(%a: f32, %slot: i32, %gv: i32, %dv: i32, {acc}: f32):\n"
            "      %gi = arith.index_cast %gv : i32 to index\n      %di = arith.index_cast %dv : i32 to index",
            text,
        )
    return text


def kv_write(hp: HParams, parallel: bool, dt: str) -> str:
    """`kv_write(cache, rows [L, 2, T, Hkv, hd], slots [T] i32)`: the only writer of the slab, in
    place; token t's rows go to slot `slots[t]` (padding rows of a batch all go to scratch slot 0,
    so the indices need not be unique). One scatter of [Hkv, hd] pieces indexed by (slot, layer,
    K|V), whatever T.

    It is a separate call because IREE 3.13 drops the in-place write-back of an
    `iree.abi.output` argument that the same function also reads (it updates a copy).
    `parallel` (Vulkan) declares the indices unique, so that IREE spreads the scatter over
    workgroups. Otherwise IREE 3.13 runs it, on every Vulkan target, as one invocation that loops
    over every element, and lavapipe ends a shader's loops after 65,535 iterations in all
    (llvmpipe's LP_MAX_TGSI_LOOP_ITERATIONS): the elements past 62,597 (SmolLM2's K/V width) to
    65,024 (Gemma 3's) stayed unwritten, even within a 63-token prefill call of Llama 3.2 1B (on
    a GPU one thread writes them all, one after another). Only padding rows share an index,
    scratch slot 0, whose contents nothing reads: which of their writes lands there does not matter.
    Smaller scatters in a loop over chunks of rows (scf.for) are no way out: IREE gives each
    iteration a new copy of the whole slab, and the write-back to `cache` is lost.
    `dt`: the slab's (and the rows') KV type (f16x2: the pieces are [Hkv, hd / 2] i32 words).
    """
    nl, nkv, hd = hp.block_count, hp.head_count_kv, hp.key_length
    ct, rt = slab_type(hp, dt), rows_type(hp, "?", dt)
    piece = rows_of("?", nkv, hd, dt)
    return "\n".join([
        f"func.func @kv_write(%cache: {ct}, %rows: {rt}, %slots: tensor<?xi32>) -> ({ct} {{iree.abi.output = 0 : index}}) {{",
        "  %c0 = arith.constant 0 : index",
        "  %T = tensor.dim %slots, %c0 : tensor<?xi32>",
        *_indices("%idx", nl, 0),
        f"  %pieces = tensor.collapse_shape %rows [[0, 1, 2], [3], [4]] : {rt} into {piece}",
        *_scatter("%r", "%pieces", piece, "%idx", "%cache", ct, kv_storage(dt, hd)[0], parallel),
        f"  return %r : {ct}",
        "}",
    ])  # fmt: skip


def _indices(out: str, layers: int, first: int) -> list[str]:
    """The scatter indices of `layers` layers' rows from layer `first` on, [layers * 2 * T, 3]: row
    (l, part, t) goes to (slots[t], first + l, part)."""
    e, g, it = f"{out}_e", f"{out}_g", f"tensor<{layers}x2x?x3xi32>"
    return [
        f"  {e} = tensor.empty(%T) : {it}",
        f"  {g} = linalg.generic {{indexing_maps = [affine_map<(l, p, t, c) -> (t)>, affine_map<(l, p, t, c) -> (l, p, t, c)>], "
        'iterator_types = ["parallel", "parallel", "parallel", "parallel"]} '
        f"ins(%slots : tensor<?xi32>) outs({e} : {it}) {{",
        "    ^bb0(%s: i32, %o: i32):",
        "      %il = linalg.index 0 : index",
        "      %ip = linalg.index 1 : index",
        "      %ic = linalg.index 3 : index",
        f"      %ibase = arith.constant {first} : index",
        "      %ione = arith.constant 1 : index",
        "      %izero = arith.constant 0 : index",
        "      %ilayer = arith.addi %il, %ibase : index",
        "      %isel = arith.cmpi eq, %ic, %ione : index",
        "      %ilp = arith.select %isel, %ilayer, %ip : index",
        "      %ilpi = arith.index_cast %ilp : index to i32",
        "      %islot = arith.cmpi eq, %ic, %izero : index",
        "      %v = arith.select %islot, %s, %ilpi : i32",
        "      linalg.yield %v : i32",
        f"  }} -> {it}",
        f"  {out} = tensor.collapse_shape {g} [[0, 1, 2], [3]] : {it} into tensor<?x3xi32>",
    ]


def _scatter(out: str, updates: str, ut: str, idx: str, into: str, ct: str, dt: str, unique: bool) -> list[str]:
    return [
        f"  {out} = iree_linalg_ext.scatter dimension_map = [0, 1, 2] unique_indices({str(unique).lower()})",
        f"      ins({updates}, {idx} : {ut}, tensor<?x3xi32>) outs({into} : {ct}) {{",
        f"    ^bb0(%u: {dt}, %o: {dt}):",
        f"      iree_linalg_ext.yield %u : {dt}",
        f"  }} -> {ct}",
    ]
