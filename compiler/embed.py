"""The `embed` entry point of a pooling model: a whole input's final hidden states, no KV cache.

Owns: `pools(hp)` (whether a model's GGUF declares a pooling that zinc serves: mean, cls or last;
`{arch}.pooling_type`) and `EmbedEntry`, which emits
  embed(ids [T] i32) -> hidden [T, d]
the decoder graph of zinc.compiler.graph over the T tokens at positions 0.. (causal attention over
this call's own K/V rows only), then output_norm on every row; no output head. It neither reads nor
returns cache rows, so an embedding never touches the pages of the sequences being generated. The
pooling itself (and the L2 norm) runs on the host (zinc.engine.embeddings): the last row, the first
or the mean are one numpy line on a [T, d] array that is small beside the step.
Imports: zinc.compiler (graph, emitter), zinc.model.hparams.
"""

from __future__ import annotations

from zinc.compiler.emitter import ModuleEmitter
from zinc.compiler.graph import _Entry
from zinc.model.hparams import HParams, ModelDescription

POOLINGS = ("mean", "cls", "last")  # the pooling types an `embed` entry serves (not rank: a classifier head)


def pools(hp: HParams) -> bool:
    """Whether the model declares a pooling `embed` serves."""
    return hp.pooling in POOLINGS


class EmbedEntry(_Entry):
    """`embed`: a prefill from position 0 whose attention sees only its own rows, returning the
    normalized hidden state of every token."""

    def __init__(self, mod: ModuleEmitter, desc: ModelDescription) -> None:
        super().__init__(mod, desc, batch=0)

    def text(self, name: str) -> str:
        hp, b = self.hp, self.b
        d = hp.embedding_length
        b.emit("%c0 = arith.constant 0 : index")
        b.emit("%start = arith.constant 0 : index")  # positions 0..T-1: RoPE and the causal mask
        x, _ = self.trunk()  # the K/V rows are not returned: the compiler drops them
        w = self.vector("output_norm.weight", d)
        x = b.rmsnorm(x, w, d, hp.layer_norm_rms_epsilon, "result_norm")
        act = f"tensor<{b.t}x{d}xf32>"
        b.emit(f"return {x} : {act}")
        return "\n".join([f"func.func @{name}(%ids: tensor<?xi32>) -> {act} {{", *b.lines, "}"])

    def context_kv(self, il: int, new_kv: list[str]) -> tuple[str, str]:
        """Only this call's rows, by position (nothing is cached before them)."""
        return new_kv[0], new_kv[1]
