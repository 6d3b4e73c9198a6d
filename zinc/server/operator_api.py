"""Operator endpoints, as llama.cpp's server offers them, plus health while a model loads.

Owns: `POST /tokenize` (`content`, `add_special` (default false), `parse_special` (default true),
`with_pieces`) -> `{"tokens": [...]}`; `POST /detokenize` (`tokens`) -> `{"content"}`;
`POST /apply-template` (`messages`, as chat completions take them) -> `{"prompt"}`;
`GET /props` (context size, default generation settings, slots, model alias, chat template,
modalities, the served endpoints as "METHOD /path"); `GET /metrics` (Prometheus text format);
`GET /health` (readiness), which answers 503 `{"status": "loading"}` while the first model (or
the next, after a forced removal) loads and otherwise defers to the OpenAI API's health (503
"draining" after SIGTERM); and `GET /livez` (liveness), 200 whenever the server answers at all.
Imports: zinc.engine.{manager, types}, zinc.errors, zinc.server.*, orjson, the stdlib.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from zinc import __version__
from zinc.engine.manager import EngineManager
from zinc.engine.types import SamplingParams
from zinc.errors import InvalidRequestError
from zinc.server.api import OpenAIApi
from zinc.server.config import ServerConfig
from zinc.server.exchange import Exchange, HttpRequest
from zinc.server.metrics import CONTENT_TYPE, ServerMetrics
from zinc.server.openai_request import DEFAULT_MAX_TOKENS, decode_json, parse_chat

Json = dict[str, Any]


def _flag(payload: Json, name: str, default: bool) -> bool:
    value = payload.get(name, default)
    if not isinstance(value, bool):
        raise InvalidRequestError(f"'{name}' must be a boolean.", param=name)
    return value


class OperatorApi:
    """Handlers for /health, /metrics, /props, /tokenize, /detokenize and /apply-template."""

    def __init__(
        self, manager: EngineManager, api: OpenAIApi, config: ServerConfig, metrics: ServerMetrics
    ) -> None:
        self._manager = manager
        self._api = api
        self._config = config
        self._metrics = metrics
        self._started = time.time()
        self.endpoints: tuple[str, ...] = ()  # "METHOD /path" of each route (set by extra_routes)

    async def health(self, request: HttpRequest, exchange: Exchange) -> None:
        manager = self._manager
        if manager.active is None and manager.loading is not None:
            body = {
                "status": "loading",
                "model": "none",
                "loading_model": manager.loading,
                "uptime_seconds": int(time.time() - self._started),
            }
            await exchange.respond_json(503, orjson.dumps(body), [("retry-after", "1")])
            return
        await self._api.health(request, exchange)

    async def live(self, request: HttpRequest, exchange: Exchange) -> None:
        """Liveness: the event loop answers (also while loading or draining, when /health is 503)."""
        body = {"status": "alive", "uptime_seconds": int(time.time() - self._started)}
        await exchange.respond_json(200, orjson.dumps(body))

    async def metrics(self, request: HttpRequest, exchange: Exchange) -> None:
        await exchange.respond(200, [("content-type", CONTENT_TYPE)], self._metrics.render())

    async def tokenize(self, request: HttpRequest, exchange: Exchange) -> None:
        payload = decode_json(await exchange.body())
        content = payload.get("content")
        if not isinstance(content, str):
            raise InvalidRequestError("'content' must be a string.", param="content")
        add_special = _flag(payload, "add_special", False)
        parse_special = _flag(payload, "parse_special", True)
        with_pieces = _flag(payload, "with_pieces", False)
        engine = self._manager
        ids = engine.tokenize(content, add_special=add_special, parse_special=parse_special)
        tokens: list[Any] = ids
        if with_pieces:
            tokens = [{"id": i, "piece": engine.detokenize([i])} for i in ids]
        await exchange.respond_json(200, orjson.dumps({"tokens": tokens}))

    async def detokenize(self, request: HttpRequest, exchange: Exchange) -> None:
        payload = decode_json(await exchange.body())
        tokens = payload.get("tokens")
        if not isinstance(tokens, list) or not all(type(t) is int and t >= 0 for t in tokens):
            raise InvalidRequestError("'tokens' must be an array of token ids.", param="tokens")
        try:
            content = self._manager.detokenize(tokens)
        except (IndexError, KeyError, ValueError, OverflowError):
            raise InvalidRequestError("'tokens' has an id outside the vocabulary.", param="tokens") from None
        await exchange.respond_json(200, orjson.dumps({"content": content}))

    async def apply_template(self, request: HttpRequest, exchange: Exchange) -> None:
        params = parse_chat(decode_json(await exchange.body()))
        prompt = self._manager.apply_chat_template(
            list(params.messages), add_generation_prompt=True, **params.template_kwargs
        )
        await exchange.respond_json(200, orjson.dumps({"prompt": prompt}))

    async def props(self, request: HttpRequest, exchange: Exchange) -> None:
        manager = self._manager
        engine = manager.active
        defaults = SamplingParams()
        template = getattr(getattr(engine, "chat", None), "source", None)
        body = {
            "default_generation_settings": {
                "n_ctx": engine.context_length if engine is not None else 0,
                "params": {
                    "max_tokens": DEFAULT_MAX_TOKENS,
                    "temperature": defaults.temperature,
                    "top_p": defaults.top_p,
                    "top_k": defaults.top_k,
                    "min_p": defaults.min_p,
                    "seed": -1 if defaults.seed is None else defaults.seed,
                    "presence_penalty": defaults.presence_penalty,
                    "frequency_penalty": defaults.frequency_penalty,
                    "repeat_penalty": defaults.repeat_penalty,
                },
            },
            "total_slots": self._config.parallel,
            "model_alias": manager.model_id or None,
            "model_path": manager.model_id or None,
            "chat_template": template if isinstance(template, str) else "",
            "modalities": {"vision": False, "audio": False},
            "build_info": f"zinc {__version__}",
            "is_sleeping": False,
            "loading_model": manager.loading,
            "device": manager.stats().device,
            "endpoints": list(self.endpoints),
        }
        await exchange.respond_json(200, orjson.dumps(body))
