"""Prompt logprobs: how the model predicts each token of a prompt from the tokens before it (the
`echo` with `logprobs` of /v1/completions, which evaluation harnesses score text with).

Owns: `score_prompt` — on scratch pages of the scheduler's pool, the prompt's K/V rows stored by
`prefill_rows` (a `prefill_chunk` of tokens a call), then batched decode steps of up to
`max_batch` rows, row i being the prompt's token at position p with the slots of positions
0..p: the computation a decode step at p runs when generating, so row i's logits are the
model's distribution for the token at p + 1, whose logprob (log-softmax of the raw logits, as
generated tokens' logprobs) and `top` alternatives it gives (`rows_logprobs`: a step's rows at
once). Each row rewrites its own position's K/V after the step; the rows read the stored ones,
so their order does not matter. Every chunk and step is a `Scheduler.call` of its own, so the
running requests' steps go on between them (one call for a long prompt held them for seconds);
the pages go back after the last call that may still use them.
Imports: zinc.engine (batcher, generate, kv_pages, sequences), numpy, the stdlib.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from zinc.engine.batcher import Scheduler
from zinc.engine.generate import Sampled
from zinc.engine.kv_pages import Slots
from zinc.engine.sequences import StepModel

Call = Callable[[], list[Sampled]]


async def score_prompt(scheduler: Scheduler, ids: Sequence[int], top: int) -> list[Sampled]:
    """Each of ids[1:] with its logprob after the tokens before it and the `top` most likely
    tokens there; `QueueFullError` when the pool has no pages for it now."""
    pages, slots = scheduler.take_scratch(len(ids))
    try:
        out: list[Sampled] = []
        for call in score_calls(scheduler.model, ids, slots, top, scheduler.prefill_chunk):
            out += await asyncio.wrap_future(scheduler.call(call))
        return out
    finally:
        scheduler.release_scratch(pages)


def score_calls(model: StepModel, ids: Sequence[int], slots: Slots, top: int, chunk: int) -> list[Call]:
    """The device calls that score `ids` on `slots` (the slots of positions 0..len(ids)-1), in order."""
    n = len(ids) - 1  # positions whose next token is scored
    stored = max(0, n - 1)  # positions whose K/V the rows read
    calls: list[Call] = [partial(_store, model, ids[a : min(stored, a + chunk)], a, slots) for a in range(0, stored, chunk)]
    for start in range(0, n, model.max_batch):
        calls.append(partial(_step, model, ids, slots, range(start, min(n, start + model.max_batch)), top))
    return calls


def _store(model: StepModel, ids: Sequence[int], start: int, slots: Slots) -> list[Sampled]:
    model.prefill_rows(ids, start, slots[: start + len(ids)])
    return []


def _step(model: StepModel, ids: Sequence[int], slots: Slots, positions: range, top: int) -> list[Sampled]:
    step = model.decode_batch([ids[p] for p in positions], list(positions), [slots[: p + 1] for p in positions])
    rows = np.stack([step.logits(i) for i in range(len(positions))])
    return rows_logprobs(rows, [ids[p + 1] for p in positions], top)


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
