"""Request routing: (method, path) to a handler, CORS, the API key, and the last error boundary.

Owns: the route table (with `/v1`-less aliases), OPTIONS preflight (200 `{}` with the CORS allow
headers), the headers every response carries (`Access-Control-Allow-Origin: *`), API-key
authentication (`Authorization: Bearer <key>` or `x-api-key: <key>`) compared with
`hmac.compare_digest` (401; `/health` and preflights stay public), 404/405 in the OpenAI envelope,
and turning any exception a handler raises before its response started into that envelope (into
Anthropic's for paths under /v1/messages, zinc.server.anthropic_response): a `ZincError` keeps
its status and message (a 429 for a full queue with `Retry-After: 1`), anything else is a 500
with a generic message while the traceback goes to the log. Extra routes and public paths (model management, operator endpoints, the chat UI)
are merged in from zinc.server.extra_routes.
Imports: zinc.errors, zinc.server.{anthropic_response, api, error_table, exchange}, orjson, the stdlib.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping

import orjson

from zinc.errors import AuthenticationError, QueueFullError, ZincError
from zinc.server.anthropic_response import error_body, is_anthropic_path
from zinc.server.api import OpenAIApi
from zinc.server.error_table import MethodNotAllowedError, NotFoundError
from zinc.server.exchange import Exchange, HttpRequest

log = logging.getLogger("zinc.server")

Route = Callable[[HttpRequest, Exchange], Awaitable[None]]

COMMON_HEADERS = (
    ("access-control-allow-origin", "*"),
    ("access-control-expose-headers", "x-request-id"),
    ("server", "zinc"),
)
DEFAULT_ALLOW_HEADERS = (
    "authorization, content-type, x-api-key, anthropic-version, x-request-id, x-session-id"
)
PREFLIGHT_MAX_AGE_S = 86400
PUBLIC_PATHS = frozenset({"/health"})


class Router:
    """The handler the HTTP protocol calls for every request."""

    def __init__(
        self,
        api: OpenAIApi,
        api_key: str | None,
        extra: Mapping[str, Mapping[str, Route]] | None = None,
        public: Collection[str] = (),
    ) -> None:
        self._api_key = api_key.encode() if api_key is not None else None
        self._public = PUBLIC_PATHS | frozenset(public)
        chat: dict[str, Route] = {"POST": api.chat_completions}
        text: dict[str, Route] = {"POST": api.completions}
        models: dict[str, Route] = {"GET": api.models}
        self._routes: dict[str, dict[str, Route]] = {
            "/v1/chat/completions": chat,
            "/chat/completions": chat,
            "/v1/completions": text,
            "/completions": text,
            "/v1/models": models,
            "/models": models,
            "/health": {"GET": api.health},
            "/v1/sessions/*": {"DELETE": api.delete_session},
            "/sessions/*": {"DELETE": api.delete_session},
        }
        for path, methods in (extra or {}).items():  # extra routes (zinc.server.extra_routes) win
            self._routes[path] = dict(methods)

    @property
    def paths(self) -> frozenset[str]:
        return frozenset(self._routes)

    async def __call__(self, request: HttpRequest, exchange: Exchange) -> None:
        try:
            await self._dispatch(request, exchange)
        except Exception as exc:
            if not isinstance(exc, ZincError):
                log.error(
                    "unexpected error in %s %s id=%s", request.method, request.path, exchange.request_id,
                    exc_info=exc,
                )  # fmt: skip
            if exchange.response_started:
                raise  # the stream code reports its own errors; the connection is closed
            headers = []
            if isinstance(exc, MethodNotAllowedError):
                headers.append(("allow", ", ".join(exc.allowed)))
            if isinstance(exc, AuthenticationError):
                headers.append(("www-authenticate", "Bearer"))
            if isinstance(exc, QueueFullError):  # clients (the openai SDK's retries) wait this long
                headers.append(("retry-after", "1"))
            if is_anthropic_path(request.path):
                status, body = error_body(exc)
                await exchange.respond_json(status, orjson.dumps(body), headers)
            else:
                await exchange.respond_error(exc, headers)

    async def _dispatch(self, request: HttpRequest, exchange: Exchange) -> None:
        methods = self._routes.get(request.path)
        if (
            methods is None and request.path.count("/") >= 2
        ):  # a resource under a collection: "/v1/sessions/*"
            methods = self._routes.get(request.path.rsplit("/", 1)[0] + "/*")
        if methods is None:
            raise NotFoundError(f"Invalid URL ({request.method} {request.path}).")
        if request.method == "OPTIONS":
            await self._preflight(request, exchange, methods)
            return
        route = methods.get(request.method)
        if route is None:
            allowed = (*methods, "OPTIONS")
            raise MethodNotAllowedError(
                f"Method {request.method} is not allowed for {request.path}; use {', '.join(allowed)}.",
                allowed,
            )
        if request.path not in self._public:
            self._authenticate(request)
        await route(request, exchange)

    def _authenticate(self, request: HttpRequest) -> None:
        if self._api_key is None:
            return
        scheme, _, token = (request.header("authorization") or "").partition(" ")
        bearer = token if scheme.lower() == "bearer" else ""
        keys = [k.strip() for k in (bearer, request.header("x-api-key") or "") if k.strip()]
        if not keys:
            raise AuthenticationError(
                "Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'."
            )
        if not any(hmac.compare_digest(k.encode("latin-1"), self._api_key) for k in keys):
            raise AuthenticationError("Incorrect API key provided.")

    async def _preflight(self, request: HttpRequest, exchange: Exchange, methods: dict[str, Route]) -> None:
        headers = [
            ("access-control-allow-methods", ", ".join((*methods, "OPTIONS"))),
            (
                "access-control-allow-headers",
                request.header("access-control-request-headers") or DEFAULT_ALLOW_HEADERS,
            ),
            ("access-control-max-age", str(PREFLIGHT_MAX_AGE_S)),
        ]
        await exchange.respond_json(200, b"{}", headers)
