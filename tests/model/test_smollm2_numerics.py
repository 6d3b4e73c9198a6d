"""Tier 3 on the real model: compiled SmolLM2 against the float64 numpy reference (CPU)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import SessionFactory, reference_model

pytestmark = pytest.mark.slow
TOL = 1e-4  # max |logit error| / max |logit|: f32 kernels over 30 layers vs float64
TOL_Q8 = 5e-2  # Q8 activations through 30 layers (CPU on AVX2), see tests/conftest.py


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
