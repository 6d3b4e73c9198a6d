"""The model description: hyperparameters and expected tensors, read from GGUF metadata.

Owns: `HParams` (field names mirror GGUF's `{arch}.*` keys, `pooling_type` included; the layer recipe's switches — RoPE
mode, biases, QK-norm, post-norms, GELU, sliding windows, scales — are fields too, so the compiled
graph and the numpy reference read one description), `ModelDescription` (hparams plus the quant
type of every tensor the graph reads), the architecture registry, `with_pooling` (the operator's pooling over the GGUF's), `base_hparams` (the keys every
architecture shares) and `rope_freq_factors` (Llama 3's `rope_freqs.weight`, the one tensor whose
values the description holds). An architecture module (llama, qwen, gemma3) provides `hparams(meta)`
and `tensors(hp)`; the graph itself lives in zinc.compiler.
Imports: zinc.model.gguf_file, zinc.errors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from zinc.errors import GGUFError, UnsupportedModelError
from zinc.model.gguf_file import GGUFModel

POOLING_TYPES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}  # llama_pooling_type
POOLING_IDS = {name: value for value, name in POOLING_TYPES.items()}


@dataclass(frozen=True)
class HParams:
    architecture: str
    vocab_size: int
    embedding_length: int  # n_embd
    block_count: int  # n_layer
    head_count: int  # n_head
    head_count_kv: int  # n_head_kv
    key_length: int  # head_dim
    feed_forward_length: int  # n_ff
    layer_norm_rms_epsilon: float
    rope_freq_base: float
    rope_dimension_count: int  # rotated dims per head (n_rot)
    context_length: int  # trained context
    tied_output: bool  # logits use token_embd when there is no output.weight
    # the layer recipe (defaults: llama)
    rope_type: str = "norm"  # "norm": adjacent pairs (llama); "neox": first half with second half
    rope_freq_scale: float = 1.0  # linear RoPE scaling (1 / rope.scaling.factor), global layers only
    rope_freq_base_swa: float = 0.0  # sliding-window layers' RoPE base (0: rope_freq_base)
    # per-pair RoPE frequency divisors, n_rot/2 of them (Llama 3.1/3.2's `rope_freqs.weight`):
    # pair i turns by pos * base^(-2i/n_rot) / rope_freq_factors[i] (llama.cpp's freq_factors); (): none
    rope_freq_factors: tuple[float, ...] = ()
    sliding_window: int = 0  # attention.sliding_window: keys at distance >= this are masked (0: none)
    sliding_window_pattern: int = 0  # every Nth layer (il % N == N - 1) is global, the rest windowed
    attention_scale: float = 0.0  # query scale before q.k (0: 1 / sqrt(key_length))
    embedding_scale: float = 1.0  # token embeddings are multiplied by this (Gemma: sqrt(n_embd))
    final_logit_softcapping: float = 0.0  # logits = c * tanh(logits / c) (0: none)
    attn_qkv_bias: bool = False  # attn_q/k/v.bias added after the projections (qwen2)
    attn_qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE (qwen3, gemma3)
    post_norms: bool = False  # post_attention_norm and post_ffw_norm before each residual (gemma3)
    ffn_activation: str = "silu"  # gated FFN activation: "silu" (SwiGLU) or "gelu" (tanh GELU)
    # {arch}.pooling_type, llama.cpp's enum (POOLING_TYPES): how an embedding model pools its
    # final hidden states; 0 (none) for a chat model. A pooling model's artifact has `embed`.
    pooling_type: int = 0

    @property
    def pooling(self) -> str:
        """The pooling's name ("none", "mean", "cls", "last" or "rank"; "unknown" past the enum)."""
        return POOLING_TYPES.get(self.pooling_type, "unknown")

    def is_swa(self, il: int) -> bool:
        """Whether layer `il` uses the sliding window (llama.cpp's set_swa_pattern, dense last)."""
        n = self.sliding_window_pattern
        return self.sliding_window > 0 and (n == 0 or il % n < n - 1)

    def window(self, il: int) -> int:
        """Layer `il`'s attention window (0: none)."""
        return self.sliding_window if self.is_swa(il) else 0

    def rope_base(self, il: int) -> float:
        if self.is_swa(il):
            return self.rope_freq_base_swa or self.rope_freq_base
        return self.rope_freq_base

    def rope_scale(self, il: int) -> float:
        return 1.0 if self.is_swa(il) else self.rope_freq_scale

    def q_scale(self) -> float:
        return self.attention_scale or float(self.key_length) ** -0.5

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> HParams:
        fields = dict(d)
        if "rope_freq_factors" in fields:  # a JSON list; the dataclass is frozen and hashable
            fields["rope_freq_factors"] = tuple(float(x) for x in fields["rope_freq_factors"])
        return HParams(**fields)


@dataclass(frozen=True)
class ExpectedTensor:
    name: str
    ne: tuple[int, ...]  # GGML order: ne[0] is the contiguous dimension


@dataclass(frozen=True)
class ModelDescription:
    hparams: HParams
    tensor_types: dict[str, str] = field(default_factory=dict)  # GGUF name -> GGML type name


@dataclass(frozen=True)
class Architecture:
    name: str
    hparams: Callable[[GGUFModel], HParams]
    tensors: Callable[[HParams], list[ExpectedTensor]]


_ARCHITECTURES: dict[str, Architecture] = {}


def register(arch: Architecture) -> Architecture:
    _ARCHITECTURES[arch.name] = arch
    return arch


def supported_architectures() -> tuple[str, ...]:
    from zinc.model import gemma3, llama, qwen  # noqa: F401  (they register themselves)

    return tuple(sorted(_ARCHITECTURES))


def meta_int(model: GGUFModel, key: str, default: int | None = None) -> int:
    v = model.metadata.get(key, default)
    if v is None:
        raise GGUFError(f"{model.path}: GGUF metadata lacks {key}")
    if isinstance(v, list):  # per-layer arrays: zinc needs them uniform
        if len(set(v)) != 1:
            raise UnsupportedModelError(f"{key} varies per layer ({v[:4]}...), which zinc does not support")
        v = v[0]
    return int(v)


def meta_float(model: GGUFModel, key: str, default: float | None = None) -> float:
    v = model.metadata.get(key, default)
    if v is None:
        raise GGUFError(f"{model.path}: GGUF metadata lacks {key}")
    return float(v)


def meta_str(model: GGUFModel, key: str, default: str) -> str:
    v = model.metadata.get(key, default)
    return v if isinstance(v, str) else default


def base_hparams(model: GGUFModel, arch: str, **recipe: Any) -> HParams:
    """The hyperparameters every architecture reads from `{arch}.*` keys, plus its recipe fields."""
    a = arch
    n_embd = meta_int(model, f"{a}.embedding_length")
    n_head = meta_int(model, f"{a}.attention.head_count")
    head_dim = meta_int(model, f"{a}.attention.key_length", n_embd // n_head)
    if meta_int(model, f"{a}.attention.value_length", head_dim) != head_dim:
        raise UnsupportedModelError(
            f"{a}.attention.value_length differs from key_length, which zinc does not support"
        )
    tokens = model.metadata.get("tokenizer.ggml.tokens")
    n_vocab = meta_int(model, f"{a}.vocab_size", len(tokens) if isinstance(tokens, list) else None)
    fields: dict[str, Any] = {
        "architecture": a,
        "vocab_size": n_vocab,
        "embedding_length": n_embd,
        "block_count": meta_int(model, f"{a}.block_count"),
        "head_count": n_head,
        "head_count_kv": meta_int(model, f"{a}.attention.head_count_kv", n_head),
        "key_length": head_dim,
        "feed_forward_length": meta_int(model, f"{a}.feed_forward_length"),
        "layer_norm_rms_epsilon": meta_float(model, f"{a}.attention.layer_norm_rms_epsilon", 1e-5),
        "rope_freq_base": meta_float(model, f"{a}.rope.freq_base", 10000.0),
        "rope_dimension_count": meta_int(model, f"{a}.rope.dimension_count", head_dim),
        "context_length": meta_int(model, f"{a}.context_length", 2048),
        "tied_output": "output.weight" not in model.tensors,
        "rope_freq_scale": rope_scaling(model, a),
        "pooling_type": meta_int(model, f"{a}.pooling_type", 0),
        **recipe,
    }
    hp = HParams(**fields)
    if hp.head_count_kv <= 0 or hp.head_count % hp.head_count_kv:
        raise UnsupportedModelError(
            f"{a}: {hp.head_count} query heads do not group over {hp.head_count_kv} KV heads"
        )
    if hp.rope_type == "neox" and hp.rope_dimension_count != hp.key_length:
        raise UnsupportedModelError(
            f"{a}: NEOX RoPE over {hp.rope_dimension_count} of {hp.key_length} head dims is not supported"
        )
    return hp


def rope_scaling(model: GGUFModel, arch: str) -> float:
    """The linear RoPE frequency scale from `{arch}.rope.scaling.*` (1.0 when there is none)."""
    kind = meta_str(model, f"{arch}.rope.scaling.type", "none")
    factor = meta_float(model, f"{arch}.rope.scaling.factor", 0.0)
    if kind == "none" or factor in (0.0, 1.0):
        return 1.0
    if kind != "linear":
        raise UnsupportedModelError(
            f"{arch}.rope.scaling.type {kind!r} is not supported (zinc supports linear)"
        )
    return 1.0 / factor


ROPE_FREQS = "rope_freqs.weight"


def rope_freq_factors(model: GGUFModel, n_rot: int) -> tuple[float, ...]:
    """Llama 3.1/3.2's per-pair RoPE frequency divisors from `rope_freqs.weight` (n_rot/2 F32
    values, as llama.cpp's converter writes them for rope_type llama3), or () when it is absent."""
    info = model.tensors.get(ROPE_FREQS)
    if info is None:
        return ()
    if info.ne != (n_rot // 2,):
        raise GGUFError(f"{model.path}: tensor {ROPE_FREQS} has shape {list(info.ne)}, expected [{n_rot // 2}]")
    if info.type_name != "F32":
        raise UnsupportedModelError(f"tensor {ROPE_FREQS} is {info.type_name}; zinc reads vectors as F32 only")
    factors = model.read_f32(ROPE_FREQS)
    if not all(math.isfinite(f) and f > 0 for f in factors):
        raise GGUFError(f"{model.path}: tensor {ROPE_FREQS} holds a factor that is not a positive number")
    return factors


def with_pooling(desc: ModelDescription, pooling: str | None) -> ModelDescription:
    """`desc` with the operator's pooling (a POOLING_TYPES name) in place of the GGUF's; None: as is."""
    if pooling is None:
        return desc
    if pooling not in POOLING_IDS:
        raise UnsupportedModelError(f"pooling {pooling!r} is not one of {', '.join(POOLING_IDS)}")
    return replace(desc, hparams=replace(desc.hparams, pooling_type=POOLING_IDS[pooling]))


def describe(model: GGUFModel) -> ModelDescription:
    """Hyperparameters and tensor types for a GGUF, checked against what its architecture needs."""
    supported = supported_architectures()
    arch = _ARCHITECTURES.get(model.architecture)
    if arch is None:
        raise UnsupportedModelError(
            f"architecture {model.architecture!r} is not supported (zinc supports: {', '.join(supported)})"
        )
    hp = arch.hparams(model)
    types: dict[str, str] = {}
    for t in arch.tensors(hp):
        info = model.tensors.get(t.name)
        if info is None:
            raise GGUFError(f"{model.path}: tensor {t.name} is missing")
        if info.ne != t.ne:
            raise GGUFError(f"{model.path}: tensor {t.name} has shape {list(info.ne)}, expected {list(t.ne)}")
        if len(t.ne) == 1 and info.type_name != "F32":  # norms and biases are bound as f32 vectors
            raise UnsupportedModelError(
                f"tensor {t.name} is {info.type_name}; zinc reads vectors as F32 only"
            )
        types[t.name] = info.type_name
    return ModelDescription(hparams=hp, tensor_types=types)
