"""Token sampling from logits on the host, and the per-request sampling parameters.

Owns: `SamplingParams` (OpenAI / llama.cpp names, already validated) and `Sampler`. Per token,
in this order:
1. `adjust`: each `logit_bias` is added to its token's logit; then the penalties, counted over
   the last `PENALTY_LAST_N` tokens of the sequence (prompt and generated, as llama.cpp's server
   counts them with its default `repeat_last_n` of 64): `repeat_penalty` divides a positive logit
   of a token seen there and multiplies a negative one, then `frequency_penalty` x its count and
   `presence_penalty` (once) are subtracted from it.
2. the optional boolean `allowed` mask (constrained decoding) removes disallowed tokens.
3. temperature 0 is greedy: the argmax of what is left. Otherwise the logits are divided by the
   temperature and softmaxed;
4. top-k keeps the k most likely tokens (ties by lower id) and renormalizes;
5. top-p and min-p both judge that distribution: a token stays if it is in the smallest prefix,
   most likely first, whose probabilities sum to at least top_p, and its probability is at least
   min_p times the most likely one's (the same as top-p, then min-p on what top-p kept);
6. one draw from what stays, renormalized, with the request's seeded generator (one draw per
   token, so a seed gives the same tokens on every run).
Unlike llama.cpp's default chain, which divides by the temperature last (after top-p and min-p
judged the untempered distribution), temperature comes first here, as in Hugging Face transformers
and vLLM. Greedy decoding never needs the logits: the device computes the argmax, so
`Sampler.needs_logits` is False for plain greedy requests.
`token_logprobs` computes the model's log-probabilities (log-softmax of the raw logits) of the
chosen token and the top alternatives, only for requests that ask for them.
Imports: numpy only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

F32 = np.ndarray[Any, np.dtype[np.float32]]
PENALTY_LAST_N = 64  # the penalties count this many of the sequence's last tokens (llama.cpp's default)
BoolArray = np.ndarray[Any, np.dtype[np.bool_]]


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling controls, already validated and clamped (OpenAI/llama.cpp names)."""

    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)


class Sampler:
    def __init__(self, params: SamplingParams) -> None:
        self.p = params
        self.rng = np.random.default_rng(params.seed)

    @property
    def needs_logits(self) -> bool:
        p = self.p
        return bool(
            p.temperature > 0
            or p.logit_bias
            or p.presence_penalty
            or p.frequency_penalty
            or p.repeat_penalty != 1.0
        )

    def adjust(self, logits: F32, history: Sequence[int]) -> F32:
        """The logits after the logit bias and the penalties (step 1 above), as a new array;
        `history` is the sequence so far (prompt and generated tokens), oldest first."""
        p = self.p
        x = logits.astype(np.float32, copy=True)
        for tok, bias in p.logit_bias.items():
            if 0 <= tok < x.size:
                x[tok] += bias
        if history and (p.repeat_penalty != 1.0 or p.presence_penalty or p.frequency_penalty):
            counts = Counter(history[-PENALTY_LAST_N:])
            ids = np.fromiter(counts.keys(), dtype=np.int64)
            ids = ids[(ids >= 0) & (ids < x.size)]
            if p.repeat_penalty != 1.0:  # llama.cpp: divide positive logits, multiply negative ones
                v = x[ids]
                x[ids] = np.where(v > 0, v / p.repeat_penalty, v * p.repeat_penalty)
            n = np.array([counts[int(i)] for i in ids], dtype=np.float32)
            x[ids] -= p.frequency_penalty * n + p.presence_penalty * (n > 0)
        return x

    def sample(self, logits: F32, history: Sequence[int] = (), allowed: BoolArray | None = None) -> int:
        x = self.adjust(logits, history)
        if allowed is not None:
            n = min(allowed.size, x.size)
            if not allowed[:n].any():
                raise ValueError("the constraint allows no token")
            x[:n][~allowed[:n]] = -np.inf
            x[n:] = -np.inf
        p = self.p
        if p.temperature <= 0:
            return int(np.argmax(x))
        scaled = x.astype(np.float64) / p.temperature
        order = np.argsort(-scaled, kind="stable")
        if p.top_k > 0:
            order = order[: p.top_k]
        z = scaled[order]
        probs = np.exp(z - z[0])
        probs /= probs.sum()
        keep = probs.size
        if p.min_p > 0:
            keep = min(keep, int(np.count_nonzero(probs >= p.min_p * probs[0])))
        if p.top_p < 1.0:
            keep = min(keep, int(np.searchsorted(np.cumsum(probs), p.top_p) + 1))
        probs = probs[: max(keep, 1)]
        return int(order[self.rng.choice(probs.size, p=probs / probs.sum())])


def token_logprobs(logits: F32, token: int, top: int) -> tuple[float, list[tuple[int, float]]]:
    """The log-probability of `token` under the model (log-softmax of the raw logits) and the `top`
    most likely tokens with theirs, most likely first (ties by lower id)."""
    x = logits.astype(np.float64)
    m = float(np.max(x))
    lse = m + float(np.log(np.sum(np.exp(x - m))))
    best: list[tuple[int, float]] = []
    if top > 0:
        k = min(top, x.size)
        idx = np.argpartition(-x, k - 1)[:k]
        idx = idx[np.lexsort((idx, -x[idx]))]
        best = [(int(i), float(x[i]) - lse) for i in idx]
    return float(x[token]) - lse, best
