"""Tier 3: a packed prefill (`ModelSession.prefill_packed`, the CPU's `prefill_x{N}` entries)
against each prompt prefilled on its own.

Several prompts' last chunks go to the device in one call: the matmuls run over all their rows,
while each prompt's RoPE, attention and output head are those of a lone prefill. So each prompt's
logits and the K/V rows the call writes must equal `prefill_slots` of that prompt alone bit for bit,
for a prompt that starts after a cached prefix too, and with the bucket padded (3 prompts in 4).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import SessionFactory, device_params
from zinc.errors import InvalidRequestError
from zinc.runtime.session import layer_major


@pytest.mark.parametrize("device", device_params("cpu"))
@pytest.mark.parametrize("fixture", ["tiny-q8-q41", "tiny-gemma3"])
def test_packed_prefill_equals_each_prompt_alone(
    fixture: str, device: str, tiny_models: dict[str, Path], open_session: SessionFactory
) -> None:
    session = open_session(tiny_models[fixture], device)
    assert session.max_packed >= 4
    prompts = [[3, 17, 200, 5, 9, 11, 4, 8, 12, 13], [7, 1], [250, 30, 31, 32, 33, 34, 35], [40, 41, 42]]
    slots = [np.arange(1 + 64 * i, 1 + 64 * (i + 1), dtype=np.int32) for i in range(len(prompts))]
    session.prefill_rows(prompts[0][:6], 0, slots[0][:6])  # prompt 0 goes on after a cached prefix
    jobs = [(p, 0, own[: len(p)]) for p, own in zip(prompts, slots, strict=True)]
    jobs[0] = (prompts[0][6:], 6, slots[0][: len(prompts[0])])
    alone = [session.prefill_slots(*job) for job in jobs]
    logits = [step.logits() for step in alone]
    written = np.concatenate([own[: len(p)] for p, own in zip(prompts, slots, strict=True)])
    rows = np.asarray(session.cache.to_host())[written]
    for n in (3, 4):  # 3: the bucket of 4 with a padding prompt
        session.module.fn("kv_write")(  # clear the rows, so the packed call has to write them again
            session.cache, session.module.to_device(layer_major(np.zeros_like(rows))), session.module.to_device(written)
        )
        session.prefill_rows(prompts[0][:6], 0, slots[0][:6])
        packed = session.prefill_packed(jobs[:n])
        assert packed.bucket == 4
        for i in range(n):
            assert np.array_equal(packed.logits(i), logits[i]), f"prompt {i} of {n}"
            assert packed.token(i) == alone[i].token
        ends = np.cumsum([len(p) for p in prompts])[n - 1]
        assert np.array_equal(np.asarray(session.cache.to_host())[written[:ends]], rows[:ends])


@pytest.mark.parametrize("device", device_params("cpu"))
def test_packed_prefill_rejects_what_it_cannot_hold(
    device: str, tiny_models: dict[str, Path], open_session: SessionFactory
) -> None:
    session = open_session(tiny_models["tiny-q8-q41"], device)
    one = ([1, 2], 0, [1, 2])
    with pytest.raises(InvalidRequestError, match="2 to"):
        session.prefill_packed([one])
    with pytest.raises(InvalidRequestError, match="2 to"):
        session.prefill_packed([one] * (session.max_packed + 1))
    big = list(range(1, session.packed_tokens))
    with pytest.raises(InvalidRequestError, match="at most"):
        session.prefill_packed([(big, 0, np.arange(1, len(big) + 1)), ([1, 2, 3], 0, [200, 201, 202])])
