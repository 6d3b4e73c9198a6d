"""Token-level generation over a model session: prefill the prompt, then one decode per token.

Owns: `generate_tokens`, the single-sequence generation loop used by the CLI, the benchmarks and
the serving engine, and `generate_ids` (the same, ids only). Greedy decoding reads back only the
device's argmax; other samplers, a grammar constraint and logprobs read the step's logits. Per
token, in this order: the constraint's mask is applied to the (adjusted) logits and the sampler
picks a token; the constraint accepts it; its logprobs (log-softmax of the raw logits, with the
top `logprobs` alternatives) are computed when asked for. Stops at `max_tokens`, at an
end-of-generation id, when the constraint is complete, or when the context is full.
Imports: zinc.runtime (session, sampling), zinc.errors, numpy.
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from zinc.errors import ContextLengthExceededError
from zinc.runtime.sampling import Sampler, SamplingParams, token_logprobs


class Step(Protocol):
    @property
    def token(self) -> int: ...

    def logits(self) -> object: ...


class Session(Protocol):
    context_length: int

    def prefill(self, ids: Sequence[int], start: int = 0) -> Step: ...

    def decode(self, token: int, pos: int) -> Step: ...


class TokenConstraint(Protocol):
    """Per-token constrained decoding (zinc.engine.constraint.GrammarMatcher)."""

    def allowed(self) -> np.ndarray[Any, np.dtype[np.bool_]]: ...

    def accept(self, token: int) -> None: ...

    @property
    def done(self) -> bool: ...


@dataclass(frozen=True)
class Sampled:
    """One generated token; `logprob` and `top` (id, logprob) are set when logprobs were asked for."""

    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


def generate_tokens(
    session: Session,
    prompt_ids: Sequence[int],
    max_tokens: int,
    sampling: SamplingParams | None = None,
    stop_ids: Container[int] = (),
    *,
    logprobs: int | None = None,
    constraint: TokenConstraint | None = None,
) -> Iterator[Sampled]:
    """Yield generated tokens; an end-of-generation id is yielded and then generation stops."""
    if len(prompt_ids) >= session.context_length:
        raise ContextLengthExceededError(len(prompt_ids), session.context_length)
    sampler = Sampler(sampling or SamplingParams())
    read_logits = sampler.needs_logits or constraint is not None or logprobs is not None
    history = list(prompt_ids)
    if max_tokens <= 0:
        return
    step = session.prefill(prompt_ids)
    pos = len(prompt_ids)  # where the next token's K/V rows go
    while True:
        if read_logits:
            logits: Any = step.logits()
            allowed = constraint.allowed() if constraint is not None else None
            if sampler.needs_logits or allowed is not None:
                token = sampler.sample(logits, history, allowed)
            else:
                token = step.token
        else:
            token = step.token
        if constraint is not None and token not in stop_ids:
            constraint.accept(token)
        if logprobs is not None:
            logprob, top = token_logprobs(logits, token, logprobs)
            yield Sampled(token, logprob, tuple(top))
        else:
            yield Sampled(token)
        history.append(token)
        if (
            len(history) - len(prompt_ids) >= max_tokens
            or token in stop_ids
            or pos >= session.context_length
            or (constraint is not None and constraint.done)
        ):
            return  # no step is run for a token that will not be continued
        step = session.decode(token, pos)
        pos += 1


def generate_ids(
    session: Session,
    prompt_ids: Sequence[int],
    max_tokens: int,
    sampling: SamplingParams | None = None,
    stop_ids: Container[int] = (),
) -> Iterator[int]:
    """Yield generated token ids; an end-of-generation id is yielded and then generation stops."""
    for sampled in generate_tokens(session, prompt_ids, max_tokens, sampling, stop_ids):
        yield sampled.token
