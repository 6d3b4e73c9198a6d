"""The serving engine: a loaded model behind the `Engine` protocol, one generation at a time.

Owns: `LocalEngine` — tokenizer, chat template and model session for one model; admission (a
bounded queue; past it `QueueFullError` at once); the generation loop run step by step on one
worker thread, turning token ids into text deltas with stop sequences held back; and abort: when
the consumer stops iterating, the loop ends at the next step boundary and the slot is freed.
(Continuous batching replaces the single slot in a later issue.)
A request's grammar (constrained decoding) and logprobs are handled inside the token loop
(`generate_tokens`); each token's logprobs ride on the delta that carries the token, even when
its text is held back.
Imports: zinc.engine (types, generate, stops, constraint), zinc.runtime.session, zinc.tokenizer,
zinc.errors.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

from zinc.engine.constraint import GrammarMatcher
from zinc.engine.generate import Sampled, generate_tokens
from zinc.engine.stops import StopMatcher
from zinc.engine.types import (
    EngineStats,
    FinishReason,
    GenerationRequest,
    TextDelta,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from zinc.errors import ContextLengthExceededError, QueueFullError
from zinc.runtime.session import ModelSession
from zinc.tokenizer import ChatTemplate, IncrementalDecoder, Tokenizer

T = TypeVar("T")


class LocalEngine:
    def __init__(
        self, session: ModelSession, tokenizer: Tokenizer, chat: ChatTemplate, model_id: str, max_queue: int = 16
    ) -> None:
        self.session = session
        self.tokenizer = tokenizer
        self.chat = chat
        self._model_id = model_id
        self.max_queue = max_queue
        self._lock = asyncio.Lock()
        self._waiting = 0
        self._active = 0
        self._positions = 0  # KV positions held by the running request
        # every device call runs on this one thread, so a step still running after its request
        # was cancelled finishes before the next request's first step starts
        self._worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="zinc-engine")
        self.started = time.monotonic()

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def context_length(self) -> int:
        return self.session.context_length

    def stats(self) -> EngineStats:
        s = self.session
        return EngineStats(
            self._active, self._waiting, self.context_length, device=s.device_spec.name,
            weights_bytes=s.weights_bytes, context_reserved_bytes=s.kv_cache_bytes(), context_tokens=self._positions,
        )  # fmt: skip

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        return self.chat.render(messages, add_generation_prompt=add_generation_prompt, **kwargs)

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TextDelta]:
        n_prompt = len(request.prompt_ids)
        if n_prompt == 0 or n_prompt >= self.context_length:
            raise ContextLengthExceededError(n_prompt, self.context_length)
        if self._waiting >= self.max_queue:
            raise QueueFullError(f"the server is busy: {self._waiting} requests are waiting; retry later")
        self._waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self._waiting -= 1
        self._active += 1
        try:
            async for delta in self._generate_locked(request):
                yield delta
        finally:
            self._active -= 1
            self._positions = 0
            self._lock.release()

    async def _generate_locked(self, request: GenerationRequest) -> AsyncIterator[TextDelta]:
        prompt = list(request.prompt_ids)
        decoder = IncrementalDecoder(self.tokenizer)
        stops = StopMatcher(request.stop)
        eog = self.tokenizer.eog_ids if request.stop_on_eog else frozenset()
        matcher = None
        if request.grammar is not None:
            matcher = await self._run(partial(GrammarMatcher, request.grammar, self.tokenizer))
        # the token loop itself (prefill, sampling, constraint, logprobs, decode, context limit) is
        # generate_tokens; each `next` runs one step on the worker thread, and leaving this loop
        # abandons the rest
        tokens = generate_tokens(self.session, prompt, request.max_tokens, request.sampling, eog,
                                 logprobs=request.logprobs, constraint=matcher)
        generated = 0
        finish: FinishReason = "length"
        self._positions = len(prompt)
        while (sampled := await self._run(partial(next, tokens, None))) is not None:
            token = sampled.token
            generated += 1
            self._positions += 1
            if token in eog:
                finish = "stop"
                break
            text = stops.feed(decoder.add(token))
            logprobs = (self._logprob(sampled),) if sampled.logprob is not None else ()
            if text or logprobs:
                yield TextDelta(text, (token,), logprobs=logprobs)
            if stops.stopped or (matcher is not None and matcher.done):
                finish = "stop"
                break
        tail = stops.feed(decoder.flush()) if not stops.stopped else ""
        tail += stops.flush()
        yield TextDelta(tail, (), finish, Usage(len(prompt), generated))

    def _logprob(self, sampled: Sampled) -> TokenLogprob:
        def piece(token: int) -> tuple[str, bytes]:
            raw = self.tokenizer.piece(token, skip_special=False)
            return raw.decode("utf-8", "replace"), raw

        text, raw = piece(sampled.token)
        top = tuple(TopLogprob(*piece(t), lp) for t, lp in sampled.top)
        assert sampled.logprob is not None
        return TokenLogprob(text, raw, sampled.logprob, top)
