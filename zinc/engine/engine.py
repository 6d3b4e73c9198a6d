"""The serving engine: a loaded model behind the `Engine` protocol, every request decoded together.

Owns: `LocalEngine` — tokenizer, chat template and model session for one model, and the
continuous-batching `Scheduler` (zinc.engine.batcher) that runs every admitted request's steps
together on one thread; admission (at most `parallel` running, a bounded queue, past it
`QueueFullError` at once); turning each request's token events into text deltas with stop
sequences held back; and abort: when the consumer stops iterating (or a stop sequence matched),
the sequence is cancelled and its KV pages freed at the next step boundary. Token events reach
the request's event loop through one `EventRelay` per loop (a step's tokens wake it once). A
request's grammar (constrained decoding), sampling and logprobs are its `TokenPicker`; each
token's logprobs ride on the delta that carries the token, even when its text is held back.
`session_id` keeps a conversation's pages cached between requests until `release_session`.
`embed` (an `Embedder`, zinc.engine.embeddings): the inputs' final hidden states from the session,
several short inputs per `embed_packed` call where the artifact has it, else one per `embed` call,
each call on the scheduler's thread (decode steps go on between them), pooled as the GGUF declares
and normalized here.
Imports: zinc.engine (types, generate, batcher, relay, stops, constraint, embeddings), zinc.runtime.session,
zinc.tokenizer, zinc.errors.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from functools import partial
from typing import Any

from zinc.engine.batcher import Scheduler
from zinc.engine.constraint import GrammarMatcher
from zinc.engine.embeddings import Embeddings, Vector, normalize, packs, pool
from zinc.engine.generate import Sampled, TokenPicker
from zinc.engine.relay import EventChannel, EventRelay
from zinc.engine.scoring import score_prompt
from zinc.engine.sequences import FinishEvent, SequenceEvent, SequenceRequest
from zinc.engine.stops import StopMatcher
from zinc.engine.types import (
    EngineStats,
    FinishReason,
    GenerationRequest,
    PromptLogprobs,
    TextDelta,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from zinc.errors import ContextLengthExceededError, EngineClosedError, InvalidRequestError, ZincError
from zinc.runtime.session import EMBED_PACK_TOKENS, ModelSession
from zinc.tokenizer import ChatTemplate, IncrementalDecoder, Tokenizer


class LocalEngine:
    def __init__(
        self,
        session: ModelSession,
        tokenizer: Tokenizer,
        chat: ChatTemplate,
        model_id: str,
        max_queue: int = 16,
        parallel: int = 8,
        page_size: int = 16,
        prefill_chunk: int | None = None,
    ) -> None:
        self.session = session
        self.tokenizer = tokenizer
        self.chat = chat
        self._model_id = model_id
        self.max_queue = max_queue
        # prompt tokens per scheduler iteration (`--prefill-chunk`); by default one prefill call's
        chunk = prefill_chunk or session.chunk_tokens
        self.scheduler = Scheduler(
            session, page_size=page_size, parallel=min(parallel, 4 * session.max_batch), max_queue=max_queue,
            prefill_chunk=chunk,
        )  # fmt: skip
        self.scheduler.start()
        # grammar compilation runs here, off the event loop
        self._worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="zinc-engine")
        self.started = time.monotonic()
        self._relays: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, EventRelay] = weakref.WeakKeyDictionary()

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def context_length(self) -> int:
        return self.session.context_length

    def close(self) -> None:
        self.scheduler.close()
        self._worker.shutdown(wait=False)

    def _relay(self, loop: asyncio.AbstractEventLoop) -> EventRelay:
        """The relay to `loop`: every request served from one loop shares it, so a decode step's
        tokens wake that loop once."""
        relay = self._relays.get(loop)
        if relay is None:
            relay = self._relays[loop] = EventRelay(loop)
        return relay

    def stats(self) -> EngineStats:
        s, run = self.session, self.scheduler.stats()
        pages = run.pages
        return EngineStats(
            run.running, run.waiting, self.context_length, device=s.device_spec.name,
            weights_bytes=s.weights_bytes, context_reserved_bytes=s.kv_cache_bytes(),
            context_tokens=pages.in_use * pages.page_size, kv_page_size=pages.page_size,
            kv_pages_total=pages.total, kv_pages_in_use=pages.in_use, kv_pages_cached=pages.cached,
            kv_pages_free=pages.free, sessions=pages.sessions,
        )  # fmt: skip

    def release_session(self, session_id: str) -> bool:
        return self.scheduler.release_session(session_id)

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def special_tokens(self) -> Mapping[str, int]:
        return self.tokenizer.special_ids

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        return self.chat.render(messages, add_generation_prompt=add_generation_prompt, **kwargs)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TextDelta]:
        prompt = list(request.prompt_ids)
        if not prompt or len(prompt) >= self.context_length:
            raise ContextLengthExceededError(len(prompt), self.context_length)
        eog = self.tokenizer.eog_ids if request.stop_on_eog else frozenset()
        matcher = None
        if request.grammar is not None:
            loop = asyncio.get_running_loop()
            matcher = await loop.run_in_executor(
                self._worker, partial(GrammarMatcher, request.grammar, self.tokenizer)
            )
        picker = TokenPicker(prompt, request.sampling, eog, logprobs=request.logprobs, constraint=matcher)
        events: EventChannel[SequenceEvent] = EventChannel()
        relay, put = self._relay(asyncio.get_running_loop()), events.put

        def deliver(event: SequenceEvent) -> None:
            relay.post(put, event)

        handle = self.scheduler.submit(
            SequenceRequest(
                prompt, request.max_tokens, eog, picker, deliver, request.session_id, request.prompt_group
            )
        )
        # the token events become text deltas here, in this generator's own frame (no inner
        # generator: each layer costs the event loop a resumption per token)
        decoder = IncrementalDecoder(self.tokenizer)
        stops = StopMatcher(request.stop)
        generated = 0
        try:
            while True:
                event = await events.get()
                if isinstance(event, FinishEvent):
                    if event.reason == "error":
                        raise event.error or ZincError("generation failed")
                    if event.reason == "abort":  # the engine closed under it (a model swap, shutdown)
                        raise EngineClosedError("the engine shut down before this request finished; retry it")
                    finish: FinishReason = "stop" if event.reason == "stop" else "length"
                    cached = event.cached_tokens
                    break
                sampled = event.sampled
                generated += 1
                if sampled.token in eog:
                    continue  # the finish event follows
                text = stops.feed(decoder.add(sampled.token))
                logprobs = (self._logprob(sampled),) if sampled.logprob is not None else ()
                if text or logprobs:
                    yield TextDelta(text, (sampled.token,), logprobs=logprobs)
                if stops.stopped:
                    handle.cancel()
                    finish, cached = "stop", handle.cached_tokens
                    break
            tail = stops.feed(decoder.flush()) if not stops.stopped else ""
            tail += stops.flush()
            usage = Usage(len(request.prompt_ids), generated, cached)
            yield TextDelta(tail, (), finish, usage, stop_sequence=stops.matched)
        finally:
            handle.cancel()  # a no-op once finished; else the pages are freed at the next step

    @property
    def pooling(self) -> str:
        """The model's pooling ("none" unless its artifact has `embed`)."""
        return self.session.hparams.pooling if self.session.embeds else "none"

    @property
    def embedding_length(self) -> int:
        return self.session.hparams.embedding_length

    async def embed(self, inputs: Sequence[Sequence[int]], dimensions: int | None = None) -> Embeddings:
        pooling = self.pooling
        if pooling == "none":
            declared = self.session.hparams.pooling
            why = "declares no pooling" if declared == "none" else f"declares {declared!r} pooling, which zinc does not embed with"
            raise InvalidRequestError(
                f"The model '{self.model_id}' {why} (GGUF {self.session.hparams.architecture}.pooling_type): "
                "it is not an embedding model (`zinc serve --embeddings mean|cls|last` embeds with it anyway).",
                param="model",
            )  # fmt: skip
        for ids in inputs:
            if not ids:
                raise InvalidRequestError("an embedding input must hold at least one token", param="input")
            if min(ids) < 0 or max(ids) >= self.session.vocab_size:
                raise InvalidRequestError(f"token ids must be in [0, {self.session.vocab_size})", param="input")
            if len(ids) > self.context_length:
                exc = ContextLengthExceededError(len(ids), self.context_length)
                exc.param = "input"
                raise exc
        vectors: dict[int, Vector] = {}
        session = self.session
        for group in packs([len(ids) for ids in inputs], session.max_embed_packed, EMBED_PACK_TOKENS):
            group_ids = [list(inputs[i]) for i in group]  # the running sequences' steps go on between the calls
            call = (
                partial(session.embed_packed, group_ids) if len(group) > 1 else partial(_embed_alone, session, group_ids[0])
            )
            hidden = await asyncio.wrap_future(self.scheduler.call(call))
            for i, rows in zip(group, hidden, strict=True):
                vectors[i] = normalize(pool(rows, pooling), dimensions)
        return Embeddings([vectors[i] for i in range(len(inputs))], sum(len(ids) for ids in inputs))

    async def prompt_logprobs(self, prompt_ids: Sequence[int], top: int) -> PromptLogprobs:
        ids = list(prompt_ids)
        if not ids:
            raise InvalidRequestError("The prompt is empty.", param="prompt")
        if min(ids) < 0 or max(ids) >= self.session.vocab_size:
            raise InvalidRequestError(f"token ids must be in [0, {self.session.vocab_size})", param="prompt")
        if len(ids) >= self.context_length:
            exc = ContextLengthExceededError(len(ids), self.context_length)
            exc.param = "prompt"
            raise exc
        scored = await score_prompt(self.scheduler, ids, top)
        first = self.tokenizer.piece(ids[0], skip_special=False).decode("utf-8", "replace")
        return PromptLogprobs(first, [self._logprob(s) for s in scored])

    def _logprob(self, sampled: Sampled) -> TokenLogprob:
        def piece(token: int) -> tuple[str, bytes]:
            raw = self.tokenizer.piece(token, skip_special=False)
            return raw.decode("utf-8", "replace"), raw

        text, raw = piece(sampled.token)
        top = tuple(TopLogprob(*piece(t), lp) for t, lp in sampled.top)
        assert sampled.logprob is not None
        return TokenLogprob(text, raw, sampled.logprob, top)


def _embed_alone(session: ModelSession, ids: list[int]) -> list[Vector]:
    return [session.embed(ids)]
