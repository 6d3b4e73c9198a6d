"""The decoder graph every architecture shares, as MLIR: `prefill`, `decode` and `kv_write`.

Owns: `emit_module(desc, tiled)`, which lays out per layer the steps of llama.cpp's graphs for
llama, qwen2, qwen3 and gemma3 (names follow GGUF tensors), switched by the recipe fields of
`HParams`:
  [embedding * embedding_scale]
  attn_norm -> q/k/v (+ attn_*.bias) -> [attn_q_norm/attn_k_norm per head] -> RoPE (pairs or NEOX,
  the layer's base and scale) -> causal GQA attention (sliding window on local layers, query scale)
  -> attn_output -> [post_attention_norm] -> residual -> ffn_norm -> SwiGLU or GELU-gated
  (ffn_gate, ffn_up) -> ffn_down -> [post_ffw_norm] -> residual;
  then output_norm on the last position, logits [softcapped] and the greedy token.

Entry points (the artifact contract, see zinc/artifact.py):
  prefill(cache [L,2,S,Hkv,hd] f32, ids [T] i32, start index) -> (rows [L,2,T,Hkv,hd], logits [1,V], token [1] i32)
  decode (cache,                    ids [1] i32, pos index)   -> (rows [L,2,1,Hkv,hd], logits [1,V], token [1] i32)
  kv_write(cache, rows, start) -> cache   (in place, `iree.abi.output = 0`)
The step functions only read the cache; the caller owns the slab on the device and calls
kv_write with the step's new K/V rows. K rows are stored after QK-norm and RoPE.
Imports: zinc.compiler.emitter, zinc.compiler.kernels, zinc.model.hparams.
"""

from __future__ import annotations

from zinc.compiler.emitter import Body, ModuleEmitter
from zinc.compiler.kernels import QuantType, quant_type
from zinc.model.hparams import HParams, ModelDescription

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
        mod.entries.append(_Entry(mod, desc, dynamic=entry == "prefill").text(entry))
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


class _Entry:
    """One step function (`prefill` with T = ?, or `decode` with T = 1) being emitted."""

    def __init__(self, mod: ModuleEmitter, desc: ModelDescription, dynamic: bool) -> None:
        self.mod, self.desc, self.hp = mod, desc, desc.hparams
        self.b = Body(mod, dynamic)
        self.dynamic = dynamic
        self.tv = "%T" if dynamic else "1"
        hp = self.hp
        self.rows_type = f"tensor<{hp.block_count}x2x{self.b.t}x{hp.head_count_kv}x{hp.key_length}xf32>"

    def q(self, name: str) -> QuantType:
        return quant_type(self.desc.tensor_types[name], name)

    def vector(self, name: str, n: int, b: Body | None = None) -> str:
        """A 1-D F32 tensor (norm weight or bias) loaded as tensor<n x f32>."""
        ty = f"tensor<{n}xf32>"
        return (b or self.b).load(self.mod.param(name, ty), ty)

    def mm(self, name: str, n: int, k: int, x: str, hint: str) -> str:
        return self.b.linear(name, self.q(name), n, k, x, hint)

    def mms(self, names: list[str], ns: list[int], k: int, x: str) -> list[str]:
        """Weights applied to the same input: one stacked matmul where the target allows it."""
        return self.b.linears([(name, self.q(name), n) for name, n in zip(names, ns, strict=True)], k, x)

    def norm(self, x: str, name: str, hint: str) -> str:
        d = self.hp.embedding_length
        return self.b.rmsnorm(x, self.vector(name, d), d, self.hp.layer_norm_rms_epsilon, hint)

    def text(self, name: str) -> str:
        hp, b = self.hp, self.b
        d, nv = hp.embedding_length, hp.vocab_size
        ct, t = cache_type(self.desc), b.t
        b.emit("%c0 = arith.constant 0 : index")
        b.emit(f"%T = tensor.dim %ids, %c0 : tensor<{t}xi32>")
        q_embd = self.q("token_embd.weight")
        embd = b.load(self.mod.param("token_embd.weight", q_embd.param_type(nv, d)), q_embd.param_type(nv, d))
        x = b.gather(q_embd, embd, nv, d, "%ids")  # [T, d]
        if hp.embedding_scale != 1.0:
            x = b.scale(x, hp.embedding_scale, d, "inp_scaled")
        new_rows = b.fresh("kv_new")
        b.emit(f"{new_rows} = tensor.empty({'%T' if self.dynamic else ''}) : {self.rows_type}")
        for il in range(hp.block_count):
            x, new_rows = self.layer(il, x, new_rows)
        token, logits = self.output(x)
        b.emit(f"return {new_rows}, {logits}, {token} : {self.rows_type}, tensor<1x{nv}xf32>, tensor<1xi32>")
        sig = (
            f"func.func @{name}(%cache: {ct}, %ids: tensor<{t}xi32>, %start: index) -> "
            f"({self.rows_type}, tensor<1x{nv}xf32>, tensor<1xi32>) {{"
        )
        return "\n".join([sig, *b.lines, "}"])

    def layer(self, il: int, x: str, new_rows: str) -> tuple[str, str]:
        hp, b, p = self.hp, self.b, f"blk.{il}."
        d, ff = hp.embedding_length, hp.feed_forward_length
        cur = self.norm(x, p + "attn_norm.weight", "attn_norm")
        att, new_rows = self.attention(il, cur, new_rows)
        att = self.mm(p + "attn_output.weight", d, hp.head_count * hp.key_length, att, "attn_out")  # [T, d]
        if hp.post_norms:
            att = self.norm(att, p + "post_attention_norm.weight", "attn_post_norm")
        x = b.elementwise("add", x, att, d, "ffn_inp")
        cur = self.norm(x, p + "ffn_norm.weight", "ffn_norm")
        gate, up = self.mms([p + "ffn_gate.weight", p + "ffn_up.weight"], [ff, ff], d, cur)  # [T, ff] each
        if hp.ffn_activation == "gelu":
            cur = b.gelu_gated(gate, up, ff, "ffn_act")
        else:
            cur = b.elementwise("swiglu", gate, up, ff, "ffn_act")
        cur = self.mm(p + "ffn_down.weight", d, ff, cur, "ffn_out")  # [T, d]
        if hp.post_norms:
            cur = self.norm(cur, p + "post_ffw_norm.weight", "ffn_post_norm")
        return b.elementwise("add", x, cur, d, "l_out"), new_rows

    def projection(self, il: int, y: str, part: str, heads: int) -> str:
        """q, k or v of layer `il` [T, heads*hd] from its matmul `y`: bias, per-head norm and RoPE
        as the recipe says."""
        hp, b, p = self.hp, self.b, f"blk.{il}."
        hd, n = hp.key_length, heads * hp.key_length
        if hp.attn_qkv_bias:
            y = b.bias_add(y, self.vector(f"{p}attn_{part}.bias", n), n, f"{part.upper()}bias")
        if part == "v":
            return y
        if hp.attn_qk_norm:
            w = self.vector(f"{p}attn_{part}_norm.weight", hd)
            y = b.rmsnorm_heads(y, w, heads, hd, hp.layer_norm_rms_epsilon, f"{part.upper()}norm")
        return _rope(b, hp, il, y, heads, f"{part.upper()}rope")

    def attention(self, il: int, cur: str, new_rows: str) -> tuple[str, str]:
        """Layer `il`'s attention over the cached rows and this step's; adds its K/V to `new_rows`."""
        hp, b, t, tv = self.hp, self.b, self.b.t, self.tv
        nh, nkv, hd = hp.head_count, hp.head_count_kv, hp.key_length
        names = [f"blk.{il}.attn_{part}.weight" for part in "qkv"]
        ys = self.mms(names, [nh * hd, nkv * hd, nkv * hd], hp.embedding_length, cur)
        qc = self.projection(il, ys[0], "q", nh)  # [T, nh*hd]
        new_kv = []
        for part, name in ((0, "k"), (1, "v")):  # this step's rows, [T, nkv, hd]
            val = self.projection(il, ys[1 + part], name, nkv)
            v3 = b.fresh("kv3")
            b.emit(
                f"{v3} = tensor.expand_shape {val} [[0], [1, 2]] output_shape [{tv}, {nkv}, {hd}] "
                f": tensor<{t}x{nkv * hd}xf32> into tensor<{t}x{nkv}x{hd}xf32>"
            )
            nxt = b.fresh("kv_new")
            b.emit(
                f"{nxt} = tensor.insert_slice {v3} into {new_rows}[{il}, {part}, 0, 0, 0] "
                f"[1, 1, {tv}, {nkv}, {hd}] [1, 1, 1, 1, 1] : tensor<{t}x{nkv}x{hd}xf32> into {self.rows_type}"
            )
            new_rows = nxt
            new_kv.append(v3)
        old_kv = []
        for part in (0, 1):  # the cached rows [0, start) of this layer's K and V
            rows = b.fresh("kv_old")
            b.emit(
                f"{rows} = tensor.extract_slice %cache[{il}, {part}, 0, 0, 0] [1, 1, %start, {nkv}, {hd}] "
                f"[1, 1, 1, 1, 1] : {cache_type(self.desc)} to tensor<?x{nkv}x{hd}xf32>"
            )
            old_kv.append(rows)
        kv_old, kv_new = (old_kv[0], old_kv[1]), (new_kv[0], new_kv[1])
        window, scale = hp.window(il), hp.q_scale()
        if window == 0 and scale == hd**-0.5:
            return b.attention(qc, kv_old, kv_new, nh, nkv, hd), new_rows
        return b.attention_window(qc, kv_old, kv_new, nh, nkv, hd, scale, window), new_rows

    def output(self, x: str) -> tuple[str, str]:
        """The greedy token and the logits [1, V] of the last position."""
        hp, b = self.hp, self.b
        d, nv = hp.embedding_length, hp.vocab_size
        if self.dynamic:  # only the last position's logits are needed
            last = b.fresh("last")
            b.emit("%c1 = arith.constant 1 : index")
            b.emit("%tm1 = arith.subi %T, %c1 : index")
            b.emit(
                f"{last} = tensor.extract_slice {x}[%tm1, 0] [1, {d}] [1, 1] : tensor<?x{d}xf32> to tensor<1x{d}xf32>"
            )
            x = last
        one = b.single_token_view()
        w = self.vector("output_norm.weight", d, one)
        x = one.rmsnorm(x, w, d, hp.layer_norm_rms_epsilon, "result_norm")
        out_name = "token_embd.weight" if hp.tied_output else "output.weight"
        logits = one.linear(out_name, self.q(out_name), nv, d, x, "result_output")
        if hp.final_logit_softcapping:
            logits = one.softcap(logits, hp.final_logit_softcapping, nv, "result_softcap")
        return one.argmax(logits, nv), logits


def _rope(b: Body, hp: HParams, il: int, x: str, heads: int, hint: str) -> str:
    if hp.rope_type == "neox":
        return b.rope_neox(x, "%start", heads, hp.key_length, hp.rope_base(il), hp.rope_scale(il), hint)
    return b.rope(x, "%start", heads, hp.key_length, hp.rope_dimension_count, hp.rope_base(il), hint)
