"""The OpenAI Responses API (`/v1/responses`) on a real loopback server with the fake engine, driven by
the official `openai` SDK (`client.responses.create` and `client.responses.stream`; raw HTTP where
the SDK would hide the wire format): whole and streamed responses and their event order, a tool
round trip, structured output, reasoning items, nothing stored, errors in OpenAI's envelope, 429,
the API key, CORS, disconnects and /props."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import orjson
import pytest

from tests.e2e.test_server_fake_engine import MODEL
from tests.fakes import FakeEngine, expected_text
from tests.server_harness import RunningServer, read_response

pytestmark = pytest.mark.e2e
TOOL: Any = {
    "type": "function",
    "name": "get_time",
    "description": "Current time.",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
    "strict": False,
}
CALL = 'Checking.\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>\n'
TEXT_EVENTS = [
    "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
]  # fmt: skip
TEXT_DONE = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


def sdk(running: RunningServer, **kwargs: Any) -> openai.OpenAI:
    options: dict[str, Any] = {"api_key": "unused", "max_retries": 0, "timeout": 10, **kwargs}
    return openai.OpenAI(base_url=running.base_url, **options)


@pytest.fixture(scope="module")
def srv() -> Iterator[RunningServer]:
    running = RunningServer(FakeEngine(token_delay=0.001))
    yield running
    running.stop()


@pytest.fixture
def client(srv: RunningServer) -> openai.OpenAI:
    return sdk(srv)


def scripted(script: str) -> RunningServer:
    return RunningServer(FakeEngine(script=script, script_piece=2))


def post(running: RunningServer, body: Any, path: str = "/v1/responses", **headers: str) -> httpx2.Response:
    url = f"http://127.0.0.1:{running.port}{path}"
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx2.post(url, content=content, headers=headers, timeout=10)


def sse_events(body: bytes) -> list[Any]:
    """The data of each SSE event; the event line must name the data's type."""
    events = []
    for chunk in body.decode().split("\n\n"):
        if chunk.strip():
            name, data = chunk.split("\n")
            payload = orjson.loads(data.removeprefix("data: "))
            assert name == f"event: {payload['type']}"
            events.append(payload)
    return events


# ---- whole and streamed responses


def test_create_cut_by_max_output_tokens(client: openai.OpenAI, srv: RunningServer) -> None:
    out = client.responses.create(model=MODEL, input="hi", max_output_tokens=5, metadata={"who": "test"})
    assert out.id.startswith("resp_") and out.object == "response" and out.model == MODEL
    assert out.output_text == expected_text(5)
    assert out.status == "incomplete" and out.incomplete_details is not None
    assert out.incomplete_details.reason == "max_output_tokens"
    items: Any = out.output
    assert [(item.type, item.status) for item in items] == [("message", "incomplete")]
    assert out.metadata == {"who": "test"} and out.max_output_tokens == 5
    assert out.store is False  # type: ignore[attr-defined]
    prompt = srv.engine.apply_chat_template([{"role": "user", "content": "hi"}])
    assert out.usage is not None and out.usage.input_tokens == len(srv.engine.tokenize(prompt))
    assert (out.usage.output_tokens, out.usage.total_tokens) == (5, out.usage.input_tokens + 5)
    assert srv.engine.requests[-1].max_tokens == 5


def test_create_completed() -> None:
    running = scripted("All done.")
    try:
        out = sdk(running).responses.create(model=MODEL, input="hi")
        assert out.status == "completed" and out.incomplete_details is None and out.completed_at is not None
        assert out.output_text == "All done." and out.output[0].status == "completed"  # type: ignore[union-attr]
        assert out.usage is not None and out.usage.output_tokens == 5
    finally:
        running.stop()


def test_instructions_items_and_sampling_reach_the_chat_path(
    client: openai.OpenAI, srv: RunningServer
) -> None:
    client.responses.create(
        model=MODEL,
        instructions="Be brief.",
        input=[
            {"role": "developer", "content": "No jokes."},
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
            },
            {"role": "assistant", "content": "c"},
            {"role": "user", "content": "d"},
        ],
        max_output_tokens=2,
        temperature=0.5,
        top_p=0.9,
        extra_body={"top_k": 40},
    )
    messages, kwargs = srv.engine.template_calls[-1]
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "No jokes."},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "c"},
        {"role": "user", "content": "d"},
    ]
    assert kwargs == {}
    sampling = srv.engine.requests[-1].sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.5, 0.9, 40)


def test_stream_helper_event_order_and_final_response() -> None:
    running = scripted("All done.")
    try:
        with sdk(running).responses.stream(model=MODEL, input="hi", metadata={"k": "v"}) as stream:
            events = list(stream)
            final = stream.get_final_response()
        kinds = [e.type for e in events]
        deltas = [e for e in events if e.type == "response.output_text.delta"]
        assert kinds == [
            *TEXT_EVENTS,
            *["response.output_text.delta"] * len(deltas),
            *TEXT_DONE,
            "response.completed",
        ]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert "".join(e.delta for e in deltas) == "All done." == final.output_text
        assert final.status == "completed" and final.metadata == {"k": "v"}
        assert final.usage is not None and final.usage.output_tokens == 5
        created: Any = events[0]
        assert created.response.status == "in_progress" and created.response.output == []
        assert created.response.id == final.id and created.response.usage is None
        done: Any = events[-2]
        assert done.item.status == "completed" and done.item.content[0].text == "All done."
    finally:
        running.stop()


def test_stream_cut_short_ends_incomplete(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model=MODEL, input="hi", max_output_tokens=3, stream=True))
    assert [e.type for e in events] == [
        *TEXT_EVENTS, *["response.output_text.delta"] * 3, *TEXT_DONE, "response.incomplete"]  # fmt: skip
    last: Any = events[-1]
    assert (
        last.response.status == "incomplete"
        and last.response.incomplete_details.reason == "max_output_tokens"
    )
    assert last.response.output[0].content[0].text == expected_text(3)
    assert last.response.usage.output_tokens == 3


def test_stream_wire_format(srv: RunningServer) -> None:
    response = post(srv, {"model": MODEL, "input": "hi", "max_output_tokens": 2, "stream": True})
    assert response.status_code == 200 and response.headers["content-type"] == "text/event-stream"
    events = sse_events(response.content)
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.incomplete"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert b"[DONE]" not in response.content


# ---- tools, structured output, reasoning


@pytest.fixture(scope="module")
def tools_srv() -> Iterator[RunningServer]:
    running = scripted(CALL)
    yield running
    running.stop()


def test_tool_round_trip(tools_srv: RunningServer) -> None:
    client = sdk(tools_srv)
    out = client.responses.create(model=MODEL, input="What time is it?", tools=[TOOL])
    assert out.status == "completed"
    message, call = out.output
    assert message.type == "message" and out.output_text == "Checking.\n"
    assert call.type == "function_call" and call.name == "get_time" and call.status == "completed"
    assert orjson.loads(call.arguments) == {"tz": "UTC"} and call.call_id.startswith("call_")
    assert call.id is not None and call.id.startswith("fc_")
    _, kwargs = tools_srv.engine.template_calls[-1]
    assert kwargs["tools"][0]["function"]["name"] == "get_time"
    assert tools_srv.engine.requests[-1].grammar is None  # auto: the model decides
    assert out.tools[0].name == "get_time" and out.tool_choice == "auto"  # type: ignore[union-attr]

    follow_up: Any = [
        {"role": "user", "content": "What time is it?"},
        *[item.model_dump(exclude_none=True) for item in out.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "12:00"},
    ]
    client.responses.create(model=MODEL, input=follow_up, tools=[TOOL])
    messages, _ = tools_srv.engine.template_calls[-1]
    assert messages == [
        {"role": "user", "content": "What time is it?"},
        {"role": "assistant", "content": "Checking.\n", "tool_calls": [
            {"id": call.call_id, "type": "function",
             "function": {"name": "get_time", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "12:00"},
    ]  # fmt: skip


def test_tool_call_streamed(tools_srv: RunningServer) -> None:
    with sdk(tools_srv).responses.stream(model=MODEL, input="hi", tools=[TOOL]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    call: Any = final.output[1]
    assert call.type == "function_call" and orjson.loads(call.arguments) == {"tz": "UTC"}
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 2 and all(e.output_index == 1 and e.item_id == call.id for e in deltas)
    assert "".join(e.delta for e in deltas) == call.arguments
    kinds: list[str] = [e.type for e in events]
    tail = ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert kinds[-3:] == tail
    assert kinds.index("response.output_item.added", kinds.index(TEXT_DONE[-1])) < kinds.index(deltas[0].type)


def test_tool_choice_maps_onto_the_chat_path(tools_srv: RunningServer) -> None:
    client = sdk(tools_srv)
    for choice, forced in (
        ("required", True),
        ({"type": "function", "name": "get_time"}, True),
        ("auto", False),
    ):
        client.responses.create(model=MODEL, input="hi", tools=[TOOL], tool_choice=choice)  # type: ignore[call-overload]
        assert (tools_srv.engine.requests[-1].grammar is not None) == forced, choice
    out = client.responses.create(model=MODEL, input="hi", tools=[TOOL], tool_choice="none")
    assert [item.type for item in out.output] == ["message"]
    assert "tools" not in tools_srv.engine.template_calls[-1][1]


def test_text_format_json_schema(client: openai.OpenAI, srv: RunningServer) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    text: Any = {"format": {"type": "json_schema", "name": "number", "schema": schema, "strict": True}}
    out = client.responses.create(model=MODEL, input="hi", max_output_tokens=2, text=text)
    assert srv.engine.requests[-1].grammar is not None  # the fake engine ignores it; llguidance is real
    assert out.text is not None and out.text.format is not None and out.text.format.type == "json_schema"
    with pytest.raises(openai.BadRequestError) as caught:
        bad: Any = {
            "format": {"type": "json_schema", "name": "x", "schema": {"type": "object", "minProperties": "2"}}
        }
        client.responses.create(model=MODEL, input="hi", text=bad)
    assert caught.value.body["param"] == "text.format.schema"  # type: ignore[index]


def test_reasoning_items() -> None:
    running = scripted("<think>Greeting.</think>\nHi!")
    try:
        client = sdk(running)
        out = client.responses.create(model=MODEL, input="hi", reasoning={"effort": "low"})
        reasoning, _ = out.output
        assert reasoning.type == "reasoning" and reasoning.content is not None
        assert reasoning.content[0].text == "Greeting." and out.output_text == "Hi!"
        assert running.engine.template_calls[-1][1] == {"enable_thinking": True}
        assert (
            out.usage is not None
            and 0 < out.usage.output_tokens_details.reasoning_tokens < out.usage.output_tokens
        )
        assert out.reasoning is not None and out.reasoning.effort == "low"
        with client.responses.stream(model=MODEL, input="hi") as stream:
            kinds = [e.type for e in stream]
            final = stream.get_final_response()
        assert "response.reasoning_text.delta" in kinds and "response.reasoning_text.done" in kinds
        streamed: Any = final.output
        assert [(i.type, i.content[0].text) for i in streamed] == [
            ("reasoning", "Greeting."),
            ("message", "Hi!"),
        ]
        assert running.engine.template_calls[-1][1] == {}
        client.responses.create(model=MODEL, input="hi", reasoning={"effort": "none"})
        assert running.engine.template_calls[-1][1] == {"enable_thinking": False}
    finally:
        running.stop()


def test_logprobs_when_included(client: openai.OpenAI) -> None:
    asked: Any = {"include": ["message.output_text.logprobs"], "top_logprobs": 2}
    out = client.responses.create(model=MODEL, input="hi", max_output_tokens=3, **asked)
    items: Any = out.output
    logprobs = items[0].content[0].logprobs
    assert [(t.token, t.logprob) for t in logprobs] == [("Hello", 0.0), (",", -0.25), (" world", -0.5)]
    assert [len(t.top_logprobs) for t in logprobs] == [2, 2, 2] and logprobs[0].bytes == list(b"Hello")
    events = list(client.responses.create(model=MODEL, input="hi", max_output_tokens=3, stream=True, **asked))
    deltas: Any = [e for e in events if e.type == "response.output_text.delta"]
    assert [t.token for e in deltas for t in e.logprobs] == ["Hello", ",", " world"]
    plain: Any = client.responses.create(model=MODEL, input="hi", max_output_tokens=3).output
    assert plain[0].content[0].logprobs == []


# ---- errors, storage, authentication


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        ({"model": MODEL, "input": []}, 400, "input"),
        ({"model": MODEL, "input": "hi", "previous_response_id": "resp_1"}, 400, "previous_response_id"),
        ({"model": MODEL, "input": [{"type": "item_reference", "id": "msg_1"}]}, 400, "input[0]"),
        ({"model": MODEL, "input": "hi", "tools": [{"type": "web_search"}]}, 400, "tools[0]"),
        ({"model": "gpt-nope", "input": "hi"}, 404, None),
    ],
)
def test_errors_are_openai_envelopes(srv: RunningServer, body: Any, status: int, param: str | None) -> None:
    response = post(srv, body)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param


def test_previous_response_id_is_refused_and_nothing_is_stored(
    client: openai.OpenAI, srv: RunningServer
) -> None:
    first = client.responses.create(model=MODEL, input="hi", max_output_tokens=2, store=True)
    assert first.store is False  # type: ignore[attr-defined]
    with pytest.raises(openai.BadRequestError, match="stores no responses"):
        client.responses.create(model=MODEL, input="more", previous_response_id=first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    assert not srv.engine.sessions  # no KV pages kept either, unless a session_id asks
    client.responses.create(model=MODEL, input="hi", max_output_tokens=2, extra_body={"session_id": "s1"})
    assert set(srv.engine.sessions) == {"s1"} and srv.engine.release_session("s1")


def test_queue_full_and_mid_stream_failure() -> None:
    running = RunningServer(FakeEngine(queue_full=True))
    try:
        response = post(running, {"model": MODEL, "input": "hi"})
        assert response.status_code == 429 and response.headers["retry-after"] == "1"
        assert response.json()["error"]["type"] == "rate_limit_error"
    finally:
        running.stop()
    running = RunningServer(FakeEngine(fail_after=2))
    try:
        events = sse_events(post(running, {"model": MODEL, "input": "hi", "stream": True}).content)
        error, failed = events[-2:]
        assert error["type"] == "error" and error["code"] == "internal_error"
        assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
        assert failed["response"]["error"]["code"] == "server_error"
        assert failed["response"]["output"][0]["content"][0]["text"] == expected_text(2)
    finally:
        running.stop()


def test_api_key_and_cors() -> None:
    running = RunningServer(FakeEngine(), api_key="sekrit")
    try:
        out = sdk(running, api_key="sekrit").responses.create(model=MODEL, input="hi", max_output_tokens=2)
        assert out.output_text == expected_text(2)
        with pytest.raises(openai.AuthenticationError):
            sdk(running, api_key="wrong").responses.create(model=MODEL, input="hi")
        missing = post(running, {"model": MODEL, "input": "hi"})
        assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
        preflight = httpx2.options(f"http://127.0.0.1:{running.port}/v1/responses", timeout=10)
        assert (
            preflight.status_code == 200
            and preflight.headers["access-control-allow-methods"] == "POST, OPTIONS"
        )
        assert missing.headers["access-control-allow-origin"] == "*"
    finally:
        running.stop()


# ---- disconnects and discovery


def test_disconnect_mid_stream_aborts_the_generation() -> None:
    running = RunningServer(FakeEngine(token_delay=0.02))
    try:
        body = orjson.dumps({"model": MODEL, "input": "hi", "max_output_tokens": 500, "stream": True})
        with running.connect() as sock:
            sock.sendall(
                b"POST /v1/responses HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            data = b""
            while b"response.output_text.delta" not in data:
                chunk = sock.recv(4096)
                assert chunk
                data += chunk
        for _ in range(200):
            if running.engine.aborts:
                break
            time.sleep(0.01)
        assert len(running.engine.aborts) == 1 and not running.engine.completed
    finally:
        running.stop()


def test_props_lists_the_endpoint(srv: RunningServer) -> None:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as sock:
        sock.sendall(b"GET /props HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        status, _, body = read_response(sock.makefile("rb"))
    assert status == 200 and "POST /v1/responses" in orjson.loads(body)["endpoints"]
    alias = post(srv, {"model": MODEL, "input": "hi", "max_output_tokens": 1}, path="/responses")
    assert alias.status_code == 200 and alias.json()["object"] == "response"  # the /v1-less alias
    wrong = httpx2.get(f"http://127.0.0.1:{srv.port}/v1/responses", timeout=10)
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST, OPTIONS"
