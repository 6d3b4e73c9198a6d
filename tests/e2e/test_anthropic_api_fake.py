"""The Anthropic Messages API (`/v1/messages`, `/v1/messages/count_tokens`) on a real loopback server
with the fake engine, driven by the official `anthropic` SDK (and raw HTTP where the SDK would hide
the wire format): whole and streamed messages, stop reasons, a tool round trip, thinking blocks,
token counting, errors in Anthropic's envelope, and both ways of sending the API key."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import orjson
import pytest

from tests.e2e.test_server_fake_engine import MODEL
from tests.fakes import FakeEngine, expected_text
from tests.server_harness import RunningServer, read_response

pytestmark = pytest.mark.e2e
HI: Any = [{"role": "user", "content": "hi"}]
TOOL: Any = {
    "name": "get_time",
    "description": "Current time.",
    "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}},
}
CALL = 'Checking.\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>\n'


def sdk(running: RunningServer, **kwargs: Any) -> anthropic.Anthropic:
    options: dict[str, Any] = {"api_key": "unused", "max_retries": 0, "timeout": 10, **kwargs}
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{running.port}", **options)


@pytest.fixture(scope="module")
def srv() -> Iterator[RunningServer]:
    running = RunningServer(FakeEngine(token_delay=0.001))
    yield running
    running.stop()


@pytest.fixture
def client(srv: RunningServer) -> anthropic.Anthropic:
    return sdk(srv)


def post(running: RunningServer, path: str, body: Any, **headers: str) -> httpx2.Response:
    url = f"http://127.0.0.1:{running.port}{path}"
    return httpx2.post(url, content=orjson.dumps(body), headers=headers, timeout=10)


def sse_events(body: bytes) -> list[tuple[str, Any]]:
    """(event name, data) of each SSE event; the event line must name the data's type."""
    events = []
    for chunk in body.decode().split("\n\n"):
        if chunk.strip():
            name, data = chunk.split("\n")
            assert name.startswith("event: ") and data.startswith("data: ")
            payload = orjson.loads(data[6:])
            assert payload["type"] == name[7:]
            events.append((name[7:], payload))
    return events


# ---- whole and streamed messages


def test_message_whole(client: anthropic.Anthropic, srv: RunningServer) -> None:
    out = client.messages.create(model=MODEL, max_tokens=5, messages=HI)
    assert out.id.startswith("msg_") and out.type == "message" and out.role == "assistant"
    assert out.model == MODEL
    assert [(b.type, getattr(b, "text", None)) for b in out.content] == [("text", expected_text(5))]
    assert out.stop_reason == "max_tokens" and out.stop_sequence is None
    prompt = srv.engine.apply_chat_template(HI)
    assert out.usage.input_tokens == len(srv.engine.tokenize(prompt)) and out.usage.output_tokens == 5


def test_system_and_block_content_reach_the_template(client: anthropic.Anthropic, srv: RunningServer) -> None:
    client.messages.create(
        model=MODEL,
        max_tokens=2,
        system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "c"},
            {"role": "user", "content": "d"},
        ],
        metadata={"user_id": "someone"},
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 40},  # not in this SDK's signature
    )
    messages, kwargs = srv.engine.template_calls[-1]
    assert messages == [
        {"role": "system", "content": "Be brief.\nBe kind."},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "c"},
        {"role": "user", "content": "d"},
    ]
    assert kwargs == {}
    sampling = srv.engine.requests[-1].sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.5, 0.9, 40)


def test_message_stream_helper(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model=MODEL, max_tokens=6, messages=HI) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == expected_text(6)
    assert [b.type for b in final.content] == ["text"] and final.content[0].text == text  # type: ignore[union-attr]
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 6
    assert final.usage.input_tokens > 0


def test_message_stream_true_event_sequence(client: anthropic.Anthropic) -> None:
    events = list(client.messages.create(model=MODEL, max_tokens=3, messages=HI, stream=True))
    kinds = [e.type for e in events]
    assert kinds == ["message_start", "content_block_start"] + ["content_block_delta"] * 3 + [
        "content_block_stop", "message_delta", "message_stop"]  # fmt: skip
    start: Any = events[0]
    assert start.message.id.startswith("msg_") and start.message.content == []
    assert start.message.stop_reason is None
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == expected_text(3)  # type: ignore[union-attr]
    delta: Any = events[-2]
    assert delta.delta.stop_reason == "max_tokens" and delta.usage.output_tokens == 3


def test_stream_wire_format_has_event_lines_and_a_ping(srv: RunningServer) -> None:
    response = post(srv, "/v1/messages", {"model": MODEL, "max_tokens": 2, "messages": HI, "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream"
    events = sse_events(response.content)
    assert [name for name, _ in events][:2] == ["message_start", "ping"]
    assert events[-1] == ("message_stop", {"type": "message_stop"})
    assert b"[DONE]" not in response.content


def test_stop_sequences(client: anthropic.Anthropic) -> None:
    out = client.messages.create(model=MODEL, max_tokens=50, messages=HI, stop_sequences=["zzz", "fox"])
    assert out.content[0].text == "Hello, world! The quick brown "  # type: ignore[union-attr]
    assert out.stop_reason == "stop_sequence" and out.stop_sequence == "fox"
    with client.messages.stream(model=MODEL, max_tokens=50, messages=HI, stop_sequences=["fox"]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hello, world! The quick brown "
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == "fox"


def test_end_turn() -> None:
    running = RunningServer(FakeEngine(script="All done.", script_piece=4))
    try:
        out = sdk(running).messages.create(model=MODEL, max_tokens=50, messages=HI)
        assert out.content[0].text == "All done." and out.stop_reason == "end_turn"  # type: ignore[union-attr]
        assert out.usage.output_tokens == 3
    finally:
        running.stop()


# ---- tools and thinking


@pytest.fixture(scope="module")
def tools_srv() -> Iterator[RunningServer]:
    running = RunningServer(FakeEngine(script=CALL, script_piece=2))
    yield running
    running.stop()


def test_tool_round_trip(tools_srv: RunningServer) -> None:
    client = sdk(tools_srv)
    question: Any = {"role": "user", "content": "What time is it?"}
    out = client.messages.create(model=MODEL, max_tokens=200, messages=[question], tools=[TOOL])
    assert out.stop_reason == "tool_use"
    text, use = out.content
    assert text.type == "text" and text.text == "Checking.\n"
    assert use.type == "tool_use" and use.name == "get_time" and use.input == {"tz": "UTC"}
    assert use.id.startswith("toolu_")
    _, kwargs = tools_srv.engine.template_calls[-1]
    assert kwargs["tools"][0]["function"]["name"] == "get_time"
    assert tools_srv.engine.requests[-1].grammar is None  # auto: the model decides

    answer: Any = [
        question,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in out.content]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "12:00"}]},
            {"type": "text", "text": "Thanks."},
        ]},
    ]  # fmt: skip
    client.messages.create(model=MODEL, max_tokens=200, messages=answer, tools=[TOOL])
    messages, _ = tools_srv.engine.template_calls[-1]
    assert messages[1:] == [
        {"role": "assistant", "content": "Checking.\n", "tool_calls": [
            {"id": use.id, "type": "function", "function": {"name": "get_time", "arguments": '{"tz":"UTC"}'}}]},
        {"role": "tool", "tool_call_id": use.id, "content": "12:00"},
        {"role": "user", "content": "Thanks."},
    ]  # fmt: skip


def test_tool_use_streamed(tools_srv: RunningServer) -> None:
    client = sdk(tools_srv)
    with client.messages.stream(model=MODEL, max_tokens=200, messages=HI, tools=[TOOL]) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["text", "tool_use"]
    use: Any = final.content[1]
    assert use.name == "get_time" and use.input == {"tz": "UTC"}
    json_deltas = [
        e for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert len(json_deltas) > 2 and all(e.index == 1 for e in json_deltas)  # type: ignore[union-attr]


def test_tool_choice_maps_onto_the_chat_path(tools_srv: RunningServer) -> None:
    client = sdk(tools_srv)
    for choice, forced in (({"type": "any"}, True), ({"type": "tool", "name": "get_time"}, True),
                           ({"type": "auto"}, False)):  # fmt: skip
        client.messages.create(model=MODEL, max_tokens=200, messages=HI, tools=[TOOL], tool_choice=choice)  # type: ignore[arg-type]
        assert (tools_srv.engine.requests[-1].grammar is not None) == forced, choice
    out = client.messages.create(
        model=MODEL, max_tokens=200, messages=HI, tools=[TOOL], tool_choice={"type": "none"}
    )
    assert out.stop_reason == "end_turn" and out.content[0].type == "text"
    assert "tools" not in tools_srv.engine.template_calls[-1][1]


def test_thinking_blocks() -> None:
    running = RunningServer(FakeEngine(script="<think>Greeting.</think>\nHi!", script_piece=3))
    try:
        client = sdk(running)
        thinking: Any = {"type": "enabled", "budget_tokens": 1024}
        out = client.messages.create(model=MODEL, max_tokens=50, messages=HI, thinking=thinking)
        assert [b.to_dict() for b in out.content] == [
            {"type": "thinking", "thinking": "Greeting.", "signature": ""},
            {"type": "text", "text": "Hi!"},
        ]
        assert running.engine.template_calls[-1][1] == {"enable_thinking": True}
        with client.messages.stream(model=MODEL, max_tokens=50, messages=HI) as stream:
            final = stream.get_final_message()
        assert [b.to_dict() for b in final.content] == [b.to_dict() for b in out.content]
        assert running.engine.template_calls[-1][1] == {}
        client.messages.create(model=MODEL, max_tokens=50, messages=HI, thinking={"type": "disabled"})
        assert running.engine.template_calls[-1][1] == {"enable_thinking": False}
    finally:
        running.stop()


# ---- count_tokens


def test_count_tokens_matches_the_prompt(client: anthropic.Anthropic, srv: RunningServer) -> None:
    body: Any = {"system": "Be brief.", "messages": [{"role": "user", "content": "What time is it?"}]}
    counted = client.messages.count_tokens(model=MODEL, **body)
    out = client.messages.create(model=MODEL, max_tokens=1, **body)
    assert counted.input_tokens == out.usage.input_tokens
    prompt = srv.engine.apply_chat_template([{"role": "system", "content": "Be brief."}, *body["messages"]])
    assert counted.input_tokens == len(srv.engine.tokenize(prompt))
    with_tools = client.messages.count_tokens(model=MODEL, tools=[TOOL], **body)
    assert with_tools.input_tokens == counted.input_tokens  # the fake template ignores tools
    assert srv.engine.template_calls[-1][1]["tools"][0]["function"]["name"] == "get_time"


# ---- errors and authentication


def test_missing_max_tokens_is_an_anthropic_400(srv: RunningServer) -> None:
    response = post(srv, "/v1/messages", {"model": MODEL, "messages": HI})
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"] and set(body["error"]) == {"type", "message"}
    counted = post(srv, "/v1/messages/count_tokens", {"model": MODEL, "messages": HI})
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0


@pytest.mark.parametrize(
    ("body", "status", "kind"),
    [
        (b"{not json", 400, "invalid_request_error"),
        ({"model": MODEL, "max_tokens": 5, "messages": []}, 400, "invalid_request_error"),
        ({"model": MODEL, "max_tokens": 0, "messages": HI}, 400, "invalid_request_error"),
        (
            {"model": MODEL, "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
            400,
            "invalid_request_error",
        ),
        ({"model": "claude-nope", "max_tokens": 5, "messages": HI}, 404, "not_found_error"),
    ],
)
def test_error_shapes(srv: RunningServer, body: Any, status: int, kind: str) -> None:
    url = f"http://127.0.0.1:{srv.port}/v1/messages"
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    response = httpx2.post(url, content=content, timeout=10)
    assert response.status_code == status
    assert response.json() == {
        "type": "error",
        "error": {"type": kind, "message": response.json()["error"]["message"]},
    }


def test_sdk_raises_its_own_errors(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="claude-nope", max_tokens=5, messages=HI)
    assert caught.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL, max_tokens=5, messages=HI, tool_choice={"type": "any"})


def test_unknown_path_under_messages_is_an_anthropic_404(srv: RunningServer) -> None:
    response = post(srv, "/v1/messages/batches", {})
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"
    openai_404 = post(srv, "/v1/nothing", {})
    assert openai_404.status_code == 404 and "param" in openai_404.json()["error"]


def test_queue_full_is_429_and_mid_stream_failure_is_an_error_event() -> None:
    running = RunningServer(FakeEngine(queue_full=True))
    try:
        response = post(running, "/v1/messages", {"model": MODEL, "max_tokens": 5, "messages": HI})
        assert response.status_code == 429 and response.headers["retry-after"] == "1"
        assert response.json()["error"]["type"] == "rate_limit_error"
    finally:
        running.stop()
    running = RunningServer(FakeEngine(fail_after=2))
    try:
        body = {"model": MODEL, "max_tokens": 5, "messages": HI, "stream": True}
        events = sse_events(post(running, "/v1/messages", body).content)
        assert events[-1] == ("error", {"type": "error", "error": {
            "type": "api_error", "message": "The server had an internal error while processing the request."}})  # fmt: skip
        with pytest.raises(anthropic.APIStatusError, match="api_error"):
            list(sdk(running).messages.create(model=MODEL, max_tokens=5, messages=HI, stream=True))
    finally:
        running.stop()


def test_api_key_as_bearer_or_x_api_key() -> None:
    running = RunningServer(FakeEngine(), api_key="sekrit")
    try:
        body = {"model": MODEL, "max_tokens": 2, "messages": HI}
        assert sdk(running, api_key="sekrit").messages.create(**body).stop_reason == "max_tokens"  # type: ignore[arg-type]
        assert post(running, "/v1/messages", body, **{"x-api-key": "sekrit"}).status_code == 200
        header_client = sdk(running, api_key=None, default_headers={"x-api-key": "sekrit"})
        assert header_client.messages.count_tokens(model=MODEL, messages=HI).input_tokens > 0
        assert post(running, "/v1/chat/completions", body, **{"x-api-key": "sekrit"}).status_code == 200
        with pytest.raises(anthropic.AuthenticationError) as caught:
            sdk(running, api_key="wrong").messages.create(**body)  # type: ignore[arg-type]
        assert caught.value.body == {"type": "error", "error": {
            "type": "authentication_error", "message": "Incorrect API key provided."}}  # fmt: skip
        missing = post(running, "/v1/messages", body, **{"anthropic-version": "2023-06-01"})
        assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
        openai_401 = post(running, "/v1/chat/completions", body, **{"x-api-key": "wrong"})
        assert openai_401.status_code == 401 and openai_401.json()["error"]["code"] is not None
    finally:
        running.stop()


# ---- disconnects and discovery


def test_disconnect_mid_stream_aborts_the_generation() -> None:
    running = RunningServer(FakeEngine(token_delay=0.02))
    try:
        body = orjson.dumps({"model": MODEL, "max_tokens": 500, "messages": HI, "stream": True})
        with running.connect() as sock:
            sock.sendall(
                b"POST /v1/messages HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            assert b"content_block_delta" in _read_until(sock, b"content_block_delta")
        for _ in range(200):
            if running.engine.aborts:
                break
            time.sleep(0.01)
        assert len(running.engine.aborts) == 1 and not running.engine.completed
    finally:
        running.stop()


def test_props_lists_the_endpoints(srv: RunningServer) -> None:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as sock:
        sock.sendall(b"GET /props HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        status, _, body = read_response(sock.makefile("rb"))
    endpoints = orjson.loads(body)["endpoints"]
    assert status == 200
    assert {"POST /v1/messages", "POST /v1/messages/count_tokens", "POST /v1/chat/completions"} <= set(
        endpoints
    )


def _read_until(sock: socket.socket, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data
