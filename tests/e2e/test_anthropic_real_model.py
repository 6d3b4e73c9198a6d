"""The Anthropic Messages API end to end with the real SmolLM2 on the CPU and the official `anthropic`
SDK: greedy whole and streamed messages say the same thing, a stop sequence the model reaches is
reported as `stop_sequence`, and count_tokens counts the prompt the chat template makes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from tests.e2e.test_server_fake_engine import RunningServer
from zinc.engine.engine import LocalEngine

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
QUESTION: Any = [{"role": "user", "content": "What is the capital of France?"}]
SYSTEM = "You are a helpful assistant."


@pytest.fixture(scope="module")
def client(engine: LocalEngine) -> Iterator[anthropic.Anthropic]:
    running = RunningServer(engine)  # type: ignore[arg-type]
    url = f"http://127.0.0.1:{running.port}"
    yield anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=120)
    running.stop()


def test_whole_and_streamed_agree_greedily(client: anthropic.Anthropic, engine: LocalEngine) -> None:
    greedy = {"temperature": 0}
    out = client.messages.create(
        model="smollm2", max_tokens=12, system=SYSTEM, messages=QUESTION, extra_body=greedy
    )
    assert [b.type for b in out.content] == ["text"]
    text = out.content[0].text  # type: ignore[union-attr]
    assert text.strip() and out.stop_reason in ("max_tokens", "end_turn")
    prompt_ids = engine.chat.encode(engine.tokenizer, [{"role": "system", "content": SYSTEM}, *QUESTION])
    assert out.usage.input_tokens == len(prompt_ids)
    counted = client.messages.count_tokens(model="smollm2", system=SYSTEM, messages=QUESTION)
    assert counted.input_tokens == len(prompt_ids)

    with client.messages.stream(
        model="smollm2", max_tokens=12, system=SYSTEM, messages=QUESTION, extra_body=greedy
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text
    assert final.stop_reason == out.stop_reason
    assert (final.usage.input_tokens, final.usage.output_tokens) == (
        out.usage.input_tokens, out.usage.output_tokens)  # fmt: skip

    words = text.split()
    assert len(words) >= 2
    stop = words[1]  # a word the model writes, so the greedy answer reaches it
    cut = client.messages.create(
        model="smollm2",
        max_tokens=12,
        system=SYSTEM,
        messages=QUESTION,
        stop_sequences=[stop],
        extra_body=greedy,
    )
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[: text.index(stop)]  # type: ignore[union-attr]
