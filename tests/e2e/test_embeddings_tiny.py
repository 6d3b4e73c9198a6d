"""`POST /v1/embeddings` end to end through the `openai` SDK, on the compiled tiny-qwen3-embed
fixture (a qwen3 GGUF with last-token pooling, as Qwen3-Embedding's) on the CPU: a string, a list
of strings (special tokens written in them read as those tokens), token ids and lists of them, float and base64 encodings, `dimensions` (truncated and
renormalized) and usage, every vector checked against the numpy reference's hidden states pooled
and normalized the same way; the 400s (too long, too wide, bad types, a model without pooling) in
OpenAI's envelope; auth, CORS and /props as on the other endpoints. With the operator's pooling
(`zinc serve --embeddings mean`), a chat model embeds too.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import numpy as np
import openai
import orjson
import pytest

from tests.conftest import reference_model
from tests.fakes import FakeEngine
from tests.model.test_fixture_numerics import TOL, TOL_Q8
from tests.server_harness import RunningServer
from zinc.compiler.build import ensure_artifact
from zinc.engine.embeddings import normalize, pool
from zinc.engine.engine import LocalEngine
from zinc.model.gguf_file import open_gguf
from zinc.runtime.device import resolve_device
from zinc.runtime.session import ModelSession
from zinc.tokenizer import ChatTemplate, Tokenizer

pytestmark = [pytest.mark.e2e]
MODEL = "tiny-qwen3-embed"
CONTEXT = 64
KEY = "sekrit"


@pytest.fixture(scope="module")
def engine(tiny_models: dict[str, Path]) -> Iterator[LocalEngine]:
    path = tiny_models[MODEL]
    session = ModelSession(
        ensure_artifact(path, "cpu"), path, resolve_device("cpu"), CONTEXT, kv_slots=2 * CONTEXT + 64
    )
    meta = open_gguf(path).metadata
    tokenizer = Tokenizer.from_metadata(meta)
    eng = LocalEngine(session, tokenizer, ChatTemplate.from_metadata(meta, tokenizer), MODEL, parallel=2)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def srv(engine: LocalEngine) -> Iterator[RunningServer]:
    running = RunningServer(engine, parallel=2, api_key=KEY)  # type: ignore[arg-type]
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(srv: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def expect(tiny_models: dict[str, Path]) -> Any:
    """The reference's vector for token ids: hidden states pooled (last) and normalized."""
    ref = reference_model(tiny_models[MODEL], "cpu")
    tol = 10 * (TOL_Q8 if ref.q8_activations else TOL)

    def vector(ids: list[int], dimensions: int | None = None) -> np.ndarray:
        ref.reset()
        return normalize(pool(ref.hidden(ids), "last"), dimensions)

    vector.tol = tol  # type: ignore[attr-defined]
    return vector


def close(got: list[float], want: np.ndarray, tol: float) -> bool:
    return len(got) == len(want) and float(np.abs(np.asarray(got) - want).max()) < tol


def test_string_and_list_of_strings(client: openai.OpenAI, engine: LocalEngine, expect: Any) -> None:
    texts = ["the quick brown fox", "hello", "jumps over the lazy dog"]
    one = client.embeddings.create(model=MODEL, input=texts[0], encoding_format="float")
    ids = engine.tokenize(texts[0])
    assert one.object == "list" and one.model == MODEL and len(one.data) == 1
    assert close(one.data[0].embedding, expect(ids), expect.tol)
    assert one.usage.prompt_tokens == one.usage.total_tokens == len(ids)
    many = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    assert [d.index for d in many.data] == [0, 1, 2]
    for d, text in zip(many.data, texts, strict=True):
        assert close(d.embedding, expect(engine.tokenize(text)), expect.tol), text
    assert many.usage.prompt_tokens == sum(len(engine.tokenize(t)) for t in texts)
    assert close(many.data[0].embedding, np.asarray(one.data[0].embedding), 1e-6)  # batched = alone


def test_a_special_token_written_in_an_input_is_that_token(client: openai.OpenAI, engine: LocalEngine, expect: Any) -> None:
    text = "hello<|endoftext|>"  # Qwen3-Embedding's inputs end with it
    ids = [*engine.tokenize("hello"), engine.special_tokens()["eos"]]
    got = client.embeddings.create(model=MODEL, input=text, encoding_format="float")
    assert got.usage.prompt_tokens == len(ids)  # one id for the special token, as llama.cpp reads it
    assert close(got.data[0].embedding, expect(ids), expect.tol)


def test_token_ids_base64_and_dimensions(client: openai.OpenAI, expect: Any) -> None:
    ids = [3, 17, 200, 5, 9, 11]
    out = client.embeddings.create(model=MODEL, input=ids)  # the SDK asks for base64 and decodes it
    assert close(out.data[0].embedding, expect(ids), expect.tol) and out.usage.prompt_tokens == 6
    lists = client.embeddings.create(model=MODEL, input=[ids, ids[:2]], encoding_format="float")
    assert close(lists.data[1].embedding, expect(ids[:2]), expect.tol)
    raw = client.embeddings.create(model=MODEL, input=ids, encoding_format="base64")
    decoded = np.frombuffer(base64.b64decode(str(raw.data[0].embedding)), dtype="<f4")
    assert close(list(decoded), expect(ids), expect.tol)
    short = client.embeddings.create(model=MODEL, input=ids, dimensions=16, encoding_format="float")
    assert close(short.data[0].embedding, expect(ids, 16), expect.tol)
    assert abs(float(np.linalg.norm(short.data[0].embedding)) - 1.0) < 1e-5  # renormalized after truncation


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"input": list(range(CONTEXT + 1))}, "input", "maximum context length is 64"),
        ({"input": "hi", "dimensions": 65}, "dimensions", "at most 64"),
        ({"input": [5, "a"]}, "input", "not a mix"),
        ({"input": []}, "input", "non-empty"),
        ({"input": [[1, 2], []]}, "input", "empty"),
        ({"input": [1, 100000]}, "input", "token ids must be in"),
        ({"input": "hi", "encoding_format": "hex"}, "encoding_format", "base64"),
    ],
)
def test_bad_requests_are_400s(srv: RunningServer, body: dict[str, Any], param: str, says: str) -> None:
    out = httpx2.post(
        f"{srv.base_url}/embeddings", content=orjson.dumps({"model": MODEL, **body}),
        headers={"authorization": f"Bearer {KEY}"}, timeout=60,
    )  # fmt: skip
    error = out.json()["error"]
    assert out.status_code == 400 and error["type"] == "invalid_request_error"
    assert error["param"] == param and says in error["message"]


def test_sdk_raises_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="at most 64"):
        client.embeddings.create(model=MODEL, input="hi", dimensions=100)


def test_auth_cors_and_props(srv: RunningServer) -> None:
    url = f"{srv.base_url}/embeddings"
    missing = httpx2.post(url, content=b'{"input": "hi"}', timeout=10)
    assert missing.status_code == 401 and missing.headers["access-control-allow-origin"] == "*"
    preflight = httpx2.options(url, timeout=10)
    assert (
        preflight.status_code == 200 and preflight.headers["access-control-allow-methods"] == "POST, OPTIONS"
    )
    props = httpx2.get(
        f"http://127.0.0.1:{srv.port}/props", headers={"authorization": f"Bearer {KEY}"}, timeout=10
    )
    assert "POST /v1/embeddings" in props.json()["endpoints"]


def test_a_model_without_pooling_is_a_400() -> None:
    running = RunningServer(FakeEngine())
    try:
        c = openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=10)
        with pytest.raises(openai.BadRequestError, match="declares no pooling") as info:
            c.embeddings.create(model="fake-model", input="hi")
        assert info.value.body["param"] == "model"  # type: ignore[index]
    finally:
        running.stop()


def test_a_chat_model_embeds_when_the_operator_opts_in(tiny_models: dict[str, Path]) -> None:
    """`zinc serve --embeddings mean` (the loader's `pooling`, tests/unit/test_embeddings.py): the
    chat fixture compiled with `embed` (one decode bucket, to compile fast) mean-pools."""
    path = tiny_models["tiny-qwen3"]
    artifact = ensure_artifact(path, "cpu", batch_sizes=(1,), pooling="mean")
    session = ModelSession(artifact, path, resolve_device("cpu"), CONTEXT, kv_slots=CONTEXT + 64)
    meta = open_gguf(path).metadata
    tokenizer = Tokenizer.from_metadata(meta)
    engine = LocalEngine(session, tokenizer, ChatTemplate.from_metadata(meta, tokenizer), "chat", parallel=1)
    running = RunningServer(engine)  # type: ignore[arg-type]
    try:
        assert engine.pooling == "mean" and session.hparams.pooling_type == 1
        c = openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=120)
        ids = [3, 17, 200, 5, 9, 11, 40]
        out = c.embeddings.create(model="chat", input=ids, encoding_format="float")
        ref = reference_model(path, "cpu")
        want = normalize(pool(ref.hidden(ids), "mean"))
        assert close(out.data[0].embedding, want, 10 * (TOL_Q8 if ref.q8_activations else TOL))
        chat = c.completions.create(model="chat", prompt=ids, max_tokens=2)  # still a chat model
        assert chat.usage is not None and chat.usage.completion_tokens == 2
    finally:
        running.stop()
        engine.close()
