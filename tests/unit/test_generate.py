"""The token loop and stop sequences, with a scripted session (no model needed)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytest

from zinc.engine.generate import generate_ids
from zinc.engine.stops import StopMatcher
from zinc.errors import ContextLengthExceededError
from zinc.runtime.sampling import SamplingParams


@dataclass
class Step:
    token: int

    def logits(self) -> object:
        raise AssertionError("greedy decoding must not read the logits")


class ScriptedSession:
    """Returns tokens 100, 101, 102, ... and records every step it is asked to run."""

    def __init__(self, context_length: int = 64) -> None:
        self.context_length = context_length
        self.calls: list[tuple[str, int]] = []

    def prefill(self, ids: Sequence[int], start: int = 0) -> Step:
        self.calls.append(("prefill", len(ids)))
        return Step(100)

    def decode(self, token: int, pos: int) -> Step:
        self.calls.append(("decode", pos))
        return Step(token + 1)


def test_runs_no_step_past_the_last_token() -> None:
    s = ScriptedSession()
    assert list(generate_ids(s, [1, 2, 3], 3)) == [100, 101, 102]
    assert s.calls == [("prefill", 3), ("decode", 3), ("decode", 4)]


def test_stops_at_a_stop_id_after_yielding_it() -> None:
    s = ScriptedSession()
    assert list(generate_ids(s, [1], 10, stop_ids={101})) == [100, 101]
    assert s.calls == [("prefill", 1), ("decode", 1)]


def test_context_limits() -> None:
    s = ScriptedSession(context_length=4)
    assert list(generate_ids(s, [1, 2], 10)) == [100, 101, 102]  # decodes at positions 2 and 3
    assert s.calls[-1] == ("decode", 3)
    with pytest.raises(ContextLengthExceededError):
        list(generate_ids(ScriptedSession(context_length=2), [1, 2], 1))


class ChainingSession(ScriptedSession):
    """Also chains steps as ModelSession.decode_after does: the step at `pos` is fed the token of
    the step before it, which is read only after this one is asked for."""

    def decode_after(self, prev: Step, pos: int) -> Step:
        self.calls.append(("decode_after", pos))
        return Step(prev.token + 1)


def test_greedy_steps_are_chained_and_none_past_the_last_token() -> None:
    s = ChainingSession()
    assert list(generate_ids(s, [1, 2, 3], 5)) == [100, 101, 102, 103, 104]
    # the first decode is fed the prefill's token from the host; each later step is enqueued
    # before the token of the one before is read; none for a sixth token
    assert s.calls == [("prefill", 3), ("decode", 3), ("decode_after", 4), ("decode_after", 5), ("decode_after", 6)]


def test_chained_steps_stop_at_a_stop_id_and_the_context() -> None:
    s = ChainingSession()
    assert list(generate_ids(s, [1], 10, stop_ids={102})) == [100, 101, 102]
    assert s.calls == [("prefill", 1), ("decode", 1), ("decode_after", 2), ("decode_after", 3)]  # one spare step
    s = ChainingSession(context_length=4)
    assert list(generate_ids(s, [1, 2], 10)) == [100, 101, 102]
    assert s.calls == [("prefill", 2), ("decode", 2), ("decode_after", 3)]  # none at position 4


@dataclass
class PeakedStep(Step):
    def logits(self) -> object:
        row = np.full(512, -1e9, np.float32)
        row[self.token] = 0.0  # any sampler picks the greedy token
        return row


class PeakedSession(ChainingSession):
    def prefill(self, ids: Sequence[int], start: int = 0) -> Step:
        return PeakedStep(super().prefill(ids, start).token)

    def decode(self, token: int, pos: int) -> Step:
        return PeakedStep(super().decode(token, pos).token)


def test_a_sampler_reading_logits_is_not_chained() -> None:
    """The next step's token is the host's pick, which the device's greedy token may not be."""
    s = PeakedSession()
    assert list(generate_ids(s, [1], 3, SamplingParams(temperature=1.0, seed=1))) == [100, 101, 102]
    assert s.calls == [("prefill", 1), ("decode", 1), ("decode", 2)]


@pytest.mark.parametrize(
    ("deltas", "stops", "emitted", "stopped"),
    [
        (["Hel", "lo wor", "ld"], ["world"], ["Hel", "lo ", ""], True),  # the stop text never leaks
        (["a", "b", "c"], ["bd"], ["a", "", "bc"], False),  # a held-back partial match is released
        (["x\n", "y"], ["\n"], ["x"], True),
        (["abc"], [], ["abc"], False),
    ],
)
def test_stop_matcher(deltas: list[str], stops: list[str], emitted: list[str], stopped: bool) -> None:
    m = StopMatcher(stops)
    out = [m.feed(d) for d in deltas if not m.stopped]
    assert out == emitted
    assert m.stopped is stopped
    if not stopped:
        assert "".join(out) + m.flush() == "".join(deltas)
