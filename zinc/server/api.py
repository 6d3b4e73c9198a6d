"""The OpenAI endpoints over an `Engine`: chat and text completions (whole and streamed), models, health.

Owns: turning validated parameters into a `GenerationRequest` (chat template, tokenization, model
and context checks), admission (`parallel` running plus a bounded queue; past that, 429 at once),
and running a generation. The engine's iterator is always closed (`aclose`), so a cancelled
handler task (client gone, during prefill, mid-stream or while waiting for a whole response)
reaches the engine's abort. The first event is awaited before any response head is sent, so
errors the engine raises before yielding (context length, queue full) are ordinary JSON errors;
once SSE headers are out, an error becomes a final `data: {"error": ...}` event.
Chat requests render their active `tools` through the template, and their output goes through
an `OutputParser` (reasoning split, tool calls; finish reason "tool_calls" when a call was
made); a forced `tool_choice` or a `response_format` becomes the request's grammar.
`prepare_chat` and `generation` are that path in two steps, for the Anthropic Messages API
(zinc.server.anthropic_api) and the OpenAI Responses API (zinc.server.responses_api) to run the
same way with their own response shapes. A request with
`n` > 1 choices takes `n` admission slots at once (at most `--parallel`) and is answered by
zinc.server.choices, as is a /v1/completions batch (an array of prompts), whose prompts take
their slots in turn (a batch may hold at most `--parallel` + `--max-queue` generations). A
completion's `suffix` makes each text prompt a fill-in-the-middle prompt (zinc.server.fim). With
`echo` and `logprobs`, each prompt is scored first (the engine's `prompt_logprobs`, under an
admission slot of its own) and its tokens' logprobs lead each of its choices'; `max_tokens` 0
answers with the prompts alone. An `X-Session-Id` header stands for the body's `session_id` when that is
absent (balancers hash on headers, not bodies). While `draining` (after SIGTERM, zinc.server.app),
`/health` answers 503 so balancers stop sending requests, which are still served meanwhile.
Imports: zinc.engine (types, reasoning), zinc.errors, zinc.server.*, orjson, the stdlib.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from urllib.parse import unquote

import orjson

from zinc.engine.manager import EngineManager
from zinc.engine.reasoning import prompt_opens_thinking
from zinc.engine.types import Engine, GenerationRequest, Grammar, PromptLogprobs, TextDelta, Usage
from zinc.errors import (
    ContextLengthExceededError,
    InvalidRequestError,
    ModelNotFoundError,
    QueueFullError,
    ZincError,
)
from zinc.server.chat_output import OutputParser
from zinc.server.choices import ChoiceEvents, choice_requests, respond_choices, respond_prompts
from zinc.server.config import ServerConfig
from zinc.server.error_table import NotFoundError, describe
from zinc.server.exchange import Exchange, HttpRequest
from zinc.server.fim import engine_fim_prompt, fim_texts
from zinc.server.openai_request import (
    ChatParams,
    CommonParams,
    Json,
    decode_json,
    parse_chat,
    parse_completion,
)
from zinc.server.openai_response import (
    SSE_DONE,
    SSE_HEADERS,
    ChatShape,
    Output,
    TextShape,
    model_card,
    sse_event,
)

log = logging.getLogger("zinc.server")

Shape = ChatShape | TextShape


class Admission:
    """Counts the choices generating and waiting (a request with `n` choices counts `n`, taken
    all at once, first come first served); refuses at once past both bounds."""

    def __init__(self, parallel: int, max_queued: int) -> None:
        self.parallel = parallel
        self.max_queued = max_queued
        self.running = 0
        self.waiting = 0
        self._queue: deque[tuple[int, asyncio.Future[None]]] = deque()

    @asynccontextmanager
    async def slot(self, n: int = 1) -> AsyncIterator[None]:
        if self._queue or self.running + n > self.parallel:
            if self.waiting + n > self.max_queued:
                raise QueueFullError("The server is busy: too many requests are running and queued.")
            entry = (n, asyncio.get_running_loop().create_future())
            self._queue.append(entry)
            self.waiting += n
            try:
                await entry[1]
            except BaseException:
                if entry in self._queue:  # still waiting: leave the queue
                    self._queue.remove(entry)
                    self.waiting -= n
                elif not entry[1].cancelled():  # granted as it was cancelled: give it back
                    self.running -= n
                self._grant()
                raise
        else:
            self.running += n
        try:
            yield
        finally:
            self.running -= n
            self._grant()

    def _grant(self) -> None:
        """Start the waiting requests, in order, while the first one's choices fit."""
        while self._queue and self.running + self._queue[0][0] <= self.parallel:
            n, future = self._queue.popleft()
            self.waiting -= n
            if not future.done():
                self.running += n
                future.set_result(None)


def session_header(payload: Json, request: HttpRequest) -> Json:
    """The body with the `X-Session-Id` header as its `session_id` when the body names none: a
    balancer can hash on the header to send a conversation's turns to the replica holding it."""
    header = request.header("x-session-id")
    if header is None or "session_id" in payload:
        return payload
    return {**payload, "session_id": header.strip()}


@asynccontextmanager
async def closing(events: AsyncIterator[TextDelta]) -> AsyncIterator[AsyncIterator[TextDelta]]:
    """`contextlib.aclosing` for any async iterator: close it (which aborts the generation)."""
    try:
        yield events
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


class OpenAIApi:
    """Endpoint handlers; each takes the request head and its exchange."""

    def __init__(self, engine: Engine, config: ServerConfig) -> None:
        self._engine = engine
        self._admission = Admission(config.parallel, config.max_queued_requests)
        self._started = time.time()
        self.draining = False  # set on SIGTERM (zinc.server.app): /health says 503 "draining"

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def admission(self) -> Admission:
        return self._admission

    async def chat_completions(self, request: HttpRequest, exchange: Exchange) -> None:
        params = parse_chat(session_header(decode_json(await exchange.body()), request))
        shape = ChatShape(await self.select_model(params.common.model))
        ids, parser, grammar = self.prepare_chat(params)
        await self._generate(exchange, shape, params.common, ids, "messages", parser, grammar)

    def prepare_chat(self, params: ChatParams) -> tuple[list[int], OutputParser, Grammar | None]:
        """A chat request's prompt ids (template, tools), its output parser and its grammar."""
        tools = params.tools
        kwargs = dict(params.template_kwargs)
        if tools.active:
            kwargs["tools"] = [dict(t) for t in tools.tools]
        prompt = self._engine.apply_chat_template(list(params.messages), add_generation_prompt=True, **kwargs)
        ids = self._engine.tokenize(prompt, add_special=True, parse_special=True)
        parser = OutputParser(reasoning=True, thinking_open=prompt_opens_thinking(prompt), tools=tools.active)
        return ids, parser, tools.grammar() or params.common.grammar

    async def completions(self, request: HttpRequest, exchange: Exchange) -> None:
        params = parse_completion(session_header(decode_json(await exchange.body()), request))
        model = await self.select_model(params.common.model)
        if params.suffix:  # fill in the middle, between each prompt and the suffix
            texts = fim_texts(params.prompts, params.suffix)
            prompts = [engine_fim_prompt(self._engine, t, params.common.max_tokens, "suffix") for t in texts]
        else:
            # special tokens written in a prompt are those tokens, as llama.cpp's server reads them
            prompts = [self._engine.tokenize(p, parse_special=True) if isinstance(p, str) else list(p) for p in params.prompts]
        echoes: list[str] = []
        for text, ids in zip(params.prompts, prompts, strict=True) if params.echo else ():
            echoes += [text if isinstance(text, str) else self._engine.detokenize(ids)] * params.common.n
        scored: list[PromptLogprobs] = []
        top = params.common.logprobs
        for ids in prompts if params.echo and top is not None else ():
            async with self._admission.slot():  # its pages are held as a generation's are
                scored += [await self._engine.prompt_logprobs(ids, top or 0)] * params.common.n
        shape = TextShape(model, echoes, scored)
        if params.common.max_tokens == 0:  # `echo` alone: nothing to generate
            await respond_prompts(exchange, shape, params.common, prompts)
            return
        if len(prompts) > 1:
            await self._choices(exchange, shape, params.common, prompts, "prompt", OutputParser(), params.common.grammar)
            return
        await self._generate(
            exchange, shape, params.common, prompts[0], "prompt", OutputParser(), params.common.grammar
        )

    async def models(self, request: HttpRequest, exchange: Exchange) -> None:
        context = self._engine.context_length
        body = {
            "object": "list",
            "data": [model_card(self._engine.model_id, int(self._started), context)],
            "active_context_capacity_tokens": context,
        }
        await exchange.respond_json(200, orjson.dumps(body))

    async def health(self, request: HttpRequest, exchange: Exchange) -> None:
        stats = self._engine.stats()
        body = {
            "status": "draining" if self.draining else "ok",
            "model": self._engine.model_id or "none",
            "active_requests": stats.active_requests,
            "queued_requests": stats.queued_requests + self._admission.waiting,
            "uptime_seconds": int(time.time() - self._started),
            "context_length": stats.context_length,
            "device": stats.device,
            "gpu_memory_used_bytes": stats.weights_bytes + stats.context_reserved_bytes,
            "gpu_memory_weights_bytes": stats.weights_bytes,
            "gpu_context_reserved_bytes": stats.context_reserved_bytes,
            "gpu_context_active_bytes": stats.context_active_bytes,
            "gpu_context_tokens": stats.context_tokens,
            "gpu_context_capacity_tokens": stats.kv_capacity_tokens,
            "active_sessions": stats.sessions,
            "kv_cache": {
                "page_size": stats.kv_page_size,
                "total_pages": stats.kv_pages_total,
                "used_pages": stats.kv_pages_in_use,
                "cached_pages": stats.kv_pages_cached,
                "free_pages": stats.kv_pages_free,
                "utilization": round(stats.kv_pages_in_use / stats.kv_pages_total, 4)
                if stats.kv_pages_total
                else 0.0,
            },
        }
        if self.draining:  # balancers take this replica out; requests still sent are served
            await exchange.respond_json(503, orjson.dumps(body), [("retry-after", "1")])
            return
        await exchange.respond_json(200, orjson.dumps(body))

    async def delete_session(self, request: HttpRequest, exchange: Exchange) -> None:
        """`DELETE /v1/sessions/{id}`: release a session's cached KV pages."""
        session_id = unquote(request.path.rsplit("/", 1)[1])
        if not session_id or not self._engine.release_session(session_id):
            raise NotFoundError(f"No session '{session_id}' exists.")
        body = {"id": session_id, "object": "session", "deleted": True}
        await exchange.respond_json(200, orjson.dumps(body))

    # ---- generation

    async def select_model(self, requested: str | None) -> str:
        """The model that answers: an `EngineManager` may switch to an installed one first."""
        if isinstance(self._engine, EngineManager):
            return await self._engine.select_model(requested)
        return self._model(requested)

    def _model(self, requested: str | None) -> str:
        served = self._engine.model_id
        if requested is not None and requested != served:
            raise ModelNotFoundError(
                f"The model '{requested}' does not exist; this server serves '{served}'."
            )
        return served

    async def _generate(
        self,
        exchange: Exchange,
        shape: Shape,
        common: CommonParams,
        prompt_ids: Sequence[int],
        param: str,
        parser: OutputParser,
        grammar: Grammar | None,
    ) -> None:
        if common.n > 1:
            await self._choices(exchange, shape, common, [prompt_ids], param, parser, grammar)
            return
        async with self.generation(shape.id, common, prompt_ids, param, grammar) as (request, events, first):
            if common.stream:
                await self._stream(exchange, shape, common, request, events, first, parser)
            else:
                await self._whole(exchange, shape, request, events, first, parser)

    @asynccontextmanager
    async def generation(
        self,
        request_id: str,
        common: CommonParams,
        prompt_ids: Sequence[int],
        param: str,
        grammar: Grammar | None,
    ) -> AsyncIterator[tuple[GenerationRequest, AsyncIterator[TextDelta], TextDelta | None]]:
        """Check the prompt, take an admission slot and start generating: the request, its
        events and the first event (awaited, so errors before it are plain JSON errors).
        Leaving the block closes the events, which aborts a generation still running."""
        request = self.request(request_id, common, prompt_ids, param, grammar)
        async with self._admission.slot(), closing(self._engine.generate(request)) as events:
            first = await anext(events, None)  # engine errors before the first token: plain JSON
            yield request, events, first

    def request(
        self,
        request_id: str,
        common: CommonParams,
        prompt_ids: Sequence[int],
        param: str,
        grammar: Grammar | None,
    ) -> GenerationRequest:
        """The engine request, once the prompt is checked (empty, or too long for the context)."""
        context = self._engine.context_length
        if not prompt_ids:
            raise InvalidRequestError("The prompt is empty.", param=param)
        if len(prompt_ids) >= context:
            error = ContextLengthExceededError(len(prompt_ids), context)
            error.param = param
            raise error
        request = GenerationRequest(
            request_id=request_id,
            prompt_ids=prompt_ids,
            max_tokens=min(common.max_tokens, context - len(prompt_ids)),
            sampling=common.sampling,
            stop=common.stop,
            logprobs=common.logprobs,
            grammar=grammar,
            session_id=common.session_id,
        )
        return request

    async def _choices(
        self,
        exchange: Exchange,
        shape: Shape,
        common: CommonParams,
        prompts: Sequence[Sequence[int]],
        param: str,
        parser: OutputParser,
        grammar: Grammar | None,
    ) -> None:
        """`n` > 1 choices of each of `prompts` (zinc.server.choices): a prompt's n generations
        take n admission slots together; a batch's prompts take theirs in turn."""
        admission = self._admission
        if common.n > admission.parallel:
            raise InvalidRequestError(
                f"'n' is {common.n}, more than this server decodes together (--parallel {admission.parallel}).",
                param="n",
            )
        if len(prompts) * common.n > admission.parallel + admission.max_queued:
            raise InvalidRequestError(
                f"{len(prompts)} prompts x n={common.n} are more generations than this server runs and "
                f"queues at once (--parallel {admission.parallel} + --max-queue {admission.max_queued}).",
                param=param,
            )
        requests: list[GenerationRequest] = []
        for p, ids in enumerate(prompts):
            where = param if len(prompts) == 1 else f"{param}[{p}]"
            first = self.request(shape.id, replace(common, session_id=None) if p else common, ids, where, grammar)
            requests += choice_requests(first, common.n, p * common.n)
        groups = [
            (admission.slot(common.n), [self._engine.generate(r) for r in requests[i : i + common.n]])
            for i in range(0, len(requests), common.n)
        ]
        events = ChoiceEvents(groups)
        try:
            await events.started()
            await respond_choices(exchange, shape, common, requests, events, parser.fresh, ending)
        finally:
            await events.close()

    async def _whole(
        self,
        exchange: Exchange,
        shape: Shape,
        request: GenerationRequest,
        events: AsyncIterator[TextDelta],
        event: TextDelta | None,
        parser: OutputParser,
    ) -> None:
        output = Output()
        generated = 0
        while event is not None:
            _extend(output, parser.feed(event.text, event.logprobs))
            generated += len(event.token_ids)
            if event.finish_reason is not None:
                break
            event = await anext(events, None)
        _extend(output, parser.finish())
        finish, usage = ending(event, request, generated)
        if parser.calls:
            finish = "tool_calls"
        exchange.note_usage(usage.prompt_tokens, usage.completion_tokens)
        body = shape.whole(
            output, finish, usage, calls=parser.calls, with_logprobs=request.logprobs is not None
        )
        await exchange.respond_json(200, orjson.dumps(body))

    async def _stream(
        self,
        exchange: Exchange,
        shape: Shape,
        common: CommonParams,
        request: GenerationRequest,
        events: AsyncIterator[TextDelta],
        event: TextDelta | None,
        parser: OutputParser,
    ) -> None:
        with_logprobs = request.logprobs is not None
        await exchange.start_stream(200, SSE_HEADERS)
        try:
            first = shape.first_chunk()
            if first is not None:
                await exchange.send(sse_event(first))
            generated = 0
            while event is not None:
                generated += len(event.token_ids)
                output = parser.feed(event.text, event.logprobs)
                if output:
                    await exchange.send(sse_event(shape.delta_chunk(output, with_logprobs=with_logprobs)))
                if event.finish_reason is not None:
                    break
                event = await anext(events, None)
            output = parser.finish()
            if output:
                await exchange.send(sse_event(shape.delta_chunk(output, with_logprobs=with_logprobs)))
            finish, usage = ending(event, request, generated)
            if parser.calls:
                finish = "tool_calls"
            exchange.note_usage(usage.prompt_tokens, usage.completion_tokens)
            await exchange.send(sse_event(shape.final_chunk(finish)))
            if common.include_usage:
                await exchange.send(sse_event(shape.usage_chunk(usage)))
            await exchange.send(SSE_DONE)
        except Exception as exc:  # headers are out: report the failure inside the stream
            if not isinstance(exc, ZincError):
                log.error("generation failed mid-stream (request %s)", request.request_id, exc_info=exc)
            await exchange.send(sse_event(describe(exc)[1]))
        await exchange.end()


def ending(last: TextDelta | None, request: GenerationRequest, generated: int) -> tuple[str, Usage]:
    """Finish reason and usage from the last event (computed if the engine left them out)."""
    usage = last.usage if last is not None else None
    if usage is None:
        usage = Usage(len(request.prompt_ids), generated)
    if last is not None and last.finish_reason is not None:
        return last.finish_reason, usage
    return ("length" if usage.completion_tokens >= request.max_tokens else "stop"), usage


def _extend(output: Output, more: Output) -> None:
    output.content += more.content
    output.reasoning += more.reasoning
    output.tool_calls.extend(more.tool_calls)
    output.logprobs.extend(more.logprobs)
