"""Tier 3: the paged KV cache and batched decode against the float64 reference.

Several sequences live in the same slab at scattered slots (as the page allocator hands them
out); each is prefilled on its own (in two parts: the first K/V only, `prefill_rows`, the second
reading the first's rows by slot),
then all of them decode together in one `decode_batch` step per position, padded to a compiled
bucket, and every row's logits must equal its own sequence's reference. Covers the window
masking of gemma3's local layers (positions past the window), rows at different positions, and
Llama 3's RoPE frequency factors in the batch's per-row angle table.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import SessionFactory, device_params, reference_model
from tests.model.test_fixture_numerics import TOL, TOL_Q8, rel_err
from zinc.errors import InvalidRequestError


@pytest.mark.parametrize("device", device_params("cpu", "vulkan"))
@pytest.mark.parametrize("fixture", ["tiny-q8-q41", "tiny-gemma3", "tiny-llama3-ropefreqs"])
def test_batched_decode_matches_each_sequence(
    fixture: str, device: str, tiny_models: dict[str, Path], open_session: SessionFactory
) -> None:
    path = tiny_models[fixture]
    session = open_session(path, device)
    assert session.batch_sizes[0] == 1 and session.max_batch >= 4
    prompts = [[3, 17, 200, 5, 9, 11, 4, 8], [7, 1], [250, 30, 31, 32, 33]]
    rng = np.random.default_rng(0)
    free = rng.permutation(np.arange(1, 200, dtype=np.int32))  # scattered slots, never scratch slot 0
    slots = [free[i * 60 : (i + 1) * 60] for i in range(len(prompts))]
    refs = [reference_model(path, device) for _ in prompts]
    positions = []
    for prompt, own, ref in zip(prompts, slots, refs, strict=True):
        head = len(prompt) // 2
        session.prefill_rows(prompt[:head], 0, own[:head])
        step = session.prefill_slots(prompt[head:], head, own[: len(prompt)])
        assert rel_err(step.logits(), ref.forward(prompt)[-1]) < (TOL_Q8 if ref.q8_activations else TOL)
        positions.append(len(prompt))
    tokens = [5, 6, 7]
    for _ in range(4):  # past gemma3's window of 5 for every sequence
        batch = session.decode_batch(
            tokens, positions, [own[: p + 1] for own, p in zip(slots, positions, strict=True)]
        )
        for i, ref in enumerate(refs):
            expect = ref.forward([tokens[i]])[-1]
            assert rel_err(batch.logits(i), expect) < (TOL_Q8 if ref.q8_activations else TOL), f"row {i} at position {positions[i]}"
            assert batch.token(i) == int(np.argmax(batch.logits(i)))
        positions = [p + 1 for p in positions]
        tokens = [batch.token(i) for i in range(len(tokens))]
    # one sequence alone (bucket 1) continues where the batch left it
    single = session.decode_batch([tokens[1]], [positions[1]], [slots[1][: positions[1] + 1]])
    assert rel_err(single.logits(0), refs[1].forward([tokens[1]])[-1]) < (TOL_Q8 if refs[1].q8_activations else TOL)


@pytest.mark.parametrize("device", device_params("cpu", "vulkan"))
@pytest.mark.parametrize("fixture", ["tiny-q8-q41", "tiny-gemma3"])
@pytest.mark.parametrize("cached", [16, 13])
def test_a_cached_prefix_changes_no_bit(
    fixture: str, device: str, cached: int, tiny_models: dict[str, Path], open_session: SessionFactory
) -> None:
    """A prompt prefilled whole and the same prompt whose first `cached` positions were stored
    earlier (a prefix-cache hit: other calls, other chunk boundaries) give the same logits bit for
    bit, then and at the next decode step: every query reduces over its keys in position order."""
    session = open_session(tiny_models[fixture], device)
    prompt = [(i * 37) % 250 + 1 for i in range(30)]
    whole_slots = np.arange(1, 32, dtype=np.int32)
    split_slots = np.arange(64, 95, dtype=np.int32)
    whole = session.prefill_slots(prompt, 0, whole_slots[:30])
    session.prefill_rows(prompt[:cached], 0, split_slots[:cached])
    split = session.prefill_slots(prompt[cached:], cached, split_slots[:30])
    assert np.array_equal(whole.logits(), split.logits())
    after = [session.decode_batch([7], [30], [own]).logits(0) for own in (whole_slots, split_slots)]
    assert np.array_equal(after[0], after[1])


@pytest.mark.parametrize("device", device_params("cpu", "vulkan"))
def test_chained_steps_equal_steps_fed_from_the_host(
    device: str, tiny_models: dict[str, Path], open_session: SessionFactory
) -> None:
    """`decode_next` enqueued before the step it follows has been read (its greedy tokens fed on
    the device) gives the same bits as steps fed the same tokens from the host, in other slots."""
    session = open_session(tiny_models["tiny-q8-q41"], device)
    prompts = [[3, 17, 200, 5, 9], [7, 1, 250]]
    host_slots = [np.arange(1 + 40 * i, 41 + 40 * i, dtype=np.int32) for i in range(2)]
    chain_slots = [own + 100 for own in host_slots]
    firsts = []
    for prompt, a, b in zip(prompts, host_slots, chain_slots, strict=True):
        firsts.append(session.prefill_slots(prompt, 0, a[: len(prompt)]).token)
        session.prefill_slots(prompt, 0, b[: len(prompt)])
    positions = [len(p) for p in prompts]

    def own(slots: list[np.ndarray], at: list[int]) -> list[np.ndarray]:
        return [s[: p + 1] for s, p in zip(slots, at, strict=True)]

    host, tokens = [], firsts
    for k in range(4):
        at = [p + k for p in positions]
        step = session.decode_batch(tokens, at, own(host_slots, at))
        host.append(np.stack([step.logits(i) for i in range(2)]))
        tokens = [step.token(i) for i in range(2)]
    steps = [session.decode_batch(firsts, positions, own(chain_slots, positions))]
    for k in range(1, 4):  # each enqueued while the one before it may still run
        at = [p + k for p in positions]
        steps.append(session.decode_next(steps[-1], at, own(chain_slots, at)))
    for k, step in enumerate(steps):
        assert np.array_equal(np.stack([step.logits(i) for i in range(2)]), host[k]), f"step {k}"


def test_decode_batch_rejects_bad_input(tiny_models: dict[str, Path], open_session: SessionFactory) -> None:
    session = open_session(tiny_models["tiny-q8-q41"], "cpu")
    with pytest.raises(InvalidRequestError):
        session.decode_batch(
            [1] * (session.max_batch + 1), [0] * (session.max_batch + 1), [[1]] * (session.max_batch + 1)
        )
    with pytest.raises(InvalidRequestError):
        session.decode_batch([1], [3], [[1, 2]])  # too few slots for position 3
    with pytest.raises(InvalidRequestError):
        session.prefill_slots([1, 2], 0, [1, session.kv_slots])  # a slot outside the slab
