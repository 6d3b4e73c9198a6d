"""Prompt logprobs: how the model predicts each token of a prompt from the tokens before it (the
`echo` with `logprobs` of /v1/completions, which evaluation harnesses score text with).

Owns: `score_prompt` — the prompt's K/V rows stored by `prefill_rows`, then batched decode steps
of up to `max_batch` rows, row i being the prompt's token at position p with the slots of
positions 0..p: the computation a decode step at p runs when generating, so row i's logits are
the model's distribution for the token at p + 1, whose logprob (log-softmax of the raw logits,
as generated tokens' logprobs) and `top` alternatives it gives (`rows_logprobs`: a step's rows
at once). Each row rewrites its own
position's K/V; the rows after it in the same step read the stored ones, so the order of rows
does not matter.
Imports: zinc.engine (generate, kv_pages, sequences), numpy, the stdlib.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from zinc.engine.generate import Sampled
from zinc.engine.kv_pages import Slots
from zinc.engine.sequences import StepModel


def score_prompt(model: StepModel, ids: Sequence[int], slots: Slots, top: int) -> list[Sampled]:
    """Each of ids[1:] with its logprob after the tokens before it and the `top` most likely
    tokens there; `slots` are the slots of positions 0..len(ids)-1 (scratch pages)."""
    n = len(ids) - 1  # positions whose next token is scored
    if n < 1:
        return []
    if n > 1:
        model.prefill_rows(ids[: n - 1], 0, slots[: n - 1])  # what the rows at 1..n-1 read
    out: list[Sampled] = []
    for start in range(0, n, model.max_batch):
        positions = list(range(start, min(n, start + model.max_batch)))
        step = model.decode_batch([ids[p] for p in positions], positions, [slots[: p + 1] for p in positions])
        rows = np.stack([step.logits(i) for i in range(len(positions))])
        out += rows_logprobs(rows, [ids[p + 1] for p in positions], top)
    return out


def rows_logprobs(logits: np.ndarray[Any, Any], tokens: Sequence[int], top: int) -> list[Sampled]:
    """`token_logprobs` (zinc.runtime.sampling) of each row at once: log-softmax with the
    exponentials in f32 summed in float64 (within 1e-6 of float64 throughout, at a tenth of its
    time), and each row's `top` tokens, most likely first (ties by lower id), by `top` argmax
    passes (partitioning the rows took longer than the decode step)."""
    work = np.array(logits, dtype=np.float32)
    peak = work.max(axis=1, keepdims=True)
    lse = peak[:, 0].astype(np.float64) + np.log(np.exp(work - peak).sum(axis=1, dtype=np.float64))
    rows = np.arange(len(work))
    best = []
    for _ in range(min(top, work.shape[1])):
        pick = work.argmax(axis=1)  # the first of equal maxima: the lower id
        best.append(pick)
        work[rows, pick] = -np.inf
    picks = np.stack(best, axis=1) if best else np.zeros((len(work), 0), np.intp)
    return [
        Sampled(token, float(row[token]) - z, tuple((int(i), float(row[i]) - z) for i in idx))
        for row, z, token, idx in zip(logits, lse.tolist(), tokens, picks, strict=True)
    ]
