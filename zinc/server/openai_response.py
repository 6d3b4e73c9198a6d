"""OpenAI response bodies and Server-Sent Events framing.

Owns: the JSON shapes of chat (`chat.completion`, `chat.completion.chunk`) and text
(`text_completion`) responses, whole and streamed, with `usage`; and SSE framing (one
`data: {...}\\n\\n` per event, `data: [DONE]` at the end). `ChatShape` and `TextShape` share one
interface so the generation code does not branch on the endpoint: both take an `Output` (content,
and for chat `reasoning_content` and `tool_calls` deltas) and the tokens' logprobs, in OpenAI's
shapes (chat: `logprobs.content[]` with `token`, `logprob`, `bytes`, `top_logprobs`; text:
`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`). A request with `n` choices gets one
`Choice` per index (`whole_choices`) or chunks that each carry their choice's `index`; a text
completion with `echo` starts each choice's text with the prompt (streamed: a first chunk of it).
Imports: zinc.engine (types, tool_calls), orjson, the stdlib.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from zinc.engine.tool_calls import ToolCall, ToolCallDelta
from zinc.engine.types import PromptLogprobs, TokenLogprob, TopLogprob, Usage

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
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


@dataclass
class Output:
    """What one generation (or one streamed piece of it) says, endpoint-neutral.

    Text completions use `content` only; chat may also carry reasoning and tool calls.
    """

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls or self.logprobs)


@dataclass
class Choice:
    """One finished choice of a whole response."""

    output: Output
    finish_reason: str
    calls: Sequence[ToolCall] = ()


def _top_json(t: TopLogprob | TokenLogprob) -> Json:
    return {"token": t.token, "logprob": t.logprob, "bytes": list(t.bytes)}


def chat_logprobs_json(logprobs: Sequence[TokenLogprob]) -> Json:
    """OpenAI's chat `logprobs`: one entry per token with its top alternatives."""
    content = [{**_top_json(t), "top_logprobs": [_top_json(a) for a in t.top_logprobs]} for t in logprobs]
    return {"content": content, "refusal": None}


def _merge_tool_deltas(deltas: Sequence[ToolCallDelta]) -> list[Json]:
    """Consecutive deltas of one call merged; the first of a call carries id, type and name."""
    out: list[Json] = []
    for d in deltas:
        if out and out[-1]["index"] == d.index and d.id is None:
            out[-1]["function"]["arguments"] += d.arguments
            continue
        item: Json = {"index": d.index}
        if d.id is not None:
            item.update(id=d.id, type="function", function={"name": d.name, "arguments": d.arguments})
        else:
            item["function"] = {"arguments": d.arguments}
        out.append(item)
    return out


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

    def whole(
        self,
        output: Output | str,
        finish_reason: str,
        usage: Usage,
        *,
        calls: Sequence[ToolCall] = (),
        with_logprobs: bool = False,
    ) -> Json:
        """The non-streaming response."""
        if isinstance(output, str):
            output = Output(output)
        return self.whole_choices([Choice(output, finish_reason, calls)], usage, with_logprobs=with_logprobs)

    def whole_choices(self, choices: Sequence[Choice], usage: Usage, *, with_logprobs: bool = False) -> Json:
        """The non-streaming response of `n` choices, choice i at index i."""
        return {
            **self._head(self.whole_object),
            "choices": [
                self._choice(c.output, c.finish_reason, c.calls, with_logprobs, i) for i, c in enumerate(choices)
            ],
            "usage": usage_json(usage),
        }

    def usage_chunk(self, usage: Usage) -> Json:
        """The last chunk when `stream_options.include_usage` is set."""
        return {**self._head(self.chunk_object), "choices": [], "usage": usage_json(usage)}

    def first_chunk(self, index: int = 0) -> Json | None:
        """A chunk sent before any text of choice `index` (the chat role, an echoed prompt), or None."""
        return None

    def delta_chunk(self, output: Output | str, *, with_logprobs: bool = False, index: int = 0) -> Json:
        if isinstance(output, str):
            output = Output(output)
        return {**self._head(self.chunk_object), "choices": [self._delta(output, None, with_logprobs, index)]}

    def final_chunk(self, finish_reason: str, index: int = 0) -> Json:
        return {**self._head(self.chunk_object), "choices": [self._delta(None, finish_reason, False, index)]}

    def _choice(
        self, output: Output, finish_reason: str, calls: Sequence[ToolCall], with_logprobs: bool, index: int
    ) -> Json:
        raise NotImplementedError

    def _delta(self, output: Output | None, finish_reason: str | None, with_logprobs: bool, index: int) -> Json:
        raise NotImplementedError


class ChatShape(_Shape):
    id_prefix = "chatcmpl"
    whole_object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def first_chunk(self, index: int = 0) -> Json:
        role = {"index": index, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None}
        return {**self._head(self.chunk_object), "choices": [role]}

    def _choice(
        self, output: Output, finish_reason: str, calls: Sequence[ToolCall], with_logprobs: bool, index: int
    ) -> Json:
        message: Json = {"role": "assistant", "content": output.content}
        if output.reasoning:
            message["reasoning_content"] = output.reasoning
        if calls:
            message["content"] = output.content if output.content.strip() else None
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in calls
            ]
        logprobs = chat_logprobs_json(output.logprobs) if with_logprobs else None
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}

    def _delta(self, output: Output | None, finish_reason: str | None, with_logprobs: bool, index: int) -> Json:
        delta: Json = {}
        if output is not None:
            if output.reasoning:
                delta["reasoning_content"] = output.reasoning
            if output.content:
                delta["content"] = output.content
            if output.tool_calls:
                delta["tool_calls"] = _merge_tool_deltas(output.tool_calls)
        logprobs = chat_logprobs_json(output.logprobs) if with_logprobs and output is not None else None
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


class TextShape(_Shape):
    id_prefix = "cmpl"
    whole_object = "text_completion"
    chunk_object = "text_completion"

    def __init__(
        self, model: str, echoes: Sequence[str] = (), prompt_logprobs: Sequence[PromptLogprobs] = ()
    ) -> None:
        super().__init__(model)
        self.echoes = echoes  # by choice: its prompt's text, put before its text (`echo`)
        self.prompt_logprobs = prompt_logprobs  # by choice, with `echo` and `logprobs`: its prompt's
        self._offsets: dict[int, int] = {}  # choice -> characters of its text before its next token

    def echo(self, index: int) -> str:
        return self.echoes[index] if index < len(self.echoes) else ""

    def first_chunk(self, index: int = 0) -> Json | None:
        if not self.echo(index):
            return None
        logprobs = self._prompt_json(index)
        echoed = {"index": index, "text": self.echo(index), "logprobs": logprobs, "finish_reason": None}
        return {**self._head(self.chunk_object), "choices": [echoed]}

    def _prompt_json(self, index: int) -> Json | None:
        """Choice `index`'s prompt tokens in OpenAI's completion `logprobs` (the first token's
        logprob is null); offsets into the echoed text, where a first token the text does not
        start with (BOS) takes no characters."""
        if index >= len(self.prompt_logprobs):
            return None
        prompt, text = self.prompt_logprobs[index], self.echo(index)
        offsets, at = [0], len(prompt.first) if text.startswith(prompt.first) else 0
        for t in prompt.rest:
            offsets.append(at)
            at += len(t.token)
        return {
            "tokens": [prompt.first, *(t.token for t in prompt.rest)],
            "token_logprobs": [None, *(t.logprob for t in prompt.rest)],
            "top_logprobs": [None, *({a.token: a.logprob for a in t.top_logprobs} for t in prompt.rest)],
            "text_offset": offsets,
        }

    def _logprobs(self, logprobs: Sequence[TokenLogprob], index: int) -> Json:
        offsets = []
        offset = self._offsets.get(index, len(self.echo(index)))
        for t in logprobs:
            offsets.append(offset)
            offset += len(t.token)
        self._offsets[index] = offset
        return {
            "tokens": [t.token for t in logprobs],
            "token_logprobs": [t.logprob for t in logprobs],
            "top_logprobs": [{a.token: a.logprob for a in t.top_logprobs} for t in logprobs],
            "text_offset": offsets,
        }

    def _choice(
        self, output: Output, finish_reason: str, calls: Sequence[ToolCall], with_logprobs: bool, index: int
    ) -> Json:
        logprobs = self._logprobs(output.logprobs, index) if with_logprobs else None
        prompt = self._prompt_json(index)
        if logprobs is not None and prompt is not None:
            logprobs = {key: prompt[key] + logprobs[key] for key in prompt}
        text = self.echo(index) + output.content
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}

    def _delta(self, output: Output | None, finish_reason: str | None, with_logprobs: bool, index: int) -> Json:
        text = output.content if output is not None else ""
        logprobs = self._logprobs(output.logprobs, index) if with_logprobs and output is not None else None
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


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
