"""OpenAI Responses requests -> chat parameters, and chat output -> output items and stream events,
without a server."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from zinc.engine.tool_calls import ToolCallDelta
from zinc.engine.types import TokenLogprob, TopLogprob, Usage
from zinc.errors import InvalidRequestError, QueueFullError
from zinc.server.openai_response import Output
from zinc.server.responses_request import parse_responses
from zinc.server.responses_response import EventStream, OutputItems, failure, response_object, usage_json

TOOL: Any = {
    "type": "function",
    "name": "f",
    "description": "F.",
    "parameters": {"type": "object"},
    "strict": True,
}
CALL: Any = {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": '{"a":1}', "id": "fc_1"}


def parse(**body: Any) -> Any:
    return parse_responses({"input": "hi", **body})


def test_string_input_and_fields_map_onto_chat_params() -> None:
    params = parse(
        model="m", instructions="Be brief.", max_output_tokens=7, temperature=0.5, top_p=0.9, stream=True,
        metadata={"k": "v"}, store=True, include=["reasoning.encrypted_content"], seed=3,
    )  # fmt: skip
    chat = params.chat
    assert list(chat.messages) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    common = chat.common
    assert (common.model, common.max_tokens, common.stream, common.stop) == ("m", 7, True, ())
    assert (common.sampling.temperature, common.sampling.top_p, common.sampling.seed) == (0.5, 0.9, 3)
    assert chat.template_kwargs == {} and not chat.tools.active and common.grammar is None
    echo = params.echo
    assert echo["metadata"] == {"k": "v"} and echo["instructions"] == "Be brief."
    assert echo["store"] is False and echo["previous_response_id"] is None  # nothing is kept
    assert (echo["max_output_tokens"], echo["temperature"], echo["top_p"]) == (7, 0.5, 0.9)
    assert echo["text"] == {"format": {"type": "text"}} and echo["tool_choice"] == "none"
    assert parse().chat.common.max_tokens == 256  # chat completions' default


def test_items_become_chat_messages() -> None:
    items: Any = [
        {"role": "developer", "content": "Rules."},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "a"}, {"type": "input_image", "image_url": "x"},
            {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "t"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
        CALL,
        {**CALL, "call_id": "call_2", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "one"},
        {"type": "function_call_output", "call_id": "call_2",
         "output": [{"type": "input_text", "text": "two"}, {"type": "input_image", "image_url": "y"}]},
        {"role": "user", "content": "thanks"},
        {**CALL, "call_id": "call_3"},
    ]  # fmt: skip
    assert list(parse(input=items).chat.messages) == [
        {"role": "system", "content": "Rules."},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}},
            {"id": "call_2", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "one"},
        {"role": "tool", "tool_call_id": "call_2", "content": "two"},
        {"role": "user", "content": "thanks"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_3", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}]},
    ]  # fmt: skip


def test_flat_tools_and_tool_choice() -> None:
    params = parse(tools=[TOOL, {**TOOL, "name": "g", "parameters": None}])
    assert params.chat.tools.tools == (
        {"type": "function", "function": {"name": "f", "description": "F.", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "g", "description": "F.",
                                          "parameters": {"type": "object", "properties": {}}}},
    )  # fmt: skip
    assert params.chat.tools.choice == "auto" and params.chat.tools.grammar() is None
    assert params.echo["tool_choice"] == "auto" and [t["name"] for t in params.echo["tools"]] == ["f", "g"]
    forced = parse(tools=[TOOL], tool_choice={"type": "function", "name": "f"})
    assert forced.chat.tools.choice == "f" and forced.chat.tools.grammar() is not None
    assert forced.echo["tool_choice"] == {"type": "function", "name": "f"}
    assert parse(tools=[TOOL], tool_choice="required").chat.tools.choice == "required"
    assert not parse(tools=[TOOL], tool_choice="none").chat.tools.active
    allowed = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "g"}]}
    narrowed = parse(tools=[TOOL, {**TOOL, "name": "g"}], tool_choice=allowed).chat.tools
    assert narrowed.choice == "required" and [t["function"]["name"] for t in narrowed.tools] == ["g"]


def test_text_format_becomes_a_grammar() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    fmt = {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}
    params = parse(text={"format": fmt})
    assert params.chat.common.grammar is not None and params.echo["text"] == {"format": fmt}
    assert parse(text={"format": {"type": "json_object"}}).chat.common.grammar is not None
    assert parse(text={"format": {"type": "text"}, "verbosity": "low"}).chat.common.grammar is None


@pytest.mark.parametrize(
    ("effort", "kwargs"), [(None, {}), ("none", {"enable_thinking": False}), ("low", {"enable_thinking": True}),
                           ("high", {"enable_thinking": True})],
)  # fmt: skip
def test_reasoning_effort_is_the_thinking_switch(effort: Any, kwargs: Any) -> None:
    params = parse(reasoning={"effort": effort, "summary": "auto"})
    assert params.chat.template_kwargs == kwargs
    assert params.echo["reasoning"] == {"effort": effort, "summary": "auto"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": 3}, "input"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
        ({"input": ["hi"]}, "input[0]"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": ["user"], "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": [{"text": "x"}]}]}, "input[0].content[0]"),
        ({"input": [{"role": "user", "content": [{"type": "input_text", "text": 1}]}]}, "input[0].content[0].text"),
        ({"input": [{**CALL, "arguments": {"a": 1}}]}, "input[0].arguments"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, "input[0].type"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"store": "yes"}, "store"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"max_output_tokens": "many"}, "max_output_tokens"),
        ({"instructions": ["x"]}, "instructions"),
        ({"temperature": "hot"}, "temperature"),
        ({"metadata": {"k": 1}}, "metadata"),
        ({"metadata": {str(i): "v" for i in range(17)}}, "metadata"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
        ({"tools": [TOOL], "tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "g"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"text": {"format": {"type": "json_object"}}, "tools": [TOOL], "tool_choice": "required"}, "text.format"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"reasoning": {"summary": "long"}}, "reasoning.summary"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"include": "message.output_text.logprobs"}, "include"),
    ],
)  # fmt: skip
def test_bad_requests_name_their_param(body: Any, param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        parse(**body)
    assert caught.value.param == param
    assert ".function." not in caught.value.message  # the flat tool shape's names


def test_logprobs_when_included() -> None:
    included = parse(include=["message.output_text.logprobs"], top_logprobs=3)
    assert included.chat.common.logprobs == 3 and included.echo["top_logprobs"] == 3
    assert parse(include=["message.output_text.logprobs"]).chat.common.logprobs == 0
    assert parse(top_logprobs=3, include=["reasoning.encrypted_content"]).chat.common.logprobs is None


def test_previous_response_id_says_why() -> None:
    with pytest.raises(InvalidRequestError, match="stores no responses"):
        parse(previous_response_id="resp_1")


# ---- output items and events


def items_of(*outputs: Output, status: str = "completed") -> tuple[list[Any], list[Any]]:
    items = OutputItems()
    events = [e for out in outputs for e in items.feed(out)] + items.finish(status)
    return items.output, events


def test_reasoning_message_and_call_items() -> None:
    call = ToolCallDelta(0, "call_abc", "f", '{"a": ')
    output, events = items_of(
        Output(reasoning="Hm"), Output(reasoning="m."), Output(content="Sure."), Output(tool_calls=[call]),
        Output(tool_calls=[ToolCallDelta(0, arguments="1}")]), Output(content="\n"),
    )  # fmt: skip
    assert [{k: v for k, v in item.items() if k != "id"} for item in output] == [
        {"type": "reasoning", "status": "completed", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Hmm."}]},
        {"type": "message", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "Sure.", "annotations": [], "logprobs": []}]},
        {"type": "function_call", "status": "completed", "arguments": '{"a": 1}', "call_id": "call_abc", "name": "f"},
    ]  # fmt: skip
    assert output[0]["id"].startswith("rs_") and output[1]["id"].startswith("msg_")
    assert output[2]["id"].startswith("fc_")
    kinds = [e["type"].removeprefix("response.") for e in events]
    assert kinds == [
        "output_item.added", "content_part.added", "reasoning_text.delta", "reasoning_text.delta",
        "reasoning_text.done", "content_part.done", "output_item.done",
        "output_item.added", "content_part.added", "output_text.delta",
        "output_text.done", "content_part.done", "output_item.done",
        "output_item.added", "function_call_arguments.delta", "function_call_arguments.delta",
        "function_call_arguments.done", "output_item.done",
    ]  # fmt: skip
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [e["output_index"] for e in added] == [0, 1, 2]
    assert (
        added[1]["item"]["content"] == [] and added[2]["item"]["arguments"] == ""
    )  # a snapshot, not the item
    assert all(e["item_id"] == output[e["output_index"]]["id"] for e in events if "item_id" in e)
    done = [e for e in events if e["type"].endswith(".done") and "item" not in e and "part" not in e]
    assert [e.get("text", e.get("arguments")) for e in done] == ["Hmm.", "Sure.", '{"a": 1}']


def test_empty_whitespace_and_cut_short_outputs() -> None:
    output, events = items_of()
    assert output[0]["content"][0]["text"] == "" and output[0]["type"] == "message"
    assert "response.output_text.delta" not in [e["type"] for e in events]
    assert items_of(Output(content="  "))[0][0]["content"][0]["text"] == "  "
    cut = ToolCallDelta(0, "call_1", "f", '{"a": "unfin')
    output, events = items_of(Output(content="x"), Output(tool_calls=[cut]), status="incomplete")
    assert [item["status"] for item in output] == ["completed", "incomplete"]
    assert events[-1]["item"]["status"] == "incomplete" and output[1]["arguments"] == '{"a": "unfin'


def test_logprobs_go_with_the_message_text() -> None:
    def lp(token: str) -> TokenLogprob:
        return TokenLogprob(token, token.encode(), -0.5, (TopLogprob(token, token.encode(), -0.5),))

    output, events = items_of(
        Output(reasoning="r", logprobs=[lp("r")]), Output(content=" ", logprobs=[lp(" ")]),
        Output(content="a", logprobs=[lp("a")]), Output(content="b", logprobs=[lp("b")]),
    )  # fmt: skip
    part = output[1]["content"][0]
    assert part["text"] == " ab" and [t["token"] for t in part["logprobs"]] == [" ", "a", "b"]
    assert part["logprobs"][0] == {"token": " ", "logprob": -0.5, "bytes": [32],
                                   "top_logprobs": [{"token": " ", "logprob": -0.5, "bytes": [32]}]}  # fmt: skip
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [[t["token"] for t in e["logprobs"]] for e in deltas] == [[" ", "a"], ["b"]]
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert done["logprobs"] == part["logprobs"]


def test_response_object_usage_and_stream_framing() -> None:
    usage = usage_json(Usage(10, 4, 6), 3)
    assert usage == {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 6}, "output_tokens": 4,
                     "output_tokens_details": {"reasoning_tokens": 3}, "total_tokens": 14}  # fmt: skip
    head = {"id": "resp_1", "created_at": 5, "model": "m", "metadata": {"k": "v"}}
    cut = response_object(head, "incomplete", [{"type": "message"}], usage, "max_output_tokens")
    assert cut["incomplete_details"] == {"reason": "max_output_tokens"} and cut["completed_at"] is None
    assert (cut["object"], cut["metadata"], cut["output"], cut["usage"]) == (
        "response",
        {"k": "v"},
        [{"type": "message"}],
        usage,
    )
    started = response_object(head, "in_progress", [{"type": "message"}])
    assert started["output"] == [] and started["usage"] is None and started["incomplete_details"] is None
    assert response_object(head, "completed", [], usage)["completed_at"] is not None
    frames = EventStream()
    first, second = frames.frame({"type": "response.created"}), frames.frame({"type": "a.b", "x": 1})
    assert first == b'event: response.created\ndata: {"type":"response.created","sequence_number":0}\n\n'
    assert orjson.loads(second.split(b"data: ")[1]) == {"type": "a.b", "x": 1, "sequence_number": 1}


def test_failures_mid_stream() -> None:
    event, error = failure(RuntimeError("secret"))
    assert (
        event["type"] == "error" and error["code"] == "server_error" and "secret" not in str((event, error))
    )
    event, error = failure(QueueFullError("busy"))
    assert (event["message"], error) == ("busy", {"code": "rate_limit_exceeded", "message": "busy"})
    assert failure(InvalidRequestError("bad", param="input"))[0]["param"] == "input"
