"""The active model behind a running server: which engine serves, and swapping it safely.

Owns: `EngineManager`, which is itself an `Engine` (every call goes to the active engine, or is a
503 `NoModelLoadedError` when none is loaded) and adds model switching. `activate(id)` loads the
new engine through the injected `ModelLoader` (on a thread; the old model keeps serving while
the new one compiles and loads), then closes the gate to new requests, waits until every request
in flight has finished, swaps, and reopens. A request is "in flight" from its first use of an
engine (tokenize, template, generate) until its handler returns: the server wraps each handler in
`scope()`, and the first engine call inside it pins that engine, so one request never mixes two
models. Activation runs as a task of its own, so a client that goes away does not abort it.
`observers` wrap every generation's event stream (the server's metrics use this). `embed` goes to
the active engine when it is an `Embedder` (zinc.engine.embeddings).
Imports: zinc.engine.{types, models, embeddings}, zinc.errors, the stdlib.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from zinc.engine.embeddings import Embedder, Embeddings
from zinc.engine.models import (
    ManagementUnsupportedError,
    ModelConflictError,
    ModelLoader,
    ModelRegistry,
    NoModelLoadedError,
    RemoveResult,
)
from zinc.engine.types import Engine, EngineStats, GenerationRequest, PromptLogprobs, TextDelta
from zinc.errors import InvalidRequestError, ModelNotFoundError, ZincError

log = logging.getLogger("zinc.engine")


class GenerationObserver(Protocol):
    """Wraps a generation's events (to measure them); must close `events` when it is closed."""

    def observe(
        self, request: GenerationRequest, events: AsyncIterator[TextDelta]
    ) -> AsyncIterator[TextDelta]: ...


@dataclass
class _Scope:
    manager: EngineManager
    engine: Engine | None = None


_SCOPE: ContextVar[_Scope | None] = ContextVar("zinc_engine_scope", default=None)


async def close_events(events: AsyncIterator[TextDelta]) -> None:
    """Close an event iterator if it can be closed (which aborts its generation)."""
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()


class EngineManager:
    """The engine a server talks to: the active model, swappable while the server runs."""

    def __init__(
        self,
        engine: Engine | None = None,
        *,
        loader: ModelLoader | None = None,
        registry: ModelRegistry | None = None,
    ) -> None:
        self._engine = engine
        self.loader = loader
        self.registry = registry
        self.observers: list[GenerationObserver] = []
        self.loading: str | None = None  # the model being loaded now
        self.load_error = ""  # why the last activation failed
        self._leases = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._open = asyncio.Event()  # cleared while a swap waits for requests in flight
        self._open.set()
        self._switch = asyncio.Lock()
        self._tasks: set[asyncio.Task[Engine]] = set()

    # ---- state

    @property
    def active(self) -> Engine | None:
        return self._engine

    @property
    def in_flight(self) -> int:
        """Requests holding the active engine (pinned by a scope or generating)."""
        return self._leases

    # ---- the Engine protocol, forwarded to the active engine

    @property
    def model_id(self) -> str:
        return self._engine.model_id if self._engine is not None else ""

    @property
    def context_length(self) -> int:
        return self._use().context_length

    def stats(self) -> EngineStats:
        if self._engine is None:
            return EngineStats(0, 0, 0)
        return self._engine.stats()

    def release_session(self, session_id: str) -> bool:
        return self._engine.release_session(session_id) if self._engine is not None else False

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self._use().tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._use().detokenize(ids)

    def special_tokens(self) -> Mapping[str, int]:
        return self._use().special_tokens()

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        return self._use().apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, **kwargs
        )

    @property
    def pooling(self) -> str:
        engine = self._use()
        return engine.pooling if isinstance(engine, Embedder) else "none"

    @property
    def embedding_length(self) -> int:
        engine = self._use()
        return engine.embedding_length if isinstance(engine, Embedder) else 0

    async def embed(self, inputs: Sequence[Sequence[int]], dimensions: int | None = None) -> Embeddings:
        engine = self._use()
        if not isinstance(engine, Embedder):
            raise InvalidRequestError(f"The model '{engine.model_id}' does not serve embeddings.", param="model")
        return await engine.embed(inputs, dimensions)

    async def prompt_logprobs(self, prompt_ids: Sequence[int], top: int) -> PromptLogprobs:
        return await self._use().prompt_logprobs(prompt_ids, top)

    def generate(self, request: GenerationRequest) -> AsyncIterator[TextDelta]:
        scope = self._scope()
        if scope is not None and scope.engine is not None:  # pinned (a handler tokenizes first):
            events = scope.engine.generate(request)  # its events as they are, one layer less per token
        else:
            events = self._generate(request)
        for observer in self.observers:
            events = observer.observe(request, events)
        return events

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[TextDelta]:
        scope = self._scope()
        if scope is None:  # a caller outside a server scope: hold a lease for this generation
            await self._open.wait()
            engine = self._require()
            self._acquire()
        else:
            engine = self._pin(scope)
        try:
            events = engine.generate(request)
            try:
                async for delta in events:
                    yield delta
            finally:
                await close_events(events)
        finally:
            if scope is None:
                self._release()

    # ---- request scopes

    @contextlib.asynccontextmanager
    async def scope(self) -> AsyncIterator[None]:
        """One request: its first engine use pins the active engine until the scope ends."""
        await self._open.wait()
        scope = _Scope(self)
        token = _SCOPE.set(scope)
        try:
            yield
        finally:
            _SCOPE.reset(token)
            if scope.engine is not None:
                self._release()

    async def select_model(self, requested: str | None) -> str:
        """The model a request names: the active one, or an installed one activated now.

        Raises `ModelNotFoundError` for a model that cannot be loaded and `NoModelLoadedError`
        when the request names none and nothing is loaded.
        """
        if requested is not None and requested != self.model_id:
            if self.loader is None or not self.loader.can_load(requested):
                served = f"this server serves '{self.model_id}'" if self._engine else "no model is loaded"
                raise ModelNotFoundError(
                    f"The model '{requested}' does not exist or is not installed; {served}."
                )
            engine = await self.activate(requested)
        else:
            engine = self._require()
        scope = self._scope()
        if scope is None:
            return engine.model_id
        if scope.engine is None:
            scope.engine = engine  # pinned before any other task can swap it out
            self._acquire()
        return scope.engine.model_id

    # ---- switching models

    async def activate(self, model_id: str) -> Engine:
        """Make `model_id` the active model (loading it first); the caller going away does not stop it."""
        if self.loader is None:
            raise ManagementUnsupportedError("This server was started without model management.")
        task = asyncio.ensure_future(self._activate(model_id))
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return await asyncio.shield(task)

    def _finished(self, task: asyncio.Task[Engine]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.info("activation failed: %s", task.exception())

    async def _activate(self, model_id: str) -> Engine:
        assert self.loader is not None
        async with self._switch:
            if self._engine is not None and self._engine.model_id == model_id:
                return self._engine
            self._check_runnable(model_id)
            self.loading, self.load_error = model_id, ""
            try:
                engine = await asyncio.to_thread(self.loader.load, model_id)
            except Exception as exc:
                self.load_error = (
                    exc.message if isinstance(exc, ZincError) else f"{type(exc).__name__}: {exc}"
                )
                if not isinstance(exc, ZincError):
                    log.error("loading %s failed", model_id, exc_info=exc)
                raise
            finally:
                self.loading = None
            old = await self._swap(engine)
        if old is not None:
            log.info("switched from %s to %s", old.model_id, engine.model_id)
        return engine

    def _check_runnable(self, model_id: str) -> None:
        """Refuse a catalog model that is not installed, not supported, or too big (before loading)."""
        assert self.loader is not None
        info = self.registry.get(model_id) if self.registry is not None else None
        if info is not None and not info.supported:
            raise InvalidRequestError(
                f"The model '{model_id}' has the '{info.architecture}' architecture, which zinc cannot run yet.",
                param="model",
                code="unsupported_model",
            )
        budget = self.registry.memory_budget_bytes if self.registry is not None else 0
        if info is not None and budget and info.required_memory_bytes > budget:
            raise InvalidRequestError(
                f"The model '{model_id}' needs {info.required_memory_bytes} bytes; the budget on "
                f"{self.registry.profile if self.registry else 'this device'} is {budget}.",
                param="model",
                code="model_does_not_fit",
            )
        if not self.loader.can_load(model_id):
            raise ModelNotFoundError(f"The model '{model_id}' is not installed.")

    async def unload(self) -> bool:
        """Stop serving the active model once its requests finish; False when none was loaded."""
        async with self._switch:
            if self._engine is None:
                return False
            await self._swap(None)
        return True

    async def _swap(self, engine: Engine | None) -> Engine | None:
        self._open.clear()  # new requests wait here
        try:
            while self._leases:
                await self._idle.wait()
            old, self._engine = self._engine, engine  # no await between the check and the swap
        finally:
            self._open.set()
        close = getattr(old, "close", None)
        if close is not None:  # no request uses it any more: stop its scheduler thread
            close()
        return old

    async def remove(self, model_id: str, *, force: bool) -> tuple[RemoveResult, bool]:
        """Delete an installed model; the loaded one only with `force` (it is unloaded first).

        Returns the registry's result and whether the model was unloaded.
        """
        registry = self.require_registry()
        if registry.get(model_id) is None:
            raise InvalidRequestError(f"Unknown model '{model_id}'.", param="model", code="model_not_found")
        if self.loading == model_id:
            raise ModelConflictError(f"The model '{model_id}' is being loaded; try again when it is active.")
        unloaded = False
        if self._engine is not None and self._engine.model_id == model_id:
            if not force:
                raise ModelConflictError(
                    f"The model '{model_id}' is loaded; pass \"force\": true to unload and remove it."
                )
            unloaded = await self.unload()
        return await asyncio.to_thread(registry.remove, model_id), unloaded

    def require_registry(self) -> ModelRegistry:
        if self.registry is None:
            raise ManagementUnsupportedError("This server was started without a model catalog.")
        return self.registry

    # ---- helpers

    def _scope(self) -> _Scope | None:
        scope = _SCOPE.get()
        return scope if scope is not None and scope.manager is self else None

    def _require(self) -> Engine:
        if self._engine is None:
            if self.loading is not None:
                raise NoModelLoadedError(f"The model '{self.loading}' is loading; retry in a moment.")
            raise NoModelLoadedError("No model is loaded: activate one with POST /v1/models/activate.")
        return self._engine

    def _use(self) -> Engine:
        scope = self._scope()
        return self._pin(scope) if scope is not None else self._require()

    def _pin(self, scope: _Scope) -> Engine:
        if scope.engine is None:
            scope.engine = self._require()
            self._acquire()
        return scope.engine

    def _acquire(self) -> None:
        self._leases += 1
        self._idle.clear()

    def _release(self) -> None:
        self._leases -= 1
        if self._leases == 0:
            self._idle.set()
