"""The `embed` entry points of a pooling model: whole inputs' final hidden states, no KV cache.

Owns: `pools(hp)` (whether a model's GGUF declares a pooling that zinc serves: mean, cls or last;
`{arch}.pooling_type`) and `EmbedEntry`, which emits
  embed(ids [T] i32) -> hidden [T, d]
the decoder graph of zinc.compiler.graph over the T tokens at positions 0.. (causal attention over
this call's own K/V rows only), then output_norm on every row; no output head; and, on the CPU,
  embed_x{N}(ids [T] i32, pos [T] i32, off_i, len_i index for each i < N) -> hidden [T, d]
N inputs packed in one row of tokens, as prefill_x{N} packs prompts: input i is
ids[off_i : off_i + len_i] at positions pos (0.. within each input), the matmuls and norms run
over all T rows at once (a row's arithmetic is the same in any tile), and each input's attention
is a lone `embed`'s over its own rows, so its hidden states are bit for bit those of `embed` on it
alone. Neither reads nor returns cache rows, so an embedding never touches the pages of the
sequences being generated. The pooling itself (and the L2 norm) runs on the host
(zinc.engine.embeddings): the last row, the first or the mean are one numpy line on a [T, d] array
that is small beside the step.
Imports: zinc.artifact (CTX_ALIGN), zinc.compiler (graph, emitter), zinc.model.hparams.
"""

from __future__ import annotations

from zinc.artifact import CTX_ALIGN
from zinc.compiler.emitter import ModuleEmitter
from zinc.compiler.graph import _Entry
from zinc.model.hparams import HParams, ModelDescription

POOLINGS = ("mean", "cls", "last")  # the pooling types an `embed` entry serves (not rank: a classifier head)


def pools(hp: HParams) -> bool:
    """Whether the model declares a pooling `embed` serves."""
    return hp.pooling in POOLINGS


class EmbedEntry(_Entry):
    """`embed` (`segments` 0): a prefill from position 0 whose attention sees only its own rows,
    returning the normalized hidden state of every token; `embed_x{segments}`: that many inputs
    in one call."""

    def __init__(self, mod: ModuleEmitter, desc: ModelDescription, segments: int = 0) -> None:
        super().__init__(mod, desc, batch=0, segments=segments)

    def text(self, name: str) -> str:
        hp, b = self.hp, self.b
        d = hp.embedding_length
        b.emit("%c0 = arith.constant 0 : index")
        b.emit(f"%align = arith.constant {CTX_ALIGN} : index")
        b.emit(f"%align1 = arith.constant {CTX_ALIGN - 1} : index")
        b.emit("%zero_row = arith.constant 0.0 : f32")
        b.emit("%start = arith.constant 0 : index")  # positions 0..T-1 (each segment's): RoPE and the causal mask
        x, _ = self.trunk()  # the K/V rows are not returned: the compiler drops them
        w = self.vector("output_norm.weight", d)
        x = b.rmsnorm(x, w, d, hp.layer_norm_rms_epsilon, "result_norm")
        act = f"tensor<{b.t}x{d}xf32>"
        b.emit(f"return {x} : {act}")
        args = ["%ids: tensor<?xi32>"]
        if self.segments:
            args += ["%pos: tensor<?xi32>", *(f"%off{i}: index, %len{i}: index" for i in range(self.segments))]
        return "\n".join([f"func.func @{name}({', '.join(args)}) -> {act} {{", *b.lines, "}"])

    def context_kv(self, il: int, new_kv: list[str]) -> tuple[str, str]:
        """Only this call's rows, by position (nothing is cached before them)."""
        return self._aligned(new_kv[0]), self._aligned(new_kv[1])

    def segment_context(self, i: int, il: int, new: list[str]) -> tuple[str, str, str]:
        """Segment i's own rows only, from position 0."""
        return self._aligned(new[0]), self._aligned(new[1]), "%start"

    def _aligned(self, rows: str) -> str:
        """On the CPU, K or V rows [T, Hkv, hd] padded with zero rows to a multiple of CTX_ALIGN,
        as a prefill's ctx is: its attention reads keys in blocks of that many (the padding lies
        past every query's position, so it is masked). Vulkan's linalg attention takes any T. Zeros
        with the rows inserted, not a tensor.pad: with a pad here the CPU's embeddings came out
        wrong (IREE 3.13), though a pad before the attention alone was right."""
        b, hp = self.b, self.hp
        if not self.mod.tiled:
            return rows
        ty = f"tensor<?x{hp.head_count_kv}x{hp.key_length}xf32>"
        n, up, blocks, width, empty, zeros, out = (
            b.fresh(h) for h in ("n", "up", "blocks", "width", "empty", "zeros", "aligned")
        )
        b.emit(f"{n} = tensor.dim {rows}, %c0 : {ty}")
        b.emit(f"{up} = arith.addi {n}, %align1 : index")
        b.emit(f"{blocks} = arith.divui {up}, %align : index")
        b.emit(f"{width} = arith.muli {blocks}, %align : index")
        b.emit(f"{empty} = tensor.empty({width}) : {ty}")
        b.emit(f"{zeros} = linalg.fill ins(%zero_row : f32) outs({empty} : {ty}) -> {ty}")
        b.emit(f"{out} = tensor.insert_slice {rows} into {zeros}[0, 0, 0] [{n}, {hp.head_count_kv}, {hp.key_length}] [1, 1, 1] : {ty} into {ty}")
        return out
