"""The server's acceptance checks once against `zinc serve --device vulkan` (lavapipe in CI), on a
tiny model: streamed and whole answers, several streams decoded together, the prefix cache, a
session through `X-Session-Id`, and a client that goes away mid-stream.

Each answer is compared with the same prompt's greedy tokens from a Vulkan `ModelSession` run
alone, so batching, KV pages and cached prefixes must change nothing on Vulkan either.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2
import openai
import pytest

from tests.conftest import SessionFactory
from tests.e2e.test_sigterm import REPO, free_port, wait_until_serving
from zinc.engine.generate import generate_ids
from zinc.model.gguf_file import open_gguf
from zinc.tokenizer import Tokenizer

pytestmark = [pytest.mark.e2e, pytest.mark.vulkan]
MODEL = "tiny-q8-q41"
CONTEXT = 256
PROMPTS = [[1, 5, 9, 200, 33, 17, 4, 8, 2, 90, 91, 92], [1, 300, 301, 7], [1, *range(40, 70)], [1, 2, 3]]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def server(tiny_models: dict[str, Path]) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "zinc", "serve", "-m", str(tiny_models[MODEL]), "-p", str(port), "--device", "vulkan",
         "-c", str(CONTEXT), "--parallel", "4"],
        cwd=REPO, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_until_serving(proc, port)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.communicate()


@pytest.fixture(scope="module")
def expected(tiny_models: dict[str, Path], open_session: SessionFactory) -> list[str]:
    """Each prompt's greedy completion from a Vulkan session alone."""
    path = tiny_models[MODEL]
    session = open_session(path, "vulkan")
    tokenizer = Tokenizer.from_metadata(open_gguf(path).metadata)
    texts = []
    for ids in PROMPTS:
        out = [t for t in generate_ids(session, ids, MAX_TOKENS, stop_ids=tokenizer.eog_ids) if t not in tokenizer.eog_ids]
        texts.append(tokenizer.decode(out))
    return texts


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300)


def test_the_server_answers_on_vulkan_as_the_session_does(server: str, expected: list[str]) -> None:
    client = _client(server)
    health = httpx2.get(f"{server}/health", timeout=30).json()
    assert health["status"] == "ok" and not health["device"].startswith("CPU")  # the Vulkan device's name
    whole = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0)
    assert whole.choices[0].text == expected[0]
    streamed = client.completions.create(
        model=MODEL, prompt=PROMPTS[1], max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == expected[1]


def test_streams_decoded_together_give_their_solo_tokens(server: str, expected: list[str]) -> None:
    client = _client(server)

    def run(i: int) -> str:
        stream = client.completions.create(
            model=MODEL, prompt=PROMPTS[i], max_tokens=MAX_TOKENS, temperature=0, stream=True
        )
        return "".join(c.choices[0].text for c in stream if c.choices)

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        assert list(pool.map(run, range(len(PROMPTS)))) == expected


def test_prefix_cache_and_session_on_vulkan(server: str, expected: list[str]) -> None:
    client = _client(server)
    first = client.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=MAX_TOKENS, temperature=0)
    again = client.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=MAX_TOKENS, temperature=0)
    assert first.choices[0].text == again.choices[0].text == expected[2]
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens >= 16  # the prompt's whole first page
    turn = [1, *range(100, 140)]
    headers = {"x-session-id": "vk-conversation"}
    one = httpx2.post(f"{server}/v1/completions", json={"prompt": turn, "max_tokens": 2}, headers=headers, timeout=300)
    two = httpx2.post(
        f"{server}/v1/completions", json={"prompt": [*turn, 7, 8], "max_tokens": 2}, headers=headers, timeout=300
    )
    assert one.status_code == two.status_code == 200
    assert two.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 32
    assert httpx2.delete(f"{server}/v1/sessions/vk-conversation", timeout=30).status_code == 200


def test_a_client_gone_mid_stream_frees_its_generation(server: str) -> None:
    with httpx2.stream(
        "POST", f"{server}/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 200, "stream": True}, timeout=300
    ) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # generating
    deadline = time.monotonic() + 60
    while httpx2.get(f"{server}/health", timeout=30).json()["active_requests"]:
        assert time.monotonic() < deadline, "the generation kept running after its client left"
        time.sleep(0.05)
    metrics = httpx2.get(f"{server}/metrics", timeout=30).text
    assert 'zinc_generations_total{finish_reason="aborted"} 1.0' in metrics
