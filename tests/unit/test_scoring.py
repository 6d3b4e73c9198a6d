"""Prompt logprobs on the scheduler (zinc.engine.scoring, `Scheduler.score`): on the fake step
model, whose slab checks that every row reads its own history, each scored position's most likely
token is the model's next token after the prompt's tokens before it, with the log-softmax of its
logits; a request decoding meanwhile is undisturbed, and the scratch pages go back to the pool."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.unit._fake_step_model import PAGE, VOCAB, WAIT_S, FakeModel, next_token, prompt
from tests.unit.test_scheduler import Run, make, started
from zinc.engine.scoring import rows_logprobs, score_prompt
from zinc.errors import ContextLengthExceededError, QueueFullError
from zinc.runtime.sampling import token_logprobs

# the fake's logits are one-hot: the greedy token's log-softmax, and every other token's
TOP = 1.0 - math.log(math.e + VOCAB - 1)
REST = -math.log(math.e + VOCAB - 1)


def test_each_position_is_scored_from_the_tokens_before_it_while_a_request_decodes() -> None:
    model = FakeModel()
    scheduler = started(model)
    try:
        run = Run(scheduler, prompt(1, 12), max_tokens=20)
        ids = prompt(2, 30)
        scored = scheduler.score(ids, 3).result(WAIT_S)
        assert [s.token for s in scored] == ids[1:]
        for p, s in enumerate(scored):
            best = next_token(ids[: p + 1])
            assert s.top[0] == (best, pytest.approx(TOP)) and len(s.top) == 3
            assert s.logprob == pytest.approx(TOP if ids[p + 1] == best else REST)
        assert run.wait().reason == "length" and run.exact()
        decode_rows = [len(c.tokens) for c in model.calls if c.kind == "decode" and 0 in c.positions]
        assert decode_rows and max(decode_rows) <= model.max_batch
        stats = scheduler.stats()
        assert stats.pages.in_use == 0 and stats.pages.free + stats.pages.cached == stats.pages.total
    finally:
        scheduler.close()


def test_short_long_and_crowded_prompts() -> None:
    model = FakeModel(kv_slots=PAGE * 5)  # four pages besides the scratch one: one context
    assert score_prompt(model, [5], model_slots(1), 2) == []  # nothing predicts a lone token
    assert model.calls == []
    scheduler = make(model)
    with pytest.raises(ContextLengthExceededError):
        scheduler.score(prompt(3, model.context_length), 1)
    model.hold_at = 0  # the request's prefill: the score waits behind it, its pages all taken
    scheduler.start()
    try:
        run = Run(scheduler, prompt(5, 60), max_tokens=3)
        assert model.inside.wait(WAIT_S)
        crowded = scheduler.score(prompt(4, 20), 1)
        model.go.set()
        with pytest.raises(QueueFullError):
            crowded.result(WAIT_S)
        assert run.wait().reason == "length" and run.exact()
        assert scheduler.stats().pages.cached == 3
        assert len(scheduler.score(prompt(6, 40), 1).result(WAIT_S)) == 39  # evicts cached pages
        stats = scheduler.stats()
        assert (stats.pages.in_use, stats.pages.free + stats.pages.cached) == (0, 4)
    finally:
        model.go.set()
        scheduler.close()


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
