"""`n` > 1, batched prompts, `echo`, `suffix` and `/infill` over HTTP on the fake engine (issue 39), with the `openai` SDK where
it applies: choices by index whole and streamed, usage, the 400s, an echoed prompt, and /infill's
llama.cpp shapes (the FIM prompt the engine gets, the answer, the stream, a model without FIM)."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.fakes import BOS, FakeEngine, expected_text
from tests.server_harness import RunningServer

pytestmark = pytest.mark.e2e
FIM = {"fim_pre": 300, "fim_suf": 301, "fim_mid": 302}


@pytest.fixture
def srv() -> Iterator[RunningServer]:
    running = RunningServer(FakeEngine(), parallel=4)
    yield running
    running.stop()


def client(srv: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)


def post(srv: RunningServer, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    """POST `body` as JSON: the status and the whole response body."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{srv.port}{path}", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_chat_n_3_gives_three_choices_by_index_and_usage_counts_the_prompt_once(srv: RunningServer) -> None:
    messages = [{"role": "user", "content": "hi"}]
    one = client(srv).chat.completions.create(model="fake-model", messages=messages, max_tokens=4)  # type: ignore[arg-type]
    three = client(srv).chat.completions.create(model="fake-model", messages=messages, max_tokens=4, n=3, seed=5)  # type: ignore[arg-type]
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert all(c.message.content == expected_text(4) and c.finish_reason == "length" for c in three.choices)
    assert three.usage is not None and one.usage is not None
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens
    requests = srv.engine.requests[-3:]
    assert [r.sampling.seed for r in requests] == [5, 6, 7]
    assert len({r.prompt_group for r in requests}) == 1 and requests[0].prompt_group is not None


def test_streamed_chat_n_2_chunks_carry_their_choice(srv: RunningServer) -> None:
    stream = client(srv).chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=3, n=2, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    texts, roles, finishes = ["", ""], [0, 0], [str(None), str(None)]
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            roles[choice.index] += choice.delta.role == "assistant"
            finishes[choice.index] = str(choice.finish_reason or finishes[choice.index])
    assert texts == [expected_text(3)] * 2 and roles == [1, 1] and finishes == ["length", "length"]
    assert usage is not None and usage.completion_tokens == 6


def test_completions_n_2_whole_and_streamed(srv: RunningServer) -> None:
    whole = client(srv).completions.create(model="fake-model", prompt="abc", max_tokens=2, n=2)
    assert [(c.index, c.text) for c in whole.choices] == [(0, expected_text(2)), (1, expected_text(2))]
    texts = ["", ""]
    for chunk in client(srv).completions.create(model="fake-model", prompt="abc", max_tokens=2, n=2, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == [expected_text(2)] * 2


def test_a_batch_of_prompts_gives_each_its_n_choices_in_order_whole_and_streamed(srv: RunningServer) -> None:
    ask: Any = {"model": "fake-model", "prompt": ["ab", "cde"], "max_tokens": 2, "n": 2, "seed": 9, "echo": True}
    whole = client(srv).completions.create(**ask)
    assert [(c.index, c.text) for c in whole.choices] == [
        (0, "ab" + expected_text(2)), (1, "ab" + expected_text(2)),
        (2, "cde" + expected_text(2)), (3, "cde" + expected_text(2)),
    ]  # fmt: skip
    requests = srv.engine.requests[-4:]
    assert [list(r.prompt_ids) for r in requests] == [[BOS, *b"ab"]] * 2 + [[BOS, *b"cde"]] * 2
    assert [r.sampling.seed for r in requests] == [9, 10, 9, 10]  # each prompt's choices as if alone
    assert len({r.prompt_group for r in requests}) == 2
    assert whole.usage is not None and (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (3 + 4, 8)
    texts = [""] * 4
    for chunk in client(srv).completions.create(**ask, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == [c.text for c in whole.choices]


def test_a_batch_larger_than_parallel_runs_in_turns_and_one_past_the_queue_is_400(srv: RunningServer) -> None:
    prompts = [[BOS, 104 + i] for i in range(10)]  # parallel 4: three turns
    batch = client(srv).completions.create(model="fake-model", prompt=prompts, max_tokens=2)
    assert [c.index for c in batch.choices] == list(range(10))
    assert all(c.text == expected_text(2) and c.finish_reason == "length" for c in batch.choices)
    assert [list(r.prompt_ids) for r in srv.engine.requests] == prompts
    srv.engine.requests.clear()
    with pytest.raises(openai.BadRequestError) as info:  # 4 running + 16 queued at most
        client(srv).completions.create(model="fake-model", prompt=["x"] * 11, max_tokens=2, n=2)
    assert "--max-queue 16" in str(info.value) and srv.engine.requests == []
    with pytest.raises(openai.BadRequestError) as info:
        client(srv).completions.create(model="fake-model", prompt=["x", "y" * 600], max_tokens=2)
    assert info.value.body["param"] == "prompt[1]"  # type: ignore[index]


def test_n_past_parallel_and_out_of_range_are_400(srv: RunningServer) -> None:
    for n, words in ((5, "--parallel 4"), (0, "from 1 to 128")):
        with pytest.raises(openai.BadRequestError) as info:
            client(srv).completions.create(model="fake-model", prompt="abc", max_tokens=2, n=n)
        assert words in str(info.value) and info.value.body["param"] == "n"  # type: ignore[index]
    assert srv.engine.requests == []


def test_echo_puts_the_prompt_before_the_text_whole_and_streamed(srv: RunningServer) -> None:
    whole = client(srv).completions.create(model="fake-model", prompt="Once upon", max_tokens=3, echo=True)
    assert whole.choices[0].text == "Once upon" + expected_text(3)
    chunks = list(client(srv).completions.create(model="fake-model", prompt="Once upon", max_tokens=3, echo=True,
                                                 stream=True))  # fmt: skip
    assert chunks[0].choices[0].text == "Once upon"
    assert "".join(c.choices[0].text for c in chunks) == "Once upon" + expected_text(3)
    ids = client(srv).completions.create(model="fake-model", prompt=[BOS, 104, 105], max_tokens=1, echo=True, n=2)
    assert [c.text for c in ids.choices] == ["hi" + expected_text(1)] * 2


def test_completions_suffix_fills_in_the_middle_and_needs_fim_tokens_and_text(srv: RunningServer) -> None:
    with pytest.raises(openai.BadRequestError) as info:  # no FIM tokens yet
        client(srv).completions.create(model="fake-model", prompt="ab", suffix="cd", max_tokens=2)
    assert "cannot infill" in str(info.value) and info.value.body["param"] == "suffix"  # type: ignore[index]
    srv.engine.specials.update(FIM)
    answer = client(srv).completions.create(model="fake-model", prompt=["ab", "x"], suffix="cd", max_tokens=2, echo=True)
    assert [c.text for c in answer.choices] == ["ab" + expected_text(2), "x" + expected_text(2)]
    assert [list(r.prompt_ids) for r in srv.engine.requests] == [
        [BOS, 300, *b"ab", 301, *b"cd", 302], [BOS, 300, *b"x", 301, *b"cd", 302]
    ]  # fmt: skip
    with pytest.raises(openai.BadRequestError) as info:
        client(srv).completions.create(model="fake-model", prompt=[104, 105], suffix="cd", max_tokens=2)
    assert "text prompt" in str(info.value)
    plain = client(srv).completions.create(model="fake-model", prompt="ab", suffix="", max_tokens=1)
    assert list(srv.engine.requests[-1].prompt_ids) == [BOS, *b"ab"] and plain.choices[0].text


def test_echo_with_logprobs_scores_the_prompt_and_max_tokens_0_generates_nothing(srv: RunningServer) -> None:
    ask: Any = {"model": "fake-model", "prompt": "abc", "echo": True, "logprobs": 2}
    whole = client(srv).completions.create(**ask, max_tokens=2).choices[0]
    assert whole.text == "abc" + expected_text(2) and whole.logprobs is not None
    lp = whole.logprobs
    assert lp.tokens is not None and lp.tokens[:4] == ["<s>", "a", "b", "c"] and len(lp.tokens) == 6
    assert lp.token_logprobs is not None and lp.token_logprobs[:4] == [None, -0.01, -0.02, -0.03]
    assert lp.top_logprobs is not None and lp.top_logprobs[0] is None and lp.top_logprobs[1] == {"a": -0.01, "alt1": -1.01}
    assert lp.text_offset == [0, 0, 1, 2, 3, 3 + len(expected_text(1))]  # BOS takes no characters
    assert srv.engine.scored == [[BOS, *b"abc"]]
    srv.engine.requests.clear()
    alone = client(srv).completions.create(**{**ask, "prompt": [[BOS, *b"abc"], [BOS, 120]]}, max_tokens=0, n=2)
    assert [c.text for c in alone.choices] == ["abc", "abc", "x", "x"] and srv.engine.requests == []
    assert all(c.finish_reason == "length" for c in alone.choices)
    assert [c.logprobs.token_logprobs for c in alone.choices] == [[None, -0.01, -0.02, -0.03]] * 2 + [[None, -0.01]] * 2  # type: ignore[union-attr]
    assert alone.usage is not None and (alone.usage.prompt_tokens, alone.usage.completion_tokens) == (6, 0)
    chunks = list(client(srv).completions.create(**ask, max_tokens=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].text == "abc" and chunks[0].choices[0].logprobs.tokens == ["<s>", "a", "b", "c"]  # type: ignore[union-attr]
    assert chunks[1].choices[0].finish_reason == "length" and chunks[-1].usage is not None
    with pytest.raises(openai.BadRequestError) as info:
        client(srv).completions.create(model="fake-model", prompt="abc", max_tokens=0)
    assert info.value.body["param"] == "max_tokens"  # type: ignore[index]


def test_scoring_takes_an_admission_slot() -> None:
    one = RunningServer(FakeEngine(token_delay=0.05), parallel=1, max_queued_requests=0)
    try:
        running = client(one).completions.create(model="fake-model", prompt="x", max_tokens=100, stream=True)
        assert next(iter(running)).choices  # admitted: the one slot is taken
        ask: Any = {"model": "fake-model", "prompt": "abc", "echo": True, "logprobs": 1, "max_tokens": 0}
        with pytest.raises(openai.RateLimitError):
            client(one).completions.create(**ask)
        assert one.engine.scored == []
        running.close()
        deadline = time.monotonic() + 10
        while one.engine.active and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client(one).completions.create(**ask).choices[0].text == "abc" and one.engine.scored
    finally:
        one.stop()


def test_infill_answers_in_llama_cpps_shape(srv: RunningServer) -> None:
    srv.engine.specials.update(FIM)
    body = {"input_prefix": "ab", "input_suffix": "cd", "prompt": "e", "n_predict": 4}
    status, raw = post(srv, "/infill", body)
    assert status == 200, raw
    answer = json.loads(raw)
    assert answer["content"] == expected_text(4) and answer["stop"] is True and answer["stop_type"] == "limit"
    assert answer["tokens_predicted"] == 4 and answer["tokens_evaluated"] == 9 and answer["model"] == "fake-model"
    # BOS (the fake engine adds one), then the prefix, the prompt, the suffix and the middle token
    assert list(srv.engine.requests[-1].prompt_ids) == [BOS, 300, *b"ab", *b"e", 301, *b"cd", 302]
    stopped = json.loads(post(srv, "/infill", {**body, "stop": [" world"]})[1])
    assert stopped["stop_type"] == "word" and stopped["stopping_word"] == " world"
    assert stopped["content"] == "Hello,"


def test_infill_streams_content_chunks_then_the_totals(srv: RunningServer) -> None:
    srv.engine.specials.update(FIM)
    body = {"input_prefix": "ab", "input_suffix": "cd", "n_predict": 3, "stream": True}
    status, raw = post(srv, "/infill", body)
    assert status == 200
    lines = [line for line in raw.decode().split("\n") if line]
    events = [json.loads(line.removeprefix("data: ")) for line in lines]
    assert all(line.startswith("data: {") for line in lines)  # no [DONE], as llama.cpp's /infill
    assert "".join(e["content"] for e in events) == expected_text(3)
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    assert events[-1]["tokens_predicted"] == 3 and events[-1]["stop_type"] == "limit"


def test_infill_without_fim_tokens_or_with_bad_fields_is_400(srv: RunningServer) -> None:
    status, raw = post(srv, "/infill", {"input_prefix": "a", "input_suffix": "b"})
    assert status == 400 and "cannot infill" in json.loads(raw)["error"]["message"]
    srv.engine.specials.update(FIM)
    status, raw = post(srv, "/infill", {"input_prefix": "a"})
    assert status == 400 and json.loads(raw)["error"]["param"] == "input_suffix"
    assert srv.engine.requests == []


def test_a_client_gone_mid_request_aborts_every_choice(srv: RunningServer) -> None:
    """A whole (not streamed) n = 2 request whose client resets its connection: both choices'
    generations are aborted (the fake engine runs one at a time: the second, still waiting for
    it, is aborted too), and the next request is answered."""
    engine = srv.engine
    engine.token_delay = 0.005
    body = json.dumps({"prompt": "abc", "max_tokens": 100_000, "n": 2}).encode()
    sock = srv.connect()
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(body)}\r\n\r\n".encode() + body
    )
    while not engine.started:  # the first choice is generating
        time.sleep(0.01)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
    sock.close()
    deadline = time.monotonic() + 5
    while len(engine.aborts) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(engine.aborts) == sorted(r.request_id for r in engine.requests) and len(engine.aborts) == 2
    engine.token_delay = 0.0
    assert client(srv).completions.create(model="fake-model", prompt="abc", max_tokens=2).choices[0].text
