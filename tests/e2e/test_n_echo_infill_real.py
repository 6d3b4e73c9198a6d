"""`n` > 1 and `echo` end to end with the real SmolLM2 on the CPU, through the HTTP server and the
`openai` SDK (issue 39): the choices are decoded together and the prompt is prefilled once for
all of them (the others prefill only its last page's tokens); greedy choices are identical and
equal to n = 1's; with a `seed`, choice i samples exactly as a lone request with seed + i does,
so the choices are reproducible and differ; a batch of prompts answers each as it would alone;
`echo` with `logprobs` scores a greedy completion with the logprobs it was generated with.
SmolLM2 has no FIM tokens: /infill is a 400."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from tests.server_harness import RunningServer
from zinc.compiler.build import ensure_artifact
from zinc.engine.engine import LocalEngine
from zinc.model.gguf_file import open_gguf
from zinc.runtime.device import resolve_device
from zinc.runtime.session import ModelSession
from zinc.tokenizer import ChatTemplate, Tokenizer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
CONTEXT = 512
PAGE = 16


class Counting:
    """Counts the prompt tokens the scheduler runs through the model (every kind of prefill)."""

    def __init__(self, session: ModelSession) -> None:
        self.tokens = 0
        for name in ("prefill_slots", "prefill_rows"):
            setattr(session, name, self._wrap(getattr(session, name), lambda a: len(a[0])))
        packed = self._wrap(session.prefill_packed, lambda a: sum(len(j[0]) for j in a[0]))
        session.prefill_packed = packed

    def _wrap(self, call: Any, count: Any) -> Any:
        def counted(*args: Any) -> Any:
            self.tokens += count(args)
            return call(*args)

        return counted


@pytest.fixture(scope="module")
def engine(smollm2: Path) -> Iterator[LocalEngine]:
    spec = resolve_device("cpu")
    session = ModelSession(ensure_artifact(smollm2, "cpu"), smollm2, spec, CONTEXT, kv_slots=4 * CONTEXT + 64)
    meta = open_gguf(smollm2).metadata
    tokenizer = Tokenizer.from_metadata(meta)
    eng = LocalEngine(session, tokenizer, ChatTemplate.from_metadata(meta, tokenizer), "smollm2", parallel=4)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def counting(engine: LocalEngine) -> Counting:
    return Counting(engine.session)


@pytest.fixture(scope="module")
def srv(engine: LocalEngine) -> Iterator[RunningServer]:
    running = RunningServer(engine, parallel=4)  # type: ignore[arg-type]
    yield running
    running.stop()


def client(srv: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=300)


def texts(choices: Sequence[Any]) -> list[str]:
    assert [c.index for c in choices] == list(range(len(choices)))
    return [c.text if hasattr(c, "text") else c.message.content for c in choices]


def test_greedy_n_3_prefills_once_and_gives_n_1s_answer_three_times(
    srv: RunningServer, engine: LocalEngine, counting: Counting
) -> None:
    messages: Any = [{"role": "user", "content": "Name three colors of the rainbow, please."}]
    prompt_tokens = len(engine.tokenize(engine.apply_chat_template(messages), parse_special=True))
    before = counting.tokens
    three = client(srv).chat.completions.create(model="smollm2", messages=messages, max_tokens=12, n=3)
    tail = prompt_tokens - (prompt_tokens - 1) // PAGE * PAGE  # the tokens of the prompt's last page
    assert counting.tokens - before == prompt_tokens + 2 * tail
    assert three.usage is not None and three.usage.prompt_tokens == prompt_tokens
    one = client(srv).chat.completions.create(model="smollm2", messages=messages, max_tokens=12)
    assert texts(three.choices) == texts(one.choices) * 3 and one.choices[0].message.content
    assert three.usage.completion_tokens == 3 * (one.usage.completion_tokens if one.usage else 0)


def test_seeded_choices_are_reproducible_distinct_and_each_a_lone_seed_plus_i(srv: RunningServer) -> None:
    c = client(srv)
    prompt = "My favourite animal is"
    ask: Any = {"model": "smollm2", "prompt": prompt, "max_tokens": 10, "temperature": 1.0}
    first = texts(c.completions.create(**ask, n=3, seed=7).choices)
    again = texts(c.completions.create(**ask, n=3, seed=7).choices)
    assert first == again
    assert len(set(first)) > 1
    alone = [texts(c.completions.create(**ask, seed=7 + i).choices)[0] for i in range(3)]
    assert alone == first


def test_streamed_n_2_equals_the_whole_answer(srv: RunningServer) -> None:
    c = client(srv)
    ask: Any = {"model": "smollm2", "prompt": "The sun rises in the", "max_tokens": 8, "n": 2}
    whole = texts(c.completions.create(**ask).choices)
    streamed = ["", ""]
    for chunk in c.completions.create(**ask, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == whole


def test_echo_returns_the_prompt_and_then_the_same_completion(srv: RunningServer) -> None:
    c = client(srv)
    prompt = "The capital of France is"
    plain = c.completions.create(model="smollm2", prompt=prompt, max_tokens=6).choices[0].text
    echoed = c.completions.create(model="smollm2", prompt=prompt, max_tokens=6, echo=True).choices[0].text
    assert echoed == prompt + plain


def test_a_batch_of_prompts_answers_each_as_it_would_alone(srv: RunningServer, engine: LocalEngine) -> None:
    c = client(srv)
    prompts = ["The sun rises in the", "My favourite animal is", "1, 2, 3,", "Paris is", "Water is", "Red and"]
    ask: Any = {"model": "smollm2", "max_tokens": 8, "temperature": 1.0, "seed": 3}
    batch = c.completions.create(**ask, prompt=prompts, n=2)  # 12 choices over 4 slots: in turns
    alone = [texts(c.completions.create(**ask, prompt=p, n=2).choices) for p in prompts]
    assert texts(batch.choices) == [t for pair in alone for t in pair]
    assert batch.usage is not None
    assert batch.usage.prompt_tokens == sum(len(engine.tokenize(p)) for p in prompts)


def test_echo_logprobs_score_a_greedy_completion_as_it_was_generated(srv: RunningServer, engine: LocalEngine) -> None:
    c = client(srv)
    ids = engine.tokenize("The capital of France is")
    made = c.completions.create(model="smollm2", prompt=ids, max_tokens=8, logprobs=2).choices[0].logprobs
    assert made is not None and made.tokens is not None and made.token_logprobs is not None
    generated = [engine.tokenize(t, add_special=False, parse_special=True) for t in made.tokens]
    assert all(len(g) == 1 for g in generated)  # each token's text is one token again
    scored = c.completions.create(
        model="smollm2", prompt=ids + [g[0] for g in generated], max_tokens=0, echo=True, logprobs=2
    ).choices[0]
    lp = scored.logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    assert scored.text.startswith("The capital of France is") and len(lp.token_logprobs) == len(ids) + 8
    assert lp.token_logprobs[0] is None and all(x is not None and x <= 0 for x in lp.token_logprobs[1:])
    # the generated tokens, scored after the prompt: the logprobs they were generated with, up to
    # the paths' rounding (their K/V now written by prefill, not decode; the first token's logits
    # now a decode row's, not prefill's): 0.1 here, where a token scored one place off is nats away
    assert np.allclose(lp.token_logprobs[len(ids):], made.token_logprobs, atol=0.2)
    for top, token in zip(lp.top_logprobs[len(ids):], made.tokens, strict=True):
        assert top is not None and max(top, key=lambda k: top[k]) == token  # greedy: the top choice


def test_a_completion_prompt_in_the_chat_format_answers_as_the_chat_endpoint(
    srv: RunningServer, engine: LocalEngine
) -> None:
    messages: Any = [{"role": "user", "content": "Name a primary color."}]
    text = engine.apply_chat_template(messages)  # its special tokens written out: <|im_start|>, ...
    raw = client(srv).completions.create(model="smollm2", prompt=text, max_tokens=12)
    chat = client(srv).chat.completions.create(model="smollm2", messages=messages, max_tokens=12)
    assert raw.usage is not None and chat.usage is not None
    assert raw.usage.prompt_tokens == chat.usage.prompt_tokens  # each special token one id, as llama.cpp reads it
    assert raw.choices[0].text == chat.choices[0].message.content and raw.choices[0].text


def test_infill_on_a_model_without_fim_tokens_is_a_400(srv: RunningServer) -> None:
    body = json.dumps({"input_prefix": "def f():", "input_suffix": "\n"}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{srv.port}/infill", body, {"content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=30)
    assert info.value.code == 400 and "cannot infill" in json.loads(info.value.read())["error"]["message"]
