"""Anthropic Messages request bodies -> the chat path's validated parameters; no engine calls here.

Owns: `parse_messages`, for `POST /v1/messages` and (with `count_only`, where `max_tokens` is not
asked for) `POST /v1/messages/count_tokens`. `max_tokens` is required (a missing one is a 400);
`model`, `temperature`, `top_p`, `top_k` and `stream` are checked as chat completions check them;
`stop_sequences` become the request's stop strings; `metadata` is ignored. `system` (a string or
text blocks) becomes the first message. Message content is a string or blocks: `text`,
`tool_use` (assistant: becomes its `tool_calls`), `tool_result` (user: becomes a `tool` message,
content a string or text blocks), `thinking`/`redacted_thinking` (dropped, as templates drop past
reasoning); other blocks (images, documents) are ignored, as chat completions ignore non-text
parts. `tools` (`name`, `description`, `input_schema`) and `tool_choice` (`auto`, `any`, `tool`,
`none`) become the chat path's function tools; `thinking` becomes the template's
`enable_thinking` switch (`disabled`: off; `enabled`, `adaptive`, `between_tools`: on; a
template without the switch ignores it; `budget_tokens` is not enforced).
Imports: zinc.errors, zinc.server.{openai_features, openai_request}, orjson, the stdlib.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from zinc.errors import InvalidRequestError
from zinc.server.openai_features import ToolParams, parse_tools
from zinc.server.openai_request import ChatParams, _parse_common

Json = dict[str, Any]
COMMON_FIELDS = ("model", "max_tokens", "temperature", "top_p", "top_k", "stream")
THINKING_TYPES = ("enabled", "adaptive", "between_tools", "disabled")


def parse_messages(payload: Json, *, count_only: bool = False) -> ChatParams:
    if payload.get("max_tokens") is None and not count_only:
        raise InvalidRequestError("max_tokens: Field required", param="max_tokens")
    common = _parse_common({k: payload[k] for k in COMMON_FIELDS if k in payload})
    common = replace(common, stop=_stop_sequences(payload.get("stop_sequences")))
    if count_only:
        common = replace(common, stream=False)
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages: a non-empty array is required", param="messages")
    converted = _system(payload.get("system"))
    for i, message in enumerate(messages):
        converted.extend(_message(i, message))
    return ChatParams(common, tuple(converted), _thinking(payload.get("thinking")), _tools(payload))


def _stop_sequences(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise InvalidRequestError("stop_sequences: must be an array of strings", param="stop_sequences")
    return tuple(dict.fromkeys(s for s in value if s))


def _system(value: Any) -> list[Json]:
    if value is None:
        return []
    text = value if isinstance(value, str) else _texts("system", value, allow_other=False)
    return [{"role": "system", "content": text}] if text else []


def _texts(where: str, blocks: Any, *, allow_other: bool) -> str:
    """The text of a string or of an array of blocks (other blocks ignored when `allow_other`)."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise InvalidRequestError(f"{where}: must be a string or an array of content blocks", param=where)
    texts = []
    for i, block in enumerate(blocks):
        kind = _block_type(f"{where}.{i}", block)
        if kind == "text":
            texts.append(_field(f"{where}.{i}", block, "text", str))
        elif not allow_other:
            raise InvalidRequestError(f"{where}.{i}: only text blocks are allowed here", param=f"{where}.{i}")
    return "\n".join(texts)


def _message(index: int, message: Any) -> list[Json]:
    where = f"messages.{index}"
    if not isinstance(message, dict):
        raise InvalidRequestError(f"{where}: must be an object", param=where)
    role = message.get("role")
    if role not in ("user", "assistant"):
        raise InvalidRequestError(f"{where}.role: must be 'user' or 'assistant'", param=f"{where}.role")
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        param = f"{where}.content"
        raise InvalidRequestError(f"{param}: must be a string or an array of content blocks", param=param)
    texts: list[str] = []
    results: list[Json] = []
    calls: list[Json] = []
    for i, block in enumerate(content):
        at = f"{where}.content.{i}"
        kind = _block_type(at, block)
        if kind == "text":
            texts.append(_field(at, block, "text", str))
        elif kind == "tool_result" and role == "user":
            text = _texts(f"{at}.content", block.get("content", ""), allow_other=True)
            results.append(
                {"role": "tool", "tool_call_id": _field(at, block, "tool_use_id", str), "content": text}
            )
        elif kind == "tool_use" and role == "assistant":
            arguments = orjson.dumps(_field(at, block, "input", dict)).decode()
            function = {"name": _field(at, block, "name", str), "arguments": arguments}
            calls.append({"id": _field(at, block, "id", str), "type": "function", "function": function})
        elif kind in ("tool_result", "tool_use"):
            raise InvalidRequestError(f"{at}: a {kind} block cannot be in a {role} message", param=at)
    if role == "assistant":
        return [{"role": role, "content": "\n".join(texts), **({"tool_calls": calls} if calls else {})}]
    if results and not texts:
        return results
    return [*results, {"role": role, "content": "\n".join(texts)}]


def _block_type(where: str, block: Any) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise InvalidRequestError(f"{where}: must be an object with a 'type'", param=where)
    kind: str = block["type"]
    return kind


def _field(where: str, block: Json, name: str, kind: type) -> Any:
    value = block.get(name)
    if not isinstance(value, kind):
        noun = "a string" if kind is str else "an object"
        raise InvalidRequestError(f"{where}.{name}: must be {noun}", param=f"{where}.{name}")
    return value


def _thinking(value: Any) -> Json:
    """`thinking` as chat template arguments: `enable_thinking` when the request says."""
    if value is None:
        return {}
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in THINKING_TYPES:
        allowed = ", ".join(f"'{t}'" for t in THINKING_TYPES)
        raise InvalidRequestError(f"thinking.type: must be one of {allowed}", param="thinking.type")
    budget = value.get("budget_tokens")
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool)):
        raise InvalidRequestError(
            "thinking.budget_tokens: must be an integer", param="thinking.budget_tokens"
        )
    return {"enable_thinking": kind != "disabled"}


def _tools(payload: Json) -> ToolParams:
    tools = payload.get("tools")
    choice = payload.get("tool_choice")
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise InvalidRequestError("tools: must be an array", param="tools")
    functions = []
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        if not isinstance(tool, dict) or tool.get("type", "custom") not in ("custom", None):
            raise InvalidRequestError(
                f"{where}: only custom tools (name, input_schema) are supported", param=where
            )
        function = {"name": tool.get("name"), "parameters": _field(where, tool, "input_schema", dict)}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        functions.append({"type": "function", "function": function})
    return parse_tools({"tools": functions, "tool_choice": _tool_choice(choice)})


def _tool_choice(choice: Any) -> Any:
    if choice is None:
        return None
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    modes = {"auto": "auto", "any": "required", "none": "none"}
    if kind not in modes:
        raise InvalidRequestError(
            "tool_choice.type: must be 'auto', 'any', 'tool' or 'none'", param="tool_choice.type"
        )
    return modes[kind]
