"""Grammars for constrained decoding, written for llguidance: JSON objects, JSON Schemas and tool calls.

Owns: `json_object_grammar`, `json_schema_grammar` and `tool_call_grammar`, which turn OpenAI
request fields into a `Grammar` (an llguidance grammar string) and check it, so a bad schema is a
400 `InvalidRequestError` naming the field before anything is generated. JSON is generated in the
usual spaced form (`{"a": 1, "b": [1, 2]}`, no newlines or indentation): flexible whitespace lets
small models wander into endless blank lines. A tool call is Qwen's format, one block
`<tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>` whose ARGS follow the function's
`parameters` schema (any of the given functions, or the one named).
Imports: llguidance (on the first grammar), zinc.engine.types, zinc.errors, the stdlib.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from zinc.engine.types import Grammar
from zinc.errors import InvalidRequestError

if TYPE_CHECKING:
    from llguidance import LLMatcher

JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


def _ll() -> type[LLMatcher]:
    """llguidance's matcher class, imported on the first grammar (most starts build none; ~40 ms)."""
    from llguidance import LLMatcher

    return LLMatcher


def _with_options(schema: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(schema)
    out["x-guidance"] = {**JSON_OPTIONS, **dict(schema.get("x-guidance") or {})}
    return out


def _checked(source: str, kind: str, param: str) -> Grammar:
    error = _ll().validate_grammar(source)
    if error:
        message = " ".join(error.split())
        raise InvalidRequestError(
            f"'{param}' cannot be used for constrained decoding: {message[:300]}", param=param
        )
    return Grammar(source, kind)


def json_object_grammar() -> Grammar:
    """Any JSON object (`response_format: {"type": "json_object"}`)."""
    source = _ll().grammar_from_json_schema(_with_options({"type": "object"}))
    return _checked(source, "json_object", "response_format")


def json_schema_grammar(schema: Any, param: str = "response_format") -> Grammar:
    """A JSON value that validates against `schema` (`response_format.json_schema.schema`)."""
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, Mapping):
        raise InvalidRequestError(f"'{param}' must be a JSON Schema object.", param=param)
    try:
        source = _ll().grammar_from_json_schema(_with_options(schema))
    except (ValueError, TypeError) as exc:
        raise InvalidRequestError(f"'{param}' is not a usable JSON Schema: {exc}", param=param) from None
    return _checked(source, "json_schema", param)


def tool_call_schema(tools: Sequence[Mapping[str, Any]], name: str | None = None) -> dict[str, Any]:
    """The JSON Schema of the object inside a `<tool_call>` block: `{"name", "arguments"}`."""
    options = []
    for tool in tools:
        function = tool["function"]
        if name is not None and function["name"] != name:
            continue
        parameters = function.get("parameters")
        if not isinstance(parameters, Mapping) or not parameters:
            parameters = {"type": "object"}
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": function["name"]}, "arguments": dict(parameters)},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    if not options:
        raise InvalidRequestError(f"No function named {name!r} in 'tools'.", param="tool_choice")
    return options[0] if len(options) == 1 else {"anyOf": options}


def tool_call_grammar(tools: Sequence[Mapping[str, Any]], name: str | None = None) -> Grammar:
    """Exactly one tool call block for one of `tools` (or the function `name`)."""
    schema = _with_options(tool_call_schema(tools, name))
    lark = (
        f"start: {json.dumps(TOOL_CALL_OPEN + chr(10))} call {json.dumps(chr(10) + TOOL_CALL_CLOSE)}\n"
        f"call: %json {json.dumps(schema)}\n"
    )
    return _checked(_ll().grammar_from_lark(lark), "tool_call", "tools")
