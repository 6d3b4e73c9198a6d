"""Tool calling in prompts: tool definitions, past tool calls and tool results for any chat template.

Owns: `tool_system_prompt` (the tool list in Qwen's format, the one the serving spec uses:
`# Tools` ... `<tools>` one JSON line per function `</tools>` ... how to answer with
`<tool_call>{"name": ..., "arguments": ...}</tool_call>`), `TemplateAbilities` (what a jinja
template renders by itself: the `tools` list, assistant `tool_calls`, `tool` role messages; found
by rendering probes once per template) and `prepare_tool_messages`, which turns what a template
cannot render into plain text it can: the tool list into the system message, an assistant's
`tool_calls` into `<tool_call>` blocks in its content, and consecutive `tool` results into one
user turn of `<tool_response>` blocks. For templates that render tool calls themselves, string
`arguments` are handed over parsed (templates such as Qwen 2.5's expect an object).
Imports: the stdlib only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_PROBE_NAME = "zinc_probe_function_7f3a"
_PROBE_CALL = "zinc_probe_call_7f3a"
_PROBE_RESULT = "zinc_probe_result_7f3a"


def tool_system_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    lines = "\n".join(json.dumps(dict(t), ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


@dataclass(frozen=True)
class TemplateAbilities:
    tools: bool = False
    tool_calls: bool = False
    tool_results: bool = False

    @classmethod
    def probe(
        cls, render: Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], str]
    ) -> TemplateAbilities:
        """Render small conversations and look for the probe names in the output."""

        def shows(marker: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> bool:
            try:
                return marker in render(messages, tools)
            except Exception:
                return False

        user = {"role": "user", "content": "Hi"}
        probe_tool = {
            "type": "function",
            "function": {
                "name": _PROBE_NAME,
                "description": "probe",
                "parameters": {"type": "object", "properties": {}},
            },
        }
        call = {"id": "call_probe", "type": "function", "function": {"name": _PROBE_CALL, "arguments": {}}}
        called = {"role": "assistant", "content": "", "tool_calls": [call]}
        result = {"role": "tool", "tool_call_id": "call_probe", "name": _PROBE_CALL, "content": _PROBE_RESULT}
        calls = shows(_PROBE_CALL, [user, called], None)
        # a template that writes any role verbatim also "shows" a result; only a template that
        # knows tool calls is trusted to render results in its model's format
        return cls(
            tools=shows(_PROBE_NAME, [user], [probe_tool]),
            tool_calls=calls,
            tool_results=calls and shows(_PROBE_RESULT, [user, called, result], None),
        )


def _arguments_object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return arguments
        return parsed
    return arguments


def tool_call_block(name: str, arguments: Any) -> str:
    """One call in the text form the model is asked to write."""
    args = _arguments_object(arguments)
    args_text = json.dumps(args, ensure_ascii=False) if not isinstance(args, str) else json.dumps(args)
    return f'<tool_call>\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {args_text}}}\n</tool_call>'


def _calls_of(message: Mapping[str, Any]) -> list[tuple[str, Any]]:
    out = []
    for call in message.get("tool_calls") or ():
        function = call.get("function", call) if isinstance(call, Mapping) else {}
        out.append((str(function.get("name", "")), function.get("arguments", {})))
    return out


def prepare_tool_messages(
    messages: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]] | None, abilities: TemplateAbilities
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Messages (and the `tools` to pass to the template) with every tool part the template cannot
    render turned into text."""
    out: list[dict[str, Any]] = []
    results: list[str] = []

    def flush_results() -> None:
        if results:
            out.append({"role": "user", "content": "\n".join(results)})
            results.clear()

    for message in messages:
        role = message.get("role")
        if role == "tool" and not abilities.tool_results:
            results.append(f"<tool_response>\n{message.get('content', '')}\n</tool_response>")
            continue
        flush_results()
        if role == "assistant" and message.get("tool_calls"):
            copy = dict(message)
            if abilities.tool_calls:
                copy["tool_calls"] = [_with_parsed_arguments(c) for c in message["tool_calls"]]
            else:
                blocks = [tool_call_block(name, args) for name, args in _calls_of(message)]
                text = copy.get("content") or ""
                copy["content"] = "\n".join(([text] if text else []) + blocks)
                del copy["tool_calls"]
            out.append(copy)
            continue
        out.append(message)
    flush_results()
    if not tools:
        return out, None
    if abilities.tools:
        return out, [dict(t) for t in tools]
    block = tool_system_prompt(tools)
    if out and out[0].get("role") in ("system", "developer"):
        system = out[0].get("content") or ""
        out[0] = {**out[0], "content": f"{system}\n\n{block}" if system else block}
    else:
        out.insert(0, {"role": "system", "content": block})
    return out, None


def _with_parsed_arguments(call: Any) -> Any:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return call
    function = dict(call["function"])
    function["arguments"] = _arguments_object(function.get("arguments", {}))
    return {**call, "function": function}
