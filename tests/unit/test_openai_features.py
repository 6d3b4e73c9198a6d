"""Tool calls, reasoning, logprobs and response_format through the OpenAI API layer, with the fake
engine scripted to write what a model would."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.fakes import FakeEngine, async_test
from tests.unit.test_openai_api import CHAT, HI, TEXT, Client

TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}}}}  # fmt: skip
CALL_TEXT = 'Checking.\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>'


def chunks(response: Any) -> list[dict[str, Any]]:
    events = response.events()
    assert events[-1] == "[DONE]"
    return [orjson.loads(e) for e in events[:-1]]


@async_test
async def test_tool_call_whole_response() -> None:
    client = Client(FakeEngine(script=CALL_TEXT))
    response = await client.chat(tools=[TOOL], max_tokens=100)
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "Checking.\n"
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_time", "arguments": '{"tz": "UTC"}'}
    # the tools went to the template, and no grammar was imposed ("auto")
    assert client.engine.template_calls[-1][1]["tools"] == [TOOL]
    assert client.engine.requests[-1].grammar is None


@async_test
async def test_tool_call_stream_is_incremental() -> None:
    client = Client(FakeEngine(script=CALL_TEXT, script_piece=2))
    items = chunks(await client.chat(tools=[TOOL], max_tokens=100, stream=True))
    deltas = [tc for c in items for tc in c["choices"][0]["delta"].get("tool_calls", []) if c["choices"]]
    assert deltas[0] == {
        "index": 0,
        "id": deltas[0]["id"],
        "type": "function",
        "function": {"name": "get_time", "arguments": ""},
    }
    assert len(deltas) > 3 and all(set(d) == {"index", "function"} for d in deltas[1:])
    assert "".join(d["function"]["arguments"] for d in deltas) == '{"tz": "UTC"}'
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in items if c["choices"])
    assert content == "Checking.\n" and "<" not in content
    assert items[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(
    ("choice", "kind"),
    [
        ("required", "tool_call"),
        ({"type": "function", "function": {"name": "get_time"}}, "tool_call"),
        ("auto", None),
    ],
)
@async_test
async def test_tool_choice_forcing_uses_a_grammar(choice: Any, kind: str | None) -> None:
    client = Client(FakeEngine(script=CALL_TEXT))
    await client.chat(tools=[TOOL], tool_choice=choice, max_tokens=100)
    grammar = client.engine.requests[-1].grammar
    assert (grammar.kind if grammar else None) == kind
    if grammar is not None:
        assert "get_time" in grammar.source


@async_test
async def test_tool_choice_none_and_disabled_tool_calling(monkeypatch: pytest.MonkeyPatch) -> None:
    for env, choice in (("1", "none"), ("0", "auto")):
        monkeypatch.setenv("ZINC_TOOL_CALLING", env)
        client = Client(FakeEngine(script=CALL_TEXT))
        response = await client.chat(tools=[TOOL], tool_choice=choice, max_tokens=100)
        choice_json = response.json()["choices"][0]
        assert "tools" not in client.engine.template_calls[-1][1]
        assert choice_json["finish_reason"] == "stop" and "tool_calls" not in choice_json["message"]
        assert choice_json["message"]["content"] == CALL_TEXT  # not parsed


@async_test
async def test_history_with_tool_calls_and_results_is_accepted() -> None:
    client = Client(FakeEngine())
    messages = [*HI, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]  # fmt: skip
    response = await client.call("POST", CHAT, {"messages": messages, "tools": [TOOL], "max_tokens": 2})
    assert response.status == 200
    sent = client.engine.template_calls[-1][0]
    assert sent[1]["tool_calls"][0]["function"]["name"] == "get_time" and sent[2]["tool_call_id"] == "call_1"
    bad = await client.call(
        "POST", CHAT, {"messages": [{"role": "assistant", "tool_calls": [{"function": 1}]}]}
    )
    assert bad.status == 400 and bad.json()["error"]["param"] == "messages[0].tool_calls[0]"


@pytest.mark.parametrize("stream", [False, True])
@async_test
async def test_reasoning_is_split_from_content(stream: bool) -> None:
    client = Client(FakeEngine(script="<think>\nThe user greets.\n</think>\n\nHello there!", script_piece=2))
    response = await client.chat(max_tokens=100, stream=stream, enable_thinking=True)
    assert client.engine.template_calls[-1][1]["enable_thinking"] is True
    if stream:
        items = [c["choices"][0]["delta"] for c in chunks(response) if c["choices"]]
        reasoning = "".join(d.get("reasoning_content", "") for d in items)
        content = "".join(d.get("content", "") for d in items)
    else:
        message = response.json()["choices"][0]["message"]
        reasoning, content = message["reasoning_content"], message["content"]
    assert (reasoning, content) == ("\nThe user greets.\n", "Hello there!")


@async_test
async def test_chat_template_kwargs_enable_thinking_is_passed() -> None:
    client = Client()
    await client.chat(max_tokens=1, chat_template_kwargs={"enable_thinking": False})
    assert client.engine.template_calls[-1][1]["enable_thinking"] is False


@async_test
async def test_chat_logprobs_whole_and_streamed_agree() -> None:
    client = Client()
    whole = (await client.chat(max_tokens=6, logprobs=True, top_logprobs=2)).json()["choices"][0]
    content = whole["logprobs"]["content"]
    assert len(content) == 6 and "".join(t["token"] for t in content) == whole["message"]["content"]
    assert all(len(t["top_logprobs"]) == 2 and t["bytes"] == list(t["token"].encode()) for t in content)
    streamed = [
        t
        for c in chunks(await client.chat(max_tokens=6, logprobs=True, top_logprobs=2, stream=True))
        if c["choices"] and c["choices"][0]["logprobs"]
        for t in c["choices"][0]["logprobs"]["content"]
    ]
    assert streamed == content
    assert client.engine.requests[-1].logprobs == 2
    plain = (await client.chat(max_tokens=2)).json()["choices"][0]
    assert plain["logprobs"] is None and client.engine.requests[-1].logprobs is None


@async_test
async def test_completion_logprobs_shape() -> None:
    client = Client()
    choice = (await client.call("POST", TEXT, {"prompt": "hi", "max_tokens": 3, "logprobs": 2})).json()[
        "choices"
    ][0]
    lp = choice["logprobs"]
    assert lp["tokens"] == ["Hello", ",", " world"] and lp["text_offset"] == [0, 5, 6]
    assert lp["token_logprobs"] == [0.0, -0.25, -0.5] and all(len(t) == 2 for t in lp["top_logprobs"])
    events = chunks(
        await client.call("POST", TEXT, {"prompt": "hi", "max_tokens": 3, "logprobs": 0, "stream": True})
    )
    offsets = [
        o
        for e in events
        if e["choices"] and e["choices"][0]["logprobs"]
        for o in e["choices"][0]["logprobs"]["text_offset"]
    ]
    assert offsets == [0, 5, 6]


@pytest.mark.parametrize("endpoint", [CHAT, TEXT])
@async_test
async def test_response_format_becomes_a_grammar(endpoint: str) -> None:
    client = Client()
    base = {"messages": HI} if endpoint == CHAT else {"prompt": "hi"}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    assert (
        await client.call("POST", endpoint, {**base, "max_tokens": 1, "response_format": fmt})
    ).status == 200
    grammar = client.engine.requests[-1].grammar
    assert grammar is not None and grammar.kind == "json_schema"
    await client.call("POST", endpoint, {**base, "max_tokens": 1, "response_format": {"type": "json_object"}})
    assert client.engine.requests[-1].grammar is not None
    await client.call("POST", endpoint, {**base, "max_tokens": 1, "response_format": {"type": "text"}})
    assert client.engine.requests[-1].grammar is None
