"""Token-level generation over a model session: prefill the prompt, then one decode per token.

Owns: `TokenPicker` (the per-token choice, shared with the batching scheduler), `generate_tokens`,
the single-sequence generation loop used by the CLI (greedy steps chained on the device where the
session has `decode_after`) and the benchmarks, and `generate_ids` (the same, ids only).
Greedy decoding reads back only the device's argmax; other samplers, a grammar constraint and
logprobs read the step's logits. Per token, in this order: the constraint's mask is applied to
the (adjusted) logits and the sampler picks a token; the constraint accepts it; its logprobs
(log-softmax of the raw logits, with the top `logprobs` alternatives) are computed when asked for.
Stops at `max_tokens`, at an end-of-generation id, when the constraint is complete, or when the
context is full.
Imports: zinc.runtime (session, sampling), zinc.errors, numpy.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator, Sequence
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


class TokenPicker:
    """Chooses each next token of one sequence from its step: the sampler over the (masked)
    logits, the constraint's bookkeeping and the token's logprobs. Shared by `generate_tokens`
    and the batching scheduler, so both pick tokens the same way."""

    def __init__(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams | None = None,
        stop_ids: Container[int] = (),
        *,
        logprobs: int | None = None,
        constraint: TokenConstraint | None = None,
    ) -> None:
        self.sampler = Sampler(sampling or SamplingParams())
        self.constraint = constraint
        self.logprobs = logprobs
        self.stop_ids = stop_ids
        self.history = list(prompt_ids)
        self.read_logits = self.sampler.needs_logits or constraint is not None or logprobs is not None

    @property
    def done(self) -> bool:
        return self.constraint is not None and self.constraint.done

    def pick(self, greedy: int, logits: Callable[[], Any]) -> Sampled:
        """The next token, given the device's greedy token and a way to read the step's logits."""
        token = greedy
        if self.read_logits:
            row = logits()
            allowed = self.constraint.allowed() if self.constraint is not None else None
            if self.sampler.needs_logits or allowed is not None:
                token = self.sampler.sample(row, self.history, allowed)
        if self.constraint is not None and token not in self.stop_ids:
            self.constraint.accept(token)
        self.history.append(token)
        if self.logprobs is not None:
            logprob, top = token_logprobs(row, token, self.logprobs)
            return Sampled(token, logprob, tuple(top))
        return Sampled(token)


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
    picker = TokenPicker(prompt_ids, sampling, stop_ids, logprobs=logprobs, constraint=constraint)
    if max_tokens <= 0:
        return
    # Greedy tokens alone: each decode step is fed the one before's token on the device and
    # enqueued before that token is read (ModelSession.decode_after), so the host's work for a
    # token overlaps the device's next step. A stop id found then leaves one step run for nothing.
    chain: Callable[[Step, int], Step] | None = None if picker.read_logits else getattr(session, "decode_after", None)
    step = session.prefill(prompt_ids)
    pos = len(prompt_ids)  # where the next token's K/V rows go
    generated = 0
    ahead: Step | None = None  # the step at `pos`, already enqueued
    while True:
        if chain is not None and generated and generated + 1 < max_tokens and pos < session.context_length:
            ahead = chain(step, pos)  # from decode steps: the prefill call has already waited for its token
        sampled = picker.pick(step.token if not picker.sampler.needs_logits else 0, step.logits)
        yield sampled
        generated += 1
        token = sampled.token
        if generated >= max_tokens or token in stop_ids or pos >= session.context_length or picker.done:
            return  # no step is run past max_tokens or the context (a chained one may be, for a stop id)
        step = ahead if ahead is not None else session.decode(token, pos)
        ahead = None
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
