"""OpenAI response bodies and Server-Sent Events framing.

Owns: the JSON shapes of chat (`chat.completion`, `chat.completion.chunk`) and text
(`text_completion`) responses, whole and streamed, with `usage`; and SSE framing (one
`data: {...}\\n\\n` per event, `data: [DONE]` at the end). `ChatShape` and `TextShape` share one
interface so the generation code does not branch on the endpoint.
Imports: zinc.engine.types, orjson, the stdlib.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from zinc.engine.types import Usage

Json = dict[str, Any]

SSE_HEADERS = (
    ("content-type", "text/event-stream"),
    ("cache-control", "no-cache"),
    ("x-accel-buffering", "no"),
)
SSE_DONE = b"data: [DONE]\n\n"


def sse_event(payload: Json) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def usage_json(usage: Usage) -> Json:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


class _Shape:
    """Common fields of one response: id, creation time and model."""

    id_prefix = ""
    whole_object = ""
    chunk_object = ""

    def __init__(self, model: str) -> None:
        self.id = f"{self.id_prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model

    def _head(self, obj: str) -> Json:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, text: str, finish_reason: str, usage: Usage) -> Json:
        """The non-streaming response."""
        return {
            **self._head(self.whole_object),
            "choices": [self._choice(text, finish_reason)],
            "usage": usage_json(usage),
        }

    def usage_chunk(self, usage: Usage) -> Json:
        """The last chunk when `stream_options.include_usage` is set."""
        return {**self._head(self.chunk_object), "choices": [], "usage": usage_json(usage)}

    def first_chunk(self) -> Json | None:
        """A chunk sent before any text (the chat role), or None."""
        return None

    def delta_chunk(self, text: str) -> Json:
        return {**self._head(self.chunk_object), "choices": [self._delta(text, None)]}

    def final_chunk(self, finish_reason: str) -> Json:
        return {**self._head(self.chunk_object), "choices": [self._delta(None, finish_reason)]}

    def _choice(self, text: str, finish_reason: str) -> Json:
        raise NotImplementedError

    def _delta(self, text: str | None, finish_reason: str | None) -> Json:
        raise NotImplementedError


class ChatShape(_Shape):
    id_prefix = "chatcmpl"
    whole_object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def first_chunk(self) -> Json:
        role = {"index": 0, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None}
        return {**self._head(self.chunk_object), "choices": [role]}

    def _choice(self, text: str, finish_reason: str) -> Json:
        message = {"role": "assistant", "content": text}
        return {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}

    def _delta(self, text: str | None, finish_reason: str | None) -> Json:
        delta = {} if text is None else {"content": text}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


class TextShape(_Shape):
    id_prefix = "cmpl"
    whole_object = "text_completion"
    chunk_object = "text_completion"

    def _choice(self, text: str, finish_reason: str) -> Json:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}

    def _delta(self, text: str | None, finish_reason: str | None) -> Json:
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}


def model_card(model_id: str, created: int, context_length: int) -> Json:
    """One entry of GET /v1/models."""
    return {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "zinc",
        "context_length": context_length,
        "installed": True,
        "active": True,
        "status": "supported",
    }
