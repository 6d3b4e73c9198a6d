"""Anthropic Messages response bodies, stream events and errors.

Owns: `ContentBlocks`, which turns the chat path's `Output` pieces (reasoning, content, tool call
deltas) into content blocks, both as stream events (`content_block_start`, `content_block_delta`
with `thinking_delta`, `text_delta` or `input_json_delta`, `content_block_stop`) and as the
whole response's `content` list, so streamed and whole responses say the same thing. Whitespace
between blocks (after a tool call) opens no text block; a response with no block at all gets one
empty text block. Also: the `message` object, `stop_reason` from the engine's last event
(`tool_use` when a call was made, `stop_sequence` with the string that matched, `max_tokens`,
else `end_turn`), SSE framing with `event:` lines, and the error envelope
`{"type": "error", "error": {"type", "message"}}` with Anthropic's error type for each status,
used for every path under /v1/messages (`is_anthropic_path`).
Imports: zinc.engine.types, zinc.server.{error_table, openai_response}, orjson, the stdlib.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

import orjson

from zinc.engine.types import TextDelta, Usage
from zinc.server.error_table import describe
from zinc.server.openai_response import Output

Json = dict[str, Any]
Event = tuple[str, Json]
PATHS = ("/v1/messages", "/messages")
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def is_anthropic_path(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in PATHS)


def message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def sse(event: Event) -> bytes:
    name, payload = event
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def error_body(exc: BaseException) -> tuple[int, Json]:
    status, openai_body = describe(exc)
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return status, {"type": "error", "error": {"type": kind, "message": openai_body["error"]["message"]}}


def stop_info(last: TextDelta | None, finish: str, called: bool) -> tuple[str, str | None]:
    """`stop_reason` and `stop_sequence` from the last event and the chat path's finish reason."""
    if called:
        return "tool_use", None
    if last is not None and last.stop_sequence is not None:
        return "stop_sequence", last.stop_sequence
    return ("max_tokens" if finish == "length" else "end_turn"), None


def message(
    msg_id: str, model: str, content: list[Json], stop: tuple[str | None, str | None], usage: Usage
) -> Json:
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop[0],
        "stop_sequence": stop[1],
        "usage": {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens},
    }


def _tool_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


class ContentBlocks:
    """Output pieces -> content blocks: stream events, and the blocks themselves in `content`."""

    def __init__(self) -> None:
        self.content: list[Json] = []
        self._open: Json | None = None  # the block events are being sent for
        self._json = ""  # the open tool_use block's input so far
        self._space = ""  # whitespace not yet known to start a text block

    def feed(self, out: Output) -> list[Event]:
        events: list[Event] = []
        if out.reasoning:
            self._add(events, "thinking", out.reasoning)
        if out.content:
            self._text(events, out.content)
        for call in out.tool_calls:
            if call.id is not None:
                block: Json = {"type": "tool_use", "id": _tool_id(call.id), "name": call.name, "input": {}}
                self._start(events, block)
            if call.arguments and self._open is not None and self._open["type"] == "tool_use":
                self._json += call.arguments
                delta = {"type": "input_json_delta", "partial_json": call.arguments}
                events.append(("content_block_delta", self._delta(delta)))
        return events

    def finish(self) -> list[Event]:
        events: list[Event] = []
        if not self.content:
            self._start(events, {"type": "text", "text": ""})
            if self._space:
                self._add(events, "text", self._space)
        self._stop(events)
        return events

    def _text(self, events: list[Event], text: str) -> None:
        if self._open is None or self._open["type"] != "text":
            text, self._space = self._space + text, ""
            if not text.strip():
                self._space = text  # wait: whitespace alone opens no block
                return
        self._add(events, "text", text)

    def _add(self, events: list[Event], kind: str, text: str) -> None:
        if self._open is None or self._open["type"] != kind:
            self._start(events, {"type": kind, kind: ""} | ({"signature": ""} if kind == "thinking" else {}))
        assert self._open is not None
        self._open[kind] += text
        events.append(("content_block_delta", self._delta({"type": f"{kind}_delta", kind: text})))

    def _start(self, events: list[Event], block: Json) -> None:
        self._stop(events)
        start = {
            "type": "content_block_start",
            "index": len(self.content),
            "content_block": copy.deepcopy(block),
        }
        events.append(("content_block_start", start))
        self.content.append(block)
        self._open = block

    def _delta(self, delta: Json) -> Json:
        return {"type": "content_block_delta", "index": len(self.content) - 1, "delta": delta}

    def _stop(self, events: list[Event]) -> None:
        if self._open is None:
            return
        if self._open["type"] == "tool_use":
            try:
                parsed = orjson.loads(self._json) if self._json else {}
            except orjson.JSONDecodeError:
                parsed = {}  # arguments cut short (max_tokens)
            self._open["input"] = parsed if isinstance(parsed, dict) else {}
            self._json = ""
        events.append(("content_block_stop", {"type": "content_block_stop", "index": len(self.content) - 1}))
        self._open = None
