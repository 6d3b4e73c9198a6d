"""`n` > 1 (issue 39): the scheduler prefills a request's shared prompt once for all its choices,
`n` and `echo` parse into clear values or 400s, each choice gets its own seed, and admission
counts a request's choices together, first come first served."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tests.fakes import async_test
from tests.unit._fake_step_model import PAGE, WAIT_S, FakeModel, prompt, solo
from zinc.engine.batcher import Scheduler
from zinc.engine.generate import Sampled
from zinc.engine.sequences import FinishEvent, SequenceEvent, SequenceRequest, TokenEvent
from zinc.engine.types import GenerationRequest, SamplingParams
from zinc.errors import InvalidRequestError, QueueFullError
from zinc.server.api import Admission
from zinc.server.choices import choice_requests
from zinc.server.openai_request import parse_chat, parse_completion


class Greedy:
    read_logits = True

    def pick(self, greedy: int, logits: Callable[[], Any]) -> Sampled:
        assert int(np.argmax(logits())) == greedy
        return Sampled(greedy)

    done = False


class Choice:
    def __init__(self, scheduler: Scheduler, ids: list[int], group: str | None, max_tokens: int = 6) -> None:
        self.prompt, self.tokens = ids, list[int]()
        self.finish: FinishEvent | None = None
        self.done = threading.Event()
        self.handle = scheduler.submit(SequenceRequest(ids, max_tokens, (), Greedy(), self.on_event, None, group))

    def on_event(self, event: SequenceEvent) -> None:
        if isinstance(event, TokenEvent):
            self.tokens.append(event.sampled.token)
        else:
            self.finish = event
            self.done.set()

    def wait(self) -> FinishEvent:
        assert self.done.wait(WAIT_S) and self.finish is not None
        return self.finish


def prefilled(model: FakeModel) -> int:
    """Prompt tokens run through the model (every kind of prefill call)."""
    return sum(len(c.tokens) for c in model.calls if c.kind in ("prefill", "rows", "packed"))


@pytest.mark.parametrize("grouped", [True, False])
def test_the_choices_of_a_request_prefill_their_prompt_once(grouped: bool) -> None:
    model = FakeModel(max_packed=4, packed_tokens=64)
    scheduler = Scheduler(model, page_size=PAGE, parallel=8, max_queue=8, prefill_chunk=128)
    ids = prompt(1, 40)  # two whole pages and 8 tokens on a third
    choices = [Choice(scheduler, ids, "req-1/choices" if grouped else None) for _ in range(3)]
    scheduler.start()
    try:
        for c in choices:
            assert c.wait().reason == "length"
            assert c.tokens == solo(ids, 6)  # every position each choice read was its own prompt's
        if grouped:
            # the first choice's 40 tokens, then only the 8 of the last page for each of the others
            assert prefilled(model) == 40 + 8 + 8
            assert [c.finish.cached_tokens for c in choices if c.finish] == [0, 32, 32]
            # from then on the three decode in one batch
            assert any(c.kind == "decode" and len(c.tokens) == 3 for c in model.calls)
        else:
            assert prefilled(model) == 3 * 40
    finally:
        scheduler.close()


def test_a_choice_goes_on_when_the_one_prefilling_the_prompt_is_cancelled() -> None:
    model = FakeModel()
    scheduler = Scheduler(model, page_size=PAGE, parallel=8, max_queue=8, prefill_chunk=16)
    ids = prompt(2, 40)
    model.hold_at = 1  # inside the second chunk of the first choice's prompt
    first, second = (Choice(scheduler, ids, "g") for _ in range(2))
    scheduler.start()
    try:
        assert model.inside.wait(WAIT_S)
        first.handle.cancel()
        model.go.set()
        assert first.wait().reason == "abort"
        assert second.wait().reason == "length" and second.tokens == solo(ids, 6)
    finally:
        scheduler.close()


def test_choices_with_another_prompt_are_not_held() -> None:
    model = FakeModel()
    scheduler = Scheduler(model, page_size=PAGE, parallel=8, max_queue=8, prefill_chunk=128)
    a, b = Choice(scheduler, prompt(3, 20), "g"), Choice(scheduler, prompt(4, 20), "g")
    scheduler.start()
    try:
        assert a.wait().reason == b.wait().reason == "length"
        assert a.tokens == solo(a.prompt, 6) and b.tokens == solo(b.prompt, 6)
    finally:
        scheduler.close()


# --- request fields ------------------------------------------------------------------------------


def chat(**fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "hi"}], **fields}


def test_n_parses_and_bad_values_are_400() -> None:
    assert parse_chat(chat()).common.n == 1
    assert parse_chat(chat(n=3)).common.n == 3
    assert parse_completion({"prompt": "x", "n": 128}).common.n == 128
    for bad in (0, -1, 129, 1.5, "2", True):
        with pytest.raises(InvalidRequestError) as info:
            parse_chat(chat(n=bad))
        assert info.value.param == "n"


def test_echo_parses_takes_logprobs_and_max_tokens_0_only_with_echo() -> None:
    assert parse_completion({"prompt": "x", "echo": True}).echo
    assert not parse_completion({"prompt": "x"}).echo
    both = parse_completion({"prompt": "x", "echo": True, "logprobs": 2, "max_tokens": 0})
    assert (both.echo, both.common.logprobs, both.common.max_tokens) == (True, 2, 0)
    for bad, param in (
        ({"prompt": "x", "echo": "yes"}, "echo"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "echo": True, "max_completion_tokens": 0}, "max_completion_tokens"),
        ({"prompt": "x", "echo": True, "logprobs": 1, "suffix": "y"}, "suffix"),
    ):
        with pytest.raises(InvalidRequestError) as info:
            parse_completion(bad)
        assert info.value.param == param


def test_prompt_takes_openais_four_forms_and_refuses_the_rest() -> None:
    forms: list[tuple[Any, tuple[Any, ...]]] = [
        ("x", ("x",)),
        ([5, 6], ((5, 6),)),
        (["x"], ("x",)),
        (["a", "b", ""], ("a", "b", "")),
        ([[5, 6]], ((5, 6),)),
        ([[5], [6, 7]], ((5,), (6, 7))),
    ]
    for given, prompts in forms:
        assert parse_completion({"prompt": given}).prompts == prompts
    for bad in ([], ["a", [5]], [[5], []], [[5, -1]], [True], [1.5], {"a": 1}, 3, ["a"] * 2049):
        with pytest.raises(InvalidRequestError) as info:
            parse_completion({"prompt": bad})
        assert info.value.param == "prompt"


def test_best_of_equal_to_n_is_accepted_and_other_values_refused() -> None:
    assert parse_completion({"prompt": "x", "n": 2, "best_of": 2}).common.n == 2
    with pytest.raises(InvalidRequestError) as info:
        parse_completion({"prompt": "x", "n": 2, "best_of": 3})
    assert info.value.param == "best_of"


def test_each_choice_gets_its_own_seed_and_the_group() -> None:
    base = GenerationRequest("cmpl-1", [1, 2, 3], 8, SamplingParams(temperature=1.0, seed=41), session_id="s")
    requests = choice_requests(base, 3)
    assert [r.sampling.seed for r in requests] == [41, 42, 43]
    assert [r.session_id for r in requests] == ["s", None, None]
    assert len({r.request_id for r in requests}) == 3
    assert {r.prompt_group for r in requests} == {"cmpl-1/choices/0"}
    unseeded = choice_requests(GenerationRequest("c", [1], 8, SamplingParams(temperature=1.0)), 2)
    assert [r.sampling.seed for r in unseeded] == [None, None]


# --- admission -----------------------------------------------------------------------------------


@async_test
async def test_a_request_takes_its_n_slots_at_once_first_come_first_served() -> None:
    admission = Admission(parallel=4, max_queued=4)
    order: list[str] = []
    release = {name: asyncio.Event() for name in ("two", "three", "one")}

    async def run(name: str, n: int) -> None:
        async with admission.slot(n):
            order.append(name)
            await release[name].wait()

    two = asyncio.ensure_future(run("two", 2))
    await asyncio.sleep(0)
    three = asyncio.ensure_future(run("three", 3))  # 2 + 3 > 4: waits
    await asyncio.sleep(0)
    one = asyncio.ensure_future(run("one", 1))  # would fit, but comes after "three"
    await asyncio.sleep(0)
    assert order == ["two"] and admission.running == 2 and admission.waiting == 4
    with pytest.raises(QueueFullError):  # 4 choices wait already: one more is past --max-queue
        async with admission.slot(1):
            pass
    release["two"].set()
    await two
    await asyncio.sleep(0)
    assert order == ["two", "three", "one"] and admission.running == 4 and admission.waiting == 0
    release["three"].set()
    release["one"].set()
    await asyncio.gather(three, one)
    assert admission.running == 0


@async_test
async def test_a_waiting_request_that_is_cancelled_gives_its_place_back() -> None:
    admission = Admission(parallel=2, max_queued=8)
    hold = asyncio.Event()

    async def run(n: int) -> None:
        async with admission.slot(n):
            await hold.wait()

    first = asyncio.ensure_future(run(2))
    await asyncio.sleep(0)
    waiting = asyncio.ensure_future(run(2))
    await asyncio.sleep(0)
    assert admission.waiting == 2
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert admission.waiting == 0
    hold.set()
    await first
    assert admission.running == 0
