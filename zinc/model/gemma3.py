"""The `gemma3` architecture (Gemma 3 270M is one): hyperparameters and expected tensors.

The recipe, as llama.cpp's gemma3 graph runs it: token embeddings scaled by sqrt(n_embd); per
layer RMSNorm -> q/k/v -> per-head RMSNorm of q and k (`attn_q_norm`, `attn_k_norm`) -> NEOX RoPE
-> attention -> `post_attention_norm` -> residual -> `ffn_norm` -> GELU(tanh)-gated FFN ->
`post_ffw_norm` -> residual; output_norm, tied logits, optional final logit softcapping.
Norm weights are used as stored: llama.cpp's converter already adds Gemma's +1 to them.
Local and global layers: with `attention.sliding_window` set, every `sliding_window_pattern`-th
layer (default 6: layers 5, 11, 17, ...) is global and the rest attend to the last `sliding_window`
positions only; local layers rotate with `rope.freq_base_swa` (default 10000) and no scaling,
global ones with `rope.freq_base` and the linear `rope.scaling.factor` if any.
The query scale is 1/sqrt(query_pre_attn_scalar): the head size, except for the 62-layer 27B
model (n_embd / n_head), as llama.cpp decides, unless the GGUF states the scalar.
Imports: zinc.model.hparams, zinc.model.llama, zinc.model.gguf_file, zinc.errors.
"""

from __future__ import annotations

import math

from zinc.errors import UnsupportedModelError
from zinc.model.gguf_file import GGUFModel
from zinc.model.hparams import Architecture, HParams, base_hparams, meta_float, meta_int, register
from zinc.model.llama import tensors

ARCH = "gemma3"
DEFAULT_SWA_PATTERN = 6
DEFAULT_ROPE_BASE_SWA = 10000.0


def hparams(model: GGUFModel) -> HParams:
    a = ARCH
    n_embd = meta_int(model, f"{a}.embedding_length")
    n_head = meta_int(model, f"{a}.attention.head_count")
    n_layer = meta_int(model, f"{a}.block_count")
    head_dim = meta_int(model, f"{a}.attention.key_length", n_embd // n_head)
    scalar = meta_float(
        model, f"{a}.attention.query_pre_attn_scalar", n_embd / n_head if n_layer == 62 else head_dim
    )
    window = meta_int(model, f"{a}.attention.sliding_window", 0)
    if isinstance(model.metadata.get(f"{a}.attention.sliding_window_pattern"), list):
        raise UnsupportedModelError(
            f"{a}.attention.sliding_window_pattern per layer is not supported (only a period)"
        )
    return base_hparams(
        model,
        a,
        rope_type="neox",
        rope_freq_base_swa=meta_float(model, f"{a}.rope.freq_base_swa", DEFAULT_ROPE_BASE_SWA)
        if window
        else 0.0,
        sliding_window=window,
        sliding_window_pattern=meta_int(model, f"{a}.attention.sliding_window_pattern", DEFAULT_SWA_PATTERN)
        if window
        else 0,
        attention_scale=scalar**-0.5,
        embedding_scale=math.sqrt(n_embd),
        final_logit_softcapping=meta_float(model, f"{a}.final_logit_softcapping", 0.0),
        attn_qk_norm=True,
        post_norms=True,
        ffn_activation="gelu",
    )


GEMMA3 = register(Architecture(ARCH, hparams, tensors))
