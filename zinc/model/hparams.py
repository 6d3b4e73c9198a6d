"""The model description: hyperparameters and expected tensors, read from GGUF metadata.

Owns: `HParams` (field names mirror GGUF's `{arch}.*` keys), `ModelDescription` (hparams plus the
quant type of every tensor the graph reads) and the architecture registry. An architecture
module provides `hparams(meta)` and `tensors(hp)`; the graph itself lives in zinc.compiler.
Imports: zinc.model.gguf_file, zinc.errors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from zinc.errors import GGUFError, UnsupportedModelError
from zinc.model.gguf_file import GGUFModel


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> HParams:
        return HParams(**d)


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
    from zinc.model import llama  # noqa: F401  (registers itself)

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
        types[t.name] = info.type_name
    return ModelDescription(hparams=hp, tensor_types=types)
