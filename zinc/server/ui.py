"""The built-in chat UI: one static page served at `/` and `/chat`.

Owns: reading `chat.html` beside this module (package data; no build step) once and serving it with
`Connection: close`, as the spec asks of the HTML routes, and a content security policy that
lets the page talk only to this server. The page itself uses the same OpenAI API as any client:
`GET /v1/models` for the model picker, streamed `POST /v1/chat/completions` for answers, and an
aborted fetch (which closes the connection, so the server aborts the generation) for Stop.
Imports: zinc.server.exchange, the stdlib.
"""

from __future__ import annotations

import functools
from importlib.resources import files

from zinc.server.exchange import Exchange, HttpRequest

PAGE = "chat.html"
HEADERS = (
    ("content-type", "text/html; charset=utf-8"),
    ("cache-control", "no-cache"),
    ("connection", "close"),
    ("x-content-type-options", "nosniff"),
    (
        "content-security-policy",
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
)


@functools.cache
def page() -> bytes:
    return files("zinc.server").joinpath(PAGE).read_bytes()


async def chat_page(request: HttpRequest, exchange: Exchange) -> None:
    await exchange.respond(200, HEADERS, page())
