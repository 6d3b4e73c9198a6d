"""Operator endpoints with the fake engine: /metrics parsed with Prometheus' own parser (and moving
as requests are served), /tokenize, /detokenize, /apply-template, /props, and the chat page."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from importlib.metadata import version

import pytest
from prometheus_client.parser import text_string_to_metric_families

import zinc
from tests.fakes import BOS, FakeEngine
from tests.serving import ServerThread

pytestmark = pytest.mark.e2e
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def srv() -> Iterator[ServerThread]:
    server = ServerThread(FakeEngine(token_delay=0.002), parallel=1)
    yield server
    server.stop()


def scrape(srv: ServerThread) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = srv.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_parse_and_move_as_requests_are_served(srv: ServerThread) -> None:
    before = scrape(srv)
    for name in ("zinc_requests_running", "zinc_requests_queued", "zinc_kv_cache_tokens",
                 "zinc_kv_cache_capacity_tokens", "zinc_kv_cache_reserved_bytes", "zinc_model_loading"):  # fmt: skip
        assert (name, ()) in before, name
    assert value(before, "zinc_model_loaded", model="fake-model") == 1
    assert value(before, "zinc_kv_cache_capacity_tokens") == 64 * 16  # the fake's KV pages
    for stream in (False, True):
        r = srv.post("/v1/chat/completions", {"messages": HI, "max_tokens": 5, "stream": stream})
        assert r.status_code == 200
    assert srv.post("/v1/completions", {"prompt": "x", "max_tokens": 4, "model": "nope"}).status_code == 404
    after = scrape(srv)
    chat = {"method": "POST", "route": "/v1/chat/completions", "status": "200"}
    assert (
        value(after, "zinc_http_requests_total", **chat) - value(before, "zinc_http_requests_total", **chat)
        == 2
    )
    assert value(after, "zinc_http_requests_total", method="POST", route="/v1/completions", status="404") == 1
    assert value(after, "zinc_http_requests_total", method="GET", route="/metrics", status="200") >= 1
    assert value(after, "zinc_generated_tokens_total") - value(before, "zinc_generated_tokens_total") == 10
    assert value(after, "zinc_prompt_tokens_total") > value(before, "zinc_prompt_tokens_total")
    assert value(after, "zinc_generations_total", finish_reason="length") == 2
    assert value(after, "zinc_time_to_first_token_seconds_count") == 2
    assert value(after, "zinc_time_per_output_token_seconds_count") == 8  # 4 gaps in each of 2 answers
    assert value(after, "zinc_time_to_first_token_seconds_sum") > 0


def test_queue_depth_and_aborts_show_in_metrics(srv: ServerThread) -> None:
    seen_queue = threading.Event()

    def long_request() -> None:
        with srv.http.stream(
            "POST", "/v1/completions", json={"prompt": "x", "max_tokens": 5000, "stream": True}
        ) as r:
            for _ in r.iter_bytes():
                seen_queue.wait(10)
                break  # hang up mid-stream

    first = threading.Thread(target=long_request)
    first.start()
    queued = threading.Thread(target=lambda: srv.post("/v1/completions", {"prompt": "y", "max_tokens": 2}))
    deadline = time.monotonic() + 5
    while value(scrape(srv), "zinc_requests_running") < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    queued.start()
    depth = 0.0
    while depth < 1 and time.monotonic() < deadline:
        depth = value(scrape(srv), "zinc_requests_queued")
    seen_queue.set()
    assert depth == 1
    first.join(10)
    queued.join(10)
    after = scrape(srv)
    assert value(after, "zinc_generations_total", finish_reason="aborted") == 1
    assert value(after, "zinc_requests_queued") == 0 and value(after, "zinc_requests_running") == 0


def test_tokenize_and_detokenize(srv: ServerThread) -> None:
    r = srv.post("/tokenize", {"content": "hi"})
    assert r.json() == {"tokens": [104, 105]}
    assert srv.post("/tokenize", {"content": "hi", "add_special": True}).json() == {"tokens": [BOS, 104, 105]}
    pieces = srv.post("/tokenize", {"content": "hi", "with_pieces": True}).json()
    assert pieces == {"tokens": [{"id": 104, "piece": "h"}, {"id": 105, "piece": "i"}]}
    assert srv.post("/detokenize", {"tokens": [104, 105]}).json() == {"content": "hi"}
    for bad, param in (({"content": 5}, "content"), ({"content": "x", "add_special": "yes"}, "add_special")):
        r = srv.post("/tokenize", bad)
        assert r.status_code == 400 and r.json()["error"]["param"] == param
    r = srv.post("/detokenize", {"tokens": [1, "a"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"


def test_apply_template_and_props(srv: ServerThread) -> None:
    r = srv.post("/apply-template", {"messages": HI})
    assert r.json() == {"prompt": "<|user|>hi\n<|assistant|>"}
    assert srv.post("/apply-template", {}).status_code == 400
    props = srv.get("/props").json()
    assert props["default_generation_settings"]["n_ctx"] == 512
    assert props["total_slots"] == 1 and props["model_alias"] == "fake-model"
    assert props["modalities"] == {"vision": False, "audio": False}
    # the version zinc reports is the installed distribution's (pyproject reads it from zinc.__version__)
    assert props["build_info"] == f"zinc {version('zinc-llm')}" == f"zinc {zinc.__version__}"


def test_chat_page_is_served_at_root_and_chat(srv: ServerThread) -> None:
    for path in ("/", "/chat"):
        r = srv.get(path)
        assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=utf-8"
        assert (
            r.headers["connection"] == "close"
            and "connect-src 'self'" in r.headers["content-security-policy"]
        )
        assert "<title>zinc chat</title>" in r.text and "/v1/chat/completions" in r.text


def test_ui_is_public_but_the_api_and_metrics_need_the_key() -> None:
    srv = ServerThread(FakeEngine(), api_key="sekret")
    try:
        assert srv.get("/").status_code == 200 and srv.get("/health").status_code == 200
        assert srv.get("/metrics").status_code == 401 and srv.get("/v1/models").status_code == 401
        assert srv.post("/tokenize", {"content": "x"}).status_code == 401
        ok = srv.http.get("/metrics", headers={"authorization": "Bearer sekret"})
        assert ok.status_code == 200
    finally:
        srv.stop()
