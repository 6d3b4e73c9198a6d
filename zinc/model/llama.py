"""The `llama` architecture (SmolLM2 is one): hyperparameters and expected tensors.

Pre-norm decoder: RMSNorm, attention with RoPE on adjacent pairs (GGUF's llama q/k weights are
permuted for it) and grouped KV heads, RMSNorm, SwiGLU feed-forward; logits from `output.weight`
or, when absent, the tied `token_embd.weight`.
Imports: zinc.model.hparams, zinc.model.gguf_file.
"""

from __future__ import annotations

from zinc.model.gguf_file import GGUFModel
from zinc.model.hparams import Architecture, ExpectedTensor, HParams, meta_float, meta_int, register

ARCH = "llama"


def hparams(model: GGUFModel) -> HParams:
    a = ARCH
    n_embd = meta_int(model, f"{a}.embedding_length")
    n_head = meta_int(model, f"{a}.attention.head_count")
    head_dim = meta_int(model, f"{a}.attention.key_length", n_embd // n_head)
    tokens = model.metadata.get("tokenizer.ggml.tokens")
    n_vocab = meta_int(model, f"{a}.vocab_size", len(tokens) if isinstance(tokens, list) else None)
    return HParams(
        architecture=a,
        vocab_size=n_vocab,
        embedding_length=n_embd,
        block_count=meta_int(model, f"{a}.block_count"),
        head_count=n_head,
        head_count_kv=meta_int(model, f"{a}.attention.head_count_kv", n_head),
        key_length=head_dim,
        feed_forward_length=meta_int(model, f"{a}.feed_forward_length"),
        layer_norm_rms_epsilon=meta_float(model, f"{a}.attention.layer_norm_rms_epsilon", 1e-5),
        rope_freq_base=meta_float(model, f"{a}.rope.freq_base", 10000.0),
        rope_dimension_count=meta_int(model, f"{a}.rope.dimension_count", head_dim),
        context_length=meta_int(model, f"{a}.context_length", 2048),
        tied_output="output.weight" not in model.tensors,
    )


def tensors(hp: HParams) -> list[ExpectedTensor]:
    d, hd, ff = hp.embedding_length, hp.key_length, hp.feed_forward_length
    out = [
        ExpectedTensor("token_embd.weight", (d, hp.vocab_size)),
        ExpectedTensor("output_norm.weight", (d,)),
    ]
    if not hp.tied_output:
        out.append(ExpectedTensor("output.weight", (d, hp.vocab_size)))
    for i in range(hp.block_count):
        p = f"blk.{i}."
        out += [
            ExpectedTensor(p + "attn_norm.weight", (d,)),
            ExpectedTensor(p + "attn_q.weight", (d, hp.head_count * hd)),
            ExpectedTensor(p + "attn_k.weight", (d, hp.head_count_kv * hd)),
            ExpectedTensor(p + "attn_v.weight", (d, hp.head_count_kv * hd)),
            ExpectedTensor(p + "attn_output.weight", (hp.head_count * hd, d)),
            ExpectedTensor(p + "ffn_norm.weight", (d,)),
            ExpectedTensor(p + "ffn_gate.weight", (d, ff)),
            ExpectedTensor(p + "ffn_up.weight", (d, ff)),
            ExpectedTensor(p + "ffn_down.weight", (ff, d)),
        ]
    return out


LLAMA = register(Architecture(ARCH, hparams, tensors))
