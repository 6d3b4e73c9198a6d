"""Tier 3: prompt logprobs (zinc.engine.scoring: the prompt's K/V stored 5 tokens a call, then
decode steps of up to `max_batch` rows, one per position) against the float64 reference's logits at every position,
on the CPU and on Vulkan. 15 tokens: several batched steps, and past gemma3's sliding window."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import SessionFactory, device_params, reference_model
from tests.model.test_fixture_numerics import TOL, TOL_Q8
from zinc.engine.scoring import score_calls

PROMPT = [3, 17, 200, 5, 9, 11, 4, 8, 250, 30, 31, 32, 33, 7, 1]


@pytest.mark.parametrize("device", device_params("cpu", "vulkan"))
@pytest.mark.parametrize("fixture", ["tiny-q8-q41", "tiny-gemma3"])
def test_each_prompt_token_is_scored_as_the_reference_predicts_it(
    fixture: str, device: str, tiny_models: dict[str, Path], open_session: SessionFactory
) -> None:
    path = tiny_models[fixture]
    session = open_session(path, device)
    assert session.max_batch < len(PROMPT) - 1
    slots = np.random.default_rng(1).permutation(np.arange(1, 300, dtype=np.int32))[: len(PROMPT)]
    scored = [s for call in score_calls(session, PROMPT, slots, 4, chunk=5) for s in call()]
    ref = reference_model(path, device)
    logits = ref.forward(PROMPT)
    peak = logits.max(axis=1, keepdims=True)
    expect = logits - peak - np.log(np.exp(logits - peak).sum(axis=1, keepdims=True))  # log-softmax
    tol = (TOL_Q8 if ref.q8_activations else TOL) * float(np.abs(logits).max())
    assert [s.token for s in scored] == PROMPT[1:]
    for p, s in enumerate(scored):
        assert s.logprob is not None and abs(s.logprob - expect[p, PROMPT[p + 1]]) < tol, f"position {p}"
        assert len(s.top) == 4 and all(abs(lp - expect[p, t]) < tol for t, lp in s.top), f"position {p}"
        assert expect[p, s.top[0][0]] > expect[p].max() - 2 * tol  # the most likely token, or one tied with it
