"""The graph of the `llama` architecture as MLIR: `prefill` and `decode` entry points.

Owns: `build_module(desc, module_name)`, which lays out, per layer, the same steps as llama.cpp's
llama graph (names follow GGUF tensors): attn_norm -> q/k/v -> RoPE -> KV cache write -> causal
GQA attention -> attn_output -> residual -> ffn_norm -> SwiGLU(ffn_gate, ffn_up) -> ffn_down ->
residual; then output_norm on the last position, logits and the greedy token.

Entry points (the artifact contract, see zinc/artifact.py):
  prefill(cache [L,2,S,Hkv,hd] f32, ids [T] i32, start index) -> (rows [L,2,T,Hkv,hd], logits [1,V], token [1] i32)
  decode (cache,                    ids [1] i32, pos index)   -> (rows [L,2,1,Hkv,hd], logits [1,V], token [1] i32)
  kv_write(cache, rows, start) -> cache   (in place, `iree.abi.output = 0`)
The step functions only read the cache; the caller owns the slab on the device and calls
kv_write with the step's new K/V rows.
Imports: zinc.compiler.emitter, zinc.compiler.kernels, zinc.model.hparams.
"""

from __future__ import annotations

from zinc.compiler.emitter import Body, ModuleEmitter
from zinc.compiler.kernels import QuantType, quant_type
from zinc.model.hparams import ModelDescription

ENTRY_POINTS = ("prefill", "decode", "kv_write")


def cache_type(desc: ModelDescription) -> str:
    hp = desc.hparams
    return f"tensor<{hp.block_count}x2x?x{hp.head_count_kv}x{hp.key_length}xf32>"


def build_module(desc: ModelDescription, module_name: str = "zinc_model") -> str:
    return emit_module(desc).text(module_name)


def emit_module(desc: ModelDescription, tiled: bool = False) -> ModuleEmitter:
    """The module for `desc`; `tiled` binds the supported matmul weights as repacked planes (CPU)."""
    mod = ModuleEmitter(tiled=tiled)
    for entry in ("prefill", "decode"):
        mod.entries.append(_entry(mod, desc, entry, dynamic=entry == "prefill"))
    mod.entries.append(_kv_write(desc))
    return mod


def _kv_write(desc: ModelDescription) -> str:
    """`kv_write(cache, rows [L,2,T,Hkv,hd], start)`: the only writer of the slab, in place.

    It is a separate call because IREE 3.13 drops the in-place write-back of an
    `iree.abi.output` argument that the same function also reads (it updates a copy).
    """
    hp = desc.hparams
    ct, nkv, hd, nl = cache_type(desc), hp.head_count_kv, hp.key_length, hp.block_count
    nt = f"tensor<{nl}x2x?x{nkv}x{hd}xf32>"
    return "\n".join(
        [
            f"func.func @kv_write(%cache: {ct}, %rows: {nt}, %start: index) -> ({ct} {{iree.abi.output = 0 : index}}) {{",
            "  %c2 = arith.constant 2 : index",
            f"  %T = tensor.dim %rows, %c2 : {nt}",
            f"  %r = tensor.insert_slice %rows into %cache[0, 0, %start, 0, 0] [{nl}, 2, %T, {nkv}, {hd}] "
            f"[1, 1, 1, 1, 1] : {nt} into {ct}",
            f"  return %r : {ct}",
            "}",
        ]
    )


def _weight(mod: ModuleEmitter, b: Body, desc: ModelDescription, name: str, rows: int, cols: int) -> str:
    q = quant_type(desc.tensor_types[name], name)
    ty = q.param_type(rows, cols)
    return b.load(mod.param(name, ty), ty)


def _norm_weight(mod: ModuleEmitter, b: Body, name: str, d: int) -> str:
    ty = f"tensor<{d}xf32>"
    return b.load(mod.param(name, ty), ty)


def _entry(mod: ModuleEmitter, desc: ModelDescription, name: str, dynamic: bool) -> str:
    hp = desc.hparams
    d, hd, nh, nkv, ff, nv = (
        hp.embedding_length, hp.key_length, hp.head_count, hp.head_count_kv, hp.feed_forward_length, hp.vocab_size,
    )  # fmt: skip
    b = Body(mod, dynamic)
    ct, t = cache_type(desc), b.t

    def q_of(name: str) -> QuantType:
        return quant_type(desc.tensor_types[name], name)

    b.emit("%c0 = arith.constant 0 : index")
    b.emit(f"%T = tensor.dim %ids, %c0 : tensor<{t}xi32>")
    tv = "%T" if dynamic else "1"

    embd = _weight(mod, b, desc, "token_embd.weight", nv, d)
    x = b.gather(q_of("token_embd.weight"), embd, nv, d, "%ids")  # [T, d]
    nt = f"tensor<{hp.block_count}x2x{t}x{nkv}x{hd}xf32>"  # every layer's new K/V rows
    new_rows = b.fresh("kv_new")
    b.emit(f"{new_rows} = tensor.empty({'%T' if dynamic else ''}) : {nt}")
    for il in range(hp.block_count):
        p = f"blk.{il}."

        def mm(w: str, n: int, k: int, inp: str, p: str = p) -> str:
            return b.linear(p + w, q_of(p + w), n, k, inp, w)

        cur = b.rmsnorm(
            x, _norm_weight(mod, b, p + "attn_norm.weight", d), d, hp.layer_norm_rms_epsilon, "attn_norm"
        )
        qkv = [(p + w, q_of(p + w), n) for w, n in (("attn_q.weight", nh * hd), ("attn_k.weight", nkv * hd),
                                                      ("attn_v.weight", nkv * hd))]  # fmt: skip
        qc, kc, vc = b.linears(qkv, d, cur)  # [T, nh*hd], [T, nkv*hd], [T, nkv*hd]
        qc = b.rope(qc, "%start", nh, hd, hp.rope_dimension_count, hp.rope_freq_base, "Qcur")
        kc = b.rope(kc, "%start", nkv, hd, hp.rope_dimension_count, hp.rope_freq_base, "Kcur")
        new_kv = []
        for part, val in ((0, kc), (1, vc)):  # this step's rows, [T, nkv, hd]
            v3 = b.fresh("kv3")
            b.emit(
                f"{v3} = tensor.expand_shape {val} [[0], [1, 2]] output_shape [{tv}, {nkv}, {hd}] "
                f": tensor<{t}x{nkv * hd}xf32> into tensor<{t}x{nkv}x{hd}xf32>"
            )
            nxt = b.fresh("kv_new")
            b.emit(
                f"{nxt} = tensor.insert_slice {v3} into {new_rows}[{il}, {part}, 0, 0, 0] "
                f"[1, 1, {tv}, {nkv}, {hd}] [1, 1, 1, 1, 1] : tensor<{t}x{nkv}x{hd}xf32> into {nt}"
            )
            new_rows = nxt
            new_kv.append(v3)
        old_kv = []
        for part in (0, 1):  # the cached rows [0, start) of this layer's K and V
            rows = b.fresh("kv_old")
            b.emit(
                f"{rows} = tensor.extract_slice %cache[{il}, {part}, 0, 0, 0] [1, 1, %start, {nkv}, {hd}] "
                f"[1, 1, 1, 1, 1] : {ct} to tensor<?x{nkv}x{hd}xf32>"
            )
            old_kv.append(rows)
        att = b.attention(qc, (old_kv[0], old_kv[1]), (new_kv[0], new_kv[1]), nh, nkv, hd)  # [T, nh*hd]
        att = mm("attn_output.weight", d, nh * hd, att)  # [T, d]
        x = b.elementwise("add", x, att, d, "ffn_inp")
        cur = b.rmsnorm(
            x, _norm_weight(mod, b, p + "ffn_norm.weight", d), d, hp.layer_norm_rms_epsilon, "ffn_norm"
        )
        gate, up = b.linears([(p + w, q_of(p + w), ff) for w in ("ffn_gate.weight", "ffn_up.weight")], d, cur)
        cur = b.elementwise("swiglu", gate, up, ff, "ffn_act")
        cur = mm("ffn_down.weight", d, ff, cur)  # [T, d]
        x = b.elementwise("add", x, cur, d, "l_out")

    if dynamic:  # only the last position's logits are needed
        last = b.fresh("last")
        b.emit("%c1 = arith.constant 1 : index")
        b.emit("%tm1 = arith.subi %T, %c1 : index")
        b.emit(
            f"{last} = tensor.extract_slice {x}[%tm1, 0] [1, {d}] [1, 1] : tensor<?x{d}xf32> to tensor<1x{d}xf32>"
        )
        x = last
    one = b.single_token_view()
    x = one.rmsnorm(
        x, _norm_weight(mod, one, "output_norm.weight", d), d, hp.layer_norm_rms_epsilon, "result_norm"
    )
    out_name = "token_embd.weight" if hp.tied_output else "output.weight"
    logits = one.linear(out_name, q_of(out_name), nv, d, x, "result_output")
    token = one.argmax(logits, nv)
    b.emit(f"return {new_rows}, {logits}, {token} : {nt}, tensor<1x{nv}xf32>, tensor<1xi32>")
    sig = (
        f"func.func @{name}(%cache: {ct}, %ids: tensor<{t}xi32>, %start: index) -> "
        f"({nt}, tensor<1x{nv}xf32>, tensor<1xi32>) {{"
    )
    return "\n".join([sig, *b.lines, "}"])
