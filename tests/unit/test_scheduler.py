"""The continuous-batching scheduler (zinc.engine.batcher.Scheduler) against a fake StepModel that
can be held inside a call, so a test sees the loop between two steps.

The fake (tests/unit/_fake_step_model.py) checks every slot it reads and records every call. Complements tests/unit/test_batcher.py: fairness under load, the parallel limit,
stop ids, a finished picker, a full context, close, cancel while waiting and at the step boundary,
preemption, the LRU session drop, the stats and a failing prefill.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tests.unit._fake_step_model import PAGE, WAIT_S, FakeModel, prompt, solo
from zinc.engine.batcher import Scheduler
from zinc.engine.generate import Sampled
from zinc.engine.sequences import FinishEvent, SequenceEvent, SequenceRequest, TokenEvent
from zinc.errors import ZincError


class Greedy:
    read_logits = True  # no chained steps (test_batcher and test_chained_steps have them)
    def __init__(self, done_after: int | None = None) -> None:
        self.picked = 0
        self.done_after = done_after

    def pick(self, greedy: int, logits: Callable[[], Any]) -> Sampled:
        assert int(np.argmax(logits())) == greedy
        self.picked += 1
        return Sampled(greedy)

    @property
    def done(self) -> bool:
        return self.done_after is not None and self.picked >= self.done_after


class Run:
    """One submitted request: its tokens, its finish event, and what the scheduler said when each
    token arrived (`seen`, on the scheduler thread)."""

    def __init__(
        self,
        scheduler: Scheduler,
        prompt_ids: list[int],
        max_tokens: int = 8,
        *,
        session: str | None = None,
        stop_ids: frozenset[int] = frozenset(),
        picker: Greedy | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.prompt = prompt_ids
        self.tokens: list[int] = []
        self.running_seen: list[int] = []
        self.finish: FinishEvent | None = None
        self.first = threading.Event()
        self.done = threading.Event()
        req = SequenceRequest(prompt_ids, max_tokens, stop_ids, picker or Greedy(), self.on_event, session)
        self.handle = scheduler.submit(req)

    def on_event(self, event: SequenceEvent) -> None:
        if isinstance(event, TokenEvent):
            self.tokens.append(event.sampled.token)
            self.running_seen.append(self.scheduler.stats().running)
            self.first.set()
        else:
            self.finish = event
            self.done.set()

    def wait(self) -> FinishEvent:
        assert self.done.wait(WAIT_S), "the request did not finish"
        assert self.finish is not None
        return self.finish

    def exact(self) -> bool:
        return self.tokens == solo(self.prompt, len(self.tokens))


def make(model: FakeModel, **kwargs: Any) -> Scheduler:
    return Scheduler(model, **{"page_size": PAGE, "parallel": 8, "max_queue": 8, **kwargs})


def started(model: FakeModel, **kwargs: Any) -> Scheduler:
    scheduler = make(model, **kwargs)
    scheduler.start()
    return scheduler


def held(model: FakeModel) -> int:
    """Wait until the loop is held inside the call `model.hold_at`; its index."""
    assert model.inside.wait(WAIT_S), "the loop never reached the held call"
    return len(model.calls)


@pytest.fixture
def model() -> FakeModel:
    return FakeModel()


def test_a_new_request_streams_at_once_while_seven_decode() -> None:
    model = FakeModel(kv_slots=PAGE * 40)  # room for all eight: nobody is preempted
    scheduler = make(model, prefill_chunk=8)
    streams = [Run(scheduler, prompt(i, 6), max_tokens=50) for i in range(7)]
    model.hold_at = 30  # every stream is decoding by then; the new request arrives between two steps
    scheduler.start()
    try:
        at = held(model)
        assert all(run.tokens for run in streams)
        late = Run(scheduler, prompt(9, 30), max_tokens=4)
        before = [len(run.tokens) for run in streams]
        model.go.set()
        assert late.wait().reason == "length" and late.exact()
        # 30 tokens are 4 chunks of 8; every chunk is followed by a decode of all seven streams
        # (nobody had to finish first, nobody stalled for the whole prompt); only the last chunk
        # runs the output head
        calls = model.calls[at:]
        chunks = [i for i, c in enumerate(calls) if c.kind in ("rows", "prefill")]
        assert [(calls[i].kind, len(calls[i].tokens)) for i in chunks] == [
            ("rows", 8), ("rows", 8), ("rows", 8), ("prefill", 6)
        ]
        for i in chunks:
            assert sum(len(c.tokens) for c in calls[i + 1 : i + 3] if c.kind == "decode") == 7
        assert chunks[0] <= 2, "the new prompt waited for more than one step"
        assert all(len(run.tokens) >= n + 4 for run, n in zip(streams, before, strict=True))
        assert all(run.wait().reason == "length" and run.exact() for run in streams)
    finally:
        model.go.set()
        scheduler.close()


def test_requests_that_arrive_together_decode_together() -> None:
    model = FakeModel(kv_slots=PAGE * 40)
    scheduler = make(model, prefill_chunk=16)
    runs = [Run(scheduler, prompt(60 + i, 6), max_tokens=5) for i in range(4)]
    scheduler.start()
    try:
        assert all(run.wait().reason == "length" and run.exact() for run in runs)
        # 16 tokens per iteration: two prompts whole and 4 tokens of the third, whose last 2
        # come next with the fourth; from then on every decode step holds all four, until the
        # first two (one token ahead) are done
        kinds = [(c.kind, len(c.tokens)) for c in model.calls]
        assert kinds[:2] == [("prefill", 6), ("prefill", 6)]
        assert kinds[2] == ("rows", 4)
        first_decode = next(i for i, c in enumerate(model.calls) if c.kind == "decode")
        assert kinds[first_decode - 2 : first_decode] == [("prefill", 2), ("prefill", 6)]
        assert kinds[first_decode] == ("decode", 2)  # the two whole prompts, while the others went in
        assert kinds[first_decode + 1 :] == [("decode", 4)] * 3 + [("decode", 2)]
    finally:
        scheduler.close()


def test_no_more_than_parallel_sequences_run(model: FakeModel) -> None:
    scheduler = make(model, parallel=3, max_queue=3)
    runs = [Run(scheduler, prompt(40 + i, 5 + i), max_tokens=6) for i in range(6)]
    scheduler.start()
    try:
        for run in runs:
            assert run.wait().reason == "length" and run.exact()
        assert max(n for run in runs for n in run.running_seen) == 3
        assert max(model.rows("decode")) <= 3
    finally:
        scheduler.close()


def test_a_stop_id_is_yielded_then_the_sequence_stops(model: FakeModel) -> None:
    scheduler = started(model)
    try:
        p = prompt(50, 7)
        stop = solo(p, 3)[2]
        run = Run(scheduler, p, max_tokens=20, stop_ids=frozenset({stop}))
        finish = run.wait()
        assert run.tokens == solo(p, 3) and run.tokens[-1] == stop
        assert (finish.reason, finish.prompt_tokens, finish.completion_tokens) == ("stop", 7, 3)
    finally:
        scheduler.close()


def test_a_finished_picker_stops_the_sequence(model: FakeModel) -> None:
    scheduler = started(model)
    try:
        run = Run(scheduler, prompt(51, 5), max_tokens=20, picker=Greedy(done_after=2))
        assert run.wait().reason == "stop" and run.tokens == solo(prompt(51, 5), 2)
    finally:
        scheduler.close()


def test_a_full_context_finishes_with_length(model: FakeModel) -> None:
    scheduler = started(model)
    try:
        n = model.context_length - 4
        run = Run(scheduler, prompt(52, n), max_tokens=100)
        finish = run.wait()
        assert finish.reason == "length" and run.exact()
        assert len(run.tokens) == finish.completion_tokens == model.context_length - n + 1
        assert max(p for c in model.calls for p in c.positions) == model.context_length - 1
    finally:
        scheduler.close()


def test_cancel_takes_effect_at_the_next_step_boundary(model: FakeModel) -> None:
    scheduler = make(model)
    runs = [Run(scheduler, prompt(60 + i, 10), max_tokens=40) for i in range(3)]
    model.hold_at = 10  # three prefills, then decodes of all three rows
    scheduler.start()
    try:
        at = held(model)
        runs[1].handle.cancel()
        model.go.set()
        assert runs[1].wait().reason == "abort"
        for run in (runs[0], runs[2]):
            assert run.wait().reason == "length" and run.exact()
        assert len(model.calls[at].tokens) == 3  # the step already under way
        after = [len(c.tokens) for c in model.calls[at + 1 :] if c.kind == "decode"]
        assert after[0] == 2 and max(after) == 2  # the next step runs without it
        assert scheduler.stats().pages.in_use == 0
    finally:
        model.go.set()
        scheduler.close()


def test_a_waiting_request_can_be_cancelled(model: FakeModel) -> None:
    scheduler = Scheduler(model, page_size=PAGE, parallel=1, max_queue=2)  # not started yet
    first = Run(scheduler, prompt(70, 5), max_tokens=5)
    second = Run(scheduler, prompt(71, 5), max_tokens=5)
    second.handle.cancel()
    scheduler.start()
    try:
        finish = second.wait()
        assert (finish.reason, finish.completion_tokens, second.tokens) == ("abort", 0, [])
        assert first.wait().reason == "length" and first.exact()
    finally:
        scheduler.close()


def test_close_aborts_running_and_waiting_requests(model: FakeModel) -> None:
    scheduler = make(model, parallel=1, max_queue=2)
    running = Run(scheduler, prompt(72, 5), max_tokens=50)
    waiting = Run(scheduler, prompt(73, 5), max_tokens=50)
    model.hold_at = 3
    scheduler.start()
    held(model)
    closing = threading.Thread(target=scheduler.close)
    closing.start()
    model.go.set()
    closing.join(WAIT_S)
    assert not closing.is_alive()
    assert running.wait().reason == "abort" and waiting.wait().reason == "abort"
    assert waiting.tokens == [] and 0 < len(running.tokens) < 50


def test_stats_count_sequences_and_pages(model: FakeModel) -> None:
    scheduler = make(model, parallel=2, max_queue=2)
    runs = [Run(scheduler, prompt(80 + i, 20), max_tokens=30) for i in range(3)]
    model.hold_at = 0  # the first prompt's prefill
    scheduler.start()
    try:
        held(model)
        stats = scheduler.stats()
        assert (stats.running, stats.waiting) == (2, 1)
        assert (stats.pages.page_size, stats.pages.total) == (PAGE, model.kv_slots // PAGE - 1)
        assert stats.pages.in_use == 4  # two 20-token prompts: two pages each, taken at admission
        assert stats.pages.free == stats.pages.total - 4 and stats.pages.cached == 0
        model.go.set()
        for run in runs:
            assert run.wait().reason == "length" and run.exact()
        stats = scheduler.stats()
        assert (stats.running, stats.waiting, stats.pages.in_use) == (0, 0, 0)
        assert stats.pages.cached == 3 * 3  # 49 positions each: three whole pages stay cached
        assert stats.pages.free == stats.pages.total - 9 and stats.pages.sessions == 0
    finally:
        model.go.set()
        scheduler.close()


def test_preemption_frees_pages_and_the_stream_resumes_exactly() -> None:
    model = FakeModel(kv_slots=PAGE * 6)  # five usable pages for two sequences of four pages
    scheduler = make(model, parallel=2)
    a = Run(scheduler, prompt(90, 20), max_tokens=40)
    b = Run(scheduler, prompt(91, 20), max_tokens=40)
    scheduler.start()
    try:
        for run in (a, b):
            finish = run.wait()
            assert finish.reason == "length" and len(run.tokens) == 40 and run.exact()
            assert finish.completion_tokens == 40 and finish.prompt_tokens == 20
        resumed = [c for c in model.calls if c.kind == "prefill" and len(c.positions) > 20]
        assert resumed, "nobody was preempted"
        assert all(c.positions[0] == 0 for c in resumed)  # its pages were freed: all recomputed
        assert scheduler.stats().pages.in_use == 0
    finally:
        scheduler.close()


def test_sessions_are_dropped_least_recently_used_first_when_pages_run_out() -> None:
    model = FakeModel(kv_slots=PAGE * 7)  # six usable pages
    scheduler = started(model, parallel=1)
    try:
        first = {name: prompt(100 + i, 20) for i, name in enumerate(("old", "new"))}
        for name, p in first.items():
            Run(scheduler, p, max_tokens=13, session=name).wait()  # 32 positions: two pages pinned
        assert scheduler.stats().pages.sessions == 2
        turn = Run(scheduler, first["old"] + [5], max_tokens=1, session="old")  # "old" is used again
        assert turn.wait().cached_tokens == 16  # its first page: the second holds generated tokens
        big = Run(scheduler, prompt(110, 60), max_tokens=2)  # four pages: a session must go
        assert big.wait().reason == "length" and big.exact()
        assert not scheduler.release_session("new")  # least recently used: dropped
        assert scheduler.release_session("old")
    finally:
        scheduler.close()


def test_a_failing_prefill_ends_that_request_and_the_others_go_on() -> None:
    bad = prompt(120, 9)
    model = FakeModel(fail_prefill=lambda ids: ids == bad)
    scheduler = started(model)
    try:
        good = Run(scheduler, prompt(121, 5), max_tokens=30)
        assert good.first.wait(WAIT_S)
        failed = Run(scheduler, bad, max_tokens=5)
        finish = failed.wait()
        assert finish.reason == "error" and finish.error is not None and finish.error.message == "device lost"
        assert failed.tokens == []
        assert good.wait().reason == "length" and good.exact()
        assert scheduler.stats().pages.in_use == 0
    finally:
        scheduler.close()


def test_submit_after_close_is_refused_at_once() -> None:
    scheduler = make(FakeModel())
    scheduler.start()
    scheduler.close()
    with pytest.raises(ZincError):
        Run(scheduler, prompt(1, 5))


def test_close_before_start_aborts_the_waiting_requests() -> None:
    scheduler = make(FakeModel())
    run = Run(scheduler, prompt(1, 5))
    scheduler.close()
    assert run.done.wait(1.0) and run.wait().reason == "abort"


def test_the_youngest_request_is_the_one_preempted() -> None:
    model = FakeModel(kv_slots=PAGE * 6)  # five usable pages
    scheduler = make(model, parallel=2)
    old = Run(scheduler, prompt(1, 4), max_tokens=56)  # submitted first
    young = Run(scheduler, prompt(2, 30), max_tokens=30)  # reaches the page wall first
    scheduler.start()
    try:
        assert old.wait().reason == "length" and young.wait().reason == "length"
        assert old.exact() and young.exact()
        starts = [c.tokens[:4] for c in model.calls if c.kind == "prefill" and c.positions[0] == 0]
        assert starts.count(old.prompt) == 1, "the older request was preempted"
        assert len(starts) == 3  # the younger one was, once
    finally:
        scheduler.close()


def test_a_session_pins_the_pages_its_next_turn_finds() -> None:
    model = FakeModel(kv_slots=PAGE * 8)  # seven usable pages
    scheduler = make(model, parallel=2)
    p = prompt(3, 40)
    Run(scheduler, p, max_tokens=2)  # the same prompt at the same time, without a session
    chat = Run(scheduler, p, max_tokens=2, session="s")
    scheduler.start()
    try:
        chat.wait()
        Run(scheduler, prompt(4, 60), max_tokens=2).wait()  # needs every unpinned page
        follow = Run(scheduler, [*p, *chat.tokens, 5], max_tokens=2, session="s")
        assert follow.wait().cached_tokens == 32 and follow.exact()
    finally:
        scheduler.close()


class FailsOnThird(Greedy):
    def pick(self, greedy: int, logits: object) -> Sampled:
        if self.picked == 2:
            raise RuntimeError("grammar bug")
        return super().pick(greedy, logits)  # type: ignore[arg-type]


def test_a_failing_picker_ends_only_its_own_sequence() -> None:
    scheduler = make(FakeModel())
    innocent = Run(scheduler, prompt(5, 5), max_tokens=10)
    bad = Run(scheduler, prompt(6, 5), max_tokens=10, picker=FailsOnThird())
    scheduler.start()
    try:
        assert bad.wait().reason == "error" and len(bad.tokens) == 2
        assert innocent.wait().reason == "length" and innocent.exact() and len(innocent.tokens) == 10
    finally:
        scheduler.close()


def test_cached_tokens_count_only_the_admission_that_went_through() -> None:
    model = FakeModel(kv_slots=PAGE * 6)  # five usable pages
    scheduler = started(model, parallel=2)
    try:
        p = prompt(7, 40)
        Run(scheduler, p, max_tokens=1).wait()  # its first two pages stay cached
        model.hold_at = len(model.calls) + 1  # the first decode of the next request
        a = Run(scheduler, prompt(8, 40), max_tokens=24)  # three pages now, four at the end
        held(model)
        b = Run(scheduler, [*p, 7], max_tokens=2)  # finds both cached pages, but no third is free
        model.go.set()
        assert a.wait().reason == "length" and b.wait().reason == "length" and b.exact()
        assert b.wait().cached_tokens < 32  # `a` took one of them before `b` could run
    finally:
        scheduler.close()
