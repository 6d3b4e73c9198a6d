"""OpenAI Responses request bodies -> the chat path's validated parameters; no engine calls here.

Owns: `parse_responses`, for `POST /v1/responses`. `input` is a string (one user message) or an
array of items: messages (`user`, `assistant`, `system`, `developer` (rendered as `system`, which
every template knows); content a string or parts, of which `input_text`, `output_text` and
`refusal` are kept and images, files and audio ignored, as chat completions ignore non-text
parts), `function_call` (merged into the assistant message before it as `tool_calls`, as the
model wrote them), `function_call_output` (a `tool` message) and `reasoning` (dropped, as
templates drop past reasoning). `instructions` becomes the first (system) message.
`max_output_tokens`, `temperature`, `top_p` and `stream` are checked as chat completions check
them (with chat's extras `top_k`, `min_p`, `seed`, penalties, `logit_bias` and `session_id`).
`tools` (the flat function shape: `name`, `description`, `parameters`) and `tool_choice`
(`none`, `auto`, `required`, `{"type": "function", "name"}`, `allowed_tools`) become the chat
path's function tools; `text.format` (`json_schema`, `json_object`) the llguidance grammar;
`reasoning.effort` the template's `enable_thinking` (`none`: off; any other effort: on);
`top_logprobs` with `include: ["message.output_text.logprobs"]` the chat path's logprobs.
Nothing is stored: `store` is accepted and the response says `store: false`; a
`previous_response_id`, a `conversation` or an `item_reference` (which need stored responses),
`background` and `prompt` templates are a 400 that says so. `metadata` is checked (at most 16
string pairs) and echoed. `ResponsesParams.echo` holds the settings the Response object repeats.
Imports: zinc.engine.grammars, zinc.engine.types, zinc.errors, zinc.server.{openai_features,
openai_request}, the stdlib.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from zinc.engine.grammars import json_object_grammar, json_schema_grammar
from zinc.engine.types import Grammar
from zinc.errors import InvalidRequestError
from zinc.server.openai_features import MAX_TOP_LOGPROBS, ToolParams, parse_tools
from zinc.server.openai_request import ChatParams, _parse_common

Json = dict[str, Any]
COMMON_FIELDS = (
    "model", "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
    "repeat_penalty", "logit_bias", "stream", "session_id",
)  # fmt: skip
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = ("input_text", "output_text", "refusal")
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
SUMMARIES = ("auto", "concise", "detailed")
STORED_ONLY = {  # fields that continue what a server stored, and what they would continue
    "previous_response_id": "an earlier response",
    "conversation": "a stored conversation",
}
LOGPROBS = "message.output_text.logprobs"  # the `include` entry that asks for them
METADATA_PAIRS, METADATA_KEY, METADATA_VALUE = 16, 64, 512


@dataclass(frozen=True)
class ResponsesParams:
    chat: ChatParams
    echo: Json  # the request's settings as the Response object repeats them


def parse_responses(payload: Json) -> ResponsesParams:
    _refuse_stored(payload)
    max_output = payload.get("max_output_tokens")
    if max_output is not None and (not _is_int(max_output) or max_output < 1):
        raise InvalidRequestError(
            "'max_output_tokens' must be an integer of at least 1.", param="max_output_tokens"
        )
    fields = {k: payload[k] for k in COMMON_FIELDS if k in payload}
    common = _parse_common({**fields, "max_tokens": max_output})
    text_format, grammar = _text_format(payload.get("text"))
    tools = _tools(payload)
    if tools.grammar() is not None and grammar is not None:
        raise InvalidRequestError(
            "'text.format' cannot be combined with a forced 'tool_choice'.", param="text.format"
        )
    common = replace(common, grammar=grammar, logprobs=_logprobs(payload))
    instructions = payload.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequestError("'instructions' must be a string.", param="instructions")
    messages = [{"role": "system", "content": instructions}] if instructions else []
    messages.extend(_input(payload.get("input")))
    reasoning, kwargs = _reasoning(payload.get("reasoning"))
    echo: Json = {
        "instructions": instructions,
        "max_output_tokens": max_output,
        "metadata": _metadata(payload.get("metadata")),
        "parallel_tool_calls": payload.get("parallel_tool_calls", True) is not False,
        "previous_response_id": None,
        "reasoning": reasoning,
        "store": False,
        "temperature": common.sampling.temperature,
        "text": {"format": text_format},
        "tool_choice": payload.get("tool_choice") or ("auto" if tools.tools else "none"),
        "tools": _echo_tools(tools),
        "top_logprobs": payload.get("top_logprobs"),
        "top_p": common.sampling.top_p,
        "truncation": "disabled",
    }
    return ResponsesParams(ChatParams(common, tuple(messages), kwargs, tools), echo)


def _refuse_stored(payload: Json) -> None:
    for name, what in STORED_ONLY.items():
        if payload.get(name) is not None:
            raise InvalidRequestError(
                f"'{name}' is not supported: this server stores no responses (every response is "
                f"store: false), so {what} cannot be continued; send the whole conversation in "
                "'input' (its unchanged prefix is reused from the KV cache).",
                param=name,
            )
    store = payload.get("store")
    if store is not None and not isinstance(store, bool):
        raise InvalidRequestError("'store' must be a boolean.", param="store")
    if payload.get("background"):
        raise InvalidRequestError(
            "'background' responses are not supported by this server.", param="background"
        )
    if payload.get("prompt") is not None:
        raise InvalidRequestError("'prompt' templates are not supported by this server.", param="prompt")


def _logprobs(payload: Json) -> int | None:
    """None, or how many alternatives each output token's logprob carries (`top_logprobs`); the
    logprobs are returned when `include` asks for `message.output_text.logprobs`."""
    include = payload.get("include")
    if include is not None and not (isinstance(include, list) and all(isinstance(s, str) for s in include)):
        raise InvalidRequestError("'include' must be an array of strings.", param="include")
    top = payload.get("top_logprobs")
    if top is not None and (not _is_int(top) or not 0 <= top <= MAX_TOP_LOGPROBS):
        raise InvalidRequestError(
            f"'top_logprobs' must be an integer from 0 to {MAX_TOP_LOGPROBS}.", param="top_logprobs"
        )
    return (top or 0) if LOGPROBS in (include or ()) else None


def _input(value: Any) -> list[Json]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InvalidRequestError("'input' must be a string or a non-empty array of items.", param="input")
    messages: list[Json] = []
    for i, item in enumerate(value):
        _item(messages, f"input[{i}]", item)
    if not messages:
        raise InvalidRequestError(
            "'input' holds no message, function call or function output.", param="input"
        )
    return messages


def _item(messages: list[Json], where: str, item: Any) -> None:
    if not isinstance(item, dict):
        raise InvalidRequestError(f"'{where}' must be an object.", param=where)
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        role = ROLES.get(role) if isinstance(role, str) else None
        if role is None:
            param = f"{where}.role"
            raise InvalidRequestError(
                f"'{param}' must be 'user', 'assistant', 'system' or 'developer'.", param=param
            )
        messages.append({"role": role, "content": _text(f"{where}.content", item.get("content"))})
    elif kind == "function_call":
        name, call_id = _string(where, item, "name"), _string(where, item, "call_id")
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": _string(where, item, "arguments")},
        }
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)  # parallel calls, or text then a call
        else:
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        output = _text(f"{where}.output", item.get("output"))
        messages.append({"role": "tool", "tool_call_id": _string(where, item, "call_id"), "content": output})
    elif kind == "item_reference":
        raise InvalidRequestError(
            f"'{where}': item references are not supported: this server stores no responses; send the item itself.",
            param=where,
        )
    elif kind != "reasoning":
        raise InvalidRequestError(
            f"'{where}.type' {kind!r} is not supported: input items are messages, function_call, "
            "function_call_output and reasoning.",
            param=f"{where}.type",
        )


def _text(where: str, content: Any) -> str:
    """A string, or the text of an array of content parts (images, files, audio ignored)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError(f"'{where}' must be a string or an array of content parts.", param=where)
    texts = []
    for i, part in enumerate(content):
        at = f"{where}[{i}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise InvalidRequestError(f"'{at}' must be an object with a 'type'.", param=at)
        if part["type"] in TEXT_PARTS:
            texts.append(_string(at, part, "refusal" if part["type"] == "refusal" else "text"))
    return "\n".join(texts)


def _string(where: str, item: Json, name: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise InvalidRequestError(f"'{where}.{name}' must be a string.", param=f"{where}.{name}")
    return value


def _tools(payload: Json) -> ToolParams:
    tools = payload.get("tools")
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise InvalidRequestError("'tools' must be an array of function tools.", param="tools")
    functions = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise InvalidRequestError(
                f"'tools[{i}]': only function tools (type 'function') are supported, not {kind!r}.",
                param=f"tools[{i}]",
            )
        function = {"name": tool.get("name"), "parameters": tool.get("parameters")}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        functions.append({"type": "function", "function": function})
    choice, functions = _tool_choice(payload.get("tool_choice"), functions)
    try:
        return parse_tools(
            {
                "tools": functions,
                "tool_choice": choice,
                "parallel_tool_calls": payload.get("parallel_tool_calls"),
            }
        )
    except InvalidRequestError as exc:  # the chat path's names ("tools[0].function.name") in the flat shape
        param = exc.param.replace(".function.", ".") if exc.param else None
        raise InvalidRequestError(exc.message.replace(".function.", "."), param=param) from None


def _tool_choice(choice: Any, functions: list[Json]) -> tuple[Any, list[Json]]:
    """The chat path's `tool_choice` and the functions it may use (`allowed_tools` narrows them)."""
    if choice is None or isinstance(choice, str):
        return choice, functions
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}, functions
    if kind == "allowed_tools":
        allowed = choice.get("tools")
        mode = choice.get("mode")
        if not isinstance(allowed, list) or mode not in ("auto", "required"):
            raise InvalidRequestError(
                "'tool_choice' allowed_tools needs 'mode' ('auto' or 'required') and an array 'tools'.",
                param="tool_choice",
            )
        names = [t.get("name") for t in allowed if isinstance(t, dict) and t.get("type") == "function"]
        return mode, [f for f in functions if f["function"]["name"] in names]
    raise InvalidRequestError(
        "'tool_choice' must be 'none', 'auto', 'required', {'type': 'function', 'name': ...} or allowed_tools.",
        param="tool_choice",
    )


def _echo_tools(tools: ToolParams) -> list[Json]:
    """The request's function tools in the Responses shape, as the Response object lists them."""
    out = []
    for tool in tools.tools:
        function = tool["function"]
        out.append({"type": "function", "name": function["name"], "description": function.get("description"),
                    "parameters": function["parameters"], "strict": False})  # fmt: skip
    return out


def _text_format(text: Any) -> tuple[Json, Grammar | None]:
    if text is None:
        return {"type": "text"}, None
    if not isinstance(text, dict):
        raise InvalidRequestError("'text' must be an object.", param="text")
    fmt = text.get("format")
    if fmt is None:
        return {"type": "text"}, None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return {"type": "text"}, None
    if kind == "json_object":
        return {"type": "json_object"}, json_object_grammar()
    if kind == "json_schema":
        assert isinstance(fmt, dict)
        if not isinstance(fmt.get("schema"), dict | bool):
            raise InvalidRequestError(
                "'text.format.schema' must be a JSON Schema object.", param="text.format.schema"
            )
        return dict(fmt), json_schema_grammar(fmt["schema"], "text.format.schema")
    raise InvalidRequestError(
        "'text.format.type' must be 'text', 'json_object' or 'json_schema'.", param="text.format.type"
    )


def _reasoning(value: Any) -> tuple[Json | None, Json]:
    """`reasoning` as the Response echoes it, and as chat template arguments."""
    if value is None:
        return None, {}
    if not isinstance(value, dict):
        raise InvalidRequestError("'reasoning' must be an object.", param="reasoning")
    effort = value.get("effort")
    if effort is not None and effort not in EFFORTS:
        allowed = ", ".join(f"'{e}'" for e in EFFORTS)
        raise InvalidRequestError(f"'reasoning.effort' must be one of {allowed}.", param="reasoning.effort")
    for name in ("summary", "generate_summary"):
        if value.get(name) is not None and value[name] not in SUMMARIES:
            raise InvalidRequestError(
                f"'reasoning.{name}' must be 'auto', 'concise' or 'detailed'.", param=f"reasoning.{name}"
            )
    echo = {"effort": effort, "summary": value.get("summary") or value.get("generate_summary")}
    return echo, ({} if effort is None else {"enable_thinking": effort != "none"})


def _metadata(value: Any) -> Json | None:
    if value is None:
        return None
    ok = isinstance(value, dict) and len(value) <= METADATA_PAIRS
    ok = ok and all(
        isinstance(k, str) and isinstance(v, str) and len(k) <= METADATA_KEY and len(v) <= METADATA_VALUE
        for k, v in value.items()
    )
    if not ok:
        raise InvalidRequestError(
            f"'metadata' must be an object of at most {METADATA_PAIRS} string pairs "
            f"(keys up to {METADATA_KEY} characters, values up to {METADATA_VALUE}).",
            param="metadata",
        )
    return dict(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
