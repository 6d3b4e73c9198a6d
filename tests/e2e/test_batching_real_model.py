"""Continuous batching end to end with the real SmolLM2 on the CPU, through the HTTP server.

Eight concurrent streams each give exactly the tokens the same request gives alone; a client that
disconnects frees its KV pages at once; a follow-up turn with `session_id` reuses the cached
prefix (`usage.prompt_tokens_details.cached_tokens`) and answers as a fresh computation does, up
to a step where that fresh run was nearly tied (fixtures/golden/README.md's rule).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.conftest import SessionFactory
from tests.e2e.test_server_fake_engine import RunningServer
from zinc.compiler.build import ensure_artifact
from zinc.engine.engine import LocalEngine
from zinc.engine.generate import generate_tokens
from zinc.engine.types import GenerationRequest
from zinc.errors import EngineClosedError
from zinc.model.gguf_file import open_gguf
from zinc.runtime.device import resolve_device
from zinc.runtime.session import ModelSession
from zinc.tokenizer import ChatTemplate, Tokenizer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
CONTEXT = 512
PROMPTS = [
    "The capital of France is",
    "Water boils at",
    "The largest planet in the solar system is",
    "def add(a, b):",
    "Once upon a time, there was",
    "The three primary colors are",
    "To make a cup of tea,",
    "The speed of light is",
]


@pytest.fixture(scope="module")
def engine(smollm2: Path) -> Iterator[LocalEngine]:
    spec = resolve_device("cpu")
    session = ModelSession(ensure_artifact(smollm2, "cpu"), smollm2, spec, CONTEXT, kv_slots=8 * CONTEXT + 64)
    meta = open_gguf(smollm2).metadata
    tokenizer = Tokenizer.from_metadata(meta)
    eng = LocalEngine(session, tokenizer, ChatTemplate.from_metadata(meta, tokenizer), "smollm2", parallel=8)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def srv(engine: LocalEngine) -> Iterator[RunningServer]:
    running = RunningServer(engine, parallel=8)  # type: ignore[arg-type]
    yield running
    running.stop()


def client(srv: RunningServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=300)


async def stream(c: openai.AsyncOpenAI, prompt: str, n: int) -> str:
    chunks = await c.completions.create(
        model="smollm2", prompt=prompt, max_tokens=n, temperature=0, stream=True
    )
    return "".join([chunk.choices[0].text async for chunk in chunks if chunk.choices])


def test_eight_concurrent_streams_equal_their_solo_outputs(srv: RunningServer, engine: LocalEngine) -> None:
    async def run() -> tuple[list[str], list[str], int]:
        c = client(srv)
        alone = [await stream(c, p, 12) for p in PROMPTS]
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, engine.stats().active_requests)
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        together = await asyncio.gather(*(stream(c, p, 12) for p in PROMPTS))
        watcher.cancel()
        await c.close()
        return alone, list(together), peak

    alone, together, peak = asyncio.run(run())
    assert peak >= 4, "the streams were not decoded together"
    assert together == alone  # batch rows are computed exactly as a sequence alone
    assert all(text for text in alone)


def test_disconnect_frees_pages(srv: RunningServer, engine: LocalEngine) -> None:
    body = json.dumps({"model": "smollm2", "prompt": PROMPTS[4], "max_tokens": 400, "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    )  # fmt: skip
    assert b"data: " in sock.recv(65536)
    assert engine.stats().kv_pages_in_use > 0
    sock.close()
    start = time.monotonic()
    while (engine.stats().kv_pages_in_use or engine.stats().active_requests) and time.monotonic() - start < 5:
        time.sleep(0.01)
    stats = engine.stats()
    assert stats.active_requests == 0 and stats.kv_pages_in_use == 0, (
        "pages stayed in use after the client left"
    )


def fresh_answer(
    session: ModelSession, engine: LocalEngine, prompt_ids: list[int], n: int
) -> tuple[list[int], list[float]]:
    """Greedy tokens of a plain single-sequence run and the top-2 logit gap at each step."""
    tokens, gaps = [], []
    for sampled in generate_tokens(session, prompt_ids, n, stop_ids=engine.tokenizer.eog_ids, logprobs=2):
        tokens.append(sampled.token)
        gaps.append(sampled.top[0][1] - sampled.top[1][1])
    return tokens, gaps


def test_session_follow_up_reuses_pages_and_answers_the_same(
    srv: RunningServer, engine: LocalEngine, smollm2: Path, open_session: SessionFactory
) -> None:
    history = [
        {"role": "system", "content": "You are a concise assistant. " * 12},
        {"role": "user", "content": "Name three rivers in Europe and one fact about each of them."},
    ]
    sync = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=300)
    extra = {"session_id": "chat-7"}
    first = sync.chat.completions.create(model="smollm2", messages=history, max_tokens=12, extra_body=extra)  # type: ignore[arg-type]
    assert engine.stats().sessions == 1 and engine.stats().kv_pages_in_use > 0
    follow = [*history, {"role": "assistant", "content": first.choices[0].message.content or ""},
              {"role": "user", "content": "Which of them is the longest?"}]  # fmt: skip
    again = sync.chat.completions.create(model="smollm2", messages=follow, max_tokens=10, extra_body=extra)  # type: ignore[arg-type]
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    cached = again.usage.prompt_tokens_details.cached_tokens or 0
    assert cached >= 96, f"only {cached} of {again.usage.prompt_tokens} prompt tokens were reused"
    prompt_ids = engine.chat.encode(engine.tokenizer, follow)
    tokens, gaps = fresh_answer(open_session(smollm2, "cpu"), engine, prompt_ids, 10)
    got = engine.tokenizer.encode(again.choices[0].message.content or "", add_special=False)
    same = next((i for i, (a, b) in enumerate(zip(got, tokens, strict=False)) if a != b), None)
    # reused pages change no bit, so not even a near-tie may go the other way
    assert same is None, f"answers differ at step {same} (gap {gaps[same]:.3f})"
    assert engine.detokenize(tokens) == again.choices[0].message.content
    deleted = sync.delete("/sessions/chat-7", cast_to=object)
    assert deleted == {"id": "chat-7", "object": "session", "deleted": True}
    assert engine.stats().sessions == 0
    with pytest.raises(openai.NotFoundError):
        sync.delete("/sessions/chat-7", cast_to=object)


def test_closing_the_engine_ends_a_running_request_with_an_error(smollm2: Path) -> None:
    spec = resolve_device("cpu")
    session = ModelSession(ensure_artifact(smollm2, "cpu"), smollm2, spec, CONTEXT, kv_slots=2 * CONTEXT)
    meta = open_gguf(smollm2).metadata
    tokenizer = Tokenizer.from_metadata(meta)
    eng = LocalEngine(session, tokenizer, ChatTemplate.from_metadata(meta, tokenizer), "smollm2")
    ids = eng.tokenize(PROMPTS[0])

    async def run() -> int:
        seen = 0
        closing: asyncio.Future[None] | None = None
        request = GenerationRequest("close-test", ids, 400, stop_on_eog=False)
        with pytest.raises(EngineClosedError):
            async for _ in eng.generate(request):
                seen += 1
                if closing is None:  # close from another thread while the stream runs
                    closing = asyncio.get_running_loop().run_in_executor(None, eng.close)
        assert closing is not None
        await closing
        return seen

    assert 0 < asyncio.run(run()) < 400  # it ended early, as an error, not as a "length" finish
