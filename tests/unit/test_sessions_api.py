"""Sessions and the paged KV cache as the API shows them, over the fake engine.

`session_id` reaches the engine from both endpoints, a follow-up turn's reused prompt tokens come
back as `usage.prompt_tokens_details.cached_tokens` (whole and streamed), `DELETE
/v1/sessions/{id}` answers 200 then 404 in the error envelope, and `/health`, `/v1/models` and
`/metrics` report the KV cache in pages, with byte and position figures that agree with them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes import FakeEngine, async_test
from tests.unit.test_openai_api import CHAT, TEXT, Client, assert_error
from zinc.engine.manager import EngineManager
from zinc.engine.types import EngineStats
from zinc.server.metrics import ServerMetrics
from zinc.server.models_api import memory_fields

TURN_1 = [{"role": "user", "content": "Name a river."}]
TURN_2 = [*TURN_1, {"role": "assistant", "content": "The Rhine."}, {"role": "user", "content": "How long?"}]


def usage_of(response: Any) -> dict[str, Any]:
    if response.chunked:
        chunks = [orjson.loads(e) for e in response.events()[:-1]]
        usage: dict[str, Any] = chunks[-1]["usage"]
        return usage
    whole: dict[str, Any] = response.json()["usage"]
    return whole


@async_test
async def test_session_id_reaches_the_engine_from_both_endpoints() -> None:
    client = Client()
    assert (await client.chat(max_tokens=1, session_id="chat-1")).status == 200
    assert (await client.text(max_tokens=1, session_id="text-1")).status == 200
    assert (await client.chat(max_tokens=1, session_id="")).status == 200  # empty: stateless
    assert (await client.text(max_tokens=1)).status == 200
    assert [r.session_id for r in client.engine.requests] == ["chat-1", "text-1", None, None]
    assert set(client.engine.sessions) == {"chat-1", "text-1"}


@pytest.mark.parametrize("value", [7, ["a"], {"id": "a"}, True])
@async_test
async def test_a_session_id_that_is_not_a_string_is_400(value: Any) -> None:
    client = Client()
    assert_error(await client.chat(session_id=value), 400, param="session_id")
    assert_error(await client.text(session_id=value), 400, param="session_id")
    assert client.engine.requests == []


@pytest.mark.parametrize("stream", [False, True])
@async_test
async def test_a_follow_up_turn_reports_its_cached_prompt_tokens(stream: bool) -> None:
    client = Client()
    extra: dict[str, Any] = {"stream": stream, "stream_options": {"include_usage": True}} if stream else {}
    first = await client.call("POST", CHAT, {"messages": TURN_1, "max_tokens": 2, "session_id": "s", **extra})
    assert usage_of(first)["prompt_tokens_details"] == {"cached_tokens": 0}
    again = await client.call("POST", CHAT, {"messages": TURN_2, "max_tokens": 2, "session_id": "s", **extra})
    usage = usage_of(again)
    before, now = (list(r.prompt_ids) for r in client.engine.requests)
    assert now[: len(before)] == before  # the chat template renders an append-only history
    shared = len(before)
    assert 0 < shared == usage["prompt_tokens_details"]["cached_tokens"] < usage["prompt_tokens"] == len(now)
    plain = await client.call("POST", CHAT, {"messages": TURN_2, "max_tokens": 2, **extra})  # no session
    assert usage_of(plain)["prompt_tokens_details"] == {"cached_tokens": 0}


@async_test
async def test_delete_session_is_200_then_404() -> None:
    client = Client()
    await client.chat(max_tokens=1, session_id="chat 7")
    health = (await client.call("GET", "/health")).json()
    assert health["active_sessions"] == 1 and health["kv_cache"]["used_pages"] == 1
    deleted = await client.call("DELETE", "/v1/sessions/chat%207")
    assert deleted.status == 200 and deleted.headers["content-type"] == "application/json"
    assert deleted.json() == {"id": "chat 7", "object": "session", "deleted": True}
    assert client.engine.sessions == {}
    assert (await client.call("GET", "/health")).json()["active_sessions"] == 0
    again = await client.call("DELETE", "/v1/sessions/chat%207")
    assert_error(again, 404, code="not_found")
    assert (
        again.json()["error"]["type"] == "invalid_request_error"
        and "chat 7" in again.json()["error"]["message"]
    )
    assert_error(await client.call("DELETE", "/sessions/never"), 404, code="not_found")
    assert_error(await client.call("DELETE", "/v1/sessions/"), 404, code="not_found")
    wrong = await client.call("GET", "/v1/sessions/chat%207")
    assert_error(wrong, 405)
    assert wrong.headers["allow"] == "DELETE, OPTIONS"


@async_test
async def test_delete_session_needs_the_api_key() -> None:
    client = Client(api_key="k")
    assert_error(await client.call("DELETE", "/v1/sessions/x"), 401)
    ok = await client.call("DELETE", "/v1/sessions/x", headers={"Authorization": "Bearer k"})
    assert_error(ok, 404, code="not_found")


@async_test
async def test_health_reports_the_kv_cache_in_pages() -> None:
    client = Client()
    for sid in ("a", "b", "c"):
        await client.chat(max_tokens=1, session_id=sid)
    health = (await client.call("GET", "/health")).json()
    assert health["active_sessions"] == 3 and health["queued_requests"] == 0
    assert health["kv_cache"] == {
        "page_size": 16, "total_pages": 64, "used_pages": 3, "cached_pages": 0, "free_pages": 61,
        "utilization": round(3 / 64, 4),
    }  # fmt: skip
    assert health["gpu_context_capacity_tokens"] == 64 * 16


def paged(**fields: Any) -> EngineStats:
    base = EngineStats(
        active_requests=8, queued_requests=2, context_length=512, context_reserved_bytes=4096 * 100,
        context_tokens=3000, kv_page_size=16, kv_pages_total=256, kv_pages_in_use=187, kv_pages_cached=20,
        kv_pages_free=49, sessions=2,
    )  # fmt: skip
    return replace(base, **fields)


def test_memory_figures_follow_the_pages_not_one_context() -> None:
    stats = paged()  # 8 requests hold 3000 positions: far past one 512-position context
    assert stats.kv_capacity_tokens == 4096
    assert stats.context_active_bytes == 3000 * 100 <= stats.context_reserved_bytes
    fields = memory_fields(stats, "gpu_")
    assert fields["gpu_context_capacity_tokens"] == 4096 and fields["gpu_context_active_bytes"] == 300_000
    unpaged = EngineStats(1, 0, 512, context_reserved_bytes=512 * 10, context_tokens=128)
    assert unpaged.kv_capacity_tokens == 512 and unpaged.context_active_bytes == 1280


class _StatsEngine(FakeEngine):
    def __init__(self, stats: EngineStats) -> None:
        super().__init__()
        self._stats = stats

    def stats(self) -> EngineStats:
        return self._stats


def test_metrics_report_pages_by_state_and_sessions() -> None:
    metrics = ServerMetrics(EngineManager(_StatsEngine(paged())), lambda: 1)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }
    assert samples[("zinc_kv_cache_pages", (("state", "used"),))] == 187
    assert samples[("zinc_kv_cache_pages", (("state", "cached"),))] == 20
    assert samples[("zinc_kv_cache_pages", (("state", "free"),))] == 49
    assert samples[("zinc_kv_cache_page_size_tokens", ())] == 16
    assert samples[("zinc_sessions_active", ())] == 2
    assert samples[("zinc_kv_cache_capacity_tokens", ())] == 4096
    assert samples[("zinc_kv_cache_used_bytes", ())] == 300_000
    assert samples[("zinc_requests_queued", ())] == 3  # the engine's 2 and 1 waiting for admission


@async_test
async def test_a_full_engine_queue_is_429_even_with_a_session() -> None:
    client = Client(FakeEngine(queue_full=True))
    response = await client.call("POST", TEXT, {"prompt": "hi", "session_id": "s", "stream": True})
    assert_error(response, 429, code="queue_full")
    assert response.json()["error"]["type"] == "rate_limit_error"


@async_test
async def test_the_engine_manager_passes_sessions_through() -> None:
    fake = FakeEngine()
    fake.sessions["kept"] = [1, 2, 3]
    client = Client(EngineManager(fake))  # type: ignore[arg-type]
    assert (await client.call("GET", "/health")).json()["active_sessions"] == 1
    assert (await client.call("DELETE", "/v1/sessions/kept")).status == 200
    assert fake.sessions == {}
    assert_error(await client.call("DELETE", "/v1/sessions/kept"), 404, code="not_found")
    empty = Client(EngineManager())  # type: ignore[arg-type]
    assert_error(await empty.call("DELETE", "/v1/sessions/kept"), 404, code="not_found")
