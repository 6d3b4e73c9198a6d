"""Prometheus metrics for `GET /metrics`, one registry per server.

Owns: `ServerMetrics`: counters of HTTP requests (by method, route and status), prompt and
generated tokens and finished generations (by finish reason: stop, length, aborted, error);
prompt tokens the prefix cache served, and their share (`zinc_prefix_cache_hit_ratio`);
histograms of time to first token (from the generate call, so queueing counts) and time per
output token; and gauges read at scrape time: requests running and queued, the KV cache (bytes
reserved and in use, positions in use and capacity, pages by state, the page size, sessions
holding pages), KV-cache utilization, whether the server is draining, and the loaded model. It observes generations as an `EngineManager` observer
and requests by wrapping the router. The two per-token metrics (generated tokens, time per output
token) are plain counts that only the event loop updates (`_TokenTally`), read at scrape time:
prometheus_client's locked counters and its Python loop over a histogram's buckets cost the event
loop a few microseconds a token. Unknown paths are counted under route "other" so the label
set stays small.
Imports: zinc.engine.{manager, types}, zinc.server.exchange, prometheus_client, the stdlib.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from zinc.engine.manager import EngineManager, close_events
from zinc.engine.types import EngineStats, GenerationRequest, TextDelta
from zinc.server.exchange import Exchange, HttpRequest

Handler = Callable[[HttpRequest, Exchange], Awaitable[None]]

CONTENT_TYPE = CONTENT_TYPE_LATEST
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _StateCollector(Collector):
    """Gauges computed from the engine's state when Prometheus scrapes."""

    def __init__(
        self, manager: EngineManager, waiting: Callable[[], int], draining: Callable[[], bool]
    ) -> None:
        self._manager = manager
        self._waiting = waiting
        self._draining = draining

    def collect(self) -> Iterator[Metric]:
        stats = self._manager.stats()
        yield GaugeMetricFamily(
            "zinc_requests_running", "Generations running now.", value=stats.active_requests
        )
        yield GaugeMetricFamily(
            "zinc_requests_queued",
            "Requests waiting for a generation slot (queue depth).",
            value=stats.queued_requests + self._waiting(),
        )
        yield GaugeMetricFamily(
            "zinc_kv_cache_reserved_bytes", "KV cache bytes allocated on the device.",
            value=stats.context_reserved_bytes,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "zinc_kv_cache_used_bytes",
            "KV cache bytes holding live positions.",
            value=stats.context_active_bytes,
        )
        yield GaugeMetricFamily(
            "zinc_kv_cache_tokens", "KV cache positions in use.", value=stats.context_tokens
        )
        yield GaugeMetricFamily(
            "zinc_kv_cache_capacity_tokens", "KV cache positions in all.", value=stats.kv_capacity_tokens
        )
        yield from _page_gauges(stats)
        yield GaugeMetricFamily(
            "zinc_kv_cache_utilization",
            "Share of KV cache pages held by requests or sessions (0..1).",
            value=stats.kv_pages_in_use / stats.kv_pages_total if stats.kv_pages_total else 0.0,
        )
        yield GaugeMetricFamily(
            "zinc_draining", "1 after SIGTERM while /health says 503 and requests finish.",
            value=int(self._draining()),
        )  # fmt: skip
        yield GaugeMetricFamily(
            "zinc_model_weights_bytes", "Weight bytes of the loaded model.", value=stats.weights_bytes
        )
        loaded = GaugeMetricFamily("zinc_model_loaded", "1 for the model being served.", labels=["model"])
        if self._manager.model_id:
            loaded.add_metric([self._manager.model_id], 1)
        yield loaded
        yield GaugeMetricFamily(
            "zinc_model_loading",
            "1 while a model is being loaded.",
            value=int(self._manager.loading is not None),
        )


def _page_gauges(stats: EngineStats) -> Iterator[Metric]:
    """The paged KV cache: pages by state, the page size, and sessions keeping pages."""
    pages = GaugeMetricFamily(
        "zinc_kv_cache_pages",
        "KV cache pages: used (held by requests or sessions), cached (a reusable prefix, evictable), free.",
        labels=["state"],
    )
    for state, count in (
        ("used", stats.kv_pages_in_use),
        ("cached", stats.kv_pages_cached),
        ("free", stats.kv_pages_free),
    ):
        pages.add_metric([state], count)
    yield pages
    yield GaugeMetricFamily(
        "zinc_kv_cache_page_size_tokens", "Positions per KV cache page.", value=stats.kv_page_size
    )
    yield GaugeMetricFamily(
        "zinc_sessions_active", "Sessions keeping KV pages between requests.", value=stats.sessions
    )


class _TokenTally(Collector):
    """Generated tokens and the time per output token: counts the event loop alone updates."""

    def __init__(self) -> None:
        self.tokens = 0
        self.gaps = [0] * (len(TPOT_BUCKETS) + 1)  # gaps per bucket (le bound inclusive), then +Inf
        self.gap_sum = 0.0

    def gap(self, seconds: float, n: int) -> None:
        """`n` tokens that came `seconds` apart each."""
        self.gaps[bisect_left(TPOT_BUCKETS, seconds)] += n
        self.gap_sum += seconds * n

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily("zinc_generated_tokens", "Tokens generated.", value=self.tokens)
        buckets, total = [], 0
        for bound, count in zip((*map(str, TPOT_BUCKETS), "+Inf"), self.gaps, strict=True):
            total += count
            buckets.append((bound, total))
        yield HistogramMetricFamily(
            "zinc_time_per_output_token_seconds", "Time between generated tokens.",
            buckets=buckets, sum_value=self.gap_sum,
        )  # fmt: skip


class _HitRatio(Collector):
    """The prefix cache's hit rate since start: cached over all prompt tokens of finished generations (an
    endpoint picker reads one gauge; Prometheus can also divide the two counters' rates)."""

    def __init__(self) -> None:
        self.prompt = 0  # prompt tokens of finished generations
        self.cached = 0  # of which the prefix cache served

    def collect(self) -> Iterator[Metric]:
        ratio = self.cached / self.prompt if self.prompt else 0.0
        yield GaugeMetricFamily(
            "zinc_prefix_cache_hit_ratio", "Prompt tokens served from the prefix cache, since start (0..1).",
            value=min(1.0, ratio),
        )  # fmt: skip


class ServerMetrics:
    """The server's metrics registry and the hooks that feed it."""

    def __init__(
        self, manager: EngineManager, waiting: Callable[[], int], draining: Callable[[], bool] = lambda: False
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "zinc_http_requests", "HTTP requests answered.", ["method", "route", "status"], registry=r
        )
        self.prompt_tokens = Counter(
            "zinc_prompt_tokens", "Prompt tokens of started generations.", registry=r
        )
        self.cached_tokens = Counter(
            "zinc_prompt_cached_tokens",
            "Prompt tokens of finished generations whose KV rows came from the prefix cache.",
            registry=r,
        )
        self.hits = _HitRatio()
        r.register(self.hits)
        self.generations = Counter(
            "zinc_generations", "Generations finished, by finish reason.", ["finish_reason"], registry=r
        )
        self.ttft = Histogram(
            "zinc_time_to_first_token_seconds", "From the generate call to the first token.",
            buckets=TTFT_BUCKETS, registry=r,
        )  # fmt: skip
        self.tally = _TokenTally()
        r.register(self.tally)
        r.register(_StateCollector(manager, waiting, draining))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # ---- generations (an EngineManager observer)

    def observe(
        self, request: GenerationRequest, events: AsyncIterator[TextDelta]
    ) -> AsyncIterator[TextDelta]:
        return self._observe(request, events)

    async def _observe(
        self, request: GenerationRequest, events: AsyncIterator[TextDelta]
    ) -> AsyncIterator[TextDelta]:
        start = last = time.perf_counter()
        counted = 0
        outcome = "aborted"
        tally = self.tally
        self.prompt_tokens.inc(len(request.prompt_ids))
        try:
            async for delta in events:
                n = len(delta.token_ids)
                if n:
                    now = time.perf_counter()
                    if counted == 0:
                        self.ttft.observe(now - start)
                    else:
                        tally.gap((now - last) / n, n)
                    last = now
                    counted += n
                    tally.tokens += n
                if delta.finish_reason is not None:
                    outcome = delta.finish_reason
                    if delta.usage is not None:
                        self.cached_tokens.inc(delta.usage.cached_tokens)
                        self.hits.prompt += delta.usage.prompt_tokens
                        self.hits.cached += delta.usage.cached_tokens
                        tally.tokens += max(0, delta.usage.completion_tokens - counted)
                yield delta
        except Exception:
            outcome = "error"
            raise
        finally:
            self.generations.labels(outcome).inc()
            await close_events(events)

    # ---- requests (wrapping the router)

    def instrument(self, handler: Handler, routes: Collection[str]) -> Handler:
        known = frozenset(routes)

        async def counted(request: HttpRequest, exchange: Exchange) -> None:
            try:
                await handler(request, exchange)
            finally:
                route = request.path if request.path in known else "other"
                status = str(exchange.status) if exchange.status is not None else "none"
                self.requests.labels(request.method, route, status).inc()

        return counted
