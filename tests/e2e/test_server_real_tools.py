"""Tool calling, structured output and logprobs end to end with the real SmolLM2 on the CPU and the
official openai client. Generations are short (the CPU does ~8 tokens/s): forced tool calls use
small enum/length-bounded schemas so the call is complete within a few dozen tokens."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from tests.e2e.test_server_fake_engine import RunningServer
from zinc.engine.engine import LocalEngine

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
TIME_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Return the current time in a timezone.",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "enum": ["UTC", "CET", "PST"]}},
            "required": ["timezone"],
            "additionalProperties": False,
        },
    },
}
ASK: Any = [{"role": "user", "content": "What time is it in UTC?"}]


@pytest.fixture(scope="module")
def client(engine: LocalEngine) -> Iterator[openai.OpenAI]:
    running = RunningServer(engine)  # type: ignore[arg-type]
    yield openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=180)
    running.stop()


def test_forced_tool_call_whole_and_streamed(client: openai.OpenAI) -> None:
    choice: Any = {"type": "function", "function": {"name": "get_time"}}
    out = client.chat.completions.create(
        model="smollm2", messages=ASK, tools=[TIME_TOOL], tool_choice=choice, max_tokens=40
    )
    message = out.choices[0].message
    assert out.choices[0].finish_reason == "tool_calls"
    assert message.content is None and message.tool_calls is not None and len(message.tool_calls) == 1
    call = message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_time" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, TIME_TOOL["function"]["parameters"])

    stream = client.chat.completions.create(
        model="smollm2", messages=ASK, tools=[TIME_TOOL], tool_choice="required", max_tokens=40, stream=True
    )
    chunks = list(stream)
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].id and deltas[0].function is not None and deltas[0].function.name == "get_time"
    assert len(deltas) > 2, "the arguments arrive in fragments"
    streamed = "".join(d.function.arguments or "" for d in deltas if d.function is not None)
    assert streamed == call.function.arguments  # greedy: the same call, whole or streamed
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"

    # the call and its result go back into the conversation (SmolLM2's template has no tool support:
    # both are rendered as text), and the model answers
    history: Any = [
        *ASK,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "12:00"},
    ]
    follow = client.chat.completions.create(
        model="smollm2", messages=history, tools=[TIME_TOOL], tool_choice="none", max_tokens=4
    )
    assert follow.choices[0].message.content and follow.choices[0].finish_reason in ("stop", "length")


def test_json_schema_response_validates(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "weather", "schema": schema}}
    messages: Any = [{"role": "user", "content": "The weather in Paris, as JSON."}]
    for seed in (1, 2):
        out = client.chat.completions.create(
            model="smollm2", messages=messages, response_format=fmt, max_tokens=40, temperature=0.8, seed=seed
        )
        assert out.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(out.choices[0].message.content or ""), schema)


def test_logprobs_agree_between_stream_and_whole(client: openai.OpenAI) -> None:
    kwargs: Any = {"model": "smollm2", "messages": ASK, "max_tokens": 5, "logprobs": True, "top_logprobs": 3}
    whole = client.chat.completions.create(**kwargs)
    assert whole.choices[0].logprobs is not None and whole.choices[0].logprobs.content is not None
    content = whole.choices[0].logprobs.content
    assert len(content) == 5 and "".join(t.token for t in content) == whole.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].logprob == pytest.approx(t.logprob)  # greedy picks the most likely
        assert bytes(t.bytes or []).decode() == t.token
    streamed = [
        t
        for c in client.chat.completions.create(**kwargs, stream=True)
        if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content
        for t in c.choices[0].logprobs.content
    ]
    assert [(t.token, round(t.logprob, 4)) for t in streamed] == [
        (t.token, round(t.logprob, 4)) for t in content
    ]
    text = client.completions.create(
        model="smollm2", prompt="The capital of France is", max_tokens=3, logprobs=2
    )
    lp = text.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and "".join(lp.tokens) == text.choices[0].text
    assert lp.top_logprobs is not None and all(len(top) == 2 for top in lp.top_logprobs)
