"""Running the server: listen, hand each connection to an `HttpProtocol`, and shut down gracefully.

Owns: `start_server()` (listen on host:port, port 0 picks a free one) returning a `Server` handle
whose `close()` stops accepting, closes idle connections, lets responses in progress finish within
`graceful_shutdown_timeout_s`, then cancels them (which aborts their generations), or at once after
`force_close()`; `drain(delay)`, which makes `/health` answer 503 "draining" and keeps serving
for `delay` seconds (a balancer's health checks take the replica out meanwhile); and `serve()`,
which runs all that under uvloop until SIGINT or SIGTERM (loading the first model in the
background when asked to): the first signal drains for `drain_delay_s`, then shuts down
gracefully (new connections are refused: the listening socket is closed) and `serve()` returns 0; a second SIGINT
or SIGTERM during that cuts it short and `serve()` returns 128 + that signal's number, the shell's
code for a process a signal ended. `serve()` also raises the process's soft limit on open files
(RLIMIT_NOFILE) to the hard one, so that `max_connections` sockets fit: past the limit the OS
refuses sockets, and a connection would be closed without its 503 while `/health` got no answer.
Every server talks to an `EngineManager` and has metrics.
Imports: zinc.engine.{types, manager}, zinc.errors, zinc.server.{config, api, routes, extra_routes, metrics,
http11}, uvloop, the stdlib.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import resource
import signal
import time
from types import TracebackType

import uvloop

from zinc.engine.manager import EngineManager
from zinc.engine.types import Engine
from zinc.errors import ZincError
from zinc.server.api import OpenAIApi
from zinc.server.config import ServerConfig
from zinc.server.extra_routes import PUBLIC, extra_routes
from zinc.server.http11 import HttpProtocol
from zinc.server.metrics import ServerMetrics
from zinc.server.routes import COMMON_HEADERS, Router

log = logging.getLogger("zinc.server")

_SHUTDOWN_POLL_S = 0.01
_CANCEL_GRACE_S = 1.0  # time given to cancelled handlers to run their cleanup
_FD_MARGIN = 64  # open files besides client sockets: listener, model files, event fds, logs


def raise_open_file_limit(max_connections: int) -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one (as Go's runtime does for every program), so
    that `max_connections` sockets fit and so do those refused past the cap while their 503 goes
    out; returns the soft limit now, and warns when it is short of `max_connections`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max_connections + _FD_MARGIN
    new = soft if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or new <= soft:
        new = soft
    else:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    if new != resource.RLIM_INFINITY and new < want:
        log.warning(
            "open files are limited to %d (ulimit -Hn): fewer than --max-connections %d connections "
            "fit, and those past the limit are closed without an answer",
            new, max_connections,
        )  # fmt: skip
    return new


class Server:
    """A listening server; `await close()` shuts it down gracefully."""

    def __init__(
        self, server: asyncio.Server, connections: set[HttpProtocol], config: ServerConfig, api: OpenAIApi
    ) -> None:
        self._server = server
        self._connections = connections
        self._config = config
        self._api = api
        self._closed = False
        self._forced = False
        self._cut = asyncio.Event()  # set by force_close

    @property
    def port(self) -> int:
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def host(self) -> str:
        return self._config.host

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    @property
    def draining(self) -> bool:
        return self._api.draining

    async def drain(self, delay_s: float) -> None:
        """Say 503 "draining" on /health while still serving, for `delay_s` (less if `force_close`
        comes): the time a balancer's health checks take to send new requests elsewhere."""
        self._api.draining = True
        if delay_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._cut.wait(), delay_s)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._server.close()  # stop accepting
        for connection in list(self._connections):
            connection.shutdown()  # idle ones close now, busy ones after their response
        deadline = time.monotonic() + self._config.graceful_shutdown_timeout_s
        while self._connections and time.monotonic() < deadline and not self._forced:
            await asyncio.sleep(_SHUTDOWN_POLL_S)
        tasks = [c.task for c in self._connections if c.task is not None]
        if tasks:
            why = "at once" if self._forced else "after the shutdown timeout"
            log.warning("cancelling %d request(s) still running %s", len(tasks), why)
        for connection in list(self._connections):
            connection.abort()
        if tasks:
            await asyncio.wait(tasks, timeout=_CANCEL_GRACE_S)
        await self._server.wait_closed()

    def force_close(self) -> None:
        """Cut a graceful shutdown short: `close()` (running or to come) cancels what still runs
        now instead of waiting for it."""
        self._forced = True
        self._cut.set()

    async def __aenter__(self) -> Server:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


async def start_server(engine: Engine | EngineManager, config: ServerConfig) -> Server:
    """Listen on `config.host:config.port` and serve the OpenAI API over `engine`.

    A plain `Engine` is wrapped in an `EngineManager` without a loader or catalog (one fixed model).
    """
    loop = asyncio.get_running_loop()
    connections: set[HttpProtocol] = set()
    manager = engine if isinstance(engine, EngineManager) else EngineManager(engine)
    api = OpenAIApi(manager, config)
    metrics = ServerMetrics(manager, lambda: api.admission.waiting, lambda: api.draining)
    manager.observers.append(metrics)
    router = Router(api, config.api_key, extra_routes(manager, api, config, metrics), PUBLIC)
    handler = metrics.instrument(router, router.paths)
    try:
        server = await loop.create_server(
            lambda: HttpProtocol(handler, config, COMMON_HEADERS, connections),
            config.host,
            config.port,
            reuse_address=True,
        )
    except OSError as exc:  # port taken, address not on this host, no permission
        why = exc.strerror or str(exc)
        raise ZincError(f"cannot listen on {config.host}:{config.port}: {why}") from exc
    return Server(server, connections, config, api)


def serve(engine: Engine | EngineManager, config: ServerConfig, initial_model: str | None = None) -> int:
    """Serve until SIGINT or SIGTERM, then shut down gracefully; returns the exit status: 0, or
    128 + the signal's number when a second signal cut the shutdown short.

    With `initial_model`, the server listens at once (`/health` answers 503 "loading") while the
    manager loads that model; if loading fails, the server stops and the error is raised.
    """
    raise_open_file_limit(config.max_connections)
    return uvloop.run(_serve_until_signalled(engine, config, initial_model))


async def _serve_until_signalled(
    engine: Engine | EngineManager, config: ServerConfig, initial_model: str | None
) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    forced_by: list[int] = []  # the signal that cut the graceful shutdown short
    running: list[Server] = []

    def on_signal(sig: signal.Signals) -> None:
        if not stop.is_set():
            stop.set()
            return
        if not forced_by:
            log.warning("%s during shutdown: cancelling what still runs and exiting now", sig.name)
            forced_by.append(int(sig))
        for server in running:
            server.force_close()

    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, on_signal, sig)
    failure: list[BaseException] = []
    loading: asyncio.Future[None] | None = None

    async def load_first(manager: EngineManager, model: str) -> None:
        try:
            await manager.activate(model)
        except Exception as exc:
            failure.append(exc)
            stop.set()
            return
        log.info("serving %s on http://%s:%d", manager.model_id, config.host, server.port)

    try:
        async with await start_server(engine, config) as server:
            running.append(server)
            if initial_model is not None and isinstance(engine, EngineManager):
                log.info("listening on http://%s:%d; loading %s", config.host, server.port, initial_model)
                loading = asyncio.ensure_future(load_first(engine, initial_model))
            else:
                log.info("serving %s on http://%s:%d", engine.model_id, config.host, server.port)
            await stop.wait()
            if loading is not None and not loading.done():
                loading.cancel()
            if config.drain_delay_s > 0:
                log.info("draining: /health says 503 for %g s while requests are still served", config.drain_delay_s)
            await server.drain(config.drain_delay_s)
            log.info(
                "shutting down: running requests get %g s to finish; a second signal exits at once",
                config.graceful_shutdown_timeout_s,
            )
        if isinstance(engine, EngineManager) and not forced_by and engine.loading is None:
            await engine.unload()  # stop the model's threads and free its device objects now,
            gc.collect()  # before the interpreter's exit finds IREE objects still alive
    finally:
        for sig in signals:
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_signal_handler(sig)
    if failure:
        raise failure[0]
    return 128 + forced_by[0] if forced_by else 0
