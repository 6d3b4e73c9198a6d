"""Tier 3 on the real model: compiled SmolLM2 against the float64 numpy reference (CPU)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import SessionFactory, reference_model

pytestmark = pytest.mark.slow
TOL = 1e-4  # max |logit error| / max |logit|: f32 kernels over 30 layers vs float64
# Q8 activations through 30 layers (the CPU), see tests/conftest.py: the drift is chaotic, not a
# bound of the kernels' error. With the linalg prefill attention it was 4.4e-2, and 7.1e-2 with its
# query scale changed by 1e-6; the flash attention's (rounding differently, 1e-7) is 6.6e-2.
TOL_Q8 = 1e-1


def test_smollm2_matches_reference(smollm2: Path, open_session: SessionFactory) -> None:
    session = open_session(smollm2, "cpu")
    ref = reference_model(smollm2, "cpu")
    prompt = [504, 3575, 282, 4649, 314]  # "The capital of France is"
    step = session.prefill(prompt)
    expect = ref.forward(prompt)[-1]
    logits = step.logits()
    assert np.abs(logits - expect).max() / np.abs(expect).max() < (TOL_Q8 if ref.q8_activations else TOL)
    assert step.token == int(np.argmax(expect)) == 7042  # " Paris"
    pos = len(prompt)
    for token in (7042, 30):
        step = session.decode(token, pos)
        pos += 1
        expect = ref.forward([token])[-1]
        assert np.abs(step.logits() - expect).max() / np.abs(expect).max() < (TOL_Q8 if ref.q8_activations else TOL)
