"""Tier 3: the compiled `embed` entry point against the float64 numpy reference.

The fixture `tiny-qwen3-embed` is a qwen3 GGUF that declares last-token pooling
(`qwen3.pooling_type` = 3), as Qwen3-Embedding's does. `embed` returns the final hidden states
after output_norm of every token; they, and the pooled, normalized vector the server returns, must
match the reference's `hidden` to the tolerance of the logits tests. `embed` neither reads nor
writes the KV slab: a sequence decoding around it gets the same logits as without it. On the CPU,
`embed_packed` (`embed_x{N}`: several inputs in one call) gives each input's hidden states bit
for bit as `embed` on it alone, in a full bucket and a padded one, and the engine embeds a list of
short inputs in as few calls. A chat model's artifact has no `embed`, and its engine refuses
embeddings with a 400.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import ONE_SEQUENCE, SessionFactory, device_params, reference_model
from tests.model.test_fixture_numerics import TOL, TOL_Q8, rel_err
from zinc.engine.embeddings import normalize, pool
from zinc.engine.engine import LocalEngine
from zinc.errors import InvalidRequestError
from zinc.model.gguf_file import open_gguf
from zinc.runtime.session import EMBED_PACK_TOKENS
from zinc.tokenizer import ChatTemplate, Tokenizer

SHORT = [3, 17, 200, 5, 9, 11]
LONG = [(i * 37 + 5) % 300 for i in range(150)]  # more than one CPU prefill chunk (128 tokens)


@pytest.mark.parametrize("device", device_params("cpu", "vulkan"))
def test_embed_matches_reference(
    device: str, tiny_models: dict[str, Path], open_session: SessionFactory
) -> None:
    path = tiny_models["tiny-qwen3-embed"]
    session = open_session(path, device)
    assert session.embeds and session.hparams.pooling == "last"
    ref = reference_model(path, device)
    tol = TOL_Q8 if ref.q8_activations else TOL
    inputs = [SHORT, LONG]
    for ids in inputs:
        hidden = session.embed(ids)
        ref.reset()
        expect = ref.hidden(ids)
        assert hidden.shape == (len(ids), session.hparams.embedding_length)
        assert rel_err(hidden, expect) < tol, f"{len(ids)} tokens"
        for pooling in ("last", "mean", "cls"):
            got, want = normalize(pool(hidden, pooling)), normalize(pool(expect, pooling))
            assert np.abs(got - want).max() < 10 * tol, pooling
            assert abs(float(np.linalg.norm(got)) - 1.0) < 1e-5
    # the first token's state does not depend on what follows it (causal attention from position 0)
    assert rel_err(session.embed(SHORT[:1])[0], session.embed(SHORT)[0]) < 1e-5


@pytest.mark.parametrize("device", device_params("cpu"))
def test_packed_embed_equals_each_input_alone(
    device: str, tiny_models: dict[str, Path], open_session: SessionFactory
) -> None:
    session = open_session(tiny_models["tiny-qwen3-embed"], device)
    assert session.max_embed_packed == 8
    inputs = [[(i * 37 + j * 11 + 5) % 300 for j in range(1 + (i * 5) % 13)] for i in range(8)]
    alone = [session.embed(ids) for ids in inputs]
    for n in (2, 3, 4, 5, 8):  # 3 in the bucket of 4, 5 in 8: padded
        packed = session.embed_packed(inputs[:n])
        assert len(packed) == n
        for i in range(n):
            assert np.array_equal(packed[i], alone[i]), f"input {i} of {n}"
    # an input's rows do not depend on where in the row it sits, or on its neighbours
    again = session.embed_packed([inputs[3], SHORT, inputs[3]])
    assert np.array_equal(again[0], alone[3]) and np.array_equal(again[2], alone[3])
    with pytest.raises(InvalidRequestError, match="2 to 8"):
        session.embed_packed([SHORT])
    with pytest.raises(InvalidRequestError, match="2 to 8"):
        session.embed_packed([SHORT] * 9)
    with pytest.raises(InvalidRequestError, match=f"at most {EMBED_PACK_TOKENS} tokens"):
        session.embed_packed([LONG, LONG])


def test_engine_embeds_a_list_in_few_calls(tiny_models: dict[str, Path], open_session: SessionFactory) -> None:
    """32 short inputs: 4 packed calls of 8, not 32, with the vectors of one call per input."""
    path = tiny_models["tiny-qwen3-embed"]
    session = open_session(path, "cpu")
    meta = open_gguf(path).metadata
    tokenizer = Tokenizer.from_metadata(meta)
    engine = LocalEngine(session, tokenizer, ChatTemplate.from_metadata(meta, tokenizer), "embed")
    calls: list[Callable[[], Any]] = []
    call = engine.scheduler.call

    def counted(fn: Callable[[], Any]) -> Future[Any]:
        calls.append(fn)
        return call(fn)

    engine.scheduler.call = counted  # type: ignore[method-assign]
    inputs = [[(i * 37 + j * 11 + 5) % 300 for j in range(4 + i % 9)] for i in range(32)] + [LONG]
    try:
        out = asyncio.run(engine.embed(inputs, dimensions=16))
        assert len(calls) == 5  # the long input alone
        assert out.prompt_tokens == sum(map(len, inputs))
        for ids, got in zip(inputs, out.vectors, strict=True):
            assert np.array_equal(got, normalize(pool(session.embed(ids), "last"), 16))
    finally:
        engine.close()


def test_embed_leaves_the_cache_alone(tiny_models: dict[str, Path], open_session: SessionFactory) -> None:
    path = tiny_models["tiny-qwen3-embed"]
    session = open_session(path, "cpu")
    ref = reference_model(path, "cpu")
    tol = TOL_Q8 if ref.q8_activations else TOL
    ref.reset()
    step = session.prefill(SHORT)
    assert rel_err(step.logits(), ref.forward(SHORT)[-1]) < tol
    session.embed(LONG)  # between a sequence's prefill and its decode
    step = session.decode(42, len(SHORT))
    assert rel_err(step.logits(), ref.forward([42])[-1]) < tol


def test_chat_model_has_no_embed(tiny_models: dict[str, Path], open_session: SessionFactory) -> None:
    session = open_session(tiny_models["tiny-qwen3"], "cpu", ONE_SEQUENCE)  # test_fixture_numerics' artifact
    assert not session.embeds and "embed" not in session.manifest.entry_points
    with pytest.raises(InvalidRequestError, match="declares no pooling"):
        session.embed(SHORT)
    meta = open_gguf(tiny_models["tiny-qwen3"]).metadata
    tokenizer = Tokenizer.from_metadata(meta)
    engine = LocalEngine(session, tokenizer, ChatTemplate.from_metadata(meta, tokenizer), "tiny-qwen3")
    try:
        assert engine.pooling == "none"
        with pytest.raises(InvalidRequestError, match="declares no pooling") as info:
            asyncio.run(engine.embed([SHORT]))
        assert info.value.param == "model"
    finally:
        engine.close()
