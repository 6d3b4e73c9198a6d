"""The `qwen2` and `qwen3` architectures: llama's layer with NEOX RoPE, plus their one difference.

qwen2 adds biases to the q/k/v projections (`attn_q.bias`, ...); qwen3 has no biases and instead
normalizes each query and key head with RMSNorm (`attn_q_norm`, `attn_k_norm`) before RoPE, with
a head size (`attention.key_length`) that need not be n_embd / n_head. Both rotate the first half
of each head against the second (llama.cpp's NEOX mode) and may tie or untie the output.
Imports: zinc.model.hparams, zinc.model.llama, zinc.model.gguf_file.
"""

from __future__ import annotations

from zinc.model.gguf_file import GGUFModel
from zinc.model.hparams import Architecture, HParams, base_hparams, register
from zinc.model.llama import tensors


def qwen2_hparams(model: GGUFModel) -> HParams:
    return base_hparams(model, "qwen2", rope_type="neox", attn_qkv_bias=True)


def qwen3_hparams(model: GGUFModel) -> HParams:
    return base_hparams(model, "qwen3", rope_type="neox", attn_qk_norm=True)


QWEN2 = register(Architecture("qwen2", qwen2_hparams, tensors))
QWEN3 = register(Architecture("qwen3", qwen3_hparams, tensors))
