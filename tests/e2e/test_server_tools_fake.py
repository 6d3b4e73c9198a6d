"""Tool calls and reasoning through a real loopback server and the official openai client, with the
fake engine scripted to emit a tool call (split into 2-character tokens) or a thinking block."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.e2e.test_server_fake_engine import HI, MODEL, RunningServer
from tests.fakes import FakeEngine

pytestmark = pytest.mark.e2e
TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time.",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
    },
}
CALLS = (
    '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>'
)


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    running = RunningServer(FakeEngine(script=CALLS, script_piece=2))
    yield openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=10)
    running.stop()


def test_openai_client_tool_calls_whole(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model=MODEL, messages=HI, tools=[TOOL], max_tokens=200)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_time", {"tz": "UTC"}), ("get_time", {"tz": "CET"})]  # fmt: skip
    assert len({c.id for c in calls}) == 2


def test_openai_client_reassembles_streamed_tool_calls(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=HI, tools=[TOOL], max_tokens=200, stream=True
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    n_deltas = 0
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        assert not delta.content
        for tc in delta.tool_calls or []:
            n_deltas += 1
            entry = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            if tc.id:
                entry["id"] = tc.id
            if tc.function and tc.function.name:
                entry["name"] = tc.function.name
            if tc.function and tc.function.arguments:
                entry["arguments"] += tc.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and n_deltas > 4
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("get_time", {"tz": "UTC"}), ("get_time", {"tz": "CET"})]  # fmt: skip
    assert all(c["id"].startswith("call_") for c in calls.values())


def test_openai_client_reasoning_content() -> None:
    running = RunningServer(FakeEngine(script="<think>Greeting.</think>\nHi!", script_piece=3))
    try:
        client = openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=10)
        out = client.chat.completions.create(
            model=MODEL,
            messages=HI,
            max_tokens=50,
            extra_body={"chat_template_kwargs": {"enable_thinking": True}},
        )
        message: Any = out.choices[0].message
        assert message.content == "Hi!" and message.reasoning_content == "Greeting."
    finally:
        running.stop()
