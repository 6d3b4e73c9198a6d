"""OpenAI Responses response bodies and stream events.

Owns: `OutputItems`, which turns the chat path's `Output` pieces (reasoning, content, tool call
deltas) into output items, both as typed stream events and as the Response's `output` list, so
streamed and whole responses say the same thing: a `reasoning` item (one `reasoning_text` part:
`response.reasoning_text.delta`/`.done`), a `message` item (one `output_text` part:
`response.output_text.delta`/`.done`) and a `function_call` item per call
(`response.function_call_arguments.delta`/`.done`), each opened by `response.output_item.added`
(and `response.content_part.added`) and closed by `response.content_part.done` and
`response.output_item.done`. Whitespace between items (after a tool call) opens no message; a
response with no item at all gets one message with the text there is. The message's tokens carry
their `logprobs` (in its part and its deltas) when the request asked for them. The item a cut-short
generation leaves open is `incomplete`, the others `completed`. Also: the Response object, its
`usage` (with `cached_tokens` and `reasoning_tokens`), and SSE framing with `event:` lines and
`sequence_number`s (`EventStream`), including a failure mid-stream (`error`, then
`response.failed`).
Imports: zinc.engine.types, zinc.server.{error_table, openai_response}, orjson, the stdlib.
"""

from __future__ import annotations

import copy
import time
import uuid
from typing import Any

import orjson

from zinc.engine.types import Usage
from zinc.server.error_table import describe
from zinc.server.openai_response import Output, chat_logprobs_json

Json = dict[str, Any]
PARTS = {"message": "output_text", "reasoning": "reasoning_text"}  # item type -> its one part's type


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage_json(usage: Usage, reasoning_tokens: int) -> Json:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def response_object(
    head: Json,
    status: str,
    output: list[Json],
    usage: Json | None = None,
    incomplete: str | None = None,
    error: Json | None = None,
) -> Json:
    """A Response: `head` is its id, created_at, model and the request's echoed settings."""
    done = status in ("completed", "incomplete", "failed")
    return {
        "id": head["id"],
        "object": "response",
        "created_at": head["created_at"],
        "status": status,
        "background": False,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": error,
        "incomplete_details": {"reason": incomplete} if incomplete is not None else None,
        **{k: v for k, v in head.items() if k not in ("id", "created_at")},
        "output": output if done else [],
        "usage": usage,
    }


def failure(exc: BaseException) -> tuple[Json, Json]:
    """The `error` event's fields and the failed Response's `error`, for a failure mid-stream."""
    status, body = describe(exc)
    error = body["error"]
    code = "rate_limit_exceeded" if status == 429 else "server_error" if status >= 500 else "invalid_prompt"
    event = {"type": "error", "code": error["code"], "message": error["message"], "param": error["param"]}
    return event, {"code": code, "message": error["message"]}


class EventStream:
    """SSE framing: each event gets the next `sequence_number` and an `event:` line naming its type."""

    def __init__(self) -> None:
        self.sequence = 0

    def frame(self, event: Json) -> bytes:
        kind: str = event["type"]
        payload = {**event, "sequence_number": self.sequence}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class OutputItems:
    """Output pieces -> output items: stream events, and the items themselves in `output`."""

    def __init__(self) -> None:
        self.output: list[Json] = []
        self._open: Json | None = None  # the item events are being sent for
        self._space = ""  # whitespace not yet known to start a message
        self._space_logprobs: list[Json] = []  # the logprobs of its tokens

    def feed(self, out: Output) -> list[Json]:
        events: list[Json] = []
        if out.reasoning:
            self._add(events, "reasoning", out.reasoning)
        if out.content:
            self._text(events, out.content, chat_logprobs_json(out.logprobs)["content"])
        for call in out.tool_calls:
            if call.id is not None:
                item = {"id": new_id("fc"), "type": "function_call", "status": "in_progress",
                        "arguments": "", "call_id": call.id, "name": call.name or ""}  # fmt: skip
                self._start(events, item)
            if call.arguments and self._open is not None and self._open["type"] == "function_call":
                self._open["arguments"] += call.arguments
                events.append(self._event("response.function_call_arguments.delta", delta=call.arguments))
        return events

    def finish(self, status: str) -> list[Json]:
        """The end: close the open item with `status` (`completed` or `incomplete`)."""
        events: list[Json] = []
        if not self.output:
            self._add(events, "message", self._space, self._space_logprobs, force=True)
        self._stop(events, status)
        return events

    def _text(self, events: list[Json], text: str, logprobs: list[Json]) -> None:
        if self._open is None or self._open["type"] != "message":
            text, self._space = self._space + text, ""
            logprobs, self._space_logprobs = self._space_logprobs + logprobs, []
            if not text.strip():
                self._space, self._space_logprobs = text, logprobs  # wait: whitespace alone opens no message
                return
        self._add(events, "message", text, logprobs)

    def _add(
        self,
        events: list[Json],
        kind: str,
        text: str,
        logprobs: list[Json] | None = None,
        force: bool = False,
    ) -> None:
        if self._open is None or self._open["type"] != kind:
            item: Json = {
                "id": new_id("msg" if kind == "message" else "rs"),
                "type": kind,
                "status": "in_progress",
            }
            item |= (
                {"role": "assistant", "content": []} if kind == "message" else {"summary": [], "content": []}
            )
            self._start(events, item)
            part: Json = {"type": PARTS[kind], "text": ""}
            if kind == "message":
                part |= {"annotations": [], "logprobs": []}
            item["content"].append(part)
            events.append(
                self._event("response.content_part.added", content_index=0, part=copy.deepcopy(part))
            )
        assert self._open is not None
        if text or not force:
            self._open["content"][0]["text"] += text
            extra: Json = {}
            if kind == "message":
                extra["logprobs"] = logprobs or []
                self._open["content"][0]["logprobs"].extend(extra["logprobs"])
            events.append(self._event(f"response.{PARTS[kind]}.delta", content_index=0, delta=text, **extra))

    def _start(self, events: list[Json], item: Json) -> None:
        self._stop(events, "completed")
        self.output.append(item)
        self._open = item
        events.append({"type": "response.output_item.added", "output_index": len(self.output) - 1,
                       "item": copy.deepcopy(item)})  # fmt: skip

    def _event(self, kind: str, **fields: Any) -> Json:
        assert self._open is not None
        return {"type": kind, "item_id": self._open["id"], "output_index": len(self.output) - 1, **fields}

    def _stop(self, events: list[Json], status: str) -> None:
        item = self._open
        if item is None:
            return
        if item["type"] == "function_call":
            events.append(self._event("response.function_call_arguments.done", arguments=item["arguments"]))
        else:
            part = item["content"][0]
            extra: Json = {"logprobs": part["logprobs"]} if item["type"] == "message" else {}
            events.append(
                self._event(f"response.{part['type']}.done", content_index=0, text=part["text"], **extra)
            )
            events.append(
                self._event("response.content_part.done", content_index=0, part=copy.deepcopy(part))
            )
        item["status"] = status
        events.append({"type": "response.output_item.done", "output_index": len(self.output) - 1,
                       "item": copy.deepcopy(item)})  # fmt: skip
        self._open = None
