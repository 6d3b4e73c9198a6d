"""The continuous-batching scheduler (zinc.engine.batcher) and its pages (zinc.engine.kv_pages)
with a fake model.

The fake (tests/unit/_fake_step_model.py) checks every read: a step may only read slots that hold
its own sequence's earlier positions, in order. Its greedy token is a hash of the history it read
back, so a wrong page table or a lost row changes the output. Covers admission,
batching equal to solo runs, interleaved prefill, abort, prefix reuse, sessions, eviction,
preemption and a failing step.
"""

from __future__ import annotations

import threading
from collections.abc import Container
from typing import Any

import pytest

from tests.unit._fake_step_model import WAIT_S, FakeModel, prompt, solo
from zinc.engine.batcher import Scheduler
from zinc.engine.generate import Sampled
from zinc.engine.kv_pages import PagePool
from zinc.engine.sequences import FinishEvent, SequenceEvent, SequenceRequest, TokenEvent
from zinc.errors import ContextLengthExceededError, QueueFullError

EOS = 1


class Greedy:
    read_logits = False
    done = False

    def pick(self, greedy: int, logits: Any) -> Sampled:
        return Sampled(greedy)


class Run:
    """One submitted request: its tokens and its finish event."""

    def __init__(
        self,
        scheduler: Scheduler,
        prompt: list[int],
        max_tokens: int = 8,
        session: str | None = None,
        stop: Container[int] = frozenset({EOS}),
        picker: Any = None,
    ) -> None:
        self.tokens: list[int] = []
        self.finish: FinishEvent | None = None
        self.first = threading.Event()
        self.done = threading.Event()
        req = SequenceRequest(prompt, max_tokens, stop, picker or Greedy(), self.on_event, session)
        self.handle = scheduler.submit(req)

    def on_event(self, event: SequenceEvent) -> None:
        if isinstance(event, TokenEvent):
            self.tokens.append(event.sampled.token)
            self.first.set()
        else:
            self.finish = event
            self.done.set()

    def wait(self) -> FinishEvent:
        assert self.done.wait(WAIT_S), "the request did not finish"
        assert self.finish is not None
        return self.finish


@pytest.fixture
def model() -> FakeModel:
    return FakeModel()


def started(model: FakeModel, **kwargs: Any) -> Scheduler:
    scheduler = Scheduler(model, **{"page_size": 16, "parallel": 8, "max_queue": 4, **kwargs})
    scheduler.start()
    return scheduler


def test_eight_sequences_together_equal_each_alone(model: FakeModel) -> None:
    scheduler = started(model, prefill_chunk=8)
    try:
        prompts = [prompt(i, 5 + 3 * i) for i in range(8)]
        runs = [Run(scheduler, p, max_tokens=12) for p in prompts]
        for run, p in zip(runs, prompts, strict=True):
            assert run.wait().reason == "length"
            assert run.tokens == solo(p, 12)
        assert max(model.rows("decode")) == model.max_batch  # batched
        stats = scheduler.stats()
        assert stats.running == 0 and stats.pages.in_use == 0
    finally:
        scheduler.close()


def test_admission_is_bounded_and_context_checked(model: FakeModel) -> None:
    scheduler = Scheduler(model, page_size=16, parallel=2, max_queue=1)  # not started: nothing runs
    runs = [Run(scheduler, prompt(i, 4)) for i in range(3)]
    with pytest.raises(QueueFullError):
        Run(scheduler, prompt(9, 4))
    with pytest.raises(ContextLengthExceededError):
        Run(scheduler, [])
    with pytest.raises(ContextLengthExceededError):
        Run(scheduler, prompt(3, model.context_length))
    scheduler.start()
    try:
        assert all(run.wait().reason == "length" for run in runs)
    finally:
        scheduler.close()


def test_long_prompt_is_prefilled_between_decode_steps() -> None:
    model = FakeModel(delay=0.003)
    scheduler = started(model, prefill_chunk=4)
    try:
        first = Run(scheduler, prompt(1, 3), max_tokens=60)
        assert first.first.wait(WAIT_S)
        second = Run(scheduler, prompt(2, 30), max_tokens=4)
        assert second.wait().reason == "length" and second.tokens == solo(prompt(2, 30), 4)
        assert first.finish is None  # still streaming while the long prompt went in
        kinds = [call.kind for call in model.calls]
        at = kinds.index("rows")  # the second request's first chunk (K/V only: its prompt goes on)
        assert "decode" in kinds[at + 1 : at + 3], "a decode step runs between prefill chunks"
        first.wait()
    finally:
        scheduler.close()


def test_cancel_frees_pages_at_the_next_step(model: FakeModel) -> None:
    scheduler = started(model)
    try:
        run = Run(scheduler, prompt(4, 20), max_tokens=50)
        assert run.first.wait(WAIT_S)
        run.handle.cancel()
        assert run.wait().reason == "abort"
        stats = scheduler.stats()
        assert stats.running == 0 and stats.pages.in_use == 0
        assert len(run.tokens) < 50
    finally:
        scheduler.close()


def test_shared_prefix_is_computed_once(model: FakeModel) -> None:
    scheduler = started(model)
    try:
        system = prompt(5, 40)
        a = Run(scheduler, [*system, 7, 8], max_tokens=3)
        a.wait()
        model.calls.clear()
        b = Run(scheduler, [*system, 9], max_tokens=3)
        finish = b.wait()
        assert finish.cached_tokens == 32  # two whole pages of the 40-token prefix
        assert (model.calls[0].kind, len(model.calls[0].tokens)) == ("prefill", 41 - 32)
        assert b.tokens == solo([*system, 9], 3)
    finally:
        scheduler.close()


def test_session_pins_pages_until_released(model: FakeModel) -> None:
    scheduler = started(model)
    try:
        history = prompt(6, 35)
        first = Run(scheduler, history, max_tokens=4, session="chat-1")
        first.wait()
        stats = scheduler.stats()
        assert stats.pages.sessions == 1 and stats.pages.in_use == 2  # 38 positions: two whole pages
        follow = [*history, *first.tokens, 11, 12]
        model.calls.clear()
        again = Run(scheduler, follow, max_tokens=4, session="chat-1")
        assert again.wait().cached_tokens == 32 and again.tokens == solo(follow, 4)
        assert scheduler.release_session("chat-1") and not scheduler.release_session("chat-1")
        stats = scheduler.stats()
        assert stats.pages.sessions == 0 and stats.pages.in_use == 0 and stats.pages.cached > 0
    finally:
        scheduler.close()


def test_lru_eviction_and_preemption_keep_outputs_exact() -> None:
    model = FakeModel(kv_slots=16 * 6)  # five usable pages: one whole context and a page more
    scheduler = started(model, parallel=3)
    try:
        prompts = [prompt(20 + i, 20) for i in range(3)]
        runs = [Run(scheduler, p, max_tokens=30, session=f"s{i}") for i, p in enumerate(prompts)]
        for run, p in zip(runs, prompts, strict=True):
            finish = run.wait()
            assert run.tokens == solo(p, len(run.tokens)), finish
            assert len(run.tokens) == 30, finish
        stats = scheduler.stats()
        assert stats.pages.total == 5 and stats.pages.in_use <= 5
    finally:
        scheduler.close()


def test_a_failing_step_ends_its_sequences_and_the_loop_goes_on(model: FakeModel) -> None:
    scheduler = started(model)
    try:
        bad_prompt = prompt(30, 6)
        model.fail_on = solo(bad_prompt, 1)[0]
        bad = Run(scheduler, bad_prompt, max_tokens=5)
        finish = bad.wait()
        assert finish.reason == "error" and finish.error is not None and "device lost" in finish.error.message
        model.fail_on = None
        good = Run(scheduler, prompt(31, 6), max_tokens=5)
        assert good.wait().reason == "length" and good.tokens == solo(prompt(31, 6), 5)
        assert scheduler.stats().pages.in_use == 0
    finally:
        scheduler.close()


def test_page_pool_lookup_never_covers_the_last_token() -> None:
    pool = PagePool(8, 4)
    pages = [p for p in (pool.allocate(), pool.allocate()) if p is not None]
    pool.register(pages, list(range(8)))
    pool.release(pages)
    assert pool.stats().cached == 2
    assert pool.lookup(list(range(8))) == pages[:1]  # the whole prompt is cached: its last page is recomputed
    assert pool.lookup(list(range(9))) == pages
    assert list(pool.slots(pages, 6)) == [pages[0] * 4 + i for i in range(4)] + [
        pages[1] * 4,
        pages[1] * 4 + 1,
    ]
