"""The decoder graph every architecture shares, as MLIR: `prefill`, `decode` and `kv_write`.

Owns: `emit_module(desc, tiled)`, which lays out per layer the steps of llama.cpp's graphs for
llama, qwen2, qwen3 and gemma3 (names follow GGUF tensors), switched by the recipe fields of
`HParams`:
  [embedding * embedding_scale]
  attn_norm -> q/k/v (+ attn_*.bias) -> [attn_q_norm/attn_k_norm per head] -> RoPE (pairs or NEOX,
  the layer's base and scale, Llama 3's rope_freqs factors) -> causal GQA attention (sliding window
  on local layers, query scale)
  -> attn_output -> [post_attention_norm] -> residual -> ffn_norm -> SwiGLU or GELU-gated
  (ffn_gate, ffn_up) -> ffn_down -> [post_ffw_norm] -> residual;
  then output_norm on the last position, logits [softcapped] and the greedy token.

Entry points (the artifact contract, see zinc/artifact.py). The KV cache is one slot-major slab
[NS, L, 2, Hkv, hd]; a sequence's positions live in slots its page table names (zinc.engine.pages),
so every step takes the slots of the cached positions it attends over:
  prefill(cache, ids [T] i32, start index, ctx [S >= start + T] i32)
      -> (rows [L,2,T,Hkv,hd], logits [1,V], token [1] i32)       one sequence, positions start..;
                                                                  ctx: the slots of positions < start,
                                                                  then scratch slot 0
  prefill_kv(cache, ids [T] i32, start index, ctx [S >= start + T] i32)
      -> rows [L,2,T,Hkv,hd]                                      the same rows without the output
                                                                  head, for a prompt's earlier chunks
  prefill_x{N}(cache, ids [T] i32, pos [T] i32, then per segment i < N:    (the CPU only) N prompts' last
              off_i, len_i, start_i index, ctx_i [S_i] i32)       chunks packed in one call: segment
      -> (rows [L,2,T,Hkv,hd], logits [N,V], tokens [N] i32)      i is ids[off_i : off_i + len_i] at
                                                                  positions start_i.., with its own
                                                                  ctx as in prefill; logits of each
                                                                  segment's last position
  decode_b{B}(cache, ids [B] i32, pos [B] i32, ctx [B,S] i32)
      -> (rows [L,2,B,Hkv,hd], logits [B,V], tokens [B] i32)      B sequences, one token each;
                                                                  row b sees ctx[b, :pos[b]]
  kv_write(cache, rows [L,2,T,Hkv,hd], slots [T] i32) -> cache    in place (`iree.abi.output = 0`)
  embed(ids [T] i32) -> hidden [T, d]                             (pooling models only,
                                                                  zinc.compiler.embed) a whole
                                                                  input, no cache: its final
                                                                  hidden states after output_norm
  embed_x{N}(ids [T] i32, pos [T] i32, then per segment i < N:    (the CPU, pooling models) N inputs
             off_i, len_i index) -> hidden [T, d]                 packed as prefill_x{N} packs
                                                                  prompts, each a lone `embed`
On Vulkan GPU targets prefill and prefill_kv take at most 128 tokens (zinc.artifact.PREFILL_ROWS, a
call's chunk): they pad the chunk to 128 rows inside, so that their matmuls are GEMMs
(zinc.compiler.gemm; `emit_module(gemm=...)`), and return the chunk's own K/V rows.
B runs over the compiled batch buckets (`zinc compile --batch`); decode_b1 uses the single-token
kernels, larger buckets the matmul (prefill) kernels, so a step's weights are read once for all B.
prefill_x{N} has one entry per bucket N > 1: the matmuls, norms and RoPE run over all T rows at
once (each row's arithmetic is the same in any tile, RoPE at each row's position), each segment's
attention is a lone `prefill`'s (its own ctx and start), and the head runs on each segment's last
row as a decode batch's does, so its K/V rows and logits are bit for bit a lone prefill's
(tests/model/test_packed_prefill.py).
The step functions only read the cache; the caller owns the slab on the device and calls
kv_write with the step's new K/V rows. On the CPU a decode step's layer l gate/up matmul (layer 0:
its q/k/v matmul) also prefetches layer l + 1's (0's) cached K/V rows (zinc.compiler.kv_prefetch).
K rows are stored after QK-norm and RoPE. The rows a step returns are layer-major, so each
layer's K and V rows are written in place as whole blocks (zinc.compiler.paged `rows_type`). The
slab and the rows hold f16 values: f16 on the CPU, two to an i32 word on Vulkan ("f16x2": the
manifest's `kv_cache.dtype`, ModuleEmitter.kv_dtype; zinc.compiler.paged). Each residual add
that a norm follows is handed to that norm (`Body.add_rmsnorm`: one dispatch on the CPU): the
attention's to ffn_norm, and a layer's FFN output to the next layer's attn_norm.
Imports: zinc.artifact (DEFAULT_BATCH_SIZES), zinc.compiler.emitter, zinc.compiler.paged,
zinc.compiler.kernels, zinc.compiler.kv_prefetch, zinc.model.hparams.
"""

from __future__ import annotations

from zinc.artifact import DEFAULT_BATCH_SIZES
from zinc.compiler import paged
from zinc.compiler.emitter import NO_WINDOW, Body, ModuleEmitter
from zinc.compiler.kernels import QuantType, quant_type
from zinc.compiler.kv_prefetch import KvPrefetch
from zinc.model.hparams import HParams, ModelDescription

ENTRY_POINTS = ("prefill", "prefill_kv", "kv_write")  # and decode_entry(B) for each batch size


def decode_entry(batch: int) -> str:
    return f"decode_b{batch}"


def packed_entry(segments: int) -> str:
    return f"prefill_x{segments}"


def embed_packed_entry(segments: int) -> str:
    return f"embed_x{segments}"


def packed_sizes(batch_sizes: tuple[int, ...], tiled: bool) -> list[int]:
    """The segment counts of the packed prefill entries: the decode buckets above 1, on the CPU."""
    return sorted(set(batch_sizes) - {1}) if tiled else []


def entry_points(batch_sizes: tuple[int, ...], tiled: bool, embed: bool = False) -> list[str]:
    """Every entry point `emit_module` emits for these buckets (the manifest lists them); `embed`
    and its packed forms for a model that pools (zinc.compiler.embed.pools)."""
    decode = [decode_entry(b) for b in sorted({1, *batch_sizes})]
    packed = [packed_entry(n) for n in packed_sizes(batch_sizes, tiled)]
    embeds = ["embed", *(embed_packed_entry(n) for n in packed_sizes(batch_sizes, tiled))] if embed else []
    return [*ENTRY_POINTS, *decode, *packed, *embeds]


def cache_type(desc: ModelDescription, dt: str = "f32") -> str:
    return paged.slab_type(desc.hparams, dt)


def build_module(desc: ModelDescription, module_name: str = "zinc_model") -> str:
    return emit_module(desc).text(module_name)


def emit_module(
    desc: ModelDescription,
    tiled: bool = False,
    dot8: bool = False,
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES,
    kv_write_parallel: bool = False,
    index_inputs: bool = False,
    gemm: tuple[int, str] | None = None,
    copies: frozenset[str] = frozenset(),
    dp4_subgroup: int = 0,
    shared_layers: bool = False,
) -> ModuleEmitter:
    """The module for `desc`; `tiled` binds the supported matmul weights as repacked planes (CPU),
    `dot8` with the integer dot-product kernels where they apply (x86-64 with AVX2);
    one decode entry per batch size (1 is always included: single-sequence decode);
    `kv_write_parallel` for Vulkan (see paged.kv_write); `index_inputs` for a Vulkan GPU target
    with subgroups (zinc.compiler.targets.index_inputs); `gemm` (rows, operand type): the
    prefill entries' matmuls as a dequantization and a GEMM over chunks padded to that many rows
    (zinc.compiler.gemm; Vulkan); `copies`: GGUF tensors bound from an aligned copy in the .irpa
    (ModuleEmitter.copies); `dp4_subgroup`: the decode matmuls with integer dot products, for
    subgroups this wide (zinc.compiler.dp4; a Vulkan GPU target), 0: none."""
    mod = ModuleEmitter(tiled=tiled, dot8=dot8, index_inputs=index_inputs, copies=copies, dp4_subgroup=dp4_subgroup,
                        shared_layers=shared_layers)  # fmt: skip
    mod.entries.append(_Entry(mod, desc, batch=0, gemm=gemm).text("prefill"))
    mod.entries.append(_Entry(mod, desc, batch=0, rows_only=True, gemm=gemm).text("prefill_kv"))
    for batch in sorted({1, *batch_sizes}):
        mod.entries.append(_Entry(mod, desc, batch=batch).text(decode_entry(batch)))
    for n in packed_sizes(batch_sizes, tiled):  # the CPU: several prompts' last chunks in one call
        mod.entries.append(_Entry(mod, desc, batch=0, segments=n).text(packed_entry(n)))
    mod.entries.append(paged.kv_write(desc.hparams, kv_write_parallel, mod.kv_dtype))
    from zinc.compiler import embed  # not at the top: it builds on _Entry

    if embed.pools(desc.hparams):
        mod.entries.append(embed.EmbedEntry(mod, desc).text("embed"))
        for n in packed_sizes(batch_sizes, tiled):  # the CPU: several inputs in one call
            mod.entries.append(embed.EmbedEntry(mod, desc, n).text(embed_packed_entry(n)))
    return mod


class _Entry:
    """One step function being emitted: `prefill` (batch 0: one sequence, T = ?) or a decode
    bucket of `batch` sequences (1: the single-token kernels; more: the dynamic-T kernels on a
    static batch, cast at the boundary so IREE specialises them). `rows_only`: the step returns
    its K/V rows only; with no head, the compiler also drops the last layer's work after its K/V.
    `segments` (with batch 0): a packed prefill of that many prompts (`prefill_x{N}`). `gemm`
    (rows, operand type), with batch 0: the chunk is padded to `rows` tokens inside the entry (ids
    0, their K/V rows computed and dropped, ctx padded with scratch slot 0), so that every shape
    is static and the matmuls are GEMMs (zinc.compiler.gemm); %T is then `rows` and %Tn the
    chunk's own length, at most `rows`."""

    def __init__(
        self, mod: ModuleEmitter, desc: ModelDescription, batch: int, rows_only: bool = False, segments: int = 0,
        gemm: tuple[int, str] | None = None,
    ) -> None:
        self.mod, self.desc, self.hp = mod, desc, desc.hparams
        self.batch = batch
        self.rows_only = rows_only
        self.segments = segments
        self.dynamic = batch != 1
        self.b = Body(mod, self.dynamic)
        self.b.per_row = batch > 0 or segments > 0
        self.b.rows = batch if batch > 1 else 0
        self.tv = "%T" if self.dynamic else "1"
        self.gemm = gemm
        self.b.gemm = gemm[1] if gemm else None
        self.rows_type = paged.rows_type(self.hp, self.b.t, mod.kv_dtype)

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

    def add_norm(self, x: str, r: str, name: str, hint: str) -> tuple[str, str]:
        """The residual add x + r and the norm after it (one CPU dispatch): (the sum, its norm)."""
        d = self.hp.embedding_length
        return self.b.add_rmsnorm(x, r, self.vector(name, d), d, self.hp.layer_norm_rms_epsilon, hint)

    def text(self, name: str) -> str:
        hp, b = self.hp, self.b
        nv = hp.vocab_size
        ct = cache_type(self.desc, self.mod.kv_dtype)
        b.emit("%c0 = arith.constant 0 : index")
        args = self._arguments()
        x, new_rows = self.trunk()
        if self.gemm:  # the chunk's own rows, without the padding's
            rows = b.fresh("kv_rows")
            b.emit(
                f"{rows} = tensor.extract_slice {new_rows}[0, 0, 0, 0, 0] [{hp.block_count}, 2, %Tn, {hp.head_count_kv}, "
                f"{paged.row_width(hp.key_length, self.mod.kv_dtype)}] [1, 1, 1, 1, 1] : {self.rows_type} to {self.rows_type}"
            )
            new_rows = rows
        if self.rows_only:
            b.emit(f"return {new_rows} : {self.rows_type}")
            sig = f"func.func @{name}(%cache: {ct}, {args}) -> {self.rows_type} {{"
            return "\n".join([sig, *b.lines, "}"])
        token, logits = self.output(x)
        n = self.segments or self.batch or 1  # rows of logits: one per segment or sequence, or the last position
        results = [(new_rows, self.rows_type), (logits, f"tensor<{b.t if n > 1 else 1}x{nv}xf32>"),
                   (token, f"tensor<{'?' if n > 1 else 1}xi32>")]  # fmt: skip
        if n > 1:  # back to the bucket's static shapes (a packed prefill's rows stay one per token)
            first = 0 if self.batch > 1 else 1
            results[first:] = [
                (self._cast(v, ty, _static(ty, n)), _static(ty, n)) for v, ty in results[first:]
            ]
        b.emit(f"return {', '.join(v for v, _ in results)} : {', '.join(ty for _, ty in results)}")
        sig = f"func.func @{name}(%cache: {ct}, {args}) -> ({', '.join(ty for _, ty in results)}) {{"
        return "\n".join([sig, *b.lines, "}"])

    def trunk(self) -> tuple[str, str]:
        """The token embeddings of %ids through every layer: the residual stream [T, d] before
        output_norm, and the step's K/V rows."""
        hp, b = self.hp, self.b
        d, nv = hp.embedding_length, hp.vocab_size
        if self.gemm:
            self._pad_chunk(self.gemm[0])
        else:
            b.emit(f"%T = tensor.dim %ids, %c0 : tensor<{b.t}xi32>")
        q_embd = self.q("token_embd.weight")
        embd = b.load(self.mod.param("token_embd.weight", q_embd.param_type(nv, d)), q_embd.param_type(nv, d))
        x = b.gather(q_embd, embd, nv, d, "%ids")  # [T, d]
        if hp.embedding_scale != 1.0:
            x = b.scale(x, hp.embedding_scale, d, "inp_scaled")
        new_rows = b.fresh("kv_new")
        b.emit(f"{new_rows} = tensor.empty({'%T' if self.dynamic else ''}) : {self.rows_type}")
        pending: str | None = None  # the last layer's FFN output, added to x by the next norm
        for il in range(hp.block_count):
            x, pending, new_rows = self.layer(il, x, pending, new_rows)
        if pending is not None:
            x = b.elementwise("add", x, pending, d, "l_out")
        return x, new_rows

    def _pad_chunk(self, rows: int) -> None:
        """Binds %Tn (the chunk's length), %T = `rows`, %ids and %ctx padded to them with zeros."""
        b = self.b
        b.emit("%Tn = tensor.dim %ids_in, %c0 : tensor<?xi32>")
        b.emit(f"%T = arith.constant {rows} : index")
        b.emit("%S_in = tensor.dim %ctx_in, %c0 : tensor<?xi32>")
        b.emit("%pad = arith.subi %T, %Tn : index")
        b.emit("%S_p = arith.addi %S_in, %pad : index")
        b.emit("%zero_id = arith.constant 0 : i32")
        for name, n in (("ids", "%T"), ("ctx", "%S_p")):
            b.emit(f"%{name}_e = tensor.empty({n}) : tensor<?xi32>")
            b.emit(f"%{name}_z = linalg.fill ins(%zero_id : i32) outs(%{name}_e : tensor<?xi32>) -> tensor<?xi32>")
            size = "%Tn" if name == "ids" else "%S_in"
            b.emit(f"%{name} = tensor.insert_slice %{name}_in into %{name}_z[0] [{size}] [1] : tensor<?xi32> into tensor<?xi32>")

    def _arguments(self) -> str:
        """The entry's arguments after the cache; binds %ids, %ctx and %start or %pos."""
        b = self.b
        if self.segments:
            each = (f"%off{i}: index, %len{i}: index, %start{i}: index, %ctx{i}: tensor<?xi32>" for i in range(self.segments))
            return ", ".join(["%ids: tensor<?xi32>, %pos: tensor<?xi32>", *each])
        if self.batch == 0:
            suffix = "_in" if self.gemm else ""
            return f"%ids{suffix}: tensor<?xi32>, %start: index, %ctx{suffix}: tensor<?xi32>"
        n = self.batch
        if n == 1:
            b.kv_rows = ("%ctx", "%pos")
            return "%ids: tensor<1xi32>, %pos: tensor<1xi32>, %ctx: tensor<1x?xi32>"
        b.kv_rows = ("%ctx_b", "%pos_b")
        for arg, static, dyn in (("ids", f"{n}", "?"), ("pos", f"{n}", "?"), ("ctx", f"{n}x?", "?x?")):
            b.emit(f"%{arg} = tensor.cast %{arg}_b : tensor<{static}xi32> to tensor<{dyn}xi32>")
        return f"%ids_b: tensor<{n}xi32>, %pos_b: tensor<{n}xi32>, %ctx_b: tensor<{n}x?xi32>"

    def _cast(self, value: str, src: str, dst: str) -> str:
        out = self.b.fresh("static")
        self.b.emit(f"{out} = tensor.cast {value} : {src} to {dst}")
        return out

    def layer(self, il: int, x: str, pending: str | None, new_rows: str) -> tuple[str, str, str]:
        """Layer `il` on the residual stream x (plus `pending`, the layer before's FFN output, not
        yet added: the add goes into this layer's first norm). Returns x after the attention's add,
        this layer's FFN output (pending) and the K/V rows."""
        hp, b, p = self.hp, self.b, f"blk.{il}."
        d, ff = hp.embedding_length, hp.feed_forward_length
        if pending is None:
            cur = self.norm(x, p + "attn_norm.weight", "attn_norm")
        else:
            x, cur = self.add_norm(x, pending, p + "attn_norm.weight", "attn_norm")
        att, new_rows = self.attention(il, cur, new_rows)
        att = self.mm(p + "attn_output.weight", d, hp.head_count * hp.key_length, att, "attn_out")  # [T, d]
        if hp.post_norms:
            att = self.norm(att, p + "post_attention_norm.weight", "attn_post_norm")
        x, cur = self.add_norm(x, att, p + "ffn_norm.weight", "ffn_norm")
        self._prefetch_kv(il + 1)  # the next layer's cached K/V, while gate/up's arithmetic runs
        gate, up = self.mms([p + "ffn_gate.weight", p + "ffn_up.weight"], [ff, ff], d, cur)  # [T, ff] each
        b.kv_prefetch = None
        if hp.ffn_activation == "gelu":
            cur = b.gelu_gated(gate, up, ff, "ffn_act")
        else:
            cur = b.elementwise("swiglu", gate, up, ff, "ffn_act")
        cur = self.mm(p + "ffn_down.weight", d, ff, cur, "ffn_out")  # [T, d]
        if hp.post_norms:
            cur = self.norm(cur, p + "post_ffw_norm.weight", "ffn_post_norm")
        return x, cur, new_rows

    def _prefetch_kv(self, il: int) -> None:
        """In a decode step (the CPU), have the next integer dot-product matmul prefetch layer `il`'s
        cached K/V rows (zinc.compiler.kv_prefetch); nothing past the last layer."""
        hp = self.hp
        if self.batch and il < hp.block_count:
            self.b.kv_prefetch = KvPrefetch(
                il, hp.window(il) or NO_WINDOW, hp.block_count, hp.head_count_kv, hp.key_length, self.mod.kv_dtype
            )

    def projection(self, il: int, y: str, part: str, heads: int) -> str:
        """q, k or v of layer `il` [T, heads*hd] from its matmul `y`: bias, per-head norm and RoPE
        as the recipe says."""
        hp, b, p = self.hp, self.b, f"blk.{il}."
        hd, n = hp.key_length, heads * hp.key_length
        bias = self.vector(f"{p}attn_{part}.bias", n) if hp.attn_qkv_bias else None
        if bias is not None and (part == "v" or hp.attn_qk_norm or hp.rope_type != "neox"):
            y, bias = b.bias_add(y, bias, n, f"{part.upper()}bias"), None  # else NEOX RoPE adds it
        if part == "v":
            return y
        if hp.attn_qk_norm:
            w = self.vector(f"{p}attn_{part}_norm.weight", hd)
            y = b.rmsnorm_heads(y, w, heads, hd, hp.layer_norm_rms_epsilon, f"{part.upper()}norm")
        # k stays in linalg: IREE fuses its RoPE with the rounding to the slab's type (paged.to_slab)
        return _rope(b, hp, il, y, heads, f"{part.upper()}rope", by_hand=part == "q", bias=bias)

    def attention(self, il: int, cur: str, new_rows: str) -> tuple[str, str]:
        """Layer `il`'s attention over the cached rows and this step's; adds its K/V to `new_rows`."""
        hp, b, t, tv = self.hp, self.b, self.b.t, self.tv
        nh, nkv, hd = hp.head_count, hp.head_count_kv, hp.key_length
        names = [f"blk.{il}.attn_{part}.weight" for part in "qkv"]
        if il == 0:  # the first layer's rows have no earlier gate/up to come with
            self._prefetch_kv(0)
        ys = self.mms(names, [nh * hd, nkv * hd, nkv * hd], hp.embedding_length, cur)
        b.kv_prefetch = None
        qc = self.projection(il, ys[0], "q", nh)  # [T, nh*hd]
        new_kv = []
        for part, name in ((0, "k"), (1, "v")):  # this step's rows, [T, nkv, hd]
            val = self.projection(il, ys[1 + part], name, nkv)
            v3 = b.fresh("kv3")
            b.emit(
                f"{v3} = tensor.expand_shape {val} [[0], [1, 2]] output_shape [{tv}, {nkv}, {hd}] "
                f": tensor<{t}x{nkv * hd}xf32> into tensor<{t}x{nkv}x{hd}xf32>"
            )
            stored, read = paged.to_slab(b, v3, t, nkv, hd)  # as the slab keeps it, and as read back
            nxt = b.fresh("kv_new")
            b.emit(
                f"{nxt} = tensor.insert_slice {stored} into {new_rows}[{il}, {part}, 0, 0, 0] "
                f"[1, 1, {tv}, {nkv}, {paged.row_width(hd, self.mod.kv_dtype)}] [1, 1, 1, 1, 1] : {paged.rows_of(t, nkv, hd, self.mod.kv_dtype)} "
                f"into {self.rows_type}"
            )
            new_rows = nxt
            new_kv.append(read)
        if self.batch:  # each row its own sequence: its cached rows [T, S, Hkv, hd], pos[t] of them valid
            att = paged.attention_batch(
                b, hp, il, qc, (new_kv[0], new_kv[1]), "%pos", hp.q_scale(), hp.window(il)
            )
            return att, new_rows
        if self.segments:
            return self.segment_attention(il, qc, new_kv), new_rows
        k, v = self.context_kv(il, new_kv)
        att = b.attention_window(qc, (k, v), "%start", nh, nkv, hd, hp.q_scale(), hp.window(il))
        return att, new_rows

    def context_kv(self, il: int, new_kv: list[str]) -> tuple[str, str]:
        """A prefill's keys and values by position [S, Hkv, hd]: the cached rows, then this step's."""
        k, v = (paged.context_kv(self.b, self.hp, "%ctx", il, part, new_kv[part]) for part in (0, 1))
        return k, v

    def segment_attention(self, il: int, qc: str, new_kv: list[str]) -> str:
        """A packed prefill's attention: each segment's, as a lone prefill of it computes it, put
        back at its rows."""
        hp, b = self.hp, self.b
        nh, nkv, hd = hp.head_count, hp.head_count_kv, hp.key_length
        hhd, rows = f"tensor<?x{nh * hd}xf32>", f"tensor<?x{nkv}x{hd}xf32>"
        out = b.fresh("attn_all")
        b.emit(f"{out} = tensor.empty(%T) : {hhd}")
        for i in range(self.segments):
            off, n = f"%off{i}", f"%len{i}"
            q = b.fresh("q_seg")
            b.emit(f"{q} = tensor.extract_slice {qc}[{off}, 0] [{n}, {nh * hd}] [1, 1] : {hhd} to {hhd}")
            new = []
            for part in (0, 1):
                new.append(b.fresh("kv_seg"))
                b.emit(f"{new[-1]} = tensor.extract_slice {new_kv[part]}[{off}, 0, 0] [{n}, {nkv}, {hd}] [1, 1, 1] : {rows} to {rows}")
            k, v, start = self.segment_context(i, il, new)
            att = b.attention_window(q, (k, v), start, nh, nkv, hd, hp.q_scale(), hp.window(il))
            nxt = b.fresh("attn_all")
            b.emit(f"{nxt} = tensor.insert_slice {att} into {out}[{off}, 0] [{n}, {nh * hd}] [1, 1] : {hhd} into {hhd}")
            out = nxt
        return out

    def segment_context(self, i: int, il: int, new: list[str]) -> tuple[str, str, str]:
        """Segment i's keys and values by position [S, Hkv, hd] (its cached rows, then `new`, its K
        and V rows in this call) and the position of its first row."""
        k, v = (paged.context_kv(self.b, self.hp, f"%ctx{i}", il, part, new[part], f"%start{i}", f"%len{i}") for part in (0, 1))
        return k, v, f"%start{i}"

    def last_rows(self, x: str) -> str:
        """The last row of each segment of a packed prefill, [N, d] (dynamic type)."""
        b, d = self.b, self.hp.embedding_length
        act = f"tensor<?x{d}xf32>"
        out = b.fresh("last_rows")
        b.emit(f"%nseg = arith.constant {self.segments} : index")
        b.emit(f"{out} = tensor.empty(%nseg) : {act}")
        b.emit("%c1 = arith.constant 1 : index")
        for i in range(self.segments):
            at, row, nxt = b.fresh("at"), b.fresh("row"), b.fresh("last_rows")
            b.emit(f"{at}e = arith.addi %off{i}, %len{i} : index")
            b.emit(f"{at} = arith.subi {at}e, %c1 : index")
            b.emit(f"{row} = tensor.extract_slice {x}[{at}, 0] [1, {d}] [1, 1] : {act} to tensor<1x{d}xf32>")
            b.emit(f"{nxt} = tensor.insert_slice {row} into {out}[{i}, 0] [1, {d}] [1, 1] : tensor<1x{d}xf32> into {act}")
            out = nxt
        b.rows = self.segments  # the head as a decode batch's: a static tile of N rows
        return out

    def output(self, x: str) -> tuple[str, str]:
        """The greedy token(s) and the logits: of the last position (prefill) or of every row."""
        hp, b = self.hp, self.b
        d, nv = hp.embedding_length, hp.vocab_size
        out_name = "token_embd.weight" if hp.tied_output else "output.weight"
        if self.segments:
            x = self.last_rows(x)
        if self.batch > 1 or self.segments:
            x = b.rmsnorm(
                x, self.vector("output_norm.weight", d), d, hp.layer_norm_rms_epsilon, "result_norm"
            )
            logits = b.linear(out_name, self.q(out_name), nv, d, x, "result_output")
            if hp.final_logit_softcapping:
                logits = b.softcap(logits, hp.final_logit_softcapping, nv, "result_softcap")
            return b.argmax_rows(logits, nv), logits
        if self.dynamic:  # only the last position's logits are needed
            last = b.fresh("last")
            b.emit("%c1 = arith.constant 1 : index")
            b.emit(f"%tm1 = arith.subi {'%Tn' if self.gemm else '%T'}, %c1 : index")
            b.emit(
                f"{last} = tensor.extract_slice {x}[%tm1, 0] [1, {d}] [1, 1] : tensor<?x{d}xf32> to tensor<1x{d}xf32>"
            )
            x = last
        one = b.single_token_view()
        w = self.vector("output_norm.weight", d, one)
        x = one.rmsnorm(x, w, d, hp.layer_norm_rms_epsilon, "result_norm")
        logits = one.linear(out_name, self.q(out_name), nv, d, x, "result_output")
        if hp.final_logit_softcapping:
            logits = one.softcap(logits, hp.final_logit_softcapping, nv, "result_softcap")
        return one.argmax(logits, nv), logits


def _rope(b: Body, hp: HParams, il: int, x: str, heads: int, hint: str, by_hand: bool, bias: str | None = None) -> str:
    """RoPE of q or k as the recipe says; `bias` (NEOX only) is added to x in the same dispatch."""
    pos = "%pos" if b.per_row else "%start"
    factors = hp.rope_freq_factors  # Llama 3.1/3.2's rope_freqs (none: the same MLIR as before them)
    if hp.rope_type == "neox":
        return b.rope_neox(x, pos, heads, hp.key_length, hp.rope_base(il), hp.rope_scale(il), hint, factors, bias)
    assert bias is None, "only NEOX RoPE takes the projection's bias"
    n_rot = hp.rope_dimension_count
    return b.rope(x, pos, heads, hp.key_length, n_rot, hp.rope_base(il), hint, by_hand, factors)


def _static(ty: str, n: int) -> str:
    """A tensor type with its one dynamic dimension (the tokens') made `n`."""
    dims = ty.removeprefix("tensor<").split("x")
    return "tensor<" + "x".join(str(n) if d == "?" else d for d in dims)
