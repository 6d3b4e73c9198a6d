"""zinc's HTTP server: the OpenAI API over HTTP/1.1 (h11 + uvloop), talking only to an `Engine`.

Public entry points: `ServerConfig`, `start_server(engine, config) -> Server`, `serve(engine, config)`.
Modules: config (settings and limits), http11 (connection protocol), exchange (one request/response
cycle), routes (routing, CORS, auth), api (endpoints, admission, generation), choices (`n` > 1),
openai_request (parsing/validation), openai_response (response shapes, SSE), infill_api
(llama.cpp's /infill), error_table (errors to statuses), app (start, serve, graceful shutdown).
Imports: zinc.engine.types, zinc.errors, h11, uvloop, orjson and the stdlib only.
"""

from zinc.server.app import Server, serve, start_server
from zinc.server.config import ServerConfig

__all__ = ["Server", "ServerConfig", "serve", "start_server"]
