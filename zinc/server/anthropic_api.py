"""The Anthropic Messages API over the chat completions path: `POST /v1/messages` and
`POST /v1/messages/count_tokens`.

Owns: the two handlers. A request is parsed into the chat path's parameters
(zinc.server.anthropic_request) and runs exactly as a chat completion does, through
`OpenAIApi.prepare_chat` (template, tools, output parser, tool grammar) and
`OpenAIApi.generation` (context check, admission and its 429, abort when the client goes away).
Only the response differs: a `message` object, or Anthropic's stream (`message_start`, a `ping`,
the content block events, `message_delta` with `stop_reason` and usage, `message_stop`; a
failure once the stream started is an `error` event). `count_tokens` answers `{"input_tokens"}`
for the prompt the chat template makes of the same body. Errors before a response starts are
shaped by the router (zinc.server.routes, through `anthropic_response.error_body`).
Imports: zinc.engine.types, zinc.errors, zinc.server.{anthropic_request, anthropic_response,
api, chat_output, exchange, openai_request, openai_response}, orjson, the stdlib.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import orjson

from zinc.engine.types import GenerationRequest, TextDelta, Usage
from zinc.errors import ZincError
from zinc.server.anthropic_request import parse_messages
from zinc.server.anthropic_response import (
    ContentBlocks,
    Event,
    error_body,
    message,
    message_id,
    sse,
    stop_info,
)
from zinc.server.api import OpenAIApi, ending
from zinc.server.chat_output import OutputParser
from zinc.server.exchange import Exchange, HttpRequest
from zinc.server.openai_request import decode_json
from zinc.server.openai_response import SSE_HEADERS

log = logging.getLogger("zinc.server")


class AnthropicApi:
    def __init__(self, api: OpenAIApi) -> None:
        self._api = api

    async def messages(self, request: HttpRequest, exchange: Exchange) -> None:
        params = parse_messages(decode_json(await exchange.body()))
        model = await self._api.select_model(params.common.model)
        ids, parser, grammar = self._api.prepare_chat(params)
        msg_id = message_id()
        async with self._api.generation(msg_id, params.common, ids, "messages", grammar) as (
            req,
            events,
            first,
        ):
            run = Run(exchange, msg_id, model, req, parser)
            await (run.stream(events, first) if params.common.stream else run.whole(events, first))

    async def count_tokens(self, request: HttpRequest, exchange: Exchange) -> None:
        params = parse_messages(decode_json(await exchange.body()), count_only=True)
        await self._api.select_model(params.common.model)
        ids, _, _ = self._api.prepare_chat(params)
        await exchange.respond_json(200, orjson.dumps({"input_tokens": len(ids)}))


class Run:
    """One generation's response, whole or streamed."""

    def __init__(
        self, exchange: Exchange, msg_id: str, model: str, request: GenerationRequest, parser: OutputParser
    ) -> None:
        self.exchange = exchange
        self.id = msg_id
        self.model = model
        self.request = request
        self.parser = parser
        self.blocks = ContentBlocks()
        self.stop: tuple[str | None, str | None] = (None, None)  # stop_reason, stop_sequence
        self.usage = Usage(len(request.prompt_ids), 0)

    async def whole(self, events: AsyncIterator[TextDelta], first: TextDelta | None) -> None:
        async for _ in self._events(events, first):
            pass
        body = message(self.id, self.model, self.blocks.content, self.stop, self.usage)
        await self.exchange.respond_json(200, orjson.dumps(body))

    async def stream(self, events: AsyncIterator[TextDelta], first: TextDelta | None) -> None:
        exchange = self.exchange
        await exchange.start_stream(200, SSE_HEADERS)
        try:
            start = message(self.id, self.model, [], self.stop, self.usage)
            await exchange.send(sse(("message_start", {"type": "message_start", "message": start})))
            await exchange.send(sse(("ping", {"type": "ping"})))
            async for event in self._events(events, first):
                await exchange.send(sse(event))
            delta = {"stop_reason": self.stop[0], "stop_sequence": self.stop[1]}
            counts = {"input_tokens": self.usage.prompt_tokens, "output_tokens": self.usage.completion_tokens}
            await exchange.send(
                sse(("message_delta", {"type": "message_delta", "delta": delta, "usage": counts}))
            )
            await exchange.send(sse(("message_stop", {"type": "message_stop"})))
        except Exception as exc:  # headers are out: report the failure inside the stream
            if not isinstance(exc, ZincError):
                log.error("generation failed mid-stream (request %s)", self.id, exc_info=exc)
            await exchange.send(sse(("error", error_body(exc)[1])))
        await exchange.end()

    async def _events(
        self, events: AsyncIterator[TextDelta], event: TextDelta | None
    ) -> AsyncIterator[Event]:
        """The content block events of the whole generation; then `stop` and `usage` are known."""
        generated = 0
        while event is not None:
            generated += len(event.token_ids)
            for block_event in self.blocks.feed(self.parser.feed(event.text)):
                yield block_event
            if event.finish_reason is not None:
                break
            event = await anext(events, None)
        for block_event in [*self.blocks.feed(self.parser.finish()), *self.blocks.finish()]:
            yield block_event
        finish, self.usage = ending(event, self.request, generated)
        self.exchange.note_usage(self.usage.prompt_tokens, self.usage.completion_tokens)
        self.stop = stop_info(event, finish, bool(self.parser.calls))
