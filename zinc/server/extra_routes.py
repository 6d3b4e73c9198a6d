"""The routes beyond the core OpenAI ones: the OpenAI Responses API, the Anthropic Messages API,
OpenAI's embeddings, llama.cpp's /infill, model management, operator endpoints and the chat UI.

Owns: `extra_routes()`, the table the router merges over its own (same path: this one wins), and
which of these paths are public; `/props` lists the table's endpoints. Every route that uses the
model (chat, completions, responses, messages, count_tokens, embeddings, tokenize, detokenize,
apply-template) runs inside `EngineManager.scope()`, so a model swap waits for it and it never
sees two models.
Imports: zinc.engine.manager, zinc.server.{anthropic_api, api, config, embeddings_api, exchange, infill_api, metrics,
models_api, operator_api, responses_api, routes, ui}, the stdlib.
"""

from __future__ import annotations

from zinc.engine.manager import EngineManager
from zinc.server.anthropic_api import AnthropicApi
from zinc.server.api import OpenAIApi
from zinc.server.config import ServerConfig
from zinc.server.embeddings_api import EmbeddingsApi
from zinc.server.exchange import Exchange, HttpRequest
from zinc.server.infill_api import InfillApi
from zinc.server.metrics import ServerMetrics
from zinc.server.models_api import ModelsApi
from zinc.server.operator_api import OperatorApi
from zinc.server.responses_api import ResponsesApi
from zinc.server.routes import Route
from zinc.server.ui import chat_page

RouteTable = dict[str, dict[str, Route]]
PUBLIC = frozenset({"/", "/chat", "/health", "/v1/health", "/livez"})


def scoped(manager: EngineManager, route: Route) -> Route:
    async def run(request: HttpRequest, exchange: Exchange) -> None:
        async with manager.scope():
            await route(request, exchange)

    return run


def extra_routes(
    manager: EngineManager, api: OpenAIApi, config: ServerConfig, metrics: ServerMetrics
) -> RouteTable:
    models = ModelsApi(manager)
    ops = OperatorApi(manager, api, config, metrics)
    anthropic = AnthropicApi(api)
    responses = ResponsesApi(api)
    infill = InfillApi(api)
    embeddings = EmbeddingsApi(api)
    table: RouteTable = {
        "/v1/chat/completions": {"POST": scoped(manager, api.chat_completions)},
        "/v1/completions": {"POST": scoped(manager, api.completions)},
        "/v1/responses": {"POST": scoped(manager, responses.create)},
        "/v1/messages": {"POST": scoped(manager, anthropic.messages)},
        "/v1/messages/count_tokens": {"POST": scoped(manager, anthropic.count_tokens)},
        "/v1/embeddings": {"POST": scoped(manager, embeddings.create)},
        "/v1/models": {"GET": models.list},
        "/v1/models/pull": {"POST": models.pull},
        "/v1/models/activate": {"POST": models.activate},
        "/v1/models/remove": {"POST": models.remove},
        "/v1/health": {"GET": ops.health},
        "/v1/metrics": {"GET": ops.metrics},
        "/livez": {"GET": ops.live},
        "/infill": {"POST": scoped(manager, infill.infill)},
        "/tokenize": {"POST": scoped(manager, ops.tokenize)},
        "/detokenize": {"POST": scoped(manager, ops.detokenize)},
        "/apply-template": {"POST": scoped(manager, ops.apply_template)},
        "/props": {"GET": ops.props},
        "/": {"GET": chat_page},
        "/chat": {"GET": chat_page},
    }
    ops.endpoints = tuple(f"{method} {path}" for path, methods in table.items() for method in methods)
    for path in list(table):  # the /v1-less aliases, as the core routes have them
        if path.startswith("/v1/"):
            table[path[3:]] = table[path]
    return table
