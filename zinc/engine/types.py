"""The engine's contract with its callers (server, CLI): requests in, token events out.

Owns: frozen request/event dataclasses and the `Engine` protocol. The server and the CLI talk
only to this surface; the real engine (zinc.engine.engine) and the tests' fake engine both
satisfy it.
Imports: zinc.runtime.sampling (SamplingParams, a plain dataclass module) and the stdlib.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from zinc.runtime.sampling import SamplingParams

__all__ = ["SamplingParams"]

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class Grammar:
    """A constraint on the generated text, as an llguidance grammar (built by zinc.engine.grammars).

    `kind` names what it was made from ("json_object", "json_schema", "tool_call"), for messages.
    Generation ends (finish "stop") as soon as the grammar is complete.
    """

    source: str
    kind: str = "grammar"


@dataclass(frozen=True)
class GenerationRequest:
    """One generation: prompt token ids in, at most `max_tokens` new tokens out."""

    request_id: str
    prompt_ids: Sequence[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: Sequence[str] = ()  # text stop sequences; never leaked into the output
    stop_on_eog: bool = True  # stop at the model's end-of-generation tokens
    logprobs: int | None = None  # None: none; n >= 0: each token's logprob and the n most likely
    grammar: Grammar | None = None  # constrained decoding: only tokens the grammar allows
    session_id: str | None = None  # keep this conversation's KV pages for its next turn
    # the choices of one request (n > 1) share this key and their prompt: one of them prefills
    # it, the others take its KV pages and compute only the last page's tokens
    prompt_group: str | None = None


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens whose KV rows came from the prefix cache

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class TopLogprob:
    """One candidate token: its text (partial UTF-8 shown as U+FFFD), raw bytes and log-probability."""

    token: str
    bytes: bytes
    logprob: float


@dataclass(frozen=True)
class PromptLogprobs:
    """A prompt's tokens under the model: the first one's text (nothing predicts it) and each
    later one's logprob after the tokens before it."""

    first: str
    rest: Sequence[TokenLogprob]


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability under the model and the most likely alternatives."""

    token: str
    bytes: bytes
    logprob: float
    top_logprobs: Sequence[TopLogprob] = ()


@dataclass(frozen=True)
class TextDelta:
    """A piece of generated text (may be empty while a stop sequence is being held back).

    `finish_reason` is set on the last event of a generation, together with `usage`, and
    `stop_sequence` with the request's stop string that ended it, if one did.
    `logprobs` has one entry per token in `token_ids` when the request asked for logprobs.
    """

    text: str
    token_ids: Sequence[int] = ()
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    logprobs: Sequence[TokenLogprob] = ()
    stop_sequence: str | None = None


@dataclass(frozen=True)
class EngineStats:
    active_requests: int
    queued_requests: int
    context_length: int
    device: str = ""  # where the model runs, e.g. "CPU (local-sync)"
    weights_bytes: int = 0  # model tensor bytes bound from the GGUF
    context_reserved_bytes: int = 0  # the KV cache slab allocated on the device
    context_tokens: int = 0  # positions held in KV pages (running requests, sessions, prefix cache)
    kv_page_size: int = 0  # positions per KV page
    kv_pages_total: int = 0
    kv_pages_in_use: int = 0  # referenced by running requests or sessions
    kv_pages_cached: int = 0  # holding a reusable prefix, evictable
    kv_pages_free: int = 0
    sessions: int = 0

    @property
    def kv_capacity_tokens(self) -> int:
        """Positions the KV cache holds in all: its pages, or one context without paging."""
        return self.kv_pages_total * self.kv_page_size or self.context_length

    @property
    def context_active_bytes(self) -> int:
        """Bytes of the KV cache holding live positions (`context_tokens` of `kv_capacity_tokens`)."""
        return (
            self.context_reserved_bytes
            * min(self.context_tokens, self.kv_capacity_tokens)
            // max(1, self.kv_capacity_tokens)
        )


class Engine(Protocol):
    """What the server needs from a loaded model.

    `generate` is an async iterator; when the consumer stops iterating (client gone, task
    cancelled), the generation is aborted and its cache freed at the next step boundary.
    It raises `QueueFullError` at once when admission is refused and
    `ContextLengthExceededError` before yielding anything when the prompt does not fit.
    """

    @property
    def model_id(self) -> str: ...

    @property
    def context_length(self) -> int: ...

    def stats(self) -> EngineStats: ...

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]: ...

    def detokenize(self, ids: Sequence[int]) -> str: ...

    def special_tokens(self) -> Mapping[str, int]:
        """The vocabulary's special token ids by GGUF name ("bos", "fim_pre", ...)."""
        ...

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True, **kwargs: Any
    ) -> str: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[TextDelta]: ...

    async def prompt_logprobs(self, prompt_ids: Sequence[int], top: int) -> PromptLogprobs:
        """The prompt's tokens as the model predicts them, with the `top` most likely tokens at
        each (`echo` with `logprobs`)."""
        ...

    def release_session(self, session_id: str) -> bool: ...
