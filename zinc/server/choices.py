"""Several choices of one chat or text completion (`n` > 1, or a batch of prompts), generated
together, whole or streamed.

Owns: `choice_requests` (one `GenerationRequest` per choice of a prompt: the same prompt under one
`prompt_group`, so the engine prefills it once and the others take its KV pages; with a `seed`,
choice j of each prompt samples with seed + j, so each choice's stream is reproducible, they differ,
and a batched prompt answers as it would alone; only the first choice keeps a `session_id`),
`ChoiceEvents` (every choice's engine events merged in the order they come; each prompt's choices
start once its admission gate lets them, so a batch larger than `--parallel` runs in turns; each
generation's iterator is closed on exit, which aborts what still runs), and `respond_choices`, the
response: every choice's first event is awaited before the head (errors before it are plain JSON
errors), each choice's text goes through its own `OutputParser`, streamed chunks carry their
choice's `index`, and usage counts each prompt once and the completion tokens of every choice
(`cached_tokens`: per prompt, the prompt tokens none of its choices computed); `respond_prompts`,
the answer to `echo` with `max_tokens` 0: each choice is its prompt (and its logprobs) alone.
Imports: zinc.engine.types, zinc.errors, zinc.server (chat_output, exchange, openai_request,
openai_response, error_table), orjson, the stdlib.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import replace

import orjson

from zinc.engine.types import GenerationRequest, TextDelta, Usage
from zinc.errors import ZincError
from zinc.server.chat_output import OutputParser
from zinc.server.error_table import describe
from zinc.server.exchange import Exchange
from zinc.server.openai_request import CommonParams
from zinc.server.openai_response import SSE_DONE, SSE_HEADERS, ChatShape, Choice, Output, TextShape, sse_event

log = logging.getLogger("zinc.server")
SEED_MASK = (1 << 64) - 1

Shape = ChatShape | TextShape
Item = tuple[int, TextDelta | BaseException | None]  # (choice, its next event, an error or its end)


Group = tuple[AbstractAsyncContextManager[None], Sequence[AsyncIterator[TextDelta]]]  # a gate, its streams


def choice_requests(request: GenerationRequest, n: int, first: int = 0) -> list[GenerationRequest]:
    """`request` as `n` choices that share its prompt (and its prefill), numbered from `first`."""
    group = f"{request.request_id}/choices/{first}"
    seed = request.sampling.seed
    out = []
    for j in range(n):
        sampling = request.sampling if seed is None else replace(request.sampling, seed=(seed + j) & SEED_MASK)
        out.append(
            replace(
                request,
                request_id=f"{request.request_id}/{first + j}",
                sampling=sampling,
                session_id=request.session_id if j == 0 else None,
                prompt_group=group,
            )
        )
    return out


class ChoiceEvents:
    """The events of several generations as (choice, event) in arrival order; a choice's end is
    (choice, None), and an error it raised is (choice, error). Choices come in groups, numbered in
    order; a group's generations start once its gate (an admission slot) is entered, and the gate
    is left when all of them have ended."""

    def __init__(self, groups: Sequence[Group]) -> None:
        self._queue: asyncio.Queue[Item] = asyncio.Queue()
        self._streams = [s for _, streams in groups for s in streams]
        self._tasks: list[asyncio.Future[None]] = []
        first = 0
        for gate, streams in groups:
            self._tasks.append(asyncio.ensure_future(self._group(gate, first, streams)))
            first += len(streams)
        self._backlog: deque[Item] = deque()

    async def _group(
        self, gate: AbstractAsyncContextManager[None], first: int, streams: Sequence[AsyncIterator[TextDelta]]
    ) -> None:
        try:
            async with gate:
                await asyncio.gather(*(self._pump(first + i, s) for i, s in enumerate(streams)))
        except Exception as exc:  # the gate refused (the queue is full): each choice reports it
            for i in range(len(streams)):
                self._queue.put_nowait((first + i, exc))

    async def _pump(self, index: int, stream: AsyncIterator[TextDelta]) -> None:
        try:
            async for event in stream:
                self._queue.put_nowait((index, event))
        except Exception as exc:  # handed to the reader, which reports it
            self._queue.put_nowait((index, exc))
            return
        self._queue.put_nowait((index, None))

    async def started(self) -> None:
        """Wait until every choice has an event (or has failed: that error is raised here)."""
        seen: set[int] = set()
        while len(seen) < len(self._streams):
            item = await self._queue.get()
            if isinstance(item[1], BaseException):
                raise item[1]
            self._backlog.append(item)
            seen.add(item[0])

    async def next(self) -> Item:
        if self._backlog:
            return self._backlog.popleft()
        return await self._queue.get()

    async def close(self) -> None:
        """Stop every generation still running (its pages are freed at the next step)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for stream in self._streams:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()


async def respond_choices(
    exchange: Exchange,
    shape: Shape,
    common: CommonParams,
    requests: Sequence[GenerationRequest],
    events: ChoiceEvents,
    make_parser: Callable[[], OutputParser],
    ending: Callable[[TextDelta | None, GenerationRequest, int], tuple[str, Usage]],
) -> None:
    """Answer with every choice of `events`, whole or streamed (`common.stream`)."""
    n = len(requests)
    parsers = [make_parser() for _ in range(n)]
    outputs = [Output() for _ in range(n)]
    generated = [0] * n
    last: list[TextDelta | None] = [None] * n
    finishes = [""] * n
    with_logprobs = requests[0].logprobs is not None
    streaming = common.stream
    if streaming:
        await exchange.start_stream(200, SSE_HEADERS)
    try:
        for i in range(n) if streaming else ():
            first = shape.first_chunk(i)
            if first is not None:
                await exchange.send(sse_event(first))
        left = n
        while left:
            i, event = await events.next()
            if isinstance(event, BaseException):
                raise event
            if event is not None and finishes[i] == "":
                last[i] = event
                generated[i] += len(event.token_ids)
                output = parsers[i].feed(event.text, event.logprobs)
                await _emit(exchange, shape, outputs[i], output, streaming, with_logprobs, i)
                if event.finish_reason is None:
                    continue
            if finishes[i]:
                continue  # the end of a choice that already finished
            await _emit(exchange, shape, outputs[i], parsers[i].finish(), streaming, with_logprobs, i)
            finish, _ = ending(last[i], requests[i], generated[i])
            finishes[i] = "tool_calls" if parsers[i].calls else finish
            if streaming:
                await exchange.send(sse_event(shape.final_chunk(finishes[i], i)))
            left -= 1
        usage = _usage(requests, last, generated, ending)
        exchange.note_usage(usage.prompt_tokens, usage.completion_tokens)
        if not streaming:
            choices = [Choice(outputs[i], finishes[i], parsers[i].calls) for i in range(n)]
            body = shape.whole_choices(choices, usage, with_logprobs=with_logprobs)
            await exchange.respond_json(200, orjson.dumps(body))
            return
        if common.include_usage:
            await exchange.send(sse_event(shape.usage_chunk(usage)))
        await exchange.send(SSE_DONE)
    except Exception as exc:
        if not streaming:
            raise
        if not isinstance(exc, ZincError):  # headers are out: report the failure inside the stream
            log.error("generation failed mid-stream (request %s)", shape.id, exc_info=exc)
        await exchange.send(sse_event(describe(exc)[1]))
    if streaming:
        await exchange.end()


async def _emit(
    exchange: Exchange, shape: Shape, whole: Output, output: Output, streaming: bool, with_logprobs: bool, i: int
) -> None:
    """A piece of choice i: streamed as its chunk, or kept for the whole response."""
    if not output:
        return
    if streaming:
        await exchange.send(sse_event(shape.delta_chunk(output, with_logprobs=with_logprobs, index=i)))
        return
    whole.content += output.content
    whole.reasoning += output.reasoning
    whole.tool_calls.extend(output.tool_calls)
    whole.logprobs.extend(output.logprobs)


async def respond_prompts(
    exchange: Exchange, shape: TextShape, common: CommonParams, prompts: Sequence[Sequence[int]]
) -> None:
    """Each prompt's `n` choices as the echoed prompt and nothing generated (finish "length")."""
    n = len(prompts) * common.n
    usage = Usage(sum(len(p) for p in prompts), 0)
    exchange.note_usage(usage.prompt_tokens, 0)
    with_logprobs = common.logprobs is not None
    if not common.stream:
        body = shape.whole_choices([Choice(Output(), "length") for _ in range(n)], usage, with_logprobs=with_logprobs)
        await exchange.respond_json(200, orjson.dumps(body))
        return
    await exchange.start_stream(200, SSE_HEADERS)
    for i in range(n):
        first = shape.first_chunk(i)
        if first is not None:
            await exchange.send(sse_event(first))
        await exchange.send(sse_event(shape.final_chunk("length", i)))
    if common.include_usage:
        await exchange.send(sse_event(shape.usage_chunk(usage)))
    await exchange.send(SSE_DONE)
    await exchange.end()


def _usage(
    requests: Sequence[GenerationRequest],
    last: Sequence[TextDelta | None],
    generated: Sequence[int],
    ending: Callable[[TextDelta | None, GenerationRequest, int], tuple[str, Usage]],
) -> Usage:
    """Each prompt once, every choice's completion tokens, and per prompt the prompt tokens none
    of its choices computed."""
    groups: dict[str | None, list[Usage]] = {}
    for e, r, g in zip(last, requests, generated, strict=True):
        groups.setdefault(r.prompt_group, []).append(ending(e, r, g)[1])
    each = list(groups.values())
    return Usage(
        sum(g[0].prompt_tokens for g in each),
        sum(u.completion_tokens for g in each for u in g),
        sum(min(u.cached_tokens for u in g) for g in each),
    )
