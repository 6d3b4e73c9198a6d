"""Request fields for tool calling, structured output and logprobs: validated into typed values.

Owns: `parse_tools` (`tools`, `tool_choice`, `parallel_tool_calls`), `parse_response_format`
(`{"type": "text" | "json_object" | "json_schema"}` -> a `Grammar` or None),
`parse_chat_logprobs` (`logprobs` bool + `top_logprobs` 0..20), `parse_completion_logprobs`
(`logprobs` int 0..20) and `check_tool_history` (assistant `tool_calls` and `tool` messages). A
wrong type or value is a 400 `invalid_request_error` naming the `param`.
`ZINC_TOOL_CALLING=0` in the environment turns tool calling off: `tools` are then accepted and
ignored (not rendered, not parsed), as with `tool_choice: "none"`.
Imports: zinc.engine (types, grammars), zinc.errors, the stdlib.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from zinc.engine.grammars import json_object_grammar, json_schema_grammar, tool_call_grammar
from zinc.engine.types import Grammar
from zinc.errors import InvalidRequestError

Json = dict[str, Any]
MAX_TOP_LOGPROBS = 20
_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


def tool_calling_enabled() -> bool:
    return os.environ.get("ZINC_TOOL_CALLING", "1").strip().lower() not in ("0", "false", "no", "off")


@dataclass(frozen=True)
class ToolParams:
    """The request's functions and how they may be used.

    `choice` is "none", "auto", "required" or the name of the one function that must be called.
    """

    tools: tuple[Json, ...] = ()
    choice: str = "none"

    @property
    def active(self) -> bool:
        """Tools are rendered into the prompt and calls parsed from the output."""
        return bool(self.tools) and self.choice != "none"

    def grammar(self) -> Grammar | None:
        """The constraint that forces a call ("required" or a named function), else None."""
        if not self.active or self.choice == "auto":
            return None
        return tool_call_grammar(self.tools, None if self.choice == "required" else self.choice)


def parse_tools(payload: Json) -> ToolParams:
    tools = payload.get("tools")
    choice = payload.get("tool_choice")
    parallel = payload.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise InvalidRequestError("'parallel_tool_calls' must be a boolean.", param="parallel_tool_calls")
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise InvalidRequestError("'tools' must be an array of function tools.", param="tools")
    checked = tuple(_check_tool(i, t) for i, t in enumerate(tools))
    names = [t["function"]["name"] for t in checked]
    if len(set(names)) != len(names):
        raise InvalidRequestError("Function names in 'tools' must be unique.", param="tools")
    mode = _parse_choice(choice, names)
    if not tool_calling_enabled():
        mode = "none"
    return ToolParams(checked, mode if checked else "none")


def _check_tool(index: int, tool: Any) -> Json:
    where = f"tools[{index}]"
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise InvalidRequestError(f"'{where}' must be an object with type 'function'.", param=where)
    function = tool.get("function")
    if not isinstance(function, dict):
        raise InvalidRequestError(f"'{where}.function' must be an object.", param=f"{where}.function")
    name = function.get("name")
    if not isinstance(name, str) or not _FUNCTION_NAME.match(name):
        raise InvalidRequestError(
            f"'{where}.function.name' must be 1-64 letters, digits, '_', '-', '.' or ':'.",
            param=f"{where}.function.name",
        )
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        param = f"{where}.function.description"
        raise InvalidRequestError(f"'{param}' must be a string.", param=param)
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        param = f"{where}.function.parameters"
        raise InvalidRequestError(f"'{param}' must be a JSON Schema object.", param=param)
    clean: Json = {"name": name}
    if description is not None:
        clean["description"] = description
    clean["parameters"] = parameters if parameters is not None else {"type": "object", "properties": {}}
    return {"type": "function", "function": clean}


def _parse_choice(choice: Any, names: list[str]) -> str:
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise InvalidRequestError(
                "'tool_choice' must be 'none', 'auto', 'required' or a function.", param="tool_choice"
            )
        if choice == "required" and not names:
            raise InvalidRequestError(
                "'tool_choice' is 'required' but no 'tools' were given.", param="tool_choice"
            )
        return choice
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or choice.get("type", "function") != "function":
        raise InvalidRequestError(
            "'tool_choice' must be a string or {'type': 'function', 'function': {'name': ...}}.",
            param="tool_choice",
        )
    if name not in names:
        raise InvalidRequestError(
            f"'tool_choice' names {name!r}, which is not in 'tools'.", param="tool_choice"
        )
    return name


def check_tool_history(index: int, message: Json) -> None:
    """An assistant's `tool_calls` and a tool message's `tool_call_id` have the right shapes."""
    where = f"messages[{index}]"
    calls = message.get("tool_calls")
    if calls is not None:
        if message.get("role") != "assistant" or not isinstance(calls, list):
            raise InvalidRequestError(
                f"'{where}.tool_calls' must be an array on an assistant message.", param=f"{where}.tool_calls"
            )
        for j, call in enumerate(calls):
            function = call.get("function") if isinstance(call, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            arguments = function.get("arguments", "{}") if isinstance(function, dict) else None
            if not isinstance(name, str) or not isinstance(arguments, str | dict):
                param = f"{where}.tool_calls[{j}]"
                raise InvalidRequestError(
                    f"'{param}' must be {{'id', 'type': 'function', 'function': {{'name', 'arguments'}}}}.",
                    param=param,
                )
    if message.get("role") == "tool":
        call_id = message.get("tool_call_id")
        if call_id is not None and not isinstance(call_id, str):
            raise InvalidRequestError(
                f"'{where}.tool_call_id' must be a string.", param=f"{where}.tool_call_id"
            )


def parse_response_format(payload: Json) -> Grammar | None:
    value = payload.get("response_format")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequestError("'response_format' must be an object.", param="response_format")
    kind = value.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return json_object_grammar()
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise InvalidRequestError(
                "'response_format.json_schema' must be an object with a 'schema'.",
                param="response_format.json_schema",
            )
        schema = spec.get("schema", {"type": "object"})
        return json_schema_grammar(schema, "response_format.json_schema.schema")
    raise InvalidRequestError(
        "'response_format.type' must be 'text', 'json_object' or 'json_schema'.", param="response_format.type"
    )


def parse_chat_logprobs(payload: Json) -> int | None:
    """None, or how many alternatives to report for each token (0..20)."""
    logprobs = payload.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise InvalidRequestError("'logprobs' must be a boolean.", param="logprobs")
    top = _top_count(payload, "top_logprobs")
    if top is not None and not logprobs:
        raise InvalidRequestError("'top_logprobs' needs 'logprobs': true.", param="top_logprobs")
    return (top or 0) if logprobs else None


def parse_completion_logprobs(payload: Json) -> int | None:
    return _top_count(payload, "logprobs")


def _top_count(payload: Json, name: str) -> int | None:
    value = payload.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise InvalidRequestError(f"'{name}' must be an integer from 0 to {MAX_TOP_LOGPROBS}.", param=name)
    return value
