"""Tier 3: long prompts in full prefill calls on a model with wide K/V rows, against the float64
reference.

The fixture has Llama 3.2 1B's K/V width (4 KV heads of 128 here: 1,024 floats a token and layer),
so a prefill call of 128 tokens stores 131,072 floats of each layer. On lavapipe a scatter that one
invocation runs stops after 64,158 of them (its loops end after 65,535 iterations in all): before
`kv_write`'s scatter was spread over workgroups (compiler/paged.py) a Vulkan prefill call of such a
model took 63 tokens, and even those lost their last 354 floats of each layer (the logits here
were 2e-2 off). A 240-token prompt now takes calls of 128 and 112 tokens on every target; its last
logits (whose attention reads the first call's rows from the slab) and the next decode steps'
(which read all of them) must be the reference's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.make_fixtures import TinyLlama, write_fixture
from tests.conftest import ONE_SEQUENCE, SessionFactory, device_params, reference_model
from tests.model.test_fixture_numerics import TOL, TOL_Q8, rel_err
from zinc.artifact import PREFILL_ROWS

WIDE = TinyLlama(
    "tiny-wide-kv", {"embd": "Q8_0", "attn": "Q8_0", "ffn": "Q4_1", "output": "Q8_0"},
    n_embd=512, n_head=4, n_head_kv=4, seed=10,
)  # fmt: skip


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fixture(WIDE, tmp_path_factory.mktemp("wide") / f"{WIDE.name}.gguf")


@pytest.mark.parametrize("device", device_params("vulkan"))
def test_a_long_prompt_in_full_prefill_calls(device: str, wide: Path, open_session: SessionFactory) -> None:
    session = open_session(wide, device, ONE_SEQUENCE)
    assert session.chunk_tokens == PREFILL_ROWS
    ref = reference_model(wide, device)
    tol = TOL_Q8 if ref.q8_activations else TOL
    prompt = [(i * 37) % 300 + 1 for i in range(240)]  # the fixture's context is 256
    step = session.prefill(prompt)
    assert rel_err(step.logits(), ref.forward(prompt)[-1]) < tol
    pos = len(prompt)
    for token in (7, 100, 42):
        step = session.decode(token, pos)
        assert rel_err(step.logits(), ref.forward([token])[-1]) < tol, f"decode at position {pos}"
        pos += 1
