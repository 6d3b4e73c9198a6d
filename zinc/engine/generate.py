"""Token-level generation over a model session: prefill the prompt, then one decode per token.

Owns: `generate_ids`, the single-sequence generation loop used by the CLI, the benchmarks and the
serving engine. Greedy decoding reads back only the device's argmax; other samplers read the
logits. Stops at `max_tokens`, at an end-of-generation id, or when the context is full.
Imports: zinc.runtime (session, sampling), zinc.errors.
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Sequence
from typing import Protocol

from zinc.errors import ContextLengthExceededError
from zinc.runtime.sampling import Sampler, SamplingParams


class Step(Protocol):
    @property
    def token(self) -> int: ...

    def logits(self) -> object: ...


class Session(Protocol):
    context_length: int

    def prefill(self, ids: Sequence[int], start: int = 0) -> Step: ...

    def decode(self, token: int, pos: int) -> Step: ...


def generate_ids(
    session: Session,
    prompt_ids: Sequence[int],
    max_tokens: int,
    sampling: SamplingParams | None = None,
    stop_ids: Container[int] = (),
) -> Iterator[int]:
    """Yield generated token ids; an end-of-generation id is yielded and then generation stops."""
    if len(prompt_ids) >= session.context_length:
        raise ContextLengthExceededError(len(prompt_ids), session.context_length)
    sampler = Sampler(sampling or SamplingParams())
    history = list(prompt_ids)
    if max_tokens <= 0:
        return
    step = session.prefill(prompt_ids)
    pos = len(prompt_ids)  # where the next token's K/V rows go
    while True:
        token = sampler.sample(step.logits(), history) if sampler.needs_logits else step.token  # type: ignore[arg-type]
        yield token
        history.append(token)
        if len(history) - len(prompt_ids) >= max_tokens or token in stop_ids or pos >= session.context_length:
            return  # no step is run for a token that will not be continued
        step = session.decode(token, pos)
        pos += 1
