"""Test doubles: a fake `Engine` that needs no model.

`FakeEngine` tokenizes one token per UTF-8 byte (plus a BOS id), renders chat messages in a tiny
ChatML-like template, and generates a fixed, cycling sentence from a small vocabulary with an
optional per-token delay. It honours `max_tokens` and text stop sequences (holding back partial
matches, never emitting the stop text), serializes generations behind a lock like the real
engine does before batching, and records everything tests want to check: requests, template
calls, aborts and completions. With `script`, it generates that text instead (cut into pieces of
`script_piece` characters, one per token, so tags split across tokens) and stops ("stop") when the
script ends. A stop sequence that ends a generation is named in its last event's `stop_sequence`.
When a request asks for logprobs, each token carries made-up but deterministic ones
(token i: logprob -0.25 * (i % 4), alternatives below it). A request with a `session_id` keeps
its prompt until `release_session`; the next request of that session reports the prompt prefix it
shares with it (at most all but one token) as `usage.cached_tokens`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

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
from zinc.errors import ContextLengthExceededError, QueueFullError, ZincError

VOCAB = (
    "Hello",
    ",",
    " world",
    "!",
    " The",
    " quick",
    " brown",
    " fox",
    " jumps",
    " over",
    " the",
    " lazy",
    " dog",
    ".",
)
BOS = 1
TOKEN_BASE = 1000  # generated token ids are TOKEN_BASE + vocab index


def expected_text(n_tokens: int) -> str:
    """What the fake engine generates for `n_tokens` tokens (no stop sequences)."""
    return "".join(VOCAB[i % len(VOCAB)] for i in range(n_tokens))


class FakeEngine:
    """Deterministic engine for server tests."""

    def __init__(
        self,
        *,
        model_id: str = "fake-model",
        context_length: int = 512,
        token_delay: float = 0.0,
        prefill_delay: float = 0.0,
        fail_after: int | None = None,
        fail_with: ZincError | Exception | None = None,
        queue_full: bool = False,
        script: str | None = None,
        script_piece: int = 3,
    ) -> None:
        self.script = script
        self.specials: dict[str, int] = {"bos": BOS}  # add "fim_pre", ... for /infill tests
        self.script_piece = script_piece
        self._model_id = model_id
        self._context_length = context_length
        self.token_delay = token_delay
        self.prefill_delay = prefill_delay
        self.fail_after = fail_after  # raise `fail_with` after this many tokens (None: never)
        self.fail_with = fail_with
        self.queue_full = queue_full
        self.requests: list[GenerationRequest] = []
        self.scored: list[list[int]] = []  # prompts `prompt_logprobs` scored
        self.template_calls: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []
        self.aborts: list[str] = []
        self.sessions: dict[str, list[int]] = {}  # session id -> the prompt it last sent
        self.completed: list[str] = []
        self.started: list[str] = []
        self.active = 0
        self.queued = 0
        self._lock: asyncio.Lock | None = None

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def context_length(self) -> int:
        return self._context_length

    def stats(self) -> EngineStats:
        return EngineStats(
            self.active, self.queued, self._context_length, kv_page_size=16, kv_pages_total=64,
            kv_pages_in_use=len(self.sessions), kv_pages_free=64 - len(self.sessions), sessions=len(self.sessions),
        )  # fmt: skip

    def release_session(self, session_id: str) -> bool:
        return self.sessions.pop(session_id, None) is not None

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return ([BOS] if add_special else []) + list(text.encode())

    def detokenize(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i < 256 and i != BOS).decode(errors="replace")

    def special_tokens(self) -> Mapping[str, int]:
        return dict(self.specials)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        self.template_calls.append(([dict(m) for m in messages], dict(kwargs)))
        text = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)
        return text + ("<|assistant|>" if add_generation_prompt else "")

    async def prompt_logprobs(self, prompt_ids: Sequence[int], top: int) -> PromptLogprobs:
        """Token k of the prompt (k >= 1) gets logprob -k/100; BOS's text is "<s>"."""
        self.scored.append(list(prompt_ids))
        out = []
        for k, token in enumerate(prompt_ids[1:], 1):
            piece = self.detokenize([token])
            alternatives = [TopLogprob(piece, piece.encode(), -k / 100)]
            alternatives += [TopLogprob(f"alt{j}", f"alt{j}".encode(), -k / 100 - j) for j in range(1, top)]
            out.append(TokenLogprob(piece, piece.encode(), -k / 100, tuple(alternatives[:top])))
        first = "<s>" if prompt_ids[0] == BOS else self.detokenize(prompt_ids[:1])
        return PromptLogprobs(first, out)

    def generate(self, request: GenerationRequest) -> AsyncIterator[TextDelta]:
        if self.queue_full:
            raise QueueFullError("fake engine queue is full")
        return self._generate(request)

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[TextDelta]:
        self.requests.append(request)
        cached = 0
        if request.session_id is not None:
            cached = _shared_prefix(self.sessions.get(request.session_id, []), request.prompt_ids)
            self.sessions[request.session_id] = list(request.prompt_ids)
        if len(request.prompt_ids) >= self._context_length:
            raise ContextLengthExceededError(len(request.prompt_ids), self._context_length)
        if self._lock is None:
            self._lock = asyncio.Lock()
        finished = False
        holding_lock = False
        self.queued += 1
        try:
            async with self._lock:
                self.queued -= 1
                holding_lock = True
                self.active += 1
                try:
                    self.started.append(request.request_id)
                    if self.prefill_delay:
                        await asyncio.sleep(self.prefill_delay)
                    async for delta in self._tokens(request, cached):
                        finished = delta.finish_reason is not None
                        yield delta
                finally:
                    self.active -= 1
        finally:
            if not holding_lock:
                self.queued -= 1
            (self.completed if finished else self.aborts).append(request.request_id)

    async def _tokens(self, request: GenerationRequest, cached: int = 0) -> AsyncIterator[TextDelta]:
        text = ""  # generated so far
        sent = 0  # characters of `text` already emitted
        pieces = self._script_pieces()
        for n in range(1, request.max_tokens + 1):
            if self.token_delay:
                await asyncio.sleep(self.token_delay)
            else:
                await asyncio.sleep(0)
            if self.fail_after is not None and n > self.fail_after:
                raise self.fail_with or RuntimeError("fake engine failure")
            index = (n - 1) % len(VOCAB)
            text += pieces[n - 1] if pieces is not None else VOCAB[index]
            logprobs = _fake_logprobs(n - 1, pieces[n - 1] if pieces else VOCAB[index], request.logprobs)
            hits = [(i, s) for s in request.stop if (i := text.find(s, sent)) >= 0]
            if hits:
                hit, stop = min(hits, key=lambda h: h[0])
                final = self._final(text[sent:hit], index, "stop", request, n, logprobs, cached)
                yield replace(final, stop_sequence=stop)
                return
            safe = len(text) - _held_back(text, request.stop)
            if pieces is not None and n == len(pieces):
                yield self._final(text[sent:], index, "stop", request, n, logprobs, cached)
                return
            last = n == request.max_tokens
            if last:
                yield self._final(text[sent:], index, "length", request, n, logprobs, cached)
                return
            yield TextDelta(text[sent:safe], token_ids=(TOKEN_BASE + index,), logprobs=logprobs)
            sent = max(sent, safe)

    def _script_pieces(self) -> list[str] | None:
        if self.script is None:
            return None
        size = self.script_piece
        return [self.script[i : i + size] for i in range(0, len(self.script), size)] or [""]

    @staticmethod
    def _final(
        text: str, index: int, reason: FinishReason, request: GenerationRequest, n: int,
        logprobs: tuple[TokenLogprob, ...] = (), cached: int = 0,
    ) -> TextDelta:  # fmt: skip
        usage = Usage(len(request.prompt_ids), n, cached)
        return TextDelta(
            text, token_ids=(TOKEN_BASE + index,), finish_reason=reason, usage=usage, logprobs=logprobs
        )


def _fake_logprobs(i: int, piece: str, top: int | None) -> tuple[TokenLogprob, ...]:
    """Deterministic logprobs for the i-th generated token (none unless asked for)."""
    if top is None:
        return ()
    logprob = -0.25 * (i % 4)
    alternatives = [TopLogprob(piece, piece.encode(), logprob)]
    alternatives += [TopLogprob(f"alt{k}", f"alt{k}".encode(), logprob - k) for k in range(1, top)]
    return (TokenLogprob(piece, piece.encode(), logprob, tuple(alternatives[:top])),)


def _shared_prefix(before: Sequence[int], now: Sequence[int]) -> int:
    """Leading tokens `now` shares with `before`, leaving at least one of `now` to compute."""
    n = 0
    for a, b in zip(before, now[:-1], strict=False):
        if a != b:
            break
        n += 1
    return n


def _held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters of `text` could start a stop sequence."""
    longest = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                longest = max(longest, k)
                break
    return longest


# ---- a transport without sockets, and a small HTTP/1.1 response parser


class MockTransport(asyncio.Transport):
    """Collects what the protocol writes; records read pauses; `close()` reports connection_lost."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False
        self.read_paused = False
        self.pause_count = 0
        self.protocol: asyncio.Protocol | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed, "write after close"
        self.written += data

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.protocol is not None:
                asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.read_paused = True
        self.pause_count += 1

    def resume_reading(self) -> None:
        self.read_paused = False

    def is_reading(self) -> bool:
        return not self.read_paused

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000)}.get(name, default)

    def take(self) -> bytes:
        data = bytes(self.written)
        self.written.clear()
        return data


class ParsedResponse:
    def __init__(self, status: int, headers: dict[str, str], body: bytes, chunked: bool) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.chunked = chunked

    def json(self) -> Any:
        import orjson

        return orjson.loads(self.body)

    def events(self) -> list[str]:
        """The `data:` payloads of an SSE body."""
        return [line[6:] for line in self.body.decode().split("\n") if line.startswith("data: ")]

    def __repr__(self) -> str:
        return f"<{self.status} {self.headers} {self.body[:200]!r}>"


def parse_responses(raw: bytes) -> list[ParsedResponse]:
    """Split bytes written by the server into responses (Content-Length, chunked, or to EOF)."""
    out: list[ParsedResponse] = []
    while raw:
        head, sep, raw = raw.partition(b"\r\n\r\n")
        assert sep, f"incomplete head: {head!r}"
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        chunked = headers.get("transfer-encoding") == "chunked"
        if "content-length" in headers:
            size = int(headers["content-length"])
            body, raw = raw[:size], raw[size:]
        elif chunked:
            parts: list[bytes] = []
            while True:
                size_line, _, raw = raw.partition(b"\r\n")
                size = int(size_line, 16)
                parts.append(raw[:size])
                raw = raw[size + 2 :]
                if size == 0:
                    break
            body = b"".join(parts)
        elif 100 <= status < 200:
            body = b""
        else:
            body, raw = raw, b""
        out.append(ParsedResponse(status, headers, body, chunked))
    return out


def async_test(fn: Any) -> Any:
    """Run an `async def` test on a fresh event loop, bounded by a timeout."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        async def bounded() -> None:
            await asyncio.wait_for(fn(*args, **kwargs), timeout=20)

        asyncio.run(bounded())

    return wrapper
