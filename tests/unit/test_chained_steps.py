"""Chained decode steps: the scheduler keeps `CHAIN_DEPTH` steps of a steady batch on the device,
each fed the greedy tokens of the one before it there, and reads back the oldest while the others
run (zinc.engine.batcher, `Scheduler._next`).

The fake model (tests/unit/_fake_step_model.py) checks every position a step reads, so a chained
row that wrote into the wrong slot, or a freed page written after its reuse, fails the call; its
chained calls are recorded as kind "next".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise

import pytest

from tests.unit._fake_step_model import PAGE, WAIT_S, FakeModel, prompt, solo
from tests.unit.test_batcher import Greedy, Run
from zinc.engine import batcher
from zinc.engine.batcher import CHAIN_DEPTH, Scheduler


class ReadsLogits(Greedy):
    read_logits = True  # as a sampler, grammar or logprobs would: its row's step is read back


@contextmanager
def running(model: FakeModel) -> Iterator[Scheduler]:
    scheduler = Scheduler(model, page_size=16, parallel=4, max_queue=4)
    scheduler.start()
    try:
        yield scheduler
    finally:
        scheduler.close()


def settled(scheduler: Scheduler) -> None:
    stats = scheduler.stats()
    assert stats.running == 0 and stats.pages.in_use == 0, stats


def test_a_steady_batch_chains_its_steps_and_each_equals_its_solo_output() -> None:
    model = FakeModel()
    with running(model) as scheduler:
        prompts = [prompt(40 + i, 6 + i) for i in range(4)]
        runs = [Run(scheduler, p, max_tokens=20, stop=()) for p in prompts]
        for run, p in zip(runs, prompts, strict=True):
            assert run.wait().reason == "length"
            assert run.tokens == solo(p, 20)
        assert len(model.rows("next")) >= 10, [c.kind for c in model.calls]
        settled(scheduler)


def test_a_steady_batch_keeps_chain_depth_steps_ahead_and_none_past_max_tokens() -> None:
    model = FakeModel()
    with running(model) as scheduler:
        prompts = [prompt(90 + i, 8) for i in range(3)]
        runs = [Run(scheduler, p, max_tokens=16, stop=()) for p in prompts]
        for run, p in zip(runs, prompts, strict=True):
            assert run.wait().reason == "length" and run.tokens == solo(p, 16)
        assert model.most_ahead == CHAIN_DEPTH == 2  # the step after the next is enqueued before a read
        # token 16 is sampled from the step that fed token 15 at position 8 + 14: none goes further
        assert max(p for c in model.calls if c.kind in ("decode", "next") for p in c.positions) == 8 + 14
        settled(scheduler)


# A slow fake device for the lead test: the lead is half a step, so the host has STEP_S / 2 to
# enqueue each chained step and to take a probe that came at a step's start ahead of the next
STEP_S = 0.12


def test_the_device_runs_steps_back_to_back_and_a_new_prompt_waits_for_the_running_step_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The next step is enqueued `ENQUEUE_LEAD_S` before the running one is due to end (timed on
    the batch's recent steps), not as soon as it starts: the device runs chained steps back to
    back, and a request that comes in before then has its prompt run right after the running step,
    not after one more.

    Nothing here depends on how fast the host is: the lead is half of a 120 ms fake step (60 ms
    for the host to enqueue a step or to take a probe ahead of the next; in production it is 3 ms,
    about what enqueueing a step takes). The figures that do depend on it, the device's idle gaps
    between steps and how long a new request waits with the real lead, are measured by
    bench/bench_chained_steps.py."""
    monkeypatch.setattr(batcher, "ENQUEUE_LEAD_S", STEP_S / 2)
    model = FakeModel(step_s=STEP_S, kv_slots=PAGE * 40)
    scheduler = Scheduler(model, page_size=16, parallel=8, max_queue=4)
    scheduler.start()
    try:
        background = [prompt(100 + i, 6) for i in range(3)]
        runs = [Run(scheduler, p, max_tokens=50, stop=()) for p in background]
        deadline = time.monotonic() + WAIT_S
        while len(model.rows("next")) < 3:  # the chain is steady
            assert time.monotonic() < deadline, "the batch never chained its steps"
            time.sleep(0.002)
        behind = []  # steps that started on the device after a probe came in, before its prompt
        for i in range(3):
            seen = len(model.ran)
            while not (len(model.ran) > seen and model.ran[-1][1] <= time.monotonic()):
                time.sleep(0.001)  # a new step has started: nothing is enqueued behind it yet
            came = time.monotonic()
            probe = Run(scheduler, prompt(110 + i, 5), max_tokens=1, stop=())
            assert probe.wait().reason == "length" and probe.tokens == solo(prompt(110 + i, 5), 1)
            ran = [call.kind for call, start in model.ran if start >= came]
            behind.append(ran.index("prefill"))
        assert behind == [0, 0, 0]  # each probe waited for the step running when it came only
        # chained steps start as the one before ends: no gap on the device between them
        gaps = [b[1] - a[1] - STEP_S for a, b in pairwise(model.ran) if a[0].kind == b[0].kind == "next"]
        assert len(gaps) >= 3 and all(abs(g) < 1e-9 for g in gaps), gaps
        for run, p in zip(runs, background, strict=True):
            run.handle.cancel()
            assert run.wait().reason == "abort" and run.tokens == solo(p, len(run.tokens))
        settled(scheduler)
    finally:
        scheduler.close()


def test_a_chain_stops_at_the_end_of_the_context() -> None:
    model = FakeModel()  # context_length 64: a step past it fails the fake's call
    with running(model) as scheduler:
        prompts = [prompt(95 + i, 50) for i in range(2)]
        runs = [Run(scheduler, p, max_tokens=40, stop=()) for p in prompts]
        for run, p in zip(runs, prompts, strict=True):
            assert run.wait().reason == "length"
            assert run.tokens == solo(p, 64 - 50 + 1)  # the last token is sampled at position 63
        assert model.rows("next")
        settled(scheduler)


def test_a_sequence_that_stops_mid_chain_gets_no_extra_token() -> None:
    model = FakeModel()
    with running(model) as scheduler:
        short, long = prompt(50, 7), prompt(51, 9)
        stop_at = solo(short, 20)[5]  # its sixth token ends it, while a step after it is enqueued
        ended = Run(scheduler, short, max_tokens=20, stop={stop_at})
        goes_on = Run(scheduler, long, max_tokens=20, stop=())
        assert ended.wait().reason == "stop"
        assert ended.tokens == solo(short, 20)[: solo(short, 20).index(stop_at) + 1]
        assert goes_on.wait().reason == "length" and goes_on.tokens == solo(long, 20)
        assert model.rows("next")
        settled(scheduler)
        again = Run(scheduler, short, max_tokens=8, stop=())  # its cached pages hold only what it kept
        assert again.wait().reason == "length" and again.tokens == solo(short, 8)


def test_cancel_while_a_chained_step_runs_frees_the_pages_and_spares_the_others() -> None:
    model = FakeModel(delay=0.002)
    with running(model) as scheduler:
        keep, drop = prompt(60, 5), prompt(61, 5)
        kept = Run(scheduler, keep, max_tokens=30, stop=())
        dropped = Run(scheduler, drop, max_tokens=30, stop=())
        assert dropped.first.wait(WAIT_S)
        while not model.rows("next"):  # a chained step has been enqueued
            threading.Event().wait(0.001)
        dropped.handle.cancel()
        assert dropped.wait().reason == "abort"
        assert dropped.tokens == solo(drop, len(dropped.tokens))
        assert kept.wait().reason == "length" and kept.tokens == solo(keep, 30)
        settled(scheduler)


def test_a_failed_chained_step_ends_its_batch_and_the_loop_goes_on() -> None:
    bad = prompt(70, 6)
    model = FakeModel(fail_on=solo(bad, 12)[6])  # fed in a chained step
    with running(model) as scheduler:
        failing = Run(scheduler, bad, max_tokens=12, stop=())
        finish = failing.wait()
        assert finish.reason == "error" and finish.error is not None
        assert "device lost" in str(finish.error)
        assert model.rows("next")
        settled(scheduler)
        model.fail_on = None
        later = prompt(71, 4)
        after = Run(scheduler, later, max_tokens=10, stop=())
        assert after.wait().reason == "length" and after.tokens == solo(later, 10)


def test_a_row_that_reads_its_logits_keeps_the_batch_unchained() -> None:
    model = FakeModel()
    with running(model) as scheduler:
        prompts = [prompt(80 + i, 5) for i in range(3)]
        runs = [
            Run(scheduler, p, max_tokens=10, stop=(), picker=ReadsLogits() if i == 1 else None)
            for i, p in enumerate(prompts)
        ]
        for run, p in zip(runs, prompts, strict=True):
            assert run.wait().reason == "length" and run.tokens == solo(p, 10)
        assert not model.rows("next")
        settled(scheduler)
