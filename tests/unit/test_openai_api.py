"""The OpenAI API layer (routes, validation, responses, errors, admission, cancellation) over the fake engine.

Requests go through the real HttpProtocol with a mock transport, so what is checked is what a
client would receive.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest

from tests.fakes import FakeEngine, MockTransport, ParsedResponse, async_test, expected_text, parse_responses
from zinc.engine.types import SamplingParams
from zinc.errors import ContextLengthExceededError, InvalidRequestError
from zinc.server.api import OpenAIApi
from zinc.server.config import ServerConfig
from zinc.server.http11 import HttpProtocol
from zinc.server.routes import COMMON_HEADERS, Router

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
HI = [{"role": "user", "content": "hi"}]


class Client:
    def __init__(self, engine: FakeEngine | None = None, **config: Any) -> None:
        self.engine = engine or FakeEngine()
        self.config = ServerConfig(**config)
        self.router = Router(OpenAIApi(self.engine, self.config), self.config.api_key)

    def open(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> MockTransport:
        protocol = HttpProtocol(self.router, self.config, COMMON_HEADERS)
        transport = MockTransport()
        transport.protocol = protocol
        protocol.connection_made(transport)
        data = body if isinstance(body, bytes) else b"" if body is None else orjson.dumps(body)
        head = f"{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: {len(data)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        protocol.data_received(head.encode() + b"\r\n" + data)
        return transport

    async def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> ParsedResponse:
        transport = self.open(method, path, body, headers)
        while not transport.closed:
            await asyncio.sleep(0.001)
        (response,) = parse_responses(transport.take())
        return response

    async def chat(self, **fields: Any) -> ParsedResponse:
        return await self.call("POST", CHAT, {"messages": HI, **fields})

    async def text(self, **fields: Any) -> ParsedResponse:
        return await self.call("POST", TEXT, {"prompt": "hi", **fields})


def assert_error(
    response: ParsedResponse, status: int, code: str | None = None, param: str | None = None
) -> None:
    assert response.status == status, response
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if code is not None:
        assert error["code"] == code
    if param is not None:
        assert error["param"] == param
    assert response.headers["access-control-allow-origin"] == "*"


# ---- responses


@async_test
async def test_chat_completion_shape_and_usage() -> None:
    client = Client()
    response = await client.chat(max_tokens=5)
    body = response.json()
    assert response.status == 200 and response.headers["content-type"] == "application/json"
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == "fake-model"
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": expected_text(5)}
    assert choice["finish_reason"] == "length"
    prompt_tokens = len(client.engine.requests[0].prompt_ids)
    assert body["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 5,
        "total_tokens": prompt_tokens + 5,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


@async_test
async def test_chat_renders_template_then_tokenizes_with_specials() -> None:
    client = Client()
    messages = [
        {"role": "system", "content": None},
        {
            "role": "user",
            "content": [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}],
        },
    ]
    await client.call(
        "POST", CHAT, {"messages": messages, "enable_thinking": False, "chat_template_kwargs": {"x": 1}}
    )
    rendered, kwargs = client.engine.template_calls[0]
    assert [m["content"] for m in rendered] == ["", "a\nb"]
    assert kwargs == {"x": 1, "enable_thinking": False}
    prompt = "<|system|>\n<|user|>a\nb\n<|assistant|>"
    assert list(client.engine.requests[0].prompt_ids) == client.engine.tokenize(prompt)


@async_test
async def test_chat_stream_chunks_usage_and_done() -> None:
    client = Client()
    response = await client.chat(max_tokens=4, stream=True, stream_options={"include_usage": True})
    assert response.status == 200 and response.chunked
    assert response.headers["content-type"] == "text/event-stream"
    events = response.events()
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-2])
    assert text == expected_text(4)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert len({c["id"] for c in chunks}) == 1


@async_test
async def test_stream_without_include_usage_has_no_usage_chunk() -> None:
    response = await Client().chat(max_tokens=2, stream=True)
    chunks = [orjson.loads(e) for e in response.events()[:-1]]
    assert all("usage" not in c for c in chunks) and chunks[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("stream", [False, True])
@async_test
async def test_stop_sequences_are_honored(stream: bool) -> None:
    client = Client()
    response = await client.chat(max_tokens=50, stop=["fox", "never"], stream=stream)
    assert client.engine.requests[0].stop == ("fox", "never")
    if stream:
        chunks = [orjson.loads(e) for e in response.events()[:-1]]
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        finish = chunks[-1]["choices"][0]["finish_reason"]
    else:
        text = response.json()["choices"][0]["message"]["content"]
        finish = response.json()["choices"][0]["finish_reason"]
    assert text == "Hello, world! The quick brown " and finish == "stop"


@async_test
async def test_completions_whole_and_prompt_forms() -> None:
    client = Client()
    body = (await client.text(max_tokens=3)).json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == expected_text(3) and "usage" in body
    await client.text(prompt=["hi"], max_tokens=1)
    await client.text(prompt=[5, 6, 7], max_tokens=1)
    await client.text(prompt=[[5, 6]], max_tokens=1)
    prompts = [list(r.prompt_ids) for r in client.engine.requests]
    assert prompts == [client.engine.tokenize("hi")] * 2 + [[5, 6, 7], [5, 6]]


@async_test
async def test_completions_stream_with_sampling_controls() -> None:
    client = Client()
    response = await client.text(
        max_tokens=3, stream=True, temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, seed=7,
        presence_penalty=0.5, frequency_penalty=0.25, repeat_penalty=1.1, logit_bias={"42": 5},
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = [orjson.loads(e) for e in response.events()[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == expected_text(3)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and chunks[-1]["usage"]["total_tokens"] > 3
    assert client.engine.requests[0].sampling == SamplingParams(
        0.7, 0.9, 40, 0.05, 7, 0.5, 0.25, 1.1, {42: 5.0}
    )


@async_test
async def test_defaults_and_clamping() -> None:
    client = Client()
    await client.chat()
    await client.chat(temperature=9, top_p=3, min_p=-1, top_k=-5, presence_penalty=-7, logit_bias={"1": 500})
    await client.chat(max_tokens=10, max_completion_tokens=3, seed=-1)
    default, clamped, override = client.engine.requests
    assert default.max_tokens == 256 and default.sampling == SamplingParams()
    assert clamped.sampling == SamplingParams(2.0, 1.0, 0, 0.0, None, -2.0, 0.0, 1.0, {1: 100.0})
    assert override.max_tokens == 3 and override.sampling.seed is None


@async_test
async def test_max_tokens_is_clamped_to_the_context_left() -> None:
    client = Client(FakeEngine(context_length=40))
    await client.text(prompt="x" * 30, max_tokens=100)
    assert client.engine.requests[0].max_tokens == 40 - 31


# ---- validation


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": None}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": ["hi"]}, "messages[0]"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
            "messages[0].content[0].text",
        ),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_p": [1]}, "top_p"),
        ({"top_k": 1.5}, "top_k"),
        ({"seed": "1"}, "seed"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "9"}, "max_tokens"),
        ({"max_completion_tokens": -1}, "max_completion_tokens"),
        ({"stop": 5}, "stop"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stream": "yes"}, "stream"),
        ({"stream_options": {"include_usage": "y"}}, "stream_options.include_usage"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"1": "x"}}, "logit_bias"),
        ({"repeat_penalty": 0}, "repeat_penalty"),
        ({"model": 7}, "model"),
        ({"n": 0}, "n"),
        ({"n": 129}, "n"),
        ({"n": 1.5}, "n"),
        ({"tools": [{"type": "function", "function": {"name": "no spaces"}}]}, "tools[0].function.name"),
        ({"tools": {"type": "function"}}, "tools"),
        ({"tool_choice": "maybe", "tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice"),
        (
            {
                "tool_choice": {"type": "function", "function": {"name": "g"}},
                "tools": [{"type": "function", "function": {"name": "f"}}],
            },
            "tool_choice",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "wat"}}}},
            "response_format.json_schema.schema",
        ),
        ({"logprobs": 3}, "logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": [1]}, "chat_template_kwargs"),
        ({"enable_thinking": "no"}, "enable_thinking"),
    ],
)
@async_test
async def test_wrong_fields_are_400_naming_the_param(fields: dict[str, Any], param: str) -> None:
    client = Client()
    response = await client.call("POST", CHAT, {"messages": HI, **fields})
    assert_error(response, 400, param=param)
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert client.engine.requests == []


@pytest.mark.parametrize("prompt", [None, 5, [], ["a", [5]], [1, -2], [1, True], {"a": 1}])
@async_test
async def test_bad_prompts_are_400(prompt: Any) -> None:
    assert_error(await Client().call("POST", TEXT, {"prompt": prompt}), 400, param="prompt")


@pytest.mark.parametrize("body", [b"", b"{nope", b"[1, 2]", b'"text"'])
@async_test
async def test_malformed_json_is_400(body: bytes) -> None:
    assert_error(await Client().call("POST", CHAT, body), 400)


@async_test
async def test_model_field() -> None:
    client = Client()
    assert (await client.chat(model="fake-model")).status == 200
    assert (await client.chat(model=None)).status == 200
    assert_error(await client.chat(model="gpt-4"), 404, code="model_not_found")


# ---- errors from the engine


@pytest.mark.parametrize("stream", [False, True])
@async_test
async def test_context_length_exceeded_is_a_plain_400(stream: bool) -> None:
    client = Client(FakeEngine(context_length=20))
    response = await client.text(prompt="x" * 40, stream=stream)
    assert_error(response, 400, code="context_length_exceeded", param="prompt")
    assert response.headers["content-type"] == "application/json"


@pytest.mark.parametrize("stream", [False, True])
@async_test
async def test_engine_errors_before_the_first_token_are_json(stream: bool) -> None:
    engine = FakeEngine(fail_after=0, fail_with=ContextLengthExceededError(10, 5))
    response = await Client(engine).chat(stream=stream)
    assert_error(response, 400, code="context_length_exceeded")
    queue_full = await Client(FakeEngine(queue_full=True)).chat(stream=stream)
    assert_error(queue_full, 429, code="queue_full")
    assert queue_full.json()["error"]["type"] == "rate_limit_error"


@async_test
async def test_unexpected_engine_error_is_a_generic_500(caplog: pytest.LogCaptureFixture) -> None:
    engine = FakeEngine(fail_after=0, fail_with=RuntimeError("GPU said /secret/path 0xdeadbeef"))
    with caplog.at_level(logging.ERROR, logger="zinc.server"):
        response = await Client(engine).chat()
    assert_error(response, 500, code="internal_error")
    assert b"secret" not in response.body and b"Traceback" not in response.body
    assert any(r.exc_info for r in caplog.records)


@pytest.mark.parametrize("error", [InvalidRequestError("bad token"), RuntimeError("hidden")])
@async_test
async def test_error_after_stream_started_is_a_final_error_event(error: Exception) -> None:
    response = await Client(FakeEngine(fail_after=2, fail_with=error)).chat(stream=True, max_tokens=10)
    assert response.status == 200
    events = response.events()
    assert "[DONE]" not in events
    final = orjson.loads(events[-1])["error"]
    assert set(final) == {"message", "type", "param", "code"}
    assert "hidden" not in final["message"]


# ---- routes, CORS, auth


@async_test
async def test_unknown_path_and_wrong_method() -> None:
    client = Client()
    assert_error(await client.call("GET", "/v1/nope"), 404, code="not_found")
    response = await client.call("GET", CHAT)
    assert_error(response, 405, code="method_not_allowed")
    assert response.headers["allow"] == "POST, OPTIONS"


@async_test
async def test_options_preflight() -> None:
    response = await Client(api_key="k").call(
        "OPTIONS", CHAT, headers={"Access-Control-Request-Headers": "x-a"}
    )
    assert response.status == 200 and response.json() == {}
    assert response.headers["access-control-allow-origin"] == "*"
    assert response.headers["access-control-allow-methods"] == "POST, OPTIONS"
    assert response.headers["access-control-allow-headers"] == "x-a"


@async_test
async def test_models_and_health() -> None:
    client = Client()
    models = (await client.call("GET", "/v1/models")).json()
    assert models["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in models["data"]] == [
        ("fake-model", "model", "zinc")
    ]
    health = (await client.call("GET", "/health")).json()
    assert health["status"] == "ok" and health["model"] == "fake-model"
    for key in ("active_requests", "queued_requests", "uptime_seconds", "gpu_context_capacity_tokens"):
        assert isinstance(health[key], int)


@async_test
async def test_api_key() -> None:
    client = Client(api_key="sekrit")
    assert_error(await client.chat(), 401, code="invalid_api_key")
    bad = await client.call("GET", "/v1/models", headers={"Authorization": "Bearer nope"})
    assert_error(bad, 401)
    assert (
        bad.json()["error"]["type"] == "authentication_error" and bad.headers["www-authenticate"] == "Bearer"
    )
    ok = await client.call("GET", "/v1/models", headers={"Authorization": "Bearer sekrit"})
    assert ok.status == 200
    assert (await client.call("GET", "/health")).status == 200


# ---- admission and cancellation


@async_test
async def test_past_parallel_and_queue_is_429_at_once() -> None:
    engine = FakeEngine(token_delay=0.1)
    client = Client(engine, parallel=1, max_queued_requests=1)
    running = client.open("POST", CHAT, {"messages": HI, "max_tokens": 3})
    queued = client.open("POST", CHAT, {"messages": HI, "max_tokens": 3})
    await asyncio.sleep(0.01)
    health = (await client.call("GET", "/health")).json()
    assert health["active_requests"] == 1 and health["queued_requests"] == 1
    refused = await client.chat()
    assert_error(refused, 429, code="queue_full")
    assert refused.headers["retry-after"] == "1"  # the openai SDK waits this long before its retry
    for transport in (running, queued):
        while not transport.closed:
            await asyncio.sleep(0.005)
        assert parse_responses(transport.take())[0].status == 200


@pytest.mark.parametrize(
    ("stream", "phase"), [(False, "decode"), (True, "decode"), (False, "prefill"), (True, "prefill")]
)
@async_test
async def test_client_disconnect_aborts_the_generation(stream: bool, phase: str) -> None:
    engine = FakeEngine(token_delay=0.01) if phase == "decode" else FakeEngine(prefill_delay=5)
    client = Client(engine)
    transport = client.open("POST", CHAT, {"messages": HI, "max_tokens": 1000, "stream": stream})
    await asyncio.sleep(0.05)
    assert engine.started and not engine.aborts
    assert transport.protocol is not None
    transport.protocol.connection_lost(ConnectionResetError())
    await asyncio.sleep(0.02)
    assert engine.aborts == engine.started and engine.completed == []
    assert engine.active == 0


@async_test
async def test_one_access_log_line_per_request(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="zinc.server.access"):
        await Client().chat(max_tokens=2)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "zinc.server.access"]
    assert line.startswith("POST /v1/chat/completions 200 ") and line.endswith("+2")


@async_test
async def test_disconnect_while_queued_for_admission_frees_the_place() -> None:
    engine = FakeEngine(token_delay=0.1)
    client = Client(engine, parallel=1, max_queued_requests=1)
    running = client.open("POST", CHAT, {"messages": HI, "max_tokens": 3})
    queued = client.open("POST", CHAT, {"messages": HI, "max_tokens": 3})
    await asyncio.sleep(0.01)
    assert queued.protocol is not None
    queued.protocol.connection_lost(ConnectionResetError())
    await asyncio.sleep(0.01)
    assert (await client.call("GET", "/health")).json()["queued_requests"] == 0
    while not running.closed:
        await asyncio.sleep(0.005)
    assert len(engine.requests) == 1 and engine.aborts == []
    assert (await client.chat(max_tokens=1)).status == 200
