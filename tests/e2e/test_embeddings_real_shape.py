"""`POST /v1/embeddings` through the `openai` SDK on Qwen3-Embedding-0.6B's shape (the sizes tier).

The model is fixtures/real_shapes.py's `qwen3-embedding-0.6b` in Q8_0, as the release's GGUF:
qwen3, 28 layers of 1024, 16/8 heads of 128, Qwen 3's 151,669 tokens with `<|endoftext|>` added
after every input, last-token pooling; seeded random weights. `zinc serve` would compile it for
the CPU with the default buckets, so a list of inputs is embedded by the packed `embed_x{N}`
calls and a lone input by `embed`. Every vector the SDK gets back (a string, a list of strings,
token ids, a list of them, Matryoshka `dimensions`) is checked against the float64 numpy
reference's final hidden state of the last token, normalized, within the tolerance the sizes tier
gives a 30-layer model's logits (tests/model/test_real_shape_models.py); a vector of a list equals
the same input's alone bit for bit. Opt-in: `pytest --sizes -m sizes` (125 s on 2 busy cores with
the artifact compiled, most of it the reference's forward passes; compiling it takes 2 minutes more).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from fixtures.real_shapes import ensure_model
from tests.model.test_real_shape_models import TOL_Q8_DEEP, rel_err
from tests.server_harness import RunningServer
from zinc.compiler import dot8_layout
from zinc.compiler.build import ensure_artifact
from zinc.engine.embeddings import normalize, pool
from zinc.engine.engine import LocalEngine
from zinc.model.gguf_file import open_gguf
from zinc.model.reference import ReferenceModel
from zinc.runtime.device import resolve_device
from zinc.runtime.session import ModelSession
from zinc.tokenizer import ChatTemplate, Tokenizer

pytestmark = [pytest.mark.sizes, pytest.mark.e2e]
NAME = "qwen3-embedding-0.6b"
EOS = 151643  # <|endoftext|>: the token whose hidden state is pooled
TEXTS = ["The quick brown fox jumps over the lazy dog.", "hello", "What is the capital of France?"]
IDS = [785, 6722, 315, 9625, 374]  # "The capital of France is", no EOS


@pytest.fixture(scope="module")
def path() -> Path:
    return ensure_model(NAME, "Q8_0")


@pytest.fixture(scope="module")
def engine(path: Path) -> Iterator[LocalEngine]:
    session = ModelSession(ensure_artifact(path, "cpu"), path, resolve_device("cpu"), context_length=512)
    assert session.hparams.pooling == "last" and session.max_embed_packed == 8
    meta = open_gguf(path).metadata
    tokenizer = Tokenizer.from_metadata(meta)
    eng = LocalEngine(session, tokenizer, ChatTemplate.from_metadata(meta, tokenizer), NAME, parallel=2)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def client(engine: LocalEngine) -> Iterator[openai.OpenAI]:
    running = RunningServer(engine)  # type: ignore[arg-type]
    yield openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=600)
    running.stop()


@pytest.fixture(scope="module")
def expect(path: Path) -> Any:
    """The reference's last-token hidden state of token ids, normalized (to `dimensions`); each
    input's forward pass once (a lazy reference: about 15 s each)."""
    ref = ReferenceModel(open_gguf(path), q8_activations=dot8_layout.enabled(), kv_f16=True, lazy=True)
    last: dict[tuple[int, ...], np.ndarray] = {}

    def vector(ids: list[int], dimensions: int | None = None) -> np.ndarray:
        if tuple(ids) not in last:
            ref.reset()
            last[tuple(ids)] = pool(ref.hidden(ids), "last")
        return normalize(last[tuple(ids)], dimensions)

    return vector


def check(got: list[float], want: np.ndarray) -> None:
    v = np.asarray(got, dtype=np.float64)
    assert v.shape == want.shape and abs(float(np.linalg.norm(v)) - 1.0) < 1e-5
    # 28 layers of Q8 activations: measured 1.6-2.8e-2; pooling the token before the last, the mean or
    # the first instead, or one input token changed, puts the vector 0.48-0.99 off
    assert rel_err(v, want) < TOL_Q8_DEEP


def test_strings_and_lists_of_strings(client: openai.OpenAI, engine: LocalEngine, expect: Any) -> None:
    ids = [engine.tokenize(text) for text in TEXTS]
    assert all(t[-1] == EOS for t in ids)  # the GGUF's add_eos_token, as the release's
    one = client.embeddings.create(model=NAME, input=TEXTS[0])
    assert one.model == NAME and len(one.data) == 1 and len(one.data[0].embedding) == 1024
    assert one.usage.prompt_tokens == one.usage.total_tokens == len(ids[0])
    check(one.data[0].embedding, expect(ids[0]))
    many = client.embeddings.create(model=NAME, input=TEXTS)  # one packed call
    assert [d.index for d in many.data] == [0, 1, 2] and many.usage.prompt_tokens == sum(map(len, ids))
    for d, want in zip(many.data, ids, strict=True):
        check(d.embedding, expect(want))
    assert np.array_equal(np.float32(many.data[0].embedding), np.float32(one.data[0].embedding))
    floats = client.embeddings.create(model=NAME, input=TEXTS[1], encoding_format="float")
    assert np.array_equal(np.float32(floats.data[0].embedding), np.float32(many.data[1].embedding))


def test_token_ids_and_dimensions(client: openai.OpenAI, engine: LocalEngine, expect: Any) -> None:
    out = client.embeddings.create(model=NAME, input=IDS)
    assert out.usage.prompt_tokens == len(IDS)
    check(out.data[0].embedding, expect(IDS))
    lists = client.embeddings.create(model=NAME, input=[IDS, IDS[:2], IDS])
    check(lists.data[1].embedding, expect(IDS[:2]))
    assert lists.data[0].embedding == lists.data[2].embedding == out.data[0].embedding
    ids = engine.tokenize(TEXTS[0])
    short = client.embeddings.create(model=NAME, input=TEXTS[0], dimensions=256)
    assert len(short.data[0].embedding) == 256
    check(short.data[0].embedding, expect(ids, 256))  # Matryoshka: truncated, then renormalized
