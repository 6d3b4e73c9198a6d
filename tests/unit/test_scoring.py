"""Prompt logprobs on the scheduler (zinc.engine.scoring, `Scheduler.score`): on the fake step
model, whose slab checks that every row reads its own history, each scored position's most likely
token is the model's next token after the prompt's tokens before it, with the log-softmax of its
logits; a request decoding meanwhile is undisturbed, and the scratch pages go back to the pool."""

from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import pytest

from tests.unit._fake_step_model import PAGE, VOCAB, WAIT_S, FakeModel, next_token, prompt
from tests.unit.test_scheduler import Run, make, started
from zinc.engine.batcher import Scheduler
from zinc.engine.scoring import rows_logprobs, score_calls, score_prompt
from zinc.engine.sequences import SchedulerStats
from zinc.errors import ContextLengthExceededError, QueueFullError
from zinc.runtime.sampling import token_logprobs

# the fake's logits are one-hot: the greedy token's log-softmax, and every other token's
TOP = 1.0 - math.log(math.e + VOCAB - 1)
REST = -math.log(math.e + VOCAB - 1)


def test_each_position_is_scored_from_the_tokens_before_it_while_a_request_decodes() -> None:
    model = FakeModel()
    scheduler = started(model, prefill_chunk=8)
    try:
        run = Run(scheduler, prompt(1, 12), max_tokens=20)
        ids = prompt(2, 30)
        scored = asyncio.run(score_prompt(scheduler, ids, 3))
        assert [s.token for s in scored] == ids[1:]
        for p, s in enumerate(scored):
            best = next_token(ids[: p + 1])
            assert s.top[0] == (best, pytest.approx(TOP)) and len(s.top) == 3
            assert s.logprob == pytest.approx(TOP if ids[p + 1] == best else REST)
        assert run.wait().reason == "length" and run.exact()
        stored = [c.positions for c in model.calls if c.kind == "rows" and c.tokens == ids[c.positions[0] :][: len(c.tokens)]]
        assert [p for chunk in stored for p in chunk] == list(range(28))  # `prefill_chunk` tokens a call
        assert max(len(chunk) for chunk in stored) == scheduler.prefill_chunk == 8
        ours = [c for c in model.calls if c.kind == "decode" and max(c.positions) < len(ids)]
        steps = [c.positions for c in ours if c.tokens == [ids[p] for p in c.positions]]
        assert [p for step in steps for p in step] == list(range(29)) and max(map(len, steps)) == model.max_batch
        stats = returned(scheduler)
        assert stats.pages.in_use == 0 and stats.pages.free + stats.pages.cached == stats.pages.total
    finally:
        scheduler.close()


def test_short_long_and_crowded_prompts() -> None:
    model = FakeModel(kv_slots=PAGE * 5)  # four pages besides the scratch one: one context
    assert score_calls(model, [5], model_slots(1), 2, 8) == []  # nothing predicts a lone token
    scheduler = make(model)
    with pytest.raises(ContextLengthExceededError):
        asyncio.run(score_prompt(scheduler, prompt(3, model.context_length), 1))
    model.hold_at = 1  # the request's first decode step, its prompt's four pages taken
    scheduler.start()
    try:
        run = Run(scheduler, prompt(5, 60), max_tokens=3)
        assert model.inside.wait(WAIT_S)
        with pytest.raises(QueueFullError):
            asyncio.run(score_prompt(scheduler, prompt(4, 20), 1))
        model.go.set()
        assert run.wait().reason == "length" and run.exact()
        assert scheduler.stats().pages.cached == 3
        assert len(asyncio.run(score_prompt(scheduler, prompt(6, 40), 1))) == 39  # evicts cached pages
        stats = returned(scheduler)
        assert (stats.pages.in_use, stats.pages.free + stats.pages.cached) == (0, 4)
    finally:
        model.go.set()
        scheduler.close()


def returned(scheduler: Scheduler) -> SchedulerStats:
    """The scheduler's stats once no page is in use (scratch pages go back on the loop's thread)."""
    deadline = time.monotonic() + WAIT_S
    while (stats := scheduler.stats()).pages.in_use and time.monotonic() < deadline:
        time.sleep(0.001)
    return stats


def model_slots(n: int) -> list[int]:
    return [PAGE + p for p in range(n)]


@pytest.mark.parametrize("top", [0, 1, 5, 20])
def test_a_steps_rows_at_once_are_token_logprobs_of_each_row(top: int) -> None:
    rng = np.random.default_rng(top)
    logits = (rng.standard_normal((8, 3000)) * 4).astype(np.float32)
    logits[2, [7, 900]] = 30.0  # a tie: the lower id first
    tokens = [int(t) for t in rng.integers(0, 3000, 8)]
    for row, token, got in zip(logits, tokens, rows_logprobs(logits, tokens, top), strict=True):
        logprob, best = token_logprobs(row, token, top)
        assert got.token == token and got.logprob == pytest.approx(logprob, abs=1e-6)
        assert [t for t, _ in got.top] == [t for t, _ in best] and len(got.top) == top
        assert [lp for _, lp in got.top] == pytest.approx([lp for _, lp in best], abs=1e-6)
    if top > 1:
        assert [t for t, _ in rows_logprobs(logits, tokens, top)[2].top[:2]] == [7, 900]
