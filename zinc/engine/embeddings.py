"""Embeddings: pooling a model's final hidden states into one normalized vector per input.

Owns: `pool` (llama.cpp's pooling types: "mean" over every token, "cls" the first token's,
"last" the last token's, as Qwen3-Embedding declares), `normalize` (Matryoshka truncation to
`dimensions`, then the L2 norm: a truncated vector is renormalized, as such models expect),
`Embeddings` (the vectors and the tokens they took), `packs` (a request's inputs grouped, in order,
into the device calls that embed them: several short inputs per call where the artifact packs
them) and the `Embedder` protocol: what the server needs from an engine that embeds
(zinc.engine.engine.LocalEngine; EngineManager forwards it). The hidden states come from the
session's `embed` or `embed_packed` calls, run on the scheduler's thread like every device call.
Imports: numpy, the stdlib.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

Vector = np.ndarray[Any, np.dtype[np.float32]]
POOLINGS = ("mean", "cls", "last")


def pool(hidden: np.ndarray[Any, Any], pooling: str) -> Vector:
    """One vector [d] from the hidden states [T, d] of an input's T tokens."""
    if hidden.ndim != 2 or hidden.shape[0] == 0:
        raise ValueError(f"pooling needs the hidden states of at least one token, not shape {hidden.shape}")
    if pooling == "mean":
        out = hidden.mean(axis=0, dtype=np.float64)
    elif pooling == "cls":
        out = hidden[0]
    elif pooling == "last":
        out = hidden[-1]
    else:
        raise ValueError(f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
    return np.asarray(out, dtype=np.float32)


def normalize(vector: np.ndarray[Any, Any], dimensions: int | None = None) -> Vector:
    """`vector`'s first `dimensions` values (all: None), scaled to unit L2 norm (a zero vector
    stays zero)."""
    v = np.asarray(vector[:dimensions] if dimensions else vector, dtype=np.float64)
    norm = float(np.linalg.norm(v))
    return np.asarray(v / norm if norm > 0 else v, dtype=np.float32)


def packs(lengths: Sequence[int], most: int, tokens: int) -> list[list[int]]:
    """The indices of inputs of these token `lengths`, in order, in groups of at most `most`
    inputs and `tokens` tokens together: each group one device call. An input longer than
    `tokens`, or every input when `most` < 2, is a group alone."""
    groups: list[list[int]] = []
    held = 0  # the tokens of the last group
    for i, n in enumerate(lengths):
        if groups and len(groups[-1]) < most and held + n <= tokens:
            groups[-1].append(i)
            held += n
        else:
            groups.append([i])
            held = n
    return groups


@dataclass(frozen=True)
class Embeddings:
    """One normalized vector per input, in order, and the tokens the inputs held in all."""

    vectors: list[Vector]
    prompt_tokens: int


@runtime_checkable
class Embedder(Protocol):
    """An engine that can embed. `pooling` is the model's ("none": it declares no pooling and
    `embed` refuses); `embedding_length` the vectors' full width."""

    @property
    def pooling(self) -> str: ...

    @property
    def embedding_length(self) -> int: ...

    async def embed(self, inputs: Sequence[Sequence[int]], dimensions: int | None = None) -> Embeddings:
        """Each input's pooled, normalized vector (truncated to `dimensions` first when given)."""
        ...
