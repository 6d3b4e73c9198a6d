"""Anthropic Messages requests -> chat parameters, and chat output -> content blocks, without a server."""

from __future__ import annotations

from typing import Any

import pytest

from zinc.engine.tool_calls import ToolCallDelta
from zinc.engine.types import TextDelta
from zinc.errors import InvalidRequestError
from zinc.server.anthropic_request import parse_messages
from zinc.server.anthropic_response import ContentBlocks, error_body, is_anthropic_path, stop_info
from zinc.server.error_table import ServiceUnavailableError
from zinc.server.openai_response import Output

HI: Any = [{"role": "user", "content": "hi"}]
TOOL: Any = {"name": "f", "input_schema": {"type": "object"}}


def parse(**body: Any) -> Any:
    return parse_messages({"max_tokens": 10, "messages": HI, **body})


def test_fields_map_onto_chat_params() -> None:
    params = parse(
        stop_sequences=["a", "", "b", "a", "c", "d", "e"], stream=True, model="m", metadata={"x": 1}
    )
    assert params.common.stop == ("a", "b", "c", "d", "e")  # no OpenAI limit of 4
    assert params.common.stream and params.common.model == "m" and params.common.max_tokens == 10
    assert params.template_kwargs == {} and not params.tools.active
    assert parse_messages({"messages": HI, "stream": True}, count_only=True).common.stream is False


def test_messages_with_tool_results_and_ignored_blocks() -> None:
    messages: Any = [
        {"role": "user", "content": [{"type": "text", "text": "q"}, {"type": "image", "source": {}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hm", "signature": "s"},
            {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}},
            {"type": "tool_use", "id": "t2", "name": "f", "input": {}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "one", "is_error": True},
            {"type": "tool_result", "tool_use_id": "t2"},
        ]},
    ]  # fmt: skip
    params = parse(messages=messages, system="sys", tools=[TOOL])
    assert list(params.messages) == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}},
            {"id": "t2", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "one"},
        {"role": "tool", "tool_call_id": "t2", "content": ""},
    ]  # fmt: skip
    assert params.tools.tools == (
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
    )


@pytest.mark.parametrize(
    ("thinking", "kwargs"),
    [({"type": "enabled", "budget_tokens": 2048}, {"enable_thinking": True}),
     ({"type": "adaptive"}, {"enable_thinking": True}),
     ({"type": "disabled"}, {"enable_thinking": False})],
)  # fmt: skip
def test_thinking_config(thinking: Any, kwargs: Any) -> None:
    assert parse(thinking=thinking).template_kwargs == kwargs


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "x", "name": "f", "input": {}}]}]},
         "messages.0.content.0"),
        ({"messages": [{"role": "assistant", "content": [{"type": "text"}]}]}, "messages.0.content.0.text"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages.0.content"),
        ({"system": [{"type": "image"}]}, "system.0"),
        ({"stop_sequences": "x"}, "stop_sequences"),
        ({"thinking": {"type": "sometimes"}}, "thinking.type"),
        ({"thinking": {"type": "enabled", "budget_tokens": "lots"}}, "thinking.budget_tokens"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0"),
        ({"tools": [{"name": "f"}]}, "tools.0.input_schema"),
        ({"tools": [TOOL], "tool_choice": {"type": "maybe"}}, "tool_choice.type"),
        ({"tools": [TOOL], "tool_choice": {"type": "tool", "name": "g"}}, "tool_choice"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"temperature": "hot"}, "temperature"),
    ],
)  # fmt: skip
def test_bad_requests_name_their_param(body: Any, param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        parse(**body)
    assert caught.value.param == param


def test_tool_choice_modes() -> None:
    assert parse(tools=[TOOL]).tools.choice == "auto"
    assert (
        parse(tools=[TOOL], tool_choice={"type": "any", "disable_parallel_tool_use": True}).tools.choice
        == "required"
    )
    assert parse(tools=[TOOL], tool_choice={"type": "tool", "name": "f"}).tools.choice == "f"
    assert not parse(tools=[TOOL], tool_choice={"type": "none"}).tools.active


def blocks_of(*outputs: Output) -> tuple[list[Any], list[Any]]:
    blocks = ContentBlocks()
    events = [e for out in outputs for e in blocks.feed(out)] + blocks.finish()
    return blocks.content, events


def test_blocks_whitespace_after_a_call_opens_no_text_block() -> None:
    call = ToolCallDelta(0, "call_abc", "f", '{"a": ')
    content, events = blocks_of(Output(reasoning="r"), Output(content="x"), Output(tool_calls=[call]),
                                Output(tool_calls=[ToolCallDelta(0, arguments="1}")]), Output(content="\n"))  # fmt: skip
    assert content == [
        {"type": "thinking", "thinking": "r", "signature": ""},
        {"type": "text", "text": "x"},
        {"type": "tool_use", "id": "toolu_abc", "name": "f", "input": {"a": 1}},
    ]
    names = [name.removeprefix("content_block_") for name, _ in events]
    assert names == ["start", "delta", "stop", "start", "delta", "stop", "start", "delta", "delta", "stop"]
    starts = [e["index"] for name, e in events if name == "content_block_start"]
    stops = [e["index"] for name, e in events if name == "content_block_stop"]
    assert starts == stops == [0, 1, 2]


def test_blocks_empty_output_and_cut_short_arguments() -> None:
    assert blocks_of()[0] == [{"type": "text", "text": ""}]
    assert blocks_of(Output(content="  "))[0] == [{"type": "text", "text": "  "}]
    cut = ToolCallDelta(0, "call_1", "f", '{"a": "unfinish')
    assert blocks_of(Output(tool_calls=[cut]))[0] == [
        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
    ]


def test_stop_reasons_and_errors() -> None:
    assert stop_info(TextDelta("", finish_reason="stop", stop_sequence="X"), "stop", False) == (
        "stop_sequence",
        "X",
    )
    assert stop_info(TextDelta("", finish_reason="stop"), "stop", True) == ("tool_use", None)
    assert stop_info(None, "length", False) == ("max_tokens", None)
    assert stop_info(TextDelta("", finish_reason="stop"), "stop", False) == ("end_turn", None)
    assert error_body(ServiceUnavailableError("busy")) == (503, {"type": "error", "error": {
        "type": "overloaded_error", "message": "busy"}})  # fmt: skip
    assert error_body(RuntimeError("secret"))[1]["error"]["type"] == "api_error"
    assert "secret" not in str(error_body(RuntimeError("secret")))
    assert is_anthropic_path("/v1/messages") and is_anthropic_path("/messages/count_tokens")
    assert not is_anthropic_path("/v1/messagesx") and not is_anthropic_path("/v1/chat/completions")
