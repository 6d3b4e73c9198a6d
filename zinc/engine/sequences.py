"""The scheduler's vocabulary: what it needs from the model and from each request, and the
events it sends back.

Owns: the `StepModel` protocol (the device side, zinc.runtime.session.ModelSession), `Picker`
(the per-token choice, zinc.engine.generate.TokenPicker), `SequenceRequest`, the `TokenEvent` /
`FinishEvent` stream and `SchedulerStats`.
Imports: zinc.engine (kv_pages, generate), zinc.errors, the stdlib.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from zinc.engine.generate import Sampled
from zinc.engine.kv_pages import PageStats, Slots
from zinc.errors import ZincError


class Step(Protocol):
    @property
    def token(self) -> int: ...

    def logits(self) -> Any: ...


class BatchStep(Protocol):
    def wait(self) -> None: ...

    def token(self, i: int) -> int: ...

    def logits(self, i: int) -> Any: ...


class StepModel(Protocol):
    """What the scheduler needs from the device (zinc.runtime.session.ModelSession)."""

    context_length: int
    kv_slots: int

    @property
    def max_batch(self) -> int: ...

    def prefill_slots(self, ids: Sequence[int], start: int, slots: Slots) -> Step: ...

    def prefill_rows(self, ids: Sequence[int], start: int, slots: Slots) -> None: ...

    @property
    def max_packed(self) -> int:
        """The most prompts `prefill_packed` takes in one call (0: it takes none)."""
        ...

    @property
    def packed_tokens(self) -> int: ...

    def prefill_packed(self, jobs: Sequence[tuple[Sequence[int], int, Slots]]) -> BatchStep:
        """The last chunks of several prompts, (ids, start, slots) each, in one call; row i is job i's."""
        ...

    def decode_batch(
        self, tokens: Sequence[int], positions: Sequence[int], slots: Sequence[Slots]
    ) -> BatchStep: ...

    def decode_next(self, prev: Any, positions: Sequence[int], slots: Sequence[Slots]) -> BatchStep:
        """The step after `prev` (a step of this model) for its rows, fed its greedy tokens on the device."""
        ...


class Picker(Protocol):
    read_logits: bool  # False: `pick` keeps the greedy token, so the next step can be fed it on the device

    def pick(self, greedy: int, logits: Callable[[], Any]) -> Sampled: ...

    @property
    def done(self) -> bool: ...


FinishKind = Literal["stop", "length", "abort", "error"]


@dataclass(frozen=True)
class TokenEvent:
    sampled: Sampled


@dataclass(frozen=True)
class FinishEvent:
    reason: FinishKind
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    error: ZincError | None = None


SequenceEvent = TokenEvent | FinishEvent


@dataclass
class SequenceRequest:
    prompt_ids: Sequence[int]
    max_tokens: int
    stop_ids: Container[int]
    picker: Picker
    on_event: Callable[[SequenceEvent], None]
    session_id: str | None = None
    group: str | None = None  # the choices of one request (n > 1): one prefills the shared prompt


@dataclass(frozen=True)
class SchedulerStats:
    running: int
    waiting: int
    pages: PageStats
