"""The scheduler packs the last chunks of prompts that arrive together into one `prefill_packed`
call (zinc.engine.batcher.Scheduler._prefills), against the fake StepModel
(tests/unit/_fake_step_model.py), which checks every slot it reads and records every call.

Packed calls keep the plan's order, hold at most `max_packed` prompts and `packed_tokens` tokens,
never take a chunk that does not end its prompt, and give each request the tokens it gets alone;
a packed call that fails ends its own requests only. While nothing decodes, requests that come a
little apart still go in one call (`batch_wait`), a lone one waits that long only, and a stream of
requests that never pauses is served after `BATCH_WAIT_CAP` times it.
"""

from __future__ import annotations

import time

from tests.unit._fake_step_model import PAGE, FakeModel, prompt
from tests.unit.test_scheduler import Run, make
from zinc.engine.batcher import BATCH_WAIT_CAP


def kinds(model: FakeModel) -> list[tuple[str, int]]:
    return [(c.kind, len(c.tokens)) for c in model.calls]


def test_prompts_that_arrive_together_are_prefilled_in_one_call() -> None:
    model = FakeModel(kv_slots=PAGE * 40, max_packed=4, packed_tokens=16)
    scheduler = make(model, prefill_chunk=16)
    runs = [Run(scheduler, prompt(60 + i, 6), max_tokens=5) for i in range(4)]
    scheduler.start()
    try:
        assert all(run.wait().reason == "length" and run.exact() for run in runs)
        # 16 tokens per iteration: two prompts whole (one call) and 4 tokens of the third, whose
        # last 2 come next with the fourth (one call), then the first two decode while the others'
        # first tokens are picked
        assert kinds(model)[:5] == [("packed", 12), ("rows", 4), ("packed", 8), ("decode", 2), ("decode", 4)]
    finally:
        scheduler.close()


def test_a_packed_call_holds_max_packed_prompts_and_packed_tokens() -> None:
    model = FakeModel(kv_slots=PAGE * 40, max_packed=4, packed_tokens=16, max_batch=8)
    scheduler = make(model, prefill_chunk=64)
    lengths = [3, 3, 3, 3, 3, 6, 8, 4]  # 4 prompts (the most), then 3 + 6 (8 more would pass 16), 8 + 4
    runs = [Run(scheduler, prompt(70 + i, n), max_tokens=4) for i, n in enumerate(lengths)]
    scheduler.start()
    try:
        assert all(run.wait().reason == "length" and run.exact() for run in runs)
        assert kinds(model)[:4] == [("packed", 12), ("packed", 9), ("packed", 12), ("decode", 8)]
    finally:
        scheduler.close()


def test_a_lone_prompt_and_a_model_that_packs_none_use_prefill_slots() -> None:
    for packs in (0, 4):
        model = FakeModel(kv_slots=PAGE * 40, max_packed=packs)
        scheduler = make(model, prefill_chunk=64)
        runs = [Run(scheduler, prompt(80 + i, 5), max_tokens=3) for i in range(2 if packs == 0 else 1)]
        scheduler.start()
        try:
            assert all(run.wait().reason == "length" and run.exact() for run in runs)
            assert [k for k, _ in kinds(model)].count("packed") == 0
            assert kinds(model)[: len(runs)] == [("prefill", 5)] * len(runs)
        finally:
            scheduler.close()


def test_a_failed_packed_call_ends_its_requests_and_the_loop_goes_on() -> None:
    bad = prompt(91, 5)
    model = FakeModel(kv_slots=PAGE * 40, max_packed=4, fail_prefill=lambda ids: ids == bad)
    scheduler = make(model, prefill_chunk=64)
    runs = [Run(scheduler, p, max_tokens=4) for p in (prompt(90, 5), bad)]
    scheduler.start()
    try:
        assert [run.wait().reason for run in runs] == ["error", "error"]
        later = [Run(scheduler, prompt(92 + i, 5), max_tokens=4) for i in range(2)]
        assert all(run.wait().reason == "length" and run.exact() for run in later)
        assert scheduler.stats().pages.in_use == 0
    finally:
        scheduler.close()


def test_requests_that_come_apart_within_the_batch_wait_share_one_call() -> None:
    for wait, first in ((0.25, ("packed", 18)), (0.0, ("prefill", 6))):  # without the wait, the first goes alone
        model = FakeModel(kv_slots=PAGE * 40, max_packed=4, packed_tokens=32)
        scheduler = make(model, prefill_chunk=64, batch_wait=wait)
        scheduler.start()
        try:
            runs = [Run(scheduler, prompt(100, 6), max_tokens=3)]
            if not wait:  # the first is prefilled at once, alone
                assert runs[0].first.wait(5)
            for i in (1, 2):
                time.sleep(0.01)
                runs.append(Run(scheduler, prompt(100 + i, 6), max_tokens=3))
            assert all(run.wait().reason == "length" and run.exact() for run in runs)
            assert kinds(model)[0] == first
        finally:
            scheduler.close()


def test_a_lone_request_waits_the_batch_wait_once() -> None:
    """Its prompt waits `batch_wait` (no other request comes to share the call), its decode steps
    never wait again. Both bounds are the wait itself, not the host's speed: the first token
    cannot come sooner than the wait, and had any of its 5 decode steps waited too, the rest
    would take another whole wait, while the fake model's steps take no time, so the host has a
    whole wait (0.5 s) of slack for them."""
    wait = 0.5
    model = FakeModel(kv_slots=PAGE * 40, max_packed=4)
    scheduler = make(model, prefill_chunk=64, batch_wait=wait)
    scheduler.start()
    try:
        t0 = time.monotonic()
        run = Run(scheduler, prompt(110, 5), max_tokens=6)
        assert run.first.wait(5)
        first = time.monotonic() - t0
        assert run.wait().reason == "length" and run.exact()
        assert first >= wait
        assert time.monotonic() - t0 < first + wait  # its decode steps did not wait again
    finally:
        scheduler.close()


def test_requests_that_keep_coming_stop_the_wait_after_its_cap() -> None:
    model = FakeModel(kv_slots=PAGE * 80, max_packed=4, packed_tokens=64, max_batch=8)
    wait = 0.02
    scheduler = make(model, prefill_chunk=64, batch_wait=wait, max_queue=64)
    scheduler.start()
    try:
        t0 = time.monotonic()
        runs = [Run(scheduler, prompt(120, 4), max_tokens=2)]
        while time.monotonic() - t0 < 3 * BATCH_WAIT_CAP * wait:  # a request every quarter of the wait
            time.sleep(wait / 4)
            runs.append(Run(scheduler, prompt(120 + len(runs), 4), max_tokens=2))
            if runs[0].first.is_set():
                break
        assert runs[0].first.is_set(), "the first request was still waiting after the cap"
        assert all(run.wait().reason == "length" and run.exact() for run in runs)
    finally:
        scheduler.close()


def test_a_request_cancelled_while_waiting_leaves_the_next_burst_its_wait() -> None:
    """The second of the next burst comes 10 ms after the first, well inside its wait (0.25 s:
    a loaded host has that much slack to send it)."""
    model = FakeModel(kv_slots=PAGE * 40, max_packed=4, packed_tokens=32)
    wait = 0.25
    scheduler = make(model, prefill_chunk=64, batch_wait=wait)
    scheduler.start()
    try:
        gone = Run(scheduler, prompt(130, 6), max_tokens=3)
        time.sleep(wait / 2)
        gone.handle.cancel()  # inside its wait
        assert gone.wait().reason == "abort"
        time.sleep(BATCH_WAIT_CAP * wait + 0.1)  # past the cap of the wait it was in
        runs = [Run(scheduler, prompt(131, 6), max_tokens=3)]
        time.sleep(0.01)
        runs.append(Run(scheduler, prompt(132, 6), max_tokens=3))
        assert all(run.wait().reason == "length" and run.exact() for run in runs)
        assert kinds(model)[0] == ("packed", 12)
    finally:
        scheduler.close()
