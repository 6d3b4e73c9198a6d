"""The OpenAI Responses API over the chat completions path: `POST /v1/responses`.

Owns: the handler. A request is parsed into the chat path's parameters
(zinc.server.responses_request) and runs exactly as a chat completion does, through
`OpenAIApi.prepare_chat` (template, tools, output parser, tool or `text.format` grammar) and
`OpenAIApi.generation` (context check, admission and its 429, abort when the client goes away).
Only the response differs: a Response object (`status` `completed`, or `incomplete` with
`incomplete_details.reason` `max_output_tokens` when the token limit cut it), or its typed
stream: `response.created`, `response.in_progress`, the output item events
(zinc.server.responses_response), then `response.completed` (or `response.incomplete`); a
failure once the stream started is an `error` event and `response.failed`. Nothing is kept after
the response. `usage.output_tokens_details.reasoning_tokens` counts the tokens generated before
the answer (text or a call) began, when the model reasoned. Errors before a response starts are
OpenAI's envelope, from the router (zinc.server.routes).
Imports: zinc.engine.types, zinc.errors, zinc.server.{api, chat_output, exchange,
openai_request, openai_response, responses_request, responses_response}, the stdlib.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

import orjson

from zinc.engine.types import GenerationRequest, TextDelta, Usage
from zinc.errors import ZincError
from zinc.server.api import OpenAIApi, ending
from zinc.server.chat_output import OutputParser
from zinc.server.exchange import Exchange, HttpRequest
from zinc.server.openai_request import decode_json
from zinc.server.openai_response import SSE_HEADERS
from zinc.server.responses_request import parse_responses
from zinc.server.responses_response import (
    EventStream,
    Json,
    OutputItems,
    failure,
    new_id,
    response_object,
    usage_json,
)

log = logging.getLogger("zinc.server")


class ResponsesApi:
    def __init__(self, api: OpenAIApi) -> None:
        self._api = api

    async def create(self, request: HttpRequest, exchange: Exchange) -> None:
        params = parse_responses(decode_json(await exchange.body()))
        common = params.chat.common
        model = await self._api.select_model(common.model)
        ids, parser, grammar = self._api.prepare_chat(params.chat)
        head = {"id": new_id("resp"), "created_at": int(time.time()), "model": model, **params.echo}
        async with self._api.generation(head["id"], common, ids, "input", grammar) as (req, events, first):
            run = Run(exchange, head, req, parser)
            await (run.stream(events, first) if common.stream else run.whole(events, first))


class Run:
    """One generation's response, whole or streamed."""

    def __init__(
        self, exchange: Exchange, head: Json, request: GenerationRequest, parser: OutputParser
    ) -> None:
        self.exchange = exchange
        self.head = head
        self.request = request
        self.parser = parser
        self.items = OutputItems()
        self.status = "in_progress"
        self.usage = Usage(len(request.prompt_ids), 0)
        self.reasoning_tokens = 0

    def response(self) -> Json:
        incomplete = "max_output_tokens" if self.status == "incomplete" else None
        usage = usage_json(self.usage, self.reasoning_tokens) if self.status != "in_progress" else None
        return response_object(self.head, self.status, self.items.output, usage, incomplete)

    async def whole(self, events: AsyncIterator[TextDelta], first: TextDelta | None) -> None:
        async for _ in self._events(events, first):
            pass
        await self.exchange.respond_json(200, orjson.dumps(self.response()))

    async def stream(self, events: AsyncIterator[TextDelta], first: TextDelta | None) -> None:
        exchange = self.exchange
        frames = EventStream()
        await exchange.start_stream(200, SSE_HEADERS)
        try:
            for kind in ("response.created", "response.in_progress"):
                await exchange.send(frames.frame({"type": kind, "response": self.response()}))
            async for event in self._events(events, first):
                await exchange.send(frames.frame(event))
            final = {"type": f"response.{self.status}", "response": self.response()}
            await exchange.send(frames.frame(final))
        except Exception as exc:  # headers are out: report the failure inside the stream
            if not isinstance(exc, ZincError):
                log.error("generation failed mid-stream (request %s)", self.head["id"], exc_info=exc)
            event, error = failure(exc)
            await exchange.send(frames.frame(event))
            failed = response_object(self.head, "failed", self.items.output, error=error)
            await exchange.send(frames.frame({"type": "response.failed", "response": failed}))
        await exchange.end()

    async def _events(self, events: AsyncIterator[TextDelta], event: TextDelta | None) -> AsyncIterator[Json]:
        """The output item events of the whole generation; then `status` and `usage` are known."""
        generated = 0
        before_answer = 0  # tokens generated before the answer (text or a call) began
        answering = False
        while event is not None:
            generated += len(event.token_ids)
            out = self.parser.feed(event.text, event.logprobs)
            answering = answering or bool(out.content.strip() or out.tool_calls)
            if not answering:
                before_answer += len(event.token_ids)
            for item_event in self.items.feed(out):
                yield item_event
            if event.finish_reason is not None:
                break
            event = await anext(events, None)
        finish, self.usage = ending(event, self.request, generated)
        self.status = "incomplete" if finish == "length" else "completed"
        for item_event in [*self.items.feed(self.parser.finish()), *self.items.finish(self.status)]:
            yield item_event
        self.exchange.note_usage(self.usage.prompt_tokens, self.usage.completion_tokens)
        if any(item["type"] == "reasoning" for item in self.items.output):
            self.reasoning_tokens = before_answer
