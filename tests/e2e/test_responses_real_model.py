"""The OpenAI Responses API end to end with the real SmolLM2 on the CPU and the official `openai` SDK:
greedy whole and streamed responses say the same thing and count the prompt the chat template
makes, a response the token limit cuts is `incomplete`, and `text.format` json_schema makes the
model's answer valid JSON of that schema (llguidance)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest

from tests.server_harness import RunningServer
from zinc.engine.engine import LocalEngine

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
QUESTION = "What is the capital of France?"
SYSTEM = "You are a helpful assistant."


@pytest.fixture(scope="module")
def client(engine: LocalEngine) -> Iterator[openai.OpenAI]:
    running = RunningServer(engine)  # type: ignore[arg-type]
    yield openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=120)
    running.stop()


def test_whole_and_streamed_agree_greedily(client: openai.OpenAI, engine: LocalEngine) -> None:
    request: Any = {"model": "smollm2", "instructions": SYSTEM, "input": QUESTION, "max_output_tokens": 12,
                    "temperature": 0}  # fmt: skip
    out = client.responses.create(**request)
    assert [item.type for item in out.output] == ["message"]
    assert out.output_text.strip() and out.status in ("completed", "incomplete")
    prompt_ids = engine.chat.encode(engine.tokenizer, [{"role": "system", "content": SYSTEM},
                                                       {"role": "user", "content": QUESTION}])  # fmt: skip
    assert out.usage is not None and out.usage.input_tokens == len(prompt_ids)
    if out.status == "incomplete":
        assert out.usage.output_tokens == 12 and out.incomplete_details is not None

    events = list(client.responses.create(**request, stream=True))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == out.output_text
    last: Any = events[-1]
    assert last.type == f"response.{out.status}"
    assert (last.response.usage.input_tokens, last.response.usage.output_tokens) == (
        out.usage.input_tokens, out.usage.output_tokens)  # fmt: skip


def test_json_schema_output_is_valid(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    }
    out = client.responses.create(
        model="smollm2",
        input="Give the capital of France as JSON.",
        text={"format": {"type": "json_schema", "name": "capital", "schema": schema, "strict": True}},
        max_output_tokens=40,
        temperature=0,
    )
    assert out.status == "completed"
    answer = orjson.loads(out.output_text)
    assert set(answer) == {"city"} and isinstance(answer["city"], str)
