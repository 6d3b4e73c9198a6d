"""Helpers for tests of a running server with model management: a server on a background
uvloop thread, a fake `ModelLoader` that opens `FakeEngine`s, and small HTTP helpers."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx2
import uvloop

from tests.fakes import FakeEngine
from zinc.engine.manager import EngineManager
from zinc.engine.models import ModelRegistry
from zinc.engine.types import Engine
from zinc.server import Server, ServerConfig, start_server


class FakeLoader:
    """Opens a `FakeEngine` for ids it was given or that the registry has installed."""

    def __init__(
        self, ids: set[str] | None = None, registry: ModelRegistry | None = None, **engine: Any
    ) -> None:
        self.ids = set(ids or ())
        self.registry = registry
        self.engine_options = engine
        self.loaded: list[str] = []
        self.gate: threading.Event | None = None  # load() waits for it when set
        self.failures: dict[str, Exception] = {}

    def can_load(self, model_id: str) -> bool:
        if model_id in self.ids:
            return True
        info = self.registry.get(model_id) if self.registry is not None else None
        return info is not None and info.installed

    def load(self, model_id: str) -> Engine:
        if self.gate is not None:
            assert self.gate.wait(20), "the test never opened the loader's gate"
        if model_id in self.failures:
            raise self.failures[model_id]
        self.loaded.append(model_id)
        return FakeEngine(model_id=model_id, **self.engine_options)


class ServerThread:
    """`start_server` on a uvloop loop in a background thread, with an HTTP client."""

    def __init__(self, engine: Engine | EngineManager, **config: Any) -> None:
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        future = asyncio.run_coroutine_threadsafe(
            start_server(engine, ServerConfig(**{"port": 0, **config})), self.loop
        )
        self.server: Server = future.result(timeout=5)
        self.url = f"http://127.0.0.1:{self.server.port}"
        self.http = httpx2.Client(base_url=self.url, timeout=20)

    def run(self, coro: Any, timeout: float = 20) -> Any:
        """Run a coroutine on the server's loop (to touch the manager from the loop's thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def get(self, path: str) -> httpx2.Response:
        return self.http.get(path)

    def post(self, path: str, body: Any) -> httpx2.Response:
        return self.http.post(path, json=body)

    def stop(self) -> None:
        self.http.close()
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(timeout=15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()
