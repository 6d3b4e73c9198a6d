"""The `llama` architecture (SmolLM2 is one): hyperparameters and expected tensors.

Pre-norm decoder: RMSNorm, attention with RoPE on adjacent pairs (GGUF's llama q/k weights are
permuted for it; Llama 3.1/3.2 divide each pair's frequency by the F32 `rope_freqs.weight`, which
the description reads into `HParams.rope_freq_factors`) and grouped KV heads, RMSNorm, SwiGLU
feed-forward; logits from `output.weight` or, when absent, the tied `token_embd.weight`. `attention_tensors`/`ffn_tensors` are the layer
tensors that qwen2, qwen3 and gemma3 share with it.
Imports: zinc.model.hparams, zinc.model.gguf_file, zinc.errors.
"""

from __future__ import annotations

import dataclasses

from zinc.errors import UnsupportedModelError
from zinc.model.gguf_file import GGUFModel
from zinc.model.hparams import (
    ROPE_FREQS,
    Architecture,
    ExpectedTensor,
    HParams,
    base_hparams,
    register,
    rope_freq_factors,
)

ARCH = "llama"


def hparams(model: GGUFModel) -> HParams:
    hp = base_hparams(model, ARCH)
    if hp.rope_freq_scale != 1.0:
        raise UnsupportedModelError("llama with rope scaling is not supported yet")
    return dataclasses.replace(hp, rope_freq_factors=rope_freq_factors(model, hp.rope_dimension_count))


def output_tensors(hp: HParams) -> list[ExpectedTensor]:
    d = hp.embedding_length
    out = [
        ExpectedTensor("token_embd.weight", (d, hp.vocab_size)),
        ExpectedTensor("output_norm.weight", (d,)),
    ]
    if not hp.tied_output:
        out.append(ExpectedTensor("output.weight", (d, hp.vocab_size)))
    return out


def layer_tensors(hp: HParams, il: int) -> list[ExpectedTensor]:
    """Layer `il`'s tensors, with the recipe's extras (biases, QK-norm weights, post-norms)."""
    d, hd, ff = hp.embedding_length, hp.key_length, hp.feed_forward_length
    nq, nkv = hp.head_count * hd, hp.head_count_kv * hd
    p = f"blk.{il}."
    out = [
        ExpectedTensor(p + "attn_norm.weight", (d,)),
        ExpectedTensor(p + "attn_q.weight", (d, nq)),
        ExpectedTensor(p + "attn_k.weight", (d, nkv)),
        ExpectedTensor(p + "attn_v.weight", (d, nkv)),
        ExpectedTensor(p + "attn_output.weight", (nq, d)),
        ExpectedTensor(p + "ffn_norm.weight", (d,)),
        ExpectedTensor(p + "ffn_gate.weight", (d, ff)),
        ExpectedTensor(p + "ffn_up.weight", (d, ff)),
        ExpectedTensor(p + "ffn_down.weight", (ff, d)),
    ]
    if hp.attn_qkv_bias:
        out += [
            ExpectedTensor(p + "attn_q.bias", (nq,)),
            ExpectedTensor(p + "attn_k.bias", (nkv,)),
            ExpectedTensor(p + "attn_v.bias", (nkv,)),
        ]
    if hp.attn_qk_norm:
        out += [
            ExpectedTensor(p + "attn_q_norm.weight", (hd,)),
            ExpectedTensor(p + "attn_k_norm.weight", (hd,)),
        ]
    if hp.post_norms:
        out += [
            ExpectedTensor(p + "post_attention_norm.weight", (d,)),
            ExpectedTensor(p + "post_ffw_norm.weight", (d,)),
        ]
    return out


def tensors(hp: HParams) -> list[ExpectedTensor]:
    out = output_tensors(hp)
    if hp.rope_freq_factors:
        out.append(ExpectedTensor(ROPE_FREQS, (hp.rope_dimension_count // 2,)))
    for il in range(hp.block_count):
        out += layer_tensors(hp, il)
    return out


LLAMA = register(Architecture(ARCH, hparams, tensors))
