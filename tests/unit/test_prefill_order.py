"""The order of the prompts' chunks in an iteration (zinc.engine.batcher.Scheduler._plan), against
the fake StepModel (tests/unit/_fake_step_model.py), which checks every slot it reads and records
every call: a short request that comes while a long prompt is being prefilled gets its first
token after the long prompt's chunk under way (not after the whole long prompt), its last chunk
still packs with the others', it streams while the long prompt goes on, a prompt too long to end
beside the long one's share still goes in beside it, and the long prompt is never starved by a
stream of short ones (its share of every iteration's budget). Every count here
is of calls and tokens, never of wall time.
"""

from __future__ import annotations

from typing import Any

from tests.unit._fake_step_model import PAGE, FakeModel, prompt
from tests.unit.test_scheduler import Run, held, make
from zinc.engine.batcher import OLDEST_SHARE, Scheduler
from zinc.engine.sequences import SequenceEvent, TokenEvent


class Counted(Run):
    """A request that notes how many device calls had been made when its first token came."""

    def __init__(self, scheduler: Scheduler, model: FakeModel, *args: Any, **kwargs: Any) -> None:
        self.model = model
        self.first_call: int | None = None
        super().__init__(scheduler, *args, **kwargs)

    def on_event(self, event: SequenceEvent) -> None:
        if isinstance(event, TokenEvent) and self.first_call is None:
            self.first_call = len(self.model.calls)
        super().on_event(event)


def long_tokens(model: FakeModel, long: Run, calls: slice) -> list[int]:
    """The long prompt's tokens prefilled in each of `model.calls[calls]` that is one of its chunks."""
    return [
        len(c.tokens)
        for c in model.calls[calls]
        if c.kind in ("rows", "prefill") and c.tokens == long.prompt[c.positions[0] : c.positions[-1] + 1]
    ]


def test_short_requests_go_in_after_the_long_prompts_chunk_under_way_and_pack() -> None:
    model = FakeModel(context_length=256, kv_slots=PAGE * 40, max_packed=4, packed_tokens=32)
    scheduler = make(model, prefill_chunk=32)
    long = Counted(scheduler, model, prompt(200, 200), max_tokens=3)
    model.hold_at = 2  # the long prompt's third chunk (of seven)
    scheduler.start()
    try:
        at = held(model)
        shorts = [Counted(scheduler, model, prompt(201 + i, n), max_tokens=4) for i, n in enumerate((6, 5))]
        model.go.set()
        assert long.wait().reason == "length" and long.exact()
        assert all(run.wait().reason == "length" and run.exact() for run in shorts)
        calls = [(c.kind, len(c.tokens)) for c in model.calls]
        # the chunk under way, then both short prompts whole in one packed call (their first
        # tokens), then the long prompt takes what is left of the 32 tokens
        assert calls[at : at + 3] == [("rows", 32), ("packed", 11), ("rows", 21)]
        for run in shorts:
            assert run.first_call is not None
            assert long_tokens(model, long, slice(at, run.first_call)) == [32]  # one long chunk, no more
    finally:
        model.go.set()
        scheduler.close()


def test_a_short_request_streams_while_the_long_prompt_is_prefilled() -> None:
    model = FakeModel(context_length=512, kv_slots=PAGE * 40)
    scheduler = make(model, prefill_chunk=16)
    long = Counted(scheduler, model, prompt(210, 400), max_tokens=2)
    model.hold_at = 1
    scheduler.start()
    try:
        at = held(model)
        short = Counted(scheduler, model, prompt(211, 9), max_tokens=5)
        model.go.set()
        assert short.wait().reason == "length" and short.exact()
        assert long.finish is None, "the short request waited for the whole long prompt"
        assert short.first_call is not None and long_tokens(model, long, slice(at, short.first_call)) == [16]
        assert long.wait().reason == "length" and long.exact()
        # every iteration after the short prompt: the long prompt's chunk (the 7 tokens the short
        # one left, then 16), then the short request's decode step, until it has its 5 tokens
        after = [(c.kind, len(c.tokens)) for c in model.calls[at + 1 : at + 11]]
        assert after == [("prefill", 9), ("rows", 7)] + [("rows", 16), ("decode", 1)] * 4
    finally:
        model.go.set()
        scheduler.close()


def test_a_prompt_too_long_to_end_beside_the_long_one_still_goes_in_beside_it() -> None:
    """30 tokens do not fit beside the long prompt's share (32 - 8): they go in as a chunk of 24
    and the rest next iteration, while the long prompt gets its share each time."""
    model = FakeModel(context_length=256, kv_slots=PAGE * 40)
    scheduler = make(model, prefill_chunk=32)
    long = Counted(scheduler, model, prompt(230, 200), max_tokens=2)
    model.hold_at = 2
    scheduler.start()
    try:
        at = held(model)
        medium = Counted(scheduler, model, prompt(231, 30), max_tokens=3)
        model.go.set()
        assert medium.wait().reason == "length" and medium.exact()
        assert long.wait().reason == "length" and long.exact()
        calls = [(c.kind, len(c.tokens)) for c in model.calls]
        assert calls[at : at + 5] == [("rows", 32), ("rows", 24), ("rows", 8), ("prefill", 6), ("rows", 26)]
        assert medium.first_call is not None
        assert long_tokens(model, long, slice(at, medium.first_call)) == [32, 8]  # its share beside it
    finally:
        model.go.set()
        scheduler.close()


def test_a_stream_of_short_requests_never_starves_the_long_prompt() -> None:
    """Short prompts of half the budget would take all of it, two at a time; a quarter of it is
    kept for the oldest prompt, so the long one goes on beside them in every iteration and ends
    while the short ones still come."""
    chunk = 16
    model = FakeModel(context_length=128, kv_slots=PAGE * 60)
    scheduler = make(model, prefill_chunk=chunk, parallel=8, max_queue=64)
    long = Counted(scheduler, model, prompt(220, 96), max_tokens=2)
    shorts = [Counted(scheduler, model, prompt(221 + i, chunk // 2), max_tokens=1) for i in range(40)]
    scheduler.start()
    try:
        assert long.wait().reason == "length" and long.exact()
        assert all(run.wait().reason == "length" and run.exact() for run in shorts)
        chunks = long_tokens(model, long, slice(None))
        assert sum(chunks) == 96 and min(chunks) >= chunk // OLDEST_SHARE
        assert long.first_call is not None
        assert sum(run.first_call is not None and run.first_call > long.first_call for run in shorts) >= 5
        # the short ones went first: the first whole, the second as much as fits beside the long
        # prompt's share, then that share
        kinds = [(c.kind, len(c.tokens)) for c in model.calls[:3]]
        assert kinds == [("prefill", 8), ("rows", 4), ("rows", 4)]
    finally:
        scheduler.close()
